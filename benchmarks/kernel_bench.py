"""GPU benchmark of the strided-slice kernel (the code the DALI GPU operator launches), through the
DALI-free library on torch device memory; no DALI needed (``--host``: no GPU either).

Reports GB/s (bytes read + bytes written) next to the device-to-device copy bandwidth measured in the
same run (``dst.copy_(src)`` of the same byte count, read + written), for batches >= 256 MiB; CUDA
events around each launch, queued behind a GPU spin so that host-side preparation is not timed:

* ``inside``: windows inside the samples, step 1, no cast (16-byte moves where alignment allows);
  target >= 85% of the copy bandwidth;
* ``periodic_halo``: ERA5-like rows of one rank with 1 constant halo row each side and 2 periodic
  halo cells in longitude; target >= 75% (the in-bounds box moves 8 bytes per thread: with a 2-cell
  float32 halo every output cell sits 8 bytes (mod 16) from its source);
* ``periodic_halo_4``: the same with 4 halo cells (the box moves 16 bytes per thread);
* ``rows_halo_u8``: uint8 rows of 65536 bytes, rank 0 of 4 of a row split with a constant halo row
  above (whole rows plus a halo row: the box moves 16 bytes, the halo row is a strip of its own);
* ``normalise_f16``: the same window, per-channel normalisation and a cast to float16 (for info).

Each result is checked against the CPU kernel (GPU) or numpy (``--host``) on one sample first.

    python benchmarks/kernel_bench.py [--iters 20] [--json out.json]
    python benchmarks/kernel_bench.py --host --tiny     # no GPU: the CPU kernel vs np.copyto (CI)
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, not installed
from benchmarks._common import print_results  # noqa: E402
from dali_mesh import _kernels as K  # noqa: E402


def cases(tiny: bool):
    """``(name, shape, nsamples, start, window shape, boundary, out dtype, kwargs, in dtype)`` of
    each case; ``tiny`` keeps the geometry (row band of rank 1 of 4, periodic halo) at a few KiB."""
    c, h, w = (2, 64, 64) if tiny else (16, 1024, 1024)
    ec, eh, ew = (2, 21, 40) if tiny else (16, 721, 1440)  # ERA5-like
    n = 2 if tiny else 6
    r0 = -(-eh // 4)  # rows of one rank of 4 (chunk)
    era_start, era_shape = [0, r0 - 1, -2], [ec, r0 + 2, ew + 4]
    bnd = ["constant", "constant", "periodic"]
    mean = [float(v) for v in np.linspace(-1, 1, ec)]
    std = [float(v) for v in np.linspace(0.5, 2, ec)]
    uh, uw = (16, 256) if tiny else (2048, 65536)  # uint8 rows: 128 MiB per sample
    f32, u8 = np.float32, np.uint8
    return [
        ("inside", (c, h, w), n, [0, h // 8, 0], [c, 3 * h // 4, w], "constant", np.float32, {}, f32),
        ("inside_cols", (c, h, w), n, [0, h // 8, w // 4], [c, 3 * h // 4, w // 2], "constant", np.float32, {}, f32),
        ("periodic_halo", (ec, eh, ew), n + 2, era_start, era_shape, bnd, np.float32, {}, f32),
        ("periodic_halo_full", (ec, eh, ew), max(2, n - 2), [0, -1, -2], [ec, eh + 2, ew + 4], bnd, np.float32, {}, f32),
        ("periodic_halo_4", (ec, eh, ew), n + 2, [0, r0 - 1, -4], [ec, r0 + 2, ew + 8], bnd, np.float32, {}, f32),
        ("rows_halo_u8", (uh, uw), 4, [-1, 0], [uh // 4 + 1, uw], "constant", np.uint8, {}, u8),
        ("normalise_f16", (ec, eh, ew), n + 2, era_start, era_shape, bnd, np.float16,
         dict(channel_axis=0, mean=mean, std=std), f32),
    ]


def record(results, name, shape, nsamples, start, wshape, boundary, out_dtype, t, t_copy, copy_bytes,
           in_dtype=np.float32, plan=None):
    isz = np.dtype(in_dtype).itemsize
    out_bytes = int(np.prod(wshape)) * np.dtype(out_dtype).itemsize * nsamples
    read_bytes = int(np.prod(wshape)) * isz * nsamples  # each window cell read once
    moved = read_bytes + out_bytes
    gbs, copy_gbs = moved / t / 1e9, copy_bytes / t_copy / 1e9
    results["cases"][name] = {
        "batch": f"{nsamples} x {np.dtype(in_dtype).name} {tuple(shape)} = "
                 f"{nsamples * np.prod(shape) * isz / 2**20:.0f} MiB",
        "window": f"start {start} shape {wshape} {boundary} -> {np.dtype(out_dtype).name}",
        "kernel_s": t, "kernel_GBps": gbs, "d2d_copy_GBps": copy_gbs, "fraction_of_copy": gbs / copy_gbs,
    }
    if plan is not None:  # what the GPU plan launches for this case (its pieces and their widths)
        results["cases"][name]["plan"] = plan
    return moved


def _random(rng, shape, dtype) -> np.ndarray:
    if np.dtype(dtype) == np.uint8:
        return rng.integers(0, 256, shape, dtype=np.uint8)
    return rng.standard_normal(shape, dtype=np.float32)


def _aligned_empty(shape, dtype) -> np.ndarray:
    """An uninitialised array starting on a 256-byte boundary (as CUDA allocations do)."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(n + 256, np.uint8)
    base = (-raw.ctypes.data) % 256
    return raw[base:base + n].view(dtype).reshape(shape)


def _plan(samples, start, wshape, bnd, out_dtype, kw, outs) -> dict:
    """The GPU plan's pieces and bytes per move for a case (gpu_plan_info; host arrays)."""
    nch = len(kw.get("mean") or [])
    info = K.gpu_plan_info(samples[:1], start, wshape, 1, bnd, out_dtype, normalize_channels=nch,
                           outs=outs[:1])
    return {k: info[k] for k in ("num_pieces", "elem_size", "sample_elem_sizes", "conv")}


def run_host(args) -> dict:
    """The CPU kernel (the DALI CPU operator's code, one thread) on host memory vs ``np.copyto``:
    keeps the cases and their checks running where there is no GPU (CI)."""
    results = {"device": "host: CPU kernel, one thread (no GPU)", "iters": args.iters, "cases": {}}
    rng = np.random.default_rng(0)

    def timed(fn) -> float:
        fn()
        times = []
        for _ in range(args.iters):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    for name, shape, nsamples, start, wshape, boundary, out_dtype, kw, in_dtype in cases(args.tiny):
        samples = [_random(rng, shape, in_dtype) for _ in range(nsamples)]
        outs = [np.empty(wshape, out_dtype) for _ in range(nsamples)]
        bnd = [boundary] * len(shape) if isinstance(boundary, str) else boundary

        def run():
            K.strided_slice_host(samples, start, wshape, 1, bnd, dtype=out_dtype, backend="cpu", out=outs, **kw)

        run()
        ref = K.reference_strided_slice(samples[0], start, wshape, 1, bnd, dtype=out_dtype, **kw)
        np.testing.assert_array_equal(outs[0], ref, err_msg=f"{name}: CPU kernel vs numpy")
        t = timed(run)
        moved = (int(np.prod(wshape)) * (np.dtype(in_dtype).itemsize + np.dtype(out_dtype).itemsize)) * nsamples
        src = np.ones(moved // 2, np.uint8)
        dst = np.empty_like(src)
        t_copy = timed(lambda: np.copyto(dst, src))
        record(results, name, shape, nsamples, start, wshape, boundary, out_dtype, t, t_copy, 2 * src.size,
               in_dtype, _plan(samples, start, wshape, bnd, out_dtype, kw, outs))
    return results


def run_gpu(args) -> dict:
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("kernel_bench.py needs a CUDA GPU (torch.cuda.is_available() is False); "
                         "--host runs the same cases with the CPU kernel")
    if not K.has_cuda():
        raise SystemExit(f"{K.library_path()} was built without CUDA: rebuild with nvcc on PATH")
    dev = torch.device("cuda")
    stream = torch.cuda.current_stream()

    def timed(fn) -> float:
        for _ in range(3):
            fn()
        start = [torch.cuda.Event(enable_timing=True) for _ in range(args.iters)]
        end = [torch.cuda.Event(enable_timing=True) for _ in range(args.iters)]
        # Hold the stream busy while the host enqueues every launch: the events then time the GPU
        # work alone, not the Python/ctypes preparation of each launch (~0.1 ms, as long as a kernel)
        if hasattr(torch.cuda, "_sleep"):
            torch.cuda._sleep(200_000_000)
        for s, e in zip(start, end):
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in zip(start, end)) / 1e3

    results = {"device": torch.cuda.get_device_name(), "iters": args.iters, "cases": {}}
    launcher = K.CudaLauncher()
    tdts = {np.float32: torch.float32, np.float16: torch.float16, np.uint8: torch.uint8}
    for name, shape, nsamples, start, wshape, boundary, out_dtype, kw, in_dtype in cases(args.tiny):
        if in_dtype == np.uint8:
            samples = [torch.randint(0, 256, shape, device=dev, dtype=torch.uint8) for _ in range(nsamples)]
        else:
            samples = [torch.randn(shape, device=dev, dtype=torch.float32) for _ in range(nsamples)]
        tdt = tdts[out_dtype]
        outs = [torch.empty(wshape, device=dev, dtype=tdt) for _ in range(nsamples)]
        ndim = len(shape)
        bnd = [boundary] * ndim if isinstance(boundary, str) else boundary

        def run():
            K.strided_slice_device([s.data_ptr() for s in samples], [o.data_ptr() for o in outs],
                                   [shape] * nsamples, start, wshape, 1, bnd, in_dtype=in_dtype,
                                   out_dtype=out_dtype, stream=stream.cuda_stream, launcher=launcher,
                                   **kw)

        run()
        torch.cuda.synchronize()
        ref = K.strided_slice_host([samples[0].cpu().numpy()], start, wshape, 1, bnd, dtype=out_dtype,
                                   backend="cpu", **kw)[0]
        np.testing.assert_array_equal(outs[0].cpu().numpy(), ref)
        t = timed(run)
        moved = (int(np.prod(wshape)) * (np.dtype(in_dtype).itemsize + np.dtype(out_dtype).itemsize)) * nsamples
        src = torch.empty(moved // 2, dtype=torch.uint8, device=dev)
        dst = torch.empty_like(src)
        t_copy = timed(lambda: dst.copy_(src))
        # the plan of the case's geometry (its alignment: torch allocations are 256-byte aligned)
        small = [_aligned_empty(shape, in_dtype)]
        record(results, name, shape, nsamples, start, wshape, boundary, out_dtype, t, t_copy, 2 * src.numel(),
               in_dtype, _plan(small, start, wshape, bnd, out_dtype, kw, [_aligned_empty(wshape, out_dtype)]))
        del samples, outs, src, dst
        torch.cuda.empty_cache()
    launcher.close()
    return results


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json")
    ap.add_argument("--host", action="store_true",
                    help="no GPU: the same cases with the CPU kernel on host memory vs np.copyto")
    ap.add_argument("--tiny", action="store_true", help="a few KiB per case (a smoke test)")
    args = ap.parse_args(argv)
    results = run_host(args) if args.host else run_gpu(args)
    print_results(results, args.json)


if __name__ == "__main__":
    main()
