"""The dali_mesh DALI plugin (``libdali_mesh.so``, built into the package folder by
``pip install --no-build-isolation -e .`` or ``make``): found, checked against the installed DALI and
loaded once, on the first use of one of its operators. It links the kernels library beside it
(``libdali_mesh_kernels.so``, which ctypes loads too: one native core per process), so its operators read
through the very stores Python made: their credentials, objects and callbacks are given once, when each
store is made."""
from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import nvidia.dali as dali
import nvidia.dali.fn as dali_fn

__all__ = ["PLUGIN_PATH", "load_plugin"]

log = logging.getLogger(__name__)

PLUGIN_PATH = Path(__file__).parent.parent / "libdali_mesh.so"
_REBUILD = "rebuild it with `pip install --no-build-isolation -e .` (or `make`) from the repository root"
_lock = threading.Lock()
_ops_module = None


def load_plugin() -> Any:
    """Loads ``libdali_mesh.so`` into DALI once; returns ``nvidia.dali.fn.dali_mesh``.

    Raises ``ImportError`` when the library is missing, was built against another DALI version than
    the one installed, or DALI refuses it; the message says how to rebuild.
    """
    global _ops_module
    with _lock:
        if _ops_module is not None:
            return _ops_module
        if not PLUGIN_PATH.exists():
            raise ImportError(f"the dali_mesh DALI plugin {PLUGIN_PATH} is missing: {_REBUILD}")
        try:
            from dali_mesh import _build_info
        except ImportError:
            raise ImportError(
                f"{PLUGIN_PATH.with_name('_build_info.py')} is missing, so the DALI version the "
                f"plugin was built against is unknown: {_REBUILD}") from None
        if _build_info.DALI_VERSION != dali.__version__:
            raise ImportError(
                f"the dali_mesh plugin {PLUGIN_PATH} was built against DALI {_build_info.DALI_VERSION} "
                f"but DALI {dali.__version__} is installed: {_REBUILD}")
        from nvidia.dali import plugin_manager

        try:
            plugin_manager.load_library(str(PLUGIN_PATH))
        except RuntimeError as e:
            raise ImportError(f"DALI could not load the dali_mesh plugin {PLUGIN_PATH} ({e}): "
                              f"{_REBUILD}") from e
        from dali_mesh._kernels.library import KernelsError, check_one_core  # noqa: PLC0415

        try:
            check_one_core()  # the plugin's kernels library beside a ctypes-loaded one elsewhere
        except KernelsError as e:
            raise ImportError(str(e)) from None
        ops = getattr(dali_fn, "dali_mesh", None)
        if ops is None or not hasattr(ops, "strided_slice") or not hasattr(ops, "mesh_roi"):
            raise ImportError(f"{PLUGIN_PATH} loaded but registered no dali_mesh operators: {_REBUILD}")
        log.debug("loaded %s (DALI %s, CUDA kernels: %s)", PLUGIN_PATH, dali.__version__,
                  getattr(_build_info, "WITH_CUDA", None))
        cuda = getattr(_build_info, "CUDA_VERSION", "")
        dali_cuda = getattr(_build_info, "DALI_CUDA_MAJOR", "")
        if getattr(_build_info, "WITH_CUDA", False) and cuda and dali_cuda and cuda.split(".")[0] != dali_cuda:
            log.info("the dali_mesh GPU operator was built with CUDA %s, DALI with CUDA %s: the GPU "
                     "operator needs a driver for CUDA %s (>= 580 for CUDA 13)", cuda, dali_cuda,
                     cuda.split(".")[0])
        _ops_module = ops
        return ops


def reads_in_flight() -> list[dict]:
    """The native reads of the loaded plugin now in flight: ``{"path", "offset", "bytes",
    "seconds"}`` each (``[]`` when the plugin is not loaded or has no such entry point)."""
    import ctypes  # noqa: PLC0415
    import json  # noqa: PLC0415

    fn = _entry("dali_mesh_reads_in_flight", ctypes.c_int64, [ctypes.c_char_p, ctypes.c_int64])
    if fn is None:
        return []
    size = 4096
    for _ in range(3):
        buf = ctypes.create_string_buffer(size)
        n = fn(buf, size)
        if n < size:
            break
        size = n + 4096
    out = [json.loads(line) for line in buf.raw[:n].decode().splitlines() if line]
    for r in out:
        r["path"] = bytes.fromhex(r["path"]).decode(errors="replace")
    return out


def cancel_reads() -> None:
    """Make the native reads now in flight fail, interrupting those blocked in the kernel (after a
    pipeline failure, so that its threads return and the process can exit); reads started later
    are not affected. Every read in flight in the process, also another pipeline's."""
    fn = _entry("dali_mesh_cancel_reads", None, [])
    if fn is not None:
        fn()


def _entry(name: str, restype, argtypes):
    """An entry point of the plugin if DALI has loaded it (never loads it)."""
    import ctypes  # noqa: PLC0415

    if _ops_module is None:
        return None
    fn = getattr(ctypes.CDLL(str(PLUGIN_PATH)), name, None)
    if fn is not None:
        fn.restype, fn.argtypes = restype, argtypes
    return fn


def plugin_read_ahead_counts() -> tuple[int, int, int]:
    """``(used, dropped, failed)``: batches the operator read from what it had read ahead, batches it
    read ahead then dropped unused (the sample order went elsewhere), and batches whose read ahead
    failed (read again when wanted), in this process."""
    import ctypes  # noqa: PLC0415

    load_plugin()
    fn = _entry("dali_mesh_read_ahead_counts", None, [ctypes.POINTER(ctypes.c_int64)])
    out = (ctypes.c_int64 * 3)()
    fn(out)
    return int(out[0]), int(out[1]), int(out[2])

