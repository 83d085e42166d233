"""What the tests share: the numpy oracles and random test data, the native reader's skips and meshes,
a one-shot CPU pipeline, and running a script in a fresh interpreter.

Import as ``from tests.helpers import ...`` (the repository root is on ``sys.path`` under pytest;
``tests/`` itself never is: ``tests/torch`` and ``tests/io`` are packages, not the libraries)."""
import os
import random
import re
import subprocess
import sys
import textwrap
from typing import NamedTuple

import numpy as np
import pytest

from dali_mesh import MeshInfo
from dali_mesh.partition import Region

#: the repository root (a str: it goes into PYTHONPATH and subprocess scripts)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

NP_MODE = {"constant": "constant", "periodic": "wrap", "reflect": "reflect", "symmetric": "symmetric", "edge": "edge"}


def np_pad_window(domain_array, region):
    """The oracle: np.pad the domain, one axis at a time with that axis's numpy mode, then slice."""
    padded = domain_array
    pads = region.pads
    for a, mode in enumerate(region.boundary):
        if mode == "trim":
            assert pads[a] == (0, 0)
            continue
        width = [(0, 0)] * padded.ndim
        width[a] = pads[a]
        kwargs = {"constant_values": region.fill_value} if mode == "constant" else {}
        padded = np.pad(padded, width, mode=NP_MODE[mode], **kwargs)
    index = []
    for a in range(region.ndim):
        lo = region.window_start[a] - region.domain_start[a] + pads[a][0]
        index.append(slice(lo, lo + region.window_shape[a]))
    return padded[tuple(index)]


def np_pad_sample(sample, region):
    """The window of a whole sample by np.pad of its domain (the crop box)."""
    domain = sample[tuple(slice(a, b) for a, b in zip(region.domain_start, region.domain_stop))]
    return np_pad_window(domain, region)


# ---- random test data of the kernel and operator tests ------------------------------------------
#: Random data each run; the seed is in every failure message (set DALI_MESH_TEST_SEED to replay).
SEED = int(os.environ.get("DALI_MESH_TEST_SEED", random.SystemRandom().randrange(2**31)))
MODES = ("constant", "periodic", "reflect", "symmetric", "edge")
DTYPES = [np.uint8, np.uint16, np.uint32, np.uint64, np.int8, np.int16, np.int32, np.int64,
          np.float16, np.float32, np.float64, np.bool_]


def random_array(rng: np.random.Generator, shape, dtype, *, beyond_int: bool = True) -> np.ndarray:
    """Random values of ``dtype``: integers over the dtype's whole range, floats normal (wider for
    float16, some beyond its range: inf); ``beyond_int``: a few float values beyond every integer
    range (to test saturating casts)."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    scale = 3e4 if dtype == np.float16 else 1e3
    x = rng.normal(0, scale, shape)
    if beyond_int and x.size and dtype != np.float16:
        flat = x.reshape(-1)
        flat[rng.integers(0, flat.size, max(1, flat.size // 16))] *= 1e17
    with np.errstate(over="ignore"):  # values beyond float16: inf, on purpose
        return x.astype(dtype)


def random_region(rng: np.random.Generator, shape, mode: str, max_halo: int = 6, dtype=None,
                  fill_value=None) -> Region:
    """A random domain (crop) of ``shape`` and a random window around it reaching up to ``max_halo``
    cells beyond it (inside it for ``trim``); ``fill_value`` by default one that ``dtype`` holds."""
    ds, de, ws, we = [], [], [], []
    for n in shape:
        a = int(rng.integers(0, n))
        b = int(rng.integers(a + 1, n + 1))
        if mode == "trim":
            u = int(rng.integers(a, b))
            v = int(rng.integers(u, b + 1))
        else:
            u = int(rng.integers(a - max_halo, b))
            v = int(rng.integers(u + 1, b + max_halo + 1))
        ds.append(a), de.append(b), ws.append(u), we.append(v)
    if fill_value is None:
        kind = np.dtype(dtype).kind if dtype is not None else "f"
        fill_value = {"b": 1, "u": 7}.get(kind, -7)
    return Region(ds, de, ds, de, ws, we, mode, fill_value=fill_value)


# ---- the native reader -------------------------------------------------------------------------
def needs_read_windows():
    """Skips the calling test unless the plugin is built and has the read_windows operator."""
    from dali_mesh.fn import load_plugin

    try:
        ops = load_plugin()
    except ImportError as e:
        pytest.skip(f"plugin not built: {e}")
    if not hasattr(ops, "read_windows"):
        pytest.skip("the plugin has no read_windows operator: rebuild it")


def mesh_of(shape, coord):
    """A mesh whose first dim is data_parallel and the others m0, m1, ...; this rank at ``coord``."""
    names = ("data_parallel",) + tuple(f"m{i}" for i in range(len(shape) - 1))
    return MeshInfo(shape, names, coord)


def dali_gpus() -> int:
    """CUDA devices DALI sees (0 without a driver: DALI says so by raising)."""
    try:
        from nvidia.dali import backend

        return backend.GetCUDADeviceCount()
    except Exception:  # noqa: BLE001
        return 0


# ---- DALI: one batch through a CPU pipeline -----------------------------------------------------
def _constant(b):
    return lambda: b  # no parameters: DALI would pass the iteration index to one


def run_pipeline(graph, batch, num_threads=2):
    """Runs graph(*inputs) once on a CPU pipeline: `batch` is a list of per-input lists of arrays;
    returns one list of numpy arrays per output (imports DALI)."""
    from nvidia.dali import fn, pipeline_def


    @pipeline_def(batch_size=len(batch[0]), num_threads=num_threads, device_id=None, exec_dynamic=True)
    def pipe():
        inputs = [fn.external_source(source=_constant(b), batch=True) for b in batch]
        out = graph(*inputs)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)

    p = pipe()
    p.build()
    outs = p.run()
    return [[np.array(o[i]) for i in range(len(batch[0]))] for o in outs]


# ---- a fresh interpreter ---------------------------------------------------------------------------
def run_python(script: str, *args: str, env: dict | None = None, timeout: float = 150, cwd: str | None = ROOT,
               check: bool = False) -> subprocess.CompletedProcess:
    """Runs ``script`` (dedented) in a fresh ``python -c`` with the repository root on PYTHONPATH and
    ``env`` added to this process's environment, output captured as text; ``check``: a non-zero exit fails the calling test with its output."""
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, full_env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=full_env)
    if check and proc.returncode != 0:
        pytest.fail(f"exit {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return proc


def native_pipeline(src, *, batch_size=None, threads=2, checkpoint=None, checkpointing=True, **kw):
    """A built CPU pipeline of ``read_windows(src, fallback=False, **kw)`` (checkpointing on unless
    ``checkpointing=False``, prefetch depth 1; ``batch_size``: the source's by default)."""
    from nvidia.dali import pipeline_def

    from dali_mesh.pipeline import native

    @pipeline_def(batch_size=batch_size or src.batch_size, num_threads=threads, device_id=None,
                  enable_checkpointing=checkpointing, prefetch_queue_depth=1)
    def pipe():
        return native.read_windows(src, fallback=False, **kw)

    p = pipe(checkpoint=checkpoint) if checkpoint is not None else pipe()
    p.build()
    return p


def native_batches(src, n_batches, *, threads=2, **kw):
    """``(sample id, window)`` of every sample of the first ``n_batches`` batches of
    :func:`native_pipeline`."""
    p = native_pipeline(src, threads=threads, **kw)
    out = []
    for _ in range(n_batches):
        w, ids, _ = p.run()
        out += [(int(np.array(ids[i])), np.array(w[i])) for i in range(len(w))]
    return out


def native_epoch(src, key=None, **kw) -> dict:
    """``{key(sample id): window}`` of one epoch of :func:`native_pipeline` (``key``: the sample id by
    default; ``src.step_of`` for a source of steps)."""
    p = native_pipeline(src, **kw)
    got = {}
    for _ in range(len(src) // src.batch_size):
        w, ids, _ = p.run()
        for i in range(len(w)):
            sid = int(np.array(ids[i]))
            got[sid if key is None else key(sid)] = np.array(w[i])
    return got


def row_stores(folder, x, *, blocksize: int, inner: int, shard: tuple, h5_chunk: int):
    """``x`` (steps, rows, features) written in every format the rows= tests read: a ``.npy`` file per step,
    a Zarr v2 array of Blosc(lz4, shuffle, ``blocksize``) whole-grid chunks, a Zarr v3 array of Zstd chunks of
    ``inner`` rows in shards of ``shard`` (steps, rows), and HDF5 datasets ``chunked`` (gzip + shuffle,
    ``h5_chunk`` rows) and ``contiguous``. Returns ``(makers, blosc store)``: ``makers[kind](layout, rows,
    **source kwargs)`` makes the source of each."""
    import h5py
    import numcodecs
    import zarr

    from dali_mesh import HDF5Source, NumpySource, ZarrSource

    steps, n, f = x.shape
    files = []
    for t in range(steps):
        files.append(os.path.join(folder, f"s{t}.npy"))
        np.save(files[-1], x[t])
    blosc = os.path.join(folder, "blosc.zarr")
    zarr.create_array(blosc, shape=x.shape, chunks=(1, n, f), dtype="f4", zarr_format=2,
                      compressors=numcodecs.Blosc("lz4", 5, numcodecs.Blosc.SHUFFLE, blocksize=blocksize))[:] = x
    sharded = os.path.join(folder, "zstd.zarr")
    zarr.create_array(sharded, shape=x.shape, chunks=(1, inner, f), shards=shard + (f,), dtype="f4", zarr_format=3,
                      compressors=zarr.codecs.ZstdCodec(level=3))[:] = x
    h5 = os.path.join(folder, "f.h5")
    with h5py.File(h5, "w") as fh:
        fh.create_dataset("chunked", data=x, chunks=(1, h5_chunk, f), compression="gzip", shuffle=True)
        fh.create_dataset("contiguous", data=x)
    return {
        "npy": lambda lay, rows, **kw: NumpySource(files, lay, rows=rows, **kw),
        "zarr_blosc": lambda lay, rows, **kw: ZarrSource([blosc], None, lay, rows=rows, **kw),
        "zarr_sharded_zstd": lambda lay, rows, **kw: ZarrSource([sharded], None, lay, rows=rows, **kw),
        "hdf5_chunked": lambda lay, rows, **kw: HDF5Source([h5], "chunked", lay, rows=rows, **kw),
        "hdf5_contiguous": lambda lay, rows, **kw: HDF5Source([h5], "contiguous", lay, rows=rows, **kw),
    }, blosc


def assert_windows(w, ids, samples, region):
    """Each window of a batch (a pipeline's outputs ``w`` and ``ids``) equals take_window of
    ``samples[its sample id]`` over ``region``."""
    from dali_mesh.partition import take_window

    for i in range(len(w)):
        sid = int(np.array(ids[i]))
        np.testing.assert_array_equal(np.array(w[i]), take_window(samples[sid], region))


def pipeline_epochs(pipe, epochs: int) -> list:
    """``[[(sample id, window), ...] per batch]`` per epoch: ``pipe`` run to each epoch's end (``reset``
    after its StopIteration)."""
    out = []
    for _ in range(epochs):
        got = []
        while True:
            try:
                w, ids, _ = pipe.run()
            except StopIteration:
                pipe.reset()
                break
            got.append([(int(np.array(ids[i])), np.array(w[i])) for i in range(len(w))])
        out.append(got)
    return out


def gpu_windows_pipeline(src, *, prefetch_queue_depth=1):
    """A built pipeline on GPU 0 of ``read_windows(src, device="gpu", fallback=False)``: the windows
    (in device memory) and the sample ids."""
    from nvidia.dali import pipeline_def

    from dali_mesh.pipeline import native

    @pipeline_def(batch_size=src.batch_size, num_threads=2, device_id=0, prefetch_queue_depth=prefetch_queue_depth)
    def pipe():
        w, ids, _ = native.read_windows(src, device="gpu", fallback=False)
        return w, ids

    p = pipe()
    p.build()
    return p


def check_gpu_epoch(p, src, files):
    """The batches of one epoch of :func:`gpu_windows_pipeline` ``p``: each window, copied to the host,
    equals take_window of its whole sample (``np.load`` of ``files[sample id]``)."""
    from dali_mesh.partition import take_window

    for _ in range(len(src) // src.batch_size):
        w, ids = p.run()
        w = w.as_cpu()
        for k in range(src.batch_size):
            sid = int(np.array(ids[k]))
            np.testing.assert_array_equal(np.array(w[k]), take_window(np.load(files[sid]), src.region))


def fed_plugin_pipeline(plan_path, feed, batch_size, **read_ahead):
    """A built CPU pipeline of the plugin's ``read_windows`` on the plan file at ``plan_path``, fed by
    ``feed``: per batch ``(sample ids, next ids)``, the next ids per sample a list of its ids in the
    batches after this one; ``read_ahead``: the operator's read_ahead_* arguments. Outputs the windows
    (float32) and the ids."""
    from nvidia.dali import fn, pipeline_def, types

    from dali_mesh.fn import load_plugin

    feed = iter(feed)

    def batch():
        ids, nxt = next(feed)
        return [np.array(i, np.int64) for i in ids], [np.array(n, np.int64) for n in nxt]

    @pipeline_def(batch_size=batch_size, num_threads=2, device_id=None, prefetch_queue_depth=1)
    def pipe():
        ids, nxt = fn.external_source(source=batch, num_outputs=2, batch=True, dtype=types.INT64)
        return load_plugin().read_windows(ids, nxt, plan_file=plan_path, dtype=types.FLOAT, **read_ahead), ids

    p = pipe()
    p.build()
    return p


class ReadBeside:
    """``body(reader, got)`` on a daemon thread of its own, with a ``_kernels.PlanReader`` of the plan file
    at ``plan_path`` (float32), started now (``t0``): for a read beside others that are stuck. ``got``:
    what ``body`` appended; ``errors``: what it raised."""

    def __init__(self, plan_path, body):
        import threading
        import time

        self.plan_path, self.body = plan_path, body
        self.got: list = []
        self.errors: list = []
        self.t0 = time.monotonic()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        from dali_mesh import _kernels

        try:
            with _kernels.PlanReader(self.plan_path, "f4") as r:
                self.body(r, self.got)
        except Exception as e:  # noqa: BLE001 - the test reports it
            self.errors.append(e)

    def join(self, timeout):
        self.thread.join(timeout)


def assert_refused(call, error, *fragments, what):
    """``call()`` raises ``error`` whose message holds each of ``fragments``; were it accepted, an
    AssertionError says ``what`` was accepted. (Plain asserts: it runs in the ranks' processes too.)"""
    try:
        call()
    except error as e:
        for fragment in fragments:
            assert fragment in str(e), e
    else:
        raise AssertionError(f"{what} was accepted")


def write_era5_folder(root, rng, shape, chunks, *, marked=False) -> dict:
    """What PhysicsNeMo's ERA5HDF5Datapipe reads, in ``root`` (a Path): ``data/2000.h5`` (contiguous) and
    ``data/2001.h5`` (in ``chunks``, gzip + shuffle) of ``rng``'s standard normal float32 fields of
    ``shape`` (steps, channels, H, W), then ``stats/global_means.npy`` (standard normal) and
    ``stats/global_stds.npy`` (0.5 to 1.5) per channel; ``marked``: each step plus 10 x its step and
    1000 x its year's number past 2000. Returns ``{year: fields}``."""
    import h5py

    (root / "data").mkdir()
    (root / "stats").mkdir()
    years = {}
    for y in (2000, 2001):
        a = rng.standard_normal(shape).astype(np.float32)
        if marked:
            a += (np.arange(shape[0], dtype=np.float32)[:, None, None, None] * 10 + (y - 2000) * 1000)
        with h5py.File(root / "data" / f"{y}.h5", "w") as f:
            if y == 2000:
                f["fields"] = a
            else:
                f.create_dataset("fields", data=a, chunks=chunks, compression="gzip", shuffle=True)
        years[y] = a
    channels = shape[1]
    np.save(root / "stats" / "global_means.npy", rng.standard_normal((1, channels, 1, 1)).astype(np.float32))
    np.save(root / "stats" / "global_stds.npy", (rng.random((1, channels, 1, 1)) + 0.5).astype(np.float32))
    return years


def one_rank_layout(shard_axis=0):
    """A one-rank mesh ("mp",) sharding ``shard_axis``: the window is the whole sample."""
    from dali_mesh import Layout

    return Layout(MeshInfo((1,), ("mp",), (0,)), shard={"mp": shard_axis})


# ---- crafted plan files (the typed plan objects, checked by nothing here) ---------------------------
def crafted_plan(ndim, itemsize, swap, fortran, shape, fo, do, ub, gb, ge, check=b"", check_off=0, fill=b"",
                 axes=None, repeat=None):
    """A plan as given (``ndim`` is ``len(shape)``; ``repeat``: the units' ``(count, file step, dest
    step)``), for plans the reader must refuse or read exactly."""
    from dali_mesh.plan import AxisProgram, ReadPlan

    assert ndim == len(shape)
    ints = [np.asarray(v, np.int64) for v in (fo, do, ub, gb, ge)]
    programs = tuple(AxisProgram(*(np.asarray(v, np.int64) for v in a)) for a in (axes or [([], [], [])] * ndim))
    return ReadPlan(itemsize, swap, fortran, tuple(shape), *ints, check_off, check, fill, programs, 0,
                    *(repeat or (None, None, None)))


def crafted_plan_file(path, plans, files, items):
    """A plan file of exactly these plans, files ``[(path, expected size)]`` and items."""
    from dali_mesh.plan import PlanFile, PlanSet

    plan_set = PlanSet(np.dtype(np.float32), 1, plans=list(plans), files=[PlanFile(p, s) for p, s in files])
    plan_set.items = items
    with open(path, "wb") as f:
        f.write(plan_set.to_bytes())
    return str(path)


def run_plan_file(plan_path, dtype=None):
    """The outputs of ``fn.dali_mesh.read_windows`` on the plan file for sample id 0 (one batch)."""
    from nvidia.dali import fn, pipeline_def, types

    from dali_mesh.fn import load_plugin

    ops = load_plugin()

    @pipeline_def(batch_size=1, num_threads=1, device_id=None)
    def pipe():
        ids = fn.external_source(source=lambda: [np.array(0, np.int64)], batch=True, dtype=types.INT64)
        return ops.read_windows(ids, plan_file=plan_path, dtype=types.FLOAT if dtype is None else dtype)

    p = pipe()
    p.build()
    return p.run()


def run_python_bounded(script: str, *args: str, env: dict | None = None, timeout: float = 90) -> tuple[str, str]:
    """:func:`run_python` for scripts that must end by themselves: in a session of their own, killed
    with everything they started when ``timeout`` passes (the calling test then fails, saying so).
    Returns ``(stdout, stderr)``."""
    import signal

    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, full_env.get("PYTHONPATH", "")) if p)
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), *args], env=full_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the process did not end within {timeout:g} s: {out[-1000:]} {err[-2000:]}")


#: what a process that crashed, or touched the interpreter as it was torn down, writes ("panicked": pyo3's,
#: a call of a Rust library after the interpreter was finalized)
CRASHES = ("Fatal Python error", "FATAL", "Segmentation fault", "terminate called", "core dumped", "Traceback",
           "panicked", "not initialized")


def run_python_uncrashed(script: str, *args: str, timeout: float = 120,
                         crashes: tuple = ()) -> tuple[subprocess.CompletedProcess, str]:
    """:func:`run_python` of a script that must end by itself (else the calling test fails, saying so)
    and that writes none of :data:`CRASHES` (nor ``crashes``) and dies of no signal. Returns the
    finished process and its output (stdout, then stderr)."""
    try:
        done = run_python(script, *args, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the process ({' '.join(args)}) did not end within {timeout:g} s: {e.stdout!r} "
                    f"{(e.stderr or '')[-2000:]!r}")
    out = done.stdout + done.stderr
    for crash in CRASHES + tuple(crashes):
        assert crash not in out, out[-3000:]
    assert done.returncode >= 0, f"the process ({' '.join(args)}) died of signal {-done.returncode}: {out[-3000:]}"
    return done, out


def need_kernel_codec(codec_id: int, library: str) -> None:
    """Skip unless the kernels library is built and decodes codec ``codec_id`` (``library``: its
    name, for the message)."""
    from dali_mesh import _kernels

    try:
        available = _kernels.codec_available(codec_id)
    except _kernels.KernelsError as e:
        pytest.skip(f"the kernels library is not built: {e}")
    if not available:
        pytest.skip(f"this build of the reader has no {library}")


class CodecRow(NamedTuple):
    """One row of the codec table (csrc/codecs/codec_table.inc)."""

    id: int
    symbol: str
    name: str
    kind: str  # "Decompressor", "Checksum" or "KeepsSize"
    library: str
    cmake_libs: tuple[str, ...]
    source: str  # csrc/codecs/<source>.cc


#: a row of the codec table, as CMakeLists.txt reads it (the same regular expression)
CODEC_ROW = re.compile(r'^DM_CODEC\(([0-9]+), ([A-Za-z0-9]+), "([a-z0-9_]+)", (Decompressor|Checksum|KeepsSize), '
                       r'"([^"]*)", "([A-Z0-9 ]*)", ([a-z0-9_]+)\)$')


def codec_rows() -> tuple[CodecRow, ...]:
    """The rows of the codec table, read from its source as CMake reads them (no library needed:
    the sanitizer harnesses and the table's round trip through the kernels library use it)."""
    rows = []
    with open(os.path.join(ROOT, "csrc", "codecs", "codec_table.inc")) as f:
        for line in f:
            if not line.startswith("DM_CODEC("):
                continue
            m = CODEC_ROW.match(line.rstrip("\n"))
            assert m, f"csrc/codecs/codec_table.inc: a row CMake cannot read: {line!r}"
            rows.append(CodecRow(int(m[1]), m[2], m[3], m[4], m[5], tuple(m[6].split()), m[7]))
    return tuple(rows)


def codec_sources() -> tuple[str, ...]:
    """The codecs' C++ sources, as CMakeLists.txt lists them: the table, the shared decode steps,
    then each codec's decoder file once."""
    files = ["csrc/codecs/codec_table.cc", "csrc/codecs/codecs.cc"]
    for row in codec_rows():
        path = f"csrc/codecs/{row.source}.cc"
        if path not in files:
            files.append(path)
    return tuple(files)


def ahead_alive_settled(quiet: float = 0.5, timeout: float = 10.0) -> int:
    """The batches read ahead alive in this process (one native core: the plugin's and every PlanReader's)
    once garbage is collected and the count holds still for ``quiet`` seconds: what another test's pipeline,
    still held, keeps. A test of its own batches being freed waits for the count to come back to it
    (:func:`ahead_alive_back_to`), not to 0."""
    import gc
    import time

    from dali_mesh import _kernels

    gc.collect()
    deadline = time.monotonic() + timeout
    last, since = _kernels.ahead_alive(), time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - since < quiet:
        time.sleep(0.05)
        now = _kernels.ahead_alive()
        if now != last:
            last, since = now, time.monotonic()
    return last


def ahead_alive_back_to(baseline: int, timeout: float = 20.0) -> int:
    """The batches read ahead alive once they are no more than ``baseline`` (:func:`ahead_alive_settled`
    before the test's own), or after ``timeout`` seconds."""
    import time

    from dali_mesh import _kernels

    deadline = time.monotonic() + timeout
    while _kernels.ahead_alive() > baseline and time.monotonic() < deadline:
        time.sleep(0.05)
    return _kernels.ahead_alive()
