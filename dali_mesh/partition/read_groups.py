"""Read once per group (``share``): the ranks that read the same samples split each epoch's batches
between them; each reads its batches' *group window* (the box every member's window lies in) and the
members' windows are cut from it and exchanged (``dali_mesh.torch.group_exchange``).

The group of a rank is the ranks whose coordinates differ from its own only along the share dims
(mesh dims that do not split the batch: sharding dims, where the members' windows differ, and
replica dims, where they are the same). Batch ``b`` of an epoch is read by member ``b mod G``
(members in row-major order over the share dims), so the assignment is the same on every rank and
follows from the stateless sample order alone. A member's window is a box of the group window:
both apply the same boundary rule to the same sample index, so the cut is exact (halo cells and
boundary fills included).

What a rank's pipeline reads is a *reads* value: :class:`OwnReads` (its own window, its sample group's
order: every source by default) or :class:`GroupReads` (the group window, this member's batches: a
source's ``group_reader()``). Both are small frozen values carrying their own math, applied to the
layout of the source that holds them, so the variables of a dataset source (each with its own layout)
read with the same value as the dataset.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Sequence

from dali_mesh.partition.checks import LayoutError
from dali_mesh.partition.order import GroupOrder, SampleOrder
from dali_mesh.partition.region import Region

__all__ = ["share_dims", "group_coordinates", "group_region", "group_cut", "OwnReads", "GroupReads"]


def share_dims(layout, share) -> tuple[str, ...]:
    """The mesh dims (names) a group spans: ``share="group"`` every dim that does not split the batch
    (sharding and replica dims), or the names given (a subset of those, e.g. the dims within one
    node); ``None``: none (every rank reads its own window)."""
    if share is None:
        return ()
    free = [n for n in layout.mesh.names if n not in layout.batch_dims]
    if isinstance(share, str):
        if share != "group":
            raise ValueError(f"share must be None, 'group' or a list of mesh dim names, got {share!r}")
        dims = free
    else:
        dims = list(share)
        for d in dims:
            if d not in layout.mesh.names:
                raise LayoutError(f"share names mesh dim {d!r}; the mesh has {layout.mesh.names}")
            if d in layout.batch_dims:
                raise LayoutError(f"share names mesh dim {d!r}, which splits the batch: its ranks read other "
                                  "samples, so they have nothing to share")
        if len(set(dims)) != len(dims):
            raise ValueError(f"share names a mesh dim twice: {share!r}")
    dims = [d for d in layout.mesh.names if d in dims]  # mesh order
    if math.prod(layout.mesh.shape[layout.mesh.names.index(d)] for d in dims) == 1:
        return ()  # a group of one rank: nothing to share
    return tuple(dims)


def group_coordinates(layout, dims: Sequence[str]) -> list[tuple[int, ...]]:
    """The coordinates of this rank's group (row-major over ``dims``, the others this rank's)."""
    idx = [layout.mesh.names.index(d) for d in dims]
    out = []
    for combo in itertools.product(*(range(layout.mesh.shape[d]) for d in idx)):
        c = list(layout.mesh.coordinate)
        for d, v in zip(idx, combo):
            c[d] = v
        out.append(tuple(c))
    return out


def group_index(layout, dims: Sequence[str]) -> int:
    """This rank's index in its group."""
    return group_coordinates(layout, dims).index(tuple(layout.mesh.coordinate))


def group_region(layout, shape: Sequence[int], dims: Sequence[str]) -> Region:
    """The group window: the smallest box holding every member's window (members with an empty window
    aside), with the layout's domain, boundary rules and fill value."""
    regions = [layout.region(shape, c) for c in group_coordinates(layout, dims)]
    full = [r for r in regions if r.size > 0] or [layout.region(shape)]
    first = full[0]
    lo = tuple(min(r.window_start[a] for r in full) for a in range(first.ndim))
    hi = tuple(max(r.window_stop[a] for r in full) for a in range(first.ndim))
    start = tuple(min(r.start[a] for r in full) for a in range(first.ndim))
    stop = tuple(max(r.stop[a] for r in full) for a in range(first.ndim))
    return Region(first.domain_start, first.domain_stop, start, stop, lo, hi, first.boundary, first.fill_value)


def group_cut(group: Region, member: Region) -> tuple[slice, ...] | None:
    """The slices of the group window that are ``member``'s window (``None`` for an empty window)."""
    if member.size == 0:
        return None
    out = []
    for a in range(group.ndim):
        o = member.window_start[a] - group.window_start[a]
        n = member.window_stop[a] - member.window_start[a]
        if o < 0 or o + n > group.window_stop[a] - group.window_start[a]:
            raise LayoutError(f"the window of {member} is not inside the group window {group}")
        out.append(slice(o, o + n))
    return tuple(out)


@dataclass(frozen=True)
class OwnReads:
    """Every rank reads its own window of its sample group's order (no ``share``)."""

    def region_of(self, layout, shape: Sequence[int]) -> Region:
        return layout.region(tuple(shape))

    def order_of(self, layout, order: SampleOrder):
        return order


@dataclass(frozen=True)
class GroupReads:
    """A member of the read group over mesh dims ``dims`` reads the group window
    (:func:`group_region`) of its batches of the sample group's order (:class:`GroupOrder`: batches
    ``index, index + size, ...``)."""

    dims: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "dims", tuple(self.dims))  # a list of names compares equal to the tuple

    def region_of(self, layout, shape: Sequence[int]) -> Region:
        return group_region(layout, tuple(shape), self.dims)

    def order_of(self, layout, order: SampleOrder) -> GroupOrder:
        members = group_coordinates(layout, self.dims)
        return GroupOrder(order, order.batch_size, len(members), members.index(tuple(layout.mesh.coordinate)))
