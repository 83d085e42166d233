"""The remote store's client under faults (csrc/storage/http_store.cc through dali_mesh/storage/remote.py,
and the native DALI reader): a forwarding proxy of our own (tests/storage/fault_proxy.py) between the
client and a real S3 server (moto) answers 429 and 503, stalls, never answers, drops connections, sends
bodies shorter or longer than the range and wrong ``Content-Range`` headers, denies access. Retries must
give the stored bytes (the request counts show them), broken answers an error and never data, every
error must name the object, the range, the status and the attempts, every test ends in bounded time,
and no credential shows in any message, spec, ``repr``, pickle or plan file."""
from __future__ import annotations

import inspect
import io
import os
import pickle
import socket
import time
import zlib

import numpy as np
import pytest

from dali_mesh.storage import DataFileError, FileChangedError, MissingFileError, TruncatedFileError, store_of
from dali_mesh.storage.remote import have_native_http
from tests.storage.fault_proxy import ECHO, FaultProxy, proxy  # noqa: F401
from tests.storage.s3_server import (KEY, REGION, SECRET, client, options, s3_endpoint,  # noqa: F401
                                    start_checking_server)

pytestmark = [pytest.mark.skipif(not have_native_http(), reason="this build has no libcurl"),
              pytest.mark.timeout(60)]

SIZE = 10_000


#: quick settings: each test ends in seconds (stall=1 drops a silent request after about a second)
FAST = {"retries": 3, "retry_seconds": 5, "stall": 1, "timeout": 10}


@pytest.fixture
def obj(s3_endpoint, request):
    """``(key, bytes)`` of an object of :data:`SIZE` random bytes uploaded for this test (not through the
    proxy: the counts are the reads' alone)."""
    data = np.random.default_rng(zlib.crc32(request.node.name.encode())).bytes(SIZE)
    name = f"faults/{request.node.name}.bin".replace("[", "-").replace("]", "")
    client(s3_endpoint).put_object(Bucket="data", Key=name, Body=data)
    return f"data/{name}", data


def opened(store, key):
    """``key`` opened at the version a HEAD names, as a plan opens it: no first bytes are fetched with
    the open (``store.open``'s GET), so every read below goes to the server."""
    return store.open_version(key, store.stat(key))


def remote(proxy, key, **settings):
    """``(store, key)`` of ``s3://key`` read through the proxy with :data:`FAST` settings (``settings``
    override them)."""
    return store_of(f"s3://{key}", options(proxy.endpoint, **{**FAST, **settings}))


def no_secret(text: str) -> str:
    """``text``, after checking that it holds no credential of the tests nor the proxy's echo."""
    assert SECRET not in text, text
    assert ECHO not in text, text
    return text


def read_error(call, error=DataFileError) -> str:
    """The message of the ``error`` that ``call()`` raises (checked free of credentials)."""
    with pytest.raises(error) as info:
        call()
    return no_secret(str(info.value))


def readv(store, key, offset, n, pieces=1):
    """``n`` bytes at ``offset`` by one ``readv`` into ``pieces`` buffers (opened by a HEAD)."""
    bufs = [bytearray(len(part)) for part in np.array_split(np.zeros(n, np.uint8), pieces)]
    got = opened(store, key).readv(bufs, offset)
    assert got == n
    return b"".join(bufs)


# ---- retries ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("status, times", [(429, 2), (503, 3), (500, 1), (502, 1), (504, 1), (408, 1)])
def test_a_transient_status_is_retried_and_the_stored_bytes_come(proxy, obj, status, times):
    key, data = obj
    store, key = remote(proxy, key)
    proxy.add("status", status=status, times=times)
    t0 = time.monotonic()
    assert readv(store, key, 100, 3000, pieces=3) == data[100:3100]
    assert proxy.counts == {"HEAD": 1, "GET": times + 1}
    assert [kind for _, _, _, kind in proxy.requests] == [None] + ["status"] * times + [None]
    assert all(r == "bytes=100-3099" for m, _, r, _ in proxy.requests if m == "GET")  # the same range each time
    assert time.monotonic() - t0 < 5


def test_head_and_read_range_are_retried_too(proxy, obj):
    key, data = obj
    store, key = remote(proxy, key)
    proxy.add("status", method="HEAD", status=503, times=2)
    proxy.add("status", method="GET", status=429, times=2)
    assert store.stat(key).size == SIZE
    assert store.read_range(key, SIZE - 10, 100) == data[-10:]  # fewer at the end
    assert proxy.counts == {"HEAD": 3, "GET": 3}  # read_range sends no HEAD first


def test_more_failures_than_retries_name_the_object_range_status_and_attempts(proxy, obj):
    key, _ = obj
    store, key = remote(proxy, key, retries=2)
    o = opened(store, key)
    proxy.add("status", status=503, times=100)
    t0 = time.monotonic()
    msg = read_error(lambda: o.readv([bytearray(1000)], 100))
    assert time.monotonic() - t0 < 5
    assert f"s3://{key}" in msg and "bytes 100-1099" in msg and "HTTP 503" in msg and "SlowDown" in msg
    assert "after 3 attempts" in msg and "retries=2" in msg
    assert proxy.count("GET") == 3


def test_retry_seconds_bounds_the_retries_in_time(proxy, obj):
    key, _ = obj
    store, key = remote(proxy, key, retries=100, retry_seconds=1)
    proxy.add("status", method=None, status=429, times=10_000)
    t0 = time.monotonic()
    msg = read_error(lambda: store.stat(key))
    elapsed = time.monotonic() - t0
    assert elapsed < 4, elapsed  # the backoff's last wait is at most 5 s but never past retry_seconds
    assert f"s3://{key}" in msg and "HEAD" in msg and "HTTP 429" in msg and "attempts" in msg
    assert "retry_seconds=1" in msg
    assert 1 < proxy.count("HEAD") < 101


def test_a_refused_connection_is_retried_then_named(obj):
    key, _ = obj
    with socket.socket() as s:  # a port of 127.0.0.1 where nothing listens
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store, key = store_of(f"s3://{key}", options(f"http://127.0.0.1:{port}", **{**FAST, "retries": 2}))
    t0 = time.monotonic()
    msg = read_error(lambda: store.read_range(key, 0, 10))
    assert time.monotonic() - t0 < 5
    assert f"s3://{key}" in msg and "after 3 attempts" in msg and "connect" in msg.lower()


# ---- stalls and silence --------------------------------------------------------------------------------------
def test_a_stall_before_the_body_is_dropped_and_retried(proxy, obj):
    key, data = obj
    store, key = remote(proxy, key)
    o = opened(store, key)
    proxy.add("stall", after=0, seconds=30)  # headers, then silence
    proxy.add("hang", seconds=30)  # then no answer at all
    t0 = time.monotonic()
    buf = bytearray(2000)
    assert o.readv([buf], 4000) == 2000 and bytes(buf) == data[4000:6000]
    elapsed = time.monotonic() - t0
    assert 1.5 < elapsed < 6, elapsed  # two silent attempts of about stall=1 s each
    assert proxy.count("GET") == 3


def test_a_stall_mid_body_is_dropped_and_retried(proxy, obj):
    key, data = obj
    store, key = remote(proxy, key, retry_seconds=15)
    o = opened(store, key)
    proxy.add("stall", after=500, seconds=40)
    t0 = time.monotonic()
    buf = bytearray(2000)
    assert o.readv([buf], 4000) == 2000 and bytes(buf) == data[4000:6000]
    # libcurl's low-speed check averages the speed over its last 5 s: after 500 bytes a stall is seen
    # only once they leave the average (measured: 7.0 s with stall=1, not 1 s)
    assert time.monotonic() - t0 < 12
    assert proxy.count("GET") == 2


def test_a_server_that_never_answers_is_an_error_in_bounded_time(proxy, obj):
    key, _ = obj
    store, key = remote(proxy, key, retries=1)
    o = opened(store, key)
    proxy.add("hang", times=100)  # until the proxy stops
    t0 = time.monotonic()
    msg = read_error(lambda: o.readv([bytearray(100)], 0))
    assert time.monotonic() - t0 < 6
    assert f"s3://{key}" in msg and "bytes 0-99" in msg and "after 2 attempts" in msg and "retries=1" in msg
    assert "stalled: no byte for 1 s" in msg or "Timeout" in msg


def test_timeout_bounds_one_request_when_stall_would_not(proxy, obj):
    key, _ = obj
    store, key = remote(proxy, key, retries=1, stall=30, timeout=1.5)
    o = opened(store, key)
    proxy.add("hang", times=100)
    t0 = time.monotonic()
    msg = read_error(lambda: o.readv([bytearray(100)], 0))
    assert 2.5 < time.monotonic() - t0 < 8  # two attempts of 1.5 s
    assert "after 2 attempts" in msg and "Timeout" in msg


# ---- dropped connections and broken answers ------------------------------------------------------------------
@pytest.mark.parametrize("after", [0, 1, 1500, 2999])
def test_a_connection_dropped_mid_body_is_retried(proxy, obj, after):
    key, data = obj
    store, key = remote(proxy, key)
    proxy.add("drop", after=after, times=2)
    t0 = time.monotonic()
    assert readv(store, key, 1234, 3000, pieces=4) == data[1234:4234]  # refilled from the first buffer
    assert proxy.count("GET") == 3
    assert time.monotonic() - t0 < 5


@pytest.mark.parametrize("kind, params, said", [
    ("short", {"value": 1}, "not the range asked for"),
    ("short", {"value": 1999}, "not the range asked for"),
    ("long", {"value": 1}, "more bytes than the range"),
    ("long", {"value": 5000}, "more bytes than the range"),
    ("bad_range", {"value": 1}, "holds bytes 101-2100"),
    ("bad_range", {"value": -100}, "holds bytes 0-1999"),
    ("wrong_length", {"value": 1999}, "not the range asked for"),  # Content-Length below the body
])
def test_a_broken_answer_is_an_error_never_data(proxy, obj, kind, params, said):
    key, data = obj
    store, key = remote(proxy, key)
    o = opened(store, key)
    proxy.add(kind, **params)
    buf = bytearray(2000)
    msg = read_error(lambda: o.readv([buf], 100))
    assert f"s3://{key}" in msg and "bytes 100-2099" in msg and said in msg
    assert "nothing of it is used" in msg
    assert proxy.count("GET") == 1  # a broken answer is not a transient one: no retry
    # the next read of the same object gives the truth
    if kind != "wrong_length":  # see test_a_desynchronised_connection_is_not_reused
        assert o.pread(2000, 100) == data[100:2100]


def test_a_content_length_above_the_body_is_a_dropped_connection(proxy, obj):
    key, data = obj
    store, key = remote(proxy, key)
    o = opened(store, key)
    proxy.add("wrong_length", value=5000)  # then the connection closes: a partial answer
    assert o.pread(2000, 100) == data[100:2100]
    assert proxy.count("GET") == 2


def test_a_desynchronised_connection_is_not_reused(proxy, obj):
    key, data = obj
    store, key = remote(proxy, key)
    o = opened(store, key)
    proxy.add("wrong_length", value=1999)
    read_error(lambda: o.readv([bytearray(2000)], 100))
    assert o.pread(2000, 100) == data[100:2100]  # an independent, correct request


def test_416_is_an_error_naming_the_range(proxy, obj):
    key, _ = obj
    store, key = remote(proxy, key)
    o = opened(store, key)
    proxy.add("status", status=416)
    msg = read_error(lambda: o.readv([bytearray(10)], 20), TruncatedFileError)
    assert f"s3://{key}" in msg and "bytes 20-29" in msg and "416" in msg
    assert proxy.count("GET") == 1


# ---- missing objects, denied access ------------------------------------------------------------------------
def test_404_is_a_missing_file_error_naming_the_key(proxy, obj):
    key, _ = obj
    store, key = remote(proxy, key)
    assert store.stat(key.replace(".bin", "-none.bin")) is None
    msg = read_error(lambda: store.open(key.replace(".bin", "-none.bin")), MissingFileError)
    assert f"s3://{key.replace('.bin', '-none.bin')}" in msg and "no such" in msg
    o = opened(store, key)
    proxy.add("status", status=404)  # deleted after it was opened
    msg = read_error(lambda: o.readv([bytearray(10)], 0), MissingFileError)
    assert f"s3://{key}" in msg and "bytes 0-9" in msg and "no such object" in msg and "HTTP 404" in msg
    assert proxy.counts == {"HEAD": 2, "GET": 2}  # never retried (the open of a missing object: one GET)


@pytest.mark.parametrize("method", ["HEAD", "GET"])
def test_403_is_access_denied_without_the_servers_echo(proxy, obj, method):
    key, _ = obj
    store, key = remote(proxy, key)
    o = opened(store, key)
    proxy.add("status", method=method, status=403)
    msg = read_error(lambda: store.stat(key) if method == "HEAD" else o.readv([bytearray(10)], 0))
    assert f"s3://{key}" in msg and "access denied" in msg and "HTTP 403" in msg
    if method == "GET":  # the <Code> is shown, never the <StringToSign> (no_secret checked ECHO)
        assert "SignatureDoesNotMatch" in msg and "bytes 0-9" in msg
    assert proxy.count(method) == 1 + (method == "HEAD")  # never retried


@pytest.fixture(scope="module")
def checking():
    """``(endpoint, key id, secret, bytes of data/signed/a.bin)`` of a moto server that checks every
    signature against an IAM user's key."""
    proc, endpoint, key_id, secret = start_checking_server()
    try:
        s3 = client(endpoint, key_id, secret)
        s3.create_bucket(Bucket="data")
        data = os.urandom(3000)
        s3.put_object(Bucket="data", Key="signed/a.bin", Body=data)
        yield endpoint, key_id, secret, data
    finally:
        proc.stdin.close()
        proc.wait(20)


def test_a_checking_server_reads_a_good_key_and_denies_a_wrong_secret(checking):
    endpoint, key_id, secret, data = checking
    wrong_secret = "W" + secret[1:][::-1]
    with FaultProxy(endpoint) as p:  # the proxy keeps signatures valid (the Host header passed through)
        good, key = store_of("s3://data/signed/a.bin", {"key": key_id, "secret": secret, "endpoint_url": p.endpoint,
                                                        **FAST})
        assert good.read_range(key, 1000, 500) == data[1000:1500]
        version = good.stat(key)
        # (read nothing with `good` after `bad` is used: see test_two_keys_for_one_endpoint_stay_apart)
        bad, key = store_of("s3://data/signed/a.bin", {"key": key_id, "secret": wrong_secret,
                                                       "endpoint_url": p.endpoint, **FAST})
        msgs = [read_error(lambda: bad.stat(key)),
                read_error(lambda: bad.open_version(key, version).readv([bytearray(10)], 0))]
        for msg in msgs:
            assert "access denied" in msg and "HTTP 403" in msg and "s3://data/signed/a.bin" in msg
            assert secret not in msg and wrong_secret not in msg
        assert "SignatureDoesNotMatch" in msgs[1] and "bytes 0-9" in msgs[1]
        assert p.counts == {"HEAD": 2, "GET": 2}  # 403 is never retried; read_range sends no HEAD
        for store in (good, bad):
            for text in (repr(store), store.spec, pickle.dumps(store)):
                text = text if isinstance(text, bytes) else text.encode()
                assert secret.encode() not in text and wrong_secret.encode() not in text


def test_two_keys_for_one_endpoint_stay_apart(checking):
    endpoint, key_id, secret, data = checking
    good, key = store_of("s3://data/signed/a.bin", {"key": key_id, "secret": secret, "endpoint_url": endpoint})
    assert good.read_range(key, 0, 100) == data[:100]
    bad, key = store_of("s3://data/signed/a.bin", {"key": key_id, "secret": "W" + secret[1:],
                                                   "endpoint_url": endpoint})
    read_error(lambda: bad.stat(key))
    assert good.read_range(key, 0, 100) == data[:100]


# ---- replaced objects ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("new_size", [SIZE, SIZE + 5])
def test_an_object_replaced_after_open_is_a_file_changed_error(proxy, obj, s3_endpoint, new_size):
    key, data = obj
    store, key = remote(proxy, key)
    o = opened(store, key)
    client(s3_endpoint).put_object(Bucket="data", Key=key.split("/", 1)[1], Body=os.urandom(new_size))
    buf = bytearray(1000)
    msg = read_error(lambda: o.readv([buf], 0), FileChangedError)
    assert f"s3://{key}" in msg and "bytes 0-999" in msg and "replaced" in msg
    msg = read_error(o.check_unchanged, FileChangedError)
    assert f"s3://{key}" in msg and "replaced" in msg
    assert proxy.count("GET") == 2  # not retried; check_unchanged's GET of one byte


# ---- the native reader ------------------------------------------------------------------------------------------
@pytest.fixture
def npy(s3_endpoint, request):
    """``(location, array)`` of a small ``.npy`` uploaded for this test."""
    array = np.arange(3 * 16 * 20, dtype=np.float32).reshape(3, 16, 20) + len(request.node.name)
    buf = io.BytesIO()
    np.save(buf, array)
    name = f"faults/{request.node.name}.npy"
    client(s3_endpoint).put_object(Bucket="data", Key=name, Body=buf.getvalue())
    return f"s3://data/{name}", array


def native_source(location, proxy, monkeypatch):
    """A ``NumpySource`` of ``location`` read through the proxy: with ``storage_options`` where the sources
    take them, else with the credentials and endpoint in the environment (as boto3 reads them)."""
    pytest.importorskip("nvidia.dali")
    from dali_mesh import NumpySource
    from tests.helpers import one_rank_layout

    kw = {}
    if "storage_options" in inspect.signature(NumpySource).parameters:
        kw["storage_options"] = options(proxy.endpoint, retries=4, retry_seconds=10, stall=1, timeout=10)
    else:
        for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        monkeypatch.setenv("AWS_REGION", REGION)
    return NumpySource([location], one_rank_layout(), batch_size=1, shuffle=False, **kw)


def test_the_native_reader_retries_and_its_plan_file_holds_no_secret(proxy, npy, monkeypatch, tmp_path):
    from tests.helpers import native_pipeline

    location, array = npy
    pipe = native_pipeline(native_source(location, proxy, monkeypatch), plan_dir=str(tmp_path))
    plans = list(tmp_path.iterdir())
    assert plans
    for plan in plans:
        assert SECRET.encode() not in plan.read_bytes() and KEY.encode() not in plan.read_bytes()
    proxy.reset_counts()
    proxy.add("status", status=503, times=2)
    proxy.add("status", status=429, times=1)
    proxy.add("drop", after=100, times=1)
    t0 = time.monotonic()
    window, ids, pads = pipe.run()
    assert time.monotonic() - t0 < 10
    np.testing.assert_array_equal(np.array(window[0]), array)
    kinds = [kind for _, _, _, kind in proxy.requests]
    assert kinds.count("status") == 3 and kinds.count("drop") == 1
    for i, (_, _, byte_range, kind) in enumerate(proxy.requests):  # each broken answer was asked for again
        assert kind is None or any(r == byte_range for _, _, r, _ in proxy.requests[i + 1:])


def test_the_native_reader_reads_a_remote_npy_window_in_one_request(proxy, npy, monkeypatch, tmp_path):
    """A .npy object's header is read at the ETag the plan records (as every read of it is): the reader
    sends one GET per window, no header read before it."""
    from tests.helpers import native_pipeline

    location, array = npy
    pipe = native_pipeline(native_source(location, proxy, monkeypatch), plan_dir=str(tmp_path))
    proxy.reset_counts()
    window, _, _ = pipe.run()
    np.testing.assert_array_equal(np.array(window[0]), array)
    assert proxy.count("GET") == 1 and proxy.count("HEAD") == 0, proxy.requests


def test_the_native_reader_fails_on_an_object_replaced_after_the_plan(proxy, npy, monkeypatch, s3_endpoint, tmp_path):
    from tests.helpers import native_pipeline

    location, array = npy
    pipe = native_pipeline(native_source(location, proxy, monkeypatch), plan_dir=str(tmp_path))
    buf = io.BytesIO()
    np.save(buf, array[::-1] + 1000)  # same shape and dtype: only the ETag tells
    client(s3_endpoint).put_object(Bucket="data", Key=location.removeprefix("s3://data/"), Body=buf.getvalue())
    proxy.reset_counts()
    t0 = time.monotonic()
    with pytest.raises(Exception) as info:  # DALI's RuntimeError with the reader's message
        window, _, _ = pipe.run()
        pytest.fail(f"a window came: {np.array(window[0]).ravel()[:4]}")
    assert time.monotonic() - t0 < 10
    msg = no_secret(str(info.value))
    assert "replaced" in msg and location in msg
    assert proxy.count("GET") >= 1


def test_the_native_reader_fails_on_a_shard_replaced_after_the_plan(proxy, monkeypatch, s3_endpoint, tmp_path):
    """A shard's index is read at the shard's ETag when the plan is made, and the reader does not read
    it again (every read sends If-Match with that ETag): a shard rewritten since, at the same size and
    with its chunks elsewhere, is an error naming it, never the planned offsets read in the new bytes."""
    import zarr

    from dali_mesh import ZarrSource
    from tests.helpers import native_pipeline, one_rank_layout
    from tests.storage.s3_server import upload

    a = np.arange(4 * 12 * 10, dtype="f4").reshape(4, 12, 10)

    def write(path, values):
        z = zarr.create_array(path, shape=a.shape, chunks=(1, 12, 10), shards=(4, 12, 10), dtype="f4",
                              compressors=None)
        z[:] = values

    write(tmp_path / "one.zarr", a)
    key = f"faults/{os.getpid()}-shard.zarr"
    location = upload(s3_endpoint, tmp_path / "one.zarr", "data", key)
    src = ZarrSource([location], None, one_rank_layout(), batch_size=1, shuffle=False,
                     storage_options=options(proxy.endpoint, retries=2, retry_seconds=5, stall=1, timeout=10))
    pipe = native_pipeline(src, plan_dir=str(tmp_path / "plans"))  # planned: the shard's index read
    write(tmp_path / "two.zarr", a[::-1] + 1000)  # the same size, other values
    shard = "c/0/0/0"
    body = (tmp_path / "two.zarr" / shard).read_bytes()
    assert len(body) == len((tmp_path / "one.zarr" / shard).read_bytes())
    client(s3_endpoint).put_object(Bucket="data", Key=f"{key}/{shard}", Body=body)
    proxy.reset_counts()
    with pytest.raises(Exception) as info:
        window, _, _ = pipe.run()
        pytest.fail(f"a window came: {np.array(window[0]).ravel()[:4]}")
    msg = no_secret(str(info.value))
    assert "replaced" in msg and shard in msg


def test_the_native_reader_reads_hdf5_at_its_planned_etag_and_fails_on_a_replaced_file(proxy, s3_endpoint, tmp_path):
    """An HDF5 object is planned at one ETag (h5py's reads, the object header, the plan's tag all at
    it), so a sample is one ranged GET (no header read per sample); the file rewritten since, the same
    size and layout with other values, is an error naming it, never the new values."""
    import h5py

    from dali_mesh import HDF5Source
    from tests.helpers import native_pipeline, one_rank_layout
    from tests.storage.s3_server import upload

    a = np.arange(4 * 12 * 10, dtype="f4").reshape(4, 12, 10)
    for name, values in (("one.h5", a), ("two.h5", a[::-1] + 1000)):
        with h5py.File(tmp_path / name, "w") as f:
            f.create_dataset("x", data=values)
    key = f"faults/{os.getpid()}-file.h5"
    location = upload(s3_endpoint, tmp_path / "one.h5", "data", key)
    src = HDF5Source([location], "x", one_rank_layout(), batch_size=1, shuffle=False,
                     storage_options=options(proxy.endpoint, retries=2, retry_seconds=5, stall=1, timeout=10))
    # one batch read ahead (the default reads 4: every batch of these 4 samples before the file changes)
    pipe = native_pipeline(src, plan_dir=str(tmp_path / "plans"), read_ahead_batches=1)
    proxy.reset_counts()
    window, _, _ = pipe.run()
    np.testing.assert_array_equal(np.array(window[0]), a[0])
    # one GET per window, no header read: this batch's window and the next batch's, read ahead (its
    # request may still be on its way)
    deadline = time.monotonic() + 10
    while proxy.count("GET", key) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    gets = sorted((r for m, path, r, _ in proxy.requests if m == "GET" and key in path),
                  key=lambda r: int(r.split("=")[1].split("-")[0]))
    offset = int(gets[0].split("=")[1].split("-")[0])
    assert gets == [f"bytes={offset + k * a[0].nbytes}-{offset + (k + 1) * a[0].nbytes - 1}" for k in (0, 1)], gets
    assert (tmp_path / "two.h5").stat().st_size == (tmp_path / "one.h5").stat().st_size
    client(s3_endpoint).put_object(Bucket="data", Key=key, Body=(tmp_path / "two.h5").read_bytes())
    with pytest.raises(Exception) as info:
        for _ in range(3):  # past the batches DALI may have read ahead
            window, _, _ = pipe.run()
            assert not np.array_equal(np.array(window[0]), a[::-1][0] + 1000), "a window of the new file came"
    msg = no_secret(str(info.value))
    assert "replaced" in msg and key in msg


# ---- credentials ---------------------------------------------------------------------------------------------
def test_no_credential_in_repr_spec_pickle_or_messages(proxy, obj):
    key, _ = obj
    token = "TOKEN-of-the-tests-fedcba9876543210"
    store, key = remote(proxy, key, token=token)
    texts = [repr(store), store.spec, pickle.dumps(store).decode("latin-1"), repr(pickle.loads(pickle.dumps(store)))]
    proxy.add("status", method=None, status=503, times=100)
    for call in (lambda: store.stat(key), lambda: store.read_range(key, 0, 10)):
        with pytest.raises(DataFileError) as info:
            call()
        texts += [str(info.value), repr(info.value), pickle.dumps(info.value).decode("latin-1")]
    for text in texts:
        no_secret(text)
        assert token not in text, text
