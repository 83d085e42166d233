"""GPU tests of the DALI-free kernels library (ctypes on torch or cupy device memory).

They need a CUDA GPU, ``libdali_mesh_kernels.so`` built with CUDA (``dali_mesh/`` after
``pip install --no-build-isolation -e .`` with nvcc on PATH, or ``$DALI_MESH_KERNELS_LIB``), and torch
with CUDA or cupy. Without them every test here is skipped. DALI is not needed.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

# the repository root, for tests.helpers (the oracles and random data), also when tests/gpu runs alone;
# never tests/ itself (tests/torch would hide torch)
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


class Device:
    """Raw device buffers from torch or cupy (bytes; the kernels take pointers)."""

    def __init__(self, name: str, mod) -> None:
        self.name, self.mod = name, mod

    def to_device(self, x: np.ndarray, offset: int = 0):
        raw = np.ascontiguousarray(x).reshape(-1).view(np.uint8)
        buf = self.empty(raw.size + offset)
        if self.name == "torch":
            buf[offset:].copy_(self.mod.from_numpy(raw.copy()))
        else:
            buf[offset:] = self.mod.asarray(raw)
        return buf

    def empty(self, nbytes: int):
        if self.name == "torch":
            return self.mod.empty(max(nbytes, 1), dtype=self.mod.uint8, device="cuda")
        return self.mod.empty(max(nbytes, 1), dtype=self.mod.uint8)

    def ptr(self, buf, offset: int = 0) -> int:
        return (buf.data_ptr() if self.name == "torch" else buf.data.ptr) + offset

    def to_host(self, buf, offset: int, shape, dtype) -> np.ndarray:
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        raw = buf[offset:offset + n]
        host = raw.cpu().numpy() if self.name == "torch" else self.mod.asnumpy(raw)
        return host.view(dtype).reshape(shape)

    def stream(self) -> int:
        if self.name == "torch":
            return self.mod.cuda.current_stream().cuda_stream
        return self.mod.cuda.get_current_stream().ptr

    def sync(self) -> None:
        if self.name == "torch":
            self.mod.cuda.synchronize()
        else:
            self.mod.cuda.runtime.deviceSynchronize()


def _find_device():
    try:
        import torch

        if torch.cuda.is_available():
            return Device("torch", torch)
    except ImportError:
        pass
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            return Device("cupy", cupy)
    except Exception:  # cupy missing, or no driver / device
        pass
    return None


@pytest.fixture(scope="session")
def device():
    dev = _find_device()
    if dev is None:
        pytest.skip("no CUDA GPU (or neither torch with CUDA nor cupy)")
    from dali_mesh import _kernels as K

    if not K.library_path().exists():
        pytest.skip(f"{K.library_path()} is not built")
    if not K.has_cuda():
        pytest.skip(f"{K.library_path()} was built without CUDA (no nvcc at build time)")
    return dev
