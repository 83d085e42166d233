"""PyTorch side: iterate a DALI pipeline of windows as local tensors, DTensors or ShardTensors.

Built on ``nvidia.dali.plugin.pytorch.DALIGenericIterator`` and following its conventions: it runs
with ``size=-1`` (the stateless sources end the epoch on a whole batch), ``reset()`` starts the next
epoch, and checkpoints come from DALI (``checkpoints()``), wrapped as ``state_dict()`` /
``load_state_dict()``.

Example::

    layout = Layout(MeshInfo.from_device_mesh(device_mesh), shard={"model_parallel": 1})
    source = NumpySource(files, layout, batch_size=4)

    def make_pipeline(checkpoint=None):
        @pipeline_def(batch_size=4, num_threads=2, device_id=0, py_num_workers=2,
                      py_start_method="spawn", enable_checkpointing=True)
        def pipe():
            window, sample_id, is_pad = dali_mesh.fn.partitioned_source(source, device="gpu")
            return window, sample_id, is_pad
        return pipe(checkpoint=checkpoint)

    loader = MeshLoader(make_pipeline, layout, sample_shape=source.sample_shape,
                        output="dtensor", device_mesh=device_mesh)
    for batch in loader:
        batch["window"]           # DTensor of the global batch (halo stripped)
        batch["sample_id"], batch["is_pad"]

Or from the model's input (the second way in): ``layout = Layout.from_dtensor(model_input)`` for the
source, and ``MeshLoader(make_pipeline, like=model_input)``, which checks that its DTensor has exactly
the mesh, placements, shape, stride and local shape of ``model_input``.

Failures are errors, not hangs or wrong data: a DALI worker that dies or is stopped raises
:class:`WorkerError` within about a second (no batch within ``timeout`` seconds, too), naming the
worker and the file it was reading; a device mesh that is not the layout's, outputs named in the
wrong order, or a checkpoint of another source, layout or batch size are refused.
"""
from dali_mesh.pipeline.watchdog import WorkerError
from dali_mesh.torch.like import check_like, like_spec
from dali_mesh.torch.loader import OUTPUTS, MeshLoader
from dali_mesh.torch.wrap import to_dtensor, to_shard_tensor

__all__ = ["MeshLoader", "OUTPUTS", "WorkerError", "check_like", "like_spec", "to_dtensor", "to_shard_tensor"]
