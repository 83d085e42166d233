"""Native plans of chunked arrays and of time series (HDF5 datasets and Zarr arrays whose axis 0 is
the step), shared by :mod:`dali_mesh.formats.hdf5` and :mod:`dali_mesh.formats.zarr`.

A window is cut by the chunk grid of the axes after the step axis into pieces, one per chunk it
touches; each piece's reads are planned once for a chunk's first step (:func:`chunk_pieces`) and
shared by every step (a part's base offset says where its chunk lies and which step of it). The
per-step work is numpy arithmetic on those bases, so 20,000 steps plan in a fraction of a second:
:func:`plan_time_series` turns the per-file parts of the steps into one item per sample (a window,
or a forecast's stacked input and target steps).
"""
from __future__ import annotations

import itertools
import math
from typing import NamedTuple, Sequence

import numpy as np

from dali_mesh.plan.forecast_spec import ForecastSpec
from dali_mesh.plan.window import WindowPlan
from dali_mesh.plan.ranges import StoredArray, Units, group_units, plan_npy_units
from dali_mesh.plan.plan_set import PlanSet
from dali_mesh.plan.types import NotNativeError, ReadPlan

__all__ = ["MAX_CODED_CHUNK_BYTES", "MAX_MERGED_LAYOUTS", "MAX_NATIVE_PARTS", "MAX_NATIVE_SAMPLES", "chunk_coords", "chunk_pieces",
           "check_coded_chunk", "count_chunk_pieces", "merge_pieces", "piece_plans", "plan_time_series", "SeriesFiles",
           "StepReads", "same_dtype", "too_many_parts"]

#: The most samples (and parts: reads of one file or chunk, over all samples) the native reader
#: plans; a source with more (a file claiming 2**31 steps, say) is read by ``partitioned_source``,
#: whose sample order and reads cost nothing per step until a step is read. The plan file holds 2
#: words per sample and 4 per part: at the limits about 80 MB, written once per process.
MAX_NATIVE_SAMPLES = 1 << 20
MAX_NATIVE_PARTS = 1 << 21
#: The largest decoded chunk the native reader decodes (each DALI thread keeps one decoded chunk):
#: ARCO-ERA5's whole-globe chunks of 37 levels are 154 MB. A store with larger chunks is read by
#: ``partitioned_source`` (a crafted metadata file cannot make every thread allocate terabytes).
MAX_CODED_CHUNK_BYTES = 2 << 30


def check_coded_chunk(path: str, chunks, itemsize: int) -> int:
    """The decoded size of a chunk of shape ``chunks``, or :class:`NotNativeError` above
    :data:`MAX_CODED_CHUNK_BYTES`."""
    n = math.prod(int(c) for c in chunks) * int(itemsize)
    if n > MAX_CODED_CHUNK_BYTES:
        raise NotNativeError(f"{path}: a decoded chunk of shape {tuple(chunks)} is {n} bytes, more than the native "
                             f"reader decodes (dali_mesh.plan.chunks.MAX_CODED_CHUNK_BYTES = {MAX_CODED_CHUNK_BYTES}); "
                             "it is read by partitioned_source")
    return n


#: chunked HDF5: at most this many merged plans per file (steps whose chunks lie at the same
#: relative offsets share one); a file with more layouts keeps a part per chunk piece
MAX_MERGED_LAYOUTS = 64


def _pieces(start: int, length: int, chunk: int):
    """``(offset in the box, chunk index, start in the chunk, length)`` of a run cut by a chunk grid."""
    out, pos = [], start
    while pos < start + length:
        c = pos // chunk
        n = min(start + length, (c + 1) * chunk) - pos
        out.append((pos - start, c, pos - c * chunk, n))
        pos += n
    return out


def count_chunk_pieces(wplan: WindowPlan, chunks: Sequence[int]) -> int:
    """How many pieces :func:`chunk_pieces` makes (the chunks each box touches, summed over the
    boxes), counted without making them: planning is bounded before the work, not after it."""
    total = 0
    for _, fst, ln in wplan.boxes():
        total += math.prod((f + n - 1) // c - f // c + 1 for f, n, c in zip(fst, ln, chunks[1:]))
    return total


def chunk_coords(wplan: WindowPlan, chunks: Sequence[int]):
    """The chunk indices (axes after the step axis) the window's boxes touch, each once."""
    seen = set()
    for _, fst, ln in wplan.boxes():
        for idx in itertools.product(*(range(f // c, (f + n - 1) // c + 1) for f, n, c in zip(fst, ln, chunks[1:]))):
            if idx not in seen:
                seen.add(idx)
                yield idx


def chunk_pieces(wplan: WindowPlan, chunks: Sequence[int], stored: np.dtype, merge_gap: int,
                 fortran: bool = False):
    """The window's boxes cut by the chunk grid of the axes after the step axis: per piece, the
    :class:`Units` read from a raw C-order (``fortran``: Fortran-order) chunk of shape ``chunks`` for
    the chunk's first step (the units of step ``j`` of the chunk lie ``j`` step-strides further: the
    part's base says so), and the chunk indices of its axes after the step axis. Fortran-order
    units land in the Fortran-order staging of the window (its finishing plan transposes it)."""
    shape = wplan.window_shape
    chunk = StoredArray(tuple(chunks), stored, fortran)
    out = []
    for wst, fst, ln in wplan.boxes():
        per_axis = [_pieces(f, n, c) for f, n, c in zip(fst, ln, chunks[1:])]
        for combo in itertools.product(*per_axis):
            box = (tuple(w + p[0] for w, p in zip(wst, combo)), tuple(p[2] for p in combo),
                   tuple(p[3] for p in combo))
            out.append((plan_npy_units(chunk, WindowPlan.reads_only(shape, box), (0,), merge_gap),
                        tuple(p[1] for p in combo)))
    return out


def piece_plans(pieces, plans: PlanSet, shape, stored, check=b"", check_at=0) -> list[int]:
    """A plan per chunk piece (its units, no boundary program)."""
    return [plans.add_plan(ReadPlan.reads_only(shape, stored, *u.plan_args, check, check_at, repeat=u.repeat))
            for u, _ in pieces]


def _merged_units(pieces, merge_gap: int) -> Units | None:
    """The units of ``pieces`` (``(units, file offset)`` each) in one sorted list, merged into reads;
    run by run where two pieces' repeated units interleave (pieces of one chunk); ``None`` when their
    runs overlap."""
    cols = [np.concatenate([u[k] + (r if k == 0 else 0) for u, r in pieces]) for k in range(6)]
    order = np.argsort(cols[0], kind="stable")
    u = Units(*(c[order] for c in cols), [])
    spans = u.spans
    if np.any(u.file_off[1:] < u.file_off[:-1] + spans[:-1]):
        if (u.count == 1).all():
            return None
        fo, do, ub = u.expanded()
        one, zero = np.ones_like(fo), np.zeros_like(fo)
        order = np.argsort(fo, kind="stable")
        u = Units(fo[order], do[order], ub[order], one, zero, zero, [])
        spans = u.unit_bytes
        if np.any(u.file_off[1:] < u.file_off[:-1] + spans[:-1]):
            return None
    return u._replace(groups=group_units(u.file_off, spans, merge_gap, True))


def merge_pieces(parts, pieces, plans: PlanSet, shape, stored, merge_gap, check, check_at):
    """Parts ``(steps, P, 3)`` of one file merged into one part per step where few layouts exist:
    the steps whose pieces lie at the same offsets relative to each other (files written step by
    step: all of them) share one plan reading all their units, merged into fewer reads, and the
    file is opened and checked once per sample instead of once per piece. ``None`` if not worth it."""
    n, p = parts.shape[:2]
    if p < 2 or n == 0:
        return None
    bases = parts[:, :, 2]
    b0 = bases.min(axis=1)
    keys, inverse = np.unique(bases - b0[:, None], axis=0, return_inverse=True)
    if len(keys) > MAX_MERGED_LAYOUTS:
        return None
    merged = []
    for rel in keys:
        u = _merged_units([(u, r) for (u, _), r in zip(pieces, rel)], merge_gap)
        if u is None:
            return None  # chunks that share bytes (a crafted file): a plan's reads must be disjoint
        merged.append(plans.add_plan(ReadPlan.reads_only(shape, stored, *u.plan_args, check, check_at, repeat=u.repeat)))
    out = np.empty((n, 1, 3), np.int64)
    out[:, 0, 0] = parts[:, 0, 0]
    out[:, 0, 1] = np.asarray(merged, np.int64)[np.asarray(inverse).reshape(-1)]
    out[:, 0, 2] = b0
    return out


def _item_words(finish: np.ndarray, parts: np.ndarray) -> np.ndarray:
    """Encoded items: per row ``finish[i]``, the number of parts, then ``parts[i]`` (``(n, P, 4)``)."""
    n, p = parts.shape[:2]
    words = np.empty((n, 2 + 4 * p), np.int64)
    words[:, 0] = finish
    words[:, 1] = p
    words[:, 2:] = parts.reshape(n, 4 * p)
    return words.ravel()


class StepReads(NamedTuple):
    """What a format's planner (``ArrayFormat.plan_steps``) returns for the steps of one file, the
    plans and files they name added to the :class:`PlanSet` it was given: ``parts``, an array
    ``(steps, parts per step, 3)`` of ``(file, plan, base)`` (a part reads plan ``plan`` of file
    ``file`` from byte ``base``); ``finish``, the plan that finishes a step's window (boundary cells);
    ``wplan``, that window's plan."""

    parts: np.ndarray
    finish: int
    wplan: WindowPlan


class SeriesFiles(NamedTuple):
    """The arrays of a time series as its planner needs them: one array ``name`` of ``format`` per
    file of ``files`` (its steps along axis 0; ``file_offsets``: the global step of each file's first
    step, and the total last), a step's window in file ``i`` ``regions[i]``, the format's
    ``options``, the window's ``index_maps`` and the reads' ``merge_gap``."""

    format: object
    files: Sequence[str]
    name: str | None
    regions: Sequence
    file_offsets: np.ndarray
    options: dict | None = None
    index_maps: object = None
    merge_gap: int = 0


def same_dtype(plans: PlanSet, dtype, location) -> None:
    """:class:`NotNativeError` when a file of a series holds another dtype than the series' plans (a
    file rewritten since the source was made): ``partitioned_source`` reads it, and says so."""
    if np.dtype(dtype) != plans.dtype:
        raise NotNativeError(f"{location}: its dtype {np.dtype(dtype)} is not the series' {plans.dtype}")


def too_many_parts(location, n_parts: int, max_parts: int, wplan=None) -> None:
    """:class:`NotNativeError` when ``n_parts`` file parts are more than the ``max_parts`` a planner
    was given (what is left of :data:`MAX_NATIVE_PARTS`): a planner asks before it makes them. With the
    window's plan ``wplan``, an index-set window of many runs (a chunk part per run) says so."""
    if n_parts > max_parts:
        runs = max((len(a.reads) for a in wplan.axes), default=0) if wplan is not None else 0
        hint = (f" (the window's rows form {runs:,} runs, a part per run and chunk: rows of a mesh numbered in "
                "no spatial order; `dali-mesh convert --renumber` writes the nodes along a space-filling curve)"
                if runs > 1000 else "")
        raise NotNativeError(f"{location}: the samples read more than dali_mesh.plan.chunks.MAX_NATIVE_PARTS = "
                             f"{MAX_NATIVE_PARTS} file parts (chunks) in all{hint}; they are read by partitioned_source")


def plan_time_series(series: SeriesFiles, *, dtype, sample_ndim: int, num_samples: int, time_start: int,
                     forecast: ForecastSpec | None, per_sample_shapes: bool,
                     sample_stride: int = 1) -> tuple[PlanSet, ...]:
    """The plans of a time series (samples along axis 0 across files): one :class:`PlanSet` per
    output window (the window; or a forecast's input and, with a lead, target: steps stacked on a
    new leading axis), sharing the plan and file tables.

    Each file's needed steps are planned by its format (``plan_steps``: a :class:`StepReads`, its plans
    added to the one :class:`PlanSet` of ``dtype`` it is given, and the parts it may still make given as
    a number); this function turns them into the items of every sample.

    Args:
        series: the files and how to plan them (:class:`SeriesFiles`).
        dtype: the windows' dtype (native byte order); ``sample_ndim``: a step's number of axes.
        num_samples, time_start, sample_stride: sample id ``i`` is the step ``time_start + i * sample_stride``
            (global).
        forecast: a :class:`~dali_mesh.plan.forecast_spec.ForecastSpec` (its history, lead and stride), or
            ``None``: one step per sample.
        per_sample_shapes: the steps differ in shape (refused for forecasts).
    """
    first_file = series.files[0]
    file_offsets = series.file_offsets
    if forecast is not None and per_sample_shapes:
        raise NotNativeError("a forecast with per-sample shapes is read by partitioned_source")
    n_samples = int(num_samples)
    if n_samples > MAX_NATIVE_SAMPLES:
        raise NotNativeError(f"{first_file}: {n_samples} samples are more than the native reader plans "
                             f"(dali_mesh.plan.chunks.MAX_NATIVE_SAMPLES = {MAX_NATIVE_SAMPLES}); they are read by "
                             "partitioned_source")
    # the steps of each output window relative to a sample's step t
    history, lead, stride = (forecast.history, forecast.lead, forecast.stride) if forecast is not None else (0, 0, 1)
    spans = [(0, 0)] if forecast is None else [(-history, 0)] + ([(1, lead)] if lead else [])
    g0 = time_start - history * stride  # global steps [g0, g1) are read by some sample (every stride-th of them)
    g1 = time_start + (n_samples - 1) * sample_stride + 1 + lead * stride
    ranges = {}
    for fi in range(len(file_offsets) - 1):
        a, b = max(g0, int(file_offsets[fi])), min(g1, int(file_offsets[fi + 1]))
        if a < b:
            ranges[fi] = (a - int(file_offsets[fi]), b - int(file_offsets[fi]))
    # the parts over the steps, times the steps per sample: what the items will hold
    reads = sum(hi - lo + 1 for lo, hi in spans)
    base = PlanSet(np.dtype(dtype), sample_ndim)
    steps: dict[int, StepReads] = {}
    used = 0
    for fi, file_steps in sorted(ranges.items()):
        got = StepReads(*series.format.plan_steps(
            series.files[fi], series.name, file_steps, series.regions[fi], plans=base,
            max_parts=MAX_NATIVE_PARTS // reads - used, options=series.options, index_maps=series.index_maps,
            merge_gap=series.merge_gap))
        steps[fi] = got
        used += got.parts.shape[0] * got.parts.shape[1]
    # per needed step (global step - g0): its file's parts and finishing plan
    order = sorted(steps)
    widths = {steps[fi].parts.shape[1] for fi in order}
    outs = []
    for lo, hi in spans:
        out = base.sharing_tables(sample_ndim + (forecast is not None))
        # the step (global step - g0) of each sample
        sample_rows = np.arange(n_samples, dtype=np.int64) * sample_stride + (time_start - g0)
        if forecast is None and sample_stride != 1:  # every sample_stride-th step, its file's finishing plan
            table = [(finish, row) for fi in order for finish in (steps[fi].finish,) for row in steps[fi].parts]
            out.items = [(table[r][0], [tuple(int(v) for v in q) + (0,) for q in table[r][1]]) for r in sample_rows]
            outs.append(out)
            continue
        if forecast is None:
            # one item per step, in order; files may differ in parts per step: encoded file by file
            words = []
            for fi in order:
                parts, finish, _ = steps[fi]
                p4 = np.zeros(parts.shape[:2] + (4,), np.int64)
                p4[..., :3] = parts
                words.append(_item_words(np.full(parts.shape[0], finish, np.int64), p4))
            out.set_item_words(np.concatenate(words), n_samples)
            outs.append(out)
            continue
        n = hi - lo + 1
        if any(base.plans[steps[fi].finish].fortran for fi in order):
            # a step's window lands in Fortran order; a stacked window transposes as a whole
            raise NotNativeError(f"{first_file}: a forecast of chunks in Fortran order is read by partitioned_source")
        wplan = steps[order[0]].wplan
        step_bytes = math.prod(wplan.window_shape) * base.dtype.itemsize
        # the stacked window: a leading step axis without boundary cells, then the step's axes
        finish = base.add_plan(ReadPlan.finishing(wplan.stacked(n), base.dtype))
        rows = sample_rows[:, None] + np.arange(lo, hi + 1) * stride
        if len(widths) == 1:
            table = np.concatenate([steps[fi].parts for fi in order])  # (steps, P, 3)
            p = table.shape[1]
            p4 = np.zeros((n_samples, n, p, 4), np.int64)
            p4[..., :3] = table[rows]
            p4[..., 3] = (np.arange(n, dtype=np.int64) * step_bytes)[None, :, None]
            out.set_item_words(_item_words(np.full(n_samples, finish, np.int64), p4.reshape(n_samples, n * p, 4)),
                               n_samples)
        else:  # files chunked differently: steps with different numbers of parts
            table = [row for fi in order for row in steps[fi].parts]
            out.items = [(finish, [tuple(int(v) for v in q) + (j * step_bytes,)
                                   for j, r in enumerate(rs) for q in table[r]]) for rs in rows]
        outs.append(out)
    return tuple(outs)
