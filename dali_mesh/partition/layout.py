"""``Layout``: how one sample is split over a mesh (shard, batch and replica dims, crop, halo,
boundary, split), its argument checks, the region of every rank (the math:
:func:`~dali_mesh.partition.region.region_bounds`) and its DTensor / ShardTensor placements, both ways
(the math: :mod:`dali_mesh.partition.placements`, which knows nothing of ``Layout``)."""
from __future__ import annotations

import itertools
import math
from typing import Any, Mapping, Sequence

import numpy as np

from dali_mesh._checks import is_int as _is_int
from dali_mesh.mesh import MeshInfo
from dali_mesh.partition.checks import (LayoutError, _check_int, _check_shape, _mesh_dim,
                                        _normalize_axis)
from dali_mesh.partition.order import SampleOrder
from dali_mesh.partition.placements import (check_dtensor_split, dtensor_parts, is_shard_tensor, mesh_info,
                                            placement_spec, shard_and_batch, shard_tensor_parts,
                                            split_of_sharding_shapes, torch_placements)
from dali_mesh.partition.region import Region, region_bounds
from dali_mesh.partition.rules import (BOUNDARIES, SPLIT_ALIASES, SPLITS, _axis_groups, _check_boundary,
                                       _check_split, _nested_sizes)


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
    # which mesh dims share an axis is known here only when the axes are all counted one way: -1 and
    # 0 are one axis of a 1-d sample and two of a 2-d one, so mixed signs are checked by region()
    if len({a < 0 for _, a in shard}) <= 1:
        _check_explicit_groups(out, mesh, shard, None)
    return out



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


def _parse_shard(mesh: MeshInfo, shard) -> tuple[tuple[int, int], ...]:
    """``shard`` as ``((mesh dim index, sample axis), ...)`` in mesh-dim order (outer first)."""
    if shard is not None and not isinstance(shard, Mapping):
        raise LayoutError(f"shard must be a mapping {{mesh dim: sample axis}}, got {shard!r}")
    by_dim: dict[int, int] = {}
    for name, axis in dict(shard or {}).items():
        d = _mesh_dim(mesh, name, "shard")
        if d in by_dim:
            raise LayoutError(f"shard: mesh dim {mesh.names[d]!r} is used twice")
        if not _is_int(axis):
            raise LayoutError(f"shard: axis {axis!r} of mesh dim {mesh.names[d]!r} is not an integer")
        by_dim[d] = int(axis)
    return tuple(sorted(by_dim.items()))


def _parse_split(split, mesh: MeshInfo, shard: Sequence[tuple[int, int]]) -> tuple[str, dict | None, dict | None]:
    """``(rule, explicit sizes, their prefix sums)``: a rule name with ``None, None``, or ``"explicit"``
    with the sizes per mesh dim index and their prefix sums (O(1) offsets per rank)."""
    if isinstance(split, Mapping):
        sizes = _check_explicit_split(split, mesh, shard)
        return "explicit", sizes, {d: tuple(itertools.accumulate(s, initial=0)) for d, s in sizes.items()}
    if isinstance(split, str):
        split = SPLIT_ALIASES.get(split, split)
        _check_split(split)
        return split, None, None
    raise LayoutError(f"split must be a rule ({', '.join(SPLITS)}) or {{mesh dim: [sizes...]}}, got {split!r}")


def _parse_batch(batch, mesh: MeshInfo, shard: Sequence[tuple[int, int]]) -> tuple[int, ...]:
    """The batch dims' indices, sorted: as given, or the one mesh dim that shards nothing."""
    by_dim = dict(shard)
    if batch is None:
        free = [d for d in range(mesh.ndim) if d not in by_dim]
        if len(free) > 1:
            names = [mesh.names[d] for d in free]
            raise LayoutError(
                f"batch is required: mesh dims {names} shard no axis, so say which of them split "
                f"the dataset (e.g. batch={names[0]!r}); the others are replicas"
            )
        return tuple(free)
    names = [batch] if isinstance(batch, (str, int, np.integer)) else list(batch)
    batch_dims: list[int] = []
    for name in names:
        d = _mesh_dim(mesh, name, "batch")
        if d in by_dim:
            raise LayoutError(f"mesh dim {mesh.names[d]!r} is used twice: in shard and in batch")
        if d in batch_dims:
            raise LayoutError(f"batch: mesh dim {mesh.names[d]!r} is used twice")
        batch_dims.append(d)
    return tuple(sorted(batch_dims))


def _check_coordinate(mesh: MeshInfo, coordinate) -> tuple[int, ...]:
    coordinate = tuple(coordinate)
    if len(coordinate) != mesh.ndim or any(not _is_int(c) or not 0 <= c < s for c, s in zip(coordinate, mesh.shape)):
        raise LayoutError(f"coordinate {coordinate} is out of range for mesh shape {mesh.shape}: "
                          "one integer per mesh dim, 0 <= c < size")
    return tuple(int(c) for c in coordinate)


def _crop_box(crop_key, crop, shape: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(domain_start, domain_stop)`` of a crop (normalised as ``_normalize_crop``; ``crop``: as given,
    for messages) on samples of ``shape``."""
    if crop_key is None:
        return (0,) * len(shape), shape
    if len(crop_key) != len(shape):
        raise LayoutError(f"crop {crop!r} has {len(crop_key)} entries for a sample of shape {shape}")
    lo, hi = [], []
    for a, ((s, e), n) in enumerate(zip(crop_key, shape)):
        e = n if e is None else e
        if not (0 <= s < e <= n):
            raise LayoutError(f"crop {s}:{e} of axis {a} lies outside the sample (axis size {n}) or is empty")
        lo.append(s)
        hi.append(e)
    return tuple(lo), tuple(hi)


def _keyed_by_axis(value, ndim: int, what: str):
    """``value`` (a halo or boundary) with the axes of an ``{axis: ...}`` mapping counted from 0."""
    if not isinstance(value, Mapping):
        return value
    out = {}
    for axis, v in value.items():
        a = _normalize_axis(axis, ndim, what)
        if a in out:
            raise LayoutError(f"{what}: axis {axis} is given twice (as {a} and {a - ndim})")
        out[a] = v
    return out


def _rule_sizes(mesh: MeshInfo, shard: Sequence[tuple[int, int]], domain, rule: str) -> dict[str, list[int]]:
    """Per sharded axis of the ``(start, stop)`` domain, keyed by its innermost mesh dim's name:
    ``rule``'s sizes of its combined shards (row-major over the nested mesh dims)."""
    d0, d1 = domain
    return {mesh.names[dims[-1]]: _nested_sizes(d1[a] - d0[a], [mesh.shape[d] for d in dims], rule)
            for a, dims in _axis_groups(shard, len(d0)).items()}


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
        split: a rule, ``chunk`` (torch.chunk, DTensor; alias ``"dtensor"``), ``physicsnemo``
            (``compute_split_shapes``, what ShardTensor makes itself; alias ``"shard_tensor"``) or
            ``even`` (numpy array_split), or explicit shard sizes ``{mesh dim: [sizes...]}``: one list for every
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

        self._shard = _parse_shard(mesh, shard)  # ((mesh_dim, axis), ...) in mesh-dim order (outer first)
        # split: a rule name, or explicit sizes with their prefix sums (O(1) offsets per rank)
        self.split, self._split_sizes, self._split_prefix = _parse_split(split, mesh, self._shard)
        self._batch_dims = _parse_batch(batch, mesh, self._shard)

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
        return Layout(self.mesh, shard=shard, batch=self.batch_dims, crop=self._crop,
                      halo=_keyed_by_axis(self._halo, ndim, "halo"),
                      boundary=_keyed_by_axis(self._boundary, ndim, "boundary"),
                      fill_value=self.fill_value, split=self.split_sizes if self._split_sizes is not None else self.split)

    def without_axis(self, axis: int, ndim: int) -> "Layout":
        """This layout for samples of ``ndim - 1`` axes that are these samples less ``axis`` (a
        variable without a level axis beside variables with one, say): the same regions on the other
        axes. Refused (``LayoutError``) when ``axis`` is sharded, has a halo or is cropped."""
        n = self.normalized(ndim)
        axis = _normalize_axis(axis, ndim, "axis")
        by = [n.mesh.names[d] for d, a in n._shard if a == axis]
        if by:
            raise LayoutError(f"axis {axis} is sharded by mesh dim {by[0]!r}: it cannot be dropped")
        halo = n.halo_pairs(ndim)
        if halo[axis] != (0, 0):
            raise LayoutError(f"axis {axis} has a halo {halo[axis]}: it cannot be dropped")
        crop = None if n._crop is None else list(n._crop)
        if crop is not None and len(crop) > axis and crop[axis] not in (None, slice(None)):
            raise LayoutError(f"axis {axis} is cropped ({crop[axis]!r}): it cannot be dropped")
        keep = [a for a in range(ndim) if a != axis]
        new = {a: i for i, a in enumerate(keep)}
        return Layout(n.mesh, shard={n.mesh.names[d]: new[a] for d, a in n._shard}, batch=n.batch_dims,
                      crop=None if crop is None else [crop[a] if a < len(crop) else None for a in keep],
                      halo={i: halo[a] for i, a in enumerate(keep)},
                      boundary={new[a]: b for a, b in enumerate(n.boundaries(ndim)) if a != axis},
                      fill_value=n.fill_value, split=n.split_sizes if n._split_sizes is not None else n.split)

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
        want = _rule_sizes(self.mesh, self._shard, self.domain(global_shape), rule)
        return all(tuple(sizes) == self._split_sizes[self.mesh.names.index(name)] for name, sizes in want.items())

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
        return _crop_box(self._crop_key, self._crop, _check_shape(global_shape))

    # ---- regions ------------------------------------------------------------------------------------
    def region(self, global_shape: Sequence[int], coordinate: Sequence[int] | None = None) -> Region:
        """The region of the rank at ``coordinate`` (this rank by default). O(ndim), whatever the
        mesh size (explicit sizes: offsets from prefix sums made once); the math is
        :func:`~dali_mesh.partition.region.region_bounds`."""
        shape = _check_shape(global_shape)
        ndim = len(shape)
        coordinate = self.mesh.coordinate if coordinate is None else _check_coordinate(self.mesh, coordinate)
        d0, d1 = self.domain(shape)
        halo, boundary = self.halo_pairs(ndim), self.boundaries(ndim)
        groups = _axis_groups(self._shard, ndim)
        if self._split_sizes is not None:
            _check_explicit_groups(self._split_sizes, self.mesh, self._shard, ndim)
            for axis, dims in groups.items():
                total = self._split_prefix[dims[-1]][-1]
                if total != d1[axis] - d0[axis]:
                    raise LayoutError(
                        f"split sizes {list(self._split_sizes[dims[-1]])} of mesh dim {self.mesh.names[dims[-1]]!r} "
                        f"sum to {total} but axis {axis} has {d1[axis] - d0[axis]} cells"
                        + (" (its crop)" if self._crop_key is not None else "") + ": the sizes must tile the axis")
        bounds = region_bounds(d0, d1, self.mesh.shape, coordinate, groups, self.split, self._split_prefix, halo,
                               boundary)
        return Region(d0, d1, *bounds, boundary, self.fill_value)

    def regions(self, global_shape: Sequence[int]) -> list[Region]:
        """The region of every rank, in rank order."""
        return [self.region(global_shape, c) for c in self.mesh.coordinates()]

    # ---- DTensor / ShardTensor placements (the math: dali_mesh.partition.placements) -----------------
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
        if not any_split:
            check_dtensor_split(self.split, self.split_sizes, global_shape, None if global_shape is None else
                                _rule_sizes(self.mesh, self._shard, self.domain(global_shape), "chunk"))
        if not halo_stripped and any(lo or hi for lo, hi in self.halo_pairs(ndim)):
            raise LayoutError("no DTensor for a window with halo: strip the halo first (region.owned_in_window) "
                              "or use the local tensor and its region")
        return placement_spec(self.mesh.ndim, self._batch_dims, self.shard_axes(ndim), lead_axes)

    def dtensor_placements(self, ndim: int, **kwargs):
        """torch DTensor placements of the batched tensor (imports torch); arguments as
        :meth:`placement_spec`."""
        return torch_placements(self.placement_spec(ndim, **kwargs))

    def sharding_shapes(self, global_shape: Sequence[int], batch_size: int | None = None
                        ) -> dict[int, tuple[tuple[int, ...], ...]]:
        """For ``ShardTensor.from_local(..., sharding_shapes=...)``: per mesh dim that shards an axis,
        the owned shapes of the ranks along that mesh dim (this rank's coordinate elsewhere). With
        ``batch_size`` the shapes are of the batched tensor ``(batch_size, *shape)``."""
        out = {}
        for d, axis in enumerate(self.shard_axes(len(_check_shape(global_shape)))):
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
        mesh = mesh_info(mesh)
        shard, batch = shard_and_batch(mesh, placements, batched=batched, ndim=ndim, lead_axes=lead_axes, batch=batch)
        return cls(mesh, shard=shard, batch=batch, crop=crop, halo=halo, boundary=boundary, fill_value=fill_value,
                   split=split)

    @classmethod
    def from_dtensor(cls, tensor_or_spec, **kwargs) -> "Layout":
        """The layout of a DTensor (e.g. a model's example input) or of its ``DTensorSpec``
        (``tensor._spec``): mesh and placements from it, ``split="chunk"`` (DTensor's ``Shard``);
        other arguments as :meth:`from_placements`. A PhysicsNeMo ``ShardTensor`` goes to
        :meth:`from_shard_tensor`."""
        if "split" in kwargs:
            raise LayoutError("from_dtensor: a DTensor is split by torch.chunk; for other sizes use "
                              "from_shard_tensor or from_placements(..., split=...)")
        if is_shard_tensor(tensor_or_spec):
            return cls.from_shard_tensor(tensor_or_spec, **kwargs)
        mesh, placements, ndim = dtensor_parts(tensor_or_spec)
        kwargs.setdefault("ndim", ndim)
        return cls.from_placements(mesh, placements, **kwargs)

    @classmethod
    def from_shard_tensor(cls, tensor, **kwargs) -> "Layout":
        """The layout of a PhysicsNeMo ``ShardTensor`` (or its ``ShardTensorSpec``): mesh,
        placements and ``sharding_shapes()`` (its documented API; gathering them may communicate
        once) become explicit sizes, or the rule they equal; see :meth:`from_sharding_shapes`."""
        mesh, placements, shapes, ndim = shard_tensor_parts(tensor)
        if ndim is not None:
            kwargs.setdefault("ndim", ndim)  # resolves negative Shard dims
        return cls.from_sharding_shapes(mesh, placements, shapes, **kwargs)

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
        offset = (1 + kwargs.get("lead_axes", 0)) if batched else 0
        split = split_of_sharding_shapes(layout.mesh, placements, sharding_shapes, layout._shard,
                                         layout._batch_dims, offset)
        return cls(layout.mesh, shard=layout.shard_dims, batch=layout.batch_dims, crop=layout._crop,
                   halo=layout._halo, boundary=layout._boundary, fill_value=layout.fill_value, split=split)

    def __repr__(self) -> str:
        return f"Layout(mesh={self.mesh}, {self._rules()})"

    def _rules(self) -> str:
        return (f"shard={self.shard_dims}, batch={self.batch_dims}, crop={self._crop}, halo={self._halo!r}, "
                f"boundary={self._boundary!r}, fill_value={self.fill_value!r}, "
                f"split={self.split_sizes if self._split_sizes is not None else self.split!r}")

    def describe_rules(self) -> str:
        """The layout as every rank of its mesh has it: the mesh's dims and sizes and the rules
        (shard, batch, crop, halo, boundary, fill value, split), not this rank's coordinate. Ranks
        that read together (a read group) must have the same."""
        dims = ", ".join(f"{n}={s}" for n, s in zip(self.mesh.names, self.mesh.shape))
        return f"Layout(mesh=({dims}), {self._rules()})"

