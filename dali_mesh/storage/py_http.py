"""The remote stores' Python client, for a build without libcurl (or ``DALI_MESH_HTTP=python``): the
same requests, checks and messages as csrc/storage/http_store.cc, through the standard library's
``urllib.request``, signed by botocore's ``S3SigV4Auth`` (where botocore is installed; without it only
anonymous requests). Its reads serve planning and ``partitioned_source``; the native reader needs
libcurl.

As libcurl's client: no redirect is followed (urllib's default opener would send a signed request's
``Authorization`` to the host a 307 names); each request has one deadline (``timeout``) over its
connection, headers and body, besides ``stall`` for each read of the socket; a body is read in pieces
and never past the range asked for (a listing page: :data:`MAX_BODY`); a server's words shown in an
error are stripped of anything that looks like a credential."""
from __future__ import annotations

import heapq
import http.client
import itertools
import os
import random
import re
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

from dali_mesh.storage.byte_store import is_etag

__all__ = ["MAX_BODY", "PythonHttp"]

_TRANSIENT = {408, 429, 500, 502, 503, 504}
#: the most bytes of an answer without a Range (a listing page; S3's are ~1 MiB for 1,000 keys)
MAX_BODY = 16 << 20
#: the most bytes of an error answer's body read (its Code and Message come first)
_ERROR_BODY = 4096


class _Answer:
    def __init__(self, status: int, headers, body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body
        self.cut = False  # the body is the first bytes of a longer one (request's ``cut``)


class _Refused(Exception):
    """An answer not to be used nor asked again (a body longer than asked for)."""


# ---- one deadline per request -----------------------------------------------------------------------------
class _Deadline:
    """The deadline of one request: when it passes, the sockets of the request are shut down, so that a
    blocked read returns at once (a socket's timeout bounds one read only: a body or headers sent a byte
    a second would never end). One thread of the process (:class:`_Watchdog`) keeps every deadline."""

    def __init__(self, seconds: float, connect: float) -> None:
        self.connect = connect
        self.when = time.monotonic() + seconds
        self.expired = self.done = False
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        _watchdog.add(self)

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
            expired = self.expired
        if expired:
            _shut(sock)

    def expire(self) -> None:
        with self._lock:
            if self.done:
                return
            self.expired = True
            sockets = list(self._sockets)
        for sock in sockets:
            _shut(sock)

    def cancel(self) -> None:
        with self._lock:
            self.done = True
            self._sockets.clear()
        _watchdog.cancelled()


class _Watchdog:
    """The deadlines of the requests in flight, and one thread that expires each when it passes (a
    thread per request costs more than a small request)."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._heap: list[tuple[float, int, _Deadline]] = []
        self._seq = itertools.count()
        self._stale = 0
        self._thread: threading.Thread | None = None

    def add(self, deadline: _Deadline) -> None:
        with self._cv:
            heapq.heappush(self._heap, (deadline.when, next(self._seq), deadline))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="dali_mesh-http-deadlines", daemon=True)
                self._thread.start()
            if self._heap[0][2] is deadline:
                self._cv.notify()

    def cancelled(self) -> None:
        with self._cv:
            self._stale += 1
            if self._stale > 1000 and self._stale > len(self._heap) // 2:  # cancelled ones wait for their time
                self._heap = [e for e in self._heap if not e[2].done]
                heapq.heapify(self._heap)
                self._stale = 0

    def _run(self) -> None:
        with self._cv:
            while True:
                while self._heap and self._heap[0][2].done:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cv.wait()
                    continue
                wait = self._heap[0][0] - time.monotonic()
                if wait > 0:
                    self._cv.wait(wait)
                    continue
                heapq.heappop(self._heap)[2].expire()


_watchdog = _Watchdog()
# a forked child has no watchdog thread, and may hold a lock the parent's thread had taken
os.register_at_fork(after_in_child=lambda: globals().__setitem__("_watchdog", _Watchdog()))


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # closed already, or detached (wrapped in TLS: the wrapper is watched too)
        pass


#: the deadline of the request this thread is sending (urllib builds the connection inside ``open``)
_current = threading.local()


class _Watched:
    """A connection whose sockets the current request's :class:`_Deadline` watches; its connect is
    bounded by the spec's ``connect``, each later read of the socket by ``stall``."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._create_connection = self._connect_watched

    def _connect_watched(self, address, timeout, source_address=None):
        deadline = getattr(_current, "deadline", None)
        sock = socket.create_connection(address, deadline.connect if deadline else timeout, source_address)
        sock.settimeout(timeout)
        if deadline:
            deadline.watch(sock)
        return sock

    def connect(self) -> None:
        super().connect()
        deadline = getattr(_current, "deadline", None)
        if deadline:
            deadline.watch(self.sock)  # over TLS: the wrapping socket


class _HTTPConnection(_Watched, http.client.HTTPConnection):
    pass


class _HTTPSConnection(_Watched, http.client.HTTPSConnection):
    pass


class _HTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req):
        return self.do_open(_HTTPConnection, req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def https_open(self, req):
        return self.do_open(_HTTPSConnection, req, context=self._context)


def _opener() -> urllib.request.OpenerDirector:
    """http and https through the environment's proxies, and no redirect handler: a 3xx is an answer
    (an error), never a second request with the first one's headers to where it points."""
    opener = urllib.request.OpenerDirector()
    for handler in (urllib.request.ProxyHandler(), urllib.request.UnknownHandler(), _HTTPHandler(), _HTTPSHandler(),
                    urllib.request.HTTPDefaultErrorHandler(), urllib.request.HTTPErrorProcessor()):
        opener.add_handler(handler)
    return opener


def _range_length(headers: dict) -> int | None:
    m = re.fullmatch(r"bytes=(\d+)-(\d+)", headers.get("Range", ""))
    return int(m[2]) - int(m[1]) + 1 if m else None


class PythonHttp:
    """Requests of one store, with its ``settings`` as libcurl's client has them (its spec parsed by C++,
    the spec's one reader: :func:`~dali_mesh.storage.remote.store_settings`), signed with ``credentials``
    (or none). An ``http`` store's credentials are a URL's query (a presigned URL's): their ``token``,
    sent as ``?token`` with every request and never shown."""

    def __init__(self, settings: dict, credentials) -> None:
        self.cfg = settings
        self.credentials = None if self.cfg["anonymous"] else credentials
        self._opener = _opener()
        # what no message may show: the credentials (a signed request's server may echo them)
        self._secrets = sorted({s for s in (credentials or ()) if s and len(s) >= 4}, key=len, reverse=True)

    # ---- addresses --------------------------------------------------------------------------------------
    def url_of(self, key: str, query: str = "") -> str:
        if self.cfg["kind"] == "http":
            token = self.credentials.token if self.credentials else ""
            return key + (("&" if "?" in key else "?") + token if token else "")
        # an S3 key is opaque bytes: each is sent as SigV4 signs it (unreserved ones and '/' as they are,
        # the rest %XX of their UTF-8), so '?', '#', '+', ' ' are in the key and '..' is never resolved
        bucket, _, path = key.partition("/")
        path = urllib.parse.quote(path, safe="/~")
        endpoint = self.cfg["endpoint"]
        if self.cfg["path_style"]:
            url = f"{endpoint}/{urllib.parse.quote(bucket, safe='')}/{path}"
        else:
            scheme, _, host = endpoint.partition("://")
            url = f"{scheme}://{bucket}.{host}/{path}"
        return url + (f"?{query}" if query else "")

    def scrub(self, text: str) -> str:
        """``text`` (a server's words, an exception's) without this store's credentials nor anything
        credential-like (see :func:`scrub`)."""
        for secret in self._secrets:
            text = text.replace(secret, "[withheld]")
        return scrub(text)

    # ---- one request, retried ---------------------------------------------------------------------------
    def _signed(self, method: str, url: str, headers: dict) -> dict:
        headers = dict(headers, **{"x-amz-content-sha256": "UNSIGNED-PAYLOAD"})
        if self.cfg["kind"] != "s3" or not self.credentials:
            return headers
        try:
            from botocore.auth import S3SigV4Auth  # noqa: PLC0415 - only to sign
            from botocore.awsrequest import AWSRequest  # noqa: PLC0415
            from botocore.credentials import Credentials  # noqa: PLC0415
        except ImportError:
            raise RuntimeError(f"{url.split('?')[0]}: signed requests without libcurl need botocore's signer: pip "
                               "install botocore, or rebuild dali_mesh with libcurl4-openssl-dev") from None

        key, secret, token = self.credentials
        request = AWSRequest(method=method, url=url, headers=headers)
        S3SigV4Auth(Credentials(key, secret, token or None), "s3", self.cfg["region"]).add_auth(request)
        return dict(request.headers.items())

    def request(self, method: str, url: str, headers: dict, where: str, limit: int | None = None,
                cut: bool = False) -> _Answer:
        """The answer to ``method url``, after retries of 408/429/5xx, dropped connections, stalls and
        requests past their ``timeout`` (bounded by the spec's retries and retry_seconds); a
        ``RuntimeError`` naming ``where`` else. The body holds at most ``limit`` bytes (default: the
        length of the ``Range`` asked for, else :data:`MAX_BODY`): a longer one is an error, never read
        whole; with ``cut``, its first ``limit`` bytes (the rest is not read; ``answer.cut`` says so)."""
        ranged = _range_length(headers)
        limit = limit if limit is not None else ranged if ranged is not None else MAX_BODY
        t0 = time.monotonic()
        attempt = 0
        while True:
            last = None
            deadline = _Deadline(self.cfg["timeout"], min(self.cfg["connect"], self.cfg["timeout"]))
            _current.deadline = deadline
            try:
                req = urllib.request.Request(url, headers=self._signed(method, url, headers), method=method)
                with self._opener.open(req, timeout=min(self.cfg["stall"], self.cfg["timeout"])) as r:
                    body = b"" if method == "HEAD" else _read_body(r, limit, cut)
                    if deadline.expired:  # a body without a length may have looked complete
                        raise TimeoutError("timed out")
                    length = r.headers.get("Content-Length")
                    cut_off = len(body) > limit  # with ``cut``: the rest is not read
                    if method != "HEAD" and not cut_off and length and length.isdigit() and int(length) != len(body):
                        # the connection dropped mid-body (read in pieces, http.client does not raise)
                        raise http.client.IncompleteRead(body, int(length) - len(body))
                    answer = _Answer(r.status, r.headers, body[:limit] if cut_off else body)
                    answer.cut = cut_off
            except urllib.error.HTTPError as e:
                with e:
                    answer = _Answer(e.code, e.headers, e.read(_ERROR_BODY) if method != "HEAD" else b"")
            except _Refused as e:
                said = "the range asked for" if ranged is not None else f"{limit} (the most this client reads)"
                raise RuntimeError(f"{where}: the server sent more bytes than {said} (HTTP {e.args[0]}): a broken "
                                   "server or proxy; nothing of it is used") from None
            except (urllib.error.URLError, http.client.HTTPException, OSError) as e:  # dropped, refused, timed out
                answer = None
                if deadline.expired:
                    last = f"TimeoutError: the request took more than timeout={self.cfg['timeout']:g} s"
                else:
                    last = self.scrub(f"{type(e).__name__}: {getattr(e, 'reason', e)}")
            finally:
                deadline.cancel()
                _current.deadline = None
            if answer is not None and answer.status not in _TRANSIENT:
                return answer
            if answer is not None:
                last = f"HTTP {answer.status}" + (f" {code}" if (code := self.error_code(answer.body)) else "")
            elapsed = time.monotonic() - t0
            wait = random.uniform(0, min(5.0, 0.05 * 2 ** min(attempt, 20)))
            if attempt >= self.cfg["retries"] or elapsed + wait > self.cfg["retry_seconds"]:
                raise RuntimeError(f"{where}: {last} after {attempt + 1} attempt{'s' * (attempt > 0)} in "
                                   f"{elapsed:.0f} s (retries={self.cfg['retries']}, retry_seconds="
                                   f"{self.cfg['retry_seconds']:g}); the store is unreachable or overloaded")
            time.sleep(wait)
            attempt += 1


    def error_code(self, body: bytes) -> str:
        """``Code: Message`` of an S3 error body, scrubbed (never the rest: it may echo what was signed)."""
        return self.scrub(error_code(body))

    def fail_status(self, where: str, a: _Answer):
        fail_status(where, a, self.error_code(a.body))

    # ---- what the store asks ----------------------------------------------------------------------------
    def head(self, key: str, name: str) -> tuple[int, str] | None:
        """``(size, tag)`` of ``key``, None when it does not exist."""
        a = self.request("HEAD", self.url_of(key), {}, f"{name} (HEAD)")
        if a.status == 404:
            return None
        if not 200 <= a.status < 300:
            self.fail_status(f"{name} (HEAD)", a)
        size = a.headers.get("Content-Length")
        if size is None:
            raise RuntimeError(f"{name} (HEAD): the answer has no Content-Length: the size of the object is unknown")
        return int(size), _tag_of(a.headers)

    def open_range(self, key: str, name: str, n: int) -> tuple[bytes, int, str] | None:
        """An open without HEAD (S3 refuses HEAD on a URL presigned for GET): one GET of the first ``n``
        (>= 1) bytes, no If-Match; ``(bytes, size, tag)`` (at most ``n`` bytes; the size from
        ``Content-Range``, a 200's length, or 0 for a 416, an empty object; the tag as :meth:`head` names
        it), or None when ``key`` does not exist (as http_store.cc's OpenRange)."""
        where = f"{name} (open, bytes 0-{n - 1})"
        # cut: a server that ignores the range answers 200 with the whole object: its first n bytes are
        # kept and the rest is not read (its size from Content-Length)
        a = self.request("GET", self.url_of(key), {"Range": f"bytes=0-{n - 1}"}, where, cut=True)
        if a.status == 404:
            return None
        content_range = a.headers.get("Content-Range", "").strip()
        if a.status == 416:  # a range from byte 0 is unsatisfiable only for an empty object
            if content_range not in ("", "bytes */0"):
                raise RuntimeError(f"{where}: HTTP 416 for the object's first bytes, and its Content-Range does not "
                                   "say it is empty: a broken answer")
            total, body = 0, b""
        elif a.status == 206:
            if getattr(a, "cut", False):  # a 206 longer than the range asked for: broken, as the C++ client says
                raise RuntimeError(f"{where}: the server sent more bytes than the range asked for (HTTP 206): a "
                                   "broken server or proxy; nothing of it is used")
            m = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+)", content_range)
            if not m:
                raise RuntimeError(f"{where}: the answer has no valid Content-Range with the object's size")
            first, last, total = int(m[1]), int(m[2]), int(m[3])
            body = a.body
            if first != 0 or last - first + 1 != len(body) or len(body) != min(n, total):
                raise RuntimeError(f"{where}: the answer holds bytes {first}-{last} of {total} in {len(body)} bytes "
                                   "of body, not the range asked for: a short or broken answer; nothing of it is used")
        elif a.status == 200:  # the server ignored the range: the whole object (cut after n bytes)
            length = a.headers.get("Content-Length", "")
            if getattr(a, "cut", False) and not length.isdigit():
                # no length (chunked): the size is known only by reading it all, up to MAX_BODY
                a = self.request("GET", self.url_of(key), {}, where)
                if a.status != 200:
                    fail_status(where, a)
                length = str(len(a.body))
            total, body = (int(length) if getattr(a, "cut", False) else len(a.body)), a.body[:n]
        else:
            fail_status(where, a)
        return bytes(body), total, _tag_of(a.headers)

    def get(self, key: str, name: str, offset: int, n: int, if_match: str, size: int) -> bytes:
        """Bytes [offset, offset + n) of ``key`` (fewer only at the end of the object)."""
        if size >= 0:
            if offset >= size:
                return b""
            n = min(n, size - offset)
        what = f"bytes {offset}-{offset + n - 1}"
        where = f"{name} ({what})"
        etag = is_etag(if_match)
        headers = {"Range": f"bytes={offset}-{offset + n - 1}", **({"If-Match": if_match} if etag else {})}
        a = self.request("GET", self.url_of(key), headers, where)
        if a.status == 416 and size < 0:
            return b""  # the object ends before offset
        if a.status == 416:
            raise RuntimeError(f"{where}: the range lies past the end of the object (HTTP 416): it is shorter than "
                               "planned")
        if a.status not in (200, 206):
            self.fail_status(where, a)
        if etag and a.headers.get("ETag") and a.headers["ETag"] != if_match:
            raise RuntimeError(f"{where}: the object was replaced since the plan was made (its ETag differs): define "
                               "the pipeline again")
        if a.status == 206:
            m = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+|\*)", a.headers.get("Content-Range", "").strip())
            if not m:
                raise RuntimeError(f"{where}: the answer has no valid Content-Range")
            first, last, total = int(m[1]), int(m[2]), -1 if m[3] == "*" else int(m[3])
        else:
            if offset != 0:
                raise RuntimeError(f"{where}: the server ignored the Range header (HTTP 200): byte ranges are not "
                                   "supported there")
            first, last, total = 0, len(a.body) - 1, len(a.body)
        if first != offset or last - first + 1 != len(a.body) or len(a.body) > n:
            raise RuntimeError(f"{where}: the answer holds bytes {first}-{last} in {len(a.body)} bytes of body, not the "
                               "range asked for: a short or broken answer; nothing of it is used")
        if len(a.body) != n and not (total >= 0 and last == total - 1):
            raise RuntimeError(f"{where}: the object ended after {len(a.body)} of the {n} bytes: it is shorter than "
                               "planned")
        if size >= 0 and total >= 0 and total != size:
            raise RuntimeError(f"{where}: the object is {total} bytes now, {size} when it was opened: it was replaced; "
                               "define the pipeline again")
        if etag and not a.headers.get("ETag"):
            self._verify(key, name, where, if_match, size)
        return a.body

    def _verify(self, key: str, name: str, where: str, if_match: str, size: int) -> None:
        """After an answer to a GET with If-Match that names no ETag (the server may have ignored If-Match
        and sent another version of the same size): the object's version, asked again, must still be the
        one read at. A replacement during the reads is an error, never bytes of two versions."""
        now = self.head(key, name)
        if now is None or now[1] != if_match or (size >= 0 and now[0] != size):
            raise RuntimeError(f"{where}: the object was replaced since the plan was made (the answer named no ETag "
                               "and the object's differs now): what was read could mix two versions; define the "
                               "pipeline again")

    def list_page(self, bucket: str, prefix: str, delimiter: bool, continuation: str, name: str) -> str:
        q = {"list-type": "2", "prefix": prefix, **({"delimiter": "/"} if delimiter else {}),
             **({"continuation-token": continuation} if continuation else {})}
        query = "&".join(f"{k}={urllib.parse.quote(v, safe='~')}" for k, v in sorted(q.items()))
        a = self.request("GET", self.url_of(f"{bucket}/", query), {}, f"{name} (list)")
        if a.status != 200:
            self.fail_status(f"{name} (list)", a)
        return a.body.decode("utf-8")


def _tag_of(headers) -> str:
    """The version an answer names (as http_store.cc's TagOf, for HEAD and GET alike): its ETag, else its
    generation (``gen:``), else its date (``lm:``), else ``""``."""
    generation, date = headers.get("x-goog-generation"), headers.get("Last-Modified")
    return headers.get("ETag") or (f"gen:{generation}" if generation else f"lm:{date}" if date else "")


def _read_body(r, limit: int, cut: bool) -> bytes:
    """The body of the answer ``r``, read in pieces (each read of the socket bounded by ``stall``, the
    whole by the request's deadline), ``limit + 1`` bytes at most; once more than ``limit`` came:
    :class:`_Refused`, or with ``cut`` those bytes (whatever the Content-Length says: a body that ends
    before it is a dropped connection, retried)."""
    body = bytearray()
    while True:
        piece = r.read1(min(1 << 20, limit + 1 - len(body)))  # one more than the limit: too long shows
        if not piece:
            return bytes(body)
        body += piece
        if len(body) > limit:
            if cut:
                return bytes(body)
            raise _Refused(r.status)


#: a header or field that carries a credential, with its value; a SigV4 authorization and all after it
_CREDENTIAL_FIELD = re.compile(
    r"(?is)\b(authorization|x-amz-security-token|x-amz-signature|x-amz-credential|signature|credential|"
    r"access[-_]?key[-_]?id|secret[-_]?access[-_]?key|secret|session[-_]?token|token|password|awsaccesskeyid)"
    r"\s*[:=]\s*\S+|AWS4-HMAC-SHA256.*")
#: a run of the characters that keys, secrets, signatures and tokens are made of
_KEYLIKE_RUN = re.compile(r"[A-Za-z0-9+/=_%.-]{16,}")


def _keylike(m: re.Match) -> str:
    # a long run, or one with a digit: an id, a secret, a signature (words and plain paths stay)
    run = m[0]
    return "[withheld]" if len(run) >= 32 or any(c.isdigit() for c in run) else run


def scrub(text: str) -> str:
    """``text`` with control characters made spaces and everything credential-like replaced by
    ``[withheld]``: what a server says can echo what it was sent (an ``Authorization`` header, a
    presigned query)."""
    text = re.sub(r"[\x00-\x1f\x7f]+", " ", text)
    return _KEYLIKE_RUN.sub(_keylike, _CREDENTIAL_FIELD.sub("[withheld]", text))


def error_code(body: bytes) -> str:
    """``Code: Message`` of an S3 error body (never the rest: it may echo what was signed), scrubbed."""
    text = body.decode("utf-8", "replace")
    code = re.search(r"<Code>([A-Za-z0-9._-]{1,64})</Code>", text)
    msg = re.search(r"<Message>(.{0,200}?)</Message>", text, re.S)
    return "" if not code else code[1] + (f": {scrub(msg[1])}" if msg else "")


def fail_status(where: str, a: _Answer, code: str | None = None):
    code = error_code(a.body) if code is None else code
    said = f"HTTP {a.status}" + (f" {code}" if code else "")
    if 300 <= a.status < 400:
        raise RuntimeError(f"{where}: the server answers with a redirect ({said}): redirects are not followed (the "
                           "request's credentials would go to the host it names); give the final location, or the "
                           "endpoint_url of the bucket's region")
    if a.status == 404:
        raise RuntimeError(f"{where}: no such object ({said}); check the location")
    if a.status == 412:
        raise RuntimeError(f"{where}: the object was replaced since the plan was made ({said}: its ETag differs): what "
                           "was read could mix two versions; define the pipeline again")
    if a.status in (401, 403):
        raise RuntimeError(f"{where}: access denied ({said}); check the credentials (storage_options key/secret/token, "
                           "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, AWS_PROFILE), the region and "
                           "the object's permissions, or anon=True for a public bucket")
    raise RuntimeError(f"{where}: {said}")
