"""Bytes and time of one rank's window reads: dali_mesh readers against DALI's numpy reader.

Data: ``--files`` .npy files of float32 ``--shape`` (default 16 x (8, 1024, 2048) = 1 GiB), rank
``--rank`` of ``--ranks`` split along each axis of ``--axes`` (default 1, 0, 2), no halo.

- cold: every file is evicted from the page cache (``posix_fadvise(POSIX_FADV_DONTNEED)``) before
  the epoch; bytes from storage are ``read_bytes`` of ``/proc/self/io`` (this process: DALI's reader
  threads included), and for dali_mesh also its own counters.
- warm: files in the page cache; the median over ``--repeats`` epochs. DALI pipelines are CPU-only
  (``device_id=None``) with ``--threads`` threads and one batch = one epoch (steady state, the
  pipeline's prefetching included); dali_mesh reads with a pool of ``--threads`` Python threads
  (``preadv`` releases the GIL), and also through a DALI parallel external source with
  ``--threads`` spawn workers.
- innermost axis: also the same data as chunked HDF5 and Zarr with chunks aligned to the split.
- ``--merge-sweep``: warm and cold cost of merging byte ranges across gaps of several sizes (how the
  default ``merge_gap`` was chosen).

Writes a markdown table to ``--out`` (default benchmarks/read_bench_results.md) and prints it.
Run: ``python benchmarks/read_bench.py`` (about 3 minutes on 2 cores; needs ~3.5 GiB free in
``--dir``; the data is deleted afterwards unless ``--keep``). ``--tiny --out /tmp/r.md``: a smoke test.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import gc
import math
import os
import platform
import shutil
import statistics
import sys
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dali_mesh import Layout, MeshInfo  # noqa: E402
from dali_mesh.formats.npy import read_npy_window  # noqa: E402
from dali_mesh.io import DEFAULT_MERGE_GAP, IOStats  # noqa: E402
from dali_mesh.io.pagecache import evict, read_bytes, walk_files  # noqa: E402
from dali_mesh.partition import take_window  # noqa: E402


# ---- measuring ----------------------------------------------------------------------------------
def proc_read_bytes() -> int:
    value = read_bytes()
    if value is None:
        raise RuntimeError("/proc/self/io has no read_bytes")
    return value


def measure_cold(method, paths):
    """``(seconds, bytes from storage)`` of one epoch of ``method`` after evicting ``paths``.

    The method's setup (a DALI pipeline build: it reads the file headers) runs after the eviction
    and counts in the bytes, not in the time; ``close`` then drops the method's pipeline and
    mappings (mapped pages cannot be evicted for the next method's cold epoch).
    """
    try:
        evict(paths)
        b0 = proc_read_bytes()
        method.setup()
        t0 = time.perf_counter()
        method.run()
        t_cold = time.perf_counter() - t0
        return t_cold, proc_read_bytes() - b0
    finally:
        method.close()
        gc.collect()


def measure_warm(methods, repeats):
    """Warm epochs, interleaved: each round runs every method once, so that a change of load on the
    machine hits all of them alike. Returns per method ``(median seconds, median of the per-round
    ratio to methods[0])``."""
    try:
        for m in methods:
            m.setup()
            m.run()
            m.run()
        times = [[] for _ in methods]
        for _ in range(repeats):
            for i, m in enumerate(methods):
                t0 = time.perf_counter()
                m.run()
                times[i].append(time.perf_counter() - t0)
        ref = times[0]
        return [(statistics.median(t), statistics.median(a / b for a, b in zip(t, ref))) for t in times]
    finally:
        for m in methods:
            m.close()
        gc.collect()


# ---- data -----------------------------------------------------------------------------------------
def make_npy(d, n, shape):
    files = []
    for i in range(n):
        p = os.path.join(d, f"sample{i:03d}.npy")
        a = np.lib.format.open_memmap(p, mode="w+", dtype=np.float32, shape=shape)
        a[...] = np.arange(shape[-1], dtype=np.float32) + i  # cheap to write, differs per file
        a[..., :7] = np.arange(math.prod(shape[:-1]), dtype=np.float32).reshape(shape[:-1] + (1,))
        a.flush()
        del a
        files.append(p)
    os.sync()
    return files


def make_chunked(d, files, shape, chunks):
    import h5py
    import zarr

    h5, zs = [], []
    for i, f in enumerate(files):
        data = np.load(f, mmap_mode="r")
        p = os.path.join(d, f"sample{i:03d}.h5")
        with h5py.File(p, "w") as h:
            h.create_dataset("x", data=data, chunks=chunks)
        h5.append(p)
        z = os.path.join(d, f"sample{i:03d}.zarr")
        arr = zarr.create_array(store=z, name="x", shape=shape, chunks=chunks, dtype="f4",
                                compressors=None, zarr_format=3)
        arr[...] = data
        zs.append(z)
        del data
    os.sync()
    return h5, zs


# ---- methods: setup() outside the timer, run() = one epoch, close() -------------------------------
class Method:
    def __init__(self, threads):
        self.threads = threads
        self.pool = None

    def setup(self):
        self.pool = cf.ThreadPoolExecutor(self.threads)

    def close(self):
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None


class Ours(Method):
    """``read_npy_window`` over the files with a pool of threads; ``reuse``: into one preallocated
    buffer per file (as DALI's reader reuses its own buffers), else a fresh ``np.empty`` per read
    (as a source does: page faults included)."""

    def __init__(self, files, region, threads, stats=None, reuse=False, **kw):
        super().__init__(threads)
        self.files, self.region, self.stats, self.kw, self.reuse = files, region, stats, kw, reuse
        self.outs = [None] * len(files)

    def setup(self):
        super().setup()
        if self.reuse:
            self.outs = [np.empty(self.region.window_shape, np.float32) for _ in self.files]

    def run(self):
        list(self.pool.map(lambda i: read_npy_window(self.files[i], self.region, out=self.outs[i],
                                                     stats=self.stats, **self.kw), range(len(self.files))))

    def close(self):
        super().close()
        self.outs = [None] * len(self.files)


class FullRead(Method):
    def __init__(self, files, region, threads):
        super().__init__(threads)
        self.files, self.region = files, region

    def run(self):
        list(self.pool.map(lambda f: take_window(np.load(f), self.region), self.files))


class DaliRoi(Method):
    def __init__(self, files, region, threads, mmap=True):
        super().__init__(threads)
        self.files, self.region, self.mmap = files, region, mmap
        self.pipe = None

    def setup(self):
        from nvidia.dali import fn, pipeline_def

        files, region = self.files, self.region

        @pipeline_def(batch_size=len(files), num_threads=self.threads, device_id=None, prefetch_queue_depth=1)
        def pipe():
            return fn.readers.numpy(file_root=os.path.dirname(files[0]),
                                    files=[os.path.basename(f) for f in files],
                                    roi_start=list(region.start), roi_end=list(region.stop),
                                    dont_use_mmap=not self.mmap, random_shuffle=False)

        self.pipe = pipe()
        self.pipe.build()

    def run(self):
        (out,) = self.pipe.run()
        assert out[0].shape() == list(self.region.window_shape)

    def close(self):
        self.pipe = None


class OursViaDali(Method):
    def __init__(self, files, layout, threads):
        super().__init__(threads)
        self.files, self.layout = files, layout
        self.pipe = None

    def setup(self):
        from nvidia.dali import pipeline_def

        from dali_mesh.pipeline.external import partitioned_source
        from dali_mesh.source import NumpySource

        self.src = src = NumpySource(self.files, self.layout, batch_size=len(self.files), shuffle=False)

        @pipeline_def(batch_size=len(self.files), num_threads=self.threads, device_id=None,
                      py_num_workers=self.threads, py_start_method="spawn")
        def pipe():
            window, _, _ = partitioned_source(src)
            return window

        with warnings.catch_warnings():  # sample id and pad flag are computed but not used here
            warnings.simplefilter("ignore")
            self.pipe = pipe()
            self.pipe.build()

    def run(self):
        (out,) = self.pipe.run()
        assert out[0].shape() == list(self.src.region.window_shape)
        try:
            self.pipe.run()
            raise AssertionError("the source should end its epoch after one batch")
        except StopIteration:
            self.pipe.reset()

    def close(self):
        self.pipe = None


class Chunked(Method):
    def __init__(self, paths, region, threads, kind, stats=None, random_access=False):
        super().__init__(threads)
        self.paths, self.region, self.kind, self.stats, self.ra = paths, region, kind, stats, random_access

    def one(self, p):
        from dali_mesh.formats.hdf5 import open_hdf5_dataset, read_hdf5_window
        from dali_mesh.formats.zarr import open_zarr_array, read_zarr_window

        if self.kind == "hdf5":
            f, ds = open_hdf5_dataset(p, "x", random_access=self.ra)
            try:
                return read_hdf5_window(ds, self.region, path=p, stats=self.stats)
            finally:
                f.close()
        return read_zarr_window(open_zarr_array(p, "x"), self.region, stats=self.stats)

    def run(self):
        list(self.pool.map(self.one, self.paths))


# ---- the benchmark --------------------------------------------------------------------------------
def gib(b):
    return f"{b / 2**30:.3f} GiB"


def _row(axis, name, window, total, t_cold, b_cold, t_warm, ratio, note=""):
    cold_bytes = "-" if b_cold is None else f"{b_cold / window:.3f}x ({100 * b_cold / total:.0f}% of data)"
    return (axis, name, cold_bytes, "-" if t_cold is None else f"{t_cold:.3f}",
            f"{t_warm * 1e3:.1f}", f"{ratio:.2f}", note)


def _bench(axis, entries, paths_of, window, total_of, args, rows):
    """entries: ``(name, make_method, stats or None, cold?)``; the first is the warm reference."""
    n_epochs = args.repeats + 2
    colds = []
    for name, make, st, do_cold in entries:
        colds.append(measure_cold(make(), paths_of(name)) if do_cold else (None, None))
    stats = [st for _, _, st, _ in entries]
    for st in stats:
        if st is not None:
            st.__init__()
    warm = measure_warm([make() for _, make, _, _ in entries], args.repeats)
    for (name, _, st, do_cold), (t_cold, b_cold), (t_warm, ratio) in zip(entries, colds, warm):
        note = ""
        if st is not None:
            note = f"own counter {st.bytes_read / n_epochs / window:.4f}x in {st.read_calls // n_epochs} calls/epoch"
        if not do_cold:
            note = "read in DALI's worker processes (not in this process's /proc/self/io); DALI copies via shared memory"
        rows.append(_row(axis, name, window, total_of(name), t_cold, b_cold, t_warm, ratio, note))


def bench_axes(args, files, rows):
    shape = tuple(args.shape)
    total = sum(os.path.getsize(f) for f in files)
    for axis in args.axes:
        layout = Layout(MeshInfo((args.ranks,), ("model_parallel",), (args.rank,)), shard={"model_parallel": axis})
        region = layout.region(shape)
        window = region.size * 4 * len(files)
        T = args.threads
        st = [IOStats() for _ in range(3)]
        entries = [
            ("DALI readers.numpy ROI, mmap (default)", lambda: DaliRoi(files, region, T, True), None, True),
            ("dali_mesh read_npy_window, preadv, reused buffers",
             lambda: Ours(files, region, T, stats=st[0], reuse=True, method="preadv"), st[0], True),
            ("dali_mesh read_npy_window, auto (default), fresh np.empty buffers",
             lambda: Ours(files, region, T, stats=st[1]), st[1], True),
            ("dali_mesh read_npy_window, mmap, reused buffers",
             lambda: Ours(files, region, T, stats=st[2], reuse=True, method="mmap"), st[2], True),
            ("DALI readers.numpy ROI, dont_use_mmap", lambda: DaliRoi(files, region, T, False), None, True),
            ("full read + slice (np.load)", lambda: FullRead(files, region, T), None, True),
        ]
        if args.via_dali:
            entries.append((f"dali_mesh NumpySource via DALI parallel external source ({T} workers)",
                            lambda: OursViaDali(files, layout, T), None, False))
        _bench(axis, entries, lambda name: files, window, lambda name: total, args, rows)
        print(f"axis {axis} done", file=sys.stderr, flush=True)


def bench_chunked(args, files, rows):
    shape = tuple(args.shape)
    axis = len(shape) - 1
    chunks = (1,) + tuple(shape[1:-1]) + (shape[-1] // args.ranks,)  # one plane of one rank's columns
    h5, zs = make_chunked(args.dir, files, shape, chunks)
    layout = Layout(MeshInfo((args.ranks,), ("model_parallel",), (args.rank,)), shard={"model_parallel": axis})
    region = layout.region(shape)
    window = region.size * 4 * len(files)
    T = args.threads
    st = [IOStats() for _ in range(3)]
    names = [f"dali_mesh HDF5, chunks {chunks} (uncompressed)",
             f"dali_mesh HDF5, chunks {chunks} (uncompressed), random_access",
             f"dali_mesh Zarr v3, chunks {chunks} (uncompressed)"]
    entries = [
        ("DALI readers.numpy ROI, mmap (default), on the .npy files", lambda: DaliRoi(files, region, T, True), None, True),
        (names[0], lambda: Chunked(h5, region, T, "hdf5", st[0]), st[0], True),
        (names[1], lambda: Chunked(h5, region, T, "hdf5", st[1], random_access=True), st[1], True),
        (names[2], lambda: Chunked(zs, region, T, "zarr", st[2]), st[2], True),
    ]
    paths = {names[0]: h5, names[1]: h5, names[2]: zs}
    sub = []
    _bench(axis, entries, lambda n: paths.get(n, files), window,
           lambda n: sum(os.path.getsize(p) for p in walk_files(paths.get(n, files))), args, sub)
    rows += sub[1:]  # the reference row repeats the .npy table's
    for p in h5:
        os.remove(p)
    for z in zs:
        shutil.rmtree(z)


def merge_sweep(args):
    """Rows of 2 KiB windows separated by gaps of several sizes: separate reads vs merged reads."""
    from dali_mesh.partition import Region

    out = []
    unit = 2048
    d = os.path.join(args.dir, "sweep")
    os.makedirs(d, exist_ok=True)
    for gap in (256, 1024, 4096, 8192, 16384, 65536):
        row = unit + gap
        nrows = (64 << 20) // row
        p = os.path.join(d, f"gap{gap}.npy")
        a = np.lib.format.open_memmap(p, mode="w+", dtype=np.uint8, shape=(nrows, row))
        a[...] = 1
        a.flush()
        del a
        os.sync()
        region = Region((0, 0), (nrows, row), (0, 0), (nrows, unit), (0, 0), (nrows, unit), "constant")
        configs = ({"merge_gap": 0, "page_merge": False, "method": "preadv"},
                   {"merge_gap": gap, "method": "preadv"}, {"method": "preadv"})
        colds = [measure_cold(Ours([p], region, 1, **kw), [p]) for kw in configs]
        warms = measure_warm([Ours([p], region, 1, **kw) for kw in configs], args.repeats)
        res = [(c, b, w) for (c, b), (w, _) in zip(colds, warms)]
        cold_ms = " / ".join(f"{c * 1e3:.0f}" for c, _, _ in res)
        warm_ms = " / ".join(f"{w * 1e3:.1f}" for _, _, w in res)
        cold_b = " / ".join(f"{b / (nrows * unit):.2f}x" for _, b, _ in res)
        out.append((gap, nrows, warm_ms, cold_ms, cold_b))
        os.remove(p)
        print(f"gap {gap} done", file=sys.stderr, flush=True)
    shutil.rmtree(d)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default="/tmp/dali_mesh_read_bench")
    ap.add_argument("--files", type=int, default=16)
    ap.add_argument("--shape", type=int, nargs="+", default=[8, 1024, 2048])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--rank", type=int, default=1)
    ap.add_argument("--axes", type=int, nargs="+", default=[1, 0, 2])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--no-via-dali", dest="via_dali", action="store_false")
    ap.add_argument("--no-chunked", dest="chunked", action="store_false")
    ap.add_argument("--merge-sweep", action="store_true")
    ap.add_argument("--only-sweep", action="store_true", help="run the merge-gap sweep only")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "read_bench_results.md"))
    ap.add_argument("--tiny", action="store_true",
                    help="2 files of (2, 16, 1024), axis 1, 1 repeat, no parallel source, no HDF5/Zarr: a smoke test")
    args = ap.parse_args(argv)
    if args.tiny:
        args.files, args.shape, args.axes, args.repeats = 2, [2, 16, 1024], [1], 1
        args.via_dali = args.chunked = False

    need = args.files * math.prod(args.shape) * 4 * 3.5
    os.makedirs(args.dir, exist_ok=True)
    free = shutil.disk_usage(args.dir).free
    if free < need:
        sys.exit(f"{args.dir} has {gib(free)} free; this benchmark needs {gib(need)}: pass --dir elsewhere or --files fewer")
    lines = [
        "# read_bench results",
        "",
        f"`python benchmarks/read_bench.py {' '.join(argv if argv is not None else sys.argv[1:])}`".replace(" `", "`"),
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}, numpy {np.__version__}; data in {args.dir} "
        f"({os.statvfs(args.dir).f_bsize}-byte blocks); {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        f"Data: {args.files} x float32 {tuple(args.shape)} .npy "
        f"({gib(args.files * math.prod(args.shape) * 4)}); rank {args.rank} of {args.ranks}; {args.threads} threads; "
        f"warm = median of {args.repeats} epochs.",
        "",
    ]
    try:
        rows = []
        if not args.only_sweep:
            files = make_npy(args.dir, args.files, tuple(args.shape))
            # load DALI's libraries and h5py/zarr before any cold measurement (their .so files count
            # in read_bytes too)
            measure_cold(DaliRoi(files[:1], Layout(MeshInfo((1,), ("m",), (0,))).region(tuple(args.shape)), 1), [])
            import h5py  # noqa: F401
            import zarr  # noqa: F401

            bench_axes(args, files, rows)
            if args.chunked and len(args.shape) == 3:
                bench_chunked(args, files, rows)
        if rows:
            lines += [
                "| split axis | reader | cold bytes from storage / window bytes | cold epoch s | warm epoch ms | warm time / DALI ROI mmap (median of per-round ratios) | notes |",
                "|---|---|---|---|---|---|---|",
            ]
            for r in rows:
                lines.append("| " + " | ".join(str(x) for x in r) + " |")
        if args.merge_sweep or args.only_sweep:
            sweep = merge_sweep(args)
            lines += [
                "",
                "Merge-gap sweep: 64 MiB uint8 .npy, window = the first 2 KiB of every row, rows separated by `gap` bytes;",
                "each cell: separate / merged / default. `separate` = merge_gap 0, page_merge off (one preadv per row);",
                "`merged` = merge_gap = gap (one range, gaps read into scratch); `default` = merge_gap "
                f"{DEFAULT_MERGE_GAP} with page_merge (gaps that add no page are merged too). All with method='preadv'.",
                "",
                "| gap bytes | rows | warm ms | cold ms | cold bytes from storage / window bytes |",
                "|---|---|---|---|---|",
            ]
            for r in sweep:
                lines.append("| " + " | ".join(str(x) for x in r) + " |")
    finally:
        if not args.keep:
            shutil.rmtree(args.dir, ignore_errors=True)
    text = "\n".join(lines) + "\n"
    with open(args.out, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
