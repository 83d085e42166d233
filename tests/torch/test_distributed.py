"""Real processes, gloo on the CPU: MeshInfo from a DeviceMesh, windows of an arange batch, and
DTensor.from_local(...).full_tensor() equal to the global batch."""
import pytest

torch = pytest.importorskip("torch")

from dali_mesh.cli.launch import RankFailure, run_ranks  # noqa: E402


def _dtensor_round_trip(rank, world_size, global_shape, shard, split):
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from dali_mesh import Layout, MeshInfo

    device_mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("data_parallel", "model_parallel"))
    mesh = MeshInfo.from_device_mesh(device_mesh)
    assert mesh.rank == rank == torch.distributed.get_rank()
    assert mesh.coordinate == (device_mesh.get_local_rank("data_parallel"), device_mesh.get_local_rank("model_parallel"))
    layout = Layout(mesh, shard=shard, split=split)
    batch_size = 3
    n = layout.num_batch_groups * batch_size
    global_batch = torch.arange(n * torch.Size(global_shape).numel(), dtype=torch.float32).reshape(n, *global_shape)
    # this rank's part: its sample group's samples (Shard(0) on the batch dims), its window of each
    b = layout.batch_index
    region = layout.region(global_shape)
    local = global_batch[b * batch_size:(b + 1) * batch_size][(slice(None),) + region.window_slices].contiguous()
    dt = DTensor.from_local(local, device_mesh, layout.dtensor_placements(len(global_shape)),
                            shape=global_batch.shape, stride=global_batch.stride())
    full = dt.full_tensor()
    assert torch.equal(full, global_batch), f"rank {rank}: gathered batch differs"


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("global_shape,shard", [((3, 7, 5), {"model_parallel": 1}), ((5, 3), {"model_parallel": -1})])
def test_dtensor_from_local_equals_global_batch(tmp_path, global_shape, shard):
    run_ranks(_dtensor_round_trip, 4, tmp_path, global_shape, shard, "chunk", timeout_s=90)


def _fails_on_rank_1(rank, world_size):
    if rank == 1:
        raise RuntimeError("deliberate failure on rank 1")
    import torch.distributed as dist

    dist.barrier()  # the other ranks wait here until the group times out: must not hang the test


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_failing_rank_fails_the_test_without_hanging(tmp_path):
    with pytest.raises(RankFailure, match="deliberate failure on rank 1"):
        run_ranks(_fails_on_rank_1, 4, tmp_path, timeout_s=20)
