"""From a ``Region`` to what a reader must read, copy and fill (shared by every reader).

The value at window position ``p`` is ``sample[idx_0(p_0), idx_1(p_1), ...]``, or ``fill_value`` when
any ``idx_a`` is -1 (a ``constant`` cell): the boundary rules are separable per axis, which is what
``np.pad`` applied axis by axis computes. So each axis is planned on its own:

- **reads**: window positions whose source cell is read from storage, as runs ``(dst, src, length)``
  where window and file indices both step by one. Each source cell is read once: in-domain cells
  first (they map onto themselves), then the halo cells whose sources lie elsewhere (the far side of
  a periodic domain, or mirrored cells beyond a small owned part).
- **copies**: window positions whose source cell is already read elsewhere in the window (reflect,
  symmetric, edge, and periodic halos wider than the domain): copied from that position.
- **fills**: ``constant`` positions.

A reader reads the product of every axis's read runs (one box per combination) into the output,
then :meth:`WindowPlan.finish` does copies and fills axis by axis; a slab copied along axis ``a``
may carry not-yet-valid cells of later axes, which those axes' passes then overwrite.
"""
from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass
from typing import Iterator, Mapping, Sequence

import numpy as np

from dali_mesh.storage.errors import DataFileError
from dali_mesh.partition import Region, boundary_index, check_fill_value

__all__ = ["AxisPlan", "WindowPlan", "normalise_index_maps", "plan_window"]


def normalise_index_maps(
    index_maps: Mapping[int, Sequence[int]] | None, ndim: int, path: str | None = None
) -> dict[int, Sequence[int]]:
    """``index_maps`` with each axis in ``0..ndim-1`` (``-1`` is the last axis, as numpy counts).
    Every plan looks its maps up by non-negative axis: a negative key left as it is would be
    ignored and the window read without its channel subset. An axis out of range is an error
    naming it (a :class:`DataFileError` naming ``path`` when one is given)."""
    out: dict[int, Sequence[int]] = {}
    for a, m in (index_maps or {}).items():
        if isinstance(a, (bool, np.bool_)) or not isinstance(a, (int, np.integer)) or not -ndim <= a < ndim:
            msg = (f"channel axis {a!r} is out of range for a sample of {ndim} axes "
                   f"(use 0..{ndim - 1}, or -{ndim}..-1 counted from the end)")
            if path is not None:
                raise DataFileError(path, msg)
            raise ValueError(msg)
        a = int(a) % ndim
        if a in out:
            raise ValueError(f"index_maps names axis {a} twice (as {a} and {a - ndim}): give one map per axis")
        out[a] = m
    return out


@dataclass(frozen=True)
class AxisPlan:
    size: int
    reads: tuple[tuple[int, int, int], ...]  # (window position, file index, length)
    copy_dst: np.ndarray  # window positions filled by copy ...
    copy_src: np.ndarray  # ... from these window positions (which are read)
    fill: np.ndarray  # window positions holding fill_value

    @property
    def read_cells(self) -> int:
        return sum(r[2] for r in self.reads)

    @functools.cached_property
    def read_array(self) -> np.ndarray:
        """:attr:`reads` as an ``(n, 3)`` int64 array, made once (a window of many rows is asked for it by
        the planner's count and by its plan)."""
        return np.asarray(self.reads, np.int64).reshape(-1, 3)


def _runs(dst: np.ndarray, src: np.ndarray) -> tuple[tuple[int, int, int], ...]:
    """Split parallel index arrays into runs where both step by +1."""
    if dst.size == 0:
        return ()
    breaks = np.flatnonzero((np.diff(dst) != 1) | (np.diff(src) != 1)) + 1
    starts = np.concatenate(([0], breaks))
    lengths = np.diff(np.concatenate((starts, [dst.size])))
    return tuple(map(tuple, np.stack((dst[starts], src[starts], lengths), axis=1).astype(np.int64).tolist()))


def plan_axis(
    window_start: int,
    window_stop: int,
    domain_start: int,
    domain_stop: int,
    mode: str,
    index_map: np.ndarray | None = None,
) -> AxisPlan:
    """Plan one axis. ``index_map`` maps a sample index to a file index (a channel subset)."""
    size = window_stop - window_start
    empty = np.empty(0, np.int64)
    if size <= 0:
        return AxisPlan(0, (), empty, empty, empty)
    n = domain_stop - domain_start
    if index_map is None:
        return _plan_axis_runs(size, window_start - domain_start, n, domain_start, mode)
    pos = np.arange(size, dtype=np.int64)
    rel = pos + (window_start - domain_start)
    idx = boundary_index(rel, n, mode)  # -1: constant (or trim, whose windows never leave the domain)
    valid = idx >= 0
    # in-domain positions map onto themselves: read them first, so halos copy from them
    core = valid & (idx == rel)
    read_pos = [pos[core]]
    read_src = [idx[core]]
    rest = valid & ~core
    if rest.any():
        cand_pos, cand_src = pos[rest], idx[rest]
        new = ~np.isin(cand_src, read_src[0])
        # among sources not in the core, read each once (first occurrence)
        src_new, first = np.unique(cand_src[new], return_index=True)
        read_pos.append(cand_pos[new][first])
        read_src.append(src_new)
    rpos = np.concatenate(read_pos)
    rsrc = np.concatenate(read_src)
    order = np.argsort(rpos, kind="stable")
    rpos, rsrc = rpos[order], rsrc[order]
    # copies: every valid position not read takes the read position holding its source
    is_read = np.zeros(size, bool)
    is_read[rpos] = True
    copy_dst = pos[valid & ~is_read]
    if copy_dst.size:
        by_src = np.argsort(rsrc)
        k = np.searchsorted(rsrc[by_src], idx[copy_dst])
        copy_src = rpos[by_src][k]
    else:
        copy_src = empty
    file_idx = rsrc + domain_start
    if index_map is not None:
        file_idx = np.asarray(index_map, dtype=np.int64)[file_idx]
        # a map may name one file index twice (channels [4, 2, 4]): read it once, at its first
        # position, and copy it to the others. Two reads of one file range would overlap, which a
        # single preadv cannot express.
        uniq, first, inverse = np.unique(file_idx, return_index=True, return_inverse=True)
        if uniq.size < file_idx.size:
            canon = rpos[first][inverse]  # the read position holding each read's file index
            dup = canon != rpos
            # copies planned above may take from a position that is now itself a copy: redirect
            if copy_dst.size:
                where = np.searchsorted(rpos, copy_src)
                copy_src = canon[where]
            copy_dst = np.concatenate((copy_dst, rpos[dup]))
            copy_src = np.concatenate((copy_src, canon[dup]))
            rpos, file_idx = rpos[~dup], file_idx[~dup]
    return AxisPlan(size, _runs(rpos, file_idx), copy_dst, copy_src, pos[~valid])


def _merge_runs(runs) -> tuple[tuple[int, int, int], ...]:
    """Runs in window order, neighbours that step on by one in both the window and the file joined."""
    out: list[tuple[int, int, int]] = []
    for d, s, k in runs:
        if out and out[-1][0] + out[-1][2] == d and out[-1][1] + out[-1][2] == s:
            out[-1] = (out[-1][0], out[-1][1], out[-1][2] + k)
        else:
            out.append((d, s, k))
    return tuple(out)


def _plan_axis_runs(size: int, offset: int, n: int, domain_start: int, mode: str) -> AxisPlan:
    """:func:`plan_axis` without an index map, in time and memory of the halo's cells (not the
    window's): the window positions inside the domain (``offset`` is the window's start relative to
    it, ``n`` its extent) are one read run, computed, not listed; only the positions outside it go
    through :func:`boundary_index`."""
    lo, hi = min(max(0, -offset), size), max(min(size, n - offset), 0)
    lo, hi = (lo, hi) if lo < hi else (0, 0)  # the window may lie wholly outside the domain
    halo = np.concatenate((np.arange(0, lo if hi else size, dtype=np.int64),
                           np.arange(hi, size, dtype=np.int64) if hi else np.empty(0, np.int64)))
    idx = boundary_index(halo + offset, n, mode)  # -1: constant
    valid = idx >= 0
    in_core = valid & (idx >= lo + offset) & (idx < hi + offset)
    # sources outside the window's domain part: read each once, at its first position
    cand = valid & ~in_core
    src_new, first = np.unique(idx[cand], return_index=True)
    new_pos = halo[cand][first]
    order = np.argsort(new_pos, kind="stable")
    new_pos, new_src = new_pos[order], src_new[order]
    left = new_pos < lo
    core = ((lo, lo + offset + domain_start, hi - lo),) if hi > lo else ()
    runs = _merge_runs(_runs(new_pos[left], new_src[left] + domain_start) + core +
                       _runs(new_pos[~left], new_src[~left] + domain_start))
    # copies: every valid halo position not read takes the read position holding its source
    is_new = np.zeros(halo.size, bool)
    is_new[np.flatnonzero(cand)[first]] = True
    copy = valid & ~is_new
    copy_dst = halo[copy]
    src = idx[copy]
    copy_src = np.where((src >= lo + offset) & (src < hi + offset), src - offset, 0)
    far = ~((src >= lo + offset) & (src < hi + offset))
    if far.any():
        k = np.searchsorted(src_new, src[far])
        copy_src[far] = halo[cand][first][k]
    return AxisPlan(size, runs, copy_dst.astype(np.int64), copy_src.astype(np.int64), halo[~valid])


@dataclass(frozen=True)
class WindowPlan:
    axes: tuple[AxisPlan, ...]
    fill_value: float

    @property
    def window_shape(self) -> tuple[int, ...]:
        return tuple(a.size for a in self.axes)

    @property
    def empty(self) -> bool:
        return any(a.size == 0 for a in self.axes)

    @property
    def read_cells(self) -> int:
        return math.prod(a.read_cells for a in self.axes)

    def boxes(self) -> Iterator[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]:
        """``(window_start, file_start, lengths)`` of every box to read (none if the window is empty
        or wholly filled)."""
        if self.empty:
            return
        for combo in itertools.product(*(a.reads for a in self.axes)):
            yield (
                tuple(c[0] for c in combo),
                tuple(c[1] for c in combo),
                tuple(c[2] for c in combo),
            )

    def slices(self, prefix: Sequence[int] = ()) -> Iterator[tuple[tuple[slice, ...], tuple]]:
        """``(window index, array index)`` of every box of :meth:`boxes`: the box in the window and
        in the stored array, whose leading axes ``prefix`` select the sample."""
        pre = tuple(int(p) for p in prefix)
        for wst, fst, ln in self.boxes():
            yield (tuple(slice(s, s + n) for s, n in zip(wst, ln)),
                   pre + tuple(slice(s, s + n) for s, n in zip(fst, ln)))

    @classmethod
    def reads_only(cls, window_shape: Sequence[int], box=None) -> "WindowPlan":
        """A plan of ``window_shape`` with no boundary program: every cell read, nothing copied or
        filled; with ``box = (window_start, file_start, lengths)`` that one box is all it reads
        (one chunk's piece of a window)."""
        empty = np.empty(0, np.int64)
        reads = [()] * len(window_shape) if box is None else [((w, f, n),) for w, f, n in zip(*box)]
        return cls(tuple(AxisPlan(int(s), r, empty, empty, empty) for s, r in zip(window_shape, reads)), 0)

    def stacked(self, steps: int) -> "WindowPlan":
        """``steps`` windows of this plan on a new leading axis (a forecast's steps), the step axis
        without boundary cells."""
        empty = np.empty(0, np.int64)
        return WindowPlan((AxisPlan(int(steps), (), empty, empty, empty),) + self.axes, self.fill_value)

    def finish(self, out: np.ndarray) -> None:
        """Copies and fills, axis by axis, after every box is read into ``out``."""
        if self.empty:
            return
        fill = None
        for a, ap in enumerate(self.axes):
            lead = (slice(None),) * a
            if ap.copy_dst.size:
                out[lead + (ap.copy_dst,)] = out[lead + (ap.copy_src,)]
            if ap.fill.size:
                if fill is None:
                    check_fill_value(self.fill_value, out.dtype)
                    fill = np.asarray(self.fill_value).astype(out.dtype)
                out[lead + (ap.fill,)] = fill


def plan_window(
    region: Region, index_maps: Mapping[int, Sequence[int]] | None = None
) -> WindowPlan:
    """Plan the read of ``region`` (see the module docstring). ``index_maps``: sample axis -> array
    mapping a sample index on that axis to a file index (e.g. a channel subset)."""
    index_maps = normalise_index_maps(index_maps, region.ndim)
    axes = tuple(
        plan_axis(
            region.window_start[a],
            region.window_stop[a],
            region.domain_start[a],
            region.domain_stop[a],
            region.boundary[a],
            None if index_maps.get(a) is None else np.asarray(index_maps[a]),
        )
        for a in range(region.ndim)
    )
    return WindowPlan(axes, region.fill_value)
