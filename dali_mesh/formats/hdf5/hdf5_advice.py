"""Layout advice for an HDF5 dataset: a cold read of a window reads its hyperslab's byte runs
(contiguous) or the stored bytes of every chunk it touches (chunked), found in one pass over the
dataset's chunk index."""
from __future__ import annotations

import itertools
import math

import numpy as np

from dali_mesh.formats.cold_reads import ColdReads, check_chunk_count, chunk_ranges
from dali_mesh.formats.hdf5.hdf5_planner import _chunk_offsets
from dali_mesh.formats.hdf5.hdf5_reader import open_hdf5_dataset
from dali_mesh.io._common import DataFileError
from dali_mesh.plan import WindowPlan

__all__ = ["HDF5ColdReads"]


class HDF5ColdReads(ColdReads):
    def __init__(self, format, path: str, name: str, allow_external: bool = False) -> None:
        f, ds = open_hdf5_dataset(path, name, allow_external=allow_external)
        try:
            if ds.ndim < 2:
                raise DataFileError(path, f"dataset {name!r} has shape {ds.shape}: samples lie along axis 0, so it "
                                          "needs at least 2 axes")
            chunks = None if ds.chunks is None else tuple(ds.chunks)
            # stored size of every written chunk of sample 0, in one pass over the chunk index (a lookup per
            # chunk of the grid took minutes for a tiny file claiming millions of one-cell chunks); a chunk
            # never written reads nothing
            self._sizes = {} if chunks is None else {
                tuple(o // n for o, n in zip(first, chunks)): size or 0
                for first, (_, size, _) in _chunk_offsets(ds).items() if first[0] == 0}
            super().__init__(format, path, name, tuple(ds.shape[1:]), np.dtype(ds.dtype).newbyteorder("="), chunks,
                             (0,))
        finally:
            f.close()

    def cold_bytes(self, plan: WindowPlan) -> int:
        itemsize = self.dtype.itemsize
        if self.chunks is None:  # contiguous: HDF5 reads the hyperslab's byte runs
            return sum(math.prod(ln) for _, _, ln in plan.boxes()) * itemsize
        check_chunk_count(self.path, plan, self.chunks)
        seen = set()
        for _, fst, ln in plan.boxes():
            seen.update(itertools.product(*chunk_ranges((0,) + tuple(fst), (1,) + tuple(ln), self.chunks)))
        return sum(self._sizes.get(idx, 0) for idx in seen)
