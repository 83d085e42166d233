"""The speed of a warm ``pread`` by where its destination lies against its source, modulo the page.

    python benchmarks/pread_bench.py [--mib 32] [--runs 9] [--dir DIR]

A read of a file in the page cache is the kernel copying the cached pages into the caller's buffer
(``copy_to_user``, ``rep movsb`` on x86). On this project's AMD EPYC VMs that copy runs 4-7x slower
when the destination lies 1-31 bytes after the source modulo 4096, a case glibc's ``memmove`` avoids
and the kernel's copy does not; a ``malloc``'d buffer often starts 16 bytes into a page. This is why
the native reader reads a chunk's stored bytes to an address equal to their file offset modulo the
page (``PlaceLike`` in ``csrc/reader/read_units.h``). Each row: ``--mib`` MiB read from offset 0 of a
warm file into a page-aligned anonymous mapping at ``distance`` bytes, in 1 MiB ``pread`` calls;
GB/s is the median of ``--runs`` passes. Results: ``benchmarks/compressed_results.md``.

``--floors`` (issue 54: where a warm read's time goes beyond a copy in memory): ``--mib`` MiB of a warm
file moved into a page-aligned buffer by (1) ``pread`` calls of 2 MiB (what the native reader does),
(2) ``mmap`` of the range with ``MAP_POPULATE`` (the page tables filled in one call) and a copy from the
mapping, then ``munmap``, per 2 MiB, and (3) a copy of the same bytes from memory (numpy's, glibc's
``memmove``): the page cache's copy is the floor of any reader that does not keep the data in its own
memory. Results: ``benchmarks/limits_54_results.md``.
"""
from __future__ import annotations

import argparse
import mmap
import os
import platform
import statistics
import tempfile
import time

DISTANCES = (0, 1, 8, 16, 24, 31, 32, 48, 64, 128, 2048, 4064, 4095)


def measure(path: str, nbytes: int, distance: int, runs: int) -> float:
    """GB/s of reading ``nbytes`` of ``path`` (warm) into a buffer at ``distance`` bytes past a page."""
    step = 1 << 20
    buf = mmap.mmap(-1, nbytes + 2 * mmap.PAGESIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    view = memoryview(buf)
    view[:] = bytes(len(buf))  # every page present before timing
    fd = os.open(path, os.O_RDONLY)
    try:
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            for at in range(0, nbytes, step):
                n = min(step, nbytes - at)
                if os.preadv(fd, [view[distance + at:distance + at + n]], at) != n:
                    raise OSError(f"{path}: short read at byte {at}")
            times.append(time.perf_counter() - t0)
        return nbytes / statistics.median(times) / 1e9
    finally:
        os.close(fd)
        view.release()
        buf.close()


def floors(path: str, nbytes: int, runs: int) -> dict[str, float]:
    """GB/s (median of ``runs`` passes) of moving ``nbytes`` of the warm ``path`` into a buffer by pread,
    by mmap + MAP_POPULATE + copy, and by a copy from memory (see the module's docstring)."""
    import numpy as np

    step = 2 << 20
    dst = np.zeros(nbytes, np.uint8)
    src = np.fromfile(path, np.uint8, nbytes)
    fd = os.open(path, os.O_RDONLY)
    populate = getattr(mmap, "MAP_POPULATE", 0)

    def by_pread():
        for at in range(0, nbytes, step):
            os.preadv(fd, [dst[at:at + step]], at)

    def by_mmap():
        for at in range(0, nbytes, step):
            n = min(step, nbytes - at)
            m = mmap.mmap(fd, n, flags=mmap.MAP_SHARED | populate, prot=mmap.PROT_READ, offset=at)
            np.copyto(dst[at:at + n], np.frombuffer(m, np.uint8))
            m.close()

    def by_copy():
        for at in range(0, nbytes, step):
            np.copyto(dst[at:at + step], src[at:at + step])

    out = {}
    try:
        for name, fn in (("pread", by_pread), ("mmap + MAP_POPULATE + copy", by_mmap), ("copy from memory", by_copy)):
            fn()
            times = []
            for _ in range(runs):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            out[name] = nbytes / statistics.median(times) / 1e9
    finally:
        os.close(fd)
    return out


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "?")
    except OSError:
        return platform.processor() or "?"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=32)
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--dir", default=None, help="where the test file goes (default: a temporary folder)")
    ap.add_argument("--floors", action="store_true", help="pread against mmap + copy and a copy from memory")
    args = ap.parse_args(argv)
    nbytes = args.mib << 20
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        path = os.path.join(folder, "data.bin")
        with open(path, "wb") as f:
            f.write(os.urandom(nbytes))
        measure(path, nbytes, 0, 1)  # warm: in the page cache
        if args.floors:
            print(f"{args.mib} MiB warm file, 2 MiB pieces, medians of {args.runs} passes; {_cpu()}, "
                  f"{os.cpu_count()} CPUs, kernel {platform.release()}\n")
            print("| how | GB/s |")
            print("|---|---|")
            for name, gbs in floors(path, nbytes, args.runs).items():
                print(f"| {name} | {gbs:.2f} |")
            return
        print(f"{args.mib} MiB warm file, 1 MiB preads, medians of {args.runs} passes; "
              f"{_cpu()}, {os.cpu_count()} CPUs, kernel {platform.release()}")
        print()
        print("| destination - source (mod 4096), bytes | GB/s |")
        print("|---|---|")
        for d in DISTANCES:
            print(f"| {d} | {measure(path, nbytes, d, args.runs):.2f} |")


if __name__ == "__main__":
    main()
