"""The native reader (fn.dali_mesh.read_windows) against DALI's fn.readers.numpy with the same ROI and
against partitioned_source, side by side in one run, warm and cold.

    python benchmarks/native_read_bench.py [--files 16] [--shape 8,1024,2048] [--runs 3] [--threads 1,2]

Rank 1 of 4, H (axis 1) split, batch 2, CPU pipelines (device_id=None). Per run, thread count and
loader: a pipeline is built; cold: the files are evicted (posix_fadvise DONTNEED after fsync) and
one epoch is timed, bytes from storage = ``read_bytes`` of this process and its DALI workers; warm:
the next epochs (files now cached) are timed, median of ``--warm-epochs``. Epoch time = first
``run()`` to the last batch (pipeline build excluded). Loaders:
  native       dali_mesh.pipeline.native.read_windows(NumpySource): ``num_threads`` = threads
  native_noprefetch  the same with prefetch=False (no POSIX_FADV_WILLNEED of the batch's ranges)
  dali_roi     fn.readers.numpy(roi_start, roi_end) (default mmap): ``num_threads`` = threads
  partitioned  dali_mesh partitioned_source (parallel external source): ``py_num_workers`` = threads
  memcpy, pread  floors with no DALI (:class:`Floor`): the window's bytes copied from memory / read with
               ``os.preadv`` by ``threads`` threads (``--loaders native,memcpy,pread --floor memcpy``:
               the ratio column against the memcpy floor instead of dali_roi)
Medians over ``--runs``; the ratio column is the median of per-run ratios to dali_roi.

``--era5``: instead, an ERA5-like HDF5 file ``(T, C, 721, 1440)`` float32 (contiguous), latitude
split over 4 (rank 1), against a PhysicsNeMo-style loader (a parallel external source reading
``f["fields"][t]`` whole with h5py, then keeping the band) and HDF5Source via partitioned_source:
    python benchmarks/native_read_bench.py --era5 [--steps 16] [--channels 4]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks._common import make_npy_samples  # noqa: E402
from dali_mesh import Layout, MeshInfo  # noqa: E402
from dali_mesh.io.pagecache import descendant_pids, evict, read_bytes  # noqa: E402
from dali_mesh.partition import take_window  # noqa: E402
from dali_mesh.source import HDF5Source, NumpySource  # noqa: E402




class PhysicsNeMoStyle:
    """A parallel external source as PhysicsNeMo's ERA5 datapipe reads: the whole step, then the band."""

    def __init__(self, path, region, steps, batch):
        self.path, self.region, self.steps, self.batch = path, region, steps, batch
        self._f = None

    def __getstate__(self):
        return {**self.__dict__, "_f": None}

    def __call__(self, info):
        import h5py

        if info.idx_in_epoch >= self.steps:
            raise StopIteration
        if self._f is None:
            self._f = h5py.File(self.path, "r")
        full = self._f["fields"][info.idx_in_epoch]
        return np.ascontiguousarray(take_window(full, self.region))


class Floor:
    """The bounds of issue 54, with no DALI and no planning: the window's bytes of every sample moved by
    ``threads`` threads (a pool, each batch's byte ranges split among them; numpy's copy and ``os.preadv``
    release the interpreter lock), into buffers made once.
      memcpy  from the samples held in memory (loaded once, untimed): a warm reader's floor
      pread   ``os.preadv`` of the same ranges from the files: cold, a parallel read of the window's bytes
              with the same threads; warm, the page cache's copy plus one system call per range
    Only ``.npy`` samples whose window is a box of C-order ranges (the H split here)."""

    def __init__(self, kind, files, region, threads, batch):
        from concurrent.futures import ThreadPoolExecutor

        self.kind, self.files, self.batch = kind, files, batch
        first = np.load(files[0], mmap_mode="r")
        self.header = first.offset
        shape, item = first.shape, first.dtype.itemsize
        inner = int(np.prod(shape[2:])) * item
        rows = region.stop[1] - region.start[1]
        # the window of a (C, H, ...) sample split on H: one range of ``rows`` rows per channel
        self.ranges = [((c * shape[1] + region.start[1]) * inner, rows * inner) for c in range(shape[0])]
        self.out = [np.empty((len(self.ranges), rows * inner), np.uint8) for _ in range(batch)]
        self.pool = ThreadPoolExecutor(threads)
        self.memory = [np.fromfile(f, np.uint8) for f in files] if kind == "memcpy" else None
        self.fds = [os.open(f, os.O_RDONLY) for f in files] if kind == "pread" else None

    def _move(self, job):
        i, b, k = job
        off, n = self.ranges[k]
        dst = self.out[b][k]
        if self.memory is not None:
            start = self.header + off
            np.copyto(dst, self.memory[i][start:start + n])
        elif os.preadv(self.fds[i], [dst], self.header + off) != n:
            raise RuntimeError(f"{self.files[i]}: a short read")

    def epoch(self):
        for first in range(0, len(self.files) - self.batch + 1, self.batch):
            jobs = [(first + b, b, k) for b in range(self.batch) for k in range(len(self.ranges))]
            list(self.pool.map(self._move, jobs))
        return [out.view(np.float32) for out in self.out]

    def close(self):
        self.pool.shutdown()
        for fd in self.fds or ():
            os.close(fd)


def build(loader, files, source, region, threads, batch):
    from nvidia.dali import fn, pipeline_def, types

    if loader in ("memcpy", "pread"):
        return Floor(loader, files, region, threads, batch)

    from dali_mesh.pipeline import native
    from dali_mesh.pipeline.external import partitioned_source

    if loader.startswith("native"):
        @pipeline_def(batch_size=batch, num_threads=threads, device_id=None, prefetch_queue_depth=1)
        def pipe():
            return native.read_windows(source, fallback=False, prefetch=loader != "native_noprefetch")[0]
    elif loader == "dali_roi":
        @pipeline_def(batch_size=batch, num_threads=threads, device_id=None, prefetch_queue_depth=1)
        def pipe():
            return fn.readers.numpy(file_root=os.path.dirname(files[0]),
                                    files=[os.path.basename(f) for f in files],
                                    roi_start=list(region.start), roi_end=list(region.stop),
                                    random_shuffle=False, name="r")
    elif loader == "physicsnemo":
        @pipeline_def(batch_size=batch, num_threads=1, device_id=None, py_num_workers=threads,
                      py_start_method="spawn", prefetch_queue_depth=1)
        def pipe():
            return fn.external_source(PhysicsNeMoStyle(files[0], region, source.num_samples, batch),
                                      batch=False, parallel=True, dtype=types.FLOAT, ndim=3)
    else:
        @pipeline_def(batch_size=batch, num_threads=1, device_id=None, py_num_workers=threads,
                      py_start_method="spawn", prefetch_queue_depth=1)
        def pipe():
            return partitioned_source(source)[0]
    p = pipe()
    p.build()
    return p


def make_era5(folder, steps, channels):
    import h5py

    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"era5_{steps}x{channels}.h5")
    if not os.path.exists(path):
        with h5py.File(path, "w") as f:
            ds = f.create_dataset("fields", (steps, channels, 721, 1440), np.float32)
            for t in range(steps):
                ds[t] = np.random.default_rng(t).standard_normal((channels, 721, 1440), dtype=np.float32)
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    return path


def h5py_step(path, t):
    import h5py

    with h5py.File(path, "r") as f:
        return f["fields"][t]


def run_epoch(p, loader, n_batches):
    """Seconds for one epoch; the first batch of every loader is checked for shape."""
    t0 = time.perf_counter()
    if isinstance(p, Floor):
        out = p.epoch()
        return time.perf_counter() - t0, out
    for _ in range(n_batches):
        out = p.run()
    if loader != "dali_roi":  # sources end their epoch: DALI needs the StopIteration and a reset
        try:
            p.run()
            raise RuntimeError(f"{loader}: the epoch did not end after {n_batches} batches")
        except StopIteration:
            p.reset()
    seconds = time.perf_counter() - t0
    return seconds, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=16)
    ap.add_argument("--shape", default="8,1024,2048")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--warm-epochs", type=int, default=3)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--loaders", default="native,dali_roi,partitioned")
    ap.add_argument("--floor", default="dali_roi", help="the loader the ratio columns compare against")
    ap.add_argument("--dir", default="/tmp/dali_mesh_native_bench")
    ap.add_argument("--era5", action="store_true", help="ERA5-like HDF5 instead of .npy files")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--channels", type=int, default=4)
    args = ap.parse_args()
    os.environ["PYTHONPATH"] = os.pathsep.join([os.path.join(os.path.dirname(__file__), ".."),
                                                os.environ.get("PYTHONPATH", "")])
    layout = Layout(MeshInfo((4,), ("model_parallel",), (1,)), shard={"model_parallel": 1})
    if args.era5:
        files, shape = [make_era5(args.dir, args.steps, args.channels)], (args.channels, 721, 1440)
        region = layout.region(shape)
        source = HDF5Source(files, "fields", layout, batch_size=args.batch_size, shuffle=False)
        loaders = ["native", "partitioned", "physicsnemo"] if args.loaders == ap.get_default("loaders") \
            else args.loaders.split(",")
        n_samples = args.steps
    else:
        shape = tuple(int(s) for s in args.shape.split(","))
        files = make_npy_samples(args.dir, args.files, shape)
        region = layout.region(shape)
        source = NumpySource(files, layout, batch_size=args.batch_size, shuffle=False)
        loaders = args.loaders.split(",")
        n_samples = len(files)
    window_bytes = int(np.prod(region.window_shape)) * 4 * n_samples
    n_batches = n_samples // args.batch_size
    threads = [int(t) for t in args.threads.split(",")]

    # correctness first: the native window of the first batch equals the numpy oracle
    p = build("native", files, source, region, 1, args.batch_size)
    out = p.run()
    first = h5py_step(files[0], 0) if args.era5 else np.load(files[0])
    np.testing.assert_array_equal(np.array(out[0][0]), take_window(first, region))
    del p

    res = {}  # (threads, loader) -> list of (cold s, cold bytes, warm s)
    for run in range(args.runs):
        for t in threads:
            for loader in loaders:
                p = build(loader, files, source, region, t, args.batch_size)
                evict(files)
                before = read_bytes([os.getpid()] + descendant_pids(os.getpid()))
                cold, _ = run_epoch(p, loader, n_batches)
                got = read_bytes([os.getpid()] + descendant_pids(os.getpid())) - before
                warm = statistics.median(run_epoch(p, loader, n_batches)[0] for _ in range(args.warm_epochs))
                if isinstance(p, Floor):
                    last = np.load(files[-1])
                    np.testing.assert_array_equal(p.out[-1].view(np.float32).reshape(region.window_shape),
                                                  take_window(last, region))
                    p.close()
                del p
                res.setdefault((t, loader), []).append((cold, got, warm))
                print(f"run {run} threads {t} {loader}: cold {cold:.3f} s {got / window_bytes:.3f}x window, "
                      f"warm {warm:.3f} s", file=sys.stderr)

    what = f"ERA5-like HDF5 ({args.steps}, {args.channels}, 721, 1440) float32 contiguous" if args.era5 else \
        f"{len(files)} x float32 {shape} .npy"
    print(f"{what}, rank 1 of 4 (H split, window {region.window_shape}), batch "
          f"{args.batch_size}; medians of {args.runs} runs (warm: median of {args.warm_epochs} epochs per run); "
          f"load average at the end {os.getloadavg()[0]:.1f}")
    ref = "physicsnemo" if args.era5 else args.floor
    print(f"| threads | loader | cold epoch s | cold bytes / window | warm epoch s | cold vs {ref} | warm vs {ref} |")
    print("|---|---|---|---|---|---|---|")
    for t in threads:
        base = res.get((t, ref))
        for loader in loaders:
            r = res[(t, loader)]
            cold = statistics.median(x[0] for x in r)
            got = statistics.median(x[1] for x in r)
            warm = statistics.median(x[2] for x in r)
            if base:
                rc = statistics.median(x[0] / b[0] for x, b in zip(r, base))
                rw = statistics.median(x[2] / b[2] for x, b in zip(r, base))
                ratio = f"{rc:.2f}x | {rw:.2f}x"
            else:
                ratio = "- | -"
            print(f"| {t} | {loader} | {cold:.3f} | {got / window_bytes:.3f}x | {warm:.3f} | {ratio} |")


if __name__ == "__main__":
    main()
