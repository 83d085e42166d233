"""The bytes a ranged read of a local Icechunk repository takes from the disk (issue 43's local rows).

    python benchmarks/icechunk_local_reads.py [--folder DIR]

Writes a repository of one (1, 4, 721, 1440) float32 chunk (Blosc lz4 5 + shuffle, random values: about
15 MB stored) with the ``icechunk`` library, then reads ranges of that chunk through the library's store
(``get`` with a ``RangeByteRequest``: what the native reader's ranged reads of a repository call) and,
for comparison, with one ``os.pread`` of the chunk's file; before each read every file of the repository
is evicted from the page cache (``fsync`` + ``posix_fadvise(POSIX_FADV_DONTNEED)``, :mod:`dali_mesh.io.pagecache`), and the bytes the disk gave are
``/proc/self/io``'s ``read_bytes`` after minus before. What a reader asks of a local repository is not
what the disk reads: the rows of virtual_results.md that count a local Icechunk store's bytes count both.
"""
from __future__ import annotations

import argparse
import asyncio
import glob
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.read_bench import proc_read_bytes as _disk_bytes  # noqa: E402
from dali_mesh.io.pagecache import evict  # noqa: E402


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--folder", help="where the repository is written (default: a new temporary folder)")
    args = ap.parse_args(argv)
    import icechunk
    import zarr
    import zarr.core.buffer as zbuf
    from zarr.abc.store import RangeByteRequest

    folder = args.folder or tempfile.mkdtemp(prefix="dm_icechunk_reads_")
    path = os.path.join(folder, "repo")
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(path))
    session = repo.writable_session("main")
    x = np.random.default_rng(0).standard_normal((1, 4, 721, 1440)).astype("f4")
    a = zarr.create_array(session.store, name="x", shape=x.shape, chunks=x.shape, dtype="f4",
                          compressors=zarr.codecs.BloscCodec(cname="lz4", clevel=5, shuffle="shuffle"))
    a[...] = x
    session.commit("one chunk")
    store = icechunk.Repository.open(icechunk.local_filesystem_storage(path)).readonly_session("main").store
    asyncio.run(store.get("x/zarr.json", zbuf.default_buffer_prototype()))  # the snapshot and its manifest, read once
    (chunk,) = glob.glob(os.path.join(path, "chunks", "*"))
    size = os.path.getsize(chunk)
    print(f"icechunk {icechunk.__version__}; one chunk of {size} bytes")
    print("| range | at | the library's store: disk bytes | one pread: disk bytes |")
    print("|---|---|---|---|")
    for lo, n in [(0, 4096), (size // 2, 64 << 10), (size // 4, 1 << 20), (size // 2, 4 << 20)]:
        evict(path)
        before = _disk_bytes()
        got = asyncio.run(store.get("x/c/0/0/0/0", zbuf.default_buffer_prototype(), RangeByteRequest(lo, lo + n)))
        library = _disk_bytes() - before
        assert len(got.to_bytes()) == n
        evict(path)
        fd = os.open(chunk, os.O_RDONLY)
        try:
            before = _disk_bytes()
            assert len(os.pread(fd, n, lo)) == n
            plain = _disk_bytes() - before
        finally:
            os.close(fd)
        print(f"| {n} | {lo} | {library} ({library / n:.2f}x) | {plain} ({plain / n:.2f}x) |")


if __name__ == "__main__":
    main()
