"""Counting bytes read cold: evict files from the page cache, read ``read_bytes`` of ``/proc/PID/io``.

Used by ``dali-mesh demo`` and the benchmarks. ``read_bytes`` counts what a process pulled from
storage (page-cache hits are free), so files are evicted first; dirty pages cannot be dropped, so
each file is fsynced before ``posix_fadvise(POSIX_FADV_DONTNEED)``.
"""
from __future__ import annotations

import glob
import os
import stat
from typing import Iterable, Iterator

__all__ = ["descendant_pids", "evict", "read_bytes", "walk_files"]


def _paths(paths) -> list[str]:
    """``paths`` as a list: one path (a ``str``, ``bytes`` or ``os.PathLike``) is one path, not the
    letters of its name."""
    if isinstance(paths, (str, bytes, os.PathLike)):
        return [os.fsdecode(paths)]
    return [os.fsdecode(p) for p in paths]


def walk_files(paths: Iterable[str] | str) -> Iterator[str]:
    """Every file under ``paths`` (a Zarr store is a folder of chunk files); one path may be given
    as it is."""
    for p in _paths(paths):
        if os.path.isdir(p):
            for root, _, names in os.walk(p):
                for n in names:
                    yield os.path.join(root, n)
        else:
            yield p


def evict(paths: Iterable[str] | str) -> None:
    """Drop every regular file under ``paths`` (or the one path given) from the page cache. Opened
    read-only and non-blocking: a FIFO or device among them is passed over, never waited on."""
    for p in walk_files(paths):
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                continue
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
