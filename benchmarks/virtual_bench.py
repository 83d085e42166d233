"""Virtual datasets (issue 43's "Performance"): an ERA5-like archive of NetCDF4 files (gzip + shuffle chunks)
referenced by kerchunk, read by dali_mesh natively and by xarray + zarr-python over fsspec's
ReferenceFileSystem, the same windows from the same reference set, side by side in one run, local and
from a loopback S3 server with latency per request.

    python benchmarks/virtual_bench.py [--files 2] [--steps-per-file 4] [--runs 3] [--latencies 0.02] [--quick]

Data: ``--files`` NetCDF4 files written by xarray (h5netcdf), each ``--steps-per-file`` steps of the variables
VARIABLES at (721, 1440) float32 (compressed_bench.py's smooth ERA5-like fields plus noise), one time unit
for all files, gzip level 4 + shuffle; combined along time by kerchunk (SingleHdf5ToZarr, MultiZarrToZarr,
nothing inlined) into one JSON reference set per chunking:
  whole   chunks (1, 721, 1440): a whole field per chunk (as most archives are written)
  band    chunks (1, 181, 1440): latitude bands aligned with the split (rank 1's window is one chunk)
Rank 1 of 4, latitude split (torch.chunk: rows 181..362 of every variable), one sample per step, no halo.
Readers (each reads every step's window of every variable, in order):
  native   dali_mesh ZarrDatasetSource(reference://set) + fn.read_dataset(fallback=False): a CPU pipeline
           (device_id=None), batch 1, 2 threads; the references resolved at planning, the files' ranges
           read and decoded (inflate, unshuffle) by the plugin
  xarray   xarray.open_dataset("reference://", engine="zarr", chunks=None, storage_options fo=set):
           ``ds[v].isel(time=t, latitude=band).values`` per variable and step (zarr-python fetches the
           band's chunks concurrently through fsspec's ReferenceFileSystem; whole chunks, as stored)
Per run, link, chunking and reader: a new reader (nothing cached from an earlier one); ``open`` = making it
(the set read, metadata, plans, pipeline build), ``epoch`` = reading every window. Local: the NetCDF files
evicted from the page cache (posix_fadvise DONTNEED after fsync) before the reader is made, bytes =
``read_bytes`` of /proc/<pid>/io of this process and its children over open + epoch. Remote
(benchmarks/s3_server.py serving the same files, the set naming s3:// URLs): bytes and requests counted
at the server from the reader's creation to the epoch's end. ``stored`` = the compressed bytes of the
chunks the window touches (the set's lengths). The first run checks both readers' windows against each
other and against the fields written. Medians over ``--runs``; ratios: the median of per-run ratios to
xarray's, measured in the same run. Readers take turns going first.

``--quick``: 2 files of 2 steps of (181, 360), one run (a CI-size check that both readers run and agree).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

from benchmarks.remote_bench import BUCKET, Server, _options  # noqa: E402

VARIABLES = ("t2m", "u10", "v10", "msl")
CHUNKINGS = ("whole", "band")
READERS = ("native", "xarray")
RANKS, RANK = 4, 1


def _fields(steps: int, shape) -> np.ndarray:
    """Smooth ERA5-like fields (large-scale waves, a trend by latitude) plus noise at 1e-3 of the signal
    (compressed_bench.py's), ``(steps, len(VARIABLES), *shape)``."""
    rng = np.random.default_rng(0)
    lat = np.linspace(-np.pi / 2, np.pi / 2, shape[0])[:, None]
    lon = np.linspace(0, 2 * np.pi, shape[1], endpoint=False)[None, :]
    out = np.empty((steps, len(VARIABLES)) + tuple(shape), np.float32)
    for t in range(steps):
        for c in range(len(VARIABLES)):
            base = 250 + 40 * np.cos(lat) + 5 * np.sin(3 * lon + 0.2 * t + c) * np.cos(2 * lat)
            out[t, c] = base + rng.standard_normal(shape).astype(np.float32) * 0.05
    return out


def _band_rows(h: int) -> int:
    """Rows of a latitude band aligned with the split (torch.chunk: the first ranks' share)."""
    return -(-h // RANKS)


def _write(folder: str, chunking: str, data: np.ndarray, files: int) -> list[str]:
    """The NetCDF4 files of ``data`` (steps split evenly among ``files``) under ``folder``."""
    import pandas as pd
    import xarray as xr

    steps, _, h, w = data.shape
    per = steps // files
    chunks = (1, h if chunking == "whole" else _band_rows(h), w)
    time_axis = pd.date_range("2020-01-01", periods=steps, freq="6h")
    os.makedirs(folder, exist_ok=True)
    paths = []
    for k in range(files):
        part = slice(k * per, (k + 1) * per)
        ds = xr.Dataset({v: (("time", "latitude", "longitude"), data[part, c]) for c, v in enumerate(VARIABLES)},
                        coords={"time": time_axis[part], "latitude": np.linspace(90, -90, h),
                                "longitude": np.linspace(0, 360, w, endpoint=False)})
        enc = {v: {"zlib": True, "complevel": 4, "shuffle": True, "chunksizes": chunks} for v in VARIABLES}
        path = os.path.join(folder, f"era5_{k}.nc")
        ds.to_netcdf(path, engine="h5netcdf", encoding={**enc, "time": {"units": "hours since 2020-01-01"}})
        paths.append(path)
    return paths


def _reference(paths: list[str], out: str) -> dict:
    """The kerchunk set of ``paths`` combined along time, written to ``out``."""
    from kerchunk.combine import MultiZarrToZarr
    from kerchunk.hdf import SingleHdf5ToZarr

    singles = [SingleHdf5ToZarr(p, inline_threshold=0).translate() for p in paths]
    refs = MultiZarrToZarr(singles, concat_dims=["time"], identical_dims=["latitude", "longitude"],
                           inline_threshold=0).translate()
    _dump(refs, out)
    return refs


def _dump(refs: dict, out: str) -> None:
    with open(out, "w") as f:
        json.dump(refs, f)


def _moved(refs: dict, url) -> dict:
    """``refs`` naming each file ``url(path)`` (the same files, served by the S3 server)."""
    return {**refs, "refs": {k: [url(v[0]), *v[1:]] if isinstance(v, list) else v for k, v in refs["refs"].items()}}


def _stored_touched(refs: dict, chunks_rows: int, rows: tuple[int, int]) -> int:
    """Compressed bytes of the chunks of the variables that rows ``[rows)`` touch (the set's lengths)."""
    first, last = rows[0] // chunks_rows, (rows[1] - 1) // chunks_rows
    total = 0
    for key, ref in refs["refs"].items():
        name, _, index = key.rpartition("/")
        if name in VARIABLES and isinstance(ref, list) and first <= int(index.split(".")[1]) <= last:
            total += int(ref[2])
    return total


# ---- readers ------------------------------------------------------------------------------------------------
class _Native:
    def __init__(self, location: str, layout, storage_options=None):
        from nvidia.dali import pipeline_def

        from dali_mesh import ZarrDatasetSource
        from dali_mesh.fn import read_dataset

        kw = {"storage_options": storage_options} if storage_options is not None else {}
        self.src = ZarrDatasetSource(f"reference://{location}", list(VARIABLES), layout, batch_size=1,
                                     shuffle=False, dtype=np.float32, **kw)

        @pipeline_def(batch_size=1, num_threads=2, device_id=None, prefetch_queue_depth=1)
        def pipe():
            return read_dataset(self.src, fallback=False)[0]

        self.pipe = pipe()
        self.pipe.build()

    def epoch(self) -> list:
        from benchmarks._common import pipeline_epoch

        return pipeline_epoch(self.pipe, keep=True)


class _Xarray:
    def __init__(self, location: str, rows: tuple[int, int], endpoint: str | None = None):
        import xarray as xr

        so = {"fo": location}
        if endpoint is not None:
            from tests.storage.s3_server import KEY, SECRET

            so.update(remote_protocol="s3", remote_options={
                "endpoint_url": endpoint, "key": KEY, "secret": SECRET, "skip_instance_cache": True,
                "asynchronous": True,  # zarr-python opens the reference filesystem asynchronous: its files too
                "client_kwargs": {"region_name": "us-east-1"}})
        self.ds = xr.open_dataset("reference://", engine="zarr", consolidated=False, chunks=None,
                                  backend_kwargs={"storage_options": so})
        self.rows = slice(*rows)

    def epoch(self) -> list:
        return [np.stack([self.ds[v].isel(time=t, latitude=self.rows).values for v in VARIABLES])
                for t in range(self.ds.sizes["time"])]


# ---- measuring ------------------------------------------------------------------------------------------------
def _measure(reader: str, location: str, layout, rows, paths, server=None) -> tuple[dict, list]:
    """One cold read of every window by ``reader``: open and epoch seconds, bytes (and requests remote)."""
    from dali_mesh.io.pagecache import descendant_pids, evict, read_bytes

    pids = lambda: [os.getpid()] + descendant_pids(os.getpid())  # noqa: E731
    if server is None:
        evict(paths)
        before = read_bytes(pids())
    else:
        server.control("reset")
    t0 = time.perf_counter()
    if reader == "native":
        r = _Native(location, layout, None if server is None else _options(server.endpoint))
    else:
        r = _Xarray(location, rows, None if server is None else server.endpoint)
    t1 = time.perf_counter()
    got = r.epoch()
    t2 = time.perf_counter()
    out = {"open": t1 - t0, "epoch": t2 - t1}
    if server is None:
        out["bytes"] = read_bytes(pids()) - before
    else:
        counts = server.control("counts")
        out["bytes"], out["requests"] = counts["bytes"], counts["requests"]
    return out, got


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=2)
    ap.add_argument("--steps-per-file", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--latencies", default="0.02", help="seconds per request of the remote runs (comma list)")
    ap.add_argument("--shape", default="721,1440")
    ap.add_argument("--dir", default=None, help="where the files go (default: a temporary folder, removed)")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.files, args.steps_per_file, args.runs, args.shape = 2, 2, 1, "181,360"
    shape = tuple(int(s) for s in args.shape.split(","))
    latencies = [float(x) for x in args.latencies.split(",") if x]
    from dali_mesh import MeshInfo, NamedLayout

    layout = NamedLayout(MeshInfo((RANKS,), ("mp",), (RANK,)), shard={"mp": "latitude"})
    folder = args.dir or tempfile.mkdtemp(prefix="dali_mesh_virtual_")
    os.makedirs(folder, exist_ok=True)
    data = _fields(args.files * args.steps_per_file, shape)
    server = None
    try:
        sets, stored, rows = {}, {}, None
        for chunking in CHUNKINGS:
            files_dir = os.path.join(folder, BUCKET, chunking)
            paths = _write(files_dir, chunking, data, args.files)
            local = os.path.join(folder, f"{chunking}.json")
            refs = _reference(paths, local)
            remote = os.path.join(folder, f"{chunking}-s3.json")
            _dump(_moved(refs, lambda p, c=chunking: f"s3://{BUCKET}/{c}/{os.path.basename(p)}"), remote)
            sets[chunking] = (local, remote, paths)
            rows = _rank_rows(shape[0])
            chunk_rows = shape[0] if chunking == "whole" else _band_rows(shape[0])
            stored[chunking] = _stored_touched(refs, chunk_rows, rows)
        server = Server(folder) if latencies else None  # serving the files written: ROOT/BUCKET/chunking/
        want = [data[t][:, rows[0]:rows[1]] for t in range(len(data))]
        window_bytes = sum(w.nbytes for w in want)
        links = [None] + latencies
        res: dict = {}
        for run in range(args.runs):
            for link in links:
                if link is not None:
                    server.link((link, 0))
                for chunking in CHUNKINGS:
                    local, remote, paths = sets[chunking]
                    order = READERS if run % 2 == 0 else READERS[::-1]
                    for reader in order:
                        m, got = _measure(reader, local if link is None else remote, layout, rows, paths,
                                          None if link is None else server)
                        if run == 0:
                            for t, (g, w) in enumerate(zip(got, want)):
                                np.testing.assert_array_equal(np.asarray(g).reshape(w.shape), w,
                                                              err_msg=f"{reader} {chunking} {link} step {t}")
                        res.setdefault((link, chunking, reader), []).append(m)
                        print(f"run {run} link {link} {chunking} {reader}: {m}", file=sys.stderr)
        _report(args, shape, rows, res, stored, window_bytes, links)
    finally:
        if server is not None:
            server.close()
        if args.dir is None:
            shutil.rmtree(folder, ignore_errors=True)


def _rank_rows(h: int) -> tuple[int, int]:
    """Rank RANK's latitude rows ``[first, stop)`` as torch.chunk splits ``h`` rows (the layout's default
    split; the first run's check holds the two together)."""
    band = _band_rows(h)
    return band * RANK, min(h, band * (RANK + 1))


def _report(args, shape, rows, res, stored, window_bytes, links) -> None:
    import platform

    from importlib.metadata import version

    print(f"{args.files} NetCDF4 files x {args.steps_per_file} steps x {len(VARIABLES)} variables {shape} float32, "
          f"gzip 4 + shuffle, kerchunk JSON set; rank {RANK} of {RANKS} (latitude rows {rows[0]}..{rows[1]}); "
          f"medians of {args.runs} runs; {platform.node()}, {os.cpu_count()} CPUs, load average at the end "
          f"{os.getloadavg()[0]:.1f}; xarray {version('xarray')}, zarr {version('zarr')}, fsspec "
          f"{version('fsspec')}, kerchunk {version('kerchunk')}")
    print("| link | chunks | reader | open s | epoch s | epoch vs xarray | bytes / window | bytes / stored touched "
          "| bytes vs xarray | requests |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for link in links:
        for chunking in CHUNKINGS:
            base = res[(link, chunking, "xarray")]
            for reader in READERS:
                r = res[(link, chunking, reader)]
                med = {k: statistics.median(m[k] for m in r) for k in r[0]}
                vs = statistics.median(m["epoch"] / b["epoch"] for m, b in zip(r, base))
                bvs = statistics.median(m["bytes"] / max(b["bytes"], 1) for m, b in zip(r, base))
                print(f"| {'local' if link is None else f'{link * 1000:.0f} ms'} | {chunking} | {reader} | "
                      f"{med['open']:.3f} | {med['epoch']:.3f} | {vs:.2f}x | {med['bytes'] / window_bytes:.3f}x | "
                      f"{med['bytes'] / stored[chunking]:.3f}x | {bvs:.2f}x | "
                      f"{med.get('requests', '-') if 'requests' in med else '-'} |")


if __name__ == "__main__":
    main()
