"""Compressed chunks (issue 15): the native reader against tensorstore, zarr-python and h5py on the
same files and windows, side by side in one run, warm and cold.

    python benchmarks/compressed_bench.py [--steps 16] [--runs 3] [--threads 1,2] [--cases ...] [--levels 4]

Data: ``--steps`` × (``--levels`` = 4, 721, 1440) float32 (ERA5-like smooth fields plus noise, so that codecs
compress as on real data), rank 1 of 4, latitude split (torch.chunk: rows 181..361), one
sample per step, batch 2. Cases (``--cases``, comma-separated):
  blosc_aligned   Zarr v2, Blosc(lz4, 5, shuffle), chunks (1, 4, 181, 1440): one chunk per window
  zstd_aligned    Zarr v2, Zstd(3), the same chunks
  blosc_globe     Zarr v2, Blosc(lz4, 5, shuffle), chunks (1, 4, 721, 1440): whole fields
  zstd_globe      Zarr v2, Zstd(3), whole fields
  h5_aligned      HDF5 deflate(4) + shuffle (the NetCDF4 layout), chunks (1, 4, 181, 1440)
  h5_globe        HDF5 deflate(4) + shuffle, chunks (1, 4, 721, 1440)
Loaders (each reads exactly the rank's window of every step, in order):
  native       dali_mesh.pipeline.native.read_windows (CPU pipeline, num_threads = threads,
               prefetch_queue_depth=1: no batch read ahead, as the peers)
  native_q2    the same with DALI's default prefetch_queue_depth=2 (the next batch is read while this
               one is consumed)
  tensorstore  tensorstore.open (zarr / no HDF5), window reads of a batch issued together, its
               data_copy_concurrency and file_io_concurrency limited to `threads`
  zarr         zarr-python 3, array[t, :, lat0:lat1, :] per step, threading.max_workers = threads
  h5py_window  h5py, dataset[t, :, lat0:lat1, :] per step (one thread whatever `threads` says: h5py
               holds a global lock)
  h5py_whole   h5py, dataset[t] then the band: what PhysicsNeMo's ERA5HDF5Datapipe reads per rank
Per run, thread count, case and loader: cold = files evicted (posix_fadvise DONTNEED), one epoch
timed, bytes = read_bytes of this process; warm = median of 3 further epochs; then one more epoch,
untimed, checks every loader's windows against numpy. A timed epoch ends with each batch as the
loader hands it over (DALI's output batch; tensorstore's, zarr's and h5py's new arrays), no copy. Medians over
``--runs``; the ratio columns are medians of per-run ratios to the reference loader (tensorstore
for Zarr, h5py_whole for HDF5), measured in the same run.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks._common import pipeline_epoch  # noqa: E402
from dali_mesh import Layout, MeshInfo  # noqa: E402
from dali_mesh.io.pagecache import evict, read_bytes  # noqa: E402

SHAPE = (4, 721, 1440)
BATCH = 2
CASES = ("blosc_aligned", "zstd_aligned", "blosc_globe", "zstd_globe", "h5_aligned", "h5_globe")


def _fields(steps: int) -> np.ndarray:
    """Smooth ERA5-like fields (large-scale waves, a trend by latitude) plus noise at 1e-3 of the signal."""
    rng = np.random.default_rng(0)
    lat = np.linspace(-np.pi / 2, np.pi / 2, SHAPE[1])[:, None]
    lon = np.linspace(0, 2 * np.pi, SHAPE[2], endpoint=False)[None, :]
    out = np.empty((steps,) + SHAPE, np.float32)
    for t in range(steps):
        for c in range(SHAPE[0]):
            base = 250 + 40 * np.cos(lat) + 5 * np.sin(3 * lon + 0.2 * t + c) * np.cos(2 * lat)
            out[t, c] = base + rng.standard_normal(SHAPE[1:]).astype(np.float32) * 0.05
    return out


def _write(case: str, folder: str, data: np.ndarray) -> str:
    import numcodecs
    import zarr

    chunks = (1, SHAPE[0], 181, 1440) if case.endswith("aligned") else (1,) + SHAPE
    if case.startswith("h5"):
        import h5py

        path = os.path.join(folder, f"{case}.h5")
        with h5py.File(path, "w") as f:
            f.create_dataset("fields", data=data, chunks=chunks, compression="gzip", compression_opts=4, shuffle=True)
        return path
    comp = numcodecs.Blosc("lz4", 5, numcodecs.Blosc.SHUFFLE) if case.startswith("blosc") else numcodecs.Zstd(3)
    path = os.path.join(folder, f"{case}.zarr")
    z = zarr.create_array(path, shape=data.shape, chunks=chunks, dtype="f4", compressors=comp, zarr_format=2)
    z[:] = data
    return path


def _files_of(path: str) -> list[str]:
    if os.path.isfile(path):
        return [path]
    return [os.path.join(r, f) for r, _, fs in os.walk(path) for f in fs]


def _layout():
    return Layout(MeshInfo((4,), ("model_parallel",), (1,)), shard={"model_parallel": 1})


class _Native:
    def __init__(self, case, path, steps, threads, depth=1):
        from nvidia.dali import pipeline_def

        from dali_mesh.pipeline import native
        from dali_mesh.source import HDF5Source, ZarrSource

        kind = HDF5Source if case.startswith("h5") else ZarrSource
        src = kind([path], "fields" if case.startswith("h5") else None, _layout(), batch_size=BATCH, shuffle=False)
        self.region = src.region

        @pipeline_def(batch_size=BATCH, num_threads=threads, device_id=None, prefetch_queue_depth=depth)
        def pipe():
            return native.read_windows(src, fallback=False)[0]

        self.pipe = pipe()
        self.pipe.build()
        self.steps = steps

    def epoch(self, keep=False):
        return pipeline_epoch(self.pipe, keep)


class _TensorStore:
    def __init__(self, case, path, steps, threads, region):
        import tensorstore as ts

        ctx = ts.Context({"data_copy_concurrency": {"limit": threads}, "file_io_concurrency": {"limit": threads},
                          "cache_pool": {"total_bytes_limit": 0}})
        self.arr = ts.open({"driver": "zarr", "kvstore": {"driver": "file", "path": path}}, context=ctx,
                           read=True).result()
        self.steps, self.sl = steps, tuple(slice(a, b) for a, b in zip(region.start, region.stop))

    def epoch(self, keep=False):
        out = []
        for t0 in range(0, self.steps, BATCH):
            futs = [self.arr[(t,) + self.sl].read() for t in range(t0, t0 + BATCH)]
            out.append(futs[0].result())
            for f in futs[1:]:
                f.result()
        return out


class _Zarr:
    def __init__(self, case, path, steps, threads, region):
        import zarr

        zarr.config.set({"threading.max_workers": threads})
        self.arr = zarr.open_array(path, mode="r")
        self.steps, self.sl = steps, tuple(slice(a, b) for a, b in zip(region.start, region.stop))

    def epoch(self, keep=False):
        return [self.arr[(t,) + self.sl] for t in range(0, self.steps, 1)][::BATCH]


class _H5:
    def __init__(self, case, path, steps, threads, region, whole):
        import h5py

        self.f = h5py.File(path, "r")
        self.ds = self.f["fields"]
        self.steps, self.whole = steps, whole
        self.sl = tuple(slice(a, b) for a, b in zip(region.start, region.stop))

    def epoch(self, keep=False):
        out = []
        for t in range(self.steps):
            w = self.ds[t][self.sl] if self.whole else self.ds[(t,) + self.sl]
            if t % BATCH == 0:
                out.append(np.ascontiguousarray(w))
        return out


def time_epochs(obj, path: str, r: dict) -> None:
    """One cold epoch of ``obj`` (the files of ``path`` evicted first: its time and the bytes this
    process read from storage) and the median of 3 warm ones, appended to ``r``'s lists."""
    for f in _files_of(path):
        evict(f)
    b0, t0 = read_bytes(), time.perf_counter()
    obj.epoch()
    r["cold"].append(time.perf_counter() - t0)
    r["bytes"].append(read_bytes() - b0)
    warm = []
    for _ in range(3):
        t0 = time.perf_counter()
        obj.epoch()
        warm.append(time.perf_counter() - t0)
    r["warm"].append(statistics.median(warm))


def result_row(key, r: dict, ref: dict, bytes_cell: str) -> str:
    """A results table row: ``key`` (threads, case, loader), the medians of ``r``'s cold and warm
    epochs, ``bytes_cell``, and the medians of the per-run ratios to ``ref``'s."""
    ratio = lambda k: statistics.median(a / b for a, b in zip(r[k], ref[k]))  # noqa: E731
    return (f"| {' | '.join(map(str, key))} | {statistics.median(r['cold']):.3f} | {bytes_cell} | "
            f"{statistics.median(r['warm']):.3f} | {ratio('cold'):.2f}x | {ratio('warm'):.2f}x |")


def _loaders(case):
    first = ["native", "native_q2"]
    return first + (["h5py_window", "h5py_whole"] if case.startswith("h5") else ["tensorstore", "zarr"])


def _make(loader, case, path, steps, threads, region):
    if loader.startswith("native"):
        return _Native(case, path, steps, threads, depth=2 if loader == "native_q2" else 1)
    if loader == "tensorstore":
        return _TensorStore(case, path, steps, threads, region)
    if loader == "zarr":
        return _Zarr(case, path, steps, threads, region)
    return _H5(case, path, steps, threads, region, whole=loader == "h5py_whole")


def main(argv=None) -> None:
    global SHAPE
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--dir", default=None, help="where to write the data (default: a temporary folder)")
    ap.add_argument("--levels", type=int, default=SHAPE[0], help="fields per step (channels; 1: a surface variable)")
    args = ap.parse_args(argv)
    SHAPE = (args.levels,) + SHAPE[1:]
    threads = [int(t) for t in args.threads.split(",")]
    cases = args.cases.split(",")
    folder = args.dir or tempfile.mkdtemp(prefix="dm_compressed_bench_")
    data = _fields(args.steps)
    region = _layout().region(SHAPE)
    paths = {c: _write(c, folder, data) for c in cases}
    want = [data[t][tuple(slice(a, b) for a, b in zip(region.start, region.stop))] for t in range(0, args.steps, BATCH)]
    window_bytes = want[0].nbytes * args.steps
    results = {}  # (threads, case, loader) -> {"cold": [], "warm": [], "bytes": []}
    try:
        for run in range(args.runs):
            for th in threads:
                for case in cases:
                    for loader in _loaders(case):
                        r = results.setdefault((th, case, loader), {"cold": [], "warm": [], "bytes": []})
                        obj = _make(loader, case, paths[case], args.steps, th, region)
                        time_epochs(obj, paths[case], r)
                        got = obj.epoch(keep=True)  # every loader's windows checked, untimed
                        assert len(got) == len(want), (loader, case, len(got))
                        for g, w in zip(got, want):
                            np.testing.assert_array_equal(np.asarray(g), w, err_msg=f"{loader} {case}")
                        del obj
                print(f"run {run + 1}/{args.runs} done", file=sys.stderr)
    finally:
        if args.dir is None:
            shutil.rmtree(folder, ignore_errors=True)
    print(f"{args.steps} x {SHAPE} float32, rank 1 of 4 (latitude rows {region.start[1]}..{region.stop[1]}), "
          f"batch {BATCH}, medians of {args.runs} runs (warm: median of 3 epochs each)\n")
    print("| threads | case | loader | cold epoch s | cold bytes / window | warm epoch s | cold vs ref | warm vs ref |")
    print("|---|---|---|---|---|---|---|---|")
    for (th, case, loader), r in results.items():
        ref = "h5py_whole" if case.startswith("h5") else "tensorstore"
        rr = results.get((th, case, ref)) or results.get((1, case, ref))
        print(result_row((th, case, loader), r, rr, f"{statistics.median(r['bytes']) / window_bytes:.2f}x"))


if __name__ == "__main__":
    main()
