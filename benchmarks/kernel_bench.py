"""GPU benchmark of the strided-slice kernel (the code the DALI GPU operator launches), through the
DALI-free library on torch (or cupy) device memory; no DALI needed.

Reports GB/s (bytes read + bytes written) next to the device-to-device copy bandwidth measured in the
same run (``dst.copy_(src)`` of the same byte count, read + written), for batches >= 256 MiB:

* ``inside``: windows inside the samples, step 1, no cast (16-byte moves where alignment allows);
  target >= 85% of the copy bandwidth;
* ``periodic_halo``: ERA5-like rows of one rank with 1 constant halo row each side and 2 periodic
  halo cells in longitude; target >= 75%;
* ``normalise_f16``: the same window, per-channel normalisation and a cast to float16 (for info).

Each result is checked against the host emulation of the kernel on a small sample first.

    python benchmarks/kernel_bench.py [--iters 20] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, not installed
from dali_mesh import _kernels as K  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json")
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("kernel_bench.py needs a CUDA GPU (torch.cuda.is_available() is False)")
    if not K.has_cuda():
        raise SystemExit(f"{K.library_path()} was built without CUDA: rebuild with nvcc on PATH")
    dev = torch.device("cuda")
    stream = torch.cuda.current_stream()

    def timed(fn) -> float:
        for _ in range(3):
            fn()
        start = [torch.cuda.Event(enable_timing=True) for _ in range(args.iters)]
        end = [torch.cuda.Event(enable_timing=True) for _ in range(args.iters)]
        for s, e in zip(start, end):
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in zip(start, end)) / 1e3

    results = {"device": torch.cuda.get_device_name(), "iters": args.iters, "cases": {}}
    launcher = K.CudaLauncher()

    def bench(name, shape, nsamples, start, wshape, boundary, out_dtype=np.float32, **kw):
        samples = [torch.randn(shape, device=dev, dtype=torch.float32) for _ in range(nsamples)]
        tdt = {np.float32: torch.float32, np.float16: torch.float16}[out_dtype]
        outs = [torch.empty(wshape, device=dev, dtype=tdt) for _ in range(nsamples)]
        ndim = len(shape)
        bnd = [boundary] * ndim if isinstance(boundary, str) else boundary

        def run():
            K.strided_slice_device([s.data_ptr() for s in samples], [o.data_ptr() for o in outs],
                                   [shape] * nsamples, start, wshape, 1, bnd, in_dtype=np.float32,
                                   out_dtype=out_dtype, stream=stream.cuda_stream, launcher=launcher,
                                   **kw)

        run()
        torch.cuda.synchronize()
        ref = K.strided_slice_host([samples[0].cpu().numpy()], start, wshape, 1, bnd, dtype=out_dtype,
                                   backend="cpu", **kw)[0]
        np.testing.assert_array_equal(outs[0].cpu().numpy(), ref)
        t = timed(run)
        out_bytes = int(np.prod(wshape)) * np.dtype(out_dtype).itemsize * nsamples
        read_bytes = int(np.prod(wshape)) * 4 * nsamples  # each window cell read once
        moved = read_bytes + out_bytes
        src = torch.empty(moved // 2, dtype=torch.uint8, device=dev)
        dst = torch.empty_like(src)
        t_copy = timed(lambda: dst.copy_(src))
        gbs, copy_gbs = moved / t / 1e9, 2 * src.numel() / t_copy / 1e9
        results["cases"][name] = {
            "batch": f"{nsamples} x float32 {tuple(shape)} = {nsamples * np.prod(shape) * 4 / 2**20:.0f} MiB",
            "window": f"start {start} shape {wshape} {boundary} -> {np.dtype(out_dtype).name}",
            "kernel_s": t, "kernel_GBps": gbs, "d2d_copy_GBps": copy_gbs, "fraction_of_copy": gbs / copy_gbs,
        }
        del samples, outs, src, dst
        torch.cuda.empty_cache()

    bench("inside", (16, 1024, 1024), 6, [0, 128, 0], [16, 768, 1024], "constant")
    bench("inside_cols", (16, 1024, 1024), 6, [0, 128, 256], [16, 768, 512], "constant")
    era_start, era_shape = [0, 180, -2], [16, 183, 1444]
    bnd = ["constant", "constant", "periodic"]
    bench("periodic_halo", (16, 721, 1440), 8, era_start, [16, 183, 1444], bnd)
    bench("periodic_halo_full", (16, 721, 1440), 4, [0, -1, -2], [16, 723, 1444], bnd)
    mean = [float(v) for v in np.linspace(-1, 1, 16)]
    std = [float(v) for v in np.linspace(0.5, 2, 16)]
    bench("normalise_f16", (16, 721, 1440), 8, era_start, era_shape, bnd, out_dtype=np.float16,
          channel_axis=0, mean=mean, std=std)
    launcher.close()
    print(json.dumps(results, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
