"""Samples/s and GB/s into GPU memory of one rank's windows: five ways of loading them, one run.

    python benchmarks/gpu_bench.py [--runs 3] [--out benchmarks/gpu_results.md] [--json out.json]
    python benchmarks/gpu_bench.py --device cpu --tiny      # the same code on CPU pipelines (CI)

Data: ``--files`` ERA5-like float32 ``.npy`` samples per shape (default 16 x (8, 721, 1440) and
16 x (8, 1024, 2048)); rank 1 of a model-parallel size of 4, latitude (axis 1) split with
``split="chunk"``. Loaders, all DALI pipelines on ``device_id=0`` (``None`` with ``--device cpu``):

  (a) ``fn.readers.numpy(device="gpu")`` with the rank's ROI (GPUDirect Storage when the machine has
      it: the output says which);
  (b) ``fn.readers.numpy`` on the CPU with the ROI, then ``.gpu()``;
  (c) full samples: ``fn.readers.numpy`` on the CPU, ``.gpu()``, then ``fn.slice`` of the rows
      (what most loaders do);
  (d) dali_mesh: ``partitioned_source(NumpySource, device="gpu")`` reads the owned rows plus one
      halo row each side (constant at the poles), then ``strided_slice`` on the GPU adds 2 periodic
      longitude cells each side, normalises per channel and casts to float16 (the ERA5 input of a
      model; more work than (a)-(c), which deliver the owned rows only);
  (e) dali_mesh's native reader: ``read_windows(NumpySource, device="gpu")`` (C++ ``preadv`` on
      DALI's threads into pinned staging, copied on the operator's stream; no worker processes),
      then the same ``strided_slice`` as (d).

Cold: the files are evicted from the page cache (``dali_mesh.io.pagecache.evict``) and a fresh
pipeline is built before each cold epoch; bytes from storage are ``read_bytes`` of this process and
its DALI workers. Warm: one epoch to warm up, then ``--runs`` epochs of the same pipeline. Epoch time
runs from the first ``run()`` to the last batch in GPU memory (device synchronised); build time is
not counted. Medians over ``--runs``. The first batch of every loader is checked against numpy
(``take_window`` / ``reference_strided_slice``); a mismatch is reported and the exit status is 1.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import statistics
import sys
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dali_mesh import Layout, MeshInfo  # noqa: E402
from dali_mesh._kernels import reference_strided_slice  # noqa: E402
from dali_mesh.io.pagecache import descendant_pids, evict, read_bytes  # noqa: E402
from dali_mesh.partition import take_window  # noqa: E402

RANKS, RANK, AXIS = 4, 1, 1
LOADERS = {
    "a": "(a) DALI readers.numpy(device=gpu), ROI",
    "b": "(b) DALI readers.numpy ROI (CPU), .gpu()",
    "c": "(c) full samples, .gpu(), fn.slice",
    "d": "(d) dali_mesh partitioned_source(gpu) + strided_slice (halo, normalise, float16)",
    "e": "(e) dali_mesh read_windows(gpu), native reader + strided_slice (halo, normalise, float16)",
}
DALI_MESH = ("d", "e")  # the loaders that deliver the ERA5 input (halo, normalised, float16)
LON_HALO = 2


def gds_status() -> str:
    """Whether GPUDirect Storage can work here (the nvidia-fs kernel module is loaded)."""
    if os.path.exists("/proc/driver/nvidia-fs") or os.path.exists("/sys/module/nvidia_fs"):
        return "GDS available (nvidia-fs loaded)"
    return "no GDS (nvidia-fs not loaded): DALI's GPU reader goes through cuFile's compatibility mode"


def make_data(folder: str, n: int, shape) -> list[str]:
    """``n`` float32 samples: a random row per channel plus a row ramp, cheap to write."""
    os.makedirs(folder, exist_ok=True)
    files = []
    for i in range(n):
        path = os.path.join(folder, f"s{'x'.join(map(str, shape))}_{i:03d}.npy")
        files.append(path)
        if os.path.exists(path) and np.load(path, mmap_mode="r").shape == tuple(shape):
            continue
        rng = np.random.default_rng(i)
        a = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=tuple(shape))
        row = rng.standard_normal((shape[0], 1, shape[2]), dtype=np.float32)
        a[...] = row + np.arange(shape[1], dtype=np.float32)[None, :, None] * 1e-2 + i
        a.flush()
        del a
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        os.fsync(fd)  # dirty pages cannot be evicted
        os.close(fd)
    return files


class Case:
    """One shape: its files, the rank's layouts and the numbers of each loader."""

    def __init__(self, files, shape, args):
        self.files, self.shape, self.args = files, tuple(shape), args
        mesh = MeshInfo((RANKS,), ("model_parallel",), (RANK,))
        self.owned = Layout(mesh, shard={"model_parallel": AXIS})
        self.halo = Layout(mesh, shard={"model_parallel": AXIS}, halo={AXIS: 1}, boundary={AXIS: "constant"})
        self.region = self.owned.region(self.shape)
        self.halo_region = self.halo.region(self.shape)
        c = self.shape[0]
        self.mean = [float(v) for v in np.linspace(-1, 1, c)]
        self.std = [float(v) for v in np.linspace(0.5, 2, c)]
        h = self.halo_region.window_shape
        self.d_start = [0, 0, -LON_HALO]
        self.d_shape = [h[0], h[1], h[2] + 2 * LON_HALO]
        self.out_bytes = {k: int(np.prod(self.region.shape)) * 4 for k in "abc"}
        self.out_bytes["d"] = self.out_bytes["e"] = int(np.prod(self.d_shape)) * 2

    # ---- pipelines ---------------------------------------------------------------------------------
    def pipeline(self, key):
        from nvidia.dali import fn, pipeline_def, types

        import dali_mesh.fn as dfn
        from dali_mesh.source import NumpySource

        gpu = self.args.device == "gpu"
        bs, files = self.args.batch_size, self.files
        roi = {"roi_start": list(self.region.start), "roi_end": list(self.region.stop)}
        common = dict(batch_size=bs, num_threads=self.args.threads, device_id=0 if gpu else None,
                      prefetch_queue_depth=2)

        def reader(**kw):
            return fn.readers.numpy(files=files, random_shuffle=False, name="reader", **kw)

        if key == "a":
            @pipeline_def(**common)
            def pipe():
                return reader(device="gpu" if gpu else "cpu", **roi)
        elif key == "b":
            @pipeline_def(**common)
            def pipe():
                x = reader(**roi)
                return x.gpu() if gpu else x
        elif key == "c":
            @pipeline_def(**common)
            def pipe():
                x = reader()
                x = x.gpu() if gpu else x
                return fn.slice(x, start=[self.region.start[AXIS]], shape=[self.region.shape[AXIS]], axes=[AXIS])
        else:
            source = NumpySource(files, self.halo, batch_size=bs, shuffle=False)

            @pipeline_def(**common, py_num_workers=self.args.workers, py_start_method="spawn")
            def pipe():
                if key == "e":
                    window, sample_id, _ = dfn.read_windows(source, device="gpu" if gpu else "cpu",
                                                            fallback=False)
                else:
                    window, sample_id, _ = dfn.partitioned_source(source, device="gpu" if gpu else "cpu")
                return dfn.strided_slice(window, self.d_start, self.d_shape,
                                         boundary=["constant", "constant", "periodic"], dtype=types.FLOAT16,
                                         channel_axis=0, mean=self.mean, std=self.std), sample_id
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # unused outputs of the source
            p = pipe()
            p.build()
        return p

    def epoch(self, p, key, keep_first: bool = False) -> tuple[float, list | None]:
        """Seconds of one epoch (to the last batch in device memory); with ``keep_first`` also the
        first batch's outputs as numpy arrays (copied at once: DALI reuses its output buffers)."""
        n_iter = len(self.files) // self.args.batch_size
        t0 = time.perf_counter()
        first = None
        for i in range(n_iter):
            out = p.run()
            if i == 0 and keep_first:
                first = [[np.array(t) for t in (o.as_cpu() if hasattr(o, "as_cpu") else o)] for o in out]
        if key in DALI_MESH:  # the source ends its epoch: the next run raises StopIteration
            try:
                p.run()
                raise AssertionError("the dali_mesh source did not end its epoch")
            except StopIteration:
                p.reset()
        sync(self.args.device)
        return time.perf_counter() - t0, first

    def check(self, key, first) -> str:
        """'' when the first batch equals numpy, else what differs."""
        for k, got in enumerate(first[0]):
            if key in DALI_MESH:
                sid = int(first[1][k])
                window = take_window(np.load(self.files[sid]), self.halo_region)
                want = reference_strided_slice(window, self.d_start, self.d_shape, 1,
                                               ["constant", "constant", "periodic"], dtype=np.float16,
                                               channel_axis=0, mean=self.mean, std=self.std)
            else:
                want = take_window(np.load(self.files[k]), self.region)
            if got.shape != want.shape or got.dtype != want.dtype or not np.array_equal(got, want):
                diff = "-" if got.shape != want.shape else np.abs(got.astype(np.float64) - want).max()
                return (f"sample {k}: got {got.dtype}{got.shape}, want {want.dtype}{want.shape}, "
                        f"max abs diff {diff}")
        return ""


def sync(device: str) -> None:
    if device != "gpu":
        return
    try:
        import torch

        torch.cuda.synchronize()
        return
    except ImportError:
        pass
    import cupy

    cupy.cuda.runtime.deviceSynchronize()


def measure(case: Case, keys, runs: int) -> dict:
    res = {k: {"cold_s": [], "cold_bytes": [], "warm_s": [], "error": "", "mismatch": ""} for k in keys}
    me = os.getpid()
    for _ in range(runs):  # cold, loaders interleaved so that drift hits all alike
        for k in keys:
            if res[k]["error"]:
                continue
            try:
                evict(case.files)
                b0 = read_bytes([me] + descendant_pids(me))
                p = case.pipeline(k)
                b1 = read_bytes([me] + descendant_pids(me))
                seconds, _ = case.epoch(p, k)
                b2 = read_bytes([me] + descendant_pids(me))
                res[k]["cold_s"].append(seconds)
                if None not in (b0, b1, b2):
                    res[k]["cold_bytes"].append(b2 - b0)
                del p
            except Exception as e:  # noqa: BLE001 (a loader that cannot run here is reported, not fatal)
                res[k]["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
    for k in keys:
        if res[k]["error"]:
            continue
        try:
            p = case.pipeline(k)
            _, first = case.epoch(p, k, keep_first=True)  # warm-up epoch; its first batch is checked
            res[k]["mismatch"] = case.check(k, first)
            for _ in range(runs):
                res[k]["warm_s"].append(case.epoch(p, k)[0])
            del p
        except Exception as e:  # noqa: BLE001
            res[k]["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
    return res


def machine(device: str) -> dict:
    info = {"host": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}",
            "python": platform.python_version(), "numpy": np.__version__}
    try:
        import nvidia.dali as dali

        info["dali"] = dali.__version__
        from nvidia.dali import backend

        v = backend.GetCudaVersion()
        if v:
            info["dali_cuda_runtime"] = f"{v // 1000}.{v % 1000 // 10}"
    except Exception as e:  # noqa: BLE001
        info.setdefault("dali", f"not importable ({e})")
    try:
        from dali_mesh import _build_info

        info["plugin"] = (f"built with CUDA {getattr(_build_info, 'CUDA_VERSION', '?')} for "
                          f"{getattr(_build_info, 'CUDA_ARCHS', '?')}, DALI {_build_info.DALI_VERSION}")
    except ImportError:
        info["plugin"] = "no _build_info (plugin not built)"
    if device == "gpu":
        try:
            import torch

            info["gpu"] = torch.cuda.get_device_name(0)
            info["torch"] = f"{torch.__version__} (CUDA {torch.version.cuda})"
        except Exception as e:  # noqa: BLE001
            info["gpu"] = f"? ({e})"
        smi = shutil.which("nvidia-smi")
        if smi:
            import subprocess

            q = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                               text=True).stdout.strip()
            info["driver"] = q.splitlines()[0] if q else "?"
        info["gds"] = gds_status()
    return info


def fmt(x, spec) -> str:
    return "-" if x is None else format(x, spec)


def report(cases_res, info, args, command) -> tuple[str, float | None, bool]:
    gpu = args.device == "gpu"
    lines = ["# GPU throughput: one rank's windows into GPU memory", "",
             f"`{command}`", "", f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; " +
             "; ".join(f"{k}: {v}" for k, v in info.items()), ""]
    if not gpu:
        lines += ["**CPU pipelines (`--device cpu`)**: the code paths of the GPU run, numbers of no GPU meaning.", ""]
    lines += [f"Rank {RANK} of {RANKS}, axis {AXIS} split (chunk); batch {args.batch_size}, {args.threads} DALI "
              f"threads, {args.workers} source workers; medians of {args.runs} cold and {args.runs} warm epochs. "
              "GB/s = bytes of the delivered windows per second ((a)-(c): owned rows, float32; (d), (e): owned rows "
              "+ halo, float16).", "",
              "| shape | loader | cold samples/s | cold GB/s | cold bytes from storage / window | warm samples/s | "
              "warm GB/s | checked |", "|---|---|---|---|---|---|---|---|"]
    headline, ok = None, True
    for case, res in cases_res:
        n = len(case.files)
        window_file_bytes = int(np.prod(case.region.shape)) * 4
        for k, r in res.items():
            if r["error"]:
                ok = False
                lines.append(f"| {case.shape} | {LOADERS[k]} | could not run: {r['error']} | | | | | |")
                continue
            cold = statistics.median(r["cold_s"]) if r["cold_s"] else None
            warm = statistics.median(r["warm_s"]) if r["warm_s"] else None
            cold_rate = None if cold is None else n / cold
            warm_rate = None if warm is None else n / warm
            r["cold_samples_per_s"], r["warm_samples_per_s"] = cold_rate, warm_rate
            if k in DALI_MESH and (headline is None or k == "e"):
                headline = warm_rate
            bytes_ratio = statistics.median(r["cold_bytes"]) / (window_file_bytes * n) if r["cold_bytes"] else None
            ok = ok and not r["mismatch"]
            lines.append(
                f"| {case.shape} | {LOADERS[k]} | {fmt(cold_rate, '.1f')} | "
                f"{fmt(None if cold_rate is None else cold_rate * case.out_bytes[k] / 1e9, '.2f')} | "
                f"{fmt(bytes_ratio, '.2f')}x | {fmt(warm_rate, '.1f')} | "
                f"{fmt(None if warm_rate is None else warm_rate * case.out_bytes[k] / 1e9, '.2f')} | "
                f"{'MISMATCH ' + r['mismatch'] if r['mismatch'] else 'equal to numpy'} |")
    lines += ["", "Targets (issues 8 and 11): (d) and (e) warm >= (a) warm; cold > (a), (b) and (c) cold."]
    for case, res in cases_res:
        others = {k: r for k, r in res.items() if k not in DALI_MESH and not r["error"]}
        warm_a = others.get("a", {}).get("warm_samples_per_s")
        cold_best = max((r["cold_samples_per_s"] for r in others.values() if r.get("cold_samples_per_s")), default=None)
        for key in DALI_MESH:
            d = res.get(key, {})
            if key not in res or d.get("error"):
                continue
            lines.append(f"- {case.shape}: ({key}) warm / (a) warm = "
                         f"{fmt(None if not warm_a else d['warm_samples_per_s'] / warm_a, '.2f')}x; ({key}) cold / "
                         f"best of (a)-(c) cold = "
                         f"{fmt(None if not cold_best else d['cold_samples_per_s'] / cold_best, '.2f')}x")
    return "\n".join(lines) + "\n", headline, ok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("gpu", "cpu"), default="gpu", help="cpu: CPU pipelines (device_id=None)")
    ap.add_argument("--tiny", action="store_true", help="4 files of (2, 21, 40), 1 run: a smoke test")
    ap.add_argument("--files", type=int, default=16)
    ap.add_argument("--shapes", nargs="+", default=["8,721,1440", "8,1024,2048"])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--threads", type=int, default=min(8, os.cpu_count() or 2))
    ap.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 2))
    ap.add_argument("--loaders", default="abcde", help="which of a, b, c, d, e")
    ap.add_argument("--dir", default="/tmp/dali_mesh_gpu_bench")
    ap.add_argument("--keep", action="store_true", help="keep the data")
    ap.add_argument("--out", help="write the markdown here (default: print only)")
    ap.add_argument("--json", help="write the numbers here")
    args = ap.parse_args(argv)
    if args.tiny:
        args.files, args.shapes, args.runs, args.batch_size = 4, ["2,21,40"], 1, 2
        args.threads, args.workers = 1, 1
    if args.files % args.batch_size:
        ap.error(f"--files {args.files} must be a multiple of --batch-size {args.batch_size} (whole epochs)")
    shapes = [tuple(int(v) for v in s.split(",")) for s in args.shapes]
    if any(len(s) != 3 for s in shapes):
        ap.error(f"--shapes {args.shapes}: each must be C,H,W")
    keys = [k for k in "abcde" if k in args.loaders]
    if args.device == "gpu":
        try:
            import torch

            if not torch.cuda.is_available():
                raise SystemExit("gpu_bench.py needs a CUDA GPU (torch.cuda.is_available() is False); "
                                 "--device cpu runs the same pipelines on the CPU")
        except ImportError:
            pass  # cupy synchronises instead
    os.environ["PYTHONPATH"] = os.pathsep.join(  # DALI's spawn workers import dali_mesh from here
        p for p in (os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.environ.get("PYTHONPATH")) if p)
    command = shlex.join(["python", "benchmarks/gpu_bench.py", *(argv if argv is not None else sys.argv[1:])])
    cases_res = []
    try:
        for shape in shapes:
            files = make_data(os.path.join(args.dir, "x".join(map(str, shape))), args.files, shape)
            case = Case(files, shape, args)
            cases_res.append((case, measure(case, keys, args.runs)))
            print(f"{shape} done", file=sys.stderr, flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(args.dir, ignore_errors=True)
    info = machine(args.device)
    md, headline, ok = report(cases_res, info, args, command)
    print(md)
    if args.out:
        with open(args.out, "w") as f:
            f.write(md)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": command, "machine": info, "headline_samples_per_s": headline, "ok": ok,
                       "markdown": md, "cases": [{"shape": c.shape, "results": r} for c, r in cases_res]}, f, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
