"""Layout advice for a Zarr array: a cold read of a window fetches every chunk object each box of the
window touches (the reader selects box by box), each of its stored size. In a sharded (v3) array the
chunks are the shards' inner chunks, read by byte range: each is counted as its shard's stored bytes
shared evenly among the shard's inner chunks (the index's exact sizes are the planner's to read)."""
from __future__ import annotations

import itertools
import math

import numpy as np

from dali_mesh.formats.cold_reads import ColdReads, check_chunk_count, chunk_ranges
from dali_mesh.formats.zarr.zarr_reader import open_zarr_array
from dali_mesh.io._common import DataFileError
from dali_mesh.plan import WindowPlan
from dali_mesh.storage import store_of

__all__ = ["ZarrColdReads"]


class ZarrColdReads(ColdReads):
    def __init__(self, format, path: str, name: str | None) -> None:
        arr = open_zarr_array(path, name)
        if arr.ndim < 2:
            raise DataFileError(path, f"array {name or '/'} has shape {arr.shape}: samples lie along axis 0, so it "
                                      "needs at least 2 axes")
        # the location resolved once: the array's folder is a key of its store (a reference set's or an
        # Icechunk snapshot's root is no path that a second resolution could split again)
        self._store, root = store_of(path)
        self._root = f"{root.rstrip('/')}/{arr.path}" if arr.path else root
        self._metadata = arr.metadata
        self._sizes: dict[str, int] = {}
        chunks = tuple(int(c) for c in arr.chunks)  # a sharded array's inner chunks
        shards = getattr(arr, "shards", None)
        #: inner chunks per shard along each axis (``None``: not sharded, each chunk is an object)
        self._ratio = None if shards is None else tuple(int(s) // c for s, c in zip(shards, chunks))
        super().__init__(format, path, name, tuple(arr.shape[1:]), np.dtype(arr.dtype).newbyteorder("="), chunks,
                         (0,))

    def _object_size(self, key: str) -> int:
        """The stored size of the object ``key`` of the array (0: never written, read as the fill value),
        asked once (an object store's: a HEAD request)."""
        if key not in self._sizes:
            version = self._store.stat(f"{self._root.rstrip('/')}/{key}" if self._root else key)
            self._sizes[key] = 0 if version is None else version.size
        return self._sizes[key]

    def _chunk_size(self, idx) -> int:
        if self._ratio is None:
            return self._object_size(self._metadata.encode_chunk_key(tuple(idx)))
        shard = tuple(int(i) // r for i, r in zip(idx, self._ratio))
        return self._object_size(self._metadata.encode_chunk_key(shard)) // math.prod(self._ratio)

    def cold_bytes(self, plan: WindowPlan) -> int:
        # the reader selects box by box: a chunk two boxes touch is fetched twice
        check_chunk_count(self.path, plan, self.chunks)
        total = 0
        for _, fst, ln in plan.boxes():
            for idx in itertools.product(*chunk_ranges((0,) + tuple(fst), (1,) + tuple(ln), self.chunks)):
                total += self._chunk_size(idx)
        return total
