"""Write one Zarr array (v2 or v3), chunked and uncompressed (what ``dali-mesh convert`` writes)."""
from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from dali_mesh.formats.zarr.zarr_reader import METADATA_KEYS
from dali_mesh.io._common import ArrayWriter
from dali_mesh.storage import store_of

__all__ = ["create_zarr_array", "is_zarr_store"]


def is_zarr_store(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder holding a Zarr store's root metadata (v3 ``zarr.json``, v2
    ``.zarray`` or ``.zgroup``), or a location of another store whose root holds it (asked of the store:
    an Icechunk repository's snapshot)."""
    store, key = store_of(path)
    local = store.local_path(key)
    if local is not None:
        return os.path.isdir(local) and any(os.path.exists(os.path.join(local, m)) for m in METADATA_KEYS + (".zgroup",))
    return any(store.stat(f"{key.rstrip('/')}/{m}".lstrip("/")) is not None for m in METADATA_KEYS + (".zgroup",))


class _ZarrWriter(ArrayWriter):
    """A Zarr group being written, holding one chunked, uncompressed array (see :class:`ArrayWriter`).
    Nothing is pending after a write returns; after a failed write zarr's event loop may still be
    storing the other chunks of that write, so a caller that removes the store removes it until it
    stays gone."""

    def __init__(self, path: str, name: str, shape, dtype, chunks, zarr_format: int) -> None:
        import zarr

        self.location = path
        group = self._group = zarr.open_group(path, mode="w", zarr_format=zarr_format)
        # every chunk is stored (also all-zero ones) so that each rank's read is the same size
        self._array = group.create_array(name, shape=shape, chunks=chunks, dtype=dtype, compressors=None,
                                         fill_value=0, config={"write_empty_chunks": True})

    def write(self, index, values) -> None:
        self._array[index] = values

    def add_array(self, name: str, values) -> None:
        values = np.asarray(values)
        self._group.create_array(name, data=values, chunks=values.shape or None, compressors=None)


def create_zarr_array(path: str | os.PathLike, name: str, shape: Sequence[int], dtype, chunks: Sequence[int], *,
                      zarr_format: int = 3) -> ArrayWriter:
    """A new Zarr group at ``path`` (what is there is replaced), format ``zarr_format`` (3 or 2), holding
    array ``name`` of ``shape`` and ``dtype`` in ``chunks``, uncompressed, every chunk stored (all-zero
    ones too): an :class:`~dali_mesh.formats.ArrayWriter`."""
    if zarr_format not in (2, 3):
        raise ValueError(f"zarr_format must be 2 or 3, got {zarr_format!r}")
    return _ZarrWriter(str(path), name, tuple(shape), np.dtype(dtype), tuple(chunks), zarr_format)
