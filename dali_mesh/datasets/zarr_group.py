"""Datasets as xarray writes them to Zarr (WeatherBench2, ARCO-ERA5): a group of variables, arrays whose
dims are named in their metadata (``_ARRAY_DIMENSIONS`` in v2, ``dimension_names`` in v3), beside 1-D
coordinate arrays (``time``, ``level``, ``latitude``, ``longitude``). Each variable is read by its own
:class:`~dali_mesh.ZarrSource`."""
from __future__ import annotations

import base64
import os

import numpy as np

from dali_mesh.datasets.variables import DatasetFormat, Variable, register_dataset_format
from dali_mesh.io._common import DataFileError
from dali_mesh.partition import Layout
from dali_mesh.source import ZarrSource
from dali_mesh.storage import resolve_locations, store_of

__all__ = ["ZarrGroup", "open_dataset_group", "read_coordinate"]


@register_dataset_format
class ZarrGroup(DatasetFormat):
    """An xarray-written Zarr group (v2 or v3, as ``xarray.Dataset.to_zarr`` writes it): ``locations``
    is the group's folder or URL."""

    name = "zarr_group"
    label = "ZarrDatasetSource"

    def __init__(self, locations, storage_options: dict | None = None, time_dim: str = "time") -> None:
        super().__init__(locations, storage_options, time_dim)
        if not isinstance(locations, (str, bytes, os.PathLike)):
            raise TypeError(f"{self.label} reads one Zarr group (a folder or URL), got {type(locations).__name__}")
        self.store = os.fspath(resolve_locations([locations], storage_options)[0])
        self.files = [self.store]
        self.variables = open_dataset_group(self.store)

    def coordinate(self, name: str) -> np.ndarray:
        return read_coordinate(self.store, name)

    def array_source(self, variable: str, layout: Layout, **options) -> ZarrSource:
        return ZarrSource([self.store], variable, layout, **options)


def _dims_of(arr, path: str, name: str) -> tuple[str, ...] | None:
    meta = arr.metadata
    names = getattr(meta, "dimension_names", None)  # v3
    if names:
        return tuple(str(n) for n in names)
    dims = arr.attrs.get("_ARRAY_DIMENSIONS")  # v2, as xarray writes it
    if dims is None:
        return None
    if not isinstance(dims, (list, tuple)) or len(dims) != arr.ndim:
        raise DataFileError(path, f"array {name!r}: _ARRAY_DIMENSIONS {dims!r} does not name its {arr.ndim} dims")
    return tuple(str(d) for d in dims)


def open_dataset_group(path: str | os.PathLike) -> dict[str, Variable]:
    """Every array of the Zarr group at ``path`` (v2 or v3) whose dims are named, by name. Arrays
    without dim names are left out (xarray writes names on every array it writes). Consolidated
    metadata (``.zmetadata``, v3's ``consolidated_metadata``) is not used: each array's own metadata
    file is what the reader reads chunks by, and a consolidated copy left stale (an array grown or
    rewritten without consolidating again) would describe another array."""
    import zarr

    from dali_mesh.io.containers import check_store_dir

    bytes_store, key = store_of(path)
    local = bytes_store.local_path(key)
    if local is not None:
        check_store_dir(local)
    try:
        group = zarr.open_group(store=bytes_store.zarr_store(key), mode="r", use_consolidated=False)
    except Exception as e:  # noqa: BLE001 - zarr raises many kinds for a folder that is no group
        raise DataFileError(path, f"is not a Zarr group of variables ({type(e).__name__}: {e})") from None
    out = {}
    for name, arr in group.arrays():
        dims = _dims_of(arr, path, name)
        if dims is not None:
            attrs = dict(arr.attrs)
            out[name] = Variable(name, dims, tuple(int(s) for s in arr.shape), np.dtype(arr.dtype), attrs,
                                 _zarr_cf_fill(arr, attrs), (path,))
    if not out:
        raise DataFileError(path, "holds no arrays with named dims (_ARRAY_DIMENSIONS / dimension_names): "
                                  "not a dataset as xarray writes it")
    return out


def _zarr_cf_fill(arr, attrs):
    """The fill value xarray decodes: v2 keeps it in the array's ``fill_value``, v3 in the
    ``_FillValue`` attribute (base64 of its bytes, as xarray writes it, or a number)."""
    if arr.metadata.zarr_format == 2:
        return arr.metadata.fill_value
    value = attrs.get("_FillValue")
    if isinstance(value, str):
        try:
            raw = base64.b64decode(value)
        except (ValueError, TypeError):
            return value
        dtype = np.dtype(arr.dtype)
        if len(raw) != dtype.itemsize:  # xarray writes a float fill as float64 bytes whatever the dtype
            dtype = np.dtype(f"<{dtype.kind if dtype.kind in 'fiu' else 'f'}{len(raw)}") if len(raw) in (1, 2, 4, 8) \
                else None
        return value if dtype is None else np.frombuffer(raw, dtype=dtype)[0].item()
    return value


def read_coordinate(path: str | os.PathLike, name: str) -> np.ndarray:
    """The values of the 1-D array ``name`` of the group (a coordinate), read whole."""
    import zarr

    bytes_store, key = store_of(path)
    arr = zarr.open_array(store=bytes_store.zarr_store(key), path=name, mode="r")
    if arr.ndim != 1:
        raise DataFileError(str(path), f"coordinate {name!r} has shape {arr.shape}, not 1-D")
    return np.asarray(arr[:])
