"""Virtual and versioned datasets (issue 43's "Performance"), side by side in one run, local and from a
loopback S3 server with latency per request: an ERA5-like archive of NetCDF4 files (gzip + shuffle
chunks) referenced by kerchunk, and the same fields in an Icechunk repository (native Blosc chunks),
and the NetCDF4 files as virtual chunks of a repository, each read by dali_mesh and by xarray +
zarr-python, the same windows from the same store.

    python benchmarks/virtual_bench.py [--stores kerchunk,icechunk,icechunk-virtual] [--files 2]
                                       [--steps-per-file 4] [--runs 3] [--latencies 0.02] [--quick]

Data: ``--files`` x ``--steps-per-file`` steps of the variables VARIABLES at (721, 1440) float32
(compressed_bench.py's smooth ERA5-like fields plus noise), in two chunkings:
  whole   chunks (1, 721, 1440): a whole field per chunk (as most archives are written)
  band    chunks (1, 181, 1440): latitude bands aligned with the split (rank 1's window is one chunk)
Stores (``--stores``, all three by default):
  kerchunk  NetCDF4 files written by xarray (h5netcdf), ``--steps-per-file`` steps each, one time unit for
            all files, gzip level 4 + shuffle; combined along time by kerchunk (SingleHdf5ToZarr,
            MultiZarrToZarr, nothing inlined) into one JSON reference set per chunking
  icechunk  one Icechunk repository per chunking (a local folder, icechunk.local_filesystem_storage),
            every step in one commit, written by xarray's to_zarr (zarr-python, Zarr v3) into a writable
            session's store: native chunks Blosc(lz4, clevel 5, shuffle), read at that commit's snapshot.
            Blosc's blocks (what a reader of chunks in parts reads whole): 512 KiB by default, 8 per whole
            field, of which rank 1's rows touch 3 (0.375 of the chunk); ``--blosc-blocksize 65536``: 256 KiB,
            16 per field, 5 touched (0.31)
  icechunk-virtual
            the kerchunk case's NetCDF4 files as virtual chunks of a repository (VirtualiZarr's HDF parser,
            to_icechunk; one virtual chunk container: the files' folder, read anonymously), one commit:
            the same byte ranges as the kerchunk set (its lengths are ``stored``). Two repositories per
            chunking, the same chunks: one naming file:// URLs for the local rows, one naming the
            server's s3:// URLs (its container records the server's endpoint: written once it is up)
Rank 1 of 4, latitude split (torch.chunk: rows 181..362 of every variable), one sample per step, no halo.
Readers (each reads every step's window of every variable, in order):
  native   dali_mesh ZarrDatasetSource + fn.read_dataset(fallback=False): a CPU pipeline (device_id=None),
           batch 1, 2 threads. kerchunk: ZarrDatasetSource("reference://set"), the references resolved at
           planning, the files' ranges read and decoded (inflate, unshuffle) by the plugin. icechunk:
           ZarrDatasetSource("icechunk://repository", storage_options snapshot=the commit's id, and the
           server's S3 options remotely; authorize_virtual=True for icechunk-virtual)
  dali_mesh (python path)
           where the native reader refuses the store (dataset_readers says why, printed once; an Icechunk
           repository today: the library names no chunk's object for the plugin to read): the same source
           and fn.read_dataset(fallback=True), each variable read by partitioned_source (zarr-python over
           the library's session store) in ``--workers`` (2) DALI worker processes (py_start_method=
           "spawn": forked workers were seen to hang on Icechunk's runtime), whose start is in ``open``
  xarray   kerchunk: xarray.open_dataset("reference://", engine="zarr", chunks=None, storage_options
           fo=set); icechunk: xarray.open_zarr(session.store, consolidated=False, chunks=None) on a
           readonly session of the same snapshot (a new Repository.open: nothing cached). Then
           ``ds[v].isel(time=t, latitude=band).values`` per variable and step (zarr-python fetches the
           band's chunks concurrently; whole chunks, as stored)
Per run, link, store, chunking and reader: a new reader (nothing cached from an earlier one); ``open`` =
making it (the set read or the repository opened, metadata, plans, pipeline build), ``epoch`` = reading
every window. Local: the store's files (the NetCDF files; every object of the repository; both) evicted from
the page cache (posix_fadvise DONTNEED after fsync) before the reader is made, bytes = ``read_bytes`` of
/proc/<pid>/io of this process and its children over open + epoch. Remote (benchmarks/s3_server.py
serving the same folder: the kerchunk set naming s3:// URLs; the repository opened with
icechunk.s3_storage at http://127.0.0.1:PORT, path style, the server's static key): bytes and requests
counted at the server from the reader's creation to the epoch's end (the repository's metadata too).
``stored`` = the compressed bytes of the chunks the window touches (the set's lengths; the sizes the
repository's session gives). The first run checks both readers' windows against each other and against
the fields written. Medians over ``--runs``; ratios: the median of per-run ratios to xarray's on the same
store, measured in the same run. Readers take turns going first.

``--quick``: 2 files of 2 steps of (181, 360), one run, 1 worker (a CI-size check that the readers run
and agree).
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
STORES = ("kerchunk", "icechunk", "icechunk-virtual")
CHUNKINGS = ("whole", "band")
READERS = ("native", "xarray")  # "native": dali_mesh's reader (labelled PYTHON_PATH where it falls back)
PYTHON_PATH = "dali_mesh (python path)"
RANKS, RANK = 4, 1
REGION = "us-east-1"  # the region the S3 clients sign for (the benchmark's server takes any)


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


def _write_icechunk(path: str, chunking: str, data: np.ndarray, blocksize: int = 0) -> str:
    """An Icechunk repository at ``path`` holding ``data`` (every step) as native chunks, written by
    xarray's to_zarr (zarr-python) into a session of the branch ``main`` (``blocksize``: Blosc's
    parameter, 0: its choice); the commit's snapshot id."""
    import icechunk
    import pandas as pd
    import xarray as xr
    import zarr

    icechunk.set_logs_filter("error")  # a local repository warns at every open: no concurrent commits here
    steps, _, h, w = data.shape
    chunks = (1, h if chunking == "whole" else _band_rows(h), w)
    ds = xr.Dataset({v: (("time", "latitude", "longitude"), data[:, c]) for c, v in enumerate(VARIABLES)},
                    coords={"time": pd.date_range("2020-01-01", periods=steps, freq="6h"),
                            "latitude": np.linspace(90, -90, h), "longitude": np.linspace(0, 360, w, endpoint=False)})
    blosc = zarr.codecs.BloscCodec(cname="lz4", clevel=5, shuffle="shuffle", blocksize=blocksize)
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(path))
    session = repo.writable_session("main")
    ds.to_zarr(session.store, zarr_format=3, consolidated=False,
               encoding={v: {"chunks": chunks, "compressors": blosc} for v in VARIABLES})
    return session.commit(f"{len(VARIABLES)} variables x {steps} steps, {chunking} chunks")


def _virtual_dataset(paths: list[str]):
    """The NetCDF4 files ``paths`` as one virtual dataset along time (VirtualiZarr's HDF parser: every
    variable's chunks byte ranges of the files; the coordinates loaded)."""
    import xarray as xr
    from obspec_utils.registry import ObjectStoreRegistry
    from obstore.store import LocalStore
    from virtualizarr import open_virtual_dataset
    from virtualizarr.parsers import HDFParser

    registry = ObjectStoreRegistry({"file://": LocalStore()})
    parts = [open_virtual_dataset(f"file://{p}", registry=registry, parser=HDFParser(),
                                  loadable_variables=["time", "latitude", "longitude"]) for p in paths]
    return xr.concat(parts, dim="time", coords="minimal", compat="override")


def _write_virtual(path: str, vds, prefix: str, endpoint: str | None = None) -> str:
    """An Icechunk repository at ``path`` holding ``vds`` (_virtual_dataset) as virtual chunks into the
    files under ``prefix`` (``file:///folder/``, or ``s3://bucket/folder/`` on the benchmark's server at
    ``endpoint``, read anonymously: the server takes unsigned requests), its one virtual chunk container;
    the commit's snapshot id."""
    import icechunk

    icechunk.set_logs_filter("error")
    if endpoint is None:
        store = icechunk.local_filesystem_store(prefix.removeprefix("file://"))
    else:
        store = icechunk.s3_store(region=REGION, endpoint_url=endpoint, allow_http=True, force_path_style=True,
                                  anonymous=True)
    config = icechunk.RepositoryConfig.default()
    config.set_virtual_chunk_container(icechunk.VirtualChunkContainer(prefix, store))
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(path), config=config)
    session = repo.writable_session("main")
    vds.vz.rename_paths(lambda p: prefix + os.path.basename(p)).vz.to_icechunk(session.store)
    return session.commit(f"{len(VARIABLES)} variables: virtual chunks into {prefix}")


def _icechunk_repository(location: str, endpoint: str | None = None, virtual: str | None = None):
    """The repository at ``location`` (a local folder, or ``s3://bucket/prefix`` on the benchmark's server at
    ``endpoint``), newly opened: nothing the library caches is shared with another reader; its virtual
    chunks under the prefix ``virtual`` read (credentials as the container says: none)."""
    import icechunk

    icechunk.set_logs_filter("error")
    access = None if virtual is None else {virtual: None}
    if endpoint is None:
        return icechunk.Repository.open(icechunk.local_filesystem_storage(location),
                                        authorize_virtual_chunk_access=access)
    from tests.storage.s3_server import KEY, SECRET

    bucket, _, prefix = location.removeprefix("s3://").partition("/")
    return icechunk.Repository.open(icechunk.s3_storage(
        bucket=bucket, prefix=prefix, endpoint_url=endpoint, allow_http=True, force_path_style=True, region=REGION,
        access_key_id=KEY, secret_access_key=SECRET), authorize_virtual_chunk_access=access)


def _blosc_blocks(path: str, snapshot: str) -> tuple[int, int]:
    """The Blosc block size (bytes) of the repository's first chunk of VARIABLES[0] and its blocks: a rank
    that reads a Blosc chunk in parts reads whole blocks (c-blosc's header: uncompressed bytes at offset
    4, the block size at 8, little-endian)."""
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    store = _icechunk_repository(path).readonly_session(snapshot_id=snapshot).store
    head = sync(store.get(f"{VARIABLES[0]}/c/0/0/0", default_buffer_prototype())).to_bytes()[:16]
    nbytes, blocksize = int.from_bytes(head[4:8], "little"), int.from_bytes(head[8:12], "little")
    return blocksize, -(-nbytes // blocksize)


def _icechunk_stored_touched(path: str, snapshot: str, steps: int, chunk_rows: int, rows: tuple[int, int]) -> int:
    """Compressed bytes of the chunks of the variables that rows ``[rows)`` touch (their sizes as the
    snapshot's session gives them)."""
    from zarr.core.sync import sync

    store = _icechunk_repository(path).readonly_session(snapshot_id=snapshot).store
    first, last = rows[0] // chunk_rows, (rows[1] - 1) // chunk_rows
    return sum(sync(store.getsize(f"{v}/c/{t}/{i}/0")) for v in VARIABLES for t in range(steps)
               for i in range(first, last + 1))


# ---- readers ------------------------------------------------------------------------------------------------
class _Native:
    """dali_mesh's reader of ``location`` (``reference://set`` or ``icechunk://repository``): the plugin's
    (``python_path`` False: ``fallback=False``, a refusal is an error) or, where the native reader refuses
    the store, read_dataset's fallback in DALI worker processes."""

    def __init__(self, location: str, layout, storage_options=None, python_path: bool = False, workers: int = 2):
        from nvidia.dali import pipeline_def

        from dali_mesh import ZarrDatasetSource
        from dali_mesh.fn import read_dataset

        kw = {"storage_options": storage_options} if storage_options is not None else {}
        self.src = ZarrDatasetSource(location, list(VARIABLES), layout, batch_size=1, shuffle=False,
                                     dtype=np.float32, **kw)
        pool = {"py_num_workers": workers, "py_start_method": "spawn"} if python_path else {}

        @pipeline_def(batch_size=1, num_threads=2, device_id=None, prefetch_queue_depth=1, **pool)
        def pipe():
            return read_dataset(self.src, fallback=python_path)[0]

        self.pipe = pipe()
        self.pipe.build()

    def epoch(self) -> list:
        from benchmarks._common import pipeline_epoch

        return pipeline_epoch(self.pipe, keep=True)

    def close(self) -> None:
        del self.pipe  # its worker processes end with it, before the next reader is timed


def _dali_reader(location: str, layout, storage_options=None) -> tuple[str, str]:
    """How dali_mesh reads ``location``: ``("native", "")`` or ``(PYTHON_PATH, why)`` (read_dataset's
    plan, no data read)."""
    from dali_mesh import ZarrDatasetSource
    from dali_mesh.pipeline.dataset_reader import dataset_readers

    kw = {"storage_options": storage_options} if storage_options is not None else {}
    src = ZarrDatasetSource(location, list(VARIABLES), layout, batch_size=1, shuffle=False, dtype=np.float32, **kw)
    why = sorted({r for r in dataset_readers(src) if r != "native"})
    return ("native", "") if not why else (PYTHON_PATH, "; ".join(why))


class _Xarray:
    def __init__(self, location: str, rows: tuple[int, int], endpoint: str | None = None):
        import xarray as xr

        so = {"fo": location}
        if endpoint is not None:
            from tests.storage.s3_server import KEY, SECRET

            so.update(remote_protocol="s3", remote_options={
                "endpoint_url": endpoint, "key": KEY, "secret": SECRET, "skip_instance_cache": True,
                "asynchronous": True,  # zarr-python opens the reference filesystem asynchronous: its files too
                "client_kwargs": {"region_name": REGION}})
        self.ds = xr.open_dataset("reference://", engine="zarr", consolidated=False, chunks=None,
                                  backend_kwargs={"storage_options": so})
        self.rows = slice(*rows)

    def epoch(self) -> list:
        return [np.stack([self.ds[v].isel(time=t, latitude=self.rows).values for v in VARIABLES])
                for t in range(self.ds.sizes["time"])]

    def close(self) -> None:
        self.ds.close()


class _XarrayIcechunk(_Xarray):
    """xarray on a readonly session of ``snapshot`` of the repository at ``location`` (newly opened; its
    virtual chunks under ``virtual`` read)."""

    def __init__(self, location: str, snapshot: str, rows: tuple[int, int], endpoint: str | None = None,
                 virtual: str | None = None):
        import xarray as xr

        session = _icechunk_repository(location, endpoint, virtual).readonly_session(snapshot_id=snapshot)
        self.ds = xr.open_zarr(session.store, consolidated=False, chunks=None)
        self.rows = slice(*rows)


# ---- measuring ------------------------------------------------------------------------------------------------
class _Case:
    """One store of one chunking: where each reader finds it, locally and on the server, and what a
    window's chunks hold."""

    def __init__(self, store: str, chunking: str, local: str, remote: str, files: list[str], stored: int,
                 snapshot: str | None = None) -> None:
        self.store, self.chunking, self.local, self.remote = store, chunking, local, remote
        self.files, self.stored = files, stored
        # the repository's snapshot read locally and on the server: icechunk-virtual has a repository for
        # each (its chunks name file:// or s3:// URLs; the latter written when the server is up)
        self.snapshot = self.remote_snapshot = snapshot
        self.prefix = self.remote_prefix = None  # icechunk-virtual: the container of its chunks' files
        self.dali, self.why = "native", ""  # how dali_mesh reads it (_dali_reader, before the runs)

    def native_args(self, server) -> tuple[str, dict | None]:
        """The location and storage_options of dali_mesh's source (``server``: on the server)."""
        if self.store == "kerchunk":
            return f"reference://{self.local if server is None else self.remote}", (
                None if server is None else _options(server.endpoint))
        virtual = {"authorize_virtual": True} if self.prefix is not None else {}  # the one container it declares
        if server is None:
            return f"icechunk://{self.local}", {"snapshot": self.snapshot, **virtual}
        return f"icechunk://{self.remote}", _options(server.endpoint, region=REGION, snapshot=self.remote_snapshot,
                                                     **virtual)

    def xarray(self, rows, server):
        if self.store == "kerchunk":
            endpoint = None if server is None else server.endpoint
            return _Xarray(self.local if server is None else self.remote, rows, endpoint)
        if server is None:
            return _XarrayIcechunk(self.local, self.snapshot, rows, None, self.prefix)
        return _XarrayIcechunk(self.remote, self.remote_snapshot, rows, server.endpoint, self.remote_prefix)


def _measure(reader: str, case: _Case, layout, rows, server=None, workers: int = 2) -> tuple[dict, list]:
    """One cold read of every window by ``reader``: open and epoch seconds, bytes (and requests remote)."""
    from dali_mesh.io.pagecache import descendant_pids, evict, read_bytes

    pids = lambda: [os.getpid()] + descendant_pids(os.getpid())  # noqa: E731
    if server is None:
        evict(case.files)
        before = read_bytes(pids())
    else:
        server.control("reset")
    t0 = time.perf_counter()
    if reader == "native":
        location, options = case.native_args(server)
        r = _Native(location, layout, options, python_path=case.dali == PYTHON_PATH, workers=workers)
    else:
        r = case.xarray(rows, server)
    t1 = time.perf_counter()
    got = r.epoch()
    t2 = time.perf_counter()
    out = {"open": t1 - t0, "epoch": t2 - t1}
    if server is None:
        out["bytes"] = read_bytes(pids()) - before  # the worker processes too: counted before they end
    else:
        counts = server.control("counts")
        out["bytes"], out["requests"] = counts["bytes"], counts["requests"]
    r.close()
    return out, got


def _cases(stores, folder: str, data: np.ndarray, files: int, shape, rows, blocksize: int = 0) -> list[_Case]:
    """Every store of every chunking, written under ``folder``: its subfolder BUCKET is what the server
    serves (the NetCDF files as BUCKET/<chunking>/, the repositories as BUCKET/<store>/<chunking>/; an
    icechunk-virtual case's repository of s3:// chunks is written by :func:`_serve_virtual`)."""
    out = []
    for chunking in CHUNKINGS:
        chunk_rows = shape[0] if chunking == "whole" else _band_rows(shape[0])
        if {"kerchunk", "icechunk-virtual"} & set(stores):  # the NetCDF files and their kerchunk set
            paths = _write(os.path.join(folder, BUCKET, chunking), chunking, data, files)
            local = os.path.join(folder, f"{chunking}.json")
            refs = _reference(paths, local)
            stored = _stored_touched(refs, chunk_rows, rows)
        for store in stores:
            if store == "kerchunk":
                remote = os.path.join(folder, f"{chunking}-s3.json")
                _dump(_moved(refs, lambda p, c=chunking: f"s3://{BUCKET}/{c}/{os.path.basename(p)}"), remote)
                out.append(_Case(store, chunking, local, remote, paths, stored))
            elif store == "icechunk":
                key = f"{store}/{chunking}"
                path = os.path.join(folder, BUCKET, key)
                snapshot = _write_icechunk(path, chunking, data, blocksize)
                case = _Case(store, chunking, path, f"s3://{BUCKET}/{key}", [path],
                             _icechunk_stored_touched(path, snapshot, len(data), chunk_rows, rows), snapshot)
                case.blocks = _blosc_blocks(path, snapshot)
                out.append(case)
            else:  # the kerchunk set's chunks (the same byte ranges: the same stored bytes) as virtual chunks
                key = f"{store}/{chunking}"
                path = os.path.join(folder, BUCKET, key)
                case = _Case(store, chunking, path, f"s3://{BUCKET}/{key}-s3", [path, *paths], stored)
                case.vds = _virtual_dataset(paths)
                case.prefix = f"file://{os.path.join(folder, BUCKET, chunking)}/"
                case.snapshot = _write_virtual(path, case.vds, case.prefix)
                out.append(case)
    return sorted(out, key=lambda c: (stores.index(c.store), CHUNKINGS.index(c.chunking)))


def _serve_virtual(cases, folder: str, server) -> None:
    """The icechunk-virtual cases' repositories for the server's reads (on the server: the repository and
    the files its chunks name, at ``server``'s endpoint, which the repository's config records)."""
    for case in cases:
        if case.store == "icechunk-virtual":
            case.remote_prefix = f"s3://{BUCKET}/{case.chunking}/"
            path = os.path.join(folder, BUCKET, case.remote.removeprefix(f"s3://{BUCKET}/"))
            case.remote_snapshot = _write_virtual(path, case.vds, case.remote_prefix, server.endpoint)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stores", default=",".join(STORES), help=f"comma list of {', '.join(STORES)}")
    ap.add_argument("--files", type=int, default=2,
                    help="NetCDF4 files of kerchunk and icechunk-virtual (the steps split among them)")
    ap.add_argument("--steps-per-file", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--latencies", default="0.02", help="seconds per request of the remote runs (comma list)")
    ap.add_argument("--shape", default="721,1440")
    ap.add_argument("--dir", default=None, help="where the files go (default: a temporary folder, removed)")
    ap.add_argument("--blosc-blocksize", type=int, default=0,
                    help="icechunk: the blocksize given to Blosc (0: its choice, 512 KiB blocks here; c-blosc "
                         "scales a given one: 65536 writes 256 KiB blocks of these float32); the report says "
                         "the blocks written")
    ap.add_argument("--workers", type=int, default=2, help="DALI worker processes of dali_mesh's python path")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.files, args.steps_per_file, args.runs, args.shape, args.workers = 2, 2, 1, "181,360", 1
    stores = [s for s in args.stores.split(",") if s]
    unknown = sorted(set(stores) - set(STORES))
    if unknown or not stores:
        ap.error(f"--stores: {', '.join(unknown) or 'none given'}; choose from {', '.join(STORES)}")
    shape = tuple(int(s) for s in args.shape.split(","))
    latencies = [float(x) for x in args.latencies.split(",") if x]
    from dali_mesh import MeshInfo, NamedLayout

    layout = NamedLayout(MeshInfo((RANKS,), ("mp",), (RANK,)), shard={"mp": "latitude"})
    folder = args.dir or tempfile.mkdtemp(prefix="dali_mesh_virtual_")
    os.makedirs(folder, exist_ok=True)
    data = _fields(args.files * args.steps_per_file, shape)
    rows = _rank_rows(shape[0])
    server = None
    try:
        cases = _cases(stores, folder, data, args.files, shape, rows, args.blosc_blocksize)
        for case in cases:
            location, options = case.native_args(None)
            case.dali, case.why = _dali_reader(location, layout, options)
            if case.why:
                print(f"{case.store} {case.chunking}: dali_mesh reads it by its python path: {case.why}",
                      file=sys.stderr)
        server = Server(folder) if latencies else None  # serving the files written: ROOT/BUCKET/...
        if server is not None:
            _serve_virtual(cases, folder, server)
        want = [data[t][:, rows[0]:rows[1]] for t in range(len(data))]
        window_bytes = sum(w.nbytes for w in want)
        links = [None] + latencies
        res: dict = {}
        for run in range(args.runs):
            for link in links:
                if link is not None:
                    server.link((link, 0))
                for case in cases:
                    order = READERS if run % 2 == 0 else READERS[::-1]
                    for reader in order:
                        m, got = _measure(reader, case, layout, rows, None if link is None else server,
                                          args.workers)
                        if run == 0:
                            for t, (g, w) in enumerate(zip(got, want)):
                                np.testing.assert_array_equal(
                                    np.asarray(g).reshape(w.shape), w,
                                    err_msg=f"{reader} {case.store} {case.chunking} {link} step {t}")
                        res.setdefault((link, case.store, case.chunking, reader), []).append(m)
                        print(f"run {run} link {link} {case.store} {case.chunking} {reader}: {m}", file=sys.stderr)
        _report(args, shape, rows, res, cases, window_bytes, links)
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


def _report(args, shape, rows, res, cases, window_bytes, links) -> None:
    import platform

    from importlib.metadata import version

    stores = []
    kinds = {c.store for c in cases}
    if "kerchunk" in kinds:
        stores.append(f"kerchunk: {args.files} NetCDF4 files x {args.steps_per_file} steps, gzip 4 + shuffle, "
                      "one JSON set")
    if "icechunk" in kinds:
        blocks = {c.chunking: c.blocks for c in cases if c.store == "icechunk"}
        stores.append(f"icechunk: a repository of {args.files * args.steps_per_file} steps, Blosc lz4 5 + shuffle, "
                      + ", ".join(f"{c} chunks {n} block(s) of {b >> 10} KiB" for c, (b, n) in blocks.items()))
    if "icechunk-virtual" in kinds:
        stores.append(f"icechunk-virtual: a repository of virtual chunks into {args.files} such NetCDF4 files "
                      "(VirtualiZarr)")
    if any(c.dali == PYTHON_PATH for c in cases):
        stores.append(f"{PYTHON_PATH}: {args.workers} spawned DALI worker process(es)")
    used = {"xarray", "zarr", "fsspec"} | kinds | ({"kerchunk", "icechunk", "virtualizarr"}
                                                 if "icechunk-virtual" in kinds else set())
    versions = ", ".join(f"{m} {version(m)}" for m in ("xarray", "zarr", "fsspec", "kerchunk", "icechunk",
                                                       "virtualizarr") if m in used)
    print(f"{len(VARIABLES)} variables {shape} float32; {'; '.join(stores)}; rank {RANK} of {RANKS} (latitude rows "
          f"{rows[0]}..{rows[1]}); medians of {args.runs} runs; {platform.node()}, {os.cpu_count()} CPUs, load "
          f"average at the end {os.getloadavg()[0]:.1f}; {versions}")
    print("| store | link | chunks | reader | open s | epoch s | epoch vs xarray | bytes / window | "
          "bytes / stored touched | bytes vs xarray | requests |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for link in links:
        for case in cases:
            base = res[(link, case.store, case.chunking, "xarray")]
            for reader in READERS:
                r = res[(link, case.store, case.chunking, reader)]
                med = {k: statistics.median(m[k] for m in r) for k in r[0]}
                vs = statistics.median(m["epoch"] / b["epoch"] for m, b in zip(r, base))
                bvs = statistics.median(m["bytes"] / max(b["bytes"], 1) for m, b in zip(r, base))
                label = case.dali if reader == "native" else reader
                print(f"| {case.store} | {'local' if link is None else f'{link * 1000:.0f} ms'} | {case.chunking} | "
                      f"{label} | {med['open']:.3f} | {med['epoch']:.3f} | {vs:.2f}x | "
                      f"{med['bytes'] / window_bytes:.3f}x | {med['bytes'] / case.stored:.3f}x | {bvs:.2f}x | "
                      f"{med['requests'] if 'requests' in med else '-'} |")


if __name__ == "__main__":
    main()
