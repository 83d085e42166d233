"""Readers that fill a window of one sample from a file, reading only the bytes the window needs.

Readers know nothing of meshes: they take a :class:`~dali_mesh.Region` (window, domain, boundary per
axis, fill value) and fill a caller's buffer of ``region.window_shape``. The result equals
``dali_mesh.partition.take_window(full_sample, region)``.

h5py and zarr are imported only when their readers are used.
"""
from dali_mesh.io._common import (
    DataFileError,
    ExternalStorageError,
    FileChangedError,
    HeaderError,
    IOStats,
    MissingArrayError,
    MissingFileError,
    NotRegularFileError,
    NotWritableError,
    ShapeMismatchError,
    TruncatedFileError,
    UnsupportedDtypeError,
    UnsupportedFilterError,
    global_stats,
    reset_global_stats,
)
from dali_mesh.plan import WindowPlan, plan_window
from dali_mesh.plan.ranges import DEFAULT_MERGE_GAP
from dali_mesh.io.npy import NpyHeader, read_npy_header, read_npy_window

__all__ = [
    "DEFAULT_MERGE_GAP",
    "DataFileError",
    "ExternalStorageError",
    "FileChangedError",
    "HeaderError",
    "IOStats",
    "MissingArrayError",
    "MissingFileError",
    "NotRegularFileError",
    "NotWritableError",
    "NpyHeader",
    "ShapeMismatchError",
    "TruncatedFileError",
    "UnsupportedDtypeError",
    "UnsupportedFilterError",
    "WindowPlan",
    "global_stats",
    "plan_window",
    "read_npy_header",
    "read_npy_window",
    "reset_global_stats",
]
