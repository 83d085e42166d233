"""Icechunk repositories whose storage stops answering, and the names of repositories (issue 52): every call of
the icechunk library is bounded by the source's ``timeout`` (making a source over a server that accepts
connections and never answers, a read whose requests are never answered, natively and in Python), an s3://
repository's ``stall`` is the library's own bound of a silent answer, ``retries`` is refused saying why, a
process (DALI's pipeline, the kernels library's reader) with reads stuck in the library exits at once, an
s3:// repository's location with user info is refused without showing it or sending a request, errors name the
library's cause, a folder named like a pinned snapshot is that folder, and a folder with ``;`` is read.

Every server is on 127.0.0.1 (moto behind the tests' fault proxy, or a socket that never answers); every test
that may wait on the library has a hard timeout."""
from __future__ import annotations

import os
import re
import socket
import textwrap
import threading
import time

import numpy as np
import pytest

icechunk = pytest.importorskip("icechunk")
zarr = pytest.importorskip("zarr")

from dali_mesh import Layout, ZarrSource, _kernels  # noqa: E402
from dali_mesh.partition import take_window  # noqa: E402
from dali_mesh.pipeline import native  # noqa: E402
from dali_mesh.storage import DataFileError, store_of  # noqa: E402
from tests.helpers import mesh_of, run_python_uncrashed  # noqa: E402
from tests.storage.fault_proxy import proxy  # noqa: E402, F401 - a fixture
from tests.storage.s3_server import REGION, icechunk_storage, options, s3_endpoint  # noqa: E402, F401 - a fixture

icechunk.set_logs_filter("error")
SHAPE, CHUNKS = (6, 40, 48), (1, 20, 24)
LAYOUT = Layout(mesh_of((1, 2), (0, 1)), shard={"m0": 0}, halo={0: 1})


class Silent:
    """A server on 127.0.0.1 that accepts every connection and never answers (it counts them)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.endpoint = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.connections: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.connections:
            conn.close()


@pytest.fixture
def silent():
    server = Silent()
    try:
        yield server
    finally:
        server.close()


def _write(repo, seed: int = 0) -> tuple[str, np.ndarray]:
    """A Zstd array ``t`` committed to ``main``: the snapshot and the values."""
    x = np.random.default_rng(seed).standard_normal(SHAPE).astype("<f4")
    session = repo.writable_session("main")
    zarr.open_group(session.store, mode="w").create_array("t", shape=SHAPE, chunks=CHUNKS, dtype="<f4")[...] = x
    return session.commit("t"), x


@pytest.fixture
def in_s3(s3_endpoint, proxy, request):  # noqa: F811 - fixtures
    """A repository in moto, read through the fault proxy: ``(location, storage_options, values)``."""
    prefix = f"timeouts/{request.node.name}"
    repo = icechunk.Repository.create(icechunk_storage(s3_endpoint, "data", prefix))
    _, x = _write(repo)
    return f"icechunk://s3://data/{prefix}", options(proxy.endpoint, region=REGION), x


def _source(location, **storage_options):
    return ZarrSource([location], "t", LAYOUT, batch_size=1, shuffle=False, storage_options=storage_options)


# ---- a server that never answers ---------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_making_a_source_over_a_server_that_never_answers_fails_within_its_timeout(silent):
    t0 = time.monotonic()
    with pytest.raises(DataFileError, match=r"^icechunk://s3://data/repo: opening the repository did not finish "
                                            r"within 2 s \(storage_options timeout=2\): the repository's storage did "
                                            r"not answer in time") as caught:
        _source("icechunk://s3://data/repo", **options(silent.endpoint, region=REGION, timeout=2))
    assert time.monotonic() - t0 < 12
    assert isinstance(caught.value, TimeoutError) and type(caught.value).__name__ == "IcechunkTimeoutError"
    assert silent.connections, "the library never reached the server"


@pytest.mark.timeout(60)
def test_without_a_timeout_the_default_bounds_the_source_too(silent, monkeypatch):
    monkeypatch.setattr("dali_mesh.storage.icechunk.deadline.DEFAULT_TIMEOUT_S", 2.0)
    t0 = time.monotonic()
    with pytest.raises(DataFileError, match=r"opening the repository did not finish within 2 s"):
        _source("icechunk://s3://data/repo", **options(silent.endpoint, region=REGION))
    assert time.monotonic() - t0 < 12


@pytest.mark.timeout(90)
def test_a_read_whose_requests_are_never_answered_fails_within_its_timeout(in_s3, proxy, tmp_path):  # noqa: F811
    location, opts, x = in_s3
    src = _source(location, **opts, timeout=3)
    np.testing.assert_array_equal(src.read_sample(0)[0], take_window(x[0], src.region))
    plans = native.plan_windows(src)
    reader = _kernels.PlanReader(plans[0].write(str(tmp_path)), plans[0].dtype, read_ahead=0)
    np.testing.assert_array_equal(reader.read([1])[0][0], take_window(x[1], src.region))
    proxy.add("hang", method=None, times=10**6)
    cause = (r"icechunk://s3://data/\S+@[0-9A-Z]{20}/t/c/\d/\d/\d: a read( of \d ranges?)? did not finish within 3 s "
             r"\(storage_options timeout=3\)")
    for read in (lambda: src.read_sample(2), lambda: reader.read([3])):
        t0 = time.monotonic()
        with pytest.raises(Exception, match=cause):
            read()
        assert time.monotonic() - t0 < 15
    reader.close()


@pytest.mark.timeout(90)
def test_stall_drops_an_answer_that_stops_sending_and_the_read_goes_on(in_s3, proxy):  # noqa: F811
    location, opts, x = in_s3
    src = _source(location, **opts, stall=1, timeout=20)
    proxy.add("stall", key="/chunks/", seconds=60, after=8)
    t0 = time.monotonic()
    np.testing.assert_array_equal(src.read_sample(4)[0], take_window(x[4], src.region))
    assert time.monotonic() - t0 < 15, "the stalled answer was not dropped after stall=1"
    assert [r for r in proxy.requests if r[3] == "stall"], "the answer never stalled"


def test_retries_is_refused_saying_why_and_what_bounds_a_call(in_s3):
    location, opts, _ = in_s3
    with pytest.raises(ValueError, match=r"storage_options retries is not taken for an Icechunk repository: the "
                                          r"icechunk library retries each request .* timeout="):
        _source(location, **opts, retries=2)
    with pytest.raises(ValueError, match=r"stall bounds the silence of an object store's answer"):
        store_of(location.replace("s3://data", "/nowhere"), {"stall": 1})
    for bad in (0, -1, "2", True):
        with pytest.raises(ValueError, match=r"storage_options timeout must be a number of seconds > 0"):
            _source(location, **opts, timeout=bad)


# ---- the exit ----------------------------------------------------------------------------------------------
#: a process that reads a repository in moto (behind the fault proxy, both in the process) natively, through
#: DALI's pipeline or the kernels library's reader, makes every later request hang (reads stuck in the library:
#: no timeout given, so the default 300 s would hold them), waits until reads are in flight and ends
_CHILD = textwrap.dedent("""
    import sys, time
    from tests.storage.s3_server import start_server, icechunk_storage, options, REGION
    from tests.storage.fault_proxy import FaultProxy
    import icechunk, numpy as np, zarr
    from dali_mesh import Layout, ZarrSource, _kernels
    from dali_mesh.pipeline import native
    from tests.helpers import mesh_of

    how, folder = sys.argv[1:3]
    icechunk.set_logs_filter("error")
    server, endpoint = start_server()
    repo = icechunk.Repository.create(icechunk_storage(endpoint, "data", "exit"))
    session = repo.writable_session("main")
    x = np.arange(16 * 48 * 64, dtype="f4").reshape(16, 48, 64)
    zarr.open_group(session.store, mode="w").create_array("t", shape=x.shape, chunks=(1, 16, 24), dtype="f4")[...] = x
    session.commit("16 steps")
    proxy = FaultProxy(endpoint).start()
    layout = Layout(mesh_of((1, 2), (0, 1)), shard={"m0": 0}, halo={0: 1})
    src = ZarrSource(["icechunk://s3://data/exit"], "t", layout, batch_size=1, shuffle=False,
                     storage_options=options(proxy.endpoint, region=REGION))
    if how == "plan reader":
        plans = native.plan_windows(src)
        reader = _kernels.PlanReader(plans[0].write(folder + "/plan"), "f4", read_ahead=2)
        reader.read([0])
        sent = proxy.count()
        proxy.add("hang", method=None, times=10**6)
        assert reader.read_ahead([1]) and reader.read_ahead([2])
    else:
        from nvidia.dali import pipeline_def
        from dali_mesh.fn import read_windows

        @pipeline_def(batch_size=1, num_threads=2, device_id=None, prefetch_queue_depth=2)
        def pipe():
            return read_windows(src, fallback=False, read_ahead=True)

        p = pipe()
        p.build()
        p.schedule_run()
        p.outputs()
        p.release_outputs()
        sent = proxy.count()
        proxy.add("hang", method=None, times=10**6)
        p.schedule_run()  # its reads never get an answer
    deadline = time.monotonic() + 20
    while proxy.count() == sent and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.5)
    print("requests never answered:", proxy.count() - sent, flush=True)
    print("exiting at", time.time(), flush=True)
""")


@pytest.mark.timeout(200)
@pytest.mark.parametrize("how", ["dali", "plan reader"])
def test_a_process_with_reads_stuck_in_the_library_exits_at_once(tmp_path, how):
    if how == "dali":
        pytest.importorskip("nvidia.dali")
    done, out = run_python_uncrashed(_CHILD, how, str(tmp_path), crashes=("never retrieved", "still in flight"))
    ended = time.time()
    assert done.returncode == 0, out[-3000:]
    assert int(re.search(r"requests never answered: (\d+)", out)[1]) > 0, out[-3000:]
    exited_in = ended - float(re.search(r"exiting at (\S+)", out)[1])
    # the documented bound is 30 s; the calls in flight are cancelled, so it takes far less
    assert exited_in < 15, f"the process ({how}) took {exited_in:.1f} s to exit with reads stuck in the library"


# ---- names ----------------------------------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_user_info_in_an_s3_repositorys_location_is_refused_without_showing_it_or_sending_a_request(in_s3, proxy):  # noqa: F811
    _, opts, _ = in_s3
    proxy.reset_counts()
    for location in ("icechunk://s3://AKIDLEAKED:SECRETLEAKED@data/repo", "icechunk://s3://AKIDLEAKED@data/repo",
                     "icechunk://s3://AKIDLEAKED:SECRET/LEAKED@data/repo"):
        with pytest.raises(DataFileError, match=r"^icechunk://s3://\u2026@data/repo: holds user info") as caught:
            _source(location, **opts)
        assert "LEAKED" not in str(caught.value), str(caught.value)
    assert proxy.count() == 0, proxy.requests


@pytest.mark.timeout(60)
def test_errors_name_the_librarys_cause(s3_endpoint):  # noqa: F811
    with pytest.raises(DataFileError, match=r"^icechunk://s3://nobucket/repo: cannot be opened as an Icechunk "
                                            r"repository \(.*NoSuchBucket: The specified bucket does not exist\)"):
        _source("icechunk://s3://nobucket/repo", **options(s3_endpoint, region=REGION))


def _read_by_its_folder(folder, t):
    """A repository made in ``folder``, read by the name ``icechunk://<folder>``: the source names the
    snapshot it pins, and its sample ``t`` is the values'. Returns ``(snapshot, values, source)``."""
    snapshot, x = _write(icechunk.Repository.create(icechunk.local_filesystem_storage(folder)))
    src = _source(f"icechunk://{folder}")
    assert src.files[0] == f"icechunk://{folder}@{snapshot}"
    np.testing.assert_array_equal(src.read_sample(t)[0], take_window(x[t], src.region))
    return snapshot, x, src


@pytest.mark.timeout(60)
def test_a_folder_named_like_a_pinned_snapshot_is_that_folder(tmp_path):
    folder = str(tmp_path / "era5@ABCDEFGHJKMNPQRSTVWX")
    snapshot, _, src = _read_by_its_folder(folder, 1)
    store, key = store_of(f"{src.files[0]}/t/zarr.json")  # its names pin its snapshot, as any repository's
    assert (store.repository, store.snapshot, key) == (folder, snapshot, "t/zarr.json")


@pytest.mark.timeout(60)
def test_a_name_that_is_both_a_folder_and_a_pinned_snapshot_is_refused_as_ambiguous(tmp_path):
    base = str(tmp_path / "era5")
    snapshot, _ = _write(icechunk.Repository.create(icechunk.local_filesystem_storage(base)))
    os.mkdir(f"{base}@{snapshot}")
    with pytest.raises(DataFileError, match=rf"icechunk://{re.escape(base)}@{snapshot}: is ambiguous: the folder "
                                            rf".* exists, and so does .*; rename the folder .*, or give that snapshot "
                                            rf"as storage_options snapshot="):
        store_of(f"icechunk://{base}@{snapshot}")
    store, _ = store_of(f"icechunk://{base}", {"snapshot": snapshot})
    assert store.snapshot == snapshot


@pytest.mark.timeout(90)
def test_a_folder_with_a_semicolon_is_read_in_python_and_natively(tmp_path):
    _, x, src = _read_by_its_folder(str(tmp_path / "a;b"), 2)
    plans = native.plan_windows(src)
    with _kernels.PlanReader(plans[0].write(str(tmp_path / "plan")), plans[0].dtype, read_ahead=0) as reader:
        for t in range(SHAPE[0]):
            np.testing.assert_array_equal(reader.read([t])[0][0], take_window(x[t], src.region))
