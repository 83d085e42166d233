"""``dali-mesh demo``: one epoch on local ranks, every batch checked against the files.

Starts ``--nproc`` ranks (torch.distributed: gloo on the CPU; NCCL and one GPU per rank when there
are enough GPUs), writes a synthetic ERA5-like dataset unless ``--data DIR`` names one (``.npy``
files, or HDF5/Zarr with ``--dataset``), runs one epoch through a DALI pipeline on every rank, checks
every window against the file contents (and gathers the first batch as a DTensor when the layout
allows), and prints per rank: mesh coordinate, window, bytes read against full-sample loading,
samples/s.

The pipeline reads through the native operator (:func:`dali_mesh.fn.read_windows`: byte-range
plans executed on DALI's ``--workers`` threads, no Python on the hot path); a source it cannot
serve (compressed HDF5/Zarr, say) is read by ``partitioned_source`` in ``--workers`` DALI worker
processes instead. The demo prints which path it took, and why.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time

import numpy as np

from dali_mesh.cli.options import (UsageError, add_data_arguments, find_data, make_layout, parse_ints,
                                  positive_float, positive_int)
from dali_mesh.cli.locations import scrub, shown
from dali_mesh.formats import format_named, format_of
from dali_mesh.io._common import DataFileError
from dali_mesh.mesh import MeshError
from dali_mesh.io.pagecache import descendant_pids, evict, read_bytes
from dali_mesh.plan import NotNativeError
from dali_mesh.partition import LayoutError, take_window
from dali_mesh.storage import local_path_of, store_of

__all__ = ["add_arguments", "run", "write_synthetic", "MARKER"]

DEFAULT_SHAPE = (8, 256, 512)
#: The file by which the demo knows a folder as its own: it lists the files the demo wrote there.
#: The demo writes only into an empty (or new) folder or one that holds this marker, and never
#: over a file the marker does not list.
MARKER = ".dali_mesh_demo.json"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nproc", type=positive_int, default=4, help="local ranks to start (default 4)")
    p.add_argument("--mesh", default="data_parallel=-1,model_parallel=4",
                   help="mesh; one dim may be -1 (default data_parallel=-1,model_parallel=4)")
    p.add_argument("--shard", default="model_parallel=1", help="mesh dim -> sample axis (default model_parallel=1)")
    p.add_argument("--batch", help="mesh dims that split the dataset")
    p.add_argument("--halo", help="cells each side, e.g. 1=2,2=2")
    p.add_argument("--boundary", help="e.g. 1=constant,2=periodic")
    p.add_argument("--split", default="chunk", help="chunk|physicsnemo|even")
    add_data_arguments(p, data="a folder of .npy files (one sample each), or HDF5 (.h5) / Zarr (.zarr) files or a "
                               "folder of them, samples along axis 0 (default: write a synthetic ERA5-like set)",
                       channels="read by read_dataset (one native operator for variables of one dtype)",
                       share="read once per group")
    p.add_argument("--samples", type=positive_int, default=32, help="synthetic samples (default 32)")
    p.add_argument("--shape", default=",".join(map(str, DEFAULT_SHAPE)), help="synthetic sample shape")
    p.add_argument("--batch-size", type=positive_int, default=2, help="samples per batch per rank (default 2)")
    p.add_argument("--workers", type=positive_int, default=1,
                   help="DALI threads per rank for the native reader, or DALI worker processes where a source "
                        "falls back to partitioned_source (default 1)")
    p.add_argument("--timeout", type=positive_float, default=300, help="seconds before the demo gives up")
    p.add_argument("--fail-rank", type=int, help=argparse.SUPPRESS)  # tests: this rank's reader fails


def _claim_folder(folder: str, names: list[str]) -> dict:
    """Make sure the demo may write ``names`` into ``folder``; return its marker's record.

    A folder that exists, is not empty and has no marker, or a marked folder holding one of
    ``names`` that the marker does not list, is refused: the demo never overwrites files it did not
    write."""
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise UsageError(f"{folder} exists and is not a folder: the demo will not replace it; pass --data, or "
                         "run from another folder")
    os.makedirs(folder, exist_ok=True)
    marker = os.path.join(folder, MARKER)
    entries = sorted(os.listdir(folder))
    if not entries:
        record = {"written": []}
        with open(marker, "w") as f:  # first, so that a folder half written by a crash is still ours
            json.dump(record, f)
        return record
    try:
        with open(marker) as f:
            record = json.load(f)
        written = set(record["written"])
    except (OSError, ValueError, KeyError, TypeError):
        raise UsageError(f"{folder} holds files the demo did not write ({', '.join(entries[:3])}"
                         f"{', ...' if len(entries) > 3 else ''}): the demo writes only into a new folder or one "
                         f"it made; pass --data {folder} to use those files, or run from another folder") from None
    foreign = [n for n in names if n in entries and n not in written]
    if foreign:
        raise UsageError(f"{os.path.join(folder, foreign[0])} was not written by the demo: it will not be "
                         "overwritten; remove it, pass --data, or run from another folder")
    return record


def write_synthetic(folder: str, num_samples: int, shape, seed: int = 0) -> list[str]:
    """ERA5-like fields: smooth waves in (lat, lon) per channel plus noise; one ``.npy`` per sample.

    Writes only into a new or empty folder, or one the demo wrote before (it holds :data:`MARKER`);
    raises :class:`~dali_mesh.cli.options.UsageError` rather than overwrite a file it did not write."""
    names = [f"sample_{i:05d}.npy" for i in range(num_samples)] + ["meta.json"]
    record = _claim_folder(folder, names)
    files = [os.path.join(folder, n) for n in names[:-1]]
    meta = os.path.join(folder, "meta.json")
    want = {"num_samples": num_samples, "shape": list(shape), "dtype": "float32", "seed": seed}
    try:
        same = json.load(open(meta)) == want and all(os.path.exists(f) for f in files)
    except (OSError, ValueError):
        same = False
    if same:
        return files
    record["written"] = sorted(set(record["written"]) | set(names))
    with open(os.path.join(folder, MARKER), "w") as f:  # before writing: a crash leaves the files ours
        json.dump(record, f)
    rng = np.random.default_rng(seed)
    c, h, w = shape[0], shape[-2], shape[-1]
    lat = np.linspace(-np.pi / 2, np.pi / 2, h, dtype=np.float32)[:, None]
    lon = np.linspace(0, 2 * np.pi, w, endpoint=False, dtype=np.float32)[None, :]
    for i, f in enumerate(files):
        field = np.empty(shape, np.float32)
        for ch in range(c):
            field[ch] = (np.cos(lat * (ch + 1)) * np.sin(lon * (ch % 3 + 1) + 0.1 * i)).reshape(field[ch].shape)
        field += rng.standard_normal(shape, dtype=np.float32) * 0.01
        np.save(f, field)
    with open(meta, "w") as f:
        json.dump(want, f)
    return files


def check_files(kind: str, files: list[str], dataset: str | None, allow_external: bool = False) -> None:
    """Every file of ``--data`` must be readable, whole and hold samples of one shape and dtype:
    checked here (headers only) so that a bad file is one line naming it, not a failed rank."""
    fmt = format_named(kind)
    options = fmt.trust_options(allow_external)
    seen = None
    for path in files:
        info = fmt.info(path, dataset, **options)
        shape = tuple(info.shape[1:]) if fmt.steps else tuple(info.shape)
        if seen is None:
            seen = (path, shape, info.dtype)
        elif (shape, info.dtype) != seen[1:]:
            raise UsageError(f"--data: {shown(path)} holds samples of {shape} {info.dtype} but {shown(seen[0])} "
                             f"holds {seen[1]} {seen[2]}: every file must hold samples of one shape and dtype")


def _make_source(kind, files, dataset, layout, batch_size, allow_external=False, share=None):
    from dali_mesh import Layout, MeshInfo  # noqa: PLC0415
    from dali_mesh.source import array_source, file_source  # noqa: PLC0415

    if layout is None:  # the whole sample, to read metadata
        layout = Layout(MeshInfo((1,), ("data_parallel",)))
    if kind == "dataset":  # dataset = the --channels text
        from dali_mesh.cli.options import is_zarr_group, parse_channels  # noqa: PLC0415
        from dali_mesh.weather import NetCDFDatasetSource, ZarrDatasetSource  # noqa: PLC0415

        cls = ZarrDatasetSource if is_zarr_group(files[0]) else NetCDFDatasetSource
        return cls(files[0], parse_channels(dataset), layout, batch_size=batch_size, shuffle=True, seed=0,
                   share=share)
    fmt = format_named(kind)
    if not fmt.steps:
        return file_source(files, layout, format=fmt, batch_size=batch_size, shuffle=True, seed=0, share=share)
    return array_source(files, dataset or fmt.default_name(files[0]), layout, format=fmt, batch_size=batch_size,
                        shuffle=True, seed=0, share=share, allow_external=allow_external)


def fetched(path: str) -> int | None:
    """Body bytes the native stores (the native reader's, and the planning's in this process) fetched from
    object stores in this process so far; None for partitioned_source (its workers' fetches are not
    counted)."""
    if path != "native":
        return None
    from dali_mesh.storage.native_store import fetch_counters  # noqa: PLC0415

    return fetch_counters()[1]


def _full_sample(source, sample_id: int) -> np.ndarray:
    """The whole sample, read plainly by the format's own library (the oracle the demo checks windows
    against)."""
    if hasattr(source, "parts"):  # a dataset: every channel's whole field, by zarr-python / h5py
        return _dataset_sample(source, sample_id)
    fmt = source.format
    if not fmt.steps:  # one sample per file
        fi, local = sample_id, None
    else:
        fi, local = source.locate(source.step_of(sample_id))
    handle = fmt.open(source.files[fi], source.name, **source.format_options)
    try:
        return fmt.read_whole(handle, local)
    finally:
        fmt.close(handle)


def _dataset_sample(source, sample_id: int) -> np.ndarray:
    """A dataset's sample read by zarr-python (a Zarr group) or h5py (NetCDF4 files) variable by
    variable, none of dali_mesh's readers in between: each channel's field at the sample's time step
    (and level index), stacked and cast to the source's dtype (the demo normalises nothing)."""
    t = source.time_index(sample_id)
    fields = []
    from dali_mesh.cli.options import is_zarr_group  # noqa: PLC0415

    if len(source.files) == 1 and is_zarr_group(source.files[0]):
        import zarr  # noqa: PLC0415

        store, key = store_of(source.files[0])
        group = zarr.open_group(store=store.zarr_store(key), mode="r",
                                use_consolidated=False)
        for c in source.channels:
            arr = group[c.variable]
            fields.append(np.asarray(arr[t] if c.level_index is None else arr[t, c.level_index]))
    else:
        from dali_mesh.io.containers import open_hdf5_file  # noqa: PLC0415

        for f_path in source.files:  # the files in time order: the step's file and its local step
            with open_hdf5_file(f_path) as f:
                n = f[source.time_dim].shape[0]
                if t < n:
                    for c in source.channels:
                        ds = f[c.variable]
                        fields.append(np.asarray(ds[t] if c.level_index is None else ds[t, c.level_index]))
                    break
                t -= n
    return np.stack(fields).astype(source.dtype)


class _FailingSource:
    """Wraps a source so that its reads fail (the demo's failure test)."""

    def __init__(self, source):
        self.source = source

    def __getattr__(self, name):
        if name == "source":  # not yet set while unpickling in a worker
            raise AttributeError(name)
        return getattr(self.source, name)

    def __call__(self, sample_info):
        raise OSError(f"cannot read {shown(self.source.files[0])}: deliberate failure (--fail-rank)")

    def native_plans(self, merge_gap=None):
        # its reads fail in partitioned_source's workers: the native reader would read the files
        raise NotNativeError("the demo's --fail-rank source fails its reads in partitioned_source's workers")


def mesh_of(cfg, world_size: int):
    from dali_mesh.mesh import parse_mesh_shape, resolve_mesh_shape  # noqa: PLC0415

    shape, names = parse_mesh_shape(cfg["mesh"])
    return resolve_mesh_shape(shape, world_size), names


def layout_of(cfg, mesh):
    """The demo's ``Layout`` from its command-line strings (``--halo LOW:HIGH`` applies to every axis)."""
    return make_layout(mesh, cfg["ndim"], shard=cfg["shard"], batch=cfg["batch"], halo=cfg["halo"],
                       boundary=cfg["boundary"], split=cfg["split"])


def reader_path(source) -> tuple[str, str]:
    """``("native", "")`` when :func:`dali_mesh.fn.read_windows` reads ``source`` with the native
    operator, else ``("partitioned_source", why)``."""
    from dali_mesh.pipeline.native import plan_windows  # noqa: PLC0415

    if hasattr(source, "parts"):  # a dataset: read_dataset, native when every variable is
        from dali_mesh.pipeline.dataset_reader import dataset_readers  # noqa: PLC0415

        why = [f"{sub.name}: {r}" for (sub, _), r in zip(source.parts, dataset_readers(source)) if r != "native"]
        return ("native", "") if not why else ("partitioned_source", "; ".join(why))
    try:
        plan_windows(source)
    except NotNativeError as e:
        return "partitioned_source", str(e)
    return "native", ""


#: the errors of a user's data, layout or arguments: a rank reports their message in one line (exit 2, as
#: ``plan`` does); any other error is a defect, reported with its traceback (exit 1)
_USER_ERRORS = (UsageError, DataFileError, LayoutError, MeshError)
#: the native operator's errors reach DALI's caller as text: its line ("read_windows: FILE: why")
_NATIVE_ERROR = re.compile(r"^read_windows: (.+)$", re.M)
#: a DALI worker's exception reaches its caller as the worker's traceback, as text: its last line
_WORKER_ERROR = re.compile(r"^((?:[A-Za-z_]\w*\.)*)([A-Za-z_]\w*): (.+)\Z", re.S)


def _data_error(e: BaseException) -> str | None:
    """The message of the error in the user's data or arguments that made a rank fail, else ``None``:
    one of :data:`_USER_ERRORS` in ``e``'s chain, or named by the text DALI made of it (the native
    operator's error line; the last line of a worker process's traceback)."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, _USER_ERRORS):
            return str(e)
        text = str(e)
        native = _NATIVE_ERROR.search(text)
        if native:
            return native.group(1).strip()
        if "traceback received from worker" in text:
            last = text.strip().splitlines()[-1] if text.strip() else ""
            m = _WORKER_ERROR.match(last)
            if m and m.group(1).startswith("dali_mesh.") and _is_user_error(m.group(1)[:-1], m.group(2)):
                return m.group(3)
        e = e.__cause__ or e.__context__
    return None


def _is_user_error(module: str, name: str) -> bool:
    import importlib  # noqa: PLC0415

    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return False
    return isinstance(cls, type) and issubclass(cls, _USER_ERRORS)


def _rank(rank, world_size, cfg, out_dir):
    """One rank of the demo (:func:`_rank_run`): an error in the data is one line of its report."""
    from dali_mesh.cli.launch import RankError  # noqa: PLC0415

    try:
        _rank_run(rank, world_size, cfg, out_dir)
    except Exception as e:  # noqa: BLE001 - classified: the data's errors in one line, the rest as they are
        why = _data_error(e)
        if why is None:
            raise
        raise RankError(f"error: {why}") from None


def _rank_run(rank, world_size, cfg, out_dir):
    import torch
    import torch.distributed as dist
    from nvidia.dali import pipeline_def
    from torch.distributed.device_mesh import init_device_mesh

    from dali_mesh import MeshInfo
    from dali_mesh.pipeline.external import partitioned_source
    from dali_mesh.pipeline.native import read_windows
    from dali_mesh.torch import MeshLoader, to_dtensor

    mesh_shape, names = mesh_of(cfg, world_size)
    use_gpu = cfg["gpu"]
    device_mesh = init_device_mesh("cuda" if use_gpu else "cpu", mesh_shape, mesh_dim_names=names or None)
    layout = layout_of(cfg, MeshInfo.from_device_mesh(device_mesh))
    files = cfg["files"]
    bs = cfg["batch_size"]
    source = _make_source(cfg["kind"], files, cfg["dataset"], layout, bs, cfg["allow_external"], cfg["share"])
    if cfg["fail_rank"] == rank:
        source = _FailingSource(source)
    region = layout.region(source.sample_shape)
    path, why = reader_path(source)
    device = "gpu" if use_gpu else "cpu"
    if cfg["kind"] == "dataset":  # read_dataset: a variable that is not native falls back alone
        from dali_mesh.pipeline.dataset_reader import read_dataset  # noqa: PLC0415

        @pipeline_def(batch_size=bs, num_threads=cfg["workers"], device_id=rank if use_gpu else None,
                      py_num_workers=cfg["workers"], py_start_method="spawn", prefetch_queue_depth=1)
        def pipe():
            return read_dataset(source, device=device)
    elif path == "native":
        # the reads run on the pipeline's threads: no worker processes
        @pipeline_def(batch_size=bs, num_threads=cfg["workers"], device_id=rank if use_gpu else None,
                      prefetch_queue_depth=1)
        def pipe():
            return read_windows(source, device=device, fallback=False)
    else:
        @pipeline_def(batch_size=bs, num_threads=1, device_id=rank if use_gpu else None,
                      py_num_workers=cfg["workers"], py_start_method="spawn", prefetch_queue_depth=1)
        def pipe():
            return partitioned_source(source, device=device)

    # by path, not by cost: what is counted is where the bytes come from, this machine's disks through its page
    # cache (evicted first, then /proc/<pid>/io) or another store's requests (the native reader's counters)
    remote = any(local_path_of(f) is None for f in files)
    evict([f for f in files if local_path_of(f) is not None])  # cold files: count what the readers pull from storage
    dist.barrier()
    # the native reader reads in this process, partitioned_source in its workers: count both, from here;
    # from an object store (or a reference set, an Icechunk snapshot), the body bytes the native reader's
    # requests received where every store is read natively; else nothing is counted (not evicted either)
    counted = not remote or all(store_of(f)[0].native for f in files)
    before = (fetched(path) if remote else read_bytes([os.getpid()])) if counted else None
    t0 = time.perf_counter()
    # a rank waits for a batch no longer than the demo as a whole (--timeout)
    loader = MeshLoader(pipe(), layout, sample_shape=source.sample_shape, timeout=cfg["timeout"],
                        device_mesh=device_mesh if cfg["share"] else None)
    steps, ids, pads, windows = 0, [], [], []
    num_steps = len(source) // bs
    for batch in loader:
        steps += 1
        ids.append(batch["sample_id"].cpu().numpy())
        pads.append(batch["is_pad"].cpu().numpy())
        windows.append(batch["window"].cpu().numpy())
        if rank == 0:
            done = int(30 * steps / num_steps)
            sys.stderr.write(f"\r  epoch [{'#' * done}{'.' * (30 - done)}] {steps}/{num_steps} steps")
            sys.stderr.flush()
    elapsed = time.perf_counter() - t0
    worker_bytes = None if not counted else fetched(path) if remote else \
        read_bytes([os.getpid()] + descendant_pids(os.getpid()))
    if worker_bytes is not None:
        worker_bytes -= before
    if rank == 0:
        sys.stderr.write("\n")
    exchange = None if loader._exchange is None else dict(loader._exchange.stats, group=loader._exchange.size)
    if hasattr(loader, "close"):  # the loader's watchdog thread must let go of the pipeline, or the
        loader.close()              # process waits at exit for DALI workers that were never told to stop
    del loader

    # every rank of a sample group saw the same samples at every step; every rank took `steps` steps
    ids = np.stack(ids)
    all_ids = [None] * world_size
    dist.all_gather_object(all_ids, (layout.batch_index, ids.tolist()))
    for b, other in all_ids:
        if b == layout.batch_index and other != ids.tolist():
            raise AssertionError(f"rank {rank}: sample ids differ from another rank of sample group {b}")

    # every window equals the file's contents (np.pad oracle)
    verified = 0
    for step_ids, step_pads, step_windows in zip(ids, pads, windows):
        for sid, w in zip(step_ids, step_windows):
            expected = take_window(_full_sample(source, sid), region)
            if not np.array_equal(w, expected):
                raise AssertionError(f"rank {rank}: window of sample {sid} differs from the file's contents")
            verified += 1

    # the first batch as a DTensor of the global batch, gathered
    dtensor_checked = False
    if layout.split == "chunk":
        first = torch.from_numpy(windows[0])
        dt = to_dtensor(first.cuda() if use_gpu else first, layout, source.sample_shape, device_mesh)
        full = dt.full_tensor().cpu().numpy()
        group_ids = sorted({(b, tuple(o[0])) for b, o in all_ids})
        expected = np.concatenate([np.stack([_full_sample(source, s) for s in sids]) for _, sids in group_ids])
        if not np.array_equal(full, expected):
            raise AssertionError(f"rank {rank}: gathered DTensor differs from the global batch")
        dtensor_checked = True

    pads = np.stack(pads)
    real_ids = sorted({int(i) for i in ids[~pads]})
    stats = {
        "rank": rank, "coordinate": dict(zip(layout.mesh.names, layout.mesh.coordinate)),
        "window": [list(region.window_start), list(region.window_stop)],
        "window_shape": list(region.window_shape), "steps": steps, "samples": int(ids.size), "real_ids": real_ids,
        "verified": verified, "dtensor": dtensor_checked, "seconds": elapsed, "path": path, "why": why,
        "read_bytes": worker_bytes, "window_bytes": int(ids.size) * int(np.prod(region.window_shape)) * np.dtype(source.dtype).itemsize,
        "full_bytes": int(ids.size) * int(np.prod(source.sample_shape)) * np.dtype(source.dtype).itemsize,
        "exchange": exchange,
    }
    with open(os.path.join(out_dir, f"stats{rank}.json"), "w") as f:
        json.dump(stats, f)


def run(args: argparse.Namespace) -> int:
    from dali_mesh.cli.launch import RankFailure, run_ranks  # noqa: PLC0415

    if args.nproc <= 0:
        raise UsageError(f"--nproc must be positive, got {args.nproc}")
    gpu = False
    try:
        import torch  # noqa: PLC0415

        gpu = torch.cuda.is_available() and torch.cuda.device_count() >= args.nproc
    except ImportError:
        raise UsageError("the demo needs torch (pip install torch)") from None
    if args.batch_size <= 0:
        raise UsageError(f"--batch-size must be positive, got {args.batch_size}")
    if args.workers <= 0 or not args.timeout > 0:  # run() may be called without the parser's checks
        raise UsageError(f"--workers ({args.workers}) and --timeout ({args.timeout}) must be above 0")
    from dali_mesh import MeshInfo  # noqa: PLC0415

    cfg = {"mesh": args.mesh, "shard": args.shard, "batch": args.batch, "halo": args.halo,
           "boundary": args.boundary, "split": args.split, "batch_size": args.batch_size,
           "workers": args.workers, "gpu": gpu, "fail_rank": args.fail_rank, "dataset": args.dataset,
           "timeout": args.timeout, "allow_external": args.allow_external,
           "share": None if not args.share else ("group" if args.share == "group" else args.share.split(","))}
    # check the mesh and the layout here, before writing data or starting ranks
    mesh = MeshInfo(*mesh_of(cfg, args.nproc))
    channels = getattr(args, "channels", None)
    if channels and not args.data:
        raise UsageError("--channels goes with --data STORE")
    if channels:
        if args.dataset:
            raise UsageError("--dataset does not go with --channels")
        # a path made absolute for the ranks (started in other folders); another store's location as it is
        kind, files = "dataset", [args.data if local_path_of(args.data) is None else os.path.abspath(args.data)]
        args.dataset = cfg["dataset"] = channels
        probe = _make_source(kind, files, channels, None, args.batch_size)
        cfg["ndim"] = len(probe.sample_shape)
        probe = _make_source(kind, files, channels, layout_of(cfg, mesh), args.batch_size)
    elif args.data:
        fmt, files = find_data(args.data)
        kind = fmt.name
        if args.dataset is None and fmt.steps:
            args.dataset = cfg["dataset"] = fmt.default_name(files[0])
        check_files(kind, files, args.dataset, args.allow_external)
        probe = _make_source(kind, files, args.dataset, None, args.batch_size, args.allow_external)
        cfg["ndim"] = len(probe.sample_shape)
        probe = _make_source(kind, files, args.dataset, layout_of(cfg, mesh), args.batch_size,
                             args.allow_external)
    else:
        folder = os.path.join(os.getcwd(), "demo_data")
        shape = parse_ints(args.shape, "--shape")
        if any(s <= 0 for s in shape) or args.samples <= 0:
            raise UsageError(f"--shape {args.shape} and --samples {args.samples} must be positive")
        cfg["ndim"] = len(shape)
        layout_of(cfg, mesh).region(shape)
        files = write_synthetic(folder, args.samples, shape)
        print(f"synthetic data: {args.samples} samples {'x'.join(map(str, shape))} float32 in {folder}")
        kind = format_of(files[0]).name  # the format that reads what write_synthetic wrote
        probe = _make_source(kind, files, None, layout_of(cfg, mesh), args.batch_size)
    cfg.update(files=files, kind=kind)
    if len(probe) == 0:
        raise UsageError(f"{probe.num_samples} samples make no whole batch of {args.batch_size} per sample group: "
                         "lower --batch-size")
    num_samples = probe.num_samples
    print(f"{args.nproc} ranks ({'NCCL, one GPU each' if gpu else 'gloo on the CPU'}), mesh {args.mesh}, "
          f"shard {args.shard}, {num_samples} samples of {probe.sample_shape} {probe.dtype} ({kind}), "
          f"batch {args.batch_size} per rank")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dali_mesh_demo_") as tmp:
        try:
            run_ranks(_rank, args.nproc, tmp, cfg, tmp, timeout_s=args.timeout, backend="nccl" if gpu else "gloo")
        except RankFailure as e:
            # a rank's traceback names the files it read: their credentials are not shown
            if e.reports and not e.hung and all(t.startswith("error: ") for t in e.reports.values()):
                # an error in the data (a corrupt chunk, a reference past a file's end): one line, as plan says it
                said: dict[str, list] = {}
                for r, t in e.reports.items():
                    said.setdefault(t.removeprefix("error: "), []).append(str(r))
                for why, ranks in said.items():
                    where = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {','.join(ranks)}"
                    print(f"dali-mesh: error: {where}: {scrub(why, [args.data, *files])}", file=sys.stderr)
                return 2
            print(f"dali-mesh demo: a rank failed:\n{scrub(str(e), [args.data, *files])}", file=sys.stderr)
            return 1
        stats = [json.load(open(os.path.join(tmp, f"stats{r}.json"))) for r in range(args.nproc)]
    wall = time.perf_counter() - t0
    measured = all(s["read_bytes"] is not None for s in stats)
    reads = [s["read_bytes"] if measured else s["window_bytes"] for s in stats]
    rows = []
    for s, read in zip(stats, reads):
        rows.append([str(s["rank"]), "(" + ", ".join(str(c) for c in s["coordinate"].values()) + ")",
                     "[" + ", ".join(f"{a}:{b}" for a, b in zip(*s["window"])) + "]",
                     f"{read / 2**20:.1f} MiB", f"{100 * read / s['full_bytes']:.1f}%",
                     f"{s['samples'] / s['seconds']:.1f}"])
    header = ["rank", "(" + ", ".join(stats[0]["coordinate"]) + ")", "window", "read", "of full", "samples/s"]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    for r in [header] + rows:
        print("  ".join(c.rjust(w) if i in (0, 3, 4, 5) else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))))
    fractions = [read / s["full_bytes"] for s, read in zip(stats, reads)]
    seen = {sid for s in stats for sid in s["real_ids"]}
    checked = sum(s["verified"] for s in stats)
    dtensor = all(s["dtensor"] for s in stats)
    remote = any(local_path_of(f) is None for f in files)  # as the ranks counted (by path: see _rank_run)
    source_note = ("body bytes each rank's native reader fetched from the object store during the epoch" if remote
                   and measured else "cold /proc/<pid>/io read_bytes of each rank and its DALI workers during the "
                   "epoch (local ranks share one page cache: a page one rank pulled is not read again by another)"
                   if measured else "planned window bytes")
    paths = sorted({(s["path"], s["why"]) for s in stats})
    for path, why in paths:
        ranks = [s["rank"] for s in stats if (s["path"], s["why"]) == (path, why)]
        who = "every rank" if len(ranks) == len(stats) else "ranks " + ",".join(map(str, ranks))
        if path == "native":
            print(f"reader: native (fn.dali_mesh.read_windows, {args.workers} DALI thread(s) per rank) on {who}")
        else:
            print(f"reader: partitioned_source ({args.workers} DALI worker process(es) per rank) on {who}, "
                  f"because {why}")
    exchanges = [s["exchange"] for s in stats if s["exchange"]]
    if exchanges:
        e = exchanges[0]
        print(f"share: groups of {e['group']} ranks, each sample read by one member, the windows exchanged through "
              f"{'shared memory' if e['transport'] == 'shm' else 'all_to_all_single'}: per rank "
              f"{np.median([x['bytes_sent'] for x in exchanges]) / 2**20:.1f} MiB sent, "
              f"{np.median([x['bytes_received'] for x in exchanges]) / 2**20:.1f} MiB received, "
              f"{np.median([x['seconds'] for x in exchanges]):.2f} s in the exchange")
    print(f"bytes: {source_note}; {checked} windows checked against the files"
          f"{', first batch gathered as a DTensor on every rank' if dtensor else ''}; {wall:.1f} s in all")
    if seen != set(range(num_samples)):
        print(f"dali-mesh demo: samples {sorted(set(range(num_samples)) - seen)} were never delivered", file=sys.stderr)
        return 1
    print(f"each rank read {100 * float(np.median(fractions)):.1f}% of the bytes of full-sample loading; "
          f"all {num_samples} samples verified")
    return 0
