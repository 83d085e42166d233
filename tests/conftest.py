"""Fixtures shared by the test modules."""
import pytest


@pytest.fixture(scope="module")
def process_group(tmp_path_factory):
    """A one-rank gloo process group for the module: enough to build real DeviceMeshes and DTensors."""
    import torch.distributed as dist

    store = tmp_path_factory.mktemp("pg") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
