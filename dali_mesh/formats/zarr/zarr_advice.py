"""Layout advice for a Zarr array: a cold read of a window fetches every chunk object each box of the
window touches (the reader selects box by box), each of its stored size."""
from __future__ import annotations

import itertools
import os

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
        self._root = os.path.join(path, arr.path) if arr.path else path
        self._metadata = arr.metadata
        self._remote_sizes: dict[str, int] = {}
        super().__init__(format, path, name, tuple(arr.shape[1:]), np.dtype(arr.dtype).newbyteorder("="),
                         tuple(arr.chunks), (0,))

    def _chunk_size(self, idx) -> int:
        key = self._metadata.encode_chunk_key(tuple(idx))
        store, root = store_of(self._root)
        if store.local_path(root) is None:  # an object's size, asked once (a HEAD request)
            if key not in self._remote_sizes:
                version = store.stat(f"{root.rstrip('/')}/{key}")
                self._remote_sizes[key] = 0 if version is None else version.size
            return self._remote_sizes[key]
        try:
            return os.path.getsize(os.path.join(self._root, *key.split("/")))
        except OSError:  # a chunk never written: zarr returns the fill value, reading nothing
            return 0

    def cold_bytes(self, plan: WindowPlan) -> int:
        # the reader selects box by box: a chunk two boxes touch is fetched twice
        check_chunk_count(self.path, plan, self.chunks)
        total = 0
        for _, fst, ln in plan.boxes():
            for idx in itertools.product(*chunk_ranges((0,) + tuple(fst), (1,) + tuple(ln), self.chunks)):
                total += self._chunk_size(idx)
        return total
