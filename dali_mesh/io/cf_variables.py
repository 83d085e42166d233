"""Datasets as xarray writes them to Zarr (WeatherBench2, ARCO-ERA5): a group of variables, arrays whose
dims are named in their metadata (``_ARRAY_DIMENSIONS`` in v2, ``dimension_names`` in v3), beside 1-D
coordinate arrays (``time``, ``level``, ``latitude``, ``longitude``); and CF time coordinates
(``units: "hours since 1959-01-01"``, ``calendar``) decoded to numpy ``datetime64``."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

import numpy as np

from dali_mesh.io._common import DataFileError

__all__ = ["DatasetVariable", "open_dataset_group", "decode_cf_time", "CALENDARS"]

#: calendars numpy's proleptic Gregorian datetime64 represents (``standard``/``gregorian`` from
#: 1582-10-15 on, where they are the proleptic Gregorian calendar)
CALENDARS = ("standard", "gregorian", "proleptic_gregorian")
_GREGORIAN_START_S = int(np.datetime64("1582-10-15", "s").astype(np.int64))  # seconds since 1970
_UNITS_NS = {"nanoseconds": 1, "microseconds": 10 ** 3, "milliseconds": 10 ** 6, "seconds": 10 ** 9,
             "minutes": 60 * 10 ** 9, "hours": 3600 * 10 ** 9, "days": 86400 * 10 ** 9}
_UNIT_NAMES = {"ns": "nanoseconds", "us": "microseconds", "ms": "milliseconds", "s": "seconds", "sec": "seconds",
               "secs": "seconds", "second": "seconds", "min": "minutes", "mins": "minutes", "minute": "minutes",
               "h": "hours", "hr": "hours", "hrs": "hours", "hour": "hours", "d": "days", "day": "days",
               "nanosecond": "nanoseconds", "microsecond": "microseconds", "millisecond": "milliseconds"}
_DATE = re.compile(r"^\s*(-?\d{1,4})-(\d{1,2})-(\d{1,2})(?:[ T](\d{1,2}):(\d{1,2})(?::(\d{1,2})(\.\d+)?)?)?"
                   r"\s*(Z|UTC|GMT|[+-]0{1,2}(?::?00)?)?\s*$")


@dataclass(frozen=True)
class DatasetVariable:
    """One array of the group: its path, dims (names), shape, dtype and attributes."""

    name: str
    dims: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: np.dtype
    attrs: dict
    #: the CF fill value xarray masks to NaN (Zarr v2: the array's fill_value; v3 and NetCDF: the
    #: ``_FillValue`` attribute), None if there is none
    cf_fill: object = None

    def cf_decoding(self) -> str | None:
        """What xarray would change in the stored values of this variable (CF decoding), or None: a
        reader of raw values would return other numbers than ``xarray.open_dataset``."""
        packed = [a for a in ("scale_factor", "add_offset") if a in self.attrs]
        if packed:
            return f"it is packed ({', '.join(packed)}): xarray unpacks it to floats"
        # xarray's UnsignedIntegerCoder: "_Unsigned": "true" on signed integers reads them unsigned,
        # "false" on unsigned ones signed (the bytes are the same, the values not: int8 -34 is 222)
        unsigned = self.attrs.get("_Unsigned")
        if unsigned is not None and self.dtype.kind in "iu":
            flip = {"i": ("true", "u"), "u": ("false", "i")}[self.dtype.kind]
            if str(unsigned) == flip[0]:
                other = np.dtype(f"{flip[1]}{self.dtype.itemsize}")
                return f"its _Unsigned attribute {unsigned!r} makes xarray read its {self.dtype} values as {other}"
        for what, value in (("_FillValue", self.cf_fill), ("missing_value", self.attrs.get("missing_value"))):
            if value is None:
                continue
            values = np.atleast_1d(np.asarray(value))
            if values.dtype.kind == "f" and np.all(np.isnan(values)):
                continue  # NaN stays NaN
            return f"its {what} {values.tolist()} is masked to NaN by xarray"
        return None


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


def open_dataset_group(path: str | os.PathLike) -> dict[str, DatasetVariable]:
    """Every array of the Zarr group at ``path`` (v2 or v3) whose dims are named, by name. Arrays
    without dim names are left out (xarray writes names on every array it writes). Consolidated
    metadata (``.zmetadata``, v3's ``consolidated_metadata``) is not used: each array's own metadata
    file is what the reader reads chunks by, and a consolidated copy left stale (an array grown or
    rewritten without consolidating again) would describe another array."""
    import zarr

    from dali_mesh.io.containers import check_store_dir
    from dali_mesh.storage import store_of

    path = str(path)
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
            out[name] = DatasetVariable(name, dims, tuple(int(s) for s in arr.shape), np.dtype(arr.dtype), attrs,
                                        _zarr_cf_fill(arr, attrs))
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
        import base64

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


def open_netcdf_variables(path: str | os.PathLike) -> dict[str, DatasetVariable]:
    """Every dataset at the root of a NetCDF4 (HDF5) file whose dims are dimension scales, by name,
    as the netCDF library and h5netcdf write them."""
    from dali_mesh.io.containers import open_hdf5_file

    path = str(path)
    f = open_hdf5_file(path)
    try:
        out = {}
        for name, ds in f.items():
            if not hasattr(ds, "dims"):
                continue  # a group
            attrs = {k: _attr(v) for k, v in ds.attrs.items() if k not in ("DIMENSION_LIST", "REFERENCE_LIST")}
            if attrs.get("CLASS") == "DIMENSION_SCALE":
                dims = (name,)
            else:
                dims = []
                for dim in ds.dims:
                    scales = list(dim.values())
                    if len(scales) != 1:
                        dims = None
                        break
                    dims.append(scales[0].name.rsplit("/", 1)[-1])
                if dims is None:
                    continue
            out[name] = DatasetVariable(name, tuple(dims), tuple(int(s) for s in ds.shape), np.dtype(ds.dtype),
                                        attrs, attrs.get("_FillValue"))
    finally:
        f.close()
    if not out:
        raise DataFileError(path, "holds no variables with dimension scales: not a NetCDF4 dataset")
    return out


def _attr(value):
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.ndarray) and value.size == 1 and value.dtype.kind in "biuf":
        return value.reshape(-1)[0].item()
    return value


def read_netcdf_coordinate(path: str | os.PathLike, name: str) -> np.ndarray:
    """The values of the 1-D dataset ``name`` of a NetCDF4 file, read whole."""
    from dali_mesh.io.containers import open_hdf5_file

    f = open_hdf5_file(str(path))
    try:
        ds = f[name]
        if ds.ndim != 1:
            raise DataFileError(str(path), f"coordinate {name!r} has shape {ds.shape}, not 1-D")
        return np.asarray(ds[:])
    finally:
        f.close()


def read_coordinate(path: str | os.PathLike, name: str) -> np.ndarray:
    """The values of the 1-D array ``name`` of the group (a coordinate), read whole."""
    import zarr

    from dali_mesh.storage import store_of

    bytes_store, key = store_of(str(path))
    arr = zarr.open_array(store=bytes_store.zarr_store(key), path=name, mode="r")
    if arr.ndim != 1:
        raise DataFileError(str(path), f"coordinate {name!r} has shape {arr.shape}, not 1-D")
    return np.asarray(arr[:])


def _parse_reference(text: str, where: str) -> int:
    """The reference date as nanoseconds since 1970-01-01 (a Python int: any year 1..9999)."""
    m = _DATE.match(text)
    if m is None:
        raise ValueError(f"{where}: cannot read the reference date {text!r} (expected 'YYYY-MM-DD[ hh:mm[:ss]]', UTC)")
    y, mo, d, hh, mm, ss, frac, _tz = m.groups()
    iso = f"{int(y):04d}-{int(mo):02d}-{int(d):02d}T{int(hh or 0):02d}:{int(mm or 0):02d}:{int(ss or 0):02d}"
    try:
        seconds = int(np.datetime64(iso, "s").astype(np.int64))
    except ValueError:
        raise ValueError(f"{where}: the reference date {text!r} is not a date") from None
    return seconds * 10 ** 9 + (int(round(float(frac) * 1e9)) if frac else 0)


def decode_cf_time(values: np.ndarray, attrs: dict, where: str) -> np.ndarray:
    """CF time ``values`` (``units: "<unit> since <date>"``, ``calendar``) as ``datetime64[ns]``.

    Calendars ``standard``/``gregorian`` (from 1582-10-15) and ``proleptic_gregorian``; others
    (``noleap``, ``360_day``, ``julian``, ...) are refused naming the calendar. Values already
    ``datetime64`` are returned as nanoseconds."""
    values = np.asarray(values)
    if np.issubdtype(values.dtype, np.datetime64):
        return values.astype("datetime64[ns]")
    units = attrs.get("units")
    if not isinstance(units, str) or " since " not in units:
        raise ValueError(f"{where}: time coordinate has units {units!r}, not '<unit> since <date>' (CF)")
    calendar = str(attrs.get("calendar", "standard")).lower()
    if calendar not in CALENDARS:
        raise ValueError(f"{where}: calendar {calendar!r} is not supported (numpy datetime64 is the proleptic "
                         f"Gregorian calendar: {', '.join(CALENDARS)})")
    unit, ref = units.split(" since ", 1)
    unit = unit.strip().lower()
    unit = _UNIT_NAMES.get(unit, unit)
    if unit not in _UNITS_NS:
        raise ValueError(f"{where}: time unit {unit!r} is not one of {', '.join(_UNITS_NS)}")
    reference = _parse_reference(ref, where)
    if not (np.issubdtype(values.dtype, np.integer) or np.issubdtype(values.dtype, np.floating)):
        raise ValueError(f"{where}: time values of dtype {values.dtype} are not numbers")
    scale = _UNITS_NS[unit]
    if np.issubdtype(values.dtype, np.floating):
        if not np.all(np.isfinite(values)):
            raise ValueError(f"{where}: time coordinate holds NaN or infinite values")
        scaled = np.round(values.astype(np.float64) * scale)
        lo, hi = (float(scaled.min()), float(scaled.max())) if scaled.size else (0.0, 0.0)
    else:
        lo, hi = (int(values.min()) * scale, int(values.max()) * scale) if values.size else (0, 0)
    first, last = reference + lo, reference + hi  # exact in Python ints (floats: to the ns)
    if calendar in ("standard", "gregorian") and first < _GREGORIAN_START_S * 10 ** 9:
        raise ValueError(f"{where}: times before 1582-10-15 in the {calendar!r} calendar are Julian dates, "
                         "which numpy datetime64 does not represent")
    if first < -(2 ** 63) + 1 or last > 2 ** 63 - 1 or max(abs(lo), abs(hi)) > 2 ** 63 - 1:
        raise ValueError(f"{where}: time values overflow datetime64[ns] (1677-09-21 .. 2262-04-11; {units})")
    delta = scaled.astype(np.int64) if np.issubdtype(values.dtype, np.floating) else values.astype(np.int64) * scale
    out = (np.int64(reference) + delta).astype("datetime64[ns]")
    return out
