"""Read a window of one sample of an HDF5 dataset through h5py hyperslabs.

Each box of the read plan (:mod:`dali_mesh.io._plan`) is one ``Dataset.read_direct`` from a
hyperslab of the file into a hyperslab of the destination: HDF5 reads only the chunks (chunked
datasets, compressed or not) or the byte runs (contiguous datasets) that the box touches, and
converts big-endian data to the destination's native dtype. h5py is imported on first use.

A sample is ``dataset[prefix]``: e.g. one time step ``t`` of an ERA5-style ``(time, channel, lat,
lon)`` dataset is ``prefix=(t,)``; ``index_maps={0: channels}`` selects a channel subset.
"""
from __future__ import annotations

import itertools
import os
from typing import Mapping, Sequence

import numpy as np

from dali_mesh.io._common import (
    DataFileError,
    IOStats,
    MissingArrayError,
    UnsupportedDtypeError,
    _account,
    check_expected,
    check_region_fits,
    native_dtype,
    sample_shape,
    window_out,
)
from dali_mesh.io._plan import plan_window
from dali_mesh.partition import Region

__all__ = ["open_hdf5_dataset", "read_hdf5_window", "hdf5_sample_info"]

_ALLOWED_KINDS = "biufc"


def open_hdf5_dataset(path: str | os.PathLike, name: str, *, random_access: bool = False, **file_kwargs):
    """Open ``path`` read-only and return ``(h5py.File, Dataset)``; errors name the file.

    ``random_access=True`` opens the file in Python with ``POSIX_FADV_RANDOM`` and hands h5py the
    file object: the kernel then reads no pages beyond those HDF5 asks for (HDF5's own file
    descriptor gets readahead, which pulls neighbouring chunks of other ranks), at some cost in
    speed (every HDF5 read goes through Python).
    """
    import h5py

    path = str(path)
    if not os.path.exists(path):
        raise FileNotFoundError(2, "no such HDF5 file; check the path and the file list", path)
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
        raise DataFileError(path, f"cannot be opened as HDF5 ({e}); is it an HDF5 file, and whole?") from None
    try:
        obj = f.get(name)
        if obj is None or not isinstance(obj, h5py.Dataset):
            names = []
            f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
            raise MissingArrayError(path, f"has no dataset {name!r}; datasets in the file: {names}")
        if obj.dtype.kind not in _ALLOWED_KINDS or obj.dtype.fields is not None:
            raise UnsupportedDtypeError(path, f"dataset {name!r} has dtype {obj.dtype}; only plain numeric dtypes are read")
    except BaseException:
        f.close()
        if fobj is not None:
            fobj.close()
        raise
    return f, obj


def hdf5_sample_info(dataset, num_prefix: int) -> tuple[tuple[int, ...], np.dtype, int]:
    """``(sample shape, native dtype, samples along the first axis)`` of a dataset whose leading
    ``num_prefix`` axes index samples."""
    shape = tuple(dataset.shape)
    return shape[num_prefix:], native_dtype(dataset.dtype), (shape[0] if num_prefix else 1)


def _chunk_bytes(dataset, prefix, boxes) -> int:
    """Stored bytes of the chunks the boxes touch (hyperslab bytes for a contiguous dataset)."""
    itemsize = dataset.dtype.itemsize
    chunks = dataset.chunks
    if chunks is None:
        return sum(int(np.prod(ln)) * itemsize for _, _, ln in boxes)
    seen = set()
    total = 0
    dsid = dataset.id
    for _, fst, ln in boxes:
        full_start = tuple(prefix) + fst
        full_len = (1,) * len(prefix) + ln
        ranges = [range(s // c, (s + n - 1) // c + 1) for s, n, c in zip(full_start, full_len, chunks)]
        for idx in itertools.product(*ranges):
            if idx in seen:
                continue
            seen.add(idx)
            try:
                info = dsid.get_chunk_info_by_coord(tuple(i * c for i, c in zip(idx, chunks)))
                total += info.size or 0
            except Exception:  # an unwritten chunk (fill value): nothing stored, nothing read
                pass
    return total


def read_hdf5_window(
    dataset,
    region: Region,
    out: np.ndarray | None = None,
    *,
    prefix: Sequence[int] = (),
    index_maps: Mapping[int, Sequence[int]] | None = None,
    expected_shape: Sequence[int] | None = None,
    expected_dtype=None,
    count_chunks: bool = True,
    path: str | None = None,
    stats: IOStats | None = None,
) -> np.ndarray:
    """Fill ``out`` with the window of sample ``dataset[prefix]`` (an ``h5py.Dataset``).

    Arguments as :func:`dali_mesh.io.read_npy_window`. ``count_chunks``: add the stored size of
    the chunks touched to ``stats.bytes_read`` (an HDF5 metadata look-up per chunk). ``path``: the
    file's name for error messages (default: h5py's ``file.filename``).
    """
    path = path or dataset.file.filename
    local = IOStats()
    try:
        _, native, _ = hdf5_sample_info(dataset, len(prefix))
        shape = sample_shape(path, dataset.shape, prefix, index_maps,
                             f"dataset {dataset.name} of shape {dataset.shape}")
        check_expected(path, shape, native, expected_shape, expected_dtype, label=f"dataset {dataset.name}: ")
        check_region_fits(path, region, shape)
        out = window_out(path, region, out, native)
        local.window_bytes += out.nbytes
        if out.size == 0:
            return out
        plan = plan_window(region, index_maps)
        stage = out if out.flags.c_contiguous else np.empty(out.shape, native)
        for dst, src in plan.slices(prefix):
            try:
                dataset.read_direct(stage, source_sel=src, dest_sel=dst)
            except OSError as e:
                raise DataFileError(path, f"reading dataset {dataset.name} failed ({e}); the file is truncated or corrupt") from None
            local.read_calls += 1
        if count_chunks:
            local.bytes_read += _chunk_bytes(dataset, tuple(int(p) for p in prefix), plan.boxes())
        if stage is not out:
            out[...] = stage
        plan.finish(out)
        return out
    finally:
        _account(stats, local)
