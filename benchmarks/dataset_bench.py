"""A WeatherBench2-like Zarr store read channel by channel: dali_mesh's ZarrDatasetSource + read_dataset
against the xarray loader users write today, in one run.

    python benchmarks/dataset_bench.py [--steps 8] [--runs 3] [--threads 2] [--chunks whole,band]

The store: 8 variables, 3 of them with 4 levels (17 channels), (721, 1440) float32, Zarr v2,
Blosc(lz4, shuffle), values rounded to 0.01 (compressible, as real fields are); one chunk per time
step and variable, either the whole field (``whole``, WeatherBench2's chunking) or bands of 181 rows
(``band``: chunks that follow a 4-way latitude split). Rank 1 of 4, latitude split, batch 1, every step
once, in time order. Loaders:

- ``xarray``: ``ds = xr.open_zarr(store)``; per step, every channel's ``ds[var].sel(level=...)
  .isel(time=t).values`` stacked, then the rank's band cut (what users write today);
- ``xarray band``: the same with ``isel(latitude=band)`` (only the chunks the band touches);
- ``dali_mesh``: ``read_dataset(ZarrDatasetSource(...))`` in a DALI CPU pipeline (``--threads``): one
  operator reads every variable into its place in the stacked window;
- ``dali_mesh per variable``: ``read_dataset(..., stack=False)``: one operator per variable, then
  ``fn.cat`` (how read_dataset read every dataset before);
- ``+ norm``: the same normalised per channel (``mean``/``std``): numpy's ``(x - mean) / std`` after the
  xarray loader; fused into the operator's finishing step (``dali_mesh``) or ``strided_slice`` (channel_axis,
  mean, std) after ``fn.cat`` (``per variable``).

Per loader: samples/s warm (median of ``--runs`` epochs, files cached, the loaders' epochs taken in
turn) and bytes pulled from storage
cold (files evicted with ``POSIX_FADV_DONTNEED``; ``/proc/self/io``), against the bytes of the chunk
files the rank's window touches. The first sample of each loader is checked against ``xarray``'s.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

SURFACE = ["2m_temperature", "10m_u_component_of_wind", "10m_v_component_of_wind", "mean_sea_level_pressure",
           "total_precipitation"]
LEVELS = [500, 700, 850, 1000]
UPPER = ["geopotential", "temperature", "specific_humidity"]


def make_store(path: str, steps: int, shape, chunk_rows: int) -> None:
    import pandas as pd
    import xarray as xr
    from numcodecs import Blosc

    if os.path.exists(os.path.join(path, ".zmetadata")) or os.path.exists(os.path.join(path, "time", ".zarray")):
        return
    h, w = shape
    rng = np.random.default_rng(0)
    coords = {"time": pd.date_range("2020-01-01", periods=steps, freq="6h"), "level": LEVELS,
              "latitude": np.linspace(90, -90, h), "longitude": np.linspace(0, 360, w, endpoint=False)}
    data = {}
    for v in SURFACE:
        data[v] = (("time", "latitude", "longitude"), np.round(rng.standard_normal((steps, h, w)), 2).astype("f4"))
    for v in UPPER:
        data[v] = (("time", "level", "latitude", "longitude"),
                   np.round(rng.standard_normal((steps, len(LEVELS), h, w)), 2).astype("f4"))
    ds = xr.Dataset(data, coords=coords)
    comp = [Blosc("lz4", 5, Blosc.SHUFFLE)]
    enc = {v: {"chunks": (1, chunk_rows, w), "compressors": comp} for v in SURFACE}
    enc.update({v: {"chunks": (1, len(LEVELS), chunk_rows, w), "compressors": comp} for v in UPPER})
    ds.to_zarr(path, zarr_format=2, encoding=enc, mode="w", consolidated=False)


def channels():
    return SURFACE + [(v, LEVELS) for v in UPPER]


def xarray_epoch(path, steps, band, band_only, stats=None):
    import xarray as xr

    ds = xr.open_zarr(path, consolidated=False)
    lo, hi = band
    first = None
    t0 = time.perf_counter()
    for t in range(steps):
        fields = []
        for v in SURFACE:
            a = ds[v].isel(time=t, latitude=slice(lo, hi)) if band_only else ds[v].isel(time=t)
            fields.append(a.values[None])
        for v in UPPER:
            a = ds[v].sel(level=LEVELS).isel(time=t, latitude=slice(lo, hi)) if band_only else \
                ds[v].sel(level=LEVELS).isel(time=t)
            fields.append(a.values)
        x = np.concatenate(fields)
        x = x if band_only else x[:, lo:hi]
        if stats is not None:
            x = ((x - stats[0][:, None, None]) / stats[1][:, None, None]).astype(np.float32)
        if first is None:
            first = np.ascontiguousarray(x)
    return time.perf_counter() - t0, first


def dali_epoch(pipe, steps):
    t0 = time.perf_counter()
    first = None
    n = 0
    try:
        while n < steps:
            out = pipe.run()
            if first is None:
                first = np.array(out[0][0])
            n += len(out[0])
    except StopIteration:
        pass
    seconds = time.perf_counter() - t0
    pipe.reset()
    return seconds, first


def touched_chunk_bytes(path, band, chunk_rows, steps) -> int:
    rows = range(band[0] // chunk_rows, (band[1] - 1) // chunk_rows + 1)
    total = 0
    for v in SURFACE + UPPER:
        for t in range(steps):
            for r in rows:
                key = f"{t}.{r}.0" if v in SURFACE else f"{t}.0.{r}.0"
                total += os.path.getsize(os.path.join(path, v, key))
    return total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--shape", default="721,1440")
    ap.add_argument("--chunks", default="whole,band")
    ap.add_argument("--dir", default="/tmp/dali_mesh_dataset_bench")
    ap.add_argument("--tiny", action="store_true", help="3 steps of (37, 64), 1 run: a smoke test")
    args = ap.parse_args()
    if args.tiny:
        args.steps, args.runs, args.shape = 3, 1, "37,64"
        args.dir += "_tiny"
    shape = tuple(int(s) for s in args.shape.split(","))

    from nvidia.dali import pipeline_def

    from dali_mesh import Layout, MeshInfo
    from dali_mesh import ZarrDatasetSource
    from dali_mesh.fn import read_dataset
    from dali_mesh.io.pagecache import evict, read_bytes

    layout = Layout(MeshInfo((4,), ("model_parallel",), (1,)), shard={"model_parallel": 1})
    print(f"{args.steps} steps of 17 channels (8 variables, 3 x 4 levels) of float32 {shape}, Zarr v2 Blosc(lz4, "
          f"shuffle); rank 1 of 4, latitude split; {args.threads} DALI threads; warm: median of {args.runs} epochs; "
          f"{os.cpu_count()} CPUs")
    print("| chunks | loader | samples/s warm | vs xarray | cold MiB read | cold bytes / chunks touched |")
    print("|---|---|---|---|---|---|")
    for kind in args.chunks.split(","):
        chunk_rows = shape[0] if kind == "whole" else -(-shape[0] // 4)
        path = os.path.join(args.dir, f"{kind}.zarr")
        make_store(path, args.steps, shape, chunk_rows)
        src = ZarrDatasetSource(path, channels(), layout, batch_size=1, shuffle=False)
        mean, std = np.linspace(-1, 1, 17), np.linspace(0.5, 2, 17)
        src_norm = ZarrDatasetSource(path, channels(), layout, batch_size=1, shuffle=False, mean=mean, std=std)
        band = (src.region.start[1], src.region.stop[1])
        touched = touched_chunk_bytes(path, band, chunk_rows, args.steps)

        def build(source, stack):
            @pipeline_def(batch_size=1, num_threads=args.threads, device_id=None, prefetch_queue_depth=2)
            def pipe():
                return read_dataset(source, fallback=False, stack=stack)[0]

            p = pipe()
            p.build()
            return p

        pipes = {"dali_mesh": build(src, True), "dali_mesh per variable": build(src, False),
                 "dali_mesh + norm": build(src_norm, True), "dali_mesh per variable + norm": build(src_norm, False)}
        loaders = {"xarray": lambda: xarray_epoch(path, args.steps, band, False),
                   "xarray band": lambda: xarray_epoch(path, args.steps, band, True),
                   "xarray band + norm": lambda: xarray_epoch(path, args.steps, band, True, (mean, std))}
        loaders.update({name: (lambda p=p: dali_epoch(p, args.steps)) for name, p in pipes.items()})
        colds, firsts = {}, {}
        for name, run in loaders.items():
            evict(path)
            before = read_bytes()
            _, firsts[name] = run()  # cold
            colds[name] = read_bytes() - before
        # warm epochs round-robin over the loaders, so that the machine's slow spells hit them alike
        warm = {name: [] for name in loaders}
        for _ in range(args.runs):
            for name, run in loaders.items():
                warm[name].append(run()[0])
        results = {name: (args.steps / statistics.median(warm[name]), colds[name]) for name in loaders}
        for name in loaders:
            want = firsts["xarray band + norm" if name.endswith("norm") else "xarray"]
            assert np.allclose(firsts[name], want, rtol=1e-6, atol=1e-6), f"{name}'s first sample differs from xarray's"
            if not name.endswith("norm"):
                assert np.array_equal(firsts[name], want), f"{name}'s first sample differs from xarray's"
        base = results["xarray"][0]
        for name, (rate, cold) in results.items():
            print(f"| {kind} ({chunk_rows} rows) | {name} | {rate:.2f} | {rate / base:.2f}x | {cold / 2**20:.0f} | "
                  f"{cold / touched:.3f} |")
        del pipes


if __name__ == "__main__":
    main()
