"""Checks of the arguments the sources share."""
from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np

from dali_mesh._checks import is_int as _is_int
from dali_mesh.io._common import normalise_index_maps

__all__ = ["channel_maps", "check_group_rows", "check_sample_shape", "file_list", "normalise_maps", "resolve_rows",
           "with_rows"]


def channel_maps(channels, channel_axis):
    if channels is None:
        return None
    if not _is_int(channel_axis):
        raise ValueError(f"channel_axis must be an integer, got {channel_axis!r}")
    values = [channels] if _is_int(channels) else channels
    try:
        values = list(np.asarray(values, dtype=object).reshape(-1))
    except (TypeError, ValueError):
        raise ValueError(f"channels must be a sequence of integers, got {channels!r}") from None
    bad = [v for v in values if not _is_int(v)]
    if bad:
        raise ValueError(f"channels must be integers, got {bad[0]!r} in {channels!r}")
    ch = np.asarray([int(v) for v in values], dtype=np.int64)
    if ch.size == 0:
        raise ValueError("channels is empty: give at least one channel index, or None for all")
    return {int(channel_axis): ch}


def check_sample_shape(shape, what: str = "sample_shape") -> tuple[int, ...]:
    """``shape`` as a tuple of ints: integers (numpy's too) > 0 only; ``8.5``, ``True`` or strings are
    refused (they would silently become 8 or 1)."""
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
        raise ValueError(f"{what} must be a sequence of positive integers, got {shape!r}")
    shape = tuple(shape)
    bad = [s for s in shape if not _is_int(s) or s <= 0]
    if bad or not shape:
        raise ValueError(f"{what} must be a non-empty sequence of positive integers, got {shape!r}"
                         + (f" ({bad[0]!r} is not one)" if bad else ""))
    return tuple(int(s) for s in shape)


def file_list(files, who: str, kind: str) -> list[str]:
    if isinstance(files, (str, bytes, os.PathLike)):  # one path would otherwise be read as its letters
        raise TypeError(f"{who} takes a list of {kind}s, got one path {os.fspath(files)!r}: pass [path]")
    out = [os.fspath(f) for f in files]
    if not out:
        raise ValueError(f"{who} needs at least one {kind}")
    return out


def normalise_maps(maps, shape, path):
    """``maps`` keyed by non-negative axes of a sample of ``shape`` (``channel_axis=-1`` is the last
    axis): the readers' plans look maps up by non-negative axis, so a negative key must be resolved
    once, where the sample's number of axes is known."""
    if not maps:
        return maps
    return normalise_index_maps(maps, len(shape), path)


def resolve_rows(rows, layout, share_dims=()):
    """``(this rank's Rows, the rows of its read group's members or None)`` of a source's ``rows=``: a
    :class:`~dali_mesh.partition.Rows` (this rank's), or a mapping of mesh coordinates to ``Rows`` (this
    rank's and, with ``share=``, every member of its read group: the group reads the union of its
    members' rows once and each member gets its own, in its order). Only the group's entries are kept
    (a source goes to DALI's workers by pickle)."""
    if rows is None:
        return None, None
    from dali_mesh.partition import LayoutError, Rows
    from dali_mesh.partition.read_groups import group_coordinates

    if isinstance(rows, Rows):
        return rows, None
    if not isinstance(rows, Mapping):
        raise TypeError(f"rows must be a dali_mesh.partition.Rows or a mapping of mesh coordinates to Rows, "
                        f"got {type(rows).__name__}")
    table = {}
    for c, r in rows.items():
        if _is_int(c):
            key = (int(c),)
        elif isinstance(c, tuple) and c and all(_is_int(x) for x in c):
            key = tuple(int(x) for x in c)
        else:
            raise TypeError(f"rows' keys must be mesh coordinates (tuples of integers), got {c!r}")
        if key in table:
            raise LayoutError(f"rows names mesh coordinate {key} twice (as {c!r} and another key)")
        if not isinstance(r, Rows):
            raise TypeError(f"rows[{c!r}] must be a dali_mesh.partition.Rows, got {type(r).__name__}")
        table[key] = r
    me = tuple(layout.mesh.coordinate)
    if me not in table:
        named = sorted(table)
        raise LayoutError(f"rows names no Rows for this rank's coordinate {me} (it names {len(named)}: "
                          f"{', '.join(map(str, named[:4]))}{', ...' if len(named) > 4 else ''})")
    own = table[me]
    members = group_coordinates(layout, share_dims) if share_dims else [me]
    missing = [c for c in members if c not in table]
    if missing:
        raise LayoutError(f"rows names no Rows for read group member {missing[0]}: with share= give the rows of "
                          f"every member of this rank's group ({members})")
    if len({table[c].total for c in members}) != 1:
        raise LayoutError("the rows of a read group's members were partitioned from arrays of different lengths")
    return own, ({c: table[c] for c in members} if share_dims else None)


def check_group_rows(maps, rows, group_rows, layout, shape, path) -> None:
    """Every member's rows of a read group (``group_rows``) fit the array and index the axis ``rows``
    (this rank's) does, counted alike (``axis=-1`` and ``axis=1`` of a 2-d sample are one axis)."""
    if not group_rows:
        return
    from dali_mesh.partition import LayoutError

    axis = rows.normalized(len(shape)).axis
    for c, member in group_rows.items():
        if member.normalized(len(shape)).axis != axis:
            raise LayoutError(f"the rows of read group member {c} index axis {member.axis}, this rank's axis "
                              f"{rows.axis}: every member's rows must index one axis")
        with_rows(maps, member, layout, shape, path)


def group_row_ids(group_rows) -> np.ndarray:
    """The rows a read group reads for all of its members: the union of their ids, in id order."""
    return np.unique(np.concatenate([r.ids for r in group_rows.values()]))


def with_rows(maps, rows, layout, shape, path):
    """``maps`` (normalised, for a sample of ``shape``) with ``rows``' ids on their axis: an index-set
    window (:class:`~dali_mesh.partition.Rows`) is an index map that differs per rank. The rows' axis may
    hold no channel subset, no shard of ``layout`` and no halo (the rows name their halo themselves).
    In a read group (``share=``) given only this rank's rows, every member must read the same rows (the
    group's window is then each member's; members with other rows raise at the first group step, naming
    the field: ``GroupExchange.agree`` compares the sources' fingerprints, which hold the rows' digest);
    given every member's (:func:`resolve_rows`), the group reads their union."""
    if rows is None:
        return maps
    from dali_mesh.partition import LayoutError, Rows

    if not isinstance(rows, Rows):
        raise TypeError(f"rows must be a dali_mesh.partition.Rows, got {type(rows).__name__}")
    ndim = len(shape)
    rows = rows.normalized(ndim)
    a = rows.axis
    if maps and a in maps:
        raise LayoutError(f"rows and channels both index sample axis {a}: give the rows' ids only")
    if a in layout.shard_axes(ndim):
        raise LayoutError(f"the layout shards sample axis {a}, which rows= indexes: a rank's rows are its "
                          "share of that axis (shard it on no mesh dim)")
    mapped = tuple(len(rows.ids) if i == a else len((maps or {}).get(i, range(n))) for i, n in enumerate(shape))
    crop = layout.domain(mapped)  # the crop is of the sample as read (channels and rows picked)
    if (crop[0][a], crop[1][a]) != (0, mapped[a]):
        raise LayoutError(f"the layout crops sample axis {a}, which rows= indexes: choose the rows by their ids")
    if layout.halo_pairs(ndim)[a] != (0, 0):
        raise LayoutError(f"the layout gives sample axis {a} a halo of {layout.halo_pairs(ndim)[a]}, which rows= "
                          "indexes: a rank's halo rows are part of its rows (Rows.from_assignment(halo=))")
    if rows.total is not None and rows.total != shape[a]:
        raise LayoutError(f"{path}: the rows were partitioned from {rows.total} rows (a mapping or graph of that "
                          f"length), but axis {a} of the array has {shape[a]}")
    if int(rows.ids.max()) >= shape[a]:
        i = int(np.argmax(rows.ids >= shape[a]))
        raise LayoutError(f"{path}: row id {int(rows.ids[i])} (position {i} of rows) is out of range for axis {a} "
                          f"of {shape[a]} rows")
    return {**(maps or {}), a: rows.ids}
