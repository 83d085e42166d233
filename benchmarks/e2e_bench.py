"""One rank's epoch through DALI: its window (model-parallel size 4, H split) against full-sample
loading, measured in the same run, on cold files.

    python benchmarks/e2e_bench.py [--files 16] [--shape 8,1024,2048] [--runs 3] [--workers 2] [--tiny]

For each loader and run: the files are evicted from the page cache (posix_fadvise DONTNEED), a DALI
CPU pipeline is built and runs one epoch; bytes pulled from storage are the ``read_bytes`` of
``/proc/PID/io`` of this process and its DALI worker processes. Loaders:
  native  dali_mesh NumpySource + dali_mesh.fn.read_windows (the native operator: byte-range plans
          preadv-ed on --workers DALI threads, no worker processes), rank 1 of 4 (H split)
  window  dali_mesh NumpySource + partitioned_source (Python readers in --workers DALI worker
          processes), rank 1 of 4 (H split): the rank's window
  full    the same source and pipeline on a 1-rank layout: every rank reads the whole sample
  dali    DALI's fn.readers.numpy (whole files), what a full-sample DALI loader does
The readers' own counters (bytes read / window bytes) come from reading every sample in-process.
Epoch time is the steady state: the time after the first batch, scaled to the whole epoch.
Medians over ``--runs``.
"""
from __future__ import annotations

import argparse
import glob
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks._common import make_npy_samples  # noqa: E402
from dali_mesh import Layout, MeshInfo  # noqa: E402
from dali_mesh.io import global_stats, reset_global_stats  # noqa: E402
from dali_mesh.io.pagecache import descendant_pids, evict, read_bytes  # noqa: E402
from dali_mesh.source import NumpySource  # noqa: E402




def epoch(files, source, workers, batch_size, native=False):
    from nvidia.dali import fn, pipeline_def

    from dali_mesh.pipeline.external import partitioned_source
    from dali_mesh.fn import read_windows

    if native:
        @pipeline_def(batch_size=batch_size, num_threads=workers, device_id=None, prefetch_queue_depth=1)
        def pipe():
            return read_windows(source, fallback=False)  # all outputs: DALI warns of unused ones
    elif source is None:
        @pipeline_def(batch_size=batch_size, num_threads=workers, device_id=None, prefetch_queue_depth=1)
        def pipe():
            return fn.readers.numpy(files=files, name="r")
    else:
        @pipeline_def(batch_size=batch_size, num_threads=1, device_id=None, py_num_workers=workers,
                      py_start_method="spawn", prefetch_queue_depth=1)
        def pipe():
            return partitioned_source(source)[0]

    evict(files)
    before = read_bytes()
    p = pipe()
    p.build()
    samples = len(p.run()[0])  # the first batch overlaps start-up: time the rest of the epoch
    first = samples
    t0 = time.perf_counter()
    try:
        while source is not None or samples < len(files):  # DALI's reader loops; sources stop
            out = p.run()
            samples += len(out[0])
    except StopIteration:
        pass
    seconds = (time.perf_counter() - t0) * len(files) / max(1, samples - first)
    read = read_bytes([os.getpid()] + descendant_pids(os.getpid())) - before
    del p
    return seconds, read, samples


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=16)
    ap.add_argument("--shape", default="8,1024,2048")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--dir", default="/tmp/dali_mesh_e2e_bench")
    ap.add_argument("--tiny", action="store_true", help="4 files of (2, 32, 256), 1 run, 1 worker: a smoke test")
    args = ap.parse_args()
    if args.tiny:
        args.files, args.shape, args.runs, args.workers = 4, "2,32,256", 1, 1
    shape = tuple(int(s) for s in args.shape.split(","))
    files = make_npy_samples(args.dir, args.files, shape)
    sample_bytes = int(np.prod(shape)) * 4

    rank1 = Layout(MeshInfo((4,), ("model_parallel",), (1,)), shard={"model_parallel": 1})
    whole = Layout(MeshInfo((1,), ("data_parallel",)))
    sources = {
        "native": NumpySource(files, rank1, batch_size=args.batch_size, shuffle=False),
        "window": NumpySource(files, rank1, batch_size=args.batch_size, shuffle=False),
        "full": NumpySource(files, whole, batch_size=args.batch_size, shuffle=False),
        "dali": None,
    }
    window_bytes = int(np.prod(rank1.region(shape).window_shape)) * 4

    reset_global_stats()  # the readers' own counters, in-process
    for i in range(len(files)):
        sources["window"].read_sample(i)
    counters = global_stats()

    results = {name: [] for name in sources}
    for run in range(args.runs):
        for name, source in sources.items():
            results[name].append(epoch(files, source, args.workers, args.batch_size, native=name == "native"))

    print(f"{len(files)} files of float32 {shape} ({sample_bytes / 2**20:.0f} MiB each); rank 1 of 4, H split "
          f"(window {window_bytes / 2**20:.0f} MiB); {args.workers} DALI workers/threads; medians of {args.runs} "
          "cold runs")
    print(f"readers' counters (window): bytes read / window bytes = {counters.bytes_read / counters.window_bytes:.4f} "
          f"({counters.read_calls} read calls for {len(files)} samples)")
    print(f"| loader | cold bytes read / window bytes | of full sample | epoch s | samples/s | vs full |")
    print("|---|---|---|---|---|---|")
    full_rate = len(files) / statistics.median(r[0] for r in results["full"])
    for name, runs in results.items():
        seconds = statistics.median(r[0] for r in runs)
        read = statistics.median(r[1] for r in runs)
        rate = len(files) / seconds
        print(f"| {name} | {read / (window_bytes * len(files)):.3f} | {100 * read / (sample_bytes * len(files)):.1f}% | "
              f"{seconds:.2f} | {rate:.1f} | {rate / full_rate:.2f}x |")


if __name__ == "__main__":
    main()
