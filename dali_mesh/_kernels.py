"""ctypes access to ``libdali_mesh_kernels.so``, the DALI-free library built with the plugin.

It runs the same host code and kernels as the DALI operators ``strided_slice``, ``mesh_roi`` and
``read_windows`` (the read plans' loader and executor):

* ``backend="cpu"``: the CPU kernel, as the DALI CPU operator runs it (one thread);
* ``backend="emulate"``: the GPU kernel body run on the host thread by thread (the descriptors,
  vectorisation and index math that ship to the GPU, checked without one);
* ``backend="cuda"``: the CUDA kernel on device pointers (torch or cupy memory), see
  :func:`strided_slice_device`;
* the read plans written by :mod:`dali_mesh.plan`: :func:`plan_dump` (a plan file as the C++
  reader loads it), :func:`canonical_json` and :func:`plan_checksum` (the format's canonical JSON
  and checksum, as the reader computes them), and the test hooks :func:`check_device_fill` and
  :func:`plan_tasks`;
* the reader itself: :class:`PlanReader` reads a plan file's windows for a list of sample ids as
  ``fn.dali_mesh.read_windows`` does on the CPU (csrc/reader/), without DALI;
* the codecs: :func:`codec_table` (the one list of codecs, csrc/codecs/codec_table.inc, from which
  :data:`dali_mesh.plan.CODECS` comes), :func:`codec_available`, :func:`decode_chunk`.

Used by the tests and ``benchmarks/kernel_bench.py``; numpy only (no DALI, no torch).
"""
from __future__ import annotations

import ctypes
import json
import os
from pathlib import Path
from typing import Sequence

import numpy as np

__all__ = [
    "DTYPE_IDS",
    "BOUNDARY_IDS",
    "SPLIT_IDS",
    "KernelsError",
    "library_path",
    "load",
    "has_cuda",
    "strided_slice_host",
    "strided_slice_device",
    "mesh_roi",
    "boundary_index",
    "fast_div",
    "gpu_plan_info",
    "plan_dump",
    "canonical_json",
    "plan_checksum",
    "check_device_fill",
    "plan_tasks",
    "PlanReader",
    "codec_table",
    "codec_available",
    "decode_chunk",
    "decode_chunk_ranges",
    "CudaLauncher",
]

LIB_NAME = "libdali_mesh_kernels.so"
#: the C API this module calls (csrc/c_api/c_api.cc dm_abi_version)
ABI_VERSION = 11
#: numpy dtype -> DALI type id (the ids the C API takes)
DTYPE_IDS = {
    np.dtype(np.uint8): 0, np.dtype(np.uint16): 1, np.dtype(np.uint32): 2, np.dtype(np.uint64): 3,
    np.dtype(np.int8): 4, np.dtype(np.int16): 5, np.dtype(np.int32): 6, np.dtype(np.int64): 7,
    np.dtype(np.float16): 8, np.dtype(np.float32): 9, np.dtype(np.float64): 10, np.dtype(np.bool_): 11,
}
BOUNDARY_IDS = {"constant": 0, "periodic": 1, "reflect": 2, "symmetric": 3, "edge": 4, "trim": 5}
SPLIT_IDS = {"chunk": 0, "physicsnemo": 1, "even": 2, "explicit": 3}

_lib = None


class KernelsError(RuntimeError):
    """The kernels library refused the arguments or is missing."""


def library_path() -> Path:
    """Where the library is: ``$DALI_MESH_KERNELS_LIB`` or next to this file."""
    env = os.environ.get("DALI_MESH_KERNELS_LIB")
    return Path(env) if env else Path(__file__).with_name(LIB_NAME)


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
    i64p = ctypes.POINTER(ctypes.c_int64)
    i32p = ctypes.POINTER(ctypes.c_int32)
    f32p = ctypes.POINTER(ctypes.c_float)
    vpp = ctypes.POINTER(ctypes.c_void_p)
    lib.dm_has_cuda.restype = ctypes.c_int
    lib.dm_boundary_index.restype = ctypes.c_int64
    lib.dm_boundary_index.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_int]
    lib.dm_fast_div.restype = ctypes.c_uint64
    lib.dm_fast_div.argtypes = [ctypes.c_uint64, ctypes.c_uint64]
    lib.dm_mesh_roi.restype = ctypes.c_int
    lib.dm_mesh_roi.argtypes = [
        i64p, ctypes.c_int, ctypes.c_int, i64p, i64p, i64p, ctypes.c_int, i64p, i64p, ctypes.c_int,
        i32p, ctypes.c_int, i64p, ctypes.c_int64, i64p, i64p, i64p, i64p, i64p, ctypes.c_char_p,
        ctypes.c_int,
    ]
    lib.dm_strided_slice.restype = ctypes.c_int
    lib.dm_strided_slice.argtypes = [
        ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, vpp, vpp, i64p, i64p, i64p, i64p,
        i32p, i64p, i64p, ctypes.c_int, ctypes.c_int, ctypes.c_double, ctypes.c_int, ctypes.c_int64,
        ctypes.c_int, ctypes.c_int, ctypes.c_int, f32p, f32p, ctypes.c_void_p, ctypes.c_char_p,
        ctypes.c_int,
    ]
    lib.dm_gpu_plan_info.restype = ctypes.c_int
    lib.dm_gpu_plan_info.argtypes = [
        ctypes.c_int, ctypes.c_int, vpp, vpp, i64p, i64p, i64p, i64p, i32p, ctypes.c_int,
        ctypes.c_int, ctypes.c_int, i64p, ctypes.c_char_p, ctypes.c_int,
    ]
    lib.dm_floats_to_half.restype = None
    lib.dm_floats_to_half.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    lib.dm_cuda_launcher_create.restype = ctypes.c_void_p
    lib.dm_cuda_launcher_destroy.argtypes = [ctypes.c_void_p]
    lib.dali_mesh_check_device_fill.restype = ctypes.c_int64
    lib.dali_mesh_check_device_fill.argtypes = [ctypes.c_char_p, ctypes.c_int, i64p, ctypes.c_char_p,
                                                ctypes.c_int64]
    lib.dali_mesh_plan_tasks.restype = ctypes.c_int64
    lib.dali_mesh_plan_tasks.argtypes = [ctypes.c_char_p, ctypes.c_int64, i64p, ctypes.c_char_p,
                                         ctypes.c_int64]
    lib.dali_mesh_plan_dump.restype = ctypes.c_int64
    lib.dali_mesh_plan_dump.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int64, ctypes.c_char_p,
                                        ctypes.c_int64]
    lib.dali_mesh_canonical_json.restype = ctypes.c_int64
    lib.dali_mesh_canonical_json.argtypes = [ctypes.c_char_p, ctypes.c_int64, ctypes.c_char_p, ctypes.c_int64]
    lib.dali_mesh_plan_checksum.restype = ctypes.c_int
    lib.dali_mesh_codec_available.argtypes = [ctypes.c_int64]
    lib.dali_mesh_codec_available.restype = ctypes.c_int
    lib.dali_mesh_decode_chunk.argtypes = [i64p, i64p, ctypes.c_int64, ctypes.c_int64, ctypes.c_char_p,
                                           ctypes.c_int64, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int64]
    lib.dali_mesh_decode_chunk.restype = ctypes.c_int64
    lib.dali_mesh_decode_chunk_ranges.argtypes = [i64p, i64p, ctypes.c_int64, ctypes.c_int64, ctypes.c_char_p,
                                                  ctypes.c_int64, i64p, ctypes.c_int64, ctypes.c_int, ctypes.c_int64,
                                                  ctypes.c_char_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_char_p,
                                                  ctypes.c_int64]
    lib.dali_mesh_decode_chunk_ranges.restype = ctypes.c_int64
    lib.dali_mesh_plan_checksum.argtypes = [ctypes.c_char_p, ctypes.c_int64, ctypes.POINTER(ctypes.c_uint64)]
    lib.dali_mesh_codec_table.restype = ctypes.c_int64
    lib.dali_mesh_codec_table.argtypes = [ctypes.c_char_p, ctypes.c_int64]
    lib.dali_mesh_reader_open.restype = ctypes.c_void_p
    lib.dali_mesh_reader_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int,
                                          f32p, f32p, ctypes.c_int64, ctypes.c_int, ctypes.c_int, ctypes.c_char_p,
                                          ctypes.c_int64]
    lib.dali_mesh_reader_close.restype = None
    lib.dali_mesh_reader_close.argtypes = [ctypes.c_void_p]
    lib.dali_mesh_reader_shapes.restype = ctypes.c_int64
    lib.dali_mesh_reader_shapes.argtypes = [ctypes.c_void_p, i64p, ctypes.c_int64, i64p, i64p, ctypes.c_int64,
                                            ctypes.c_char_p, ctypes.c_int64]
    lib.dali_mesh_reader_read.restype = ctypes.c_int64
    lib.dali_mesh_reader_read.argtypes = [ctypes.c_void_p, i64p, ctypes.c_int64, vpp, i64p, ctypes.c_int,
                                          ctypes.c_char_p, ctypes.c_int64]
    lib.dali_mesh_reader_read_ahead.restype = ctypes.c_int64
    lib.dali_mesh_reader_read_ahead.argtypes = [ctypes.c_void_p, i64p, ctypes.c_int64, ctypes.c_int, ctypes.c_char_p,
                                                ctypes.c_int64]
    lib.dali_mesh_reader_ahead_alive.restype = ctypes.c_int64
    lib.dali_mesh_reader_ahead_alive.argtypes = []
    lib.dali_mesh_reader_ahead_counts.restype = None
    lib.dali_mesh_reader_ahead_counts.argtypes = [ctypes.c_void_p, i64p]
    _lib = lib
    return lib


def ahead_alive() -> int:
    """Batches read ahead whose buffers exist now in this process (each is freed once its batch was
    read, dropped or taken back and its job has ended): what a test of leaks counts."""
    return int(load().dali_mesh_reader_ahead_alive())


def has_cuda() -> bool:
    """Whether the library was built with the CUDA kernels."""
    return bool(load().dm_has_cuda())


def _i64(values) -> ctypes.Array:
    v = [int(x) for x in values]
    return (ctypes.c_int64 * max(len(v), 1))(*v)


def _i32(values) -> ctypes.Array:
    v = [int(x) for x in values]
    return (ctypes.c_int32 * max(len(v), 1))(*v)


def _f32(values) -> ctypes.Array:
    v = [float(x) for x in values]
    return (ctypes.c_float * max(len(v), 1))(*v)


def _per_sample(value, n: int, ndim: int, name: str) -> list[list[int]]:
    """One list of ndim ints per sample, from one list for all samples or one per sample."""
    arr = np.asarray(value, dtype=object)
    if arr.ndim == 1 or (arr.ndim == 0):
        rows = [list(np.broadcast_to(np.asarray(value), (ndim,)))] * n
    else:
        rows = [list(r) for r in value]
    if len(rows) != n or any(len(r) != ndim for r in rows):
        raise KernelsError(f"{name} {value!r} needs {ndim} values per sample for {n} samples")
    return rows


def _boundary_ids(boundary, n: int, ndim: int) -> list[list[int]]:
    if isinstance(boundary, str):
        boundary = [boundary] * ndim
    if boundary and isinstance(boundary[0], str):
        boundary = [list(boundary)] * n
    return [[BOUNDARY_IDS[b] for b in row] for row in boundary]


def fill_value_args(fill_value) -> tuple[float, int, int]:
    """``(fill_value, fill_kind, fill_int)`` of the C API: integers travel exactly as an int64 (kind
    1) or a uint64's bits (kind 2), floats as a double (kind 0)."""
    if isinstance(fill_value, (bool, np.bool_)):
        fill_value = int(fill_value)
    if isinstance(fill_value, (int, np.integer)):
        v = int(fill_value)
        if -(1 << 63) <= v < (1 << 63):
            return float(v), 1, v
        if 0 <= v < (1 << 64):
            return float(v), 2, v - (1 << 64)
        raise KernelsError(f"fill_value {v} is beyond the int64 and uint64 ranges: no output type "
                           "can hold it")
    try:
        return float(fill_value), 0, 0
    except (TypeError, ValueError):
        raise KernelsError(f"fill_value {fill_value!r} is not a number: pass an int or a float") from None


def _call_slice(backend: int, launcher, ptrs_in, ptrs_out, shapes, start, shape, step, boundary,
                domain_start, domain_shape, in_dtype, out_dtype, fill_value, channel_axis, mean,
                std, stream) -> None:
    lib = load()
    n = len(ptrs_in)
    ndim = len(shapes[0]) if n else 0
    err = ctypes.create_string_buffer(1024)
    flat = lambda rows: [v for r in rows for v in r]  # noqa: E731
    vin = (ctypes.c_void_p * max(n, 1))(*ptrs_in)
    vout = (ctypes.c_void_p * max(n, 1))(*ptrs_out)
    has_dom = domain_start is not None
    nch = 0 if mean is None else len(mean)
    fill_double, fill_kind, fill_int = fill_value_args(fill_value)
    rc = lib.dm_strided_slice(
        backend, launcher, n, ndim, vin, vout, _i64(flat(shapes)),
        _i64(flat(_per_sample(start, n, ndim, "start"))),
        _i64(flat(_per_sample(shape, n, ndim, "shape"))),
        _i64(flat(_per_sample(step, n, ndim, "step"))),
        _i32(flat(_boundary_ids(boundary, n, ndim))),
        _i64(flat(_per_sample(domain_start, n, ndim, "domain_start"))) if has_dom else None,
        _i64(flat(_per_sample(domain_shape, n, ndim, "domain_shape"))) if has_dom else None,
        DTYPE_IDS[np.dtype(in_dtype)], DTYPE_IDS[np.dtype(out_dtype)], fill_double, fill_kind,
        fill_int, int(channel_axis is not None), int(channel_axis or 0), nch,
        _f32(mean or []), _f32(std or []), stream, err, len(err),
    )
    if rc != 0:
        raise KernelsError(err.value.decode())


def strided_slice_host(samples: Sequence[np.ndarray], start, shape, step=1, boundary="constant", *,
                       dtype=None, fill_value=0, channel_axis=None, mean=None, std=None,
                       domain_start=None, domain_shape=None, backend: str = "cpu",
                       out: Sequence[np.ndarray] | None = None) -> list[np.ndarray]:
    """Strided slice of host arrays (every axis listed); ``start``/``shape``/``step`` are one list
    for all samples or one list per sample; ``boundary`` one name, one per axis, or per sample.
    ``out``: preallocated C-contiguous outputs of the right shapes and dtype."""
    samples = [np.ascontiguousarray(s) for s in samples]
    n = len(samples)
    if n == 0:
        return []
    in_dtype = samples[0].dtype
    out_dtype = np.dtype(dtype) if dtype is not None else (
        np.dtype(np.float32) if mean is not None else in_dtype)
    ndim = samples[0].ndim
    shapes = [list(s.shape) for s in samples]
    out_shapes = _per_sample(shape, n, ndim, "shape")
    if out is None:
        outs = [np.empty([max(int(v), 0) for v in sh], dtype=out_dtype) for sh in out_shapes]
    else:
        outs = list(out)
        for o, sh in zip(outs, out_shapes):
            if o.dtype != out_dtype or list(o.shape) != [int(v) for v in sh] or not o.flags.c_contiguous:
                raise KernelsError(f"out array {o.dtype}{o.shape} does not match {out_dtype}{tuple(sh)}")
    _call_slice({"cpu": 0, "emulate": 1}[backend], None,
                [s.ctypes.data for s in samples], [o.ctypes.data for o in outs], shapes, start,
                shape, step, boundary, domain_start, domain_shape, in_dtype, out_dtype, fill_value,
                channel_axis, mean, std, None)
    return outs


def strided_slice_device(in_ptrs, out_ptrs, in_shapes, start, shape, step=1, boundary="constant",
                         *, in_dtype, out_dtype=None, fill_value=0, channel_axis=None, mean=None,
                         std=None, domain_start=None, domain_shape=None, stream=None,
                         launcher: "CudaLauncher | None" = None) -> None:
    """Launches the CUDA kernel on device pointers (asynchronous on ``stream``, an int handle)."""
    out_dtype = out_dtype if out_dtype is not None else (np.float32 if mean is not None else in_dtype)
    _call_slice(2, launcher.handle if launcher else None, list(in_ptrs), list(out_ptrs),
                [list(s) for s in in_shapes], start, shape, step, boundary, domain_start,
                domain_shape, in_dtype, out_dtype, fill_value, channel_axis, mean, std, stream)


class CudaLauncher:
    """Keeps the descriptor buffers between launches (as the DALI GPU operator does)."""

    def __init__(self) -> None:
        self.handle = load().dm_cuda_launcher_create()
        if not self.handle:
            raise KernelsError("this kernels library was built without CUDA")

    def close(self) -> None:
        if self.handle:
            load().dm_cuda_launcher_destroy(self.handle)
            self.handle = None

    def __enter__(self) -> "CudaLauncher":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


#: the conversion kernels of the GPU plan (csrc/kernels/slice_gpu.h ConvKind)
CONV_KINDS = {-1: "copy", 0: "generic", 1: "float32->float16", 2: "float32->float32",
              3: "uint8->float32", 4: "float16->float32"}


def gpu_plan_info(samples: Sequence[np.ndarray], start, shape, step=1, boundary="constant",
                  dtype=None, *, normalize_channels: int = 0, outs: Sequence[np.ndarray] | None = None) -> dict:
    """What the GPU path would launch for host arrays. A sample whose window leaves its domain is
    cut into pieces: its in-bounds box (moved like an unpadded copy) and the halo strips around it.
    ``elem_size`` (bytes per move of a copy, the widest over the pieces; 0 when converting),
    ``sample_elem_sizes`` (input bytes per move in each sample's largest piece, its in-bounds box
    unless the halo outweighs it: a copy or a typed conversion; 0 for the generic conversion),
    ``num_pieces``, ``piece_elements`` (the output elements the pieces cover: they partition the
    outputs), ``need_pad``, ``convert``, ``conv`` (the conversion kernel:
    ``copy``, ``generic`` or a typed pair) and ``num_blocks``. ``normalize_channels``: plan with
    normalisation over that many channels of axis 0. ``outs``: output arrays (their alignment
    matters), allocated when omitted."""
    lib = load()
    n = len(samples)
    ndim = samples[0].ndim
    err = ctypes.create_string_buffer(1024)
    flat = lambda rows: [v for r in rows for v in r]  # noqa: E731
    out_dtype = np.dtype(dtype) if dtype is not None else (
        np.dtype(np.float32) if normalize_channels else samples[0].dtype)
    if outs is None:
        outs = [np.empty([int(v) for v in sh], out_dtype) for sh in _per_sample(shape, n, ndim, "shape")]
    res = (ctypes.c_int64 * (7 + n))()
    rc = lib.dm_gpu_plan_info(
        n, ndim, (ctypes.c_void_p * n)(*[s.ctypes.data for s in samples]),
        (ctypes.c_void_p * n)(*[o.ctypes.data for o in outs]),
        _i64(flat([list(s.shape) for s in samples])), _i64(flat(_per_sample(start, n, ndim, "start"))),
        _i64(flat(_per_sample(shape, n, ndim, "shape"))), _i64(flat(_per_sample(step, n, ndim, "step"))),
        _i32(flat(_boundary_ids(boundary, n, ndim))), DTYPE_IDS[samples[0].dtype],
        DTYPE_IDS[out_dtype], int(normalize_channels), res, err, len(err))
    if rc != 0:
        raise KernelsError(err.value.decode())
    return {"elem_size": res[0], "need_pad": bool(res[1]), "convert": bool(res[2]),
            "num_blocks": res[3], "conv": CONV_KINDS[res[4]], "num_pieces": res[5 + n],
            "piece_elements": res[6 + n],
            "sample_elem_sizes": [res[5 + i] for i in range(n)]}


def mesh_roi(shape, *, mesh_shape, coordinate, shard_axes, halo_lo, halo_hi, boundary,
             split="chunk", split_size_counts=None, split_sizes=None, crop_start=None,
             crop_stop=None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(window_start, window_shape)`` by the C++ rules (the DALI ``mesh_roi`` operator's code).

    ``split="explicit"`` takes ``split_size_counts`` (one per mesh dim) and ``split_sizes``, as
    :meth:`dali_mesh.Layout.split_sizes_flat` gives them."""
    lib = load()
    ndim, m = len(shape), len(mesh_shape)
    if split not in SPLIT_IDS:
        raise KernelsError(f"split {split!r} is not known; expected one of {', '.join(SPLIT_IDS)}")
    if (split_size_counts is None) != (split_sizes is None):
        raise KernelsError("give both split_size_counts and split_sizes, or neither")
    if split_size_counts is not None and len(split_size_counts) != m:
        # the C side reads one count per mesh dim: a shorter list would be read past its end
        raise KernelsError(f"split_size_counts {list(split_size_counts)} needs one entry per mesh dim of "
                           f"mesh_shape {list(mesh_shape)}")
    boundary = [boundary] if isinstance(boundary, str) else list(boundary)
    ws, wsh = (ctypes.c_int64 * ndim)(), (ctypes.c_int64 * ndim)()
    err = ctypes.create_string_buffer(1024)
    rc = lib.dm_mesh_roi(
        _i64(shape), ndim, m, _i64(mesh_shape), _i64(coordinate), _i64(shard_axes), len(halo_lo),
        _i64(halo_lo), _i64(halo_hi), len(boundary), _i32([BOUNDARY_IDS[b] for b in boundary]),
        SPLIT_IDS[split], _i64(split_size_counts) if split_size_counts is not None else None,
        len(split_sizes) if split_sizes is not None else 0,
        _i64(split_sizes) if split_sizes is not None else None,
        _i64(crop_start) if crop_start is not None else None,
        _i64(crop_stop) if crop_stop is not None else None, ws, wsh, err, len(err))
    if rc != 0:
        raise KernelsError(err.value.decode())
    return tuple(ws), tuple(wsh)


def floats_to_half(x: np.ndarray) -> np.ndarray:
    """float32 -> float16 by the kernels' software conversion (used where the CPU lacks F16C)."""
    x = np.ascontiguousarray(x, np.float32)
    out = np.empty(x.shape, np.float16)
    load().dm_floats_to_half(x.ctypes.data, out.ctypes.data, x.size)
    return out


def boundary_index(r: int, n: int, mode: str) -> int:
    return int(load().dm_boundary_index(int(r), int(n), BOUNDARY_IDS[mode]))


def fast_div(divisor: int, n: int) -> int:
    """``n // divisor`` computed by the kernels' multiply-high division (for tests)."""
    return int(load().dm_fast_div(int(divisor), int(n)))


# ---- read plans (csrc/c_api/plan_api.cc) ------------------------------------------------------------
def plan_dump(plan_path: str, *, size_hint: int = 1 << 16) -> dict:
    """The plan file at ``plan_path`` as the C++ reader loads it (LoadPlanSet: checked, JSON checks
    in canonical form): ``{"source", "plans", "files", "parts", "items"}``, every field of
    ``PlanSet``, ``ReadPlan`` (``copy_dst``, ``copy_src``, ``fills``: one list per axis),
    ``PlanFile``, ``PlanPart`` and ``PlanItem`` (csrc/plan/plan.h) under its C++ name;
    ``source``, a file's ``store``, ``key``, ``tag`` and ``check``, and ``fill`` as ``bytes``. A plan file the reader refuses raises
    :class:`KernelsError` with the reader's message. ``size_hint``: the first buffer's size (the
    call is repeated once with the size the library asks for)."""
    lib = load()
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


# ---- codecs (csrc/c_api/codec_api.cc) --------------------------------------------------------------
_codec_table = None


def codec_table() -> tuple[dict, ...]:
    """The reader's codec table (csrc/codecs/codec_table.inc, the one list of codecs), one dict per
    codec in table order: ``id`` (as plan files write it), ``name``, ``kind`` (``"decompressor"``,
    ``"checksum"`` or ``"keeps_size"``), ``library`` (what decodes it, ``""`` for a step built
    in) and ``available`` (whether this build has that library). :class:`KernelsError` when the
    library is not built."""
    global _codec_table
    if _codec_table is None:
        lib = load()
        n = lib.dali_mesh_codec_table(None, 0)
        out = ctypes.create_string_buffer(n + 1)
        if lib.dali_mesh_codec_table(out, n + 1) != n:
            raise KernelsError("codec_table: the library's table changed between two calls")
        _codec_table = tuple(json.loads(out.raw[:n]))
    return _codec_table


def codec_available(codec_id: int) -> bool:
    """Whether this build of the reader decodes codec ``codec_id`` (``read_plan.CODECS``): its
    library (``codec_table()``'s ``library``) was found when the plugin was built."""
    return bool(load().dali_mesh_codec_available(int(codec_id)))


def decode_chunk(steps, chunk_bytes: int, data: bytes) -> bytes:
    """``data`` (a stored chunk) decoded by the coder ``steps`` (``[(codec id, arg), ...]`` in decode
    order) into ``chunk_bytes`` bytes, by the reader's own code (DecodeChunk); :class:`KernelsError`
    with the reader's reason for a chunk it refuses."""
    data = bytes(data)
    ids = _i64([s[0] for s in steps] or [0])
    args = _i64([s[1] for s in steps] or [0])
    out = ctypes.create_string_buffer(max(int(chunk_bytes), 1))
    err = ctypes.create_string_buffer(1024)
    rc = load().dali_mesh_decode_chunk(ids, args, len(steps), int(chunk_bytes), data, len(data), out, err, len(err))
    if rc < 0:
        raise KernelsError(err.value.decode(errors="replace"))
    return out.raw[:int(chunk_bytes)]


def decode_chunk_ranges(steps, chunk_bytes: int, data: bytes, ranges, *, stale: int = 0x5A,
                        min_parts: int = -1) -> tuple[bytes, bool]:
    """Only the byte ``ranges`` (``[(first, stop), ...]``, sorted and disjoint) of the stored chunk
    ``data`` decoded as the reader decodes a batch's ranges: its stored bytes read as a read takes
    them (a Blosc chunk of at least ``min_parts`` stored bytes in parts: header, block index, the
    blocks the ranges touch; -1: the reader's 256 KiB) into a buffer of ``stale`` bytes, then decoded.
    Returns the chunk-sized output (bytes outside the ranges are undefined) and whether it was read
    in parts; :class:`KernelsError` with the reader's reason."""
    out, parts, _ = read_chunk_ranges(steps, chunk_bytes, data, ranges, stale=stale, min_parts=min_parts)
    return out, parts


def read_chunk_ranges(steps, chunk_bytes: int, data: bytes, ranges, *, guess_from: bytes | None = None,
                      stale: int = 0x5A, min_parts: int = -1) -> tuple[bytes, bool, int]:
    """As :func:`decode_chunk_ranges`; with ``guess_from`` (the stored bytes of another chunk of the same
    coder) that chunk is read first for the same ranges, and the layout it shows is the guess the read
    of ``data`` starts from, as a remote store's reads start (its header and index fetched together
    with the parts the guess places). Returns ``(output, read in parts, reads in turn)``: the reads in
    turn are the round trips a remote store would take."""
    data = bytes(data)
    prev = None if guess_from is None else bytes(guess_from)
    ids = _i64([s[0] for s in steps] or [0])
    args = _i64([s[1] for s in steps] or [0])
    flat = _i64([v for r in ranges for v in r] or [0])
    out = ctypes.create_string_buffer(max(int(chunk_bytes), 1))
    err = ctypes.create_string_buffer(1024)
    rc = load().dali_mesh_decode_chunk_ranges(ids, args, len(steps), int(chunk_bytes), data, len(data), flat,
                                              len(ranges), int(stale), int(min_parts), prev,
                                              0 if prev is None else len(prev), out, err, len(err))
    if rc < 0:
        raise KernelsError(err.value.decode(errors="replace"))
    return out.raw[:int(chunk_bytes)], bool(rc & 1), int(rc >> 1)


def canonical_json(text: bytes) -> bytes | None:
    """The canonical form of a JSON object's text, as the C++ reader compares a Zarr array's
    metadata file with its plan (CanonicalJson), or ``None`` when ``text`` is not one JSON object."""
    text = bytes(text)
    lib = load()
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
    if load().dali_mesh_plan_checksum(words, len(words), ctypes.byref(out)) != 0:
        raise KernelsError(f"plan_checksum: {len(words)} bytes are not a whole number of 8-byte words")
    return int(out.value).to_bytes(8, "little")


def check_device_fill(plan_path: str, dtype) -> tuple[int, int]:
    """``(checked, host_only)`` for the plan file at ``plan_path`` (items of ``dtype``): every plan
    whose boundary program the GPU strided-slice kernel can run (DeviceFillProgram) finishes a
    window of random bytes both ways, the host program and the kernel's host emulation, and must
    agree byte for byte (``checked`` counts them); ``host_only`` counts the plans left to the host.
    A mismatch or a plan file the loader refuses raises :class:`KernelsError`."""
    host_only, err = ctypes.c_int64(0), ctypes.create_string_buffer(1024)
    checked = load().dali_mesh_check_device_fill(os.fsencode(plan_path), DTYPE_IDS[np.dtype(dtype)],
                                                 ctypes.byref(host_only), err, len(err))
    if checked < 0:
        raise KernelsError(err.value.decode(errors="replace"))
    return int(checked), int(host_only.value)


def plan_tasks(plan_path: str, task_bytes: int) -> tuple[int, int]:
    """``(tasks, max_task)``: the plans of the plan file at ``plan_path`` split into read tasks as
    the ``read_windows`` operator splits them (groups of at most about ``task_bytes``): the number of
    tasks of all plans and the most file bytes one task spans."""
    most, err = ctypes.c_int64(0), ctypes.create_string_buffer(1024)
    n = load().dali_mesh_plan_tasks(os.fsencode(plan_path), int(task_bytes), ctypes.byref(most), err,
                                    len(err))
    if n < 0:
        raise KernelsError(err.value.decode(errors="replace"))
    return int(n), int(most.value)


# ---- the reader (csrc/c_api/reader_api.cc) ------------------------------------------------------------
class PlanReader:
    """The native reader's batch reader (csrc/reader/batch_reader.h) on the plan file at
    ``plan_path``, driven without DALI: :meth:`read` gives the windows of a list of sample ids as
    ``fn.dali_mesh.read_windows`` gives them on the CPU (the same prefetch, read tasks of about
    ``task_bytes``, chunks decoded once per batch, file versions checked per batch, boundary cells
    and normalisation), its tasks on ``threads`` threads of the library's own.

    Args:
        plan_path: a plan file written by :meth:`dali_mesh.plan.PlanSet.write`.
        dtype: the windows' numpy dtype (native byte order, the plans' item size).
        outputs: windows per sample id (a forecast's input and target: 2).
        task_bytes, prefetch: as the operator's arguments.
        normalize: ``(channel_axis, mean, std)``, as ``read_windows(normalize=...)``.
        read_ahead: the operator's argument: ``0`` never, ``1`` when the plans read an object
            store, ``2`` always (:meth:`read_ahead`).

    The loader's and the reader's errors raise :class:`KernelsError` with the reader's message.
    Use as a context manager, or call :meth:`close`.
    """

    MAX_NDIM = 32

    def __init__(self, plan_path: str, dtype, *, outputs: int = 1, task_bytes: int = 4 << 20, prefetch: bool = True,
                 normalize=None, read_ahead: int = 1) -> None:
        self.dtype = np.dtype(dtype)
        self.outputs = int(outputs)
        axis, mean, std = normalize if normalize is not None else (-1, (), ())
        mean, std = np.ascontiguousarray(mean, np.float32), np.ascontiguousarray(std, np.float32)
        if mean.shape != std.shape:
            raise ValueError(f"normalize: {mean.size} means but {std.size} standard deviations")
        f32p = ctypes.POINTER(ctypes.c_float)
        err = ctypes.create_string_buffer(1024)
        self._lib = load()
        self._handle = self._lib.dali_mesh_reader_open(
            os.fsencode(plan_path), DTYPE_IDS[self.dtype], self.outputs, int(task_bytes), int(bool(prefetch)),
            mean.ctypes.data_as(f32p), std.ctypes.data_as(f32p), mean.size, int(axis), int(read_ahead), err, len(err))
        if not self._handle:
            raise KernelsError(err.value.decode(errors="replace"))

    def shapes(self, ids: Sequence[int]) -> list[tuple[int, ...]]:
        """The shapes of the windows of the batch ``ids``: ``outputs * len(ids)`` of them, output
        ``k``'s window of ``ids[i]`` at ``k * len(ids) + i``."""
        ids = list(ids)
        return self._shapes(_i64(ids), len(ids))

    def read(self, ids: Sequence[int], *, threads: int = 1) -> list[list[np.ndarray]]:
        """The windows of the batch ``ids`` (sample ids of the plan set), read on ``threads``
        threads: ``[output][i]`` is output ``k``'s window of ``ids[i]``."""
        ids = list(ids)
        n = len(ids)
        c_ids = _i64(ids)
        shapes = self._shapes(c_ids, n)
        wins = [np.empty(shape, self.dtype) for shape in shapes]
        ptrs = (ctypes.c_void_p * max(len(wins), 1))(*[w.ctypes.data for w in wins])
        sizes = _i64([w.nbytes for w in wins] or [0])
        err = ctypes.create_string_buffer(4096)
        if self._lib.dali_mesh_reader_read(self._handle, c_ids, n, ptrs, sizes, int(threads), err, len(err)) < 0:
            raise KernelsError(err.value.decode(errors="replace"))
        return [wins[k * n:(k + 1) * n] for k in range(self.outputs)]

    def read_ahead(self, ids: Sequence[int], *, threads: int = 1) -> bool:
        """Starts reading the batch ``ids`` in the background (as the operator reads the next
        batch while it reads this one): a later :meth:`read` of the same ids waits for it and copies
        its windows, or raises its error. Whether it was started (reading ahead is on, the batch fits
        and its ids are in range)."""
        ids = list(ids)
        err = ctypes.create_string_buffer(4096)
        got = self._lib.dali_mesh_reader_read_ahead(self._handle, _i64(ids), len(ids), int(threads), err, len(err))
        if got < 0:
            raise KernelsError(err.value.decode(errors="replace"))
        return bool(got)

    def ahead_counts(self) -> tuple[int, int, int]:
        """``(used, dropped, failed)``: batches read from what was read ahead, batches read ahead then
        dropped unused, and batches whose read ahead failed (read again by :meth:`read`)."""
        out = (ctypes.c_int64 * 3)()
        self._lib.dali_mesh_reader_ahead_counts(self._handle, out)
        return int(out[0]), int(out[1]), int(out[2])

    def _shapes(self, c_ids, n: int) -> list[tuple[int, ...]]:
        count = self.outputs * n
        ndims = (ctypes.c_int64 * max(count, 1))()
        extents = (ctypes.c_int64 * max(count * self.MAX_NDIM, 1))()
        err = ctypes.create_string_buffer(4096)
        got = self._lib.dali_mesh_reader_shapes(self._handle, c_ids, n, ndims, extents, self.MAX_NDIM, err, len(err))
        if got < 0:
            raise KernelsError(err.value.decode(errors="replace"))
        return [tuple(extents[j * self.MAX_NDIM:j * self.MAX_NDIM + ndims[j]]) for j in range(got)]

    def close(self) -> None:
        if getattr(self, "_handle", None):
            self._lib.dali_mesh_reader_close(self._handle)
            self._handle = None

    def __enter__(self) -> "PlanReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


# ---- numpy reference (the oracle of the tests) ------------------------------------------------------
def cast_saturate(values: np.ndarray, dtype) -> np.ndarray:
    """The operator's cast: to integers rounded to nearest (ties to even), NaN -> 0, saturated;
    to floats IEEE rounding (numpy's astype); to bool ``!= 0``."""
    dtype = np.dtype(dtype)
    values = np.asarray(values)
    if dtype == np.bool_:
        return values != 0
    if dtype.kind == "f":
        with np.errstate(over="ignore", invalid="ignore"):  # overflow -> inf, as the kernels
            return values.astype(dtype)
    info = np.iinfo(dtype)
    if values.dtype.kind == "f":
        v = np.rint(values.astype(np.float64))
        v = np.where(np.isnan(v), 0.0, v)
        out = np.empty(v.shape, dtype)
        lo, hi = v <= float(info.min), v >= float(info.max)
        mid = ~(lo | hi)
        out[mid] = v[mid].astype(dtype)
        out[lo] = info.min
        out[hi] = info.max
        return out
    v = values.astype(object) if values.dtype != np.bool_ else values.astype(np.int64).astype(object)
    v = np.minimum(np.maximum(v, int(info.min)), int(info.max)) if v.size else v
    return np.asarray(v, dtype=object).astype(dtype).reshape(values.shape)


def reference_strided_slice(x: np.ndarray, start, shape, step=1, boundary="constant", *,
                            dtype=None, fill_value=0, channel_axis=None, mean=None, std=None,
                            domain_start=None, domain_shape=None) -> np.ndarray:
    """numpy oracle: normalise, crop to the domain, pad per axis (``np.pad`` rules, through
    :func:`dali_mesh.partition.boundary_index`), step, cast. Every axis listed."""
    from dali_mesh.partition import boundary_index  # noqa: PLC0415

    x = np.asarray(x)
    ndim = x.ndim
    step = [step] * ndim if np.ndim(step) == 0 else list(step)
    boundary = [boundary] * ndim if isinstance(boundary, str) else list(boundary)
    out_dtype = np.dtype(dtype) if dtype is not None else (
        np.dtype(np.float32) if mean is not None else x.dtype)
    vals = x
    if mean is not None:
        m = np.asarray(mean, np.float32)
        s = np.asarray(std, np.float32)
        if channel_axis is not None:
            bshape = [1] * ndim
            bshape[channel_axis] = -1
            m, s = m.reshape(bshape), s.reshape(bshape)
        vals = (x.astype(np.float32) - m) / s
    d0 = [0] * ndim if domain_start is None else list(domain_start)
    dn = list(x.shape) if domain_shape is None else list(domain_shape)
    vals = vals[tuple(slice(a, a + n) for a, n in zip(d0, dn))]
    index, fill = [], []
    for a in range(ndim):
        pos = int(start[a]) - d0[a] + np.arange(int(shape[a]), dtype=np.int64) * int(step[a])
        if dn[a] == 0:
            idx = np.full(pos.shape, -1, np.int64)
        else:
            idx = np.asarray(boundary_index(pos, dn[a], boundary[a]), np.int64).reshape(pos.shape)
        fill.append(idx < 0)
        index.append(np.where(idx < 0, 0, idx))
    out_shape = tuple(int(v) for v in shape)
    if any(v == 0 for v in out_shape):
        return np.empty(out_shape, out_dtype)
    if any(v == 0 for v in vals.shape):  # empty domain, constant everywhere
        return np.full(out_shape, fill_value, dtype=out_dtype)
    out = cast_saturate(vals[np.ix_(*index)], out_dtype)
    for a, mask in enumerate(fill):
        if mask.any():
            sel = [slice(None)] * ndim
            sel[a] = mask
            out[tuple(sel)] = np.asarray(fill_value).astype(out_dtype)
    return out
