"""The benchmarks' parallel S3 server (benchmarks/s3_server.py): it answers side by side, its ranges,
ETags and listings are those of the bytes and keys it was given, and boto3 and dali_mesh's own s3://
client read through it. Everything on 127.0.0.1."""
from __future__ import annotations

import hashlib
import http.client
import io
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from benchmarks.s3_server import CONTROL, S3Server

ROOT = Path(__file__).resolve().parents[1]
KEYS = sorted({"a/b/c.bin", "a/b/d.bin", "a/e.bin", "a/f/g/h.bin", "f.bin", "g/h.bin", "x y/ü+z.bin",
               *(f"many/{i:03d}.bin" for i in range(23)), *(f"many/sub{i}/k.bin" for i in range(4))})


def _call(server: S3Server, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
          conn: http.client.HTTPConnection | None = None):
    """``(status, headers, body)`` of one request (on ``conn`` when given: a kept connection)."""
    c = conn or http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    c.request(method, path, body=body, headers=headers or {})
    r = c.getresponse()
    out = r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    if conn is None:
        c.close()
    return out


def _client(endpoint: str):
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="a",
                        aws_secret_access_key="b")


@pytest.fixture(params=["memory", "folder"])
def server(request, tmp_path):
    """A server with the bucket ``bucket``, its objects in memory or as files of a folder."""
    with S3Server(root=str(tmp_path) if request.param == "folder" else None, buckets=["bucket"]) as s:
        yield s


def test_answers_in_parallel():
    """64 requests sent together, 0.2 s of latency each: answered side by side (all 64 in flight at once)."""
    with S3Server(latency=0.2, buckets=["bucket"]) as s:
        s.put("bucket", "obj", bytes(range(256)) * 64)
        # a server that answered one connection at a time would leave the others waiting: 10 s, then fail
        conns = [http.client.HTTPConnection("127.0.0.1", s.port, timeout=10) for _ in range(64)]
        for c in conns:  # connected before the clock starts: what is timed is the answers
            c.connect()
        s.reset()
        go = threading.Barrier(64, timeout=10)

        def one(c):
            go.wait()
            return _call(s, "GET", "/bucket/obj", headers={"Range": "bytes=0-9"}, conn=c)

        t0 = time.perf_counter()
        with ThreadPoolExecutor(64) as pool:
            answers = list(pool.map(one, conns))
        wall = time.perf_counter() - t0
        counts = s.counts()
    assert [a[0] for a in answers] == [206] * 64 and {a[2] for a in answers} == {bytes(range(10))}
    assert wall < 3, f"64 requests of 0.2 s took {wall:.2f} s: answered in turn, not side by side"
    assert counts["in_flight_max"] == 64 and counts["GET"] == 64 and counts["bytes"] == 640, counts


def test_ranges_equal_the_bytes(server):
    data = np.random.default_rng(1).bytes(100_003)
    server.put("bucket", "r.bin", data)
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    rng = np.random.default_rng(2)
    cases = [(f"bytes={a}-{b}", a, b + 1) for a, b in np.sort(rng.integers(0, len(data), (40, 2)), axis=1)]
    cases += [("bytes=0-0", 0, 1), (f"bytes=5-{10**9}", 5, len(data)), ("bytes=99000-", 99000, len(data)),
              ("bytes=-17", len(data) - 17, len(data)), (f"bytes=-{10**9}", 0, len(data))]
    for rng_header, start, stop in cases:
        status, headers, body = _call(server, "GET", "/bucket/r.bin", headers={"Range": rng_header}, conn=conn)
        assert (status, body) == (206, data[start:stop]), rng_header
        assert headers["content-range"] == f"bytes {start}-{stop - 1}/{len(data)}", rng_header
    for past in (f"bytes={len(data)}-", f"bytes={len(data) + 5}-{len(data) + 9}", "bytes=-0"):
        status, headers, body = _call(server, "GET", "/bucket/r.bin", headers={"Range": past}, conn=conn)
        assert status == 416 and headers["content-range"] == f"bytes */{len(data)}", past
        assert b"<Code>InvalidRange</Code>" in body
    for whole in (None, "bytes=9-3", "items=0-4"):  # none, or one it cannot parse: the whole object
        status, headers, body = _call(server, "GET", "/bucket/r.bin", headers={"Range": whole} if whole else {},
                                      conn=conn)
        assert (status, body, "content-range" in headers) == (200, data, False), whole
    status, headers, body = _call(server, "HEAD", "/bucket/r.bin", conn=conn)
    assert (status, int(headers["content-length"]), body) == (200, len(data), b"")
    assert _call(server, "GET", "/bucket/none.bin", conn=conn)[0] == 404


def test_etag_and_if_match(server):
    data = b"the first version"
    server.put("bucket", "e.bin", data)
    tag = f'"{hashlib.md5(data).hexdigest()}"'
    status, headers, _ = _call(server, "HEAD", "/bucket/e.bin")
    assert (status, headers["etag"]) == (200, tag)
    assert _call(server, "GET", "/bucket/e.bin", headers={"If-Match": tag})[::2] == (200, data)
    assert _call(server, "GET", "/bucket/e.bin", headers={"If-Match": tag, "Range": "bytes=4-8"})[::2] == (206, data[4:9])
    status, _, body = _call(server, "GET", "/bucket/e.bin", headers={"If-Match": '"0123"'})
    assert status == 412 and b"<Code>PreconditionFailed</Code>" in body
    assert _call(server, "HEAD", "/bucket/e.bin", headers={"If-Match": '"0123"'})[0] == 412
    # a PUT at a version that is not the object's changes nothing; at its version it replaces it
    assert _call(server, "PUT", "/bucket/e.bin", b"other", headers={"If-Match": '"0123"'})[0] == 412
    assert _call(server, "GET", "/bucket/e.bin")[2] == data
    status, headers, _ = _call(server, "PUT", "/bucket/e.bin", b"second", headers={"If-Match": tag})
    assert (status, headers["etag"]) == (200, f'"{hashlib.md5(b"second").hexdigest()}"')
    assert _call(server, "GET", "/bucket/e.bin", headers={"If-Match": tag})[0] == 412


@pytest.mark.parametrize("page", [1, 3, 1000])
def test_listing_equals_the_keys(server, page):
    """ListObjectsV2 through boto3's paginator (every page, ``page`` keys each), with and without a
    delimiter, against the keys and the folders one level down computed here."""
    for k in KEYS:
        server.put("bucket", k, k.encode())
    s3 = _client(server.endpoint)
    pages = s3.get_paginator("list_objects_v2")
    for prefix in ("", "a/", "a", "many/", "x y/", "none/"):
        listed = [(o["Key"], o["Size"], o["ETag"]) for p in pages.paginate(Bucket="bucket", Prefix=prefix,
                                                                             PaginationConfig={"PageSize": page})
                  for o in p.get("Contents", [])]
        want = [k for k in KEYS if k.startswith(prefix)]
        assert listed == [(k, len(k.encode()), f'"{hashlib.md5(k.encode()).hexdigest()}"') for k in want], prefix
        keys, folders = [], []
        for p in pages.paginate(Bucket="bucket", Prefix=prefix, Delimiter="/", PaginationConfig={"PageSize": page}):
            assert p["KeyCount"] <= page
            keys += [o["Key"] for o in p.get("Contents", [])]
            folders += [c["Prefix"] for c in p.get("CommonPrefixes", [])]
        rests = [k[len(prefix):] for k in want]
        assert keys == [prefix + r for r in rests if "/" not in r], prefix
        assert sorted(folders) == sorted({prefix + r.split("/")[0] + "/" for r in rests if "/" in r}), prefix
        assert len(folders) == len(set(folders)), prefix


def test_boto3_reads_and_uploads(tmp_path):
    """boto3's put, multipart upload (upload_file above its threshold), get (ranged), head and download."""
    from boto3.s3.transfer import TransferConfig

    data = np.random.default_rng(3).bytes((6 << 20) + 17)
    (tmp_path / "big.bin").write_bytes(data)
    (tmp_path / "root").mkdir()
    with S3Server(root=str(tmp_path / "root")) as s:
        s3 = _client(s.endpoint)
        s3.create_bucket(Bucket="bench")
        s3.upload_file(str(tmp_path / "big.bin"), "bench", "d/big.bin",
                       Config=TransferConfig(multipart_threshold=5 << 20, multipart_chunksize=5 << 20))
        assert s.counts()["POST"] == 2  # the upload was made of parts: created and completed
        assert (tmp_path / "root" / "bench" / "d" / "big.bin").read_bytes() == data
        s3.put_object(Bucket="bench", Key="small", Body=b"0123456789")
        assert s3.get_object(Bucket="bench", Key="d/big.bin", Range="bytes=1000-1999")["Body"].read() == data[1000:2000]
        head = s3.head_object(Bucket="bench", Key="d/big.bin")
        assert (head["ContentLength"], head["ETag"]) == (len(data), f'"{hashlib.md5(data).hexdigest()}"')
        s3.download_file("bench", "d/big.bin", str(tmp_path / "back.bin"))
        assert (tmp_path / "back.bin").read_bytes() == data
        assert s3.get_object(Bucket="bench", Key="small")["Body"].read() == b"0123456789"


def test_dali_mesh_reads_through_it(server):
    """dali_mesh's own s3:// client (a path-style endpoint, SigV4) reads a .npy and lists its folder."""
    from dali_mesh.storage import store_of

    want = np.arange(12 * 345, dtype=np.float32).reshape(12, 345)
    buf = io.BytesIO()
    np.save(buf, want)
    server.put("bucket", "d/x.npy", buf.getvalue())
    store, key = store_of("s3://bucket/d/x.npy", {"endpoint_url": server.endpoint, "key": "a", "secret": "b"})
    with store.open_file(key) as f:
        np.testing.assert_array_equal(np.load(f), want)
    objects, _ = store.list("bucket/d/")
    assert [(k, v.size) for k, v in objects] == [("bucket/d/x.npy", len(buf.getvalue()))]
    assert server.counts()["in_flight_max"] >= 1 and server.counts()["GET"] >= 1


def test_latency_bandwidth_and_counts():
    """The latency comes before each answer (control paths excepted), the bandwidth paces each connection,
    and the counts (per kind, body bytes) reset to zero."""
    with S3Server(buckets=["bucket"]) as s:
        s.put("bucket", "m.bin", bytes(1 << 20))
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
        _call(s, "HEAD", "/bucket/m.bin", conn=conn)
        assert _call(s, "POST", CONTROL + "set?latency=0.1&mbps=-4", conn=conn)[0] == 400
        assert (s.latency, s.mbps) == (0, 0)  # a refused setting changes nothing
        assert _call(s, "POST", CONTROL + "set?latency=0.1&mbps=4", conn=conn)[0] == 200
        t0 = time.perf_counter()
        assert _call(s, "HEAD", "/bucket/m.bin", conn=conn)[0] == 200
        t1 = time.perf_counter()
        assert len(_call(s, "GET", "/bucket/m.bin", conn=conn)[2]) == 1 << 20
        t2 = time.perf_counter()
        counts = json.loads(_call(s, "GET", CONTROL + "counts", conn=conn)[2])
        t3 = time.perf_counter()
        assert 0.1 <= t1 - t0 < 0.2 and 0.1 + (1 << 20) / 4e6 <= t2 - t1 < 0.6 and t3 - t2 < 0.05, (t1 - t0, t2 - t1, t3 - t2)
        assert (counts["requests"], counts["HEAD"], counts["GET"], counts["bytes"]) == (3, 2, 1, 1 << 20), counts
        assert json.loads(_call(s, "POST", CONTROL + "reset", conn=conn)[2])["requests"] == 3
        assert s.counts()["requests"] == 0


def test_cli_serves_a_folder(tmp_path):
    """``python benchmarks/s3_server.py --port 0 --root DIR --stdin`` prints its port, serves DIR's files
    and stops when its standard input closes."""
    (tmp_path / "bucket" / "k").mkdir(parents=True)
    data = os.urandom(5000)
    (tmp_path / "bucket" / "k" / "f.bin").write_bytes(data)
    proc = subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "s3_server.py"), "--port", "0", "--root",
                             str(tmp_path), "--stdin"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", "/bucket/k/f.bin", headers={"Range": "bytes=100-"})
        r = conn.getresponse()
        assert (r.status, r.read()) == (206, data[100:])
        conn.close()
    finally:
        proc.stdin.close()
        assert proc.wait(10) == 0


def test_counts_hold_the_answer_just_read():
    """A client that reads the counts right after an answer finds that answer counted (a benchmark reads
    them as soon as its last read returns)."""
    with S3Server(buckets=["bucket"]) as s:
        s.put("bucket", "c.bin", bytes(1000))
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
        seen = []
        for i in range(300):
            _call(s, "GET", "/bucket/c.bin", headers={"Range": "bytes=0-99"}, conn=conn)
            counts = s.counts()
            seen.append((counts["GET"], counts["bytes"]))
    assert seen == [(i + 1, 100 * (i + 1)) for i in range(300)]
