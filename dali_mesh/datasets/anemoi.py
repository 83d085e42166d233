"""anemoi-datasets' Zarr layout (``anemoi.datasets.open_dataset``'s stores): one array ``data`` of
``(dates, variables, ensembles, cells)``, the grid flattened to cells (a reduced Gaussian, HEALPix or
ICON grid, or a regular one), usually chunked one date per chunk with the whole grid; ``dates``,
``latitudes`` and ``longitudes`` beside it; the variables' names in the group's attribute ``variables``
(or ``name_to_index``).

:class:`AnemoiDatasetSource` reads it as a :class:`~dali_mesh.ZarrSource` of ``data`` (one sample per
date: ``(variables, ensembles, cells)``), the variables chosen by name, the dates by ``start``/``end``,
and the cells either by the layout (a contiguous grid shard, as Anemoi shards its grid over its model's
ranks: ``Layout(mesh, shard={"grid": 2}, split="even")``) or by ``rows=`` (a graph partition's rows,
with its halo: :class:`~dali_mesh.partition.Rows` on axis 2). Only the cells' Blosc blocks are read
from a whole-grid chunk.
"""
from __future__ import annotations

import os

import numpy as np

from dali_mesh.io._common import DataFileError
from dali_mesh.partition import Layout
from dali_mesh.source import ZarrSource
from dali_mesh.storage import resolve_locations, store_of

__all__ = ["AnemoiDatasetSource", "anemoi_metadata"]

def anemoi_metadata(store) -> tuple[list[str], np.ndarray, tuple[int, ...]]:
    """``(variable names in data's order, dates, data's shape)`` of an anemoi-datasets store."""
    import zarr

    path = os.fspath(store)
    bytes_store, key = store_of(path)
    try:
        group = zarr.open_group(store=bytes_store.zarr_store(key), mode="r", use_consolidated=False)
        data = group["data"]
    except Exception as e:  # noqa: BLE001 - zarr raises many kinds for a folder that is no such group
        raise DataFileError(path, f"is not an anemoi-datasets store: no group with an array 'data' "
                                  f"({type(e).__name__}: {e})") from None
    if data.ndim != 4:
        raise DataFileError(path, f"'data' has shape {data.shape}: an anemoi-datasets store's is "
                                  "(dates, variables, ensembles, cells)")
    attrs = dict(group.attrs)
    names = attrs.get("variables")
    if names is None and isinstance(attrs.get("name_to_index"), dict):
        by_index = {int(i): n for n, i in attrs["name_to_index"].items()}
        names = [by_index.get(i) for i in range(data.shape[1])]
    if not isinstance(names, list) or len(names) != data.shape[1] or not all(isinstance(n, str) for n in names):
        raise DataFileError(path, f"its attributes name no variable list of {data.shape[1]} names ('variables' or "
                                  "'name_to_index')")
    try:
        dates = np.asarray(group["dates"][:]).astype("datetime64[s]")
    except KeyError:
        dates = np.arange(data.shape[0]).astype("datetime64[s]")  # no dates: steps by index
    if dates.shape != (data.shape[0],):
        raise DataFileError(path, f"'dates' has shape {dates.shape}, but 'data' has {data.shape[0]} dates")
    return list(names), dates, tuple(int(s) for s in data.shape)


def _instant(value, what: str) -> np.datetime64:
    """``start``/``end`` as an instant: a full date and time (``"2020-01-01T06:00:00"``, a
    ``numpy.datetime64`` or ``datetime``). A date alone or a year means a whole period to ``open_dataset``
    (its first or last date), which is refused here rather than read as midnight or as seconds."""
    import datetime

    if isinstance(value, (datetime.datetime, np.datetime64)):
        t = np.datetime64(value, "s")
    elif isinstance(value, str) and ("T" in value or " " in value.strip()):
        t = np.datetime64(value.strip().replace(" ", "T"), "s")
    else:
        raise ValueError(f"{what}={value!r}: give a full date and time (e.g. '2020-01-01T06:00:00'); a date "
                         "alone or a year means a whole period to open_dataset, which this source does not read")
    if np.isnat(t):
        raise ValueError(f"{what}={value!r} is not a date and time")
    return t


class AnemoiDatasetSource(ZarrSource):
    """This rank's window of every date of an anemoi-datasets store (see the module).

    Args:
        store: the store's folder or URL.
        layout: the layout of a sample ``(variables, ensembles, cells)``: shard axis 2 for grid shards,
            or give ``rows``.
        variables: names to read, in this order (default: all, in the store's order).
        start, end: the first and last date read, inclusive, as full dates and times (a string
            ``"2020-01-01T06:00:00"``, a ``numpy.datetime64`` or ``datetime``; ``open_dataset`` also takes a
            date alone or a year as a whole period, which is refused here).
        rows: a :class:`~dali_mesh.partition.Rows` of cells (its axis must be 2, or -1), or with ``share=``
            every read group member's (``{coordinate: Rows}``).
        batch_size, shuffle, seed, drop_last, forecast, time_stride, reuse_buffers, share,
            storage_options: as :class:`~dali_mesh.ZarrSource`.
    """

    fingerprint_fields = ZarrSource.fingerprint_fields + ("variables",)

    def __init__(self, store, layout: Layout, *, variables=None, start=None, end=None, rows=None,
                 storage_options: dict | None = None, **kw) -> None:
        location = resolve_locations([store], storage_options)[0]
        names, dates, shape = anemoi_metadata(location)
        if variables is None:
            variables = list(names)
        elif isinstance(variables, str):
            variables = [variables]
        unknown = [v for v in variables if v not in names]
        if unknown:
            raise DataFileError(os.fspath(store), f"has no variable {unknown[0]!r} (it has {', '.join(names)})")
        for r in (rows.values() if isinstance(rows, dict) else [rows] if rows is not None else []):
            if getattr(r, "axis", None) not in (2, -1):
                raise ValueError(f"rows index the cells, axis 2 of a sample (variables, ensembles, cells), "
                                 f"not axis {getattr(r, 'axis', None)!r}")
        lo = 0 if start is None else int(np.searchsorted(dates, _instant(start, "start"), side="left"))
        hi = len(dates) if end is None else int(np.searchsorted(dates, _instant(end, "end"), side="right"))
        if hi <= lo:
            raise DataFileError(os.fspath(store), f"holds no date from {start} to {end} (its dates run from "
                                                  f"{dates[0]} to {dates[-1]})")
        self.variables = tuple(variables)
        self.dates = dates[lo:hi]
        super().__init__([location], "data", layout, channels=[names.index(v) for v in variables], channel_axis=0,
                         time_range=(lo, hi), rows=rows, **kw)
