"""The ``.npy`` format object: one sample per file, read by byte ranges (:mod:`.npy_reader`), planned
natively (:mod:`.npy_planner`), its layout advice (:mod:`.npy_advice`); read, not written. Registers itself."""
from __future__ import annotations

import os

import numpy as np

from dali_mesh.formats.array_format import ArrayFormat, ArrayInfo
from dali_mesh.formats.format_registry import register_format
from dali_mesh.formats.npy.npy_planner import plan_npy_files
from dali_mesh.formats.npy.npy_reader import read_npy_header, read_npy_window
from dali_mesh.io._common import DataFileError
from dali_mesh.storage import store_of

__all__ = ["NPY", "NpyFormat"]


class NpyFormat(ArrayFormat):
    name, label, container, array_word, suffixes, steps = "npy", ".npy file", "file", "array", (".npy",), False
    fills_window = True  # every element: FormatTests checks it

    def info(self, location, name=None, **options) -> ArrayInfo:
        if name:
            raise DataFileError(location, "a .npy file holds one array: it has no named dataset or array")
        h = read_npy_header(location)
        return ArrayInfo(tuple(h.shape), h.native_dtype)

    def open(self, location, name=None, **options):
        if name:
            raise DataFileError(location, "a .npy file holds one array: it has no named dataset or array")
        return os.fspath(location)

    def read_window(self, handle, region, out, *, prefix=(), index_maps=None, expected_shape=None,
                    expected_dtype=None, **read_options) -> None:
        """As :meth:`ArrayFormat.read_window`; ``read_options``: ``merge_gap``, ``direct``, ``method`` of
        :func:`~dali_mesh.formats.npy.read_npy_window`."""
        read_npy_window(handle, region, out, prefix=prefix, index_maps=index_maps, expected_shape=expected_shape,
                        expected_dtype=expected_dtype, **read_options)

    def read_whole(self, handle, index=None) -> np.ndarray:
        store, key = store_of(handle)
        path = store.local_path(key)
        if path is not None:
            arr = np.load(path, allow_pickle=False)  # no mmap: a file rewritten meanwhile must not SIGBUS
        else:
            with store.open_file(key, ".npy file") as f:  # an object: numpy reads it through ranged reads
                arr = np.load(f, allow_pickle=False)
        return arr if index is None else arr[index]

    def advice_target(self, location, name=None, **options):
        from dali_mesh.formats.npy.npy_advice import NpyColdReads  # noqa: PLC0415

        if name:
            raise DataFileError(location, "a .npy file holds one array: it has no named dataset or array "
                                          "(leave --dataset out)")
        return NpyColdReads(self, location)

    def plan_files(self, files, *, region_of, index_maps=None, sample_shape=None, dtype=None, sample_ndim: int,
                   merge_gap: int):
        return plan_npy_files(files, region_of=region_of, index_maps=index_maps, sample_shape=sample_shape,
                              dtype=dtype, sample_ndim=sample_ndim, merge_gap=merge_gap)


NPY = register_format(NpyFormat())
