"""Pure index math: split rules, ``Layout``, ``Region`` and the sample order.

Nothing here knows of files, processes, torch or DALI; numpy at most. Every function takes tuples
and returns tuples, so that readers, DALI worker processes and the C++ ``mesh_roi`` operator can all
follow the same rules (a test holds the C++ side to this one).

Example: an ERA5 field ``(8, 721, 1440)`` on a ``data_parallel=2 x model_parallel=4`` mesh, latitude
sharded, one cell of halo, periodic in longitude::

    >>> mesh = MeshInfo((2, 4), ("data_parallel", "model_parallel"), (0, 1))
    >>> layout = Layout(mesh, shard={"model_parallel": 1}, halo={1: 1, 2: 1},
    ...                 boundary={1: "constant", 2: "periodic"})
    >>> layout.region((8, 721, 1440)).window_start
    (0, 180, -1)

    every rank (split "chunk", 721 over 4 = 181, 181, 181, 178):
    rank0 -- coordinate (0, 0) owned [0:8, 0:181, 0:1440]   window [0:8, -1:182, -1:1441]
    rank1 -- coordinate (0, 1) owned [0:8, 181:362, 0:1440] window [0:8, 180:363, -1:1441]
    rank2 -- coordinate (0, 2) owned [0:8, 362:543, 0:1440] window [0:8, 361:544, -1:1441]
    rank3 -- coordinate (0, 3) owned [0:8, 543:721, 0:1440] window [0:8, 542:722, -1:1441]
    ranks 4..7 (data_parallel=1) have the same regions and the other half of the samples.

The layout can also come from the model: ``Layout.from_placements(mesh, placements)`` (the inverse
of ``dtensor_placements``), ``Layout.from_dtensor(t)``, ``Layout.from_shard_tensor(t)`` (PhysicsNeMo
sharding shapes become explicit sizes, ``split={mesh dim: [sizes...]}``, or the rule they equal).
The sample order (``SampleOrder``) is computed per index in O(1): no table of the epoch is needed.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from dali_mesh.mesh import MeshError, MeshInfo

__all__ = [
    "BOUNDARIES",
    "SPLITS",
    "LayoutError",
    "Layout",
    "Region",
    "SampleOrder",
    "boundary_index",
    "check_fill_value",
    "sample_order",
    "shard_extent",
    "split_sizes",
    "take_window",
]

#: Boundary rules, numpy's names and meanings (``periodic`` is numpy's ``wrap``); ``trim`` clips.
BOUNDARIES = ("constant", "periodic", "reflect", "symmetric", "edge", "trim")
#: Split rules: torch.chunk / DTensor, PhysicsNeMo's compute_split_shapes, numpy's array_split.
SPLITS = ("chunk", "physicsnemo", "even")


class LayoutError(ValueError):
    """A layout, or a layout applied to a sample shape, is invalid."""


# ---- split rules --------------------------------------------------------------------------------
def _check_split(rule: str) -> None:
    if rule not in SPLITS:
        raise LayoutError(f"unknown split {rule!r}; expected one of {', '.join(SPLITS)}")


def shard_extent(n: int, k: int, i: int, rule: str = "chunk") -> tuple[int, int]:
    """``(offset, size)`` of shard ``i`` of ``k`` of an axis of ``n`` cells, in O(1).

    ``chunk``: ceil(n/k) each, trailing shards smaller or empty (torch.chunk, DTensor ``Shard``).
    ``physicsnemo``: ceil(n/k) each and the last gets the rest; if the last would be empty,
    floor(n/k) each and the last gets the rest (PhysicsNeMo ``compute_split_shapes``).
    ``even``: the first ``n mod k`` get floor(n/k)+1, the rest floor(n/k) (numpy ``array_split``).
    """
    _check_split(rule)
    if n < 0 or k <= 0 or not 0 <= i < k:
        raise LayoutError(f"shard {i} of {k} of an axis of {n} cells is not defined")
    if rule == "chunk":
        c = -(-n // k)
        offset = min(i * c, n)
        return offset, min(c, n - offset)
    if rule == "physicsnemo":
        c = -(-n // k)
        if n - c * (k - 1) <= 0:
            c = n // k
        offset = i * c
        return offset, (n - offset if i == k - 1 else c)
    q, r = divmod(n, k)
    return i * q + min(i, r), q + (1 if i < r else 0)


def split_sizes(n: int, k: int, rule: str = "chunk") -> tuple[int, ...]:
    """Sizes of the ``k`` shards of an axis of ``n`` cells.

    >>> split_sizes(5, 4, "chunk"), split_sizes(5, 4, "physicsnemo"), split_sizes(5, 4, "even")
    ((2, 2, 1, 0), (1, 1, 1, 2), (2, 1, 1, 1))
    """
    return tuple(shard_extent(n, k, i, rule)[1] for i in range(k))


# ---- boundary rules ------------------------------------------------------------------------------
def _check_boundary(mode: str) -> None:
    if mode not in BOUNDARIES:
        raise LayoutError(f"unknown boundary {mode!r}; expected one of {', '.join(BOUNDARIES)}")


def boundary_index(r, n: int, mode: str):
    """Index in ``[0, n)`` that ``np.pad(..., mode)`` copies to position ``r`` (relative to the domain
    start), or ``-1`` where ``constant`` (or ``trim``) has no source cell. ``r`` may be an int or an
    integer ndarray; any number of periods.

    ``periodic``: period n. ``reflect`` (edge not repeated): period 2n-2 (n == 1 repeats the value).
    ``symmetric`` (edge repeated): period 2n. ``edge``: clamped.
    """
    _check_boundary(mode)
    if n <= 0:
        raise LayoutError(f"boundary index on an axis of {n} cells")
    scalar = np.ndim(r) == 0
    r = np.asarray(r, dtype=np.int64)
    if mode == "periodic":
        out = np.mod(r, n)
    elif mode == "reflect":
        if n == 1:
            out = np.zeros_like(r)
        else:
            m = np.mod(r, 2 * n - 2)
            out = np.where(m < n, m, 2 * n - 2 - m)
    elif mode == "symmetric":
        m = np.mod(r, 2 * n)
        out = np.where(m < n, m, 2 * n - 1 - m)
    elif mode == "edge":
        out = np.clip(r, 0, n - 1)
    else:  # constant, trim
        out = np.where((r >= 0) & (r < n), r, -1)
    return int(out) if scalar else out


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
        d0, d1 = region.domain_start[a], region.domain_stop[a]
        pos = np.arange(region.window_start[a], region.window_stop[a], dtype=np.int64) - d0
        idx = boundary_index(pos, d1 - d0, region.boundary[a]) if d1 > d0 else np.full(pos.shape, -1)
        fill_mask.append(idx < 0)
        index.append(np.where(idx < 0, 0, idx) + d0)
    if region.size == 0:
        return np.empty(region.window_shape, dtype=sample.dtype)
    out = sample[np.ix_(*index)]
    for a, mask in enumerate(fill_mask):
        if mask.any():
            sel = [slice(None)] * region.ndim
            sel[a] = mask
            out[tuple(sel)] = np.asarray(region.fill_value).astype(sample.dtype)
    return out


# ---- layouts -------------------------------------------------------------------------------------
def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _normalize_axis(axis: int, ndim: int, what: str) -> int:
    if not _is_int(axis):
        raise LayoutError(f"{what}: axis {axis!r} is not an integer")
    if not -ndim <= axis < ndim:
        raise LayoutError(f"{what}: axis {axis} is out of range for a sample of {ndim} dims")
    return int(axis) % ndim


def _per_axis(value, ndim: int, default, what: str) -> list:
    """Expand a scalar, a per-axis sequence or an ``{axis: value}`` mapping to one value per axis."""
    if isinstance(value, Mapping):
        out = [default] * ndim
        seen = set()
        for axis, v in value.items():
            a = _normalize_axis(axis, ndim, what)
            if a in seen:
                raise LayoutError(f"{what}: axis {axis} is given twice")
            seen.add(a)
            out[a] = v
        return out
    if isinstance(value, (list, tuple)):
        if len(value) != ndim:
            raise LayoutError(f"{what} {value!r} has {len(value)} entries for a sample of {ndim} dims")
        return list(value)
    return [value] * ndim


def _halo_pair(v, axis) -> tuple[int, int]:
    if isinstance(v, (list, tuple)):
        if len(v) != 2:
            raise LayoutError(f"halo of axis {axis} must be an int or (low, high), got {v!r}")
        lo, hi = v
    else:
        lo = hi = v
    for h in (lo, hi):
        if not _is_int(h):
            raise LayoutError(f"halo of axis {axis} must be integers, got {v!r}")
        if h < 0:
            raise LayoutError(f"negative halo {v!r} on axis {axis}: halos count cells and must be >= 0")
    return int(lo), int(hi)


def _mesh_dim(mesh: MeshInfo, name, what: str) -> int:
    try:
        return mesh.dim_index(name)
    except MeshError as e:
        raise LayoutError(f"{what}: {e}") from None


def _normalize_halo(halo) -> tuple:
    """A hashable normal form of ``halo``, checked as far as it can be without the sample's ndim."""
    if isinstance(halo, Mapping):
        items = []
        for axis, v in halo.items():
            if not _is_int(axis):
                raise LayoutError(f"halo: axis {axis!r} is not an integer")
            pair = _halo_pair(v, axis)
            if pair != (0, 0):
                items.append((int(axis), pair))
        return ("map", tuple(sorted(items))) if items else ("all", (0, 0))
    if isinstance(halo, (list, tuple)):
        return ("per_axis", tuple(_halo_pair(v, a) for a, v in enumerate(halo)))
    if not _is_int(halo):
        raise LayoutError(f"halo must be an int, one entry per axis or {{axis: int | (low, high)}}, "
                          f"got {halo!r} ({type(halo).__name__})")
    return ("all", _halo_pair(halo, "*"))


def _normalize_boundary(boundary) -> tuple:
    """A hashable normal form of ``boundary``, every rule checked."""
    if isinstance(boundary, str):
        _check_boundary(boundary)
        return ("all", boundary)
    if isinstance(boundary, Mapping):
        items = []
        for axis, mode in boundary.items():
            if not _is_int(axis):
                raise LayoutError(f"boundary: axis {axis!r} is not an integer")
            _check_boundary(mode)
            if mode != "constant":
                items.append((int(axis), mode))
        return ("map", tuple(sorted(items))) if items else ("all", "constant")
    if isinstance(boundary, (list, tuple)):
        for mode in boundary:
            _check_boundary(mode)
        return ("per_axis", tuple(boundary))
    raise LayoutError(f"boundary must be a rule name ({', '.join(BOUNDARIES)}), one per axis or "
                      f"{{axis: rule}}, got {boundary!r}")


def _normalize_crop(crop) -> tuple | None:
    """``crop`` as one ``(start, stop)`` per axis (``stop`` None: to the end of the axis), integers checked."""
    if crop is None:
        return None
    if isinstance(crop, (str, bytes)) or not isinstance(crop, Sequence):
        raise LayoutError(f"crop must be None or one (start, stop), slice or None per axis, got {crop!r}")
    out = []
    for a, c in enumerate(crop):
        if c is None:
            s, e = 0, None
        elif isinstance(c, slice):
            if c.step not in (None, 1):
                raise LayoutError(f"crop of axis {a}: step {c.step} is not supported")
            s = 0 if c.start is None else c.start
            e = c.stop
        else:
            try:
                s, e = c
            except (TypeError, ValueError):
                raise LayoutError(f"crop of axis {a} must be (start, stop), a slice or None, got {c!r}") from None
        for what, v in (("start", s), ("stop", e)):
            if v is not None and not _is_int(v):
                raise LayoutError(f"crop of axis {a}: {what} {v!r} is not an integer")
        out.append((int(s), None if e is None else int(e)))
    return tuple(out)


def _check_fill_type(fill_value):
    if not isinstance(fill_value, (int, float, np.integer, np.floating, np.bool_)):
        raise LayoutError(f"fill_value must be a real number, got {fill_value!r} ({type(fill_value).__name__})")
    return fill_value


def _nested_sizes(n: int, counts: Sequence[int], rule: str) -> list[int]:
    """Sizes of the combined shards of an axis of ``n`` cells split by ``rule`` over nested mesh dims of
    ``counts`` ranks (outer first, each splitting the previous shard), row-major: as ``region`` does."""
    sizes = [n]
    for k in counts:
        sizes = [s for size in sizes for s in split_sizes(size, k, rule)]
    return sizes


def _check_explicit_split(split: Mapping, mesh: MeshInfo, shard: Sequence[tuple[int, int]]
                          ) -> dict[int, tuple[int, ...]]:
    """Explicit shard sizes ``{mesh dim: sizes}`` checked against the shard dims; keyed by mesh dim index."""
    out: dict[int, tuple[int, ...]] = {}
    shard_dims = dict(shard)
    for name, sizes in split.items():
        d = _mesh_dim(mesh, name, "split")
        if d not in shard_dims:
            raise LayoutError(f"split: mesh dim {mesh.names[d]!r} shards no axis; explicit sizes are given "
                              f"only for mesh dims in shard ({[mesh.names[k] for k in shard_dims]})")
        if d in out:
            raise LayoutError(f"split: mesh dim {mesh.names[d]!r} is given twice")
        if isinstance(sizes, (str, bytes)) or not isinstance(sizes, (Sequence, np.ndarray)):
            raise LayoutError(f"split: sizes of mesh dim {mesh.names[d]!r} must be a list of integers, got {sizes!r}")
        for s in sizes:
            if not _is_int(s):
                raise LayoutError(f"split: size {s!r} of mesh dim {mesh.names[d]!r} is not an integer")
            if s < 0:
                raise LayoutError(f"split: size {s} of mesh dim {mesh.names[d]!r} is negative")
        out[d] = tuple(int(s) for s in sizes)
    _check_explicit_groups(out, mesh, shard, None)
    return out


def _axis_groups(shard: Sequence[tuple[int, int]], ndim: int | None) -> dict[int, list[int]]:
    """Sample axis -> the mesh dims that shard it, outer (earlier) first."""
    groups: dict[int, list[int]] = {}
    for d, a in shard:
        groups.setdefault(a if ndim is None else _normalize_axis(a, ndim, "shard"), []).append(d)
    return groups


def _check_explicit_groups(sizes: Mapping[int, tuple[int, ...]], mesh: MeshInfo,
                           shard: Sequence[tuple[int, int]], ndim: int | None) -> None:
    for axis, dims in _axis_groups(shard, ndim).items():
        inner = dims[-1]
        names = [mesh.names[d] for d in dims]
        for d in dims[:-1]:
            if d in sizes:
                raise LayoutError(
                    f"split: mesh dims {names} shard axis {axis} together; give the sizes of all "
                    f"{math.prod(mesh.shape[k] for k in dims)} combined shards on the innermost, "
                    f"{mesh.names[inner]!r} (row-major over {names}), not on {mesh.names[d]!r}")
        if inner not in sizes:
            raise LayoutError(f"split: no sizes for mesh dim {mesh.names[inner]!r} (it shards axis {axis}); "
                              "explicit splits give sizes for every sharded axis")
        count = math.prod(mesh.shape[k] for k in dims)
        if len(sizes[inner]) != count:
            what = (f"mesh dim {mesh.names[inner]!r} has {count} ranks" if len(dims) == 1 else
                    f"mesh dims {names} make {count} combined shards of axis {axis}")
            raise LayoutError(f"split: {len(sizes[inner])} sizes {list(sizes[inner])} given but {what}: "
                              "give one size per shard")


class Layout:
    """How one sample is split over a mesh.

    Args:
        mesh: this rank's ``MeshInfo``.
        shard: mesh dim name -> sample axis it splits (negative axes allowed). Two mesh dims may
            split one axis: nested, the outer (earlier) mesh dim first, as DTensor does.
        batch: mesh dims that split the dataset (a name or a sequence). If omitted and exactly one
            mesh dim shards nothing, that dim is the batch dim; if no mesh dim is left, there is no
            batch dim; otherwise ``batch`` must be given. Other mesh dims that shard nothing are
            replica dims (same samples, same window).
        crop: ``None`` or one ``(start, stop)`` (or ``slice``, or ``None`` for the whole axis) per axis,
            applied before splitting: the crop is the domain; data outside it is never read.
        halo: cells on each side: an int for every axis, one entry per axis, or ``{axis: int | (lo, hi)}``.
        boundary: a rule for every axis, one per axis, or ``{axis: rule}`` (others ``constant``):
            ``constant`` (+ ``fill_value``), ``periodic``, ``reflect``, ``symmetric``, ``edge``, ``trim``.
        fill_value: the value of ``constant`` cells (a real number).
        split: a rule, ``chunk`` (torch.chunk, DTensor), ``physicsnemo`` or ``even`` (numpy
            array_split), or explicit shard sizes ``{mesh dim: [sizes...]}``: one list for every
            sharded axis, one size per rank along that mesh dim, summing to the axis length (the
            crop length with a crop). When several mesh dims shard one axis, the list is given on
            the innermost of them and holds the sizes of all their combined shards, row-major over
            their coordinates (outer first): the rank at coordinates ``(i, j)`` of mesh dims of
            sizes ``(k1, k2)`` owns shard ``i * k2 + j``. Shards are laid out in that order, so
            shard ``c`` starts at ``sum(sizes[:c])``. ``layout.split`` is then ``"explicit"`` and
            ``layout.split_sizes`` holds the sizes.

    Two layouts are equal when their mesh, shard dims, batch dims and normalised crop, halo,
    boundary, fill value and split are equal (halo and boundary as given: ``halo=1`` and
    ``halo=[1, 1]`` are different layouts, though equal on 2-d samples).
    """

    def __init__(
        self,
        mesh: MeshInfo,
        shard: Mapping[str | int, int] | None = None,
        batch: str | Sequence[str] | None = None,
        crop: Sequence[Any] | None = None,
        halo: int | Sequence | Mapping = 0,
        boundary: str | Sequence[str] | Mapping[int, str] = "constant",
        fill_value: float = 0,
        split: str | Mapping[str | int, Sequence[int]] = "chunk",
    ) -> None:
        if not isinstance(mesh, MeshInfo):
            raise LayoutError(f"mesh must be a MeshInfo, got {type(mesh).__name__}")
        self.mesh = mesh
        self.fill_value = _check_fill_type(fill_value)

        # shard: mesh dim -> axis, kept in mesh-dim order (outer first)
        if shard is not None and not isinstance(shard, Mapping):
            raise LayoutError(f"shard must be a mapping {{mesh dim: sample axis}}, got {shard!r}")
        shard = dict(shard or {})
        by_dim: dict[int, int] = {}
        for name, axis in shard.items():
            d = _mesh_dim(mesh, name, "shard")
            if d in by_dim:
                raise LayoutError(f"shard: mesh dim {mesh.names[d]!r} is used twice")
            if not _is_int(axis):
                raise LayoutError(f"shard: axis {axis!r} of mesh dim {mesh.names[d]!r} is not an integer")
            by_dim[d] = int(axis)
        self._shard = tuple(sorted(by_dim.items()))  # ((mesh_dim, axis), ...)

        # split: a rule name, or explicit sizes with their prefix sums (O(1) offsets per rank)
        if isinstance(split, Mapping):
            self._split_sizes = _check_explicit_split(split, mesh, self._shard)
            self._split_prefix = {d: tuple(itertools.accumulate(s, initial=0)) for d, s in self._split_sizes.items()}
            self.split = "explicit"
        elif isinstance(split, str):
            _check_split(split)
            self._split_sizes = self._split_prefix = None
            self.split = split
        else:
            raise LayoutError(f"split must be a rule ({', '.join(SPLITS)}) or {{mesh dim: [sizes...]}}, got {split!r}")

        # batch dims
        if batch is None:
            free = [d for d in range(mesh.ndim) if d not in by_dim]
            if len(free) > 1:
                names = [mesh.names[d] for d in free]
                raise LayoutError(
                    f"batch is required: mesh dims {names} shard no axis, so say which of them split "
                    f"the dataset (e.g. batch={names[0]!r}); the others are replicas"
                )
            batch_dims = free
        else:
            names = [batch] if isinstance(batch, (str, int, np.integer)) else list(batch)
            batch_dims = []
            for name in names:
                d = _mesh_dim(mesh, name, "batch")
                if d in by_dim:
                    raise LayoutError(f"mesh dim {mesh.names[d]!r} is used twice: in shard and in batch")
                if d in batch_dims:
                    raise LayoutError(f"batch: mesh dim {mesh.names[d]!r} is used twice")
                batch_dims.append(d)
            batch_dims.sort()
        self._batch_dims = tuple(batch_dims)

        self._crop_key = _normalize_crop(crop)
        self._crop = None if crop is None else list(crop)
        # halo and boundary are checked against the sample's ndim in region(); check what we can now.
        self._halo = halo
        self._boundary = boundary
        self._halo_key = _normalize_halo(halo)
        self._boundary_key = _normalize_boundary(boundary)

    # ---- equality ----------------------------------------------------------------------------------
    def _key(self) -> tuple:
        fill = ("nan",) if isinstance(self.fill_value, (float, np.floating)) and np.isnan(self.fill_value) \
            else self.fill_value
        sizes = None if self._split_sizes is None else tuple(sorted(self._split_sizes.items()))
        return (self.mesh, self._shard, self._batch_dims, self._crop_key, self._halo_key, self._boundary_key,
                fill, self.split, sizes)

    def __eq__(self, other) -> bool:
        """Equal as given: ``shard={"mp": -1}`` and ``shard={"mp": 2}`` differ (they agree only for
        3-axis samples). Compare ``a.normalized(ndim) == b.normalized(ndim)`` (or
        ``a.same_as(b, ndim)``) for a given sample ndim."""
        if not isinstance(other, Layout):
            return NotImplemented
        return self._key() == other._key()

    def normalized(self, ndim: int) -> "Layout":
        """This layout for samples of ``ndim`` axes with every axis counted from 0: negative axes of
        ``shard``, and of ``halo``/``boundary`` given as ``{axis: ...}``, resolved (out of range:
        ``LayoutError``). ``Layout.from_placements(mesh, layout.dtensor_placements(ndim)) ==
        layout.normalized(ndim)`` for every layout DTensor can describe."""
        ndim = _check_int("ndim", ndim, 1)
        shard = {self.mesh.names[d]: _normalize_axis(a, ndim, "shard") for d, a in self._shard}

        def keyed(value, what):
            if not isinstance(value, Mapping):
                return value
            out = {}
            for axis, v in value.items():
                a = _normalize_axis(axis, ndim, what)
                if a in out:
                    raise LayoutError(f"{what}: axis {axis} is given twice (as {a} and {a - ndim})")
                out[a] = v
            return out

        return Layout(self.mesh, shard=shard, batch=self.batch_dims, crop=self._crop,
                      halo=keyed(self._halo, "halo"), boundary=keyed(self._boundary, "boundary"),
                      fill_value=self.fill_value, split=self.split_sizes if self._split_sizes is not None else self.split)

    def same_as(self, other: "Layout", ndim: int) -> bool:
        """Whether two layouts split samples of ``ndim`` axes the same way (negative axes resolved)."""
        return self.normalized(ndim) == other.normalized(ndim)

    def explicit_matches(self, global_shape: Sequence[int], rule: str = "chunk") -> bool:
        """Whether this layout's shard sizes equal ``rule``'s for samples of ``global_shape`` (crop
        applied). Explicit sizes (``split={dim: [...]}``) can equal a rule only for one axis length,
        which a ``Layout`` does not know until it sees the sample shape: ``181/181/181/178`` is
        ``chunk`` for 721 cells over 4 ranks, and DTensor output is allowed for it there."""
        _check_split(rule)
        if self._split_sizes is None:
            return self.split == rule
        shape = _check_shape(global_shape)
        d0, d1 = self.domain(shape)
        for axis, dims in _axis_groups(self._shard, len(shape)).items():
            want = _nested_sizes(d1[axis] - d0[axis], [self.mesh.shape[d] for d in dims], rule)
            if tuple(want) != self._split_sizes[dims[-1]]:
                return False
        return True

    def __hash__(self) -> int:
        return hash(self._key())

    # ---- mesh-side facts --------------------------------------------------------------------------
    @property
    def shard_dims(self) -> dict[str, int]:
        """Mesh dim name -> the sample axis it shards, as given (not normalised)."""
        return {self.mesh.names[d]: a for d, a in self._shard}

    @property
    def split_sizes(self) -> dict[str, tuple[int, ...]] | None:
        """Explicit shard sizes, mesh dim name -> sizes (``split == "explicit"``), else None."""
        if self._split_sizes is None:
            return None
        return {self.mesh.names[d]: s for d, s in sorted(self._split_sizes.items())}

    def split_sizes_flat(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Explicit sizes as plain numbers for the C++ ``mesh_roi``: ``(counts, sizes)``, ``counts``
        one per mesh dim (how many sizes it gives: 0, or its combined shard count on the innermost
        dim of an axis), ``sizes`` all lists concatenated in mesh-dim order. ``((), ())`` for a rule."""
        if self._split_sizes is None:
            return (), ()
        counts = tuple(len(self._split_sizes.get(d, ())) for d in range(self.mesh.ndim))
        sizes = tuple(v for d in range(self.mesh.ndim) for v in self._split_sizes.get(d, ()))
        return counts, sizes

    @property
    def batch_dims(self) -> tuple[str, ...]:
        return tuple(self.mesh.names[d] for d in self._batch_dims)

    @property
    def replica_dims(self) -> tuple[str, ...]:
        used = {d for d, _ in self._shard} | set(self._batch_dims)
        return tuple(n for d, n in enumerate(self.mesh.names) if d not in used)

    def shard_axes(self, ndim: int | None = None) -> tuple[int, ...]:
        """Per mesh dim: the sample axis it shards (normalised when ``ndim`` is given), or -1."""
        out = [-1] * self.mesh.ndim
        for d, a in self._shard:
            out[d] = _normalize_axis(a, ndim, "shard") if ndim is not None else a
        return tuple(out)

    def batch_index_of(self, coordinate: Sequence[int]) -> int:
        """Row-major index of a coordinate's batch coordinate over the batch dims (mesh order)."""
        b = 0
        for d in self._batch_dims:
            b = b * self.mesh.shape[d] + coordinate[d]
        return b

    @property
    def batch_index(self) -> int:
        """This rank's sample group."""
        return self.batch_index_of(self.mesh.coordinate)

    @property
    def num_batch_groups(self) -> int:
        return math.prod(self.mesh.shape[d] for d in self._batch_dims)

    def order(self, num_samples: int, epoch: int, *, seed: int = 0, shuffle: bool = True,
              batch_size: int = 1, drop_last: bool = False) -> "SampleOrder":
        """This rank's :class:`SampleOrder` for one epoch (its sample group's share), O(1) memory."""
        return SampleOrder(num_samples, epoch, seed=seed, shuffle=shuffle, batch_size=batch_size,
                           drop_last=drop_last, batch_index=self.batch_index,
                           num_batch_groups=self.num_batch_groups)

    def sample_order(self, num_samples: int, epoch: int, *, seed: int = 0, shuffle: bool = True,
                     batch_size: int = 1, drop_last: bool = False):
        """This rank's sample ids and pad flags for one epoch: ``self.order(...).arrays()``."""
        return self.order(num_samples, epoch, seed=seed, shuffle=shuffle, batch_size=batch_size,
                          drop_last=drop_last).arrays()

    # ---- per-axis settings for a sample of ndim dims ------------------------------------------------
    def halo_pairs(self, ndim: int) -> tuple[tuple[int, int], ...]:
        values = _per_axis(self._halo, ndim, 0, "halo")
        return tuple(_halo_pair(v, a) for a, v in enumerate(values))

    def boundaries(self, ndim: int) -> tuple[str, ...]:
        values = _per_axis(self._boundary, ndim, "constant", "boundary")
        for v in values:
            _check_boundary(v)
        return tuple(values)

    def domain(self, global_shape: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """``(domain_start, domain_stop)``: the crop box, checked against the sample shape."""
        shape = _check_shape(global_shape)
        if self._crop_key is None:
            return (0,) * len(shape), shape
        if len(self._crop_key) != len(shape):
            raise LayoutError(f"crop {self._crop!r} has {len(self._crop_key)} entries for a sample of shape {shape}")
        lo, hi = [], []
        for a, ((s, e), n) in enumerate(zip(self._crop_key, shape)):
            e = n if e is None else e
            if not (0 <= s < e <= n):
                raise LayoutError(
                    f"crop {s}:{e} of axis {a} lies outside the sample (axis size {n}) or is empty"
                )
            lo.append(s)
            hi.append(e)
        return tuple(lo), tuple(hi)

    # ---- regions ------------------------------------------------------------------------------------
    def _check_coordinate(self, coordinate) -> tuple[int, ...]:
        coordinate = tuple(coordinate)
        if len(coordinate) != self.mesh.ndim or any(
            not _is_int(c) or not 0 <= c < s for c, s in zip(coordinate, self.mesh.shape)
        ):
            raise LayoutError(f"coordinate {coordinate} is out of range for mesh shape {self.mesh.shape}: "
                              "one integer per mesh dim, 0 <= c < size")
        return tuple(int(c) for c in coordinate)

    def region(self, global_shape: Sequence[int], coordinate: Sequence[int] | None = None) -> Region:
        """The region of the rank at ``coordinate`` (this rank by default). O(ndim), whatever the
        mesh size (explicit sizes: offsets from prefix sums made once)."""
        shape = _check_shape(global_shape)
        ndim = len(shape)
        coordinate = self.mesh.coordinate if coordinate is None else self._check_coordinate(coordinate)
        d0, d1 = self.domain(shape)
        halo = self.halo_pairs(ndim)
        boundary = self.boundaries(ndim)
        start, stop = list(d0), list(d1)
        groups = _axis_groups(self._shard, ndim)
        if self._split_sizes is not None:
            _check_explicit_groups(self._split_sizes, self.mesh, self._shard, ndim)
        for axis, dims in groups.items():
            if self._split_sizes is None:
                for mesh_dim in dims:  # mesh-dim order: outer first, each splits the previous shard
                    offset, size = shard_extent(stop[axis] - start[axis], self.mesh.shape[mesh_dim],
                                                coordinate[mesh_dim], self.split)
                    start[axis] += offset
                    stop[axis] = start[axis] + size
                continue
            prefix = self._split_prefix[dims[-1]]
            if prefix[-1] != d1[axis] - d0[axis]:
                raise LayoutError(
                    f"split sizes {list(self._split_sizes[dims[-1]])} of mesh dim {self.mesh.names[dims[-1]]!r} "
                    f"sum to {prefix[-1]} but axis {axis} has {d1[axis] - d0[axis]} cells"
                    + (" (its crop)" if self._crop_key is not None else "") + ": the sizes must tile the axis")
            c = 0
            for mesh_dim in dims:  # the combined shard index, row-major over the nested dims
                c = c * self.mesh.shape[mesh_dim] + coordinate[mesh_dim]
            start[axis] = d0[axis] + prefix[c]
            stop[axis] = d0[axis] + prefix[c + 1]
        ws, we = [], []
        for a in range(ndim):
            if stop[a] == start[a]:  # an empty shard sits at the domain end (torch's convention)
                start[a] = stop[a] = d1[a]
        # an empty owned region gets no halo: its window is its owned region
        empty = any(s == e for s, e in zip(start, stop))
        for a in range(ndim):
            if empty:
                ws.append(start[a])
                we.append(stop[a])
                continue
            lo, hi = halo[a]
            w0, w1 = start[a] - lo, stop[a] + hi
            if boundary[a] == "trim":
                w0, w1 = max(w0, d0[a]), min(w1, d1[a])
            ws.append(w0)
            we.append(w1)
        return Region(d0, d1, tuple(start), tuple(stop), tuple(ws), tuple(we), boundary, self.fill_value)

    def regions(self, global_shape: Sequence[int]) -> list[Region]:
        """The region of every rank, in rank order."""
        return [self.region(global_shape, c) for c in self.mesh.coordinates()]

    # ---- torch / PhysicsNeMo --------------------------------------------------------------------------
    def placement_spec(self, ndim: int, *, halo_stripped: bool = False, lead_axes: int = 0,
                       any_split: bool = False, global_shape: Sequence[int] | None = None
                       ) -> tuple[tuple[str, int | None], ...]:
        """Placements of the batched tensor ``(batch, *lead, *sample)`` per mesh dim, as plain data:
        ``("shard", 0)`` for batch dims, ``("shard", 1 + lead_axes + axis)`` for shard dims,
        ``("replicate", None)`` otherwise.

        DTensor describes the batch only for ``split="chunk"`` and windows without halo (or with the
        halo stripped: ``halo_stripped=True``); anything else raises. ``lead_axes`` counts unsplit
        axes between the batch and the sample (the steps of a forecast). ``any_split=True`` skips the
        split check, for PhysicsNeMo ``ShardTensor``, which carries explicit shard shapes.
        ``global_shape``: the sample shape; explicit sizes are accepted when they equal torch.chunk's
        for it (:meth:`explicit_matches`), as they are for the axis length they were made for.
        """
        if global_shape is not None and len(_check_shape(global_shape)) != ndim:
            raise LayoutError(f"global_shape {tuple(global_shape)} has {len(global_shape)} axes, ndim is {ndim}")
        if self.split != "chunk" and not any_split:
            if self.split == "explicit" and global_shape is not None and self.explicit_matches(global_shape):
                pass  # the sizes are exactly chunk's for this shape: the DTensor tells the truth
            elif self.split == "explicit":
                chunk = {self.mesh.names[dims[-1]]: _nested_sizes(
                    self.domain(global_shape)[1][a] - self.domain(global_shape)[0][a],
                    [self.mesh.shape[d] for d in dims], "chunk")
                    for a, dims in _axis_groups(self._shard, ndim).items()} if global_shape is not None else None
                raise LayoutError(
                    f"no DTensor for explicit split sizes {self.split_sizes}: DTensor's Shard sizes follow "
                    + (f"torch.chunk, which gives {chunk} for sample shape {tuple(global_shape)}; "
                       if chunk is not None else
                       "torch.chunk, and explicit sizes are accepted only when they equal chunk's for the "
                       "sample shape (pass global_shape=, as to_dtensor and MeshLoader do); ")
                    + "use the local tensor and its region, or a PhysicsNeMo ShardTensor with sharding_shapes")
            else:
                raise LayoutError(
                    f"no DTensor for split={self.split!r}: DTensor's Shard sizes follow torch.chunk; use the "
                    "local tensor and its region, or a PhysicsNeMo ShardTensor with sharding_shapes"
                )
        if not halo_stripped and any(lo or hi for lo, hi in self.halo_pairs(ndim)):
            raise LayoutError(
                "no DTensor for a window with halo: strip the halo first (region.owned_in_window) "
                "or use the local tensor and its region"
            )
        axes = self.shard_axes(ndim)
        out = []
        for d in range(self.mesh.ndim):
            if d in self._batch_dims:
                out.append(("shard", 0))
            elif axes[d] >= 0:
                out.append(("shard", 1 + lead_axes + axes[d]))
            else:
                out.append(("replicate", None))
        return tuple(out)

    def dtensor_placements(self, ndim: int, **kwargs):
        """torch DTensor placements of the batched tensor (imports torch); arguments as
        :meth:`placement_spec`."""
        from torch.distributed.tensor import Replicate, Shard  # noqa: PLC0415

        return [Shard(d) if kind == "shard" else Replicate() for kind, d in self.placement_spec(ndim, **kwargs)]

    def sharding_shapes(self, global_shape: Sequence[int], batch_size: int | None = None
                        ) -> dict[int, tuple[tuple[int, ...], ...]]:
        """For ``ShardTensor.from_local(..., sharding_shapes=...)``: per mesh dim that shards an axis,
        the owned shapes of the ranks along that mesh dim (this rank's coordinate elsewhere). With
        ``batch_size`` the shapes are of the batched tensor ``(batch_size, *shape)``."""
        axes = self.shard_axes(len(_check_shape(global_shape)))
        out = {}
        for d, axis in enumerate(axes):
            if axis < 0:
                continue
            shapes = []
            for i in range(self.mesh.shape[d]):
                c = list(self.mesh.coordinate)
                c[d] = i
                s = self.region(global_shape, c).shape
                shapes.append(((batch_size,) + s) if batch_size is not None else s)
            out[d] = tuple(shapes)
        return out

    # ---- the way back: a layout from the model's input spec -------------------------------------------
    @classmethod
    def from_placements(cls, mesh, placements: Sequence, *, batched: bool = True, ndim: int | None = None,
                        lead_axes: int = 0, batch: str | Sequence[str] | None = None, crop=None,
                        halo=0, boundary="constant", fill_value: float = 0,
                        split: str | Mapping = "chunk") -> "Layout":
        """The layout whose :meth:`dtensor_placements` are ``placements``: the inverse of that method,
        with axes counted from 0: ``Layout.from_placements(mesh, layout.dtensor_placements(n)) ==
        layout.normalized(n)`` (a layout given ``shard={"mp": -1}`` comes back as ``{"mp": n - 1}``).

        Args:
            mesh: a ``MeshInfo`` or a torch ``DeviceMesh`` (this rank's coordinate is read from it).
            placements: one per mesh dim: torch ``Shard(d)`` / ``Replicate()``, or the plain data
                of :meth:`placement_spec` (``("shard", d)`` / ``("replicate", None)``).
            batched: the tensor is a batch ``(batch, *lead, *sample)``: ``Shard(0)`` marks a batch
                dim and ``Shard(1 + lead_axes + a)`` shards sample axis ``a``. Unbatched:
                ``Shard(a)`` shards sample axis ``a``, and ``batch`` names the batch dims among the
                replicated ones (by default as ``Layout``: the one mesh dim that shards nothing).
            ndim: the tensor's number of dims; needed only to resolve negative ``Shard`` dims.
            lead_axes: unsplit axes between batch and sample (the steps of a forecast).
            batch: batched: the mesh dims expected on the batch axis (checked against the
                ``Shard(0)`` dims); unbatched: the batch dims.
            crop, halo, boundary, fill_value, split: as for ``Layout`` (they are not in placements).

        Several mesh dims sharding one tensor dim nest in mesh-dim order, as DTensor does and as
        ``Layout`` does. ``Partial`` (a pending reduction, not data) and ``_StridedShard`` (an
        interleaved order no reader can serve) are refused, naming the mesh dim and placement.
        """
        if not isinstance(mesh, MeshInfo):
            if not hasattr(mesh, "get_coordinate"):
                raise LayoutError(f"mesh must be a MeshInfo or a torch DeviceMesh, got {type(mesh).__name__}")
            mesh = MeshInfo.from_device_mesh(mesh)
        batched = _check_bool("batched", batched)
        lead_axes = _check_int("lead_axes", lead_axes, 0)
        if ndim is not None:
            ndim = _check_int("ndim", ndim, 1)
        placements = list(placements)
        if len(placements) != mesh.ndim:
            raise LayoutError(f"{len(placements)} placements {placements} for a mesh of {mesh.ndim} dims "
                              f"{list(mesh.names)}: give one placement per mesh dim")
        offset = 1 + lead_axes if batched else 0
        shard, on_batch_axis = {}, []
        for d, p in enumerate(placements):
            kind, tensor_dim = _placement_kind(p, mesh.names[d])
            if kind == "replicate":
                continue
            if tensor_dim < 0:
                if ndim is None:
                    raise LayoutError(f"placement {p!r} of mesh dim {mesh.names[d]!r} counts from the end: "
                                      "pass ndim (the tensor's number of dims) to resolve it")
                tensor_dim += ndim
            if ndim is not None and not 0 <= tensor_dim < ndim:
                raise LayoutError(f"placement {p!r} of mesh dim {mesh.names[d]!r} is out of range for a "
                                  f"tensor of {ndim} dims")
            if batched and tensor_dim == 0:
                on_batch_axis.append(mesh.names[d])
            elif batched and tensor_dim < offset:
                raise LayoutError(f"placement {p!r} of mesh dim {mesh.names[d]!r} shards lead axis "
                                  f"{tensor_dim - 1} (one of the {lead_axes} unsplit axes between batch "
                                  "and sample): a loader cannot split those")
            else:
                shard[mesh.names[d]] = tensor_dim - offset
        if batched:
            if batch is not None:
                expected = [batch] if isinstance(batch, str) else list(batch)
                for name in on_batch_axis:
                    if name not in expected:
                        raise LayoutError(
                            f"placement Shard(0) of mesh dim {name!r} shards the batch axis, but {name!r} is "
                            f"not a batch dim (batch={expected}): a model-parallel dim cannot split the "
                            "batch; give it Replicate() or Shard(1 + axis)")
                for name in expected:
                    if name not in on_batch_axis:
                        raise LayoutError(f"batch dim {name!r} has no Shard(0) placement in {placements}: "
                                          "a batch dim splits the batch axis (Shard(0))")
            batch = on_batch_axis
        return cls(mesh, shard=shard, batch=batch, crop=crop, halo=halo, boundary=boundary,
                   fill_value=fill_value, split=split)

    @classmethod
    def from_dtensor(cls, tensor_or_spec, **kwargs) -> "Layout":
        """The layout of a DTensor (e.g. a model's example input) or of its ``DTensorSpec``
        (``tensor._spec``): mesh and placements from it, ``split="chunk"`` (DTensor's ``Shard``);
        other arguments as :meth:`from_placements`. A PhysicsNeMo ``ShardTensor`` goes to
        :meth:`from_shard_tensor`."""
        if "split" in kwargs:
            raise LayoutError("from_dtensor: a DTensor is split by torch.chunk; for other sizes use "
                              "from_shard_tensor or from_placements(..., split=...)")
        spec = getattr(tensor_or_spec, "_spec", tensor_or_spec)
        if hasattr(spec, "sharding_shapes"):
            return cls.from_shard_tensor(tensor_or_spec, **kwargs)
        mesh = getattr(tensor_or_spec, "device_mesh", None)
        if mesh is None:
            mesh = getattr(spec, "mesh", None)
        placements = getattr(tensor_or_spec, "placements", None)
        if mesh is None or placements is None:
            raise LayoutError(f"from_dtensor needs a DTensor or DTensorSpec, got {type(tensor_or_spec).__name__}")
        if "ndim" not in kwargs:
            meta = getattr(spec, "tensor_meta", None)
            ndim = getattr(tensor_or_spec, "ndim", None)
            if ndim is None and meta is not None and getattr(meta, "shape", None) is not None:
                ndim = len(meta.shape)
            kwargs["ndim"] = ndim
        return cls.from_placements(mesh, placements, **kwargs)

    @classmethod
    def from_shard_tensor(cls, tensor, **kwargs) -> "Layout":
        """The layout of a PhysicsNeMo ``ShardTensor`` (or its ``ShardTensorSpec``): mesh,
        placements and ``sharding_shapes()`` (its documented API; gathering them may communicate
        once) become explicit sizes, or the rule they equal; see :meth:`from_sharding_shapes`."""
        spec = getattr(tensor, "_spec", tensor)
        if not hasattr(spec, "sharding_shapes"):
            raise LayoutError(f"from_shard_tensor needs a PhysicsNeMo ShardTensor or ShardTensorSpec, "
                              f"got {type(tensor).__name__}")
        shapes = spec.sharding_shapes()
        meta = getattr(spec, "tensor_meta", None)
        if "ndim" not in kwargs and getattr(meta, "shape", None) is not None:
            kwargs["ndim"] = len(meta.shape)  # resolves negative Shard dims
        return cls.from_sharding_shapes(spec.mesh, spec.placements, shapes, **kwargs)

    @classmethod
    def from_sharding_shapes(cls, mesh, placements: Sequence, sharding_shapes: Mapping[int, Sequence[Sequence[int]]],
                             *, batched: bool = True, **kwargs) -> "Layout":
        """A layout from PhysicsNeMo ``ShardTensor`` sharding shapes: ``{mesh dim index: (shape of
        each rank's shard along that mesh dim, ...)}``, as ``ShardTensorSpec.sharding_shapes()``
        gives them (a local shape per rank along the mesh dim, this rank's coordinate elsewhere).

        The sizes of each sharded tensor dim become explicit shard sizes; when the sizes of every
        sharded axis equal one named rule (``chunk`` first, then ``physicsnemo``, ``even``), the
        layout uses that rule, so that ``chunk`` keeps DTensor output. A batch dim (``Shard(0)``)
        must give every rank the same batch size. ``ShardTensor`` records one mesh dim per tensor
        dim: two mesh dims sharding one axis are refused here (give ``split`` sizes by hand).
        Other arguments as :meth:`from_placements`; ``split`` comes from the shapes.
        """
        if "split" in kwargs:
            raise LayoutError("from_sharding_shapes: the split comes from sharding_shapes; do not pass split")
        layout = cls.from_placements(mesh, placements, batched=batched, **kwargs)
        mesh = layout.mesh
        if not isinstance(sharding_shapes, Mapping):
            raise LayoutError(f"sharding_shapes must be a mapping {{mesh dim: shapes}}, got {sharding_shapes!r}")
        shapes_by_dim = {}
        for key, shapes in sharding_shapes.items():
            d = _mesh_dim(mesh, key, "sharding_shapes")
            shapes = [tuple(s) for s in shapes]
            if len(shapes) != mesh.shape[d]:
                raise LayoutError(f"sharding_shapes of mesh dim {mesh.names[d]!r} hold {len(shapes)} shapes "
                                  f"for {mesh.shape[d]} ranks")
            shapes_by_dim[d] = shapes
        offset = (1 + kwargs.get("lead_axes", 0)) if batched else 0
        # the batch axis: every sample group holds the same number of samples
        for d in layout._batch_dims:
            if d in shapes_by_dim:
                sizes = {s[0] for s in shapes_by_dim[d]}
                if len(sizes) > 1:
                    raise LayoutError(f"sharding_shapes of batch dim {mesh.names[d]!r} give the ranks batch "
                                      f"sizes {sorted(sizes)}: a loader gives every sample group the same")
        groups = _axis_groups(layout._shard, None)
        sizes_by_dim = {}
        for axis, dims in groups.items():
            if len(dims) > 1:
                raise LayoutError(
                    f"mesh dims {[mesh.names[d] for d in dims]} shard axis {axis} together: ShardTensor's "
                    "sharding_shapes describe one mesh dim per tensor dim; build the Layout with split= sizes "
                    "of the combined shards instead")
            (d,) = dims
            if d not in shapes_by_dim:
                raise LayoutError(f"sharding_shapes have no entry for mesh dim {mesh.names[d]!r}, which shards "
                                  f"axis {axis} ({placements[d]!r})")
            tensor_dim = axis + offset
            for s in shapes_by_dim[d]:
                if not -len(s) <= tensor_dim < len(s):
                    raise LayoutError(f"sharding shape {s} of mesh dim {mesh.names[d]!r} has no dim {tensor_dim}")
            sizes_by_dim[d] = tuple(s[tensor_dim] for s in shapes_by_dim[d])
        for d, sizes in sizes_by_dim.items():
            for s in sizes:
                if not _is_int(s) or s < 0:
                    raise LayoutError(f"sharding_shapes of mesh dim {mesh.names[d]!r}: size {s!r} is not a "
                                      "non-negative integer")
        split = {mesh.names[d]: [int(s) for s in sizes] for d, sizes in sizes_by_dim.items()}
        for rule in SPLITS:
            if all(tuple(split_sizes(sum(sizes), mesh.shape[d], rule)) == tuple(sizes)
                   for d, sizes in sizes_by_dim.items()):
                split = rule
                break
        return cls(mesh, shard=layout.shard_dims, batch=layout.batch_dims, crop=layout._crop, halo=layout._halo,
                   boundary=layout._boundary, fill_value=layout.fill_value, split=split if sizes_by_dim else "chunk")

    def __repr__(self) -> str:
        return (
            f"Layout(mesh={self.mesh}, shard={self.shard_dims}, batch={self.batch_dims}, "
            f"crop={self._crop}, halo={self._halo!r}, boundary={self._boundary!r}, "
            f"fill_value={self.fill_value!r}, "
            f"split={self.split_sizes if self._split_sizes is not None else self.split!r})"
        )


def _placement_kind(p, mesh_dim_name: str) -> tuple[str, int | None]:
    """``("shard", tensor dim)`` or ``("replicate", None)`` of a torch placement or of the plain data
    of ``Layout.placement_spec``; anything a loader cannot honour is refused, named."""
    if isinstance(p, tuple) and len(p) == 2 and p[0] in ("shard", "replicate"):
        kind, tensor_dim = p
        if kind == "replicate":
            return "replicate", None
        if not _is_int(tensor_dim):
            raise LayoutError(f"placement {p!r} of mesh dim {mesh_dim_name!r}: the tensor dim is not an integer")
        return "shard", int(tensor_dim)
    name = type(p).__name__
    if name == "_StridedShard" or hasattr(p, "split_factor"):
        raise LayoutError(f"placement {p!r} of mesh dim {mesh_dim_name!r} is a _StridedShard (an interleaved "
                          "shard order, as FSDP with tensor parallel makes): a loader cannot read it; use Shard(d)")
    if "Partial" in name or (hasattr(p, "is_partial") and p.is_partial()):
        raise LayoutError(f"placement {p!r} of mesh dim {mesh_dim_name!r} is Partial (a pending reduction, "
                          "not data): a loader yields data; use Shard(d) or Replicate()")
    if hasattr(p, "is_shard") and p.is_shard():
        return "shard", int(p.dim)
    if hasattr(p, "is_replicate") and p.is_replicate():
        return "replicate", None
    raise LayoutError(f"placement {p!r} of mesh dim {mesh_dim_name!r} is not Shard(d) or Replicate()")


def _check_shape(global_shape: Sequence[int]) -> tuple[int, ...]:
    if isinstance(global_shape, (str, bytes)) or not isinstance(global_shape, Iterable):
        raise LayoutError(f"sample shape {global_shape!r} is not a sequence of integers")
    global_shape = tuple(global_shape)
    for s in global_shape:
        if not _is_int(s):
            raise LayoutError(f"sample shape {global_shape!r} holds {s!r} ({type(s).__name__}): "
                              "sizes must be integers")
    shape = tuple(int(s) for s in global_shape)
    if not shape:
        raise LayoutError("sample shape is empty: a sample has at least one axis")
    if any(s <= 0 for s in shape):
        raise LayoutError(f"sample shape {shape} has a size <= 0: every axis needs at least one cell")
    return shape


# ---- sample order --------------------------------------------------------------------------------
_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_FEISTEL_ROUNDS = 10  # even, so the two halves end at their starting widths; 6 left small domains skewed


def _check_int(name: str, value, minimum: int | None = None, maximum: int | None = None) -> int:
    """``value`` as an int if it is a Python or numpy integer (not a bool) in ``[minimum, maximum)``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise LayoutError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    value = int(value)
    if minimum == 1 and value < 1:
        raise LayoutError(f"{name} must be a positive integer, got {value}")
    if minimum is not None and value < minimum:
        raise LayoutError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value >= maximum:
        raise LayoutError(f"{name} must be < {maximum}, got {value}")
    return value


def _check_bool(name: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise LayoutError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")
    return bool(value)


def _mix64(z: int) -> int:
    """splitmix64's finaliser: a bijection of 64-bit integers that mixes every bit into every bit."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _mix64_array(z: np.ndarray) -> np.ndarray:
    """:func:`_mix64` on a uint64 array (numpy's uint64 arithmetic wraps modulo 2**64)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


class SampleOrder:
    """The sample ids one sample group takes in one epoch, and which of them are padding, computed
    per index in O(1) time and memory (2**40 samples need no table).

    The permutation of ``range(num_samples)`` is a keyed bijection evaluated per position: a
    10-round Feistel network on the ``bits`` = max(2, ceil(log2(num_samples))) bit integers (two
    halves of ``bits // 2`` and ``bits - bits // 2`` bits, round function splitmix64 of the half plus
    a round key derived from ``(seed, epoch)``), with cycle walking: a value ``>= num_samples`` is
    encrypted again until it falls inside (fewer than 2 steps on average, as the power of two is
    less than twice ``num_samples``). The same on every rank and in every process; the identity
    without ``shuffle``.

    Group ``b`` of ``B`` (``batch_index``, ``num_batch_groups``) takes positions ``b, b + B, b + 2B, ...``
    of the permutation. Without ``drop_last`` the positions wrap around past the end so that every
    group gets the same whole number of batches; wrapped entries are flagged as padding and every
    sample appears each epoch. With ``drop_last`` each group keeps the whole batches of
    ``floor(N / B)`` samples. Every group has the same length, a multiple of ``batch_size``, so no
    rank takes fewer steps than another.

    ``order[i]`` is ``(sample_id, is_pad)``; :meth:`arrays` gives all of them as numpy arrays.
    (Before this class the permutation came from ``numpy.random.default_rng([seed, epoch])``:
    the properties are the same, the permutation values are not.)
    """

    __slots__ = ("num_samples", "epoch", "seed", "shuffle", "batch_size", "drop_last", "batch_index",
                 "num_batch_groups", "_length", "_bits", "_keys")

    def __init__(self, num_samples: int, epoch: int, *, seed: int = 0, shuffle: bool = True,
                 batch_size: int = 1, drop_last: bool = False, batch_index: int = 0,
                 num_batch_groups: int = 1) -> None:
        self.num_samples = _check_int("num_samples", num_samples, 1, 1 << 63)
        self.epoch = _check_int("epoch", epoch, 0, 1 << 64)
        self.seed = _check_int("seed", seed, 0, 1 << 64)
        self.shuffle = _check_bool("shuffle", shuffle)
        self.batch_size = _check_int("batch_size", batch_size, 1)
        self.drop_last = _check_bool("drop_last", drop_last)
        self.num_batch_groups = _check_int("num_batch_groups", num_batch_groups, 1)
        self.batch_index = _check_int("batch_index", batch_index, 0)
        if self.batch_index >= self.num_batch_groups:
            raise LayoutError(f"batch_index {self.batch_index} is out of range for "
                              f"{self.num_batch_groups} sample groups")
        n, k, bs = self.num_samples, self.num_batch_groups, self.batch_size
        if self.drop_last:
            self._length = (n // k) // bs * bs
        else:
            self._length = -(-(-(-n // k)) // bs) * bs
        self._bits = max(2, (n - 1).bit_length())
        base = _mix64(_mix64(self.seed ^ _GOLDEN) ^ _mix64((self.epoch + _GOLDEN) & _M64))
        self._keys = tuple(_mix64((base + r * _GOLDEN) & _M64) for r in range(_FEISTEL_ROUNDS))

    def __len__(self) -> int:
        return self._length

    def __repr__(self) -> str:
        return (f"SampleOrder(num_samples={self.num_samples}, epoch={self.epoch}, seed={self.seed}, "
                f"shuffle={self.shuffle}, batch_size={self.batch_size}, drop_last={self.drop_last}, "
                f"batch_index={self.batch_index}, num_batch_groups={self.num_batch_groups})")

    # ---- the permutation ------------------------------------------------------------------------
    def _encrypt(self, x: int) -> int:
        wr = self._bits // 2
        wl = self._bits - wr
        for key in self._keys:
            left, right = x >> wr, x & ((1 << wr) - 1)
            x = (right << wl) | (left ^ (_mix64((right + key) & _M64) & ((1 << wl) - 1)))
            wl, wr = wr, wl
        return x

    def _encrypt_array(self, x: np.ndarray) -> np.ndarray:
        wr = self._bits // 2
        wl = self._bits - wr
        for key in self._keys:
            left, right = x >> np.uint64(wr), x & np.uint64((1 << wr) - 1)
            f = _mix64_array(right + np.uint64(key)) & np.uint64((1 << wl) - 1)
            x = (right << np.uint64(wl)) | (left ^ f)
            wl, wr = wr, wl
        return x

    def permutation(self, position: int) -> int:
        """``perm[position]`` for ``0 <= position < num_samples``."""
        if isinstance(position, (bool, np.bool_)) or not isinstance(position, (int, np.integer)):
            raise TypeError(f"permutation position must be an integer, got {position!r}")
        position = int(position)
        if not 0 <= position < self.num_samples:
            # outside the domain the Feistel walk would never come back into range
            raise IndexError(f"permutation position {position} is out of range for {self.num_samples} samples")
        if not self.shuffle:
            return position
        x = self._encrypt(position)
        while x >= self.num_samples:  # cycle walking: stays in range(num_samples), still a bijection
            x = self._encrypt(x)
        return x

    def _permutation_array(self, positions: np.ndarray) -> np.ndarray:
        if not self.shuffle:
            return positions.astype(np.int64)
        x = self._encrypt_array(positions.astype(np.uint64))
        outside = np.flatnonzero(x >= np.uint64(self.num_samples))
        while outside.size:
            x[outside] = self._encrypt_array(x[outside])
            outside = outside[x[outside] >= np.uint64(self.num_samples)]
        return x.astype(np.int64)

    # ---- this group's share -------------------------------------------------------------------------
    def __getitem__(self, i: int) -> tuple[int, bool]:
        """``(sample_id, is_pad)`` of entry ``i`` (negative ``i`` counts from the end), in O(1)."""
        if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"SampleOrder index must be an integer, got {i!r} ({type(i).__name__})")
        i = int(i)
        if not -self._length <= i < self._length:
            raise IndexError(f"SampleOrder index {i} is out of range for {self._length} entries")
        if i < 0:
            i += self._length
        position = self.batch_index + self.num_batch_groups * i  # in the wrapped permutation
        return self.permutation(position % self.num_samples), position >= self.num_samples

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """All entries: ``(sample_ids, is_pad)``, int64 and bool arrays of ``len(self)`` entries."""
        positions = self.batch_index + self.num_batch_groups * np.arange(self._length, dtype=np.int64)
        ids = np.empty(self._length, dtype=np.int64)
        wrapped = positions % self.num_samples
        step = 1 << 16  # blocks that stay in cache: ~4x faster than one pass over a large epoch
        for i in range(0, self._length, step):
            ids[i:i + step] = self._permutation_array(wrapped[i:i + step])
        return ids, positions >= self.num_samples


def sample_order(
    num_samples: int,
    epoch: int,
    *,
    seed: int = 0,
    shuffle: bool = True,
    batch_size: int = 1,
    drop_last: bool = False,
    batch_index: int = 0,
    num_batch_groups: int = 1,
) -> tuple[np.ndarray, np.ndarray]:
    """The sample ids one sample group takes in one epoch, and which of them are padding:
    ``SampleOrder(...).arrays()`` (see :class:`SampleOrder` for the rules).

    Returns ``(sample_ids, is_pad)``: int64 and bool arrays of equal length, a multiple of
    ``batch_size``.
    """
    return SampleOrder(num_samples, epoch, seed=seed, shuffle=shuffle, batch_size=batch_size,
                       drop_last=drop_last, batch_index=batch_index,
                       num_batch_groups=num_batch_groups).arrays()
