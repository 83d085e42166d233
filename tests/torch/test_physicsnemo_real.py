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
