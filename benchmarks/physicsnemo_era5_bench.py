"""PhysicsNeMo's ERA5HDF5Datapipe against dali_mesh's drop-in on the same files, in one run.

    python benchmarks/physicsnemo_era5_bench.py [--runs 3] [--years 2] [--steps 9] [--shape 4,721,1440]

Year files ``????.h5`` of float32 ``fields`` (steps, C, H, W) and PhysicsNeMo's stats files; both
datapipes with the same arguments (batch 2, num_steps 1, num_history 0, shuffle, device="cpu"); the
drop-in as ranks 1 and 3 of 4 (``--ranks``) with latitude split (``split="physicsnemo"``, no halo). Per loader and worker
count: bytes the loader's processes pulled from storage (``/proc/PID/io`` of the process and its DALI
workers) in an epoch read cold (files evicted with ``POSIX_FADV_DONTNEED``), and the epoch's time cold
and warm (the next epoch, files cached); medians of ``--runs``. A warm-up epoch first starts each
datapipe's workers. The first batches of both are compared (the drop-in's band equals PhysicsNeMo's
whole field cut to it). ``num_workers`` is PhysicsNeMo's Python worker processes (plus its 2 DALI
threads) and the drop-in's DALI threads.

PhysicsNeMo's datapipe module is imported around its package ``__init__`` (timm/torchvision cannot
be installed beside the CPU torch here): see tests/torch/_physicsnemo_stub.py.
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

from tests.torch._physicsnemo_stub import era5_datapipe_class  # noqa: E402

PhysicsNeMoERA5 = era5_datapipe_class()  # at the top: DALI's spawned workers re-run this file


def make_data(folder: str, years: int, steps: int, shape) -> tuple[str, str]:
    import h5py

    data, stats = os.path.join(folder, "data"), os.path.join(folder, "stats")
    os.makedirs(data, exist_ok=True)
    os.makedirs(stats, exist_ok=True)
    for y in range(years):
        path = os.path.join(data, f"{2000 + y}.h5")
        if os.path.exists(path):
            with h5py.File(path, "r") as f:
                if f["fields"].shape == (steps,) + tuple(shape):
                    continue
        rng = np.random.default_rng(y)
        with h5py.File(path, "w") as f:
            ds = f.create_dataset("fields", (steps,) + tuple(shape), "f4")
            for t in range(steps):
                ds[t] = rng.standard_normal(shape, dtype=np.float32)
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    c = shape[0]
    np.save(os.path.join(stats, "global_means.npy"), np.zeros((1, c, 1, 1), np.float32) + 0.1)
    np.save(os.path.join(stats, "global_stds.npy"), np.ones((1, c, 1, 1), np.float32) * 1.5)
    return data, stats


def timed_epoch(pipe, files, cold: bool):
    from dali_mesh.io.pagecache import descendant_pids, evict, read_bytes

    if cold:
        evict(files)
    pids = [os.getpid()] + descendant_pids(os.getpid())
    before = read_bytes(pids)
    t0 = time.perf_counter()
    n = 0
    for batch in pipe:
        n += batch[0]["invar"].shape[0]
    seconds = time.perf_counter() - t0
    pids = [os.getpid()] + descendant_pids(os.getpid())
    return seconds, read_bytes(pids) - before, n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--years", type=int, default=2)
    ap.add_argument("--steps", type=int, default=17)
    ap.add_argument("--ranks", default="1,3", help="the drop-in's model-parallel ranks (of 4) to measure")
    ap.add_argument("--shape", default="4,721,1440")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--dir", default="/tmp/dali_mesh_pn_era5_bench")
    ap.add_argument("--tiny", action="store_true", help="2 years of 5 steps of (2, 32, 64), 1 run: a smoke test")
    args = ap.parse_args()
    if args.tiny:
        args.runs, args.steps, args.shape, args.workers = 1, 5, "2,32,64", "1"
        args.dir += "_tiny"
    shape = tuple(int(s) for s in args.shape.split(","))
    data, stats = make_data(args.dir, args.years, args.steps, shape)
    files = [os.path.join(data, f) for f in sorted(os.listdir(data))]

    from dali_mesh import Layout, MeshInfo
    from dali_mesh.physicsnemo import ERA5HDF5Datapipe

    ranks = [int(r) for r in args.ranks.split(",")]
    kw = dict(stats_dir=stats, batch_size=2, num_steps=1, num_history=0, stride=1, shuffle=True, device="cpu")
    rows = []
    for workers in (int(w) for w in args.workers.split(",")):
        pipes = {"PhysicsNeMo ERA5HDF5Datapipe": PhysicsNeMoERA5(data, num_workers=workers, **kw)}
        for r in ranks:
            layout = Layout(MeshInfo((4,), ("model_parallel",), (r,)), shard={"model_parallel": 1},
                            split="physicsnemo")
            pipes[f"dali_mesh drop-in, rank {r} of 4"] = ERA5HDF5Datapipe(data, num_workers=workers, layout=layout,
                                                                           **kw)
        first = {}
        for name, pipe in pipes.items():  # warm-up: starts the workers; the first batches are compared
            for i, batch in enumerate(pipe):
                if i == 0:
                    first[name] = batch[0]["invar"].clone()
        theirs = first["PhysicsNeMo ERA5HDF5Datapipe"].numpy()
        for r in ranks:
            name = f"dali_mesh drop-in, rank {r} of 4"
            region = pipes[name].region
            assert np.array_equal(first[name].numpy(), theirs[..., region.start[1]:region.stop[1], :]), \
                f"the drop-in's band (rank {r}) differs from PhysicsNeMo's field"
        results = {name: {"cold": [], "warm": []} for name in pipes}
        for _ in range(args.runs):
            for name, pipe in pipes.items():
                results[name]["cold"].append(timed_epoch(pipe, files, cold=True))
                results[name]["warm"].append(timed_epoch(pipe, files, cold=False))
        for name, res in results.items():
            cold_s = statistics.median(r[0] for r in res["cold"])
            warm_s = statistics.median(r[0] for r in res["warm"])
            cold_b = statistics.median(r[1] for r in res["cold"])
            rows.append((workers, name, cold_b, cold_s, warm_s, res["cold"][0][2]))
        for pipe in pipes.values():
            getattr(pipe, "close", lambda: None)()
        del pipes

    sample = int(np.prod(shape)) * 4
    print(f"{args.years} year files x {args.steps} steps of float32 {shape} ({sample / 2**20:.1f} MiB a step); "
          f"batch 2, num_steps 1, num_history 0, shuffled; medians of {args.runs} runs; {os.cpu_count()} CPUs")
    print("| workers | loader | samples/epoch | cold MiB read | cold epoch s | warm epoch s | bytes vs PhysicsNeMo | "
          "cold speed-up | warm speed-up |")
    print("|---|---|---|---|---|---|---|---|---|")
    by = {(w, n): (b, c, wm) for w, n, b, c, wm, _ in rows}
    for w, n, b, c, wm, samples in rows:
        pb, pc, pw = by[(w, "PhysicsNeMo ERA5HDF5Datapipe")]
        print(f"| {w} | {n} | {samples} | {b / 2**20:.0f} | {c:.2f} | {wm:.2f} | {pb / max(b, 1):.2f}x fewer | "
              f"{pc / c:.2f}x | {pw / wm:.2f}x |")


if __name__ == "__main__":
    main()
