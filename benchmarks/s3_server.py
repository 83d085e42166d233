"""An S3-compatible server on 127.0.0.1 for the benchmarks only: it answers requests side by side, as S3
does, where moto answers one at a time (~8 ms each here), so that a reader's concurrency is what a
benchmark measures. Never for the tests of correctness or of signatures (moto's ``tests/storage/s3_server.py``
is): **the Authorization header is not verified** (SigV4-signed requests are accepted with any key and
any signature, and so are unsigned ones), and nothing here checks what a real S3 would refuse.

    python benchmarks/s3_server.py --port 0 --latency 0.02 --mbps 100 --root DIR [--bucket NAME] [--stdin]

prints the port it listens on (on 127.0.0.1, never any other address) and serves until it is
interrupted (or, with ``--stdin``, until its standard input closes: a parent process's way). In the
same process: ``with S3Server(root=DIR, latency=0.02) as s: s.endpoint, s.counts(), s.reset()``.

What it answers (path-style addressing, ``http://127.0.0.1:PORT/BUCKET/KEY``; a client given this
endpoint uses it, as dali_mesh, tensorstore, boto3, s3fs and obstore do):
  GET object       200 with the whole object, or 206 for ``Range: bytes=a-b``, ``bytes=a-``, ``bytes=-n``
                   (with ``Content-Range``; 416 when it starts past the end; a Range it cannot parse is
                   ignored, as RFC 9110 says); ``ETag`` the md5 hex of the bytes, in quotes
  HEAD object      the same headers, no body
  If-Match         on GET, HEAD and PUT: 412 PreconditionFailed when the object's ETag differs
  PUT object       stores the body (plain, HTTP-chunked or aws-chunked), answers its ETag
  multipart upload create, part, complete, abort (boto3's ``upload_file`` above 8 MB); the object's
                   ETag is the md5 of all its bytes, not S3's md5 of the parts' md5s
  ListObjectsV2    ``GET /BUCKET?list-type=2`` with prefix, delimiter, max-keys (at most 1000),
                   continuation-token, start-after, encoding-type=url; XML as S3 writes it
  PUT / HEAD bucket  creates a bucket / says whether it exists
Objects live in memory or, with ``root``, as files ``ROOT/BUCKET/KEY`` (each file's md5 is computed
when the server starts or when the file changes, never while a timed request waits; bodies go out by
``sendfile``).

What it adds, for a benchmark: ``latency`` seconds slept before each answer's first byte (a sleep, no
CPU: requests in flight wait side by side); ``mbps``, at most that many MB/s per connection (the body
sent in 64 KiB slices, each when a link of that rate would have delivered it: an object store's
throughput is per connection); ``shared_mbps``, one link of that many MB/s that every connection's
slices cross in turn (a rank's share of a node's network interface: there, bytes are time whatever the
connections). Each connection has a thread of its own (HTTP/1.1 keep-alive, ``TCP_NODELAY``: without
it a small answer waits ~40 ms for the client's delayed ACK), so requests in flight are bounded by the
client's connections, not the server. Counters, not counted themselves and answered without the latency:

  GET  /__bench__/counts                   requests and body bytes sent: in all, and per kind (GET, HEAD,
                                           LIST, PUT, POST, other), the most in flight at once, the
                                           server process's CPU seconds: all since the last reset (JSON)
  POST /__bench__/reset                    the counts (as above), then zero (GET too: a plain urlopen)
  POST /__bench__/set?latency=S&mbps=M&shared_mbps=L
                                           a new latency, bandwidth or shared link (for every connection,
                                           kept ones too)

Its cost, measured on this 2-core VM (2026-12-05, 64 client threads of ``http.client`` with kept
connections, 1000 GETs of 4 KiB ranges of a 1 MiB object, latency 0; ``python benchmarks/s3_server.py
--measure``, three runs): 0.11-0.12 ms of the server's CPU per request (its process's user + system
time), against ~8 ms of moto's; with latency 0.2 s, 64 requests sent at once were all in flight
together (the counts' ``in_flight_max``: 64) and all answered in 0.21 s.
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import re
import signal
import socket
import stat
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from dataclasses import dataclass
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from xml.sax.saxutils import escape

HOST = "127.0.0.1"
CONTROL = "/__bench__/"  # not a bucket's path: bucket names have no underscore
KINDS = ("GET", "HEAD", "LIST", "PUT", "POST", "other")
SLICE = 64 << 10  # bytes sent between two sleeps of the bandwidth's pace
MAX_KEYS = 1000  # S3's most keys in a listing's page
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_RANGE = re.compile(r"bytes=(\d*)-(\d*)")
_REASONS = {200: "OK", 204: "No Content", 206: "Partial Content", 400: "Bad Request", 404: "Not Found",
            412: "Precondition Failed", 416: "Range Not Satisfiable", 501: "Not Implemented"}
_XMLNS = "http://s3.amazonaws.com/doc/2006-03-01/"


class S3Error(Exception):
    """An answer with S3's XML error body: ``status``, S3's ``code``, a message for the client."""

    def __init__(self, status: int, code: str, message: str, extra: dict | None = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message, self.extra = status, code, message, extra or {}


@dataclass(frozen=True)
class Stored:
    """One object's version: its size, ETag (md5 hex in quotes), modification time, and its bytes
    (in memory) or the file that holds them."""
    size: int
    etag: str
    mtime: float
    data: bytes | None = None
    path: str | None = None


def _etag(data) -> str:
    return f'"{hashlib.md5(data).hexdigest()}"'


def _check_bucket(bucket: str) -> None:
    if not _BUCKET.fullmatch(bucket):
        raise S3Error(400, "InvalidBucketName", f"the bucket name {bucket!r} is not one S3 accepts (3-63 "
                      "characters of a-z, 0-9, '.' and '-')", {"BucketName": bucket})


class MemoryObjects:
    """Objects kept in memory: ``bucket -> key -> Stored``."""

    def __init__(self) -> None:
        self._buckets: dict[str, dict[str, Stored]] = {}
        self._lock = threading.Lock()

    def has_bucket(self, bucket: str) -> bool:
        return bucket in self._buckets

    def make_bucket(self, bucket: str) -> None:
        _check_bucket(bucket)
        with self._lock:
            self._buckets.setdefault(bucket, {})

    def get(self, bucket: str, key: str) -> Stored | None:
        return self._objects(bucket).get(key)

    def put(self, bucket: str, key: str, data: bytes) -> Stored:
        objects = self._objects(bucket)
        stored = Stored(len(data), _etag(data), time.time(), data=bytes(data))
        with self._lock:
            objects[key] = stored
        return stored

    def keys(self, bucket: str, prefix: str) -> list[tuple[str, Stored]]:
        """The bucket's objects whose keys start with ``prefix``, in S3's order (the keys' UTF-8 bytes)."""
        items = [(k, s) for k, s in list(self._objects(bucket).items()) if k.startswith(prefix)]
        return sorted(items, key=lambda item: item[0].encode())

    def _objects(self, bucket: str) -> dict[str, Stored]:
        objects = self._buckets.get(bucket)
        if objects is None:
            raise S3Error(404, "NoSuchBucket", f"no bucket {bucket!r} on this server", {"BucketName": bucket})
        return objects


class FolderObjects:
    """Objects as the files of a folder: bucket ``b``'s key ``k/x`` is ``ROOT/b/k/x``. ETags (md5) are
    kept per file and computed again only when its size or modification time changes; every file's is
    computed when the server starts, so that a timed request never waits for one."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        if not os.path.isdir(self.root):
            raise NotADirectoryError(f"the server's root {self.root!r} is not a folder: make it, or leave --root "
                                     "out to keep the objects in memory")
        self._tags: dict[str, tuple[int, int, str]] = {}
        self._lock = threading.Lock()
        for bucket in os.listdir(self.root):
            if self.has_bucket(bucket):
                self.keys(bucket, "")

    def has_bucket(self, bucket: str) -> bool:
        return _BUCKET.fullmatch(bucket) is not None and os.path.isdir(os.path.join(self.root, bucket))

    def make_bucket(self, bucket: str) -> None:
        _check_bucket(bucket)
        os.makedirs(os.path.join(self.root, bucket), exist_ok=True)

    def get(self, bucket: str, key: str) -> Stored | None:
        path = self._path(bucket, key)
        if path is None:
            return None
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        known = self._tags.get(path)
        if known is None or known[:2] != (st.st_size, st.st_mtime_ns):
            with open(path, "rb") as f:
                known = (st.st_size, st.st_mtime_ns, _etag(f.read()))
            with self._lock:
                self._tags[path] = known
        return Stored(st.st_size, known[2], st.st_mtime, path=path)

    def put(self, bucket: str, key: str, data: bytes) -> Stored:
        path = self._path(bucket, key)
        if path is None:
            raise S3Error(400, "InvalidArgument", f"the key {key!r} cannot be a file under the server's root "
                          "(an empty, '.' or '..' part): serve it from memory instead (no --root)", {"Key": key})
        os.makedirs(os.path.dirname(path), exist_ok=True)
        # written beside the buckets (the root holds no object), then renamed: a reader sees the old
        # bytes or the new, never a part
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".put-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        return self.get(bucket, key)

    def keys(self, bucket: str, prefix: str) -> list[tuple[str, Stored]]:
        """As :meth:`MemoryObjects.keys`; walks only the folder of the prefix's last ``/``."""
        if not self.has_bucket(bucket):
            raise S3Error(404, "NoSuchBucket", f"no bucket {bucket!r} (no folder {bucket!r} in the server's root "
                          f"{self.root})", {"BucketName": bucket})
        base = os.path.join(self.root, bucket)
        start = os.path.join(base, prefix.rpartition("/")[0])
        items = []
        for folder, _, files in os.walk(start):
            for name in files:
                key = os.path.relpath(os.path.join(folder, name), base).replace(os.sep, "/")
                stored = self.get(bucket, key) if key.startswith(prefix) else None
                if stored is not None:
                    items.append((key, stored))
        return sorted(items, key=lambda item: item[0].encode())

    def _path(self, bucket: str, key: str) -> str | None:
        """The file of ``bucket/key``, or None for a key no file can hold (an empty, ``.`` or ``..`` part:
        never a path outside the bucket's folder)."""
        _check_bucket(bucket)
        parts = key.split("/")
        if any(p in ("", ".", "..") for p in parts):
            return None
        return os.path.join(self.root, bucket, *parts)


class _Counts:
    """Requests and body bytes per kind since the last reset, the most in flight at once, and the
    process's CPU time at the reset. A request is counted when it comes and its body bytes before they
    are sent: a client that reads the counts after its last answer finds that answer in them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.in_flight = 0
        self._zero()

    def _zero(self) -> None:
        self.requests = dict.fromkeys(KINDS, 0)
        self.bytes = dict.fromkeys(KINDS, 0)
        self.received = self.in_flight_max = 0
        self.cpu0 = _cpu_seconds()

    def begin(self, kind: str) -> None:
        with self._lock:
            self.requests[kind] += 1
            self.in_flight += 1
            self.in_flight_max = max(self.in_flight_max, self.in_flight)

    def add(self, kind: str, sent: int = 0, received: int = 0) -> None:
        with self._lock:
            self.bytes[kind] += sent
            self.received += received

    def end(self) -> None:
        with self._lock:
            self.in_flight -= 1

    def snapshot(self, reset: bool = False) -> dict:
        with self._lock:
            out = {"requests": sum(self.requests.values()), "bytes": sum(self.bytes.values()), **self.requests,
                   "bytes_of": dict(self.bytes), "received": self.received, "in_flight_max": self.in_flight_max,
                   "cpu_seconds": _cpu_seconds() - self.cpu0}
            if reset:
                self._zero()
                self.in_flight_max = self.in_flight
        return out


def _cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # kept connections, as every S3 client keeps them
    server_version = "dali-mesh-bench-s3"

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format, *args) -> None:  # a line per request would cost more than the answer
        pass

    def do_GET(self) -> None:
        self._serve()

    do_HEAD = do_PUT = do_POST = do_DELETE = do_GET

    def _serve(self) -> None:
        owner: S3Server = self.server.owner
        url = urllib.parse.urlsplit(self.path)
        if url.path.startswith(CONTROL):
            self._control(owner, url)
            return
        bucket, _, key = urllib.parse.unquote(url.path).lstrip("/").partition("/")
        query = urllib.parse.parse_qs(url.query, keep_blank_values=True)
        kind = self.command if self.command in KINDS else "other"
        if kind == "GET" and not key:
            kind = "LIST"
        owner.counter.begin(kind)
        self._kind = kind
        try:
            try:
                self._s3(owner, bucket, key, {k: v[-1] for k, v in query.items()})
            except S3Error as e:
                self._error(e, bucket, key)
        finally:
            owner.counter.end()

    # ---- S3's operations -----------------------------------------------------------------------------------
    def _s3(self, owner: "S3Server", bucket: str, key: str, query: dict) -> None:
        objects = owner.objects
        body = self._body() if self.command in ("PUT", "POST") else b""
        if not bucket:
            raise S3Error(501, "NotImplemented", "this benchmark server lists no buckets: name one in the path")
        if not key:
            if self.command == "GET" and query.get("list-type") == "2":
                return self._answer(200, [("Content-Type", "application/xml")], self._list(objects, bucket, query))
            if self.command == "PUT":
                objects.make_bucket(bucket)
                return self._answer(200, [("Location", f"/{bucket}")])
            if self.command == "HEAD":
                return self._answer(200 if objects.has_bucket(bucket) else 404, [])
            raise S3Error(501, "NotImplemented", f"{self.command} of a bucket with {sorted(query)}: this benchmark "
                          "server lists with ListObjectsV2 (list-type=2) only")
        if "uploadId" in query or "uploads" in query:
            return self._multipart(owner, bucket, key, query, body)
        if self.command == "PUT":
            self._if_match(objects.get(bucket, key), bucket, key)
            stored = objects.put(bucket, key, body)
            return self._answer(200, [("ETag", stored.etag)])
        if self.command not in ("GET", "HEAD"):
            raise S3Error(501, "NotImplemented", f"{self.command} of an object: this benchmark server answers GET, "
                          "HEAD, PUT and multipart uploads")
        stored = objects.get(bucket, key)
        if stored is None:
            raise S3Error(404, "NoSuchKey", f"no object {key!r} in bucket {bucket!r}", {"Key": key})
        self._if_match(stored, bucket, key)
        start, stop = 0, stored.size
        headers = [("ETag", stored.etag), ("Last-Modified", formatdate(stored.mtime, usegmt=True)),
                   ("Accept-Ranges", "bytes"), ("Content-Type", "application/octet-stream")]
        span = _range(self.headers.get("Range"), stored.size)
        if span is not None:
            start, stop = span
            headers.append(("Content-Range", f"bytes {start}-{stop - 1}/{stored.size}"))
        self._answer(206 if span else 200, headers, stored=stored, start=start, stop=stop)

    def _if_match(self, stored: Stored | None, bucket: str, key: str) -> None:
        want = self.headers.get("If-Match")
        if want is None:
            return
        if stored is None:
            raise S3Error(404, "NoSuchKey", f"no object {key!r} in bucket {bucket!r} (If-Match {want})", {"Key": key})
        tags = {t.strip() for t in want.split(",")}
        if "*" not in tags and stored.etag not in tags and stored.etag.strip('"') not in tags:
            raise S3Error(412, "PreconditionFailed", f"the object's ETag is {stored.etag}, not If-Match's {want}",
                          {"Condition": "If-Match"})

    def _list(self, objects, bucket: str, q: dict) -> bytes:
        prefix, delimiter = q.get("prefix", ""), q.get("delimiter", "")
        try:
            max_keys = min(int(q.get("max-keys", MAX_KEYS)), MAX_KEYS)
        except ValueError:
            raise S3Error(400, "InvalidArgument", f"max-keys {q['max-keys']!r} is not a number") from None
        token = q.get("continuation-token")
        after = q.get("start-after", "")
        if token is not None:
            try:
                after = base64.urlsafe_b64decode(token.encode()).decode()
            except ValueError:
                raise S3Error(400, "InvalidArgument", "the continuation token is not one this server gave") from None
        encode = (lambda s: urllib.parse.quote(s, safe="/")) if q.get("encoding-type") == "url" else (lambda s: s)
        contents, prefixes, last, truncated = [], [], None, False
        for key, stored in objects.keys(bucket, prefix):
            # the last item of the page before: a key, or a common prefix that holds every key below it
            if after and (key.encode() <= after.encode() or (delimiter and after.endswith(delimiter)
                                                             and key.startswith(after))):
                continue
            rest = key[len(prefix):]
            cut = rest.find(delimiter) if delimiter else -1
            item = prefix + rest[:cut + len(delimiter)] if cut >= 0 else key
            if cut >= 0 and prefixes and prefixes[-1] == item:
                continue
            if len(contents) + len(prefixes) >= max_keys:
                truncated = True
                break
            (prefixes.append(item) if cut >= 0 else contents.append((key, stored)))
            last = item
        out = [f'<?xml version="1.0" encoding="UTF-8"?>\n<ListBucketResult xmlns="{_XMLNS}">',
               f"<Name>{escape(bucket)}</Name><Prefix>{escape(encode(prefix))}</Prefix>",
               f"<KeyCount>{len(contents) + len(prefixes)}</KeyCount><MaxKeys>{max_keys}</MaxKeys>",
               f"<IsTruncated>{'true' if truncated else 'false'}</IsTruncated>"]
        if delimiter:
            out.append(f"<Delimiter>{escape(encode(delimiter))}</Delimiter>")
        if q.get("encoding-type") == "url":
            out.append("<EncodingType>url</EncodingType>")
        if token is not None:
            out.append(f"<ContinuationToken>{escape(token)}</ContinuationToken>")
        elif after:
            out.append(f"<StartAfter>{escape(encode(after))}</StartAfter>")
        if truncated:
            nxt = base64.urlsafe_b64encode(last.encode()).decode()
            out.append(f"<NextContinuationToken>{nxt}</NextContinuationToken>")
        for key, stored in contents:
            when = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(stored.mtime))
            out.append(f"<Contents><Key>{escape(encode(key))}</Key><LastModified>{when}</LastModified>"
                       f"<ETag>{escape(stored.etag)}</ETag><Size>{stored.size}</Size>"
                       "<StorageClass>STANDARD</StorageClass></Contents>")
        out += [f"<CommonPrefixes><Prefix>{escape(encode(p))}</Prefix></CommonPrefixes>" for p in prefixes]
        out.append("</ListBucketResult>")
        return "".join(out).encode()

    def _multipart(self, owner: "S3Server", bucket: str, key: str, q: dict, body: bytes) -> None:
        if not owner.objects.has_bucket(bucket):
            raise S3Error(404, "NoSuchBucket", f"no bucket {bucket!r} on this server", {"BucketName": bucket})
        xml = [("Content-Type", "application/xml")]
        if self.command == "POST" and "uploads" in q:
            upload = uuid.uuid4().hex
            with owner.lock:
                owner.uploads[upload] = {}
            return self._answer(200, xml, (f'<?xml version="1.0" encoding="UTF-8"?>\n<InitiateMultipartUploadResult '
                                           f'xmlns="{_XMLNS}"><Bucket>{escape(bucket)}</Bucket><Key>{escape(key)}</Key>'
                                           f"<UploadId>{upload}</UploadId></InitiateMultipartUploadResult>").encode())
        parts = owner.uploads.get(q["uploadId"])
        if parts is None:
            raise S3Error(404, "NoSuchUpload", f"no multipart upload {q['uploadId']!r} (completed or aborted)")
        if self.command == "PUT":
            parts[int(q.get("partNumber", "0"))] = body
            return self._answer(200, [("ETag", _etag(body))])
        if self.command == "DELETE":
            owner.uploads.pop(q["uploadId"], None)
            return self._answer(204, [])
        if self.command == "POST":
            numbers = [int(n) for n in re.findall(rb"<PartNumber>\s*(\d+)\s*</PartNumber>", body)]
            missing = [n for n in numbers if n not in parts]
            if missing:
                raise S3Error(400, "InvalidPart", f"parts {missing} of upload {q['uploadId']!r} were never uploaded")
            stored = owner.objects.put(bucket, key, b"".join(parts[n] for n in numbers))
            owner.uploads.pop(q["uploadId"], None)
            return self._answer(200, xml, (f'<?xml version="1.0" encoding="UTF-8"?>\n<CompleteMultipartUploadResult '
                                           f'xmlns="{_XMLNS}"><Bucket>{escape(bucket)}</Bucket><Key>{escape(key)}</Key>'
                                           f"<ETag>{escape(stored.etag)}</ETag></CompleteMultipartUploadResult>").encode())
        raise S3Error(501, "NotImplemented", f"{self.command} of a multipart upload")

    # ---- the wire --------------------------------------------------------------------------------------------
    def _body(self) -> bytes:
        """The request's body: by Content-Length or HTTP chunks, then undone from aws-chunked (SigV4's
        streaming signatures: ``SIZE;chunk-signature=...`` lines, trailers after the last)."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            raw = _unchunk(self.rfile.readline, self.rfile.read)
        else:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.owner.counter.add(self._kind, received=len(raw))
        streaming = self.headers.get("x-amz-content-sha256", "").startswith("STREAMING-")
        if streaming or "aws-chunked" in self.headers.get("Content-Encoding", ""):
            pos = [0]

            def readline():
                end = raw.index(b"\n", pos[0]) + 1
                line, pos[0] = raw[pos[0]:end], end
                return line

            def read(n):
                out, pos[0] = raw[pos[0]:pos[0] + n], pos[0] + n
                return out

            raw = _unchunk(readline, read)
        return raw

    def _error(self, e: S3Error, bucket: str, key: str) -> None:
        extra = "".join(f"<{k}>{escape(str(v))}</{k}>" for k, v in e.extra.items())
        body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{e.code}</Code><Message>{escape(e.message)}'
                f"</Message>{extra}<Resource>/{escape(bucket)}/{escape(key)}</Resource></Error>").encode()
        headers = [("Content-Type", "application/xml")]
        if e.status == 416:
            headers.append(("Content-Range", f"bytes */{e.extra['ActualObjectSize']}"))
        self._answer(e.status, headers, body)

    def _answer(self, status: int, headers: list, body: bytes = b"", stored: Stored | None = None,
                start: int = 0, stop: int = 0) -> None:
        """Sends the status line, ``headers`` and the body (``body``, or bytes [start, stop) of ``stored``)
        after the latency; the head and a small body in one write."""
        owner: S3Server = self.server.owner
        if owner.latency > 0:
            time.sleep(owner.latency)
        n = len(body) if stored is None else stop - start
        lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}", f"Server: {self.server_version}",
                 *(f"{k}: {v}" for k, v in headers), f"Content-Length: {n}"]
        if self.close_connection:
            lines.append("Connection: close")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        sock = self.connection
        if self.command == "HEAD" or n == 0:
            sock.sendall(head)
            return
        owner.counter.add(self._kind, sent=n)
        if stored is None:
            source, start, stop = memoryview(body), 0, n
        else:
            source = None if stored.data is None else memoryview(stored.data)
        if source is not None and n <= SLICE:
            self._pace(n, n, time.monotonic())
            sock.sendall(head + source[start:stop])
        else:
            sock.sendall(head)
            if source is not None:
                self._send(source, start, stop)
            else:
                with open(stored.path, "rb") as f:
                    self._send(f, start, stop)

    def _send(self, source, start: int, stop: int) -> None:
        """Bytes [start, stop) of ``source`` (a memoryview, or a file sent by ``sendfile``), paced to the
        server's bandwidth per connection, if it has one: each slice goes out when a link of that rate
        would have delivered it, so the last byte arrives (stop - start) / rate after the first; and to
        its shared link, if it has one: each slice also waits for its turn on the one link that every
        connection's slices cross in the order they come (:class:`SharedLink`)."""
        owner = self.server.owner
        sock = self.connection
        step = SLICE if owner.mbps > 0 or owner.shared_mbps > 0 else stop - start
        t0 = time.monotonic()
        for k in range(start, stop, step):
            n = min(step, stop - k)
            self._pace(k + n - start, n, t0)
            if isinstance(source, memoryview):
                sock.sendall(source[k:k + n])
            else:
                sock.sendfile(source, k, n)

    def _pace(self, through: int, n: int, t0: float) -> None:
        """Wait until a slice of ``n`` bytes, the last of the first ``through`` bytes of a body whose first
        slice went out at ``t0``, would have arrived over the connection's link and the shared one."""
        owner = self.server.owner
        rate, shared = owner.mbps * 1e6, owner.shared_mbps * 1e6
        due = t0 + through / rate if rate > 0 else 0.0
        if shared > 0:
            due = max(due, owner.link.deliver(n, shared))
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(wait)

    def _control(self, owner: "S3Server", url) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))  # a POST's body (unused), off the connection
        what, status = url.path[len(CONTROL):], 200
        if what == "counts":
            out = owner.counts()
        elif what == "reset":
            out = owner.reset()
        elif what == "set":
            q = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query).items()}
            try:
                owner.configure(latency=float(q.get("latency", owner.latency)), mbps=float(q.get("mbps", owner.mbps)),
                                shared_mbps=float(q.get("shared_mbps", owner.shared_mbps)))
                out = {"latency": owner.latency, "mbps": owner.mbps, "shared_mbps": owner.shared_mbps}
            except ValueError as e:
                out, status = {"error": f"{url.path}?{url.query}: {e}"}, 400
        else:
            out, status = {"error": f"no control path {url.path!r}: {CONTROL}counts, {CONTROL}reset, {CONTROL}set"}, 404
        body = json.dumps(out).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _range(header: str | None, size: int) -> tuple[int, int] | None:
    """``[start, stop)`` of a ``Range`` header on an object of ``size`` bytes; None for none or one that
    cannot be parsed (the whole object, as RFC 9110 says); S3Error 416 for one that starts past the end."""
    m = _RANGE.fullmatch((header or "").strip())
    if m is None or m.group(1) == m.group(2) == "":
        return None
    first, last = m.group(1), m.group(2)
    if first == "":  # bytes=-n: the last n bytes
        start, stop = max(0, size - int(last)), size
        if int(last) == 0 or size == 0:
            raise _unsatisfiable(header, size)
        return start, stop
    start = int(first)
    stop = size if last == "" else min(size, int(last) + 1)
    if last != "" and int(last) < start:
        return None
    if start >= size:
        raise _unsatisfiable(header, size)
    return start, stop


def _unsatisfiable(header: str, size: int) -> S3Error:
    return S3Error(416, "InvalidRange", f"the range {header!r} is not satisfiable: the object has {size} bytes",
                   {"RangeRequested": header, "ActualObjectSize": size})


def _unchunk(readline, read) -> bytes:
    """The data of chunked encoding (HTTP's or aws-chunked's): ``HEX[;ext]\\r\\n DATA\\r\\n``, up to a
    0-size chunk and its trailers."""
    out = []
    while True:
        size = int(readline().split(b";")[0].strip() or b"0", 16)
        if size == 0:
            while readline().strip():  # trailers (aws-chunked's checksum), up to an empty line
                pass
            return b"".join(out)
        out.append(read(size))
        read(2)


class SharedLink:
    """One link of a given rate that every connection's bodies cross, a slice at a time, in the order
    they come (a rank's share of a node's network interface, or of a bucket's throughput): each slice
    is delivered when the link has sent every slice before it and then this one's bytes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free_at = 0.0

    def deliver(self, nbytes: int, rate: float) -> float:
        """The ``time.monotonic()`` at which ``nbytes`` sent now at ``rate`` bytes/s arrive."""
        with self._lock:
            start = max(time.monotonic(), self._free_at)
            self._free_at = start + nbytes / rate
            return self._free_at


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = 1024  # 64+ clients connecting at once: a short backlog drops SYNs (1 s retries)

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client gone with a kept connection
            super().handle_error(request, client_address)


class S3Server:
    """The server in this process: objects from ``root`` (files ``ROOT/BUCKET/KEY``) or from memory
    (None), ``latency`` seconds before each answer's first byte, at most ``mbps`` MB/s per connection
    (0: unlimited), on 127.0.0.1:``port`` (0: any free one)."""

    def __init__(self, root: str | None = None, latency: float = 0.0, mbps: float = 0.0, port: int = 0,
                 buckets=(), shared_mbps: float = 0.0) -> None:
        self.objects = FolderObjects(root) if root is not None else MemoryObjects()
        for b in buckets:
            self.objects.make_bucket(b)
        self.latency = self.mbps = self.shared_mbps = 0.0
        self.link = SharedLink()
        self.configure(latency=latency, mbps=mbps, shared_mbps=shared_mbps)
        self.counter = _Counts()
        self.lock = threading.Lock()
        self.uploads: dict[str, dict[int, bytes]] = {}
        self._server = _Server((HOST, port), _Handler)
        self._server.owner = self
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self) -> "S3Server":
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="bench-s3-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> "S3Server":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def configure(self, latency: float | None = None, mbps: float | None = None,
                  shared_mbps: float | None = None) -> None:
        """A new latency (seconds), bandwidth (MB/s per connection, 0: unlimited) or shared link (MB/s for
        every connection together, 0: none), for the next answers."""
        given = {k: v for k, v in (("latency", latency), ("mbps", mbps), ("shared_mbps", shared_mbps))
                 if v is not None}
        for name, value in given.items():  # all checked before any is changed
            if not value >= 0:
                raise ValueError(f"the benchmark server's {name} must be a number >= 0, got {value!r}")
        for name, value in given.items():
            setattr(self, name, float(value))

    def counts(self) -> dict:
        """Requests and body bytes since the last reset (see the module's docstring)."""
        return self.counter.snapshot()

    def reset(self) -> dict:
        """The counts, then zero."""
        return self.counter.snapshot(reset=True)

    def make_bucket(self, bucket: str) -> None:
        self.objects.make_bucket(bucket)

    def put(self, bucket: str, key: str, data: bytes) -> Stored:
        return self.objects.put(bucket, key, data)


def measure(requests: int = 1000, clients: int = 64) -> dict:
    """The server's CPU per request (``requests`` GETs of 4 KiB ranges of a 1 MiB object, latency 0,
    ``clients`` threads with a kept connection each) and the concurrency it reaches (``clients``
    requests sent at once, latency 0.2 s): the numbers of the module's docstring. The server runs in a
    process of its own (``--stdin``), so that its CPU time is its own."""
    import http.client
    import subprocess
    from concurrent.futures import ThreadPoolExecutor

    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--port", "0", "--stdin"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        local = threading.local()

        def call(method, path, body=None, headers=None):
            if getattr(local, "conn", None) is None:
                local.conn = http.client.HTTPConnection(HOST, port, timeout=60)
            local.conn.request(method, path, body=body, headers=headers or {})
            r = local.conn.getresponse()
            return r.status, r.read()

        call("PUT", "/bench")
        call("PUT", "/bench/obj", os.urandom(1 << 20))
        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(lambda i: call("GET", "/bench/obj"), range(clients)))  # every connection made
            call("POST", CONTROL + "reset")
            list(pool.map(lambda i: call("GET", "/bench/obj", headers={"Range": f"bytes={i * 4096}-{i * 4096 + 4095}"}),
                          range(requests)))
            cost = json.loads(call("POST", CONTROL + "reset")[1])
            call("POST", CONTROL + "set?latency=0.2")
            t0 = time.perf_counter()
            list(pool.map(lambda i: call("GET", "/bench/obj", headers={"Range": "bytes=0-4095"}), range(clients)))
            wall = time.perf_counter() - t0
            together = json.loads(call("GET", CONTROL + "counts")[1])
    finally:
        proc.stdin.close()
        proc.wait(30)
    return {"requests": cost["GET"], "cpu_ms_per_request": cost["cpu_seconds"] / cost["GET"] * 1e3,
            "clients": clients, "in_flight_max": together["in_flight_max"], "seconds_for_clients_at_0.2s": wall}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=0, help="on 127.0.0.1; 0: a free one (printed)")
    ap.add_argument("--latency", type=float, default=0.0, help="seconds before each answer's first byte")
    ap.add_argument("--mbps", type=float, default=0.0, help="MB/s per connection (0: unlimited)")
    ap.add_argument("--shared-mbps", type=float, default=0.0,
                    help="MB/s of one link every connection shares (0: none)")
    ap.add_argument("--root", help="serve the files ROOT/BUCKET/KEY (default: objects in memory)")
    ap.add_argument("--bucket", action="append", default=[], help="a bucket to make (repeatable)")
    ap.add_argument("--stdin", action="store_true", help="stop when standard input closes (for a parent process)")
    ap.add_argument("--measure", action="store_true", help="measure the server's CPU per request and concurrency")
    args = ap.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(), indent=1))
        return
    server = S3Server(args.root, args.latency, args.mbps, args.port, args.bucket, args.shared_mbps).start()
    print(server.port, flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        if args.stdin:
            sys.stdin.read()
        else:
            threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


if __name__ == "__main__":
    main()
