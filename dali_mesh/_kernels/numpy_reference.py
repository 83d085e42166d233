"""The numpy reference of the kernels (the oracle of the tests): the operator's cast and strided
slice written plainly in numpy."""
from __future__ import annotations

import numpy as np

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
