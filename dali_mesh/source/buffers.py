"""Output buffers of a source, recycled when nobody holds them any more."""
from __future__ import annotations

import sys

import numpy as np

__all__ = ["BufferPool"]


class BufferPool:
    """At most ``size`` output arrays of one process, handed out again once nobody holds them.

    Fresh large arrays cost a page fault per page (glibc hands 16 MiB blocks back to the kernel
    when they are freed); DALI's worker copies each batch into shared memory and drops it, so a
    window returned two batches ago is free again. An array is reused only when its reference
    count shows that the pool alone holds it (a caller's reference, a view or a memoryview of it
    keeps it out), so no one ever sees their array overwritten.
    """

    def __init__(self, size: int) -> None:
        self.size = int(size)
        self._arrays: list[np.ndarray] = []

    def empty(self, shape, dtype) -> np.ndarray:
        shape, dtype = tuple(shape), np.dtype(dtype)
        for buf in self._arrays:
            # held by: the pool's list, this loop variable and getrefcount's argument
            if sys.getrefcount(buf) <= 3 and buf.shape == shape and buf.dtype == dtype:
                return buf
        buf = np.empty(shape, dtype)
        if len(self._arrays) >= self.size:
            self._arrays.pop(0)
        self._arrays.append(buf)
        return buf
