"""Cold bytes of an innermost-axis split before and after ``dali-mesh convert``.

Data: ``--samples`` .npy files of float32 ``--shape`` (default 8 x (8, 721, 1440), ERA5-like: the
split runs along longitude, the innermost axis), split over ``--mp`` ranks (default 4) along the
last axis, no halo. The folder is converted with :func:`dali_mesh.cli.convert.convert_array` to HDF5 and
to Zarr (chunks aligned with the shards, uncompressed), then for every rank and format: all files are
evicted from the page cache (``fsync`` + ``POSIX_FADV_DONTNEED``, :mod:`dali_mesh.io.pagecache`), the
rank's window of every sample is read with the dali_mesh readers, and ``read_bytes`` of
``/proc/self/io`` (bytes this process pulled from storage) is compared with the window bytes. The
readers' own counters (``IOStats.bytes_read``) and ``plan --data``'s prediction are listed too.

HDF5 is read twice: through h5py's own file descriptor (the kernel's readahead then pulls neighbouring
chunks of other ranks) and with ``random_access=True`` (the file opened by Python with
``POSIX_FADV_RANDOM`` and handed to h5py).

Writes a markdown table to ``--out`` (default benchmarks/convert_results.md) and prints it. Run:
``python benchmarks/convert_bench.py`` (about a minute on 2 cores; ~1 GiB free in ``--dir``; the data
is deleted afterwards unless ``--keep``).
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dali_mesh import Layout, MeshInfo  # noqa: E402
from dali_mesh.cli.advice import open_layout_target  # noqa: E402
from dali_mesh.cli.convert import convert_array  # noqa: E402
from dali_mesh.formats.npy import read_npy_window  # noqa: E402
from dali_mesh.io import IOStats  # noqa: E402
from dali_mesh.formats.hdf5 import open_hdf5_dataset, read_hdf5_window  # noqa: E402
from dali_mesh.io.pagecache import evict, read_bytes  # noqa: E402
from dali_mesh.formats.zarr import open_zarr_array, read_zarr_window  # noqa: E402


def cold_epoch(paths, read_all):
    """``(bytes from storage, IOStats, seconds)`` of ``read_all(stats)`` after evicting ``paths``."""
    evict(paths)
    stats = IOStats()
    before = read_bytes()
    t0 = time.perf_counter()
    read_all(stats)
    seconds = time.perf_counter() - t0
    return read_bytes() - before, stats, seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", default="/tmp/dali_mesh_convert_bench")
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--shape", default="8,721,1440")
    p.add_argument("--mp", type=int, default=4)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "convert_results.md"))
    p.add_argument("--keep", action="store_true")
    args = p.parse_args()
    if read_bytes() is None:
        sys.exit("/proc/self/io has no read_bytes here: cold bytes cannot be measured")
    shape = tuple(int(s) for s in args.shape.split(","))
    src = os.path.join(args.dir, "npy")
    os.makedirs(src, exist_ok=True)
    rng = np.random.default_rng(0)
    files = []
    for i in range(args.samples):
        f = os.path.join(src, f"sample_{i:05d}.npy")
        if not os.path.exists(f):
            np.save(f, rng.standard_normal(shape, dtype=np.float32))
        files.append(f)
    mesh = MeshInfo((args.mp,), ("model_parallel",))
    axis = len(shape) - 1
    layout = Layout(mesh, shard={"model_parallel": axis})
    outputs = {}
    convert_lines = []
    for suffix in (".h5", ".zarr"):
        dst = os.path.join(args.dir, "converted" + suffix)
        t0 = time.perf_counter()
        res = convert_array(src, dst, layout, workers=args.workers, overwrite=True, progress=False)
        convert_lines.append(f"- {suffix[1:]}: chunks {res.chunks}, {res.bytes_written / 2**20:.0f} MiB copied and "
                             f"verified in {time.perf_counter() - t0:.1f} s ({args.workers} threads)")
        outputs[suffix] = dst

    def npy_reader(region):
        def run(stats):
            for f in files:
                read_npy_window(f, region, stats=stats)
        return run

    def h5_reader(region, random_access):
        def run(stats):
            f, ds = open_hdf5_dataset(outputs[".h5"], "data", random_access=random_access)
            with f:
                for i in range(args.samples):
                    read_hdf5_window(ds, region, prefix=(i,), stats=stats)
        return run

    def zarr_reader(region):
        def run(stats):
            arr = open_zarr_array(outputs[".zarr"], "data")
            for i in range(args.samples):
                read_zarr_window(arr, region, prefix=(i,), stats=stats)
        return run

    predicted = {
        "npy": open_layout_target(files[0]),
        "h5": open_layout_target(outputs[".h5"], "data"),
        "zarr": open_layout_target(outputs[".zarr"], "data"),
    }
    rows = []
    for rank in range(args.mp):
        region = layout.region(shape, mesh.coordinate_of(rank))
        cases = [
            ("npy (before)", files, npy_reader(region), "npy"),
            ("HDF5, h5py's descriptor", [outputs[".h5"]], h5_reader(region, False), "h5"),
            ("HDF5, random_access=True", [outputs[".h5"]], h5_reader(region, True), "h5"),
            ("Zarr", [outputs[".zarr"]], zarr_reader(region), "zarr"),
        ]
        for label, paths, run, key in cases:
            cold, stats, seconds = cold_epoch(paths, run)
            window = stats.window_bytes
            plan = predicted[key].cost(region)[1] * args.samples
            rows.append((rank, label, window, cold, stats.bytes_read, plan, seconds))
    head = ("| rank | format | window MiB | cold read MiB (/proc/self/io) | x window | IOStats MiB | "
            "plan --data MiB | s |")
    lines = [
        "# Cold bytes of an innermost-axis split, before and after `dali-mesh convert`",
        "",
        f"Command: `python benchmarks/convert_bench.py --samples {args.samples} --shape {args.shape} --mp {args.mp} "
        f"--workers {args.workers}`",
        f"Machine: {platform.node() or 'unknown'}, {os.cpu_count()} cores, {platform.platform()}; files on "
        f"{args.dir}; evicted before every row (fsync + POSIX_FADV_DONTNEED).",
        f"Data: {args.samples} samples of float32 {shape} ({np.prod(shape) * 4 / 2**20:.1f} MiB each), split along "
        f"axis {axis} over {args.mp} ranks; every rank reads its window of every sample.",
        "",
        "Conversion:",
        *convert_lines,
        "",
        head,
        "|---|---|---|---|---|---|---|---|",
    ]
    mib = 2**20
    for rank, label, window, cold, counted, plan, seconds in rows:
        lines.append(f"| {rank} | {label} | {window / mib:.1f} | {cold / mib:.1f} | {cold / window:.2f} | "
                     f"{counted / mib:.1f} | {plan / mib:.1f} | {seconds:.2f} |")
    lines += ["", "Cold read / window bytes, over the ranks (min-max):"]
    for label in dict.fromkeys(r[1] for r in rows):
        ratios = [r[3] / r[2] for r in rows if r[1] == label]
        lines.append(f"- {label}: {min(ratios):.2f}x-{max(ratios):.2f}x")
    text = "\n".join(lines) + "\n"
    print(text)
    with open(args.out, "w") as f:
        f.write(text)
    if not args.keep:
        shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
