"""``Region``: the part of one sample a rank owns and the window it reads, and ``take_window``, the
numpy oracle every reader is held to (``np.pad(domain, pads, mode)[window]``)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from dali_mesh.partition.checks import LayoutError
from dali_mesh.partition.rules import _check_boundary, boundary_index, shard_extent

# ---- regions ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Region:
    """The part of one sample that one rank owns, and the window it reads.

    All coordinates are sample coordinates (a crop does not shift them).

    Attributes:
        domain_start, domain_stop: the domain (the crop box; the whole sample without a crop).
        start, stop: the owned cells, inside the domain.
        window_start, window_stop: owned cells +- halo. May lie outside the domain; those cells are
            filled by the boundary rule (``trim`` axes are clipped instead). A rank whose owned region
            is empty gets no halo: its window is its owned region.
        boundary: the boundary rule of each axis.
        fill_value: the value of ``constant`` cells.
    """

    domain_start: tuple[int, ...]
    domain_stop: tuple[int, ...]
    start: tuple[int, ...]
    stop: tuple[int, ...]
    window_start: tuple[int, ...]
    window_stop: tuple[int, ...]
    boundary: tuple[str, ...]
    fill_value: float = 0

    def __post_init__(self) -> None:
        fields = ("domain_start", "domain_stop", "start", "stop", "window_start", "window_stop")
        for f in fields:
            object.__setattr__(self, f, tuple(int(v) for v in getattr(self, f)))
        b = self.boundary
        object.__setattr__(self, "boundary", (b,) * len(self.start) if isinstance(b, str) else tuple(b))
        lengths = {len(getattr(self, f)) for f in fields + ("boundary",)}
        if len(lengths) != 1:
            raise LayoutError(f"region fields disagree in length: {self}")
        for mode in self.boundary:
            _check_boundary(mode)

    @property
    def ndim(self) -> int:
        return len(self.start)

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the owned region."""
        return tuple(b - a for a, b in zip(self.start, self.stop))

    @property
    def window_shape(self) -> tuple[int, ...]:
        return tuple(b - a for a, b in zip(self.window_start, self.window_stop))

    @property
    def domain_shape(self) -> tuple[int, ...]:
        return tuple(b - a for a, b in zip(self.domain_start, self.domain_stop))

    @property
    def window_slices(self) -> tuple[slice, ...]:
        """The window as slices in sample coordinates (bounds may be negative or past the end)."""
        return tuple(slice(a, b) for a, b in zip(self.window_start, self.window_stop))

    @property
    def owned_in_window(self) -> tuple[slice, ...]:
        """Slices of the window array that hold the owned cells (strip the halo with them)."""
        return tuple(
            slice(s - ws, e - ws) for s, e, ws in zip(self.start, self.stop, self.window_start)
        )

    @property
    def halo(self) -> tuple[tuple[int, int], ...]:
        """Cells of halo below and above the owned region on each axis."""
        return tuple(
            (s - ws, we - e)
            for s, e, ws, we in zip(self.start, self.stop, self.window_start, self.window_stop)
        )

    @property
    def pads(self) -> tuple[tuple[int, int], ...]:
        """Cells of the window outside the domain, below and above, on each axis."""
        return tuple(
            (max(0, min(d0, we) - ws), max(0, we - max(d1, ws)))
            for ws, we, d0, d1 in zip(self.window_start, self.window_stop, self.domain_start, self.domain_stop)
        )

    @property
    def inside(self) -> tuple[slice, ...]:
        """The part of the window inside the domain, as slices in sample coordinates."""
        return tuple(
            slice(min(max(ws, d0), d1), max(min(we, d1), d0))
            for ws, we, d0, d1 in zip(self.window_start, self.window_stop, self.domain_start, self.domain_stop)
        )

    @property
    def size(self) -> int:
        return math.prod(self.window_shape)

    def window_index(self, axis: int) -> np.ndarray:
        """The sample index each window position of ``axis`` takes its value from, by the boundary
        rule (a periodic halo wraps to the far side, a reflected one mirrors); -1 where the window
        holds the fill value (``constant`` cells)."""
        d0, d1 = self.domain_start[axis], self.domain_stop[axis]
        pos = np.arange(self.window_start[axis], self.window_stop[axis], dtype=np.int64) - d0
        idx = boundary_index(pos, d1 - d0, self.boundary[axis]) if d1 > d0 else np.full(pos.shape, -1)
        return np.where(idx < 0, -1, idx + d0)


def region_bounds(domain_start: Sequence[int], domain_stop: Sequence[int], mesh_shape: Sequence[int],
                  coordinate: Sequence[int], axis_groups: Mapping[int, Sequence[int]], split: str,
                  split_prefix: Mapping[int, Sequence[int]] | None, halo: Sequence[tuple[int, int]],
                  boundary: Sequence[str]) -> tuple[tuple[int, ...], ...]:
    """``(start, stop, window_start, window_stop)`` of the rank at ``coordinate``: the pure math behind
    ``Layout.region``, O(ndim) whatever the mesh size.

    ``axis_groups``: sample axis -> the mesh dims that shard it, outer first (each splits the previous
    shard by the ``split`` rule); with explicit sizes, ``split_prefix`` maps the innermost of them to
    the prefix sums of the sizes of their combined shards (row-major over the nested dims). Example,
    ``(5,)`` cells over 4 ranks, one cell of halo, ``periodic``, ``split="chunk"`` (sizes 2, 2, 1, 0)::

        rank0 -- owned [0:2] window [-1:3]
        rank1 -- owned [2:4] window [1:5]
        rank2 -- owned [4:5] window [3:6]
        rank3 -- owned [5:5] window [5:5]   (empty: at the domain end, no halo)
    """
    ndim = len(domain_start)
    start, stop = list(domain_start), list(domain_stop)
    for axis, dims in axis_groups.items():
        if split_prefix is None:
            for mesh_dim in dims:  # mesh-dim order: outer first, each splits the previous shard
                offset, size = shard_extent(stop[axis] - start[axis], mesh_shape[mesh_dim], coordinate[mesh_dim],
                                            split)
                start[axis] += offset
                stop[axis] = start[axis] + size
            continue
        prefix = split_prefix[dims[-1]]
        c = 0
        for mesh_dim in dims:  # the combined shard index, row-major over the nested dims
            c = c * mesh_shape[mesh_dim] + coordinate[mesh_dim]
        start[axis] = domain_start[axis] + prefix[c]
        stop[axis] = domain_start[axis] + prefix[c + 1]
    # where an empty shard sits, decided here only: with split="chunk" (torch.chunk, DTensor) at the
    # domain end, as torch's compute_local_shape_and_global_offset puts it; with "physicsnemo" or
    # explicit sizes (PhysicsNeMo ShardTensor's) at the running sum of the sizes before it, as
    # ShardTensor.offsets() does (tests/torch/test_physicsnemo_real.py); "even" shards are empty only
    # at the end (as the C++ mesh_roi decides it too)
    if split == "chunk":
        for a in range(ndim):
            if stop[a] == start[a]:
                start[a] = stop[a] = domain_stop[a]
    if any(s == e for s, e in zip(start, stop)):  # an empty owned region gets no halo: its window is itself
        return tuple(start), tuple(stop), tuple(start), tuple(stop)
    ws, we = [], []
    for a in range(ndim):
        w0, w1 = start[a] - halo[a][0], stop[a] + halo[a][1]
        if boundary[a] == "trim":
            w0, w1 = max(w0, domain_start[a]), min(w1, domain_stop[a])
        ws.append(w0)
        we.append(w1)
    return tuple(start), tuple(stop), tuple(ws), tuple(we)


def check_fill_value(fill_value, dtype, where: str = "") -> None:
    """Raise if ``fill_value`` cannot be held exactly by ``dtype`` (e.g. -1 or 0.5 in uint8)."""
    dtype = np.dtype(dtype)
    if dtype.kind not in "biuf":
        return
    value = np.asarray(fill_value)
    if dtype.kind == "f":
        ok = not np.isfinite(value) or np.isfinite(value.astype(dtype))
    else:
        with np.errstate(invalid="ignore", over="ignore"):
            ok = np.isfinite(value) and value.astype(dtype).astype(np.float64) == float(value) and (
                dtype.kind != "b" or float(value) in (0.0, 1.0))
        if ok and dtype.kind in "iu":
            info = np.iinfo(dtype)
            ok = info.min <= float(value) <= info.max
    if not ok:
        raise LayoutError(f"fill_value {fill_value!r} cannot be held by {dtype}{where}: "
                          "choose a value the sample's dtype can hold")


def take_window(sample: np.ndarray, region: Region) -> np.ndarray:
    """The window of a whole sample, with boundary fills (numpy reference implementation).

    Equals ``np.pad(sample[domain], pads, mode)[window]``, one mode per axis.
    """
    sample = np.asarray(sample)
    if sample.ndim != region.ndim:
        raise LayoutError(f"sample has {sample.ndim} dims, region has {region.ndim}")
    if any(b == "constant" for b in region.boundary):
        check_fill_value(region.fill_value, sample.dtype)
    index, fill_mask = [], []
    for a in range(region.ndim):
        idx = region.window_index(a)
        fill_mask.append(idx < 0)
        index.append(np.where(idx < 0, 0, idx))
    if region.size == 0:
        return np.empty(region.window_shape, dtype=sample.dtype)
    out = sample[np.ix_(*index)]
    for a, mask in enumerate(fill_mask):
        if mask.any():
            sel = [slice(None)] * region.ndim
            sel[a] = mask
            out[tuple(sel)] = np.asarray(region.fill_value).astype(sample.dtype)
    return out


