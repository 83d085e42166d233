"""The kernels library itself: where it is, its ABI check, the ids its C API takes, and the declared
functions of each C API file (:func:`bound`: each binding module declares its own, as csrc/c_api/ has one
file per job)."""
from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path
from typing import Callable

import numpy as np

LIB_NAME = "libdali_mesh_kernels.so"
#: the C API this module calls (csrc/c_api/c_api.cc dm_abi_version)
ABI_VERSION = 16
#: numpy dtype -> DALI type id (the ids the C API takes)
DTYPE_IDS = {
    np.dtype(np.uint8): 0, np.dtype(np.uint16): 1, np.dtype(np.uint32): 2, np.dtype(np.uint64): 3,
    np.dtype(np.int8): 4, np.dtype(np.int16): 5, np.dtype(np.int32): 6, np.dtype(np.int64): 7,
    np.dtype(np.float16): 8, np.dtype(np.float32): 9, np.dtype(np.float64): 10, np.dtype(np.bool_): 11,
}
BOUNDARY_IDS = {"constant": 0, "periodic": 1, "reflect": 2, "symmetric": 3, "edge": 4, "trim": 5}
SPLIT_IDS = {"chunk": 0, "physicsnemo": 1, "even": 2, "explicit": 3}

I64P = ctypes.POINTER(ctypes.c_int64)
I32P = ctypes.POINTER(ctypes.c_int32)
F32P = ctypes.POINTER(ctypes.c_float)
VPP = ctypes.POINTER(ctypes.c_void_p)

_lib = None
_declared: set[str] = set()
_declaring = threading.Lock()


class KernelsError(RuntimeError):
    """The kernels library refused the arguments or is missing."""


def library_path() -> Path:
    """Where the library is: ``$DALI_MESH_KERNELS_LIB`` or next to this file."""
    env = os.environ.get("DALI_MESH_KERNELS_LIB")
    return Path(env) if env else Path(__file__).parent.parent / LIB_NAME  # dali_mesh/, beside the plugin


def load() -> ctypes.CDLL:
    global _lib
    if _lib is not None:
        return _lib
    path = library_path()
    if not path.exists():
        raise KernelsError(
            f"{path} is missing: build the plugin with `pip install --no-build-isolation -e .` (or "
            "`make`) from the repository root"
        )
    lib = ctypes.CDLL(str(path))
    lib.dm_abi_version.restype = ctypes.c_int
    # before the symbols are looked up: an older library lacks some of them
    if lib.dm_abi_version() != ABI_VERSION:
        raise KernelsError(f"{path} has ABI version {lib.dm_abi_version()}, expected {ABI_VERSION}: "
                           "rebuild it (`pip install --no-build-isolation -e .`, or `make kernels`)")
    check_one_core()
    _lib = lib
    return lib


def check_one_core() -> None:
    """Refuses a process that maps two copies of the native core (``$DALI_MESH_KERNELS_LIB`` naming a library
    other than the one the DALI plugin links, beside it): each would hold its own stores, credentials,
    counters and caches, and a store given to one would be unknown to the other. A ``KernelsError``
    naming both and the fix."""
    try:
        with open("/proc/self/maps") as f:
            mapped = {line.split(None, 5)[5].strip() for line in f if line.rstrip().endswith("/" + LIB_NAME)}
    except (OSError, IndexError):  # no /proc (another OS): nothing to check
        return
    copies = sorted({os.path.realpath(p) for p in mapped})
    if len(copies) > 1:
        raise KernelsError(f"two copies of the native core are loaded ({' and '.join(copies)}): the DALI plugin "
                           f"links the one beside it; unset DALI_MESH_KERNELS_LIB (or point it at that one) in a "
                           "process that runs DALI pipelines")


def bound(group: str, declare: Callable[[ctypes.CDLL], None]) -> ctypes.CDLL:
    """The library, with the argument and result types of one C API file's functions set by
    ``declare(lib)`` (once per process: ctypes would otherwise take every argument as a C int)."""
    lib = load()
    if group not in _declared:
        with _declaring:
            if group not in _declared:
                declare(lib)
                _declared.add(group)
    return lib


def _i64(values) -> ctypes.Array:
    v = [int(x) for x in values]
    return (ctypes.c_int64 * max(len(v), 1))(*v)


def _i32(values) -> ctypes.Array:
    v = [int(x) for x in values]
    return (ctypes.c_int32 * max(len(v), 1))(*v)


def _f32(values) -> ctypes.Array:
    v = [float(x) for x in values]
    return (ctypes.c_float * max(len(v), 1))(*v)
