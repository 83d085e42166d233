"""The native reader reads the next batch ahead from an object store (``read_windows(read_ahead=None)``:
on for s3://, gs://, https:// sources), against a real S3 server (moto) behind the tests' counting
proxy: every window of two shuffled epochs equals the oracle's (zarr-python's array, ``take_window``);
each range is fetched once (the same GETs as without reading ahead: a batch read ahead is never
fetched again); no batch of the next epoch is fetched before it is asked for; an object replaced after
the plan fails the batch that reads it, when that batch is read; a batch read ahead then not wanted,
stuck on a server that does not answer, is cancelled at once."""
from __future__ import annotations

import io
import re
import time

import numpy as np
import pytest

from dali_mesh.storage.remote import have_native_http
from tests.helpers import ReadBeside
from tests.storage.fault_proxy import proxy  # noqa: F401
from tests.storage.s3_server import client, options, s3_endpoint, upload  # noqa: F401

pytestmark = [pytest.mark.skipif(not have_native_http(), reason="this build has no libcurl"),
              pytest.mark.timeout(120)]


def _npy_objects(endpoint, prefix, arrays) -> list[str]:
    """The ``s3://`` locations of ``arrays`` uploaded as ``.npy`` objects ``ahead/<prefix><t>.npy``."""
    locations = []
    for t, arr in enumerate(arrays):
        buf = io.BytesIO()
        np.save(buf, arr)
        client(endpoint).put_object(Bucket="data", Key=f"ahead/{prefix}{t}.npy", Body=buf.getvalue())
        locations.append(f"s3://data/ahead/{prefix}{t}.npy")
    return locations


def _dead_and_healthy(s3_endpoint, proxy, tmp_path, dead: str, healthy: str):
    """``(arrays, dead plan, healthy plan)``: the plan files of two 3-sample ``.npy`` sources, one read
    through the proxy (objects ``ahead/<dead>*``, to be hung by the test) with a 60 s stall, one from the
    server directly."""
    from dali_mesh import NumpySource
    from dali_mesh.pipeline import native
    from tests.helpers import one_rank_layout

    a = np.arange(3 * 2 * 8 * 6, dtype="f4").reshape(3, 2, 8, 6)
    dead_src = NumpySource(_npy_objects(s3_endpoint, dead, a), one_rank_layout(), batch_size=1, shuffle=False,
                           storage_options=options(proxy.endpoint, retries=0, retry_seconds=60, stall=60, timeout=60))
    healthy_src = NumpySource(_npy_objects(s3_endpoint, healthy, a), one_rank_layout(), batch_size=1, shuffle=False,
                              storage_options=options(s3_endpoint, retries=0, stall=10, timeout=10))
    return (a, native.plan_windows(dead_src)[0].write(str(tmp_path / "dead")),
            native.plan_windows(healthy_src)[0].write(str(tmp_path / "healthy")))




@pytest.mark.parametrize("store", ["sharded_zstd", "blosc_parts"])
def test_batches_read_ahead_from_s3_are_the_oracles_and_fetched_once(store, proxy, tmp_path, s3_endpoint):
    pytest.importorskip("nvidia.dali")
    import zarr
    from numcodecs import Blosc

    from dali_mesh import Layout, MeshInfo, ZarrSource
    from dali_mesh.partition import take_window
    from dali_mesh.pipeline.plugin import plugin_read_ahead_counts
    from tests.helpers import native_pipeline, pipeline_epochs

    a = np.round(np.random.default_rng(11).normal(size=(8, 3, 96, 64)), 2).astype("f4")
    if store == "sharded_zstd":
        z = zarr.create_array(tmp_path / "a.zarr", shape=a.shape, chunks=(1, 3, 32, 64), shards=(2, 3, 96, 64),
                              dtype="f4", compressors=[zarr.codecs.ZstdCodec(level=3)])
    else:  # whole-field chunks of many Blosc blocks: read in parts
        z = zarr.create_array(tmp_path / "a.zarr", shape=a.shape, chunks=(1, 3, 96, 64), dtype="f4", zarr_format=2,
                              compressors=[Blosc("lz4", 5, Blosc.SHUFFLE, blocksize=4096)])
    z[:] = a
    full = zarr.open_array(str(tmp_path / "a.zarr"), mode="r")[:]
    location = upload(s3_endpoint, tmp_path / "a.zarr", "data", f"ahead/{store}.zarr")
    layout = Layout(MeshInfo((1, 3), ("dp", "mp"), (0, 1)), shard={"mp": 1}, halo={1: 2}, boundary="reflect")
    chunk_gets = {}
    for ahead in (None, False):
        src = ZarrSource([location], None, layout, batch_size=2, shuffle=True, seed=3,
                         storage_options=options(proxy.endpoint))
        pipe = native_pipeline(src, plan_dir=str(tmp_path / "plans"), read_ahead=ahead)
        used0, dropped0, _ = plugin_read_ahead_counts()
        start = len(proxy.requests)
        epochs = [[x for batch in e for x in batch] for e in pipeline_epochs(pipe, 2)]
        for got in epochs:
            assert sorted(i for i, _ in got) == list(range(8))
            for sid, w in got:
                np.testing.assert_array_equal(w, take_window(full[sid], src.region), err_msg=f"sample {sid}")
        used, dropped, _ = plugin_read_ahead_counts()
        # 4 batches an epoch: the 2nd, 3rd and 4th were read ahead; the next epoch's 1st never is
        assert (used - used0, dropped - dropped0) == ((6, 0) if ahead is None else (0, 0))
        del pipe
        chunk_gets[ahead] = sorted((path, rng) for method, path, rng, _ in proxy.requests[start:]
                                   if method == "GET" and re.search(r"\.zarr/(c/|\d)", path))
    if store == "sharded_zstd":  # the same inner chunks' ranges, each once per epoch
        assert chunk_gets[None] == chunk_gets[False]
    else:  # read in parts: where the first chunk's guess falls differs by reader; never more chunks
        assert {p for p, _ in chunk_gets[None]} == {p for p, _ in chunk_gets[False]}


def test_an_object_replaced_after_the_plan_fails_its_batch_when_read(proxy, tmp_path, s3_endpoint):
    """The batch read ahead that reads the replaced object fails when that batch is read (not before,
    and the batch before it gives its window); the error names the object."""
    pytest.importorskip("nvidia.dali")
    from dali_mesh import NumpySource
    from dali_mesh.pipeline.plugin import plugin_read_ahead_counts
    from tests.helpers import native_pipeline, one_rank_layout

    a = np.arange(3 * 2 * 8 * 6, dtype="f4").reshape(3, 2, 8, 6)
    locations = _npy_objects(s3_endpoint, "s", a)
    src = NumpySource(locations, one_rank_layout(), batch_size=1, shuffle=False,
                      storage_options=options(proxy.endpoint, retries=2, retry_seconds=5, stall=1, timeout=10))
    pipe = native_pipeline(src, plan_dir=str(tmp_path))
    buf = io.BytesIO()
    np.save(buf, a[1] + 1000)  # the same size: only the ETag tells
    client(s3_endpoint).put_object(Bucket="data", Key="ahead/s1.npy", Body=buf.getvalue())

    failed = plugin_read_ahead_counts()[2]
    w, _, _ = pipe.run()  # reads sample 0, and sample 1 ahead
    np.testing.assert_array_equal(np.array(w[0]), a[0])
    with pytest.raises(Exception) as info:
        w, _, _ = pipe.run()
        pytest.fail(f"a window came: {np.array(w[0]).ravel()[:4]}")
    assert "replaced" in str(info.value) and "ahead/s1.npy" in str(info.value)
    assert plugin_read_ahead_counts()[2] == failed + 1  # read ahead, failed, read again: the same error


def test_a_transient_failure_of_a_batch_read_ahead_is_not_replayed(proxy, tmp_path, s3_endpoint):
    """The batch read ahead meets a 503 with no retries left and fails; by the time the batch is
    wanted the server answers again: the batch is read again, and its windows come (the failure of
    the read ahead is not that batch's error)."""
    from dali_mesh import NumpySource, _kernels
    from dali_mesh.pipeline import native
    from tests.helpers import one_rank_layout

    a = np.arange(3 * 2 * 8 * 6, dtype="f4").reshape(3, 2, 8, 6)
    locations = _npy_objects(s3_endpoint, "t", a)
    src = NumpySource(locations, one_rank_layout(), batch_size=1, shuffle=False,
                      storage_options=options(proxy.endpoint, retries=0, retry_seconds=5, stall=5, timeout=10))
    path = native.plan_windows(src)[0].write(str(tmp_path))
    proxy.add("status", status=503, key="ahead/t1.npy", times=1)
    with _kernels.PlanReader(path, "f4") as reader:
        assert reader.read_ahead([1])
        (w,), = reader.read([0])
        np.testing.assert_array_equal(w, a[0])
        deadline = time.monotonic() + 10  # the batch is wanted after its read ahead failed
        while proxy.count("GET", "ahead/t1.npy") < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)
        (w,), = reader.read([1])
        np.testing.assert_array_equal(w, a[1])
        assert reader.ahead_counts() == (0, 0, 1)
    assert [kind for _, path, _, kind in proxy.requests if "ahead/t1.npy" in path][-2:] == ["status", None]


def test_a_batch_read_ahead_then_not_wanted_is_cancelled_at_once(proxy, tmp_path, s3_endpoint):
    """A server that never answers the batch read ahead (stall=60: curl would wait a minute): when a
    third batch is read ahead the first is dropped, its request cancelled within about a second (curl's
    progress callback); closing the reader cancels the others the same way."""
    from dali_mesh import NumpySource, _kernels
    from dali_mesh.pipeline import native
    from tests.helpers import one_rank_layout

    locations = _npy_objects(s3_endpoint, "h", [np.full((2, 8, 6), t, "f4") for t in range(4)])
    src = NumpySource(locations, one_rank_layout(), batch_size=1, shuffle=False,
                      storage_options=options(proxy.endpoint, retries=1, retry_seconds=120, stall=60, timeout=120))
    path = native.plan_windows(src)[0].write(str(tmp_path))
    for t in (1, 2, 3):
        proxy.add("hang", key=f"ahead/h{t}.npy", seconds=60)
    proxy.reset_counts()
    reader = _kernels.PlanReader(path, "f4")  # read_ahead=1: these are an object store's
    try:
        assert reader.read_ahead([1]) and reader.read_ahead([2])
        deadline = time.monotonic() + 10
        while proxy.count("GET", "ahead/h") < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proxy.count("GET", "ahead/h1.npy") == proxy.count("GET", "ahead/h2.npy") == 1  # both in flight
        time.sleep(0.5)
        t0 = time.monotonic()
        assert reader.read_ahead([3])  # the batch of [1] is dropped: its request cancelled
        assert time.monotonic() - t0 < 5
        assert reader.ahead_counts() == (0, 1, 0)
        (w,), = reader.read([0])  # another batch, read now
        np.testing.assert_array_equal(w, np.zeros((2, 8, 6), "f4"))
    finally:
        t0 = time.monotonic()
        reader.close()
        assert time.monotonic() - t0 < 5


_EXITS = r"""
import sys
import numpy as np
from dali_mesh import NumpySource
from tests.helpers import native_pipeline, one_rank_layout
from tests.storage.s3_server import options
endpoint, how = sys.argv[1:]
src = NumpySource([f"s3://data/ahead/x{t}.npy" for t in range(3)], one_rank_layout(), batch_size=1, shuffle=False,
                  storage_options=options(endpoint, retries=1, retry_seconds=120, stall=60, timeout=120))
pipe = native_pipeline(src)
print("planned", flush=True)
sys.stdin.readline()  # the test makes sample 1's object hang now (its header was read by the plan)
w, _, _ = pipe.run()  # sample 0; sample 1 read ahead, its answer never comes
assert float(np.array(w[0]).ravel()[0]) == 0.0
print("read", flush=True)
if how == "error":
    raise RuntimeError("the training step failed")
sys.exit(0)
"""


@pytest.mark.parametrize("how", ["exit", "error"])
def test_the_process_exits_while_a_batch_read_ahead_waits_on_the_server(how, proxy, tmp_path, s3_endpoint):
    """A training script that ends (or fails) after a batch, while the next one, read ahead, waits on
    a server that never answers: the process exits at once with its own status, neither waiting for
    the request nor crashing in it."""
    pytest.importorskip("nvidia.dali")
    import os
    import subprocess
    import sys
    from pathlib import Path

    _npy_objects(s3_endpoint, "x", [np.full((2, 8, 6), t, "f4") for t in range(3)])
    root = Path(__file__).parents[2]
    p = subprocess.Popen([sys.executable, "-c", _EXITS, proxy.endpoint, how], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(root),
                         env=dict(os.environ, PYTHONPATH=str(root)))
    try:
        assert p.stdout.readline().strip() == "planned", p.stderr.read()[-3000:]
        proxy.add("hang", key="ahead/x1.npy", method="GET", seconds=60, times=10)
        planned = proxy.count("GET", "ahead/x1.npy")  # its header, read by the plan
        t0 = time.monotonic()
        out, err = p.communicate("go\n", timeout=60)
    finally:
        p.kill()
    elapsed = time.monotonic() - t0
    assert "read" in out, err[-3000:]
    if how == "exit":
        assert p.returncode == 0, err[-3000:]
    else:
        assert p.returncode == 1 and "the training step failed" in err, err[-3000:]
    assert proxy.count("GET", "ahead/x1.npy") > planned  # the batch read ahead was on its way
    assert elapsed < 30, elapsed


def test_a_batch_whose_read_ahead_fails_while_wanted_fails_once_with_the_true_counts(proxy, tmp_path, s3_endpoint):
    """A batch whose every answer stalls (stall=0.5, retries=2): its read ahead spends the batch's
    retries while the batch is wanted, and the read fails with that error at once, not after a second
    round of retries; the attempts it names are the requests the server saw, its seconds the time the
    read took."""
    from dali_mesh import NumpySource, _kernels
    from dali_mesh.pipeline import native
    from tests.helpers import one_rank_layout

    a = np.arange(3 * 2 * 8 * 6, dtype="f4").reshape(3, 2, 8, 6)
    locations = _npy_objects(s3_endpoint, "b", a)
    src = NumpySource(locations, one_rank_layout(), batch_size=1, shuffle=False,
                      storage_options=options(proxy.endpoint, retries=2, retry_seconds=30, stall=0.5, timeout=30))
    path = native.plan_windows(src)[0].write(str(tmp_path))
    proxy.add("stall", key="ahead/b1.npy", after=0, seconds=30, times=100)
    proxy.reset_counts()
    with _kernels.PlanReader(path, "f4") as reader:
        t0 = time.monotonic()
        assert reader.read_ahead([1])
        (w,), = reader.read([0])
        np.testing.assert_array_equal(w, a[0])
        with pytest.raises(Exception) as info:
            reader.read([1])
        elapsed = time.monotonic() - t0
        assert reader.ahead_counts() == (0, 0, 1)
    message = str(info.value)
    m = re.search(r"stalled: no byte for 0\.5 s .* after (\d+) attempts in (\d+) s \(retries=2", message)
    assert m, message
    attempts, seconds = int(m[1]), int(m[2])
    assert attempts == 3 == proxy.count("GET", "ahead/b1.npy"), (message, proxy.requests)
    assert abs(seconds - elapsed) <= 1.0, (message, elapsed)
    assert "ahead/b1.npy" in message and "read ahead" in message, message


def test_a_read_never_waits_behind_other_pipelines_batches_read_ahead(proxy, tmp_path, s3_endpoint):
    """70 readers whose batches read ahead wait on a server that never answers (more than the kept
    reader threads): a healthy reader of another server gets each batch within seconds, the one it read
    ahead included (its job, queued behind the stuck ones, is taken back and read by its read)."""
    from dali_mesh import _kernels
    from tests.helpers import ahead_alive_back_to, ahead_alive_settled

    a, dead_path, healthy_path = _dead_and_healthy(s3_endpoint, proxy, tmp_path, "d", "g")
    proxy.add("hang", key="ahead/d", seconds=60, times=1000)
    alive = ahead_alive_settled()  # what another test's pipeline, still held, keeps
    stuck = [_kernels.PlanReader(dead_path, "f4") for _ in range(70)]
    try:
        for r in stuck:
            assert r.read_ahead([1]) and r.read_ahead([2])
        deadline = time.monotonic() + 10
        while proxy.count("GET", "ahead/d") < 40 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proxy.count("GET", "ahead/d") >= 40  # the kept threads are taken by stuck batches

        def read_healthy(r, got):
            for b in range(3):
                if b + 1 < 3:
                    assert r.read_ahead([b + 1])
                (w,), = r.read([b], threads=4)
                got.append((b, w, time.monotonic()))

        healthy = ReadBeside(healthy_path, read_healthy)
        healthy.join(5)
    finally:
        for r in stuck:  # their batches' reads are cancelled: the threads come back
            r.close()
    healthy.join(30)
    assert not healthy.errors, healthy.errors
    assert [b for b, _, _ in healthy.got] == [0, 1, 2]
    for b, w, _ in healthy.got:
        np.testing.assert_array_equal(w, a[b])
    assert healthy.got[-1][2] - healthy.t0 < 5, [round(t - healthy.t0, 2) for _, _, t in healthy.got]
    # every batch read ahead is freed once its job has ended: those taken back by their read, and the
    # stuck ones dropped (their reads cancelled), leave no buffers behind
    assert ahead_alive_back_to(alive, timeout=20) <= alive


def test_one_readers_batches_read_ahead_hold_a_bounded_share_of_the_threads(proxy, tmp_path, s3_endpoint):
    """A reader with 64 threads reads ahead two batches of 32 windows from a server that never answers:
    its jobs and their helpers hold about 16 kept threads (16 requests in flight), so another
    reader's batch is still read ahead (counted as used) and read at once."""
    from dali_mesh import _kernels

    a, dead_path, healthy_path = _dead_and_healthy(s3_endpoint, proxy, tmp_path, "e", "f")
    proxy.add("hang", key="ahead/e", seconds=60, times=1000)
    proxy.reset_counts()
    stuck = _kernels.PlanReader(dead_path, "f4")
    try:
        assert stuck.read_ahead([1] * 32, threads=64) and stuck.read_ahead([2] * 32, threads=64)
        deadline = time.monotonic() + 10
        while proxy.count("GET", "ahead/e") < 16 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # more would come now, were there no bound
        # 16, or 17 when the second batch's job (a job always runs) started after the helpers took 16
        assert proxy.count("GET", "ahead/e") in (16, 17)
        with _kernels.PlanReader(healthy_path, "f4") as r:
            t0 = time.monotonic()
            assert r.read_ahead([1])
            (w,), = r.read([1])
            np.testing.assert_array_equal(w, a[1])
            assert r.ahead_counts() == (1, 0, 0)
            assert time.monotonic() - t0 < 5
    finally:
        stuck.close()
