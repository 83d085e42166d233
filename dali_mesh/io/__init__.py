"""What every reader shares: the errors readers raise, I/O counters, the window plan, and the opening of
containers (an HDF5 file, a Zarr store) that formats and dataset variables both read.

The readers themselves live in the folder of their format (:mod:`dali_mesh.formats`; ``.npy``:
:mod:`dali_mesh.formats.npy`). Readers know nothing of meshes: they take a :class:`~dali_mesh.Region`
(window, domain, boundary per axis, fill value) and fill a caller's buffer of ``region.window_shape``.
The result equals ``dali_mesh.partition.take_window(full_sample, region)``.

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
    "ShapeMismatchError",
    "TruncatedFileError",
    "UnsupportedDtypeError",
    "UnsupportedFilterError",
    "WindowPlan",
    "global_stats",
    "plan_window",
    "reset_global_stats",
]
