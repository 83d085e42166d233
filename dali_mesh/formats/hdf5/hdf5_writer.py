"""Write one HDF5 dataset, chunked and uncompressed (what ``dali-mesh convert`` writes)."""
from __future__ import annotations

import os
import threading
from typing import Sequence

import numpy as np

from dali_mesh.io._common import ArrayWriter

__all__ = ["create_hdf5_dataset"]


class _HDF5Writer(ArrayWriter):
    """An HDF5 file being written, holding one chunked, uncompressed dataset (see :class:`ArrayWriter`)."""

    def __init__(self, path: str, name: str, shape, dtype, chunks) -> None:
        import h5py

        self.location = path
        self._lock = threading.Lock()  # h5py serialises its calls anyway; this says so
        self._file = h5py.File(path, "w")
        try:
            self._dataset = self._file.create_dataset(name, shape=shape, dtype=dtype, chunks=chunks)
        except BaseException as e:
            self.discard(e)
            raise

    def write(self, index, values) -> None:
        with self._lock:
            self._dataset[index] = values

    def add_array(self, name: str, values) -> None:
        with self._lock:
            self._file.create_dataset(name, data=values)

    def close(self) -> None:
        try:
            self._file.flush()  # a write that fails (a full disk) fails here, not in close()
        except BaseException as e:
            self.discard(e)
            raise
        self._file.close()

    def discard(self, error: BaseException | None = None) -> None:
        """Closes the file. After a write that failed (``error`` an ``OSError`` or ``RuntimeError``: a
        full disk, a file size limit) its descriptor is first pointed at /dev/null, so that the writes
        its close still makes succeed: an HDF5 close that fails leaves the library in a state that
        crashes the process at exit (SIGSEGV). After an interrupt it closes as usual: HDF5's close may
        extend the file (``ftruncate``), which /dev/null refuses (EINVAL, seen when SIGTERM came just
        after the file was created)."""
        try:
            fd = int(self._file.id.get_vfd_handle()) if isinstance(error, (OSError, RuntimeError)) else None
        except Exception:  # noqa: BLE001 - another file driver, or the file is closed: nothing to redirect
            fd = None
        if fd is not None:
            null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.dup2(null, fd)
            finally:
                os.close(null)
        self._file.close()


def create_hdf5_dataset(path: str | os.PathLike, name: str, shape: Sequence[int], dtype, chunks: Sequence[int]
                        ) -> ArrayWriter:
    """A new HDF5 file at ``path`` (what is there is replaced) holding dataset ``name`` of ``shape`` and
    ``dtype``, stored in ``chunks``, uncompressed: an :class:`~dali_mesh.formats.ArrayWriter`."""
    return _HDF5Writer(str(path), name, tuple(shape), np.dtype(dtype), tuple(chunks))
