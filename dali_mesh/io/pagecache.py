"""Counting bytes read cold: evict files from the page cache, read ``read_bytes`` of ``/proc/PID/io``.

Used by ``dali-mesh demo`` and the benchmarks. ``read_bytes`` counts what a process pulled from
storage (page-cache hits are free), so files are evicted first; dirty pages cannot be dropped, so
each file is fsynced before ``posix_fadvise(POSIX_FADV_DONTNEED)``.
"""
from __future__ import annotations

import glob
import os
from typing import Iterable, Iterator

__all__ = ["descendant_pids", "evict", "read_bytes", "walk_files"]


def walk_files(paths: Iterable[str]) -> Iterator[str]:
    """Every regular file under ``paths`` (a Zarr store is a folder of chunk files)."""
    for p in paths:
        if os.path.isdir(p):
            for root, _, names in os.walk(p):
                for n in names:
                    yield os.path.join(root, n)
        else:
            yield p


def evict(paths: Iterable[str]) -> None:
    """Drop every file under ``paths`` from the page cache."""
    for p in walk_files(paths):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)  # dirty pages cannot be dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def descendant_pids(pid: int) -> list[int]:
    """The processes ``pid`` started, and theirs (DALI's worker processes, say)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for task in glob.glob(f"/proc/{p}/task/*/children"):
            try:
                kids = [int(k) for k in open(task).read().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


def read_bytes(pids: Iterable[int] | None = None) -> int | None:
    """Bytes these processes (this one by default) pulled from storage, or None where the kernel
    does not say."""
    if not os.path.exists("/proc/self/io"):
        return None
    total = 0
    for pid in [os.getpid()] if pids is None else pids:
        try:
            for line in open(f"/proc/{pid}/io"):
                if line.startswith("read_bytes:"):
                    total += int(line.split()[1])
        except OSError:
            continue  # a helper process that has exited read nothing we need
    return total
