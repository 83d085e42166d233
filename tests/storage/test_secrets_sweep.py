"""Presigned https URLs as locations (issue 40, findings 5 and 6), against a loopback server that behaves
as S3 does for a URL presigned for GET: it answers ranged GETs only when the query carries the signature
and token, and refuses HEAD (403). The URLs are readable (opened by a ranged GET, no HEAD), and the query,
a credential, shows nowhere: plan files, fingerprints, the loader's state dict, the pipeline's
serialization, DEBUG logs, errors, the command line's output and the cache's names."""
from __future__ import annotations

import http.server
import io
import logging
import os
import pickle
import re
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from tests.storage.s3_server import s3_endpoint  # noqa: F401

SIG = "SIGSECRET0123456789abcdef0123456789abcdef0123456789abcdef01234567"
TOK = "TOKSECRET//fedcba9876543210+fedcba9876543210=="
SECRETS = (SIG, TOK, "SIGSECRET", "TOKSECRET")

pytestmark = pytest.mark.timeout(120)


class _Presigned(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    objects: dict = {}
    seen: list = []

    def log_message(self, *args):
        pass

    def _deny(self, code=403):
        body = b"<Error><Code>SignatureDoesNotMatch</Code><Message>The request signature we calculated does not match</Message></Error>"
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self):
        self.seen.append(("HEAD", self.path))
        self._deny()  # S3 refuses HEAD on a URL presigned for GET

    def do_GET(self):
        self.seen.append(("GET", self.path))
        path, _, query = self.path.partition("?")
        params = dict(p.split("=", 1) for p in query.split("&") if "=" in p)
        import urllib.parse

        if urllib.parse.unquote(params.get("X-Amz-Signature", "")) != SIG or \
                urllib.parse.unquote(params.get("X-Amz-Security-Token", "")) != TOK:
            return self._deny()
        data = self.objects.get(path)
        if data is None:
            return self._deny(404)
        m = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
        first, last = (int(m.group(1)), min(int(m.group(2)), len(data) - 1)) if m else (0, len(data) - 1)
        body = data[first:last + 1]
        self.send_response(206 if m else 200)
        if m:
            self.send_header("Content-Range", f"bytes {first}-{last}/{len(data)}")
        self.send_header("ETag", '"etag-%d"' % len(data))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def presigned():
    """``(urls, arrays)``: three ``.npy`` objects behind presigned-style URLs on 127.0.0.1."""
    arrays = [np.arange(6 * 8, dtype="f4").reshape(6, 8) + 100 * t for t in range(3)]
    for t, a in enumerate(arrays):
        buf = io.BytesIO()
        np.save(buf, a)
        _Presigned.objects[f"/bucket/p/{t}.npy"] = buf.getvalue()
    import h5py

    h5 = io.BytesIO()
    with h5py.File(h5, "w") as f:
        f.create_dataset("x", data=np.stack(arrays), chunks=(1, 3, 8), compression="gzip")
    _Presigned.objects["/bucket/p/x.h5"] = h5.getvalue()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Presigned)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    query = (f"X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIDPRESIGN%2F20261204%2Fus-east-1%2Fs3%2Faws4_request"
             f"&X-Amz-Date=20261204T000000Z&X-Amz-Expires=3600&X-Amz-SignedHeaders=host"
             f"&X-Amz-Security-Token={__import__('urllib.parse').parse.quote(TOK, safe='')}&X-Amz-Signature={SIG}")
    urls = [f"http://127.0.0.1:{port}/bucket/p/{t}.npy?{query}" for t in range(3)]
    try:
        yield urls, arrays
    finally:
        server.shutdown()
        server.server_close()


def _clean(blob, what):
    text = blob if isinstance(blob, str) else blob.decode("latin-1")
    for s in SECRETS + ("AKIDPRESIGN",):
        assert s not in text, f"{what} holds {s!r}"


def _checkpointed(src):
    """``make(checkpoint=None)``: a CPU pipeline of the native operator over ``src``, checkpointing on."""
    from nvidia.dali import pipeline_def

    from dali_mesh.fn import read_windows

    def make(checkpoint=None):
        @pipeline_def(batch_size=1, num_threads=1, device_id=None, enable_checkpointing=True)
        def pipe():
            return read_windows(src, fallback=False)

        return pipe(checkpoint=checkpoint)

    return make


def test_presigned_urls_are_read_and_their_query_shows_nowhere(presigned, tmp_path, caplog, process_group):
    from dali_mesh import NumpySource
    from dali_mesh.partition import take_window
    from dali_mesh.storage.remote import have_native_http
    from tests.helpers import one_rank_layout

    if not have_native_http():
        pytest.skip("this build has no libcurl")
    urls, arrays = presigned
    cache = tmp_path / "cache"
    opts = {"retries": 0, "cache_dir": str(cache)}
    caplog.set_level(logging.DEBUG)
    _Presigned.seen.clear()
    src = NumpySource(urls, one_rank_layout(), batch_size=1, shuffle=False, storage_options=opts)
    for i, a in enumerate(arrays):
        np.testing.assert_array_equal(src.read_sample(i)[0], take_window(a, src.region))
    assert not [m for m, _ in _Presigned.seen if m == "HEAD"], _Presigned.seen  # opened by a ranged GET
    _clean(repr(src.fingerprint()), "the fingerprint")
    _clean(repr(list(src.files)), "the source's files")
    assert [str(f) for f in src.files] == [u.split("?")[0] for u in urls]
    pytest.importorskip("nvidia.dali")
    from dali_mesh.pipeline import native
    from dali_mesh.torch import MeshLoader

    plan = native.plan_windows(src)[0].write(str(tmp_path))
    _clean(Path(plan).read_bytes(), "the plan file")

    make = _checkpointed(src)
    p = make()
    p.build()
    _clean(p.serialize(), "pipe.serialize()")
    loader = MeshLoader(make, src.layout)
    got = [b["window"][0].numpy() for b in loader]
    for g, sid in zip(got, range(3)):
        np.testing.assert_array_equal(g, take_window(arrays[sid], src.region))
    _clean(pickle.dumps(loader.state_dict()), "MeshLoader.state_dict()")
    loader.close()
    # the cache's entries hold no query, in their names or their bytes
    for root, _, names in os.walk(cache):
        for n in names:
            _clean(n, "a cache entry's name")
            _clean(Path(root, n).read_bytes(), "a cache entry")
    # HDF5 behind a presigned URL: planned and read without a HEAD (h5py's reads, the plan's version)
    from dali_mesh import HDF5Source

    _Presigned.seen.clear()
    h5src = HDF5Source([urls[0].replace("/0.npy", "/x.h5")], "x", one_rank_layout(), batch_size=1, shuffle=False,
                       storage_options=opts)
    for i, a in enumerate(arrays):
        np.testing.assert_array_equal(h5src.read_sample(i)[0], take_window(a, h5src.region))
    _clean(Path(native.plan_windows(h5src)[0].write(str(tmp_path))).read_bytes(), "the HDF5 plan file")
    assert not [m for m, _ in _Presigned.seen if m == "HEAD"], _Presigned.seen
    _clean(caplog.text, "the logs at DEBUG")
    # an error (an object that is not there) names the URL without its query
    from dali_mesh.storage import DataFileError

    with pytest.raises(DataFileError) as info:
        NumpySource([urls[0].replace("/0.npy", "/missing.npy")], one_rank_layout(), storage_options=opts)
    _clean(str(info.value), "an error")
    assert "/bucket/p/missing.npy" in str(info.value)


def test_the_command_line_plans_a_presigned_url_and_shows_no_query(presigned):
    urls, _ = presigned
    out = subprocess.run([sys.executable, "-m", "dali_mesh.cli", "plan", "--data", urls[1], "--mesh", "mp=2",
                          "--shard", "mp=0"], capture_output=True, text=True, timeout=90,
                         cwd=Path(__file__).parents[2])
    _clean(out.stdout + out.stderr, "the command line's output")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "/bucket/p/1.npy" in out.stdout


def test_no_s3_secret_in_plans_state_dicts_serialize_logs_errors_or_the_cache(s3_endpoint, tmp_path, monkeypatch,
                                                                              caplog, process_group):
    """The same sweep for S3 keys and a session token given as storage_options: key id, secret and token
    (and the signer's input) absent from plans, fingerprints, the loader's state dict, pipe.serialize(),
    DEBUG logs, errors and the cache's entries."""
    pytest.importorskip("nvidia.dali")
    from dali_mesh import NumpySource
    from dali_mesh.pipeline import native
    from dali_mesh.storage import DataFileError
    from dali_mesh.storage.remote import have_native_http
    from dali_mesh.torch import MeshLoader
    from tests.helpers import one_rank_layout
    from tests.storage.s3_server import client

    if not have_native_http():
        pytest.skip("this build has no libcurl")
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    key, secret, token = "AKIDSWEEPKEY00000000", "sweep-secret-0123456789abcdef0123456789", "SWEEPTOKEN+/=0123456789"
    locations = []
    for t in range(2):
        buf = io.BytesIO()
        np.save(buf, np.full((4, 6), t, "f4"))
        client(s3_endpoint).put_object(Bucket="data", Key=f"sweep/{t}.npy", Body=buf.getvalue())
        locations.append(f"s3://data/sweep/{t}.npy")
    opts = {"key": key, "secret": secret, "token": token, "endpoint_url": s3_endpoint, "retries": 0,
            "cache_dir": str(tmp_path / "cache")}
    caplog.set_level(logging.DEBUG)
    src = NumpySource(locations, one_rank_layout(), batch_size=1, shuffle=False, storage_options=opts)
    texts = [repr(src.fingerprint()), repr(list(src.files)), Path(native.plan_windows(src)[0].write(str(tmp_path))).read_bytes()]

    make = _checkpointed(src)
    p = make()
    p.build()
    texts.append(p.serialize())
    loader = MeshLoader(make, src.layout)
    assert [float(b["window"][0].numpy()[0, 0]) for b in loader] == [0.0, 1.0]
    state = loader.state_dict()
    texts.append(pickle.dumps(state))
    loader.close()
    # a checkpoint loads with torch.load's defaults (weights_only): its fingerprint is plain data
    import torch

    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    assert torch.load(buf)["fingerprint"] == state["fingerprint"]
    with pytest.raises(DataFileError) as info:
        NumpySource(["s3://data/sweep/missing.npy"], one_rank_layout(), storage_options=opts)
    texts += [str(info.value), caplog.text]
    for root, _, names in os.walk(tmp_path / "cache"):
        texts += names + [Path(root, n).read_bytes() for n in names]
    for text in texts:
        blob = text if isinstance(text, str) else text.decode("latin-1")
        for s in (key, secret, token, "SWEEPTOKEN"):
            assert s not in blob, s
