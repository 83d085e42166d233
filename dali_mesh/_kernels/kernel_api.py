"""The kernels of the operators ``strided_slice`` and ``mesh_roi`` (csrc/c_api/c_api.cc): the CPU kernel,
the GPU kernel's host emulation and the CUDA kernel on device pointers, and the index helpers."""
from __future__ import annotations

import ctypes
from typing import Sequence

import numpy as np

from dali_mesh._kernels.library import (BOUNDARY_IDS, DTYPE_IDS, F32P, I32P, I64P, SPLIT_IDS, VPP, KernelsError, _f32,
                                        _i32, _i64, bound)


def _declare(lib) -> None:
    """The argument and result types of the functions of csrc/c_api/c_api.cc."""
    lib.dm_has_cuda.restype = ctypes.c_int
    lib.dm_boundary_index.restype = ctypes.c_int64
    lib.dm_boundary_index.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_int]
    lib.dm_fast_div.restype = ctypes.c_uint64
    lib.dm_fast_div.argtypes = [ctypes.c_uint64, ctypes.c_uint64]
    lib.dm_mesh_roi.restype = ctypes.c_int
    lib.dm_mesh_roi.argtypes = [
        I64P, ctypes.c_int, ctypes.c_int, I64P, I64P, I64P, ctypes.c_int, I64P, I64P, ctypes.c_int,
        I32P, ctypes.c_int, I64P, ctypes.c_int64, I64P, I64P, I64P, I64P, I64P, ctypes.c_char_p,
        ctypes.c_int,
    ]
    lib.dm_strided_slice.restype = ctypes.c_int
    lib.dm_strided_slice.argtypes = [
        ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, VPP, VPP, I64P, I64P, I64P, I64P,
        I32P, I64P, I64P, ctypes.c_int, ctypes.c_int, ctypes.c_double, ctypes.c_int, ctypes.c_int64,
        ctypes.c_int, ctypes.c_int, ctypes.c_int, F32P, F32P, ctypes.c_void_p, ctypes.c_char_p,
        ctypes.c_int,
    ]
    lib.dm_gpu_plan_info.restype = ctypes.c_int
    lib.dm_gpu_plan_info.argtypes = [
        ctypes.c_int, ctypes.c_int, VPP, VPP, I64P, I64P, I64P, I64P, I32P, ctypes.c_int,
        ctypes.c_int, ctypes.c_int, I64P, ctypes.c_char_p, ctypes.c_int,
    ]
    lib.dm_floats_to_half.restype = None
    lib.dm_floats_to_half.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    lib.dm_cuda_launcher_create.restype = ctypes.c_void_p
    lib.dm_cuda_launcher_destroy.argtypes = [ctypes.c_void_p]


def _lib() -> ctypes.CDLL:
    return bound("c_api", _declare)


def has_cuda() -> bool:
    """Whether the library was built with the CUDA kernels."""
    return bool(_lib().dm_has_cuda())


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
    lib = _lib()
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
        self.handle = _lib().dm_cuda_launcher_create()
        if not self.handle:
            raise KernelsError("this kernels library was built without CUDA")

    def close(self) -> None:
        if self.handle:
            _lib().dm_cuda_launcher_destroy(self.handle)
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
    lib = _lib()
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
    lib = _lib()
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
    _lib().dm_floats_to_half(x.ctypes.data, out.ctypes.data, x.size)
    return out


def boundary_index(r: int, n: int, mode: str) -> int:
    return int(_lib().dm_boundary_index(int(r), int(n), BOUNDARY_IDS[mode]))


def fast_div(divisor: int, n: int) -> int:
    """``n // divisor`` computed by the kernels' multiply-high division (for tests)."""
    return int(_lib().dm_fast_div(int(divisor), int(n)))

