"""MeshLoader(..., like=model_input): the loader's DTensor is exactly the model's input (mesh,
placements, global shape, stride, local shape), or an error names both sides. Real processes on
gloo (4 ranks, a 2 x 2 mesh) and a one-rank group for the first-batch check."""
from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("nvidia.dali")

from dali_mesh.cli.launch import run_ranks  # noqa: E402
from tests.helpers import assert_refused  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHAPE = (2, 8, 6)  # (C, H, W): model_parallel splits H
BATCH = 2


@pytest.fixture(autouse=True)
def _workers_find_the_package(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))


def _write(folder, n):
    files = []
    for i in range(n):
        f = os.path.join(str(folder), f"s{i}.npy")
        np.save(f, np.arange(np.prod(SHAPE), dtype=np.float32).reshape(SHAPE) + 1000 * i)
        files.append(f)
    return files


def _make(source):
    from nvidia.dali import pipeline_def

    from dali_mesh.pipeline.external import partitioned_source

    def make(checkpoint=None):
        @pipeline_def(batch_size=source.batch_size, num_threads=1, device_id=None, py_num_workers=1,
                      py_start_method="spawn", prefetch_queue_depth=1)
        def pipe():
            return partitioned_source(source)

        return pipe(checkpoint=checkpoint)

    return make


def _model_input(device_mesh, placements, global_shape, stride=None):
    """What a model built for this mesh takes: a DTensor with torch.chunk shards."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    local_shape, _ = compute_local_shape_and_global_offset(global_shape, device_mesh, placements)
    if stride is None:
        stride = torch.empty(global_shape).stride()
    return DTensor.from_local(torch.zeros(local_shape), device_mesh, placements, run_check=False,
                              shape=torch.Size(global_shape), stride=stride)


def _like_rank(rank, world_size, files):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard

    from dali_mesh import Layout, MeshInfo
    from dali_mesh.partition import LayoutError
    from dali_mesh.source import NumpySource
    from dali_mesh.torch import MeshLoader

    device_mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("data_parallel", "model_parallel"))
    layout = Layout(MeshInfo.from_device_mesh(device_mesh), shard={"model_parallel": 1}, halo={1: 1})
    source = NumpySource(files, layout, batch_size=BATCH, shuffle=False)
    global_shape = (BATCH * 2,) + SHAPE
    model_input = _model_input(device_mesh, [Shard(0), Shard(2)], global_shape)

    loader = MeshLoader(_make(source), layout, like=model_input)
    assert loader.output == "dtensor" and loader.sample_shape == SHAPE
    steps = 0
    for batch in loader:
        dt = batch["window"]
        assert tuple(dt.placements) == tuple(model_input.placements)
        assert dt.shape == model_input.shape and dt.stride() == model_input.stride()
        assert dt.to_local().shape == model_input.to_local().shape
        assert dt.device_mesh == model_input.device_mesh
        # the data: the halo is stripped, the gathered batch is the files of both sample groups
        ids = [None] * world_size
        dist.all_gather_object(ids, (layout.batch_index, batch["sample_id"].tolist()))
        groups = [i for _, i in sorted({(b, tuple(i)) for b, i in ids})]
        expected = np.stack([np.load(files[s]) for g in groups for s in g])
        np.testing.assert_array_equal(dt.full_tensor().numpy(), expected)
        steps += 1
    assert steps == len(source) // BATCH

    # the layout taken from the model's input: the source reads with it, the loader builds it itself
    from_model = Layout.from_dtensor(model_input)
    assert from_model.shard_dims == {"model_parallel": 1} and from_model.batch_dims == ("data_parallel",)
    plain = NumpySource(files, from_model, batch_size=BATCH, shuffle=False)
    by_model = MeshLoader(_make(plain), like=model_input)
    dt = next(by_model)["window"]
    assert tuple(dt.placements) == tuple(model_input.placements) and dt.shape == model_input.shape
    assert dt.to_local().shape == model_input.to_local().shape
    # a source reading with another layout (halo) than the one the loader takes from the model
    assert_refused(lambda: MeshLoader(_make(source), like=model_input), LayoutError, "reads with layout",
                   "halo={1: 1}", what="a source with another layout than the model's")
    del by_model, dt

    # a model that splits W, not H: refused before any data, naming both placements
    wrong_axis = _model_input(device_mesh, [Shard(0), Shard(3)], global_shape)
    assert_refused(lambda: MeshLoader(_make(source), layout, like=wrong_axis), LayoutError,
                   "placements (Shard(dim=0), Shard(dim=2))", "(Shard(dim=0), Shard(dim=3))",
                   what="a model input split on another axis")

    # a model that replicates over model_parallel
    replicated = _model_input(device_mesh, [Shard(0), Replicate()], global_shape)
    assert_refused(lambda: MeshLoader(_make(source), layout, like=replicated), LayoutError, "Replicate()",
                   what="a replicated model input")

    # a model that takes another global batch
    bigger = _model_input(device_mesh, [Shard(0), Shard(2)], (BATCH * 4,) + SHAPE)
    assert_refused(lambda: MeshLoader(_make(source), layout, like=bigger), LayoutError,
                   "global batch of 8 but the loader yields 4 (batch_size 2 x 2 sample groups)",
                   what="a model input with another batch")

    # another sample shape
    other = _model_input(device_mesh, [Shard(0), Shard(2)], (BATCH * 2, 2, 8, 7))
    assert_refused(lambda: MeshLoader(_make(source), layout, like=other), LayoutError,
                   "sample shape (2, 8, 7) (from like.shape[1:]) differs from the shape (2, 8, 6) of the samples",
                   what="a model input of another sample shape")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_world4_loader_output_is_exactly_the_model_input(tmp_path):
    files = _write(tmp_path, 8)
    run_ranks(_like_rank, 4, tmp_path, files, timeout_s=200)


def test_first_batch_is_checked_against_the_model_input(process_group, tmp_path):
    """What cannot be seen before data (here: a model input with another stride) is refused on the
    first batch, naming both sides."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard

    from dali_mesh import Layout, MeshInfo
    from dali_mesh.partition import LayoutError
    from dali_mesh.source import NumpySource
    from dali_mesh.torch import MeshLoader, like_spec

    device_mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "mp"))
    layout = Layout(MeshInfo.from_device_mesh(device_mesh), shard={"mp": 2})
    source = NumpySource(_write(tmp_path, 2), layout, batch_size=BATCH, shuffle=False)
    global_shape = (BATCH,) + SHAPE
    channels_last = (SHAPE[0] * SHAPE[1] * SHAPE[2], 1, SHAPE[2] * SHAPE[0], SHAPE[0])
    like = _model_input(device_mesh, [Shard(0), Shard(3)], global_shape, stride=channels_last)
    loader = MeshLoader(_make(source), layout, like=like)
    with pytest.raises(LayoutError, match=r"the loader's 'window' does not match the model's input \(loader vs "
                                          r"model\): stride \(96, 48, 6, 1\) vs \(96, 1, 12, 2\)"):
        next(loader)

    # the spec alone (DTensorSpec) describes the same input
    spec = like_spec(like._spec)
    assert spec == like_spec(like)
    good = MeshLoader(_make(source), layout, like=_model_input(device_mesh, [Shard(0), Shard(3)], global_shape)._spec)
    batch = next(good)
    np.testing.assert_array_equal(batch["window"].to_local().numpy(), np.stack([np.load(f) for f in source.files]))


def test_like_is_checked_before_any_pipeline():
    from dali_mesh import Layout, MeshInfo
    from dali_mesh.torch import MeshLoader

    layout = Layout(MeshInfo((1,), ("mp",)), shard={"mp": 1})
    with pytest.raises(TypeError, match="like must be a DTensor .* got ndarray"):
        MeshLoader(object(), layout, like=np.zeros((2, 3)))
