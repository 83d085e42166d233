"""The read plans as the C++ reader loads them (csrc/c_api/plan_api.cc): a plan file's dump, the
canonical JSON and checksum of the format, and the test hooks of the device fill and the read tasks."""
from __future__ import annotations

import ctypes
import json
import os

import numpy as np

from dali_mesh._kernels.library import DTYPE_IDS, I64P, KernelsError, bound


def _declare(lib) -> None:
    """The argument and result types of the functions of csrc/c_api/plan_api.cc."""
    lib.dali_mesh_check_device_fill.restype = ctypes.c_int64
    lib.dali_mesh_check_device_fill.argtypes = [ctypes.c_char_p, ctypes.c_int, I64P, ctypes.c_char_p,
                                                ctypes.c_int64]
    lib.dali_mesh_plan_tasks.restype = ctypes.c_int64
    lib.dali_mesh_plan_tasks.argtypes = [ctypes.c_char_p, ctypes.c_int64, I64P, ctypes.c_char_p,
                                         ctypes.c_int64]
    lib.dali_mesh_plan_dump.restype = ctypes.c_int64
    lib.dali_mesh_plan_dump.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int64, ctypes.c_char_p,
                                        ctypes.c_int64]
    lib.dali_mesh_canonical_json.restype = ctypes.c_int64
    lib.dali_mesh_canonical_json.argtypes = [ctypes.c_char_p, ctypes.c_int64, ctypes.c_char_p, ctypes.c_int64]
    lib.dali_mesh_plan_checksum.restype = ctypes.c_int
    lib.dali_mesh_plan_checksum.argtypes = [ctypes.c_char_p, ctypes.c_int64, ctypes.POINTER(ctypes.c_uint64)]


def _lib() -> ctypes.CDLL:
    return bound("plan_api", _declare)


def plan_dump(plan_path: str, *, size_hint: int = 1 << 16) -> dict:
    """The plan file at ``plan_path`` as the C++ reader loads it (LoadPlanSet: checked, JSON checks
    in canonical form): ``{"source", "plans", "files", "parts", "items"}``, every field of
    ``PlanSet``, ``ReadPlan`` (``copy_dst``, ``copy_src``, ``fills``: one list per axis),
    ``PlanFile``, ``PlanPart`` and ``PlanItem`` (csrc/plan/plan.h) under its C++ name;
    ``source``, a file's ``store``, ``key``, ``tag`` and ``check``, and ``fill`` as ``bytes``. A plan file the reader refuses raises
    :class:`KernelsError` with the reader's message. ``size_hint``: the first buffer's size (the
    call is repeated once with the size the library asks for)."""
    lib = _lib()
    err = ctypes.create_string_buffer(1024)
    size = max(int(size_hint), 1)
    for _ in range(2):
        out = ctypes.create_string_buffer(size)
        n = lib.dali_mesh_plan_dump(os.fsencode(plan_path), out, size, err, len(err))
        if n < 0:
            raise KernelsError(err.value.decode(errors="replace"))
        if n < size:
            break
        size = n + 1
    else:
        raise KernelsError(f"{plan_path}: the plan's dump grew between two calls (was the file rewritten?)")
    dump = json.loads(out.raw[:n])
    dump["source"] = bytes.fromhex(dump["source"])
    for f in dump["files"]:
        for k in ("store", "key", "tag", "check"):
            f[k] = bytes.fromhex(f[k])
    for p in dump["plans"]:
        p["check"], p["fill"] = bytes.fromhex(p["check"]), bytes.fromhex(p["fill"])
    for c in dump["coders"]:
        c["fill"] = bytes.fromhex(c["fill"])
    return dump



def canonical_json(text: bytes) -> bytes | None:
    """The canonical form of a JSON object's text, as the C++ reader compares a Zarr array's
    metadata file with its plan (CanonicalJson), or ``None`` when ``text`` is not one JSON object."""
    text = bytes(text)
    lib = _lib()
    size = len(text) + 2  # the canonical form is never longer than the text
    out = ctypes.create_string_buffer(size)
    n = lib.dali_mesh_canonical_json(text, len(text), out, size)
    if n == -1:
        return None
    if n < 0 or n > size:
        raise KernelsError(f"canonical_json: the library returned {n} for {len(text)} bytes of text")
    return out.raw[:n]


def plan_checksum(words: bytes) -> bytes:
    """The plan file checksum (its last word, 8 little-endian bytes) of ``words``, a plan file's
    bytes after the magic without the checksum, as the C++ reader verifies it."""
    words = bytes(words)
    out = ctypes.c_uint64(0)
    if _lib().dali_mesh_plan_checksum(words, len(words), ctypes.byref(out)) != 0:
        raise KernelsError(f"plan_checksum: {len(words)} bytes are not a whole number of 8-byte words")
    return int(out.value).to_bytes(8, "little")


def check_device_fill(plan_path: str, dtype) -> tuple[int, int]:
    """``(checked, host_only)`` for the plan file at ``plan_path`` (items of ``dtype``): every plan
    whose boundary program the GPU strided-slice kernel can run (DeviceFillProgram) finishes a
    window of random bytes both ways, the host program and the kernel's host emulation, and must
    agree byte for byte (``checked`` counts them); ``host_only`` counts the plans left to the host.
    A mismatch or a plan file the loader refuses raises :class:`KernelsError`."""
    host_only, err = ctypes.c_int64(0), ctypes.create_string_buffer(1024)
    checked = _lib().dali_mesh_check_device_fill(os.fsencode(plan_path), DTYPE_IDS[np.dtype(dtype)],
                                                 ctypes.byref(host_only), err, len(err))
    if checked < 0:
        raise KernelsError(err.value.decode(errors="replace"))
    return int(checked), int(host_only.value)


def plan_tasks(plan_path: str, task_bytes: int) -> tuple[int, int]:
    """``(tasks, max_task)``: the plans of the plan file at ``plan_path`` split into read tasks as
    the ``read_windows`` operator splits them (groups of at most about ``task_bytes``): the number of
    tasks of all plans and the most file bytes one task spans."""
    most, err = ctypes.c_int64(0), ctypes.create_string_buffer(1024)
    n = _lib().dali_mesh_plan_tasks(os.fsencode(plan_path), int(task_bytes), ctypes.byref(most), err,
                                    len(err))
    if n < 0:
        raise KernelsError(err.value.decode(errors="replace"))
    return int(n), int(most.value)

