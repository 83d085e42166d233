"""MeshInfo.from_physicsnemo against the installed PhysicsNeMo (issue 18): a real DistributedManager on
4 gloo processes. Skipped where PhysicsNeMo is not installed (``make test`` installs it)."""
from __future__ import annotations

import pytest

from dali_mesh.cli.launch import run_ranks

pytest.importorskip("torch")
pytest.importorskip("physicsnemo.distributed", reason="PhysicsNeMo is not installed (make test installs it)")


def _manager(rank, world_size):
    """PhysicsNeMo's DistributedManager on the process group run_ranks made (gloo, CPU).

    Workaround, in this test only: DistributedManager.setup() calls init_process_group with
    device_id=torch.device("cpu"), which torch refuses ("device_id parameter must be an accelerator
    with an index") and it only falls back on TypeError; so the manager's state is set here as
    setup() sets it, on the group that already exists."""
    import torch
    from physicsnemo.distributed import DistributedManager

    DistributedManager._shared_state["_is_initialized"] = True
    m = DistributedManager()
    m._distributed = True
    m._rank, m._world_size, m._local_rank = rank, world_size, rank
    m._device = torch.device("cpu")
    return m


def _from_physicsnemo_rank(rank, world_size, shapes):
    from physicsnemo.distributed import DistributedManager

    from dali_mesh import MeshInfo
    from dali_mesh.mesh import MeshError

    m = _manager(rank, world_size)
    # no mesh made yet: refused, and the manager is left as it was (PhysicsNeMo's global_mesh
    # property would make a 1-D ("world",) mesh as a side effect)
    with pytest.raises(MeshError, match="initialize_mesh"):
        MeshInfo.from_physicsnemo()
    with pytest.raises(MeshError, match="initialize_mesh"):
        MeshInfo.from_physicsnemo(m)
    assert DistributedManager()._global_mesh is None
    for shape, names in shapes:
        mesh = m.initialize_mesh(mesh_shape=shape, mesh_dim_names=names)
        info = MeshInfo.from_physicsnemo()
        assert info.names == tuple(names)
        assert info.shape == tuple(mesh.shape)
        assert info.coordinate == tuple(mesh.get_local_rank(d) for d in range(mesh.ndim))
        assert MeshInfo.from_physicsnemo(m) == info


@pytest.mark.timeout(200)
def test_from_physicsnemo_with_a_real_distributed_manager(tmp_path):
    shapes = [((2, 2), ("ddp", "spatial")), ((-1,), ("world",)), ((2, -1), ("dp", "mp")),
              ((1, 2, 2), ("a", "b", "c"))]
    run_ranks(_from_physicsnemo_rank, 4, tmp_path, shapes, timeout_s=180)


def _empty_shard_offsets_rank(rank, world_size, cases):
    """Layout.from_shard_tensor of a real ShardTensor with empty shards: every rank's region starts
    where ShardTensor.offsets() says its shard does (a running sum), its sizes are the shard's."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard

    from physicsnemo.domain_parallel import ShardTensor

    from dali_mesh import Layout

    mesh = init_device_mesh("cpu", (world_size,), mesh_dim_names=("spatial",))
    for sizes in cases:
        shapes = {0: [(2, s, 4) for s in sizes]}  # batch 2, rows split by `sizes`, 4 columns
        local = torch.zeros(2, sizes[rank], 4)
        st = ShardTensor.from_local(local, mesh, [Shard(1)], sharding_shapes=shapes)
        layout = Layout.from_shard_tensor(st)
        region = layout.region((sum(sizes), 4))
        want = st.offsets(0)
        want = want[rank] if isinstance(want, (list, tuple)) else want
        assert region.start[0] == int(want), (sizes, rank, region, st.offsets())
        assert region.stop[0] - region.start[0] == sizes[rank]


@pytest.mark.timeout(200)
def test_empty_shards_sit_where_shard_tensor_puts_them(tmp_path):
    cases = [(0, 3, 3, 0), (4, 0, 2, 3), (1, 1, 1, 0), (0, 0, 0, 3)]
    run_ranks(_empty_shard_offsets_rank, 4, tmp_path, cases, timeout_s=180)


def _like_shard_tensor_rank(rank, world_size, files, shape):
    """MeshLoader(like=shard_tensor): the layout from the model's ShardTensor (PhysicsNeMo's own
    "chunk" shapes, compute_split_shapes), ShardTensors out that equal the model's spec and hold the
    data; a layout that splits otherwise is refused before any data, naming both splits."""
    import numpy as np
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard

    from physicsnemo.domain_parallel import ShardTensor

    from dali_mesh import Layout, MeshInfo
    from dali_mesh.partition import LayoutError
    from dali_mesh.source import NumpySource
    from dali_mesh.torch import MeshLoader, like_spec
    from tests.helpers import assert_refused
    from tests.torch.test_like import _make

    mesh = init_device_mesh("cpu", (world_size,), mesh_dim_names=("spatial",))
    batch = 2
    global_shape = (batch,) + shape
    # what a PhysicsNeMo model built for this mesh takes: rows split by ShardTensor's own "chunk"
    # (compute_split_shapes: 5 rows over 4 ranks are 1, 1, 1, 2; torch.chunk would say 2, 2, 1, 0)
    from physicsnemo.distributed.utils import compute_split_shapes

    rows = compute_split_shapes(shape[1], world_size)
    local = torch.zeros((batch, shape[0], rows[rank], shape[2]))
    model_input = ShardTensor.from_local(local, mesh, [Shard(2)], sharding_shapes="chunk", global_shape=global_shape)
    assert like_spec(model_input)["sharding_shapes"][0] == tuple((batch, shape[0], r, shape[2]) for r in rows)

    layout = Layout.from_shard_tensor(model_input)
    assert layout.split == "physicsnemo", layout
    source = NumpySource(files, layout, batch_size=batch, shuffle=False)
    loader = MeshLoader(_make(source), like=model_input)
    assert loader.output == "shard_tensor"
    steps = 0
    for out in loader:
        st = out["window"]
        assert type(st).__name__ == "ShardTensor"
        assert tuple(st.placements) == tuple(model_input.placements) and st.shape == model_input.shape
        assert st.to_local().shape == model_input.to_local().shape
        assert like_spec(st)["sharding_shapes"] == like_spec(model_input)["sharding_shapes"]
        want = np.stack([np.load(files[s]) for s in out["sample_id"].tolist()])
        np.testing.assert_array_equal(st.full_tensor().numpy(), want)
        steps += 1
    assert steps == len(source) // batch
    loader.close()

    # a layout with torch.chunk's split (2, 2, 1, 0) against the model's (1, 1, 1, 2): refused up front
    chunked = Layout(MeshInfo.from_device_mesh(mesh), shard={"spatial": 1}, split="chunk")
    other = NumpySource(files, chunked, batch_size=batch, shuffle=False)
    assert_refused(lambda: MeshLoader(_make(other), chunked, like=model_input), LayoutError,
                   "(2, 2, 6), (2, 2, 6), (2, 1, 6), (2, 0, 6)", "(2, 1, 6), (2, 1, 6), (2, 1, 6), (2, 2, 6)",
                   what="a layout splitting otherwise than the model's ShardTensor")
    # a ShardTensor input wants ShardTensor output
    assert_refused(lambda: MeshLoader(_make(source), like=model_input, output="dtensor"), ValueError,
                   "like= describes a ShardTensor input: use output='shard_tensor'",
                   what="output='dtensor' for a ShardTensor like=")


@pytest.mark.timeout(240)
def test_like_a_shard_tensor(tmp_path, monkeypatch):
    import os

    import numpy as np

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    shape = (2, 5, 6)
    files = []
    for i in range(4):
        f = str(tmp_path / f"s{i}.npy")
        np.save(f, np.arange(np.prod(shape), dtype=np.float32).reshape(shape) + 100 * i)
        files.append(f)
    run_ranks(_like_shard_tensor_rank, 4, tmp_path, files, shape, timeout_s=200)


def test_split_names_side_by_side_with_the_libraries():
    """split="shard_tensor" is what ShardTensor makes itself (PhysicsNeMo's compute_split_shapes, which
    ShardTensor calls "chunk"); split="dtensor" is torch.chunk (DTensor's Shard): checked against the
    libraries' own functions."""
    import torch
    from physicsnemo.distributed.utils import compute_split_shapes

    from dali_mesh import Layout, MeshInfo

    for k in range(1, 9):
        for n in range(k, 40):  # compute_split_shapes needs n >= k
            sizes = {}
            for name in ("shard_tensor", "dtensor"):
                layouts = [Layout(MeshInfo((k,), ("mp",), (i,)), shard={"mp": 0}, split=name) for i in range(k)]
                sizes[name] = [lay.region((n,)).shape[0] for lay in layouts]
            assert sizes["shard_tensor"] == list(compute_split_shapes(n, k)), (n, k)
            assert sizes["dtensor"] == [len(c) for c in torch.chunk(torch.arange(n), k)] + \
                [0] * (k - len(torch.chunk(torch.arange(n), k))), (n, k)
    mesh = MeshInfo((4,), ("mp",), (0,))
    assert Layout(mesh, shard={"mp": 0}, split="shard_tensor") == Layout(mesh, shard={"mp": 0}, split="physicsnemo")
    assert Layout(mesh, shard={"mp": 0}, split="dtensor").split == "chunk"
