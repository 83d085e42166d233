"""The generic byte-range planner: a window's boxes of an array that lies in a file (shape, dtype,
C or Fortran order, offset of element 0) become units of contiguous bytes, repeated at a stride,
grouped into merged reads. ``.npy`` files, contiguous HDF5 datasets and raw chunks all plan here."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import numpy as np

from dali_mesh.partition.rows import positions_within
from dali_mesh.plan.window import WindowPlan

__all__ = ["DEFAULT_MERGE_GAP", "StoredArray", "Units", "count_npy_units", "group_units", "plan_npy_reads",
           "plan_npy_units"]

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

#: Merge byte ranges whose gap is at most this many bytes (besides gaps that add no page, which are
#: always merged). Chosen by ``benchmarks/read_bench.py --only-sweep`` (2 KiB windows per row, see
#: benchmarks/read_bench_results.md): up to a 4 KiB gap, merged reads were ~2x faster warm and 10-13x
#: faster cold and read no more bytes from storage; at 8-16 KiB they were still faster but read
#: 1.7-3x the bytes of separate reads; at 64 KiB they were 4x slower warm. So 4 KiB: the largest gap
#: that never costs storage bytes.
DEFAULT_MERGE_GAP = 4096


@dataclass(frozen=True)
class StoredArray:
    """How an array lies in a file: ``shape``, ``dtype`` as stored (its byte order), C or Fortran
    order, and the offset of element 0 (what :func:`plan_npy_reads` needs; a :class:`NpyHeader`
    says the same of a ``.npy`` file)."""

    shape: tuple[int, ...]
    dtype: np.dtype
    fortran_order: bool = False
    data_offset: int = 0


# ---- byte-range plan -----------------------------------------------------------------------------
class Units(NamedTuple):
    """A plan's units: unit ``u`` is ``count[u]`` runs of ``unit_bytes[u]`` bytes, run ``j`` at
    ``file_off[u] + j file_step[u]`` of the file and ``dst_off[u] + j dst_step[u]`` of the (C-order)
    staging; sorted by file offset, their spans (first byte of the first run to the last byte of the
    last) disjoint; ``groups``: ``(first_unit, last_unit_exclusive)`` read in one call each (a
    unit's runs are always in one call: the planner repeats a run only across gaps it merges)."""

    file_off: np.ndarray
    dst_off: np.ndarray
    unit_bytes: np.ndarray
    count: np.ndarray
    file_step: np.ndarray
    dst_step: np.ndarray
    groups: list

    @property
    def spans(self) -> np.ndarray:
        """Each unit's bytes from its first run's first byte to its last run's end."""
        return (self.count - 1) * self.file_step + self.unit_bytes

    @property
    def repeat(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.count, self.file_step, self.dst_step

    @property
    def plan_args(self) -> tuple:
        """``(file offsets, dest offsets, bytes, groups)``, as :class:`ReadPlan`'s constructors take
        them (with ``repeat=``:attr:`repeat`)."""
        return self.file_off, self.dst_off, self.unit_bytes, self.groups

    def expanded(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(file offsets, staging offsets, bytes)`` of every run, one unit each (sorted by file
        offset: a unit's runs follow each other and the spans are disjoint)."""
        if not self.count.size or (self.count == 1).all():
            return self.file_off, self.dst_off, self.unit_bytes
        j = positions_within(self.count)
        return (np.repeat(self.file_off, self.count) + j * np.repeat(self.file_step, self.count),
                np.repeat(self.dst_off, self.count) + j * np.repeat(self.dst_step, self.count),
                np.repeat(self.unit_bytes, self.count))


def _merged_gap(gap: int, merge_gap: int, page_merge: bool) -> bool:
    """Whether :func:`group_units` reads across a gap of ``gap`` bytes (a gap of less than a page
    holds no page that its neighbours do not touch)."""
    return gap <= merge_gap or (page_merge and gap < _PAGE)


def _box_units(file_shape, dst_shape, itemsize, data_offset, file_start, dst_start, lengths, repeat: bool):
    """Byte units of one box: ``(file offsets, dest offsets, unit bytes, count, file step, dest step)``;
    each run is contiguous both in the C-order file and in the C-contiguous destination. With
    ``repeat``, the runs along the innermost axis outside the run are one unit (``count`` runs at
    that axis's strides), else one unit each."""
    nd = len(file_shape)
    k = _run_axis(file_shape, dst_shape, lengths)
    unit_cells = lengths[k] * math.prod(file_shape[k + 1 :])
    fstride = [math.prod(file_shape[i + 1 :]) for i in range(nd)]
    dstride = [math.prod(dst_shape[i + 1 :]) for i in range(nd)]
    f0 = sum(s * st for s, st in zip(file_start, fstride))
    d0 = sum(s * st for s, st in zip(dst_start, dstride))
    foff = np.array([f0], np.int64)
    doff = np.array([d0], np.int64)
    outer = k - 1 if repeat and k > 0 and lengths[k - 1] > 1 else k
    for i in range(outer):  # outer axes, C order
        steps = np.arange(lengths[i], dtype=np.int64)
        foff = (foff[:, None] + steps * fstride[i]).ravel()
        doff = (doff[:, None] + steps * dstride[i]).ravel()
    count, fstep, dstep = 1, 0, 0
    if outer < k:
        count, fstep, dstep = lengths[outer], fstride[outer] * itemsize, dstride[outer] * itemsize
    return (data_offset + foff * itemsize, doff * itemsize, unit_cells * itemsize, count, fstep, dstep)


def _box_repeats(file_shape, dst_shape, itemsize, boxes, merge_gap, page_merge) -> list[bool]:
    """Per box, whether its runs are planned as repeated units: when the gap between two runs of the
    repeat axis is one :func:`group_units` merges, and the box's file span meets no other box's
    (two boxes whose spans interleave, e.g. a periodic halo on the last axis, are planned run by run,
    so that the units stay sorted and disjoint)."""
    nd = len(file_shape)
    fstride = [math.prod(file_shape[i + 1 :]) for i in range(nd)]
    spans, ok = [], []
    for _, fst, ln in boxes:
        lo = sum(s * st for s, st in zip(fst, fstride))
        hi = sum((s + n - 1) * st for s, n, st in zip(fst, ln, fstride)) + 1
        spans.append((lo, hi))
        k = _run_axis(file_shape, dst_shape, ln)
        gap = (fstride[k - 1] - ln[k] * fstride[k]) * itemsize if k > 0 else 0
        ok.append(k > 0 and ln[k - 1] > 1 and _merged_gap(gap, merge_gap, page_merge))
    # sweep the boxes in file order: each cluster of spans that meet is planned run by run
    order = sorted(range(len(boxes)), key=lambda b: spans[b])
    cluster, reach = [], -1
    for b in order + [None]:
        if b is not None and spans[b][0] < reach:
            cluster.append(b)
        else:
            if len(cluster) > 1:
                for c in cluster:
                    ok[c] = False
            if b is None:
                break
            cluster = [b]
        reach = max(reach, spans[b][1])
    return ok


def _file_order_boxes(header: StoredArray, plan: WindowPlan, prefix: Sequence[int]):
    """``(file shape, window shape, boxes)`` in the file's own C order: the boxes of ``plan`` behind
    the ``prefix`` axes, all reversed for a Fortran-order file (the C-order array of reversed shape)."""
    file_shape = tuple(header.shape)
    full_window = (1,) * len(prefix) + plan.window_shape
    boxes = [((0,) * len(prefix) + wst, tuple(prefix) + fst, (1,) * len(prefix) + ln) for wst, fst, ln in plan.boxes()]
    if header.fortran_order:
        return file_shape[::-1], full_window[::-1], [(w[::-1], f[::-1], l[::-1]) for w, f, l in boxes]
    return file_shape, full_window, boxes


def _run_axis(file_shape, dst_shape, lengths) -> int:
    """The outermost axis of a box's contiguous runs: the trailing axes whole in both the file and
    the destination merge into one run."""
    k = len(file_shape) - 1
    while k > 0 and lengths[k] == file_shape[k] == dst_shape[k]:
        k -= 1
    return k


#: More read runs than this along one axis of a window (an index-set window's rows, a channel list) are
#: planned all at once by :func:`_one_axis_units` rather than box by box.
_MANY_RUNS = 16


class _OneAxis(NamedTuple):
    """The geometry of a window whose boxes differ along one axis ``a`` only, in the file's C order."""

    file_shape: tuple
    window: tuple
    wst: list
    fst: list
    ln: list
    a: int  # the axis of the runs
    k: int  # the run axis: axes after it whole in the file and the window (k >= a)
    runs: np.ndarray  # (window position, file index, length) along ``a``

    def count(self) -> int:
        """How many contiguous runs :func:`_one_axis_units` makes."""
        along = len(self.runs) if self.k == self.a else int(self.runs[:, 2].sum())
        return math.prod(self.ln[:self.a]) * along * math.prod(self.ln[self.a + 1:self.k])


def _one_axis(header: StoredArray, plan: WindowPlan, prefix: Sequence[int] = ()) -> _OneAxis | None:
    """:class:`_OneAxis` of ``plan`` when all of its boxes differ along one axis only and there are more
    than :data:`_MANY_RUNS` of them (an index-set window: rows of a graph partition), and either its runs
    are of whole rows or most are one row long; None otherwise (the box planner's repeats do better)."""
    if plan.empty:
        return None
    many = [i for i, ap in enumerate(plan.axes) if len(ap.reads) != 1]
    if len(many) != 1 or len(plan.axes[many[0]].reads) <= _MANY_RUNS:
        return None
    p = len(prefix)
    file_shape = tuple(header.shape)
    window = (1,) * p + plan.window_shape
    wst = [0] * p + [ap.reads[0][0] for ap in plan.axes]
    fst = [int(x) for x in prefix] + [ap.reads[0][1] for ap in plan.axes]
    ln = [1] * p + [ap.reads[0][2] for ap in plan.axes]
    a = p + many[0]
    runs = plan.axes[many[0]].read_array
    if header.fortran_order:
        file_shape, window, wst, fst, ln = file_shape[::-1], window[::-1], wst[::-1], fst[::-1], ln[::-1]
        a = len(file_shape) - 1 - a
    k = len(file_shape) - 1
    while k > a and ln[k] == file_shape[k] == window[k]:
        k -= 1
    if k > a and int(runs[:, 2].sum()) > 2 * len(runs):
        # runs within rows (a crop or channels after the rows' axis), most of them long: the box planner
        # repeats a run's rows as one unit, where this path would make one unit per row
        return None
    return _OneAxis(file_shape, window, wst, fst, ln, a, k, runs)


def _one_axis_units(header: StoredArray, g: _OneAxis):
    """``(file offsets, dest offsets, unit bytes)`` of every contiguous run of the window ``g``
    describes, unsorted: the runs :func:`_box_units` makes box by box without repeats, computed for
    every box at once (numpy, no loop over boxes)."""
    nd, a, k, ln, fst, wst, runs = len(g.file_shape), g.a, g.k, g.ln, g.fst, g.wst, g.runs
    fstride = [math.prod(g.file_shape[i + 1:]) for i in range(nd)]
    dstride = [math.prod(g.window[i + 1:]) for i in range(nd)]

    def grid(axes, f, d):
        for i in axes:
            steps = np.arange(ln[i], dtype=np.int64)
            f = (f[:, None] + (fst[i] + steps) * fstride[i]).ravel()
            d = (d[:, None] + (wst[i] + steps) * dstride[i]).ravel()
        return f, d

    zero = np.zeros(1, np.int64)
    fpre, dpre = grid(range(a), zero, zero)
    if k == a:  # a run of rows, every axis after them whole: one unit per run
        fa, da = runs[:, 1] * fstride[a], runs[:, 0] * dstride[a]
        cells = runs[:, 2] * fstride[a]
        fpost, dpost = zero, zero
    else:  # a run lies within a row: every row of every run, then the axes up to the run axis
        n = runs[:, 2]
        j = positions_within(n)
        fa, da = (np.repeat(runs[:, 1], n) + j) * fstride[a], (np.repeat(runs[:, 0], n) + j) * dstride[a]
        cells = np.full(fa.shape, ln[k] * fstride[k], np.int64)
        fpost, dpost = grid(range(a + 1, k), np.array([fst[k] * fstride[k]], np.int64),
                            np.array([wst[k] * dstride[k]], np.int64))
    isz = header.dtype.itemsize
    fo = (fpre[:, None, None] + fa[None, :, None] + fpost[None, None, :]).ravel() * isz + header.data_offset
    do = (dpre[:, None, None] + da[None, :, None] + dpost[None, None, :]).ravel() * isz
    ub = np.broadcast_to(cells[None, :, None] * isz, (fpre.size, fa.size, fpost.size)).ravel()
    return fo, do, ub


def count_npy_units(header: StoredArray, plan: WindowPlan, prefix: Sequence[int] = (),
                    merge_gap: int = DEFAULT_MERGE_GAP, page_merge: bool = True, *, runs: bool = False) -> int:
    """How many units :func:`plan_npy_units` makes for ``plan`` (``runs``: how many contiguous runs,
    :func:`plan_npy_reads`' units), counted without making them, so that a window of billions of
    units is refused before its plan is built."""
    g = _one_axis(header, plan, prefix)
    if g is not None:
        return g.count()
    file_shape, full_window, boxes = _file_order_boxes(header, plan, prefix)
    repeats = [False] * len(boxes) if runs else _box_repeats(file_shape, full_window, header.dtype.itemsize, boxes,
                                                               merge_gap, page_merge)
    total = 0
    for (_, _, ln), rep in zip(boxes, repeats):
        k = _run_axis(file_shape, full_window, ln)
        total += math.prod(ln[:k - 1] if rep else ln[:k])
    return total


def plan_npy_units(header: StoredArray, plan: WindowPlan, prefix: Sequence[int] = (),
                   merge_gap: int = DEFAULT_MERGE_GAP, page_merge: bool = True) -> Units:
    """The :class:`Units` to read for ``plan`` from a file with ``header``: the runs of each box along
    one axis are one unit where their gaps are merged reads (so a window of many rows is a few
    units), merged into reads as :func:`plan_npy_reads` says. Offsets into the destination are for
    the C-order (file-order) staging of the window."""
    g = _one_axis(header, plan, prefix)
    if g is not None:
        fo, do, ub = _one_axis_units(header, g)
        order = np.argsort(fo, kind="stable")
        ones, zeros = np.ones(fo.size, np.int64), np.zeros(fo.size, np.int64)
        units = Units(fo[order], do[order], ub[order], ones, zeros, zeros, [])
        return units._replace(groups=group_units(units.file_off, units.spans, merge_gap, page_merge))
    file_shape, full_window, boxes = _file_order_boxes(header, plan, prefix)
    isz = header.dtype.itemsize
    repeats = _box_repeats(file_shape, full_window, isz, boxes, merge_gap, page_merge)
    cols: list[list[np.ndarray]] = [[] for _ in range(6)]
    for (wst, fst, ln), rep in zip(boxes, repeats):
        f, d, u, c, fs, ds = _box_units(file_shape, full_window, isz, header.data_offset, fst, wst, ln, rep)
        for col, v in zip(cols, (f, d, u, c, fs, ds)):
            col.append(v if isinstance(v, np.ndarray) else np.full(f.shape, v, np.int64))
    if not cols[0]:
        e = np.empty(0, np.int64)
        return Units(e, e, e, e, e, e, [])
    fo, do, ub, count, fstep, dstep = (np.concatenate(c) for c in cols)
    order = np.argsort(fo, kind="stable")
    fo, do, ub, count, fstep, dstep = fo[order], do[order], ub[order], count[order], fstep[order], dstep[order]
    units = Units(fo, do, ub, count, fstep, dstep, [])
    return units._replace(groups=group_units(fo, units.spans, merge_gap, page_merge))


def plan_npy_reads(header: StoredArray, plan: WindowPlan, prefix: Sequence[int] = (),
                   merge_gap: int = DEFAULT_MERGE_GAP, page_merge: bool = True):
    """Byte ranges to read for ``plan`` from a file with ``header``, run by run.

    Two neighbouring ranges are read in one call when their gap is at most ``merge_gap`` bytes or,
    with ``page_merge``, when the gap holds no page that the two ranges do not touch already (the
    kernel reads whole pages: such a gap costs a copy but no storage bytes).

    Returns ``(file_offsets, dest_offsets, unit_bytes, groups)``: units sorted by file offset, and
    ``groups``, a list of ``(first_unit, last_unit_exclusive)`` merged into one read each. Offsets
    into the destination are for the C-order (file-order) staging of the window. (The native
    reader's plans take :func:`plan_npy_units`, the same ranges in fewer units.)
    """
    fo, do, ub = plan_npy_units(header, plan, prefix, merge_gap, page_merge).expanded()
    return fo, do, ub, group_units(fo, ub, merge_gap, page_merge)


def group_units(fo: np.ndarray, ub: np.ndarray, merge_gap: int, page_merge: bool) -> list[tuple[int, int]]:
    """Runs of units (sorted by offset) to read in one call each."""
    if fo.size == 0:
        return []
    ends = fo[:-1] + ub[:-1]
    split = fo[1:] - ends > merge_gap
    if page_merge:
        # a gap holding no page that neither neighbour touches costs no storage bytes: merge it too
        split &= (fo[1:] // _PAGE) > ((ends - 1) // _PAGE) + 1
    # units that overlap (the plan reads each file cell once, so this is a safeguard) can never share
    # one preadv: its buffers follow each other in the file
    split |= fo[1:] < ends
    bounds = np.concatenate(([0], np.flatnonzero(split) + 1, [fo.size]))
    return list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))
