"""Opening the containers that the array formats (:mod:`dali_mesh.formats`) and the dataset variables
(:mod:`dali_mesh.datasets`) share: an HDF5 file, local or in a byte store, and a Zarr store's
folder; their errors name the file."""
from __future__ import annotations

import os
import stat

from dali_mesh.io._common import DataFileError, HeaderError, MissingFileError, NotRegularFileError
from dali_mesh.storage import store_of
from dali_mesh.storage.local import check_regular_file
from dali_mesh.storage.byte_store import StoredFile

__all__ = ["check_store_dir", "open_hdf5_file", "open_hdf5_container"]


def open_hdf5_file(path: str | os.PathLike, **file_kwargs):
    """``h5py.File(path, "r")``, its errors naming the file (a NetCDF3 file is named as such)."""
    return open_hdf5_container(str(path), False, file_kwargs)[0]


def open_hdf5_container(path: str, random_access: bool, file_kwargs, version=None):
    """``(h5py.File, the Python file object h5py reads through or None)`` of ``path`` (arguments as
    :func:`dali_mesh.formats.hdf5.open_hdf5_dataset`); its errors name the file."""
    import h5py

    bytes_store, key = store_of(path)
    if bytes_store.local_path(key) is None:  # h5py reads the object through ranged reads of one version
        fobj = bytes_store.open_file(key, "HDF5 file") if version is None else \
            StoredFile(bytes_store.open_version(key, version))
        try:
            return h5py.File(fobj, "r", **file_kwargs), fobj
        except OSError as e:
            fobj.close()
            raise DataFileError(path, f"cannot be opened as HDF5 ({e}); is it an HDF5 file, and whole?") from None
    check_regular_file(path, "HDF5 file")
    fobj = None
    try:
        if random_access:
            fobj = open(path, "rb", buffering=0)
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fobj.fileno(), 0, 0, os.POSIX_FADV_RANDOM)
            f = h5py.File(fobj, "r", **file_kwargs)
        else:
            f = h5py.File(path, "r", **file_kwargs)
    except OSError as e:
        if fobj is not None:
            fobj.close()
        classic = _netcdf3_kind(path)
        if classic:
            raise HeaderError(path, f"is a NetCDF3 file ({classic}), not NetCDF4/HDF5: the reader opens NetCDF4 "
                              "files (which are HDF5) only; convert it (e.g. `nccopy -k nc4 IN OUT`, or xarray's "
                              "to_netcdf(engine='h5netcdf'))") from None
        raise DataFileError(path, f"cannot be opened as HDF5 ({e}); is it an HDF5 file, and whole?") from None
    return f, fobj


_NETCDF3 = {b"CDF\x01": "classic format, CDF-1", b"CDF\x02": "64-bit offset format, CDF-2",
            b"CDF\x05": "64-bit data format, CDF-5"}


def _netcdf3_kind(path: str) -> str | None:
    """The NetCDF3 format a file's magic names, or None."""
    try:
        with open(path, "rb") as f:
            return _NETCDF3.get(f.read(4))
    except OSError:
        return None


def check_store_dir(path: str, hint: str = "; check the path") -> None:
    """Refuse, naming ``path``, a Zarr store that does not exist or is not a directory (``hint`` ends
    the message)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise MissingFileError(path, f"no such Zarr store{hint}") from None
    if not stat.S_ISDIR(mode):
        raise NotRegularFileError(path, f"is not a directory: a Zarr store is a directory holding zarr.json or "
                                  f".zarray{hint}")
