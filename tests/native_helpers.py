"""Shared by the native reader's tests (tests/test_read_windows.py, tests/test_native_*.py)."""
import pytest

from dali_mesh import MeshInfo


def needs_read_windows():
    """Skips the calling test unless the plugin is built and has the read_windows operator."""
    from dali_mesh.fn import load_plugin

    try:
        ops = load_plugin()
    except ImportError as e:
        pytest.skip(f"plugin not built: {e}")
    if not hasattr(ops, "read_windows"):
        pytest.skip("the plugin has no read_windows operator: rebuild it")


def mesh_of(shape, coord):
    """A mesh whose first dim is data_parallel and the others m0, m1, ...; this rank at ``coord``."""
    names = ("data_parallel",) + tuple(f"m{i}" for i in range(len(shape) - 1))
    return MeshInfo(shape, names, coord)


def dali_gpus() -> int:
    """CUDA devices DALI sees (0 without a driver: DALI says so by raising)."""
    try:
        from nvidia.dali import backend

        return backend.GetCUDADeviceCount()
    except Exception:  # noqa: BLE001
        return 0
