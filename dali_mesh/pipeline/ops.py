"""The plugin's operators as Python functions with checked arguments: :func:`strided_slice`,
:func:`mesh_roi`, and :func:`mesh_slice` (the two together on data already in the pipeline).
Re-exported by :mod:`dali_mesh.fn`."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import nvidia.dali as dali
import nvidia.dali.types as types

from dali_mesh.pipeline.plugin import load_plugin

__all__ = ["strided_slice", "mesh_roi", "mesh_roi_args", "mesh_slice", "slice_boundaries"]

_INT32 = (-(1 << 31), (1 << 31) - 1)


def _int(value, name: str) -> int:
    """An integer argument: a Python or numpy integer (not a bool, a float or a string)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer (a Python or numpy int), got {value!r} of type "
                        f"{type(value).__name__}")
    return int(value)


def _int_list(values, name: str, bounds: tuple[int, int], beyond: str,
              what: str = "a sequence of ints") -> list[int]:
    """``values`` as a list of ints within ``bounds``: integers only (floats, bools and strings are
    refused, not truncated); ``beyond`` says what is wrong with a value outside the bounds."""
    if isinstance(values, (str, bytes)):
        raise TypeError(f"{name} must be {what}, got {values!r}")
    try:
        items = list(values)
    except TypeError:
        raise TypeError(f"{name} must be {what}, got {values!r}") from None
    out = [_int(v, f"{name} entry") for v in items]
    for v in out:
        if not bounds[0] <= v <= bounds[1]:
            raise ValueError(f"{name} value {v} {beyond}")
    return out


def _as_list(value, name: str) -> Any:
    """A DataNode (per-sample argument input) as is; an int or a sequence as a list of ints.

    Constant arguments travel as DALI int32 vectors: larger values must come as per-sample int64
    argument inputs (e.g. ``fn.constant`` or ``mesh_roi``'s outputs), so they are refused here.
    Floats (``1.7``), bools and strings are refused, not truncated."""
    if isinstance(value, dali.data_node.DataNode):
        return value
    if isinstance(value, (int, np.integer, bool, np.bool_, float, np.floating)):
        value = [_int(value, name)]
    return _int_list(value, name, _INT32, "does not fit a 32-bit constant argument: pass it as a per-sample "
                     "int64 argument input (a DataNode) instead", "an int, a sequence of ints or a DataNode")


def _floats(values, name: str, *, nonzero: bool = False) -> list[float]:
    """Finite real numbers (one value or a sequence): NaN, inf, bools and strings are refused."""
    if isinstance(values, (int, float, np.integer, np.floating, bool, np.bool_)):
        values = [values]
    if isinstance(values, (str, bytes)):
        raise TypeError(f"{name} must be a sequence of numbers, got {values!r}")
    out = []
    for k, v in enumerate(values):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise TypeError(f"{name}[{k}] must be a number, got {v!r} of type {type(v).__name__}")
        try:
            f = float(v)
        except OverflowError:  # a Python int beyond any float
            raise ValueError(f"{name}[{k}] = {v} overflows float32, the type it travels as") from None
        if not np.isfinite(f):
            raise ValueError(f"{name}[{k}] is {f}: {name} values must be finite")
        if nonzero and f == 0:
            raise ValueError(f"{name}[{k}] is 0: a standard deviation must be nonzero")
        with np.errstate(over="ignore"):
            overflows = not np.isfinite(np.float32(f))
        if overflows:
            raise ValueError(f"{name}[{k}] = {f} overflows float32, the type it travels as")
        out.append(f)
    if not out:
        raise ValueError(f"{name} is empty: give one value per channel")
    return out


def _fill_value_text(fill_value) -> str:
    """The fill value as exact text for the operator's ``fill_value_text`` argument: an integer in
    decimal, a float by ``repr`` (which round-trips), so no float32 rounding on the way."""
    if isinstance(fill_value, (bool, np.bool_)):
        raise TypeError(f"fill_value must be an int or a float, got the bool {fill_value!r}")
    if isinstance(fill_value, (int, np.integer)):
        return str(int(fill_value))
    if isinstance(fill_value, (float, np.floating)):
        return repr(float(fill_value))
    raise TypeError(f"fill_value must be an int or a float, got {fill_value!r} of type "
                    f"{type(fill_value).__name__}")


def _boundary_names(boundary) -> list[str]:
    """One boundary name or a sequence of names (the operator checks that the names are known)."""
    names = [boundary] if isinstance(boundary, str) else boundary
    try:
        names = list(names)
    except TypeError:
        raise TypeError(f"boundary must be a name or a sequence of names, got {boundary!r}") from None
    if not names or not all(isinstance(b, str) for b in names):
        raise TypeError(f"boundary must be a name or a non-empty sequence of names (constant, "
                        f"periodic, reflect, symmetric, edge), got {boundary!r}")
    return names


def _dali_dtype(dtype):
    if dtype is None or isinstance(dtype, types.DALIDataType):
        return dtype
    return types.to_dali_type(dtype)


def strided_slice(input, start, shape, step=1, axes: Sequence[int] | None = None,
                  boundary: str | Sequence[str] = "constant", fill_value: float = 0, dtype=None,
                  channel_axis: int | None = None, mean: Sequence[float] | None = None,
                  std: Sequence[float] | None = None, *, domain_start=None, domain_shape=None,
                  device: str | None = None, **kwargs):
    """``out[i] = in[b(start + i * step)]`` on each listed axis (``fn.dali_mesh.strided_slice``).

    Args:
        input: DataNode, CPU or GPU.
        start, shape, step: one value per listed axis (``step`` may be one value for all): lists of
            ints, or per-sample argument inputs (CPU DataNodes, e.g. from :func:`mesh_roi`).
        axes: the axes they refer to (default: every axis).
        boundary: ``constant`` (``fill_value``), ``periodic``, ``reflect``, ``symmetric``, ``edge``;
            one for all listed axes or one per listed axis (numpy ``np.pad`` meanings).
        fill_value: an int or a float, carried exactly (``16777217`` into int32 stays 16777217);
            the output type must hold it (integers of its range; floats that do not overflow).
        dtype: output type (default: the input's; float32 when normalising).
        channel_axis, mean, std: ``(x - mean[c]) / std[c]`` in float32, ``c`` the input's index on
            ``channel_axis``; constant cells hold ``fill_value`` unnormalised. Finite values only;
            ``channel_axis`` needs ``mean`` or ``std``.
        domain_start, domain_shape: a box inside the sample where the boundary applies (a crop).
    """
    ops = load_plugin()
    args: dict[str, Any] = {
        "start": _as_list(start, "start"),
        "shape": _as_list(shape, "shape"),
        "step": _as_list(step, "step"),
        "boundary": _boundary_names(boundary),
        "fill_value_text": _fill_value_text(fill_value),
    }
    if axes is not None:
        args["axes"] = [_int(a, "axes entry") for a in axes]
    if dtype is not None:
        args["dtype"] = _dali_dtype(dtype)
    if channel_axis is not None:
        if mean is None and std is None:
            raise ValueError(f"channel_axis={channel_axis!r} is given without mean or std: it only "
                             "selects the normalisation values; pass mean/std, or drop channel_axis")
        args["channel_axis"] = _int(channel_axis, "channel_axis")
    if mean is not None:
        args["mean"] = _floats(mean, "mean")
    if std is not None:
        args["std"] = _floats(std, "std", nonzero=True)
    if (domain_start is None) != (domain_shape is None):
        raise ValueError("give both domain_start and domain_shape, or neither")
    if domain_start is not None:
        args["domain_start"] = _as_list(domain_start, "domain_start")
        args["domain_shape"] = _as_list(domain_shape, "domain_shape")
    if device is not None:
        args["device"] = device
    return ops.strided_slice(input, **args, **kwargs)


def mesh_roi(shape, *, mesh_shape: Sequence[int], coordinate: Sequence[int],
             shard_axes: Sequence[int], halo_lo: int | Sequence[int] = 0,
             halo_hi: int | Sequence[int] = 0, boundary: str | Sequence[str] = "constant",
             split: str = "chunk", split_size_counts: Sequence[int] | None = None,
             split_sizes: Sequence[int] | None = None, crop_start: Sequence[int] | None = None,
             crop_stop: Sequence[int] | None = None, output_domain: bool = False, **kwargs):
    """This rank's ``(window_start, window_shape)`` per sample (``fn.dali_mesh.mesh_roi``, CPU).

    ``shape`` is a per-sample shape (``x.shape()``, ``fn.peek_image_shape(jpegs)``); ``shard_axes``
    has one entry per mesh dim (the sample axis it shards, or -1); ``halo_lo``/``halo_hi``/
    ``boundary`` one value or one per axis; ``crop_start``/``crop_stop`` the domain box (a stop of -1:
    to the end of the axis). With ``output_domain`` two more outputs give the domain's start and
    shape (for :func:`strided_slice`'s ``domain_start``/``domain_shape``).

    ``split="explicit"`` takes the size of every shard: ``split_size_counts`` (per mesh dim, how
    many sizes it gives) and ``split_sizes`` (int64), as :meth:`dali_mesh.Layout.split_sizes_flat`
    gives them; the operator checks them (counts, sums against each sample's axis or crop length).
    """
    ops = load_plugin()
    args: dict[str, Any] = {
        "mesh_shape": [int(v) for v in mesh_shape],
        "coordinate": [int(v) for v in coordinate],
        "shard_axes": [int(v) for v in shard_axes],
        "halo_lo": _as_list(halo_lo, "halo_lo"),
        "halo_hi": _as_list(halo_hi, "halo_hi"),
        "boundary": [boundary] if isinstance(boundary, str) else list(boundary),
        "split": split,
        "output_domain": bool(output_domain),
    }
    if (crop_start is None) != (crop_stop is None):
        raise ValueError("give both crop_start and crop_stop, or neither")
    if crop_start is not None:
        args["crop_start"] = [int(v) for v in crop_start]
        args["crop_stop"] = [int(v) for v in crop_stop]
    if (split_size_counts is None) != (split_sizes is None):
        raise ValueError("give both split_size_counts and split_sizes, or neither")
    if split_sizes is not None:
        args["split_size_counts"] = _int64_list(split_size_counts, "split_size_counts")
        args["split_sizes"] = _int64_list(split_sizes, "split_sizes")
    return ops.mesh_roi(shape, **args, **kwargs)


_INT64 = (-(1 << 63), (1 << 63) - 1)


def _int64_list(values, name: str) -> list[int]:
    """A sequence of integers for an int64 vector argument (the operator checks their meaning)."""
    return _int_list(values, name, _INT64, "is beyond the int64 range: no axis has that many cells")


_BIG = 1 << 62  # a stand-in axis size to read a layout's crop box without a sample shape


def mesh_roi_args(layout, ndim: int, coordinate: Sequence[int] | None = None) -> dict:
    """The :func:`mesh_roi` arguments of a :class:`dali_mesh.Layout` for ``ndim``-dim samples
    (explicit split sizes included)."""
    if isinstance(ndim, bool) or not isinstance(ndim, int) or ndim < 1:
        raise ValueError(f"ndim must be a positive int (the samples' number of axes), got {ndim!r}")
    halo = layout.halo_pairs(ndim)
    start, stop = layout.domain((_BIG,) * ndim)
    args = {
        "mesh_shape": tuple(layout.mesh.shape),
        "coordinate": tuple(layout.mesh.coordinate if coordinate is None else coordinate),
        "shard_axes": tuple(layout.shard_axes(ndim)),
        "halo_lo": [lo for lo, _ in halo],
        "halo_hi": [hi for _, hi in halo],
        "boundary": list(layout.boundaries(ndim)),
        "split": layout.split,
    }
    if layout.split == "explicit":
        counts, sizes = layout.split_sizes_flat()
        args["split_size_counts"] = list(counts)
        args["split_sizes"] = list(sizes)
    if any(s != 0 for s in start) or any(e != _BIG for e in stop):
        args["crop_start"] = list(start)
        args["crop_stop"] = [-1 if e == _BIG else e for e in stop]
    return args


def slice_boundaries(boundaries: Sequence[str]) -> list[str]:
    """The layout's boundary rules as ``strided_slice`` takes them: ``mesh_roi`` already clipped the
    window of ``trim`` axes to the domain, so the slice reads nothing outside them (``constant``)."""
    return ["constant" if b == "trim" else b for b in boundaries]


def mesh_slice(x, layout, *, ndim: int, dtype=None, channel_axis: int | None = None,
               mean: Sequence[float] | None = None, std: Sequence[float] | None = None,
               coordinate: Sequence[int] | None = None, device: str | None = None):
    """This rank's window (halo and boundaries included) of data already in the pipeline.

    ``mesh_roi(x.shape(), ...)`` from the layout's numbers, then :func:`strided_slice` with the
    layout's boundary per axis (``trim`` axes are clipped by ``mesh_roi``) and ``fill_value``; the
    crop box, if any, is the domain the boundary applies to. Works on CPU and GPU data; the result
    equals ``dali_mesh.partition.take_window(sample, layout.region(sample.shape))``.

    Args:
        x: DataNode of ``ndim``-dim samples (shapes may differ per sample).
        layout: a :class:`dali_mesh.Layout`.
        ndim: the samples' number of axes (the layout's per-axis settings need it).
        dtype, channel_axis, mean, std: as for :func:`strided_slice`.
        coordinate: another rank's mesh coordinate (default: the layout's mesh coordinate).
    """
    args = mesh_roi_args(layout, ndim, coordinate)
    has_crop = "crop_start" in args
    roi = mesh_roi(x.shape(), output_domain=has_crop, **args)
    boundary = slice_boundaries(args["boundary"])
    dom = {"domain_start": roi[2], "domain_shape": roi[3]} if has_crop else {}
    return strided_slice(x, roi[0], roi[1], boundary=boundary, fill_value=layout.fill_value,
                         dtype=dtype, channel_axis=channel_axis, mean=mean, std=std, device=device,
                         **dom)
