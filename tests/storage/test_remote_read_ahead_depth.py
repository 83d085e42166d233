"""The native reader reads K batches ahead from an object store (``read_windows(read_ahead_batches=K)``),
against the benchmarks' S3 server (``benchmarks/s3_server.py``: it answers side by side, each answer
after a fixed latency, and counts the most requests in flight) or moto behind the tests' fault proxy:
every window of two shuffled epochs equals numpy's for K = 1, 2, 4, the epochs' last batches
included, each object fetched as often as without reading ahead; K batches are in flight at once, fewer
when ``read_ahead_bytes`` does not hold them; a checkpoint restored mid-epoch (the order changed under
the batches read ahead) gives the batches it should; a server error in a batch read ahead fails that
batch when it is asked for, and the process exits; a pipeline destroyed while batches are in flight
does not wait for them."""
from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from benchmarks.s3_server import S3Server
from dali_mesh.storage.remote import have_native_http
from tests.helpers import fed_plugin_pipeline
from tests.storage.fault_proxy import proxy  # noqa: F401
from tests.storage.s3_server import client, options, s3_endpoint  # noqa: F401

pytestmark = [pytest.mark.skipif(not have_native_http(), reason="this build has no libcurl"),
              pytest.mark.timeout(120)]

SAMPLES, BATCH = 12, 2  # 6 batches an epoch
LATENCY = 0.2  # seconds before each answer: every request of the batches in flight overlaps


def _npy(arr) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def _arrays():
    return np.round(np.random.default_rng(7).normal(size=(SAMPLES, 2, 8, 6)), 2).astype("f4")


def _source(endpoint, prefix, *, shuffle=True, batch_size=BATCH, n=SAMPLES, **more):
    from dali_mesh import NumpySource
    from tests.helpers import one_rank_layout

    return NumpySource([f"s3://data/depth/{prefix}{t}.npy" for t in range(n)], one_rank_layout(),
                       batch_size=batch_size, shuffle=shuffle, seed=3, storage_options=options(endpoint, **more))




@pytest.fixture(scope="module")
def server():
    """The benchmarks' server, in memory, with :data:`SAMPLES` ``.npy`` objects ``depth/s<t>.npy``."""
    with S3Server(buckets=["data"]) as s:
        for t, arr in enumerate(_arrays()):
            s.put("data", f"depth/s{t}.npy", _npy(arr))
        yield s


def _run(server, tmp_path, **kw):
    """Two epochs of a native pipeline over ``server`` at :data:`LATENCY`: ``(epochs, server counts,
    (used, dropped, failed) read-ahead counts)``, counted from the first batch on (not the plan)."""
    from dali_mesh.pipeline.plugin import plugin_read_ahead_counts
    from tests.helpers import native_pipeline, pipeline_epochs

    server.configure(latency=0)
    pipe = native_pipeline(_source(server.endpoint, "s"), plan_dir=str(tmp_path / "plans"), **kw)
    server.configure(latency=LATENCY)
    server.reset()
    before = plugin_read_ahead_counts()
    try:
        epochs = pipeline_epochs(pipe, 2)
    finally:
        del pipe
        server.configure(latency=0)
    counts = server.reset()
    return epochs, counts, tuple(b - a for a, b in zip(before, plugin_read_ahead_counts()))


@pytest.mark.parametrize("k", [1, 2, 4])
def test_k_batches_in_flight_each_the_numpy_windows(k, server, tmp_path):
    """Every window of two shuffled epochs is numpy's; every batch but an epoch's first came read ahead
    and none was dropped (no batch of the next epoch is fetched before it is asked for); the GETs are
    those of reading one batch at a time; the server saw the K batches read ahead in flight with the
    one read (each batch's first request waits LATENCY; 2 threads: at most 2 requests a batch)."""
    pytest.importorskip("nvidia.dali")
    a = _arrays()
    epochs, counts, ahead = _run(server, tmp_path, read_ahead_batches=k)
    for got in epochs:
        assert len(got) == SAMPLES // BATCH
        assert sorted(i for b in got for i, _ in b) == list(range(SAMPLES))
        for batch in got:
            for sid, w in batch:
                np.testing.assert_array_equal(w, a[sid], err_msg=f"sample {sid}")
    assert ahead == (2 * (SAMPLES // BATCH - 1), 0, 0)
    _, alone, _ = _run(server, tmp_path, read_ahead=False)
    assert counts["GET"] == alone["GET"]
    # the server counts a request in flight until its last byte is sent: the client may have taken it and
    # started the next batch's first request before (one more at most)
    assert k + 1 <= counts["in_flight_max"] <= BATCH * (k + 1) + 1, counts
    assert alone["in_flight_max"] <= BATCH + 1


@pytest.mark.parametrize("kw", [{"read_ahead_batches": 0}, {"read_ahead_batches": 9}, {"read_ahead_batches": True},
                                {"read_ahead_bytes": -1}])
def test_read_ahead_arguments_out_of_range_are_refused(kw, server):
    from dali_mesh.pipeline import native

    name = next(iter(kw))
    with pytest.raises(ValueError, match=f"{name} must be"):
        native.define_native(_source(server.endpoint, "s"), "cpu", **kw)


def test_read_ahead_bytes_bound_the_batches_in_flight(server, tmp_path):
    """read_ahead_bytes of one batch and a half: one batch is read ahead of the one read, not 4; with
    less than one batch's, none (the windows are still numpy's). In flight: the batches' requests, and
    one more at most (the server counts a request until its last byte is sent, and the client may have
    taken it and sent the next batch's first request before: the race the test above allows)."""
    pytest.importorskip("nvidia.dali")
    a = _arrays()
    batch_bytes = BATCH * a[0].nbytes
    for limit, read_ahead, most in ((batch_bytes * 3 // 2, 2 * (SAMPLES // BATCH - 1), 2 * BATCH + 1),
                                    (batch_bytes - 1, 0, BATCH + 1)):
        epochs, counts, ahead = _run(server, tmp_path, read_ahead_batches=4, read_ahead_bytes=limit)
        assert ahead == (read_ahead, 0, 0), limit
        assert counts["in_flight_max"] <= most, (limit, counts)
        for got in epochs:
            for batch in got:
                for sid, w in batch:
                    np.testing.assert_array_equal(w, a[sid], err_msg=f"sample {sid}")


@pytest.mark.parametrize("k", [2, 4])
def test_a_checkpoint_restored_mid_epoch_gives_its_batches(k, server, tmp_path):
    """Checkpointed after two batches (K batches read ahead then), run on, and restored into a new
    pipeline: the restored one gives the same batches, numpy's windows, into the next epoch; the
    first pipeline's batches read ahead are dropped when it goes, the restored one reads its own."""
    pytest.importorskip("nvidia.dali")
    from dali_mesh.pipeline.plugin import plugin_read_ahead_counts
    from tests.helpers import native_pipeline, pipeline_epochs

    a = _arrays()
    server.configure(latency=0.02)
    try:
        p = native_pipeline(_source(server.endpoint, "s"), read_ahead_batches=k)
        p.run()
        p.run()
        ck = p.checkpoint()
        rest = [b for e in pipeline_epochs(p, 2) for b in e]
        del p
        used = plugin_read_ahead_counts()[0]
        q = native_pipeline(_source(server.endpoint, "s"), read_ahead_batches=k, checkpoint=ck)
        again = [b for e in pipeline_epochs(q, 2) for b in e]
        del q
    finally:
        server.configure(latency=0)
    assert len(rest) == SAMPLES // BATCH - 2 + SAMPLES // BATCH
    assert [[i for i, _ in b] for b in again] == [[i for i, _ in b] for b in rest]
    for b in again:
        for sid, w in b:
            np.testing.assert_array_equal(w, a[sid], err_msg=f"sample {sid}")
    # the rest of epoch 0 after its first restored batch, and epoch 1 after its first, came read ahead
    assert plugin_read_ahead_counts()[0] - used == (SAMPLES // BATCH - 3) + (SAMPLES // BATCH - 1)


def test_an_order_changed_under_the_batches_read_ahead_drops_them(server, tmp_path):
    """The operator fed sample ids and next batches' ids of its own: batches [2, 3] and [4, 5] read
    ahead, then the order changes ([6, 7] comes, then [8, 9]): the two are dropped, never given, and
    [8, 9] comes read ahead; every window is numpy's."""
    pytest.importorskip("nvidia.dali")
    from dali_mesh.pipeline import native
    from dali_mesh.pipeline.plugin import plugin_read_ahead_counts
    from dali_mesh.source import pipeline_reader

    a = _arrays()
    reader = pipeline_reader(_source(server.endpoint, "s"))
    path = native.plan_windows(reader)[0].write(str(tmp_path))
    # (this batch, the next two), per sample a 1-D tensor of its ids in the next batches
    feed = [([0, 1], [[2, 4], [3, 5]]), ([6, 7], [[8, 10], [9, 11]]), ([8, 9], [[10, -1], [11, -1]])]
    p = fed_plugin_pipeline(path, feed, BATCH, read_ahead_batches=2)
    server.configure(latency=0.05)
    before = plugin_read_ahead_counts()
    try:
        got = [p.run() for _ in range(2)]
        # dropped as [6, 7] was read, not later: they would hold their buffers and threads meanwhile
        changed = tuple(b - a for a, b in zip(before, plugin_read_ahead_counts()))
        got.append(p.run())
        used = plugin_read_ahead_counts()[0] - before[0]
        del p
    finally:
        server.configure(latency=0)
    for w, ids in got:
        for i in range(len(w)):
            np.testing.assert_array_equal(np.array(w[i]), a[int(np.array(ids[i]))])
    assert changed == (0, 2, 0)  # [2, 3] and [4, 5]
    assert used == 1  # [8, 9]


_FAILS = r"""
import sys
import numpy as np
from tests.helpers import native_pipeline
from tests.storage.test_remote_read_ahead_depth import _arrays, _source
endpoint, bad = sys.argv[1], int(sys.argv[2])
a = _arrays()
pipe = native_pipeline(_source(endpoint, "e", shuffle=False, batch_size=1, n=5, retries=0, timeout=10),
                       read_ahead_batches=4)
print("planned", flush=True)
sys.stdin.readline()  # the test makes sample `bad`'s object fail now (its header was read by the plan)
for b in range(5):
    try:
        w, ids, _ = pipe.run()
    except Exception as e:
        print(f"batch {b} failed:", " ".join(str(e).split()), flush=True)
        break
    assert int(np.array(ids[0])) == b
    np.testing.assert_array_equal(np.array(w[0]), a[b])
    print(f"batch {b} read", flush=True)
"""


def test_a_server_error_in_a_batch_read_ahead_fails_that_batch_when_asked_for(proxy, s3_endpoint):
    """Batch 3's object answers 500 (no retries) while it is read ahead with 1, 2 and 4: batches 0, 1
    and 2 give numpy's windows, batch 3 fails naming its object (read ahead, failed, read again when
    asked for: the same error), never a window; the process exits."""
    pytest.importorskip("nvidia.dali")
    for t, arr in enumerate(_arrays()[:5]):
        client(s3_endpoint).put_object(Bucket="data", Key=f"depth/e{t}.npy", Body=_npy(arr))
    root = Path(__file__).parents[2]
    p = subprocess.Popen([sys.executable, "-c", _FAILS, proxy.endpoint, "3"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(root),
                         env=dict(os.environ, PYTHONPATH=str(root)))
    try:
        assert p.stdout.readline().strip() == "planned", p.stderr.read()[-3000:]
        proxy.add("status", status=500, key="depth/e3.npy", times=100)
        out, err = p.communicate("go\n", timeout=60)
    finally:
        p.kill()
    assert p.returncode == 0, err[-3000:]
    lines = out.splitlines()
    assert lines[:3] == ["batch 0 read", "batch 1 read", "batch 2 read"], (out, err[-3000:])
    assert lines[3].startswith("batch 3 failed") and "depth/e3.npy" in lines[3], out
    assert len(lines) == 4
    assert proxy.count("GET", "depth/e3.npy") >= 2  # read ahead, and read again when asked for


def test_a_pipeline_destroyed_while_batches_are_in_flight_does_not_wait(proxy, s3_endpoint):
    """Four batches read ahead from a server that never answers them: the pipeline goes at once, their
    requests cancelled, and their buffers are freed when their jobs end."""
    pytest.importorskip("nvidia.dali")
    from tests.helpers import ahead_alive_back_to, ahead_alive_settled, native_pipeline

    a = _arrays()
    for t, arr in enumerate(a[:6]):
        client(s3_endpoint).put_object(Bucket="data", Key=f"depth/h{t}.npy", Body=_npy(arr))
    alive = ahead_alive_settled()  # what another test's pipeline, still held, keeps
    pipe = native_pipeline(_source(proxy.endpoint, "h", shuffle=False, batch_size=1, n=6, retries=1,
                                   retry_seconds=120, stall=60, timeout=120), read_ahead_batches=4)
    for t in range(1, 6):
        proxy.add("hang", key=f"depth/h{t}.npy", seconds=60, times=10)
    proxy.reset_counts()
    w, _, _ = pipe.run()
    np.testing.assert_array_equal(np.array(w[0]), a[0])
    deadline = time.monotonic() + 10
    while proxy.count("GET", "depth/h") < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [proxy.count("GET", f"depth/h{t}.npy") for t in range(1, 5)] == [1, 1, 1, 1]  # all 4 in flight
    t0 = time.monotonic()
    del pipe
    assert time.monotonic() - t0 < 5
    assert ahead_alive_back_to(alive, timeout=20) <= alive
