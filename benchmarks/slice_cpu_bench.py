"""CPU benchmark of the dali_mesh strided slice (fn.dali_mesh.strided_slice), all in one run:

1. plain window of a 64 MiB float32 sample, one thread: the kernel (through the DALI-free library,
   the code the DALI CPU operator runs) and the DALI operator (num_threads=1), next to numpy slicing
   (``np.ascontiguousarray(x[window])``);
2. the fused ERA5 case, (16, 721, 1440) float32 (63 MiB): latitude rows of rank 1 of 4 with one
   constant halo row each side, longitude periodic with 2 halo cells, per-channel normalisation,
   cast to float16 -- one ``strided_slice`` against the chain of DALI CPU operators that does the
   same (``fn.slice`` pad on latitude, ``fn.slice`` wrap on longitude, arithmetic normalisation,
   ``fn.cast``), both checked equal first;
3. the same with more DALI threads.

Inputs reach both pipelines through ``external_source(no_copy=True)``; each time is the median of
``--iters`` interleaved runs after 2 warm-up runs. GB/s counts bytes read (window cells) + written.

    python benchmarks/slice_cpu_bench.py [--iters 10] [--threads 1 2] [--batch 4] [--json out.json]
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, not installed
from benchmarks._common import print_results  # noqa: E402


def median_times(fns, iters: int) -> list[float]:
    """Median time of each function, runs interleaved (so drift hits all alike)."""
    for f in fns:
        f()
        f()
    ts: list[list[float]] = [[] for _ in fns]
    for _ in range(iters):
        for f, t in zip(fns, ts):
            t0 = time.perf_counter()
            f()
            t.append(time.perf_counter() - t0)
    return [statistics.median(t) for t in ts]


def build_pipe(graph, sample, num_threads: int, batch_size: int = 1):
    from nvidia.dali import fn, pipeline_def

    @pipeline_def(batch_size=batch_size, num_threads=num_threads, device_id=None,
                  prefetch_queue_depth=1)
    def pipe():
        x = fn.external_source(source=lambda: [sample] * batch_size, batch=True, no_copy=True)
        return graph(x)

    p = pipe()
    p.build()
    return p


def run_once(p):
    (out,) = p.run()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--batch", type=int, default=4, help="ERA5 samples per batch")
    ap.add_argument("--json", help="write the results here too")
    args = ap.parse_args()

    from nvidia.dali import fn, types

    import dali_mesh.fn as dfn
    from dali_mesh import _kernels as K

    rng = np.random.default_rng(0)
    results: dict = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
                     "iters": args.iters}

    # ---- 1. plain window, one thread --------------------------------------------------------------
    x = rng.normal(size=(16, 1024, 1024)).astype(np.float32)  # 64 MiB
    start, shape = [0, 256, 128], [16, 512, 768]
    window = tuple(slice(s, s + n) for s, n in zip(start, shape))
    out_bytes = int(np.prod(shape)) * 4
    p = build_pipe(lambda v: dfn.strided_slice(v, start, shape), x, 1)
    got = np.array(run_once(p)[0])
    np.testing.assert_array_equal(got, x[window])
    p_slice = build_pipe(lambda v: fn.slice(v, start=start[1:], shape=shape[1:], axes=[1, 2]), x, 1)
    p_id = build_pipe(lambda v: v, x, 1)
    pre_np, pre_k = np.empty(shape, np.float32), np.empty(shape, np.float32)
    t_np, t_k, t_np_into, t_k_into, t_op, t_slice, t_id = median_times(
        [lambda: np.ascontiguousarray(x[window]),
         lambda: K.strided_slice_host([x], start, shape, backend="cpu"),
         lambda: np.copyto(pre_np, x[window]),
         lambda: K.strided_slice_host([x], start, shape, backend="cpu", out=[pre_k]),
         lambda: run_once(p), lambda: run_once(p_slice), lambda: run_once(p_id)], args.iters)
    gbs = lambda t: 2 * out_bytes / t / 1e9  # noqa: E731
    results["plain_window"] = {
        "sample": "float32 (16, 1024, 1024) 64 MiB", "window": f"start {start} shape {shape} (24 MiB)",
        "numpy_s": t_np, "kernel_1thread_s": t_k,
        "numpy_into_preallocated_s": t_np_into, "kernel_into_preallocated_s": t_k_into,
        "dali_op_1thread_s": t_op,
        "dali_fn_slice_1thread_s": t_slice, "dali_identity_pipeline_s": t_id,
        "numpy_GBps": gbs(t_np), "kernel_GBps": gbs(t_k), "kernel_vs_numpy": t_np / t_k,
        "kernel_vs_numpy_preallocated": t_np_into / t_k_into,
    }
    del p, p_id, p_slice

    # ---- 2./3. fused ERA5 case vs the DALI chain --------------------------------------------------
    C, H, W = 16, 721, 1440
    era = (rng.normal(280, 20, (C, H, W))).astype(np.float32)
    mean = [float(v) for v in rng.normal(280, 5, C)]
    std = [float(v) for v in rng.uniform(5, 25, C)]
    lat0, lat1 = 181, 362  # rank 1 of 4 ("chunk": 181 rows each)
    lat_start, lat_shape = lat0 - 1, lat1 - lat0 + 2
    lon_start, lon_shape = -2, W + 4

    def fused(v):
        return dfn.strided_slice(v, [lat_start, lon_start], [lat_shape, lon_shape], axes=[1, 2],
                                 boundary=["constant", "periodic"], channel_axis=0, mean=mean,
                                 std=std, dtype=types.FLOAT16)

    m = types.Constant(np.array(mean, np.float32).reshape(C, 1, 1))
    s = types.Constant(np.array(std, np.float32).reshape(C, 1, 1))

    def chain(v):
        v = fn.slice(v, start=[lat_start], shape=[lat_shape], axes=[1], out_of_bounds_policy="pad",
                     fill_values=0.0)
        v = fn.slice(v, start=[lon_start], shape=[lon_shape], axes=[2], out_of_bounds_policy="wrap")
        v = (v - m) / s
        return fn.cast(v, dtype=types.FLOAT16)

    era_out = C * lat_shape * lon_shape
    era_bytes = era_out * 4 + era_out * 2
    results["era5"] = {"sample": f"float32 ({C}, {H}, {W}) {era.nbytes / 2**20:.0f} MiB",
                       "window": f"lat {lat_start}:{lat_start + lat_shape} constant, lon periodic "
                                 f"{lon_shape} cells, normalise, cast to float16", "threads": {}}
    results["era5"]["batch_size"] = args.batch
    for nt in args.threads:
        pf = build_pipe(fused, era, nt, args.batch)
        pc = build_pipe(chain, era, nt, args.batch)
        a, b = np.array(run_once(pf)[0]), np.array(run_once(pc)[0])
        np.testing.assert_allclose(a.astype(np.float32), b.astype(np.float32), rtol=2e-3, atol=2e-3)
        tf, tc = median_times([lambda: run_once(pf), lambda: run_once(pc)], args.iters)
        results["era5"]["threads"][nt] = {"fused_s": tf, "chain_s": tc, "speedup": tc / tf,
                                          "fused_GBps": args.batch * era_bytes / tf / 1e9}
        del pf, pc

    print_results(results, args.json)


if __name__ == "__main__":
    main()
