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
