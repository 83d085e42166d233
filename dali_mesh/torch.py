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
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from dali_mesh.partition import Layout, LayoutError

__all__ = ["MeshLoader", "to_dtensor", "to_shard_tensor"]

OUTPUTS = ("local", "dtensor", "shard_tensor")


def _contiguous_stride(shape: Sequence[int]) -> tuple[int, ...]:
    stride, acc = [], 1
    for s in reversed(shape):
        stride.append(acc)
        acc *= s
    return tuple(reversed(stride))


def _owned_part(local: torch.Tensor, layout: Layout, sample_shape: Sequence[int], lead_axes: int):
    """This rank's batched window ``(batch, *lead, *window)`` with the halo stripped."""
    region = layout.region(sample_shape)
    shape = tuple(local.shape[1 + lead_axes:])
    if shape == region.window_shape:
        return local[(slice(None),) * (1 + lead_axes) + region.owned_in_window], region
    if shape != region.shape:
        raise LayoutError(f"local batch of shape {tuple(local.shape)} holds neither the window {region.window_shape} "
                          f"nor the owned region {region.shape} of rank {layout.mesh.rank} after {lead_axes} "
                          "leading axes")
    return local, region


def to_dtensor(local: torch.Tensor, layout: Layout, sample_shape: Sequence[int], device_mesh, *, lead_axes: int = 0):
    """Wrap this rank's batched window ``(batch, *lead, *window)`` (halo included or not) as a DTensor of
    the global batch.

    The halo is stripped first; placements come from the layout (``Shard(0)`` for batch dims,
    ``Shard(1 + lead_axes + axis)`` for shard dims, ``Replicate()`` otherwise). ``lead_axes`` counts
    unsplit axes after the batch (a forecast's steps). Only ``split="chunk"``: the global shape and
    stride are given explicitly, which DTensor gets right only for torch.chunk shard sizes.
    """
    from torch.distributed.tensor import DTensor  # noqa: PLC0415

    ndim = len(sample_shape)
    placements = layout.dtensor_placements(ndim, halo_stripped=True, lead_axes=lead_axes)
    local, region = _owned_part(local, layout, sample_shape, lead_axes)
    global_shape = (local.shape[0] * layout.num_batch_groups,) + tuple(local.shape[1:1 + lead_axes]) + region.domain_shape
    return DTensor.from_local(local.contiguous(), device_mesh, placements, run_check=False,
                              shape=torch.Size(global_shape), stride=_contiguous_stride(global_shape))


def to_shard_tensor(local: torch.Tensor, layout: Layout, sample_shape: Sequence[int], device_mesh, *,
                    lead_axes: int = 0):
    """Wrap this rank's batched window (halo stripped) as a PhysicsNeMo ``ShardTensor`` with explicit
    ``sharding_shapes`` (mesh dim -> the local shapes along it), correct for every split rule."""
    try:
        from physicsnemo.domain_parallel import ShardTensor  # noqa: PLC0415
    except ImportError:
        try:
            from physicsnemo.distributed.shard_tensor import ShardTensor  # noqa: PLC0415 (older releases)
        except ImportError as e:
            raise ImportError("output='shard_tensor' needs PhysicsNeMo (pip install nvidia-physicsnemo)") from e
    placements = layout.dtensor_placements(len(sample_shape), halo_stripped=True, lead_axes=lead_axes,
                                           any_split=True)
    local, _ = _owned_part(local, layout, sample_shape, lead_axes)
    lead = tuple(local.shape[1:1 + lead_axes])
    by_dim = layout.sharding_shapes(sample_shape)
    shapes = {}
    for d, placement in enumerate(placements):
        if placement.is_shard():  # batch dims: every sample group holds a whole local batch
            along = [(local.shape[0],) + lead + s for s in by_dim[d]] if d in by_dim else \
                [tuple(local.shape)] * layout.mesh.shape[d]
            shapes[d] = [torch.Size(s) for s in along]
    return ShardTensor.from_local(local.contiguous(), device_mesh, placements, sharding_shapes=shapes)


class MeshLoader:
    """Iterate a DALI pipeline of this rank's windows as torch tensors.

    Args:
        pipeline: a DALI ``Pipeline``, or a callable ``make_pipeline(checkpoint=None) -> Pipeline``
            (needed for ``load_state_dict``: a restored pipeline is built from a checkpoint).
        layout: the ``Layout`` the pipeline's source reads with.
        output_map: names of the pipeline outputs, in order (default: ``window, sample_id, is_pad``).
        window_outputs: which outputs are windows (default: those not named ``sample_id``/``is_pad``).
        output: ``"local"`` (windows as they are, halo kept; ``loader.region`` says where they lie),
            ``"dtensor"`` (halo stripped, ``split="chunk"`` only) or ``"shard_tensor"`` (PhysicsNeMo).
        device_mesh: the torch ``DeviceMesh`` (for ``dtensor``/``shard_tensor``).
        sample_shape: the sample (domain) shape, for the region and the global DTensor shape.
        drop_padded: drop padded samples from each batch (``output="local"`` only; batches may then
            be shorter than the batch size). By default they are kept and flagged in ``is_pad``.
        per_sample_shapes: samples differ in shape: windows come as lists of per-sample tensors
            (DALI's ``DALIRaggedIterator``); no DTensor.

    Every rank takes the same number of steps per epoch (the sources pad to whole batches).
    """

    def __init__(
        self,
        pipeline,
        layout: Layout,
        *,
        output_map: Sequence[str] = ("window", "sample_id", "is_pad"),
        window_outputs: Sequence[str] | None = None,
        output: str = "local",
        device_mesh=None,
        sample_shape: Sequence[int] | None = None,
        drop_padded: bool = False,
        per_sample_shapes: bool = False,
    ) -> None:
        if output not in OUTPUTS:
            raise ValueError(f"unknown output {output!r}; expected one of {', '.join(OUTPUTS)}")
        if output != "local":
            if device_mesh is None:
                raise ValueError(f"output={output!r} needs device_mesh=")
            if sample_shape is None:
                raise ValueError(f"output={output!r} needs sample_shape= (the domain shape of a sample)")
            if per_sample_shapes:
                raise ValueError(f"output={output!r} is not possible with per-sample shapes: use output='local'")
            if drop_padded:
                raise ValueError("drop_padded would make ranks' batches differ in size: use it with output='local'")
            if output == "dtensor":  # fail now, not at the first batch
                layout.placement_spec(len(sample_shape), halo_stripped=True)
        self.layout = layout
        self.output = output
        self.device_mesh = device_mesh
        self.sample_shape = None if sample_shape is None else tuple(int(s) for s in sample_shape)
        self.output_map = tuple(output_map)
        self.window_outputs = tuple(window_outputs) if window_outputs is not None else tuple(
            n for n in self.output_map if n not in ("sample_id", "is_pad"))
        self.drop_padded = bool(drop_padded)
        self.per_sample_shapes = bool(per_sample_shapes)
        self._factory: Callable[..., Any] | None = pipeline if callable(pipeline) and not hasattr(pipeline, "build") else None
        self._pipeline = self._factory() if self._factory else pipeline
        self._iterator = self._make_iterator(self._pipeline)
        self.steps_taken = 0

    @property
    def region(self):
        """This rank's region of a sample (needs ``sample_shape``)."""
        if self.sample_shape is None:
            raise ValueError("the loader was built without sample_shape=")
        return self.layout.region(self.sample_shape)

    def _make_iterator(self, pipe):
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, DALIRaggedIterator  # noqa: PLC0415

        if self.per_sample_shapes:
            tags = [DALIRaggedIterator.SPARSE_LIST_TAG if n in self.window_outputs else DALIRaggedIterator.DENSE_TAG
                    for n in self.output_map]
            return DALIRaggedIterator([pipe], list(self.output_map), size=-1, output_types=tags)
        return DALIGenericIterator([pipe], list(self.output_map), size=-1)

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, Any]:
        batch = next(self._iterator)[0]
        self.steps_taken += 1
        if "is_pad" in batch:
            batch["is_pad"] = batch["is_pad"].reshape(-1).bool()
        if "sample_id" in batch:
            batch["sample_id"] = batch["sample_id"].reshape(-1)
        if self.drop_padded and "is_pad" in batch:
            keep = ~batch["is_pad"].cpu()
            idx = torch.nonzero(keep).reshape(-1)
            for name, value in batch.items():
                if isinstance(value, list):
                    batch[name] = [value[i] for i in idx.tolist()]
                else:
                    batch[name] = value[idx.to(value.device)]
        if self.output != "local":
            wrap = to_dtensor if self.output == "dtensor" else to_shard_tensor
            for name in self.window_outputs:
                batch[name] = wrap(batch[name], self.layout, self.sample_shape, self.device_mesh,
                                   lead_axes=self._lead_axes(batch[name], name))
        return batch

    def _lead_axes(self, value, name) -> int:
        """Unsplit axes between the batch and the sample: a forecast's steps axis, or none."""
        lead = value.ndim - 1 - len(self.sample_shape)
        if lead < 0:
            raise LayoutError(f"output {name!r} has {value.ndim - 1} sample dims, fewer than sample_shape "
                              f"{self.sample_shape}")
        return lead

    def reset(self) -> None:
        """Start the next epoch (after ``StopIteration``)."""
        self._iterator.reset()
        self.steps_taken = 0

    def __len__(self) -> int:
        raise TypeError("MeshLoader has no length: the source ends the epoch (size=-1)")

    # ---- checkpoints --------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """DALI's checkpoint of the pipeline (build it with ``enable_checkpointing=True``)."""
        return {"dali_checkpoints": self._iterator.checkpoints(), "steps_taken": self.steps_taken}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Rebuild the pipeline from a checkpoint: the next batch is the one after the checkpoint."""
        if self._factory is None:
            raise ValueError("load_state_dict needs the loader to be built from make_pipeline(checkpoint=None), "
                             "not from a built pipeline")
        checkpoints = state["dali_checkpoints"]
        if len(checkpoints) != 1:
            raise ValueError(f"expected one DALI checkpoint, got {len(checkpoints)}")
        self._iterator = self._pipeline = None  # let the old pipeline and its workers go first
        self._pipeline = self._factory(checkpoint=checkpoints[0])
        self._iterator = self._make_iterator(self._pipeline)
        self.steps_taken = int(state.get("steps_taken", 0))
