"""MeshLoader in one process: local windows, padded samples dropped or flagged, per-sample shapes as
lists, and clear errors for outputs that cannot be."""
from __future__ import annotations

import numpy as np
import pytest

from dali_mesh import Layout, MeshInfo
from dali_mesh.partition import LayoutError
from dali_mesh.source import NumpySource

pytest.importorskip("nvidia.dali")
from dali_mesh.torch import MeshLoader  # noqa: E402
from tests.helpers import np_pad_sample  # noqa: E402


def _files(tmp_path, shapes):
    files = []
    for i, shape in enumerate(shapes):
        f = str(tmp_path / f"s{i}.npy")
        np.save(f, np.arange(np.prod(shape), dtype=np.int32).reshape(shape) + 1000 * i)
        files.append(f)
    return files


def _pipe(source, batch_size):
    from nvidia.dali import pipeline_def

    from dali_mesh.pipeline.external import partitioned_source

    @pipeline_def(batch_size=batch_size, num_threads=1, device_id=None, py_num_workers=1, py_start_method="spawn")
    def pipe():
        return partitioned_source(source)

    return pipe()


def _layout(coordinate=(1, 0), **kw):
    # sample group `coordinate[0]` of 2; the model-parallel dim splits axis 1 with one cell of halo
    return Layout(MeshInfo((2, 2), ("dp", "mp"), coordinate), shard={"mp": 1}, halo={1: 1},
                  boundary={1: "symmetric"}, **kw)


def test_padded_samples_flagged_or_dropped(tmp_path):
    files = _files(tmp_path, [(2, 6, 4)] * 5)
    layout = _layout()
    source = NumpySource(files, layout, batch_size=2, shuffle=False)
    ids, pads = source.order(0)
    assert pads.any()  # 5 samples over 2 groups: group 1 pads
    flagged = list(MeshLoader(_pipe(source, 2), layout))
    assert [b["sample_id"].tolist() for b in flagged] == [ids[i:i + 2].tolist() for i in range(0, len(ids), 2)]
    assert [b["is_pad"].tolist() for b in flagged] == [pads[i:i + 2].tolist() for i in range(0, len(pads), 2)]
    region = layout.region((2, 6, 4))
    for b in flagged:
        for sid, w in zip(b["sample_id"].tolist(), b["window"].numpy()):
            np.testing.assert_array_equal(w, np_pad_sample(np.load(files[sid]), region))
    dropped = list(MeshLoader(_pipe(source, 2), layout, drop_padded=True))
    assert len(dropped) == len(flagged)  # the same number of steps
    got = [i for b in dropped for i in b["sample_id"].tolist()]
    assert got == ids[~pads].tolist()
    assert all(not b["is_pad"].any() for b in dropped)


def test_per_sample_shapes_come_as_lists(tmp_path):
    shapes = [(2, 6, 4), (2, 9, 5), (2, 3, 7)]
    files = _files(tmp_path, shapes)
    layout = _layout(coordinate=(0, 1))
    source = NumpySource(files, layout, batch_size=3, shuffle=False, per_sample_shapes=True)
    batches = list(MeshLoader(_pipe(source, 3), layout, per_sample_shapes=True))
    assert len(batches) == 1
    windows = batches[0]["window"]
    assert isinstance(windows, list) and len(windows) == 3
    for sid, w in zip(batches[0]["sample_id"].tolist(), windows):
        sample = np.load(files[sid])
        np.testing.assert_array_equal(w.numpy(), np_pad_sample(sample, layout.region(sample.shape)))


@pytest.mark.parametrize("kwargs,match", [
    ({"output": "dtensor"}, "needs device_mesh"),
    ({"output": "dtensor", "device_mesh": object()}, "needs sample_shape"),
    ({"output": "dtensor", "device_mesh": object(), "sample_shape": (2, 6, 4), "per_sample_shapes": True},
     "not possible with per-sample shapes"),
    ({"output": "dtensor", "device_mesh": object(), "sample_shape": (2, 6, 4), "drop_padded": True},
     "drop_padded would make ranks' batches differ"),
    ({"output": "tensor"}, "unknown output 'tensor'"),
])
def test_loader_argument_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MeshLoader(object(), _layout(), **kwargs)


def test_no_dtensor_for_other_splits():
    with pytest.raises(LayoutError, match="no DTensor for split='even'"):
        MeshLoader(object(), _layout(split="even"), output="dtensor", device_mesh=object(), sample_shape=(2, 6, 4))


def test_explicit_chunk_sizes_to_dtensor_single_rank(tmp_path):
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from dali_mesh.torch import to_dtensor

    if dist.is_initialized():
        pytest.skip("a process group is already running")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        dm = init_device_mesh("cpu", (1,), mesh_dim_names=("mp",))
        layout = Layout(MeshInfo((1,), ("mp",), (0,)), shard={"mp": 0}, split={"mp": [5]})
        local = torch.arange(2 * 5 * 3, dtype=torch.float32).reshape(2, 5, 3)
        t = to_dtensor(local, layout, (5, 3), dm)
        assert tuple(t.shape) == (2, 5, 3) and torch.equal(t.to_local(), local)
    finally:
        dist.destroy_process_group()
