"""The native reader over an Icechunk snapshot (csrc/storage/callback_store.cc, whose reads Python answers
through the icechunk library: dali_mesh/storage/icechunk/callbacks.py, bound when a store is made). A
repository written here by the
``icechunk`` library with zarr-python (whole-field Blosc lz4 + shuffle chunks large enough to be read in
parts, Zstd chunks, a sharded array): every window of every rank (several splits, halos, boundary rules)
read by the native reader, through the kernels library (ctypes) and through DALI's CPU pipeline, equal to
zarr-python reading the same snapshot; the bytes the store is asked for below the stored bytes of whole-field
Blosc chunks (read in parts) and equal to them for Zstd; a snapshot pinned while a commit lands; a missing
key, a failing read and an unbound store named; reads from many threads; processes that exit right after an
epoch, after an error and with reads in flight end cleanly. Every test that may wait on the GIL or on a
reader thread has a hard timeout."""
from __future__ import annotations

import ctypes
import re
import textwrap
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

icechunk = pytest.importorskip("icechunk")
zarr = pytest.importorskip("zarr")

from dali_mesh import Layout, ZarrSource, _kernels  # noqa: E402
from dali_mesh.partition import take_window  # noqa: E402
from dali_mesh.pipeline import native  # noqa: E402
from dali_mesh.storage import store_of  # noqa: E402
from dali_mesh.storage.icechunk import IcechunkStore, bind_native_reads, unbind_native_reads  # noqa: E402
from tests.helpers import SEED, mesh_of, run_python_uncrashed  # noqa: E402
from tests.storage.s3_server import s3_endpoint  # noqa: E402, F401 - a fixture

icechunk.set_logs_filter("error")
STEPS = 3
#: name -> (shape, chunks, shards): "blosc" one whole field per chunk (~960 KiB stored in 16 blocks: read in
#: parts, fetch_plan.h kMinPartsBytes is 256 KiB), "zstd" chunks no split's boundary follows, "sharded" Zstd
#: chunks inside shards
ARRAYS = {"blosc": ((STEPS, 256, 1024), (1, 256, 1024), None),
          "zstd": ((STEPS, 50, 60), (1, 16, 24), None),
          "sharded": ((STEPS, 48, 64), (1, 8, 16), (1, 24, 32))}


def _compressors(name: str):
    if name == "blosc":
        # 16 blocks of 64 KiB a chunk (Blosc's own choice here is 512 KiB blocks: two, little to read in parts);
        # c-blosc scales a block size it is given by the type size (4)
        return zarr.codecs.BloscCodec(cname="lz4", clevel=5, shuffle="shuffle", typesize=4, blocksize=16 << 10)
    return zarr.codecs.ZstdCodec(level=3)


def _write(repo, values: dict, message: str) -> str:
    """Writes ``values`` (name -> array) into the branch ``main`` with zarr-python and commits; the snapshot
    id. Blosc compresses on one thread: its blocks are then stored in order (several threads store them in
    the order they finish, and a band's blocks may lie apart in the chunk: read in parts all the same, but
    the bytes between them less than 64 KiB apart are read too: fetch_plan.h kLocalGap)."""
    import numcodecs.blosc

    threads = numcodecs.blosc.get_nthreads()
    numcodecs.blosc.set_nthreads(1)
    try:
        return _write_values(repo, values, message)
    finally:
        numcodecs.blosc.set_nthreads(threads)


def _write_values(repo, values: dict, message: str) -> str:
    session = repo.writable_session("main")
    group = zarr.open_group(session.store, mode="a")
    for name, x in values.items():
        shape, chunks, shards = ARRAYS[name]
        if name in group:
            group[name][...] = x
        else:
            group.create_array(name, shape=shape, chunks=chunks, shards=shards, dtype=x.dtype,
                               compressors=_compressors(name), dimension_names=("time", "lat", "lon"))[...] = x
    return session.commit(message)


def _values(seed: int, names=tuple(ARRAYS)) -> dict:
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(ARRAYS[name][0]).astype("<f4") for name in names}


def _oracle(repo, snapshot: str, name: str) -> np.ndarray:
    """The array as zarr-python reads it from the library's own store of the snapshot."""
    return zarr.open_array(repo.readonly_session(snapshot_id=snapshot).store, path=name, mode="r")[...]


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    """``(path, repo, snapshot, {name: values as zarr-python reads them})``."""
    path = str(tmp_path_factory.mktemp("ice") / "repo")
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(path))
    snapshot = _write(repo, _values(SEED), "first")
    return path, repo, snapshot, {name: _oracle(repo, snapshot, name) for name in ARRAYS}


def _source(location, name, mesh_shape, coordinate, shard, halo=None, boundary="constant", **kw):
    layout = Layout(mesh_of(mesh_shape, coordinate), shard=shard, halo=halo or {}, boundary=boundary)
    return ZarrSource([location], name, layout, batch_size=1, shuffle=False, **kw)


def _store(src) -> IcechunkStore:
    (store,) = src.stores()
    assert isinstance(store, IcechunkStore)
    return store


def _plan_reader(src, tmp_path, **kw):
    """The kernels library's reader (no DALI) of ``src``'s plan (the source's store answers its reads: the
    latest store made of its spec)."""
    plans = native.plan_windows(src)
    path = plans[0].write(str(tmp_path))
    return _kernels.PlanReader(path, plans[0].dtype, **{"read_ahead": 0, **kw})


def _check_native(src, oracle, tmp_path, what):
    before = dict(_store(src).native_reads)
    with _plan_reader(src, tmp_path) as reader:
        for t in range(STEPS):
            np.testing.assert_array_equal(reader.read([t])[0][0], take_window(oracle[t], src.region),
                                          err_msg=f"{what}, step {t}, seed {SEED}")
    assert _store(src).native_reads["calls"] > before["calls"], "the native reader read nothing through the store"


# ---- windows --------------------------------------------------------------------------------------------------
SPLITS = {"lat 4, halo 3": dict(mesh_shape=(1, 4), shard={"m0": 0}, halo={0: 3}, boundary="constant"),
          "lat 2 x lon 2, halo": dict(mesh_shape=(1, 2, 2), shard={"m0": 0, "m1": 1}, halo={0: 2, 1: (1, 3)},
                                      boundary={0: "reflect", 1: "periodic"})}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", list(ARRAYS))
@pytest.mark.parametrize("split", list(SPLITS))
def test_every_window_of_every_rank_read_natively_equals_zarr_python(repository, tmp_path, name, split):
    path, _, _, oracle = repository
    cfg = SPLITS[split]
    ranks = int(np.prod(cfg["mesh_shape"]))
    for rank in range(ranks):
        coordinate = (0,) + tuple(int(c) for c in np.unravel_index(rank, cfg["mesh_shape"][1:]))
        src = _source(f"icechunk://{path}", name, cfg["mesh_shape"], coordinate, cfg["shard"], cfg["halo"],
                      cfg["boundary"])
        _check_native(src, oracle[name], tmp_path / f"r{rank}", f"{name}, {split}, rank {rank}")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", ["blosc", "sharded"])
def test_a_dali_cpu_pipeline_reads_every_rank_natively(repository, name):
    """``fn.read_windows`` without a fallback (the plugin reads through the source's store, bound when it
    was made), read ahead on (the default for a store that is not local files)."""
    pytest.importorskip("nvidia.dali")
    from nvidia.dali import pipeline_def

    from dali_mesh.fn import read_windows

    path, _, _, oracle = repository
    for rank in range(2):
        src = _source(f"icechunk://{path}", name, (1, 2), (0, rank), {"m0": 0}, {0: 2}, "symmetric")

        @pipeline_def(batch_size=1, num_threads=2, device_id=None)
        def pipe():
            return read_windows(src, fallback=False)

        p = pipe()
        p.build()
        got = {}
        for _ in range(STEPS):
            w, ids, _ = p.run()
            got[int(np.array(ids[0]))] = np.array(w[0])
        del p
        assert sorted(got) == list(range(STEPS))
        for t, w in got.items():
            np.testing.assert_array_equal(w, take_window(oracle[name][t], src.region),
                                          err_msg=f"{name}, rank {rank}, step {t}, seed {SEED}")
        assert _store(src).native_reads["calls"] > 0


@pytest.mark.timeout(300)
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_differential_fuzz_of_windows_against_zarr_python(repository, tmp_path_factory, data):
    path, _, _, oracle = repository
    name = data.draw(st.sampled_from(list(ARRAYS)), label="array")
    lat, lon = data.draw(st.integers(1, 5), label="lat ranks"), data.draw(st.integers(1, 3), label="lon ranks")
    coordinate = (0, data.draw(st.integers(0, lat - 1), label="lat rank"),
                  data.draw(st.integers(0, lon - 1), label="lon rank"))
    halo = {0: data.draw(st.integers(0, 4), label="lat halo"), 1: data.draw(st.integers(0, 4), label="lon halo")}
    boundary = {a: data.draw(st.sampled_from(["constant", "periodic", "reflect", "symmetric", "edge", "trim"]),
                             label=f"boundary {a}") for a in (0, 1)}
    split = data.draw(st.sampled_from(["chunk", "even", "physicsnemo"]), label="split")
    layout = Layout(mesh_of((1, lat, lon), coordinate), shard={"m0": 0, "m1": 1}, halo=halo, boundary=boundary,
                    split=split)
    src = ZarrSource([f"icechunk://{path}"], name, layout, batch_size=1, shuffle=False)
    _check_native(src, oracle[name], tmp_path_factory.mktemp("fuzz"), f"{name} {layout}")


# ---- bytes asked -------------------------------------------------------------------------------------------------
def _chunk_bytes(store, name, rows) -> int:
    """The stored bytes of the chunks of every step that rows ``[lo, hi)`` of ``name`` touch (whole width)."""
    shape, chunks, _ = ARRAYS[name]
    lo, hi = rows
    total = 0
    for t in range(STEPS):
        for i in range(lo // chunks[1], (hi - 1) // chunks[1] + 1):
            for j in range(-(-shape[2] // chunks[2])):
                total += store.stat(f"{name}/c/{t}/{i}/{j}").size
    return total


@pytest.mark.timeout(120)
def test_a_band_of_whole_field_blosc_chunks_is_read_in_parts_and_zstd_chunks_whole(repository, tmp_path):
    path, _, _, oracle = repository
    asked = {}
    for name in ("blosc", "zstd"):
        src = _source(f"icechunk://{path}", name, (1, 4), (0, 1), {"m0": 0})
        store = _store(src)
        before = store.native_reads["bytes"]
        _check_native(src, oracle[name], tmp_path / name, f"{name}, rank 1 of 4")
        rows = (src.region.window_start[0], src.region.window_stop[0])
        asked[name] = (store.native_reads["bytes"] - before, _chunk_bytes(store, name, rows))
    got, stored = asked["blosc"]
    # rank 1 of 4 needs 4 of each field's 16 blocks, and the header and index (the bound: 0.35x)
    assert got < 0.35 * stored, asked
    got, stored = asked["zstd"]
    assert got == stored, asked


# ---- versions ----------------------------------------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_a_snapshot_stays_pinned_while_a_commit_lands(tmp_path):
    path = str(tmp_path / "repo")
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(path))
    first = _write(repo, _values(SEED, ("zstd",)), "first")
    src = _source(f"icechunk://{path}", "zstd", (1, 2), (0, 1), {"m0": 0}, {0: 1})
    assert _store(src).snapshot == first
    with _plan_reader(src, tmp_path / "plan") as reader:
        reader.read([0])
        second = _write(repo, _values(SEED + 1, ("zstd",)), "second")  # a commit to the branch read
        for t in range(STEPS):
            np.testing.assert_array_equal(reader.read([t])[0][0], take_window(_oracle(repo, first, "zstd")[t],
                                                                               src.region), err_msg=f"step {t}")
    later = _source(f"icechunk://{path}", "zstd", (1, 2), (0, 1), {"m0": 0}, {0: 1})
    assert _store(later).snapshot == second
    _check_native(later, _oracle(repo, second, "zstd"), tmp_path / "later", "the new snapshot")


# ---- errors --------------------------------------------------------------------------------------------------------
def _c_call(entry, spec, *args):
    """``entry`` of the store C API with ``args``: its result, and the message."""
    from dali_mesh.storage.remote import store_api

    err = ctypes.create_string_buffer(4096)
    got = getattr(store_api(), entry)(spec.encode(), *args, err, 4096)
    return got, err.value.decode()


@pytest.mark.timeout(60)
def test_a_key_missing_from_the_snapshot_is_named(repository):
    path, _, snapshot, _ = repository
    store, _ = store_of(f"icechunk://{path}")
    size, tag = ctypes.c_int64(), ctypes.create_string_buffer(1024)
    found, _ = _c_call("dali_mesh_store_head", store.spec, b"zstd/c/0/0/0", ctypes.byref(size), tag, 1024)
    assert found == 1 and size.value == store.stat("zstd/c/0/0/0").size and tag.value.decode() == store.tag
    found, _ = _c_call("dali_mesh_store_head", store.spec, b"zstd/c/9/9/9", ctypes.byref(size), tag, 1024)
    assert found == 0
    buf = ctypes.create_string_buffer(16)
    got, message = _c_call("dali_mesh_store_get", store.spec, b"zstd/c/9/9/9", 0, 16, b"", -1, buf)
    assert got == -1
    assert f"icechunk://{path}@{snapshot}/zstd/c/9/9/9: no such key in snapshot {snapshot}" in message
    got, _ = _c_call("dali_mesh_store_get", store.spec, b"zstd/c/0/0/0", 0, 16, b"", -1, buf)
    assert got == 16 and buf.raw == store.read("zstd/c/0/0/0", 0, 16)


@pytest.mark.timeout(60)
def test_a_failing_read_is_named_and_the_reader_goes_on(repository, tmp_path, monkeypatch):
    path, _, snapshot, oracle = repository
    src = _source(f"icechunk://{path}", "zstd", (1, 2), (0, 0), {"m0": 0})
    store = _store(src)
    with _plan_reader(src, tmp_path) as reader:
        def failing(key, ranges):
            raise RuntimeError(f"the server said no to {len(ranges)} ranges")

        monkeypatch.setattr(store, "read_ranges", failing)
        with pytest.raises(_kernels.KernelsError, match=rf"icechunk://{path}@{snapshot}/zstd/c/1/\d/\d: cannot be read "
                                                        r"\(RuntimeError: the server said no to \d+ ranges\)"):
            reader.read([1])
        monkeypatch.undo()
        np.testing.assert_array_equal(reader.read([1])[0][0], take_window(oracle["zstd"][1], src.region))


@pytest.mark.timeout(60)
def test_an_unbound_store_is_named_and_reads_once_given_again(repository, tmp_path):
    path, _, snapshot, oracle = repository
    src = _source(f"icechunk://{path}", "zstd", (1, 2), (0, 1), {"m0": 0})
    with _plan_reader(src, tmp_path) as reader:
        unbind_native_reads(_store(src))
        with pytest.raises(_kernels.KernelsError, match=rf"icechunk://{path}@{snapshot}/zstd/c/0/\d/\d: nothing in "
                                                        r"this process answers the reads of this store .* build the "
                                                        r"source .* in this process"):
            reader.read([0])
        bind_native_reads(_store(src))
        np.testing.assert_array_equal(reader.read([0])[0][0], take_window(oracle["zstd"][0], src.region))


# ---- threads and processes ----------------------------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_reads_from_many_threads_at_once(repository, tmp_path):
    """The store's ranged reads from 8 Python threads at once (zarr's event loop serves them all), and two
    readers of the kernels library each on 3 of its threads in two Python threads (ctypes releases the GIL;
    every reader thread's call back takes it): all equal to whole reads."""
    path, _, _, oracle = repository
    store, _ = store_of(f"icechunk://{path}")
    keys = [f"zstd/c/{t}/{i}/{j}" for t in range(STEPS) for i in range(4) for j in range(3)]
    whole = {k: store.read(k, 0, store.stat(k).size) for k in keys}
    failures = []

    def ranged(offset):
        try:
            for k in keys[offset::2] * 2:
                n = len(whole[k])
                parts = store.read_ranges(k, [(0, n // 3), (n // 3, n - n // 3)])
                assert b"".join(p.tobytes() for p in parts) == whole[k], k
        except BaseException as e:  # noqa: BLE001 - reported below
            failures.append(e)

    threads = [threading.Thread(target=ranged, args=(i % 2,)) for i in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not any(th.is_alive() for th in threads) and not failures, failures

    def natively(rank):
        try:
            src = _source(f"icechunk://{path}", "blosc", (1, 2), (0, rank), {"m0": 0}, {0: 1})
            with _plan_reader(src, tmp_path / f"r{rank}") as reader:
                for _ in range(2):
                    got = reader.read(list(range(STEPS)), threads=3)[0]
                    for t in range(STEPS):
                        np.testing.assert_array_equal(got[t], take_window(oracle["blosc"][t], src.region))
        except BaseException as e:  # noqa: BLE001
            failures.append(e)

    threads = [threading.Thread(target=natively, args=(rank,)) for rank in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(90)
    assert not any(th.is_alive() for th in threads) and not failures, failures


#: a process that writes a repository of 16 steps and reads it natively, then ends as ``how`` says: after a
#: whole epoch, after a read failed, after deleting its pipeline or with reads in flight (DALI's prefetch of
#: the next iterations, the kernels library's reads ahead). Each read waits 0.3 s in the store, and the
#: process waits until reads are in flight before it ends (it says how many).
_CHILD = textwrap.dedent("""
    import atexit, sys, threading, time
    from dali_mesh import Layout, ZarrSource, _kernels
    from dali_mesh.pipeline import native
    from dali_mesh.storage.icechunk import IcechunkStore
    from tests.helpers import mesh_of

    how, folder = sys.argv[1:3]
    import icechunk, numpy as np, zarr
    icechunk.set_logs_filter("error")
    path = folder + "/repo"
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(path))
    session = repo.writable_session("main")
    x = np.arange(16 * 48 * 64, dtype="f4").reshape(16, 48, 64)
    zarr.open_group(session.store, mode="w").create_array("zstd", shape=x.shape, chunks=(1, 16, 24),
                                                          dtype="f4")[...] = x
    session.commit("16 steps")
    read_ranges = IcechunkStore.read_ranges
    calls, in_flight, lock = [0], [0], threading.Lock()

    def slow(self, key, ranges):
        with lock:
            calls[0] += 1
            in_flight[0] += 1
            n = calls[0]
        try:
            time.sleep(0.3)
            if how == "error" and n > 2:
                raise RuntimeError("the test's failure")
            return read_ranges(self, key, ranges)
        finally:
            with lock:
                in_flight[0] -= 1

    def reads_in_flight():
        deadline = time.monotonic() + 10
        while not in_flight[0] and time.monotonic() < deadline:
            time.sleep(0.01)
        print("reads in flight:", in_flight[0], flush=True)

    IcechunkStore.read_ranges = slow
    # registered first, so run last of the exit hooks: after the store's unbinding, which waits for them
    atexit.register(lambda: print("reads in flight at the last exit hook:", in_flight[0], flush=True))
    layout = Layout(mesh_of((1, 2), (0, 1)), shard={"m0": 0}, halo={0: 1})
    src = ZarrSource([f"icechunk://{path}"], "zstd", layout, batch_size=1, shuffle=False)
    if how == "plan reader":
        plans = native.plan_windows(src)
        reader = _kernels.PlanReader(plans[0].write(folder + "/plan"), "f4", read_ahead=2)
        reader.read([0])
        assert reader.read_ahead([1]) and reader.read_ahead([2])
        reads_in_flight()
        print("done", flush=True)
        sys.exit(0)
    from nvidia.dali import pipeline_def
    from dali_mesh.fn import read_windows

    @pipeline_def(batch_size=1, num_threads=2, device_id=None, prefetch_queue_depth=2)
    def pipe():
        return read_windows(src, fallback=False, read_ahead=True)

    p = pipe()
    p.build()
    try:
        for _ in range(16 if how in ("epoch", "error") else 1):
            p.run()
    except Exception as e:
        print("the epoch failed:", " ".join(str(e).split())[:2000], flush=True)
        sys.exit(3)
    if how != "epoch":
        reads_in_flight()
    if how == "del":
        del p  # DALI's shutdown while its prefetched iterations read
        print("pipeline deleted", flush=True)
    print("done", flush=True)
""")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["epoch", "error", "mid-epoch", "del", "plan reader"])
def test_a_process_ends_cleanly_with_reads_in_flight(tmp_path, how):
    if how != "plan reader":
        pytest.importorskip("nvidia.dali")
    done, out = run_python_uncrashed(_CHILD, how, str(tmp_path))
    if how == "error":
        assert done.returncode == 3, out[-3000:]
        assert re.search(r"icechunk://\S+/zstd/c/\d/\d/\d: cannot be read \(RuntimeError: the test's failure\)",
                         out), out
        return
    assert done.returncode == 0 and "done" in done.stdout.splitlines(), out[-3000:]
    if how != "epoch":  # the hazard was there: reads in flight when the process ended (or deleted its pipeline)
        assert int(re.search(r"reads in flight: (\d+)", out)[1]) > 0, out[-3000:]
    assert "reads in flight at the last exit hook: 0" in out, out[-3000:]


# ---- a repository in S3, virtual chunks ------------------------------------------------------------------------
@pytest.mark.timeout(180)
def test_a_repository_in_s3_is_read_natively_in_parts(s3_endpoint, tmp_path):
    from tests.storage.s3_server import REGION, icechunk_storage, options

    opts = options(s3_endpoint, region=REGION)
    repo = icechunk.Repository.create(icechunk_storage(s3_endpoint, "native", "ice/repo"))
    snapshot = _write(repo, _values(SEED, ("blosc", "zstd")), "first")
    for name in ("blosc", "zstd"):
        src = _source("icechunk://s3://native/ice/repo", name, (1, 4), (0, 1), {"m0": 0},
                      storage_options={**opts, "snapshot": snapshot})
        store = _store(src)
        _check_native(src, _oracle(repo, snapshot, name), tmp_path / name, f"s3, {name}")
        rows = (src.region.window_start[0], src.region.window_stop[0])
        if name == "blosc":
            assert store.native_reads["bytes"] < 0.35 * _chunk_bytes(store, name, rows), store.native_reads


@pytest.mark.timeout(180)
@pytest.mark.filterwarnings("ignore::UserWarning")  # zarr-python: numcodecs.shuffle / zlib are not in the v3 spec
def test_virtual_chunks_into_netcdf_files_are_read_natively(tmp_path):
    """VirtualiZarr's references into NetCDF4 files (gzip + shuffle chunks) written into a repository: the
    library reads the files' ranges, the native reader decodes them (numcodecs.shuffle, numcodecs.zlib)."""
    from tests.storage.test_icechunk import _virtual_repository

    path, prefix, oracle = _virtual_repository(tmp_path)
    for rank in range(2):
        src = _source(f"icechunk://{path}", "t2m", (1, 2), (0, rank), {"m0": 0}, {0: 1}, "reflect",
                      storage_options={"authorize_virtual": [prefix]})
        with _plan_reader(src, tmp_path / f"r{rank}") as reader:
            for t in range(len(oracle)):
                np.testing.assert_array_equal(reader.read([t])[0][0], take_window(oracle[t], src.region),
                                              err_msg=f"virtual, rank {rank}, step {t}")
        assert _store(src).native_reads["calls"] > 0


def test_a_virtual_chunk_that_cannot_be_read_is_named_with_the_librarys_cause(tmp_path):
    """A virtual chunk whose container is not authorised, and one whose file was cut short: the native
    reader's error says what the library says (it once said "a bytes-like object is required, not
    'NoneType'", and asked whether the snapshot was garbage-collected), as the Python readers' does."""
    from dali_mesh.storage import DataFileError
    from tests.storage.test_icechunk import _virtual_repository

    path, prefix, _ = _virtual_repository(tmp_path)
    cases = [({}, r"a virtual chunk in this repository resolves to the url prefix .*authorize the virtual chunk "
                  r"container.*give storage_options authorize_virtual="),
             # cut short: past its end, or (its modification time recorded by VirtualiZarr) a changed checksum
             ({"authorize_virtual": [prefix]}, r"(error (retrieving virtual chunk, not enough data|fetching virtual "
                                               r"reference)|the checksum of the object owning the virtual chunk has "
                                               r"changed).*a virtual chunk: "
                                               r"its file changed, moved or was cut short")]
    for k, (opts, cause) in enumerate(cases):
        src = _source(f"icechunk://{path}", "t2m", (1, 2), (0, 0), {"m0": 0}, storage_options=opts)
        with _plan_reader(src, tmp_path / f"r{k}") as reader:
            if k == 1:
                nc = tmp_path / "t2m_1.nc"  # steps 2 and 3: cut to its first kilobyte
                nc.write_bytes(nc.read_bytes()[:1024])
            with pytest.raises(_kernels.KernelsError, match=rf"@\w{{20}}/t2m/c/3/\d/\d: cannot be read \({cause}"):
                reader.read([3])
        with pytest.raises(DataFileError, match=rf"@\w{{20}}/t2m/c/3/\d/\d: cannot be read \({cause}"):
            src.read_sample(3)
