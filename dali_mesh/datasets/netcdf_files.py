"""Datasets as NetCDF4 files (HDF5 underneath, as the netCDF library, h5netcdf and xarray's
``to_netcdf`` write them): variables whose dims are dimension scales, in one file or in files that
continue each other in time (one per year or month). Each variable is read by one
:class:`~dali_mesh.HDF5Source` over every file."""
from __future__ import annotations

import copy
import os
from dataclasses import replace
from typing import Sequence

import numpy as np

from dali_mesh.datasets.cf_time import decode_cf_time
from dali_mesh.datasets.variables import DatasetFormat, Variable, register_dataset_format
from dali_mesh.io._common import DataFileError
from dali_mesh.partition import Layout
from dali_mesh.source import HDF5Source
from dali_mesh.storage import local_path_of, resolve_locations

__all__ = ["NetCDFFiles", "open_netcdf_variables", "read_netcdf_coordinate"]


@register_dataset_format
class NetCDFFiles(DatasetFormat):
    """NetCDF4 files: ``locations`` is one file or a list of files that continue each other in time
    (the same variables and grid), in any order: :meth:`in_time_order` sorts them by their first
    time, as xarray's ``open_mfdataset(combine="by_coords")`` does. NetCDF3 files are refused naming
    the format."""

    name = "netcdf_files"
    label = "NetCDFDatasetSource"

    def __init__(self, locations, storage_options: dict | None = None, time_dim: str = "time") -> None:
        super().__init__(locations, storage_options, time_dim)
        many = not isinstance(locations, (str, bytes, os.PathLike))
        files = [os.fspath(f) for f in resolve_locations(list(locations) if many else [locations], storage_options)]
        if not files:
            raise ValueError(f"{self.label} needs at least one file")
        _check_each_once(files)
        self.files = files
        self.store = files[0]
        self._per_file = [open_netcdf_variables(f) for f in files]
        self._file_starts = None  # the first step of each file, once in time order
        _check_one_grid(files, self._per_file, time_dim)
        self.variables = {n: replace(v, shape=self._steps(n) + v.shape[1:] if self._along_time(v) else v.shape,
                                     locations=tuple(files))
                          for n, v in self._per_file[0].items()}

    def _along_time(self, var: Variable) -> bool:
        return bool(var.dims) and var.dims[0] == self.time_dim

    def _steps(self, name: str) -> tuple[int]:
        return (sum(vs[name].shape[0] for vs in self._per_file),)

    def coordinate(self, name: str) -> np.ndarray:
        return read_netcdf_coordinate(self.store, name)

    def in_time_order(self) -> tuple["NetCDFFiles", np.ndarray]:
        parts = [decode_cf_time(read_netcdf_coordinate(f, self.time_dim), vs[self.time_dim].attrs,
                                f"{f}: {self.time_dim!r}") for f, vs in zip(self.files, self._per_file)]
        # the files in time order, as xarray's open_mfdataset(combine="by_coords") takes them (one per
        # year or month, listed or globbed in any order); a file without steps goes first
        earliest = np.datetime64(-(2 ** 63) + 1, "ns")
        order = sorted(range(len(parts)), key=lambda k: (parts[k][0] if len(parts[k]) else earliest, k))
        ordered = copy.copy(self)
        ordered.files = [self.files[k] for k in order]
        ordered._per_file = [self._per_file[k] for k in order]
        ordered.store = ordered.files[0]
        ordered._file_starts = np.cumsum([0] + [len(parts[k]) for k in order])
        ordered.variables = {n: replace(v, locations=tuple(ordered.files)) for n, v in self.variables.items()}
        return ordered, np.concatenate([parts[k] for k in order])

    def where_step(self, step: int) -> str:
        if self._file_starts is None:
            return ""
        k = int(np.searchsorted(self._file_starts, step, side="right")) - 1
        return f" in {self.files[k]}"

    def array_source(self, variable: str, layout: Layout, **options) -> HDF5Source:
        return HDF5Source(self.files, variable, layout, **options)


def _check_each_once(files: Sequence[str]) -> None:
    """A file listed twice (under two names, too) would repeat its steps: refused naming both."""
    seen = {}
    for f in files:
        # by path: a file of this machine is known by its device and inode (two names of one file); an
        # object by its location
        if local_path_of(f) is None:
            key = f
        else:
            try:
                st = os.stat(f)
            except OSError as e:
                raise DataFileError(f, f"cannot be read ({e.strerror})") from None
            key = (st.st_dev, st.st_ino)
        if key in seen:
            raise DataFileError(f, f"is given twice (as {seen[key]!r} and {f!r}): each file once, please")
        seen[key] = f


def _check_one_grid(files: Sequence[str], per_file: Sequence[dict[str, Variable]], time_dim: str) -> None:
    """Files that continue each other in time hold the same variables with the same dims, dtype and
    shape but for the steps along ``time_dim``: refused naming the first that does not."""
    def frame(v):
        return None if v is None else (v.dims, v.shape[1:] if v.dims and v.dims[0] == time_dim else v.shape, v.dtype)

    first = {n: frame(v) for n, v in per_file[0].items()}
    for f, vs in zip(files[1:], per_file[1:]):
        for n, want in first.items():
            other = frame(vs.get(n))
            if other != want:
                raise DataFileError(f, f"variable {n!r} is {other} here, {want} in {files[0]}: the files must hold "
                                    "the same variables on the same grid")


def open_netcdf_variables(path: str | os.PathLike) -> dict[str, Variable]:
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
            out[name] = Variable(name, tuple(dims), tuple(int(s) for s in ds.shape), np.dtype(ds.dtype), attrs,
                                 attrs.get("_FillValue"), (path,))
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
