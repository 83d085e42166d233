"""Forecasts of compressed chunks (issue 15: each chunk a batch needs read and decoded once, forecast
steps included): the input and the target from one operator against one operator per output (what
read_windows built before), with tensorstore beside them, same files and windows, one run.

    python benchmarks/forecast_bench.py [--steps 16] [--runs 3] [--threads 2] [--cases ...]

Data: ``--steps`` × (4, 721, 1440) float32 (the ERA5-like fields of compressed_bench.py), Zarr v2,
Zstd(3), rank 1 of 4, latitude split (rows 181..362), batch 2, ``ForecastSpec(history=1, lead=1)``:
a sample at step t reads input steps (t-1, t) and target step t+1. Cases:
  t1_ordered    chunks (1, 4, 181, 1440), samples in order (shuffle=False, as a validation loader):
                a sample's target step is the next sample's input step
  t4_shuffled   chunks (4, 4, 181, 1440): four steps per chunk, so a sample's input and target
                mostly lie in the same chunks; shuffled samples
Loaders (each reads exactly the rank's input and target windows of every sample of the epoch):
  joined       dali_mesh read_windows: one operator for both outputs (outputs=2)
  per_output   two read_windows operators on the same plans, one per output (the earlier design:
               each decodes the chunks its output needs)
  tensorstore  tensorstore.open, the batch's input and target window reads issued together,
               data_copy_concurrency and file_io_concurrency = threads, no cache
Cold: files evicted, one epoch, bytes = read_bytes of this process; warm: median of 3 epochs; then
an untimed epoch checks every loader's windows against numpy. Medians over ``--runs``; ratios are
medians of per-run ratios to ``per_output``.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks.compressed_bench import SHAPE, _fields, _layout, result_row, time_epochs  # noqa: E402
from dali_mesh import ForecastSpec  # noqa: E402

BATCH = 2
CASES = {"t1_ordered": (1, False), "t4_shuffled": (4, True)}
FORECAST = ForecastSpec(history=1, lead=1)


def _write(case: str, folder: str, data: np.ndarray) -> str:
    import numcodecs
    import zarr

    path = os.path.join(folder, f"{case}.zarr")
    z = zarr.create_array(path, shape=data.shape, chunks=(CASES[case][0], 4, 181, 1440), dtype="f4",
                          compressors=numcodecs.Zstd(3), zarr_format=2)
    z[:] = data
    return path


def _source(case, path):
    from dali_mesh.source import ZarrSource

    return ZarrSource([path], None, _layout(), batch_size=BATCH, shuffle=CASES[case][1], seed=1, forecast=FORECAST)


class _Native:
    def __init__(self, case, path, threads, joined):
        from nvidia.dali import fn, pipeline_def, types

        from dali_mesh.pipeline import native
        from dali_mesh.pipeline.plugin import load_plugin

        src = self.src = _source(case, path)
        ops = load_plugin()

        @pipeline_def(batch_size=BATCH, num_threads=threads, device_id=None, prefetch_queue_depth=1)
        def pipe():
            if joined:
                inp, tgt, ids, _ = native.read_windows(src, fallback=False)
                return inp, tgt, ids
            plans = native.plan_windows(src)
            ids, _ = fn.external_source(source=native._SampleIds(src, ahead=0), num_outputs=2, batch=True,
                                        batch_info=True, dtype=[types.INT64, types.BOOL], ndim=[0, 0])
            inp, tgt = (ops.read_windows(ids, plan_file=p.write(), dtype=types.FLOAT) for p in plans)
            return inp, tgt, ids

        self.pipe = pipe()
        self.pipe.build()

    def epoch(self, keep=False):
        out = []
        while True:
            try:
                inp, tgt, ids = self.pipe.run()
            except StopIteration:
                self.pipe.reset()
                return out
            if keep:
                out += [(int(np.array(ids[i])), np.array(inp[i]), np.array(tgt[i])) for i in range(len(ids))]


class _TensorStore:
    def __init__(self, case, path, threads):
        import tensorstore as ts

        ctx = ts.Context({"data_copy_concurrency": {"limit": threads}, "file_io_concurrency": {"limit": threads},
                          "cache_pool": {"total_bytes_limit": 0}})
        self.arr = ts.open({"driver": "zarr", "kvstore": {"driver": "file", "path": path}}, context=ctx,
                           read=True).result()
        self.src = _source(case, path)
        region = self.src.region
        self.sl = tuple(slice(a, b) for a, b in zip(region.start, region.stop))

    def epoch(self, keep=False):
        out = []
        order = [s for s, _ in self.src.sample_order(0)]
        for b in range(0, len(order) - len(order) % BATCH, BATCH):
            futs = []
            for s in order[b:b + BATCH]:
                t = self.src.step_of(s)
                futs.append((s, self.arr[(slice(t - 1, t + 1),) + self.sl].read(),
                             self.arr[(slice(t + 1, t + 2),) + self.sl].read()))
            for s, fi, ft in futs:
                inp, tgt = fi.result(), ft.result()
                if keep:
                    out.append((s, inp, tgt))
        return out


def _make(loader, case, path, threads):
    if loader == "tensorstore":
        return _TensorStore(case, path, threads)
    return _Native(case, path, threads, joined=loader == "joined")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", default="2")
    ap.add_argument("--cases", default=",".join(CASES))
    args = ap.parse_args(argv)
    threads = [int(t) for t in args.threads.split(",")]
    cases = args.cases.split(",")
    folder = tempfile.mkdtemp(prefix="dm_forecast_bench_")
    data = _fields(args.steps)
    region = _layout().region(SHAPE)
    sl = tuple(slice(a, b) for a, b in zip(region.start, region.stop))
    loaders = ("joined", "per_output", "tensorstore")
    results = {}
    try:
        paths = {c: _write(c, folder, data) for c in cases}
        for run in range(args.runs):
            for th in threads:
                for case in cases:
                    for loader in loaders:
                        r = results.setdefault((th, case, loader), {"cold": [], "warm": [], "bytes": []})
                        obj = _make(loader, case, paths[case], th)
                        time_epochs(obj, paths[case], r)
                        got = obj.epoch(keep=True)
                        assert len(got) == (len(obj.src) // BATCH) * BATCH, (loader, case, len(got))
                        for s, inp, tgt in got:  # every window checked against numpy, untimed
                            t = obj.src.step_of(s)
                            np.testing.assert_array_equal(np.asarray(inp), data[t - 1:t + 1][(slice(None),) + sl])
                            np.testing.assert_array_equal(np.asarray(tgt), data[t + 1:t + 2][(slice(None),) + sl])
                        del obj
                print(f"run {run + 1}/{args.runs} done", file=sys.stderr)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"{args.steps} x {SHAPE} float32, Zarr v2 Zstd(3), rank 1 of 4, ForecastSpec(history=1, lead=1), "
          f"batch {BATCH}, medians of {args.runs} runs (warm: median of 3 epochs each)\n")
    print("| threads | case | loader | cold epoch s | cold MB read | warm epoch s | cold vs per_output | "
          "warm vs per_output |")
    print("|---|---|---|---|---|---|---|---|")
    for (th, case, loader), r in results.items():
        print(result_row((th, case, loader), r, results[(th, case, "per_output")],
                         f"{statistics.median(r['bytes']) / 1e6:.1f}"))


if __name__ == "__main__":
    main()
