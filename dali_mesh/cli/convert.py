"""``dali-mesh convert SRC DST``: copy data into HDF5 or Zarr whose chunks follow the layout's shards.

A ``.npy`` file stores each sample row after row: a split along the innermost axis (longitude in
ERA5) puts window bytes of every rank on every page, so each rank reads the whole file cold. The
copy written here is chunked one chunk per rank's owned region per sample (the chunk grid of
:func:`dali_mesh.cli.advice.aligned_chunks`, finer when a chunk would exceed 64 MiB), uncompressed, so
that a rank's cold read is its window.

- SRC: a ``.npy`` file (one sample), a folder of per-sample ``.npy`` files (one array with a
  leading sample axis, files in name order), or HDF5 / Zarr arrays with samples along axis 0 (a file
  or store, or a folder of them, concatenated in name order).
- DST: ``.h5``/``.hdf5`` (an HDF5 dataset) or ``.zarr`` (a Zarr v3 group holding the array); the
  dataset / array is named ``--name`` (default ``data``). Read it back with ``HDF5Source`` /
  ``ZarrSource`` and that name.
- DST's format object (:mod:`dali_mesh.formats`) writes the copy (``create``) and reads it back
  (``open``, ``read_whole``); nothing here knows HDF5 or Zarr.
- ``--renumber hilbert|morton --coords C.npy [--graph G.npz] [--node-axis A]``: for meshes numbered in
  no spatial order, the nodes on axis A are written in the order of a space-filling curve of their
  coordinates (:func:`dali_mesh.partition.curve_order`), with ``node_permutation`` (new id ``i`` is old
  id ``node_permutation[i]``), ``node_coordinates`` and the graph (``graph_offsets``, ``graph_indices``)
  beside the data, all renumbered and verified: a spatial partition's rows then form a few runs.
  ``Rows(...).renumbered(node_permutation)`` reads rows given in the old numbering.
- Samples are copied by a few threads (the readers release the GIL while reading; HDF5 calls are
  serialised, as h5py serialises them anyway), with a plain-text progress bar on stderr.
- Nothing is written at DST until the copy is complete and verified: the copy goes to a hidden
  sibling ``.DST.partial-PID`` first, every sample is read back and compared bit for bit with the
  source, and only then is it renamed to DST (never over anything that appeared there meanwhile). An
  existing DST is refused unless ``--overwrite``; even then a folder that is not a Zarr store, or one
  that holds the source, is never removed. Partial copies of processes that have ended (SIGKILL)
  are removed when the next convert of that DST starts; SIGTERM and Ctrl-C remove their own.
"""
from __future__ import annotations

import argparse
import logging
import math
import os
import shutil
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from dali_mesh.cli.options import UsageError, find_data, load_graph, make_layout, parse_ints, parse_mesh
from dali_mesh.cli.locations import scheme_of, shown
from dali_mesh.io._common import DataFileError
from dali_mesh.formats import ArrayFormat, format_of, written_suffixes
from dali_mesh.mesh import MeshInfo
from dali_mesh.partition import Layout

__all__ = ["ConvertResult", "RENUMBER_ARRAYS", "Renumbering", "SampleReader", "convert", "convert_array", "open_samples",
           "renumbering"]

log = logging.getLogger(__name__)


# ---- the source: samples by index ---------------------------------------------------------------------
class SampleReader:
    """Samples ``0 .. num_samples-1`` of a source, each a native-endian array of ``sample_shape``."""

    def __init__(self, kind: str, files: list[str], sample_shape: tuple[int, ...], dtype: np.dtype,
                 counts: list[int], read_one: Callable[[int, int], np.ndarray], close: Callable[[], None]) -> None:
        self.kind = kind
        self.files = files
        self.sample_shape = sample_shape
        self.dtype = dtype
        self._starts = np.cumsum([0] + counts)
        self._read_one = read_one
        self._close = close

    @property
    def num_samples(self) -> int:
        return int(self._starts[-1])

    def read(self, i: int) -> np.ndarray:
        fi = int(np.searchsorted(self._starts, i, side="right")) - 1
        out = np.asarray(self._read_one(fi, i - int(self._starts[fi])))
        return out.astype(self.dtype.newbyteorder("="), copy=False)

    def close(self) -> None:
        self._close()


def local_destination(location, what: str) -> str:
    """The local path a command writes ``location`` to: a plain path, or a ``file://`` URL's path.
    Any other ``scheme://`` is refused (raises :class:`~dali_mesh.cli.options.UsageError`): written as a
    path it would become a local folder named after the URL (``./s3:/bucket/...``)."""
    location = os.fspath(location)
    scheme = scheme_of(location)
    if scheme is None:
        return location
    if scheme == "file":
        from dali_mesh.storage import store_of  # noqa: PLC0415

        return store_of(location)[1]
    raise UsageError(f"{what} {shown(location)!r} is not local ({scheme}://): dali-mesh writes only to local "
                     "paths; write the copy to a local path (or a file:// URL), then upload it with your object "
                     "store's own tool (e.g. aws s3 cp --recursive); nothing was read or written")


def _same(first: tuple, path: str, shape, dtype, what: str) -> None:
    if (tuple(shape), np.dtype(dtype)) != first[1:]:
        raise UsageError(f"{what}: {shown(path)} holds samples of {tuple(shape)} {np.dtype(dtype)} but "
                         f"{shown(first[0])} holds {first[1]} {first[2]}: every file must hold samples of one shape "
                         "and dtype")


def open_samples(src: str, dataset: str | None = None, lock: threading.Lock | None = None, *,
                 allow_external: bool = False) -> SampleReader:
    """A :class:`SampleReader` over ``src`` (see the module docstring); every file's metadata is
    checked now (shape, dtype, size), so a bad file fails before anything is written.
    ``allow_external``: read HDF5 datasets kept in or linked to other files (``--allow-external``)."""
    fmt, files = find_data(src, "SRC")
    lock = lock or threading.Lock()
    if not fmt.steps:  # one sample per file
        if dataset:
            raise UsageError(f"--dataset names an HDF5 dataset or Zarr array; {fmt.label}s have none")
        infos = [fmt.info(f) for f in files]
        first = (files[0], tuple(infos[0].shape), infos[0].dtype)
        for f, info in zip(files, infos):
            _same(first, f, info.shape, info.dtype, "SRC")

        def read_file(fi, _):
            handle = fmt.open(files[fi])
            try:
                return fmt.read_whole(handle)
            finally:
                fmt.close(handle)

        return SampleReader(fmt.name, files, first[1], first[2], [1] * len(files), read_file, lambda: None)
    options = fmt.trust_options(allow_external)
    name = dataset or fmt.default_name(files[0])
    handles = []

    def close_all():
        for h in handles:
            fmt.close(h)

    def read_step(fi, j):
        if fmt.reads_in_parallel:
            return fmt.read_whole(handles[fi], j)
        with lock:
            return fmt.read_whole(handles[fi], j)

    try:
        for f in files:
            handles.append(fmt.open(f, name, **options))
        infos = [fmt.info(f, name, **options) for f in files]
        for f, info in zip(files, infos):
            if len(info.shape) < 2:
                raise UsageError(f"SRC: {shown(f)} holds an array of shape {tuple(info.shape)}: samples lie along "
                                 "axis 0, so it needs at least 2 axes")
        first = (files[0], tuple(infos[0].shape[1:]), infos[0].dtype)
        for f, info in zip(files, infos):
            _same(first, f, info.shape[1:], info.dtype, "SRC")
    except BaseException:
        close_all()
        raise
    return SampleReader(fmt.name, files, first[1], first[2], [int(info.shape[0]) for info in infos], read_step,
                        close_all)


# ---- progress --------------------------------------------------------------------------------------------------
class _Progress:
    """``label [#####.....] 12/32 samples, 40.1 MiB/s`` on one line of stderr (plain text)."""

    def __init__(self, label: str, total: int, nbytes_each: int, enabled: bool, stream=None) -> None:
        self.label, self.total, self.each = label, total, nbytes_each
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.done = 0
        self.t0 = self.last = time.perf_counter()
        self.lock = threading.Lock()

    def step(self) -> None:
        with self.lock:
            self.done += 1
            now = time.perf_counter()
            if self.enabled and (now - self.last > 0.2 or self.done == self.total):
                self.last = now
                width = 30
                filled = width * self.done // max(self.total, 1)
                rate = self.done * self.each / max(now - self.t0, 1e-9) / 2**20
                self.stream.write(f"\r  {self.label} [{'#' * filled}{'.' * (width - filled)}] "
                                  f"{self.done}/{self.total} samples, {rate:.1f} MiB/s")
                if self.done == self.total:
                    self.stream.write("\n")
                self.stream.flush()


def _run_parallel(fn: Callable[[int], None], n: int, workers: int, progress: _Progress) -> None:
    """``fn(i)`` for every i, on ``workers`` threads, at most ``2 * workers`` samples in flight (memory
    stays bounded); the first error stops the rest and is raised."""
    if workers <= 1:
        for i in range(n):
            fn(i)
            progress.step()
        return
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dali-mesh-convert") as pool:
        pending = []
        for i in range(n):
            pending.append(pool.submit(fn, i))
            if len(pending) >= 2 * workers:
                pending.pop(0).result()
                progress.step()
        for fut in pending:
            fut.result()
            progress.step()


# ---- node renumbering ----------------------------------------------------------------------------------------------
#: the arrays written beside the features by ``--renumber`` (new id ``i`` is old id ``node_permutation[i]``)
RENUMBER_ARRAYS = ("node_permutation", "node_coordinates", "graph_offsets", "graph_indices")


@dataclass(frozen=True)
class Renumbering:
    """Nodes on sample ``axis`` renumbered along a space-filling ``curve`` of their coordinates: new id
    ``i`` is old id ``order[i]``. ``coords`` and ``graph`` (CSR/CSC ``(offsets, indices)``, or None) are
    in the new numbering."""

    axis: int
    curve: str
    order: np.ndarray
    coords: np.ndarray
    graph: tuple | None = None

    def apply(self, sample: np.ndarray) -> np.ndarray:
        return np.take(sample, self.order, axis=self.axis)

    def arrays(self) -> dict[str, np.ndarray]:
        out = {"node_permutation": self.order, "node_coordinates": self.coords}
        if self.graph is not None:
            out["graph_offsets"], out["graph_indices"] = self.graph
        return out


def renumbering(coords_path: str, curve: str, axis: int, graph_path: str | None = None) -> Renumbering:
    """:class:`Renumbering` from a ``.npy`` file of ``(nodes, d)`` coordinates and, optionally, a ``.npz``
    file holding the graph's ``offsets`` and ``indices``."""
    from dali_mesh.partition import LayoutError, curve_order, renumber_graph  # noqa: PLC0415

    try:
        coords = np.load(coords_path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise UsageError(f"--coords {shown(coords_path)!r}: {e}") from None
    try:
        order = curve_order(coords, curve)
        graph = None
        if graph_path is not None:
            graph = renumber_graph(*load_graph(graph_path), order)
    except LayoutError as e:
        raise UsageError(str(e)) from None
    return Renumbering(int(axis), curve, order, np.asarray(coords)[order], graph)


# ---- the destination --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ConvertResult:
    dst: str
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    chunks: tuple[int, ...]
    seconds: float
    bytes_written: int
    note: str | None = None  # why the chunks cannot follow the shard boundaries (cold reads above ~1.0x)
    renumbered: str | None = None  # the curve the nodes were renumbered along (--renumber)

    def __str__(self) -> str:
        mib = self.bytes_written / 2**20
        return (f"wrote {self.dst} ({format_of(self.dst).label} "
                f"{self.name!r}: {'x'.join(map(str, self.shape))} {self.dtype}, chunks {self.chunks}, uncompressed), "
                f"{mib:.1f} MiB in {self.seconds:.1f} s; every sample verified against the source"
                + (f"\nnote: these chunks do not follow every shard boundary: {self.note}" if self.note else "")
                + (f"\nnodes renumbered along a {self.renumbered} curve: new id i is old id node_permutation[i]; "
                   f"beside {self.name!r}: {', '.join(RENUMBER_ARRAYS)} (the graph's when given)"
                   if self.renumbered else ""))


def _check_dst(dst: str, src_files: Sequence[str], overwrite: bool) -> ArrayFormat:
    """DST's format (one that writes), after checking that DST may be written (see the module docstring)."""
    fmt = format_of(dst)
    if fmt is None or not fmt.write_suffixes:
        names = written_suffixes()
        raise UsageError(f"DST {dst!r} must end in {', '.join(names[:-1])} or {names[-1]} (the format is taken "
                         "from the name)")
    real = os.path.realpath(dst)
    if any(os.path.realpath(f) == real for f in src_files):
        raise UsageError(f"DST {dst!r} is also the source: write the copy elsewhere")
    inside = [f for f in src_files if os.path.realpath(f).startswith(real.rstrip(os.sep) + os.sep)]
    if inside:
        raise UsageError(f"DST {dst!r} holds the source ({inside[0]!r}): replacing it would delete the source; "
                         "write the copy elsewhere")
    if os.path.lexists(dst):
        if not overwrite:
            raise UsageError(f"DST {dst!r} exists: pass --overwrite to replace it, or choose another name")
        if os.path.isdir(dst) and not fmt.is_store(dst):
            raise UsageError(f"DST {dst!r} is a folder that is not a Zarr store: it is never removed, even with "
                             "--overwrite; remove it yourself or choose another name")
    folder = os.path.dirname(os.path.abspath(dst))
    if not os.path.isdir(folder):
        raise UsageError(f"DST {dst!r}: folder {folder!r} does not exist")
    return fmt


def _parse_chunks(text: str | Sequence[int], layout: Layout, sample_shape, itemsize: int) -> tuple[int, ...]:
    from dali_mesh.cli.advice import aligned_chunks  # noqa: PLC0415

    if isinstance(text, str) and text == "auto":
        return aligned_chunks(layout, sample_shape, itemsize)
    chunks = parse_ints(text, "--chunks") if isinstance(text, str) else tuple(int(c) for c in text)
    if len(chunks) != len(sample_shape) + 1 or any(c <= 0 for c in chunks):
        raise UsageError(f"--chunks {text!r}: give {len(sample_shape) + 1} positive sizes (the sample axis first, "
                         f"then the sample's {tuple(sample_shape)}), or auto")
    too_big = [(a, c, n) for a, (c, n) in enumerate(zip(chunks[1:], sample_shape), 1) if c > n]
    if too_big:
        a, c, n = too_big[0]
        raise UsageError(f"--chunks {text!r}: {c} cells on axis {a} is larger than the data ({n}); a chunk "
                         "at most as large as the array on every sample axis")
    return chunks


def _check_name(name: str) -> str:
    """``--name``: one dataset / array name (not empty, no path separators or '..')."""
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise UsageError(f"--name {name!r}: give one plain name for the dataset or array (no '/', not empty, "
                         "not '.' or '..')")
    return name


def _partial_path(dst: str, pid: int) -> str:
    """Where the copy is written before it is verified: ``.<DST name>.partial-<pid>`` beside DST."""
    return os.path.join(os.path.dirname(os.path.abspath(dst)), f".{os.path.basename(dst.rstrip('/'))}.partial-{pid}")


def _remove_stale_partials(dst: str) -> None:
    """Remove the partial copies of DST left by processes that no longer run (SIGKILL, a crash)."""
    folder = os.path.dirname(os.path.abspath(dst))
    prefix = os.path.basename(_partial_path(dst, 0))[:-1]
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for n in names:
        pid = n[len(prefix):]
        if not n.startswith(prefix) or not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # that copy is still running
        except ProcessLookupError:
            pass
        except PermissionError:
            continue  # another user's process
        log.info("convert: removing %s, left by process %s, which has ended", n, pid)
        _remove(os.path.join(folder, n))


def _rename_noreplace(src: str, dst: str) -> None:
    """``src`` renamed to ``dst`` only if nothing is at ``dst`` (renameat2 RENAME_NOREPLACE where the
    kernel has it; else a check just before the rename)."""
    import ctypes  # noqa: PLC0415
    import errno  # noqa: PLC0415

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        renameat2 = None
    if renameat2 is not None:
        at_fdcwd, rename_noreplace = -100, 1
        if renameat2(at_fdcwd, os.fsencode(src), at_fdcwd, os.fsencode(dst), rename_noreplace) == 0:
            return
        e = ctypes.get_errno()
        if e == errno.EEXIST:
            raise UsageError(f"DST {dst!r} appeared while the copy ran: it is left as it is; the copy is removed")
        if e not in (errno.ENOSYS, errno.EINVAL):
            raise OSError(e, os.strerror(e), dst)
    if os.path.lexists(dst):
        raise UsageError(f"DST {dst!r} appeared while the copy ran: it is left as it is; the copy is removed")
    os.rename(src, dst)


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)


def _remove_settled(path: str, quiet_s: float = 0.3, limit_s: float = 5.0) -> None:
    """Remove the partial copy after a failed write, until it has stayed gone for ``quiet_s``: a
    format's writer may still be storing the other chunks of the sample whose write failed (zarr's
    event loop raises at the first failure), and a chunk written after the removal recreates the folder."""
    deadline = time.monotonic() + limit_s
    while True:
        try:
            _remove(path)
        except OSError:  # a file written while the folder was being removed: again
            pass
        settled = time.monotonic() + quiet_s
        while time.monotonic() < settled and not os.path.lexists(path):
            time.sleep(0.02)
        if not os.path.lexists(path) or time.monotonic() > deadline:
            return


def convert_array(
    src: str,
    dst: str,
    layout: Layout,
    *,
    dataset: str | None = None,
    name: str = "data",
    chunks: str | Sequence[int] = "auto",
    workers: int = 4,
    overwrite: bool = False,
    progress: bool = True,
    allow_external: bool = False,
    renumber: Renumbering | None = None,
) -> ConvertResult:
    """Copy ``src`` to ``dst`` chunked for ``layout`` (see the module docstring); returns what was written.
    ``dst`` is a local path or ``file://`` URL: another scheme is refused before anything is read. With
    ``renumber``, every sample's nodes are written in the new order, and the permutation, the new
    coordinates and graph beside them (:data:`RENUMBER_ARRAYS`)."""
    dst = local_destination(dst, "DST")
    if not isinstance(workers, int) or workers < 1:
        raise UsageError(f"workers must be an integer >= 1, got {workers!r}")
    lock = threading.Lock()
    source = open_samples(src, dataset, lock, allow_external=allow_external)
    try:
        fmt = _check_dst(dst, source.files, overwrite)
        sample_shape, dtype = source.sample_shape, source.dtype
        layout.region(sample_shape)  # the layout fits the sample
        chunk_shape = _parse_chunks(chunks, layout, sample_shape, dtype.itemsize)
        note = None
        if isinstance(chunks, str) and chunks == "auto":
            from dali_mesh.cli.advice import chunk_advice  # noqa: PLC0415

            note = chunk_advice(layout, sample_shape, dtype.itemsize)[1]
            if note:
                log.info("convert %s: %s", shown(src), note)
        _check_name(name)
        read = source.read
        if renumber is not None:
            if not -len(sample_shape) <= renumber.axis < len(sample_shape):
                raise UsageError(f"--node-axis {renumber.axis} is out of range for samples of {sample_shape}")
            if sample_shape[renumber.axis] != renumber.order.size:
                raise UsageError(f"--coords give {renumber.order.size} nodes, but axis {renumber.axis} of the samples "
                                 f"{sample_shape} has {sample_shape[renumber.axis]}")
            if name in RENUMBER_ARRAYS:
                raise UsageError(f"--name {name!r} is one of the arrays --renumber writes beside it: choose another")

            def read(i):
                return renumber.apply(source.read(i))
        n = source.num_samples
        shape = (n,) + tuple(sample_shape)
        tmp = _partial_path(dst, os.getpid())
        _remove_stale_partials(dst)
        _remove(tmp)
        t0 = time.perf_counter()
        sample_bytes = math.prod(sample_shape) * dtype.itemsize
        try:
            with fmt.create(tmp, name, shape, dtype, chunk_shape) as out:  # a failed copy is discarded
                def write(i):
                    out.write(i, read(i))
                _run_parallel(write, n, workers, _Progress("copy  ", n, sample_bytes, progress))
                for extra, values in (renumber.arrays() if renumber is not None else {}).items():
                    out.add_array(extra, values)
            _verify(read, n, fmt, tmp, name, workers, progress, sample_bytes)
            if renumber is not None:
                _verify_arrays(fmt, tmp, renumber.arrays())
            seconds = time.perf_counter() - t0
            # DST again: it may have appeared (or changed) while the copy ran; never remove what
            # was not checked, never replace what --overwrite was not given for
            _check_dst(dst, source.files, overwrite)
            if os.path.lexists(dst):  # --overwrite, checked just now
                _remove(dst)
            _rename_noreplace(tmp, dst)
        except BaseException:
            _remove_settled(tmp)
            raise
    finally:
        source.close()
    return ConvertResult(dst, name, shape, dtype, chunk_shape, seconds, n * sample_bytes, note,
                         None if renumber is None else renumber.curve)


def _verify_arrays(fmt: ArrayFormat, path: str, arrays: dict) -> None:
    """The arrays written beside the samples, read back whole, equal what was written."""
    for name, values in arrays.items():
        handle = fmt.open(path, name)
        try:
            got = np.asarray(fmt.read_whole(handle))
        finally:
            fmt.close(handle)
        if not np.array_equal(got, values):
            raise DataFileError(path, f"array {name!r} of the copy differs from what was written; the copy is removed")


def _verify(read: Callable[[int], np.ndarray], num_samples: int, fmt: ArrayFormat, path: str, name: str, workers: int,
            progress: bool, sample_bytes: int) -> None:
    """Every sample of the copy, read back by its format's own library, equals ``read(i)``, bit for bit
    (NaN payloads and -0.0 included)."""
    handle = fmt.open(path, name)

    def check(i):
        want = np.ascontiguousarray(read(i))
        got = np.ascontiguousarray(fmt.read_whole(handle, i)).astype(want.dtype, copy=False)
        if got.shape != want.shape or not np.array_equal(got.view(np.uint8), want.view(np.uint8)):
            raise DataFileError(path, f"sample {i} of the copy differs from the source; the copy is removed "
                                "(is the source being rewritten?)")
    try:
        _run_parallel(check, num_samples, workers, _Progress("verify", num_samples, sample_bytes, progress))
    finally:
        fmt.close(handle)


def convert(args: argparse.Namespace) -> ConvertResult:
    """``dali-mesh convert``: the layout from ``--mesh --shard --batch --split --crop`` (the sample
    shape from SRC), then :func:`convert_array`."""
    allow_external = bool(getattr(args, "allow_external", False))
    local_destination(args.dst, "DST")  # refused before SRC is read: s3://... would become a local ./s3:/ folder
    source = open_samples(args.src, args.dataset, allow_external=allow_external)
    try:
        sample_shape = source.sample_shape
    finally:
        source.close()
    if args.shape and parse_ints(args.shape, "--shape") != sample_shape:
        raise UsageError(f"--shape {args.shape} disagrees with SRC {shown(args.src)!r} (samples of {sample_shape}): "
                         "leave --shape out")
    mesh_shape, names = parse_mesh(args.mesh, args.world_size)
    layout = make_layout(MeshInfo(mesh_shape, names), len(sample_shape), shard=args.shard, batch=args.batch,
                         halo=args.halo, boundary=args.boundary, split=args.split, crop=args.crop,
                         fill_value=args.fill_value)
    renumber = None
    if getattr(args, "renumber", None):
        if not args.coords:
            raise UsageError("--renumber needs --coords, a .npy file of the nodes' (n, d) coordinates")
        renumber = renumbering(args.coords, args.renumber, args.node_axis, args.graph)
    elif getattr(args, "coords", None) or getattr(args, "graph", None):
        raise UsageError("--coords and --graph are for --renumber")
    return convert_array(args.src, args.dst, layout, dataset=args.dataset, name=args.name, chunks=args.chunks,
                         workers=args.workers, overwrite=args.overwrite, progress=not args.no_progress,
                         allow_external=allow_external, renumber=renumber)
