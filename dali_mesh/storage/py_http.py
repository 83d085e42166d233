"""The remote stores' Python client, for a build without libcurl (or ``DALI_MESH_HTTP=python``): the
same requests, checks and messages as csrc/storage/http_store.cc, through the standard library's
``urllib.request``, signed by botocore's ``S3SigV4Auth`` (where botocore is installed; without it only
anonymous requests). Its reads serve planning and ``partitioned_source``; the native reader needs
libcurl."""
from __future__ import annotations

import http.client
import random
import re
import socket
import time
import urllib.error
import urllib.parse
import urllib.request

from dali_mesh.storage.base import is_etag

__all__ = ["PythonHttp", "parse_spec"]

_TRANSIENT = {408, 429, 500, 502, 503, 504}


def parse_spec(spec: str) -> dict:
    """A store spec's settings (csrc/storage/http_store.h), with the client's defaults."""
    kind, *items = spec.split(";")
    cfg = {"kind": kind, "endpoint": "", "region": "us-east-1", "addressing": "path", "anon": "0", "retries": 8,
           "retry_seconds": 60.0, "timeout": 300.0, "stall": 30.0, "connect": 10.0}
    for item in items:
        k, _, v = item.partition("=")
        cfg[k] = int(v) if k == "retries" else float(v) if k in ("retry_seconds", "timeout", "stall", "connect") else v
    return cfg


class _Answer:
    def __init__(self, status: int, headers, body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body


class PythonHttp:
    """Requests of one store (its ``spec``'s settings) signed with ``credentials`` (or none)."""

    def __init__(self, spec: str, credentials) -> None:
        self.cfg = parse_spec(spec)
        self.credentials = None if self.cfg["anon"] == "1" else credentials

    # ---- addresses --------------------------------------------------------------------------------------
    def url_of(self, key: str, query: str = "") -> str:
        if self.cfg["kind"] == "http":
            return key
        bucket, _, path = key.partition("/")
        path = urllib.parse.quote(path, safe="/~")
        endpoint = self.cfg["endpoint"]
        if self.cfg["addressing"] == "path":
            url = f"{endpoint}/{urllib.parse.quote(bucket, safe='')}/{path}"
        else:
            scheme, _, host = endpoint.partition("://")
            url = f"{scheme}://{bucket}.{host}/{path}"
        return url + (f"?{query}" if query else "")

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

    def request(self, method: str, url: str, headers: dict, where: str) -> _Answer:
        """The answer to ``method url``, after retries of 408/429/5xx, dropped connections and stalls
        (bounded by the spec's retries and retry_seconds); a ``RuntimeError`` naming ``where`` else."""
        t0 = time.monotonic()
        attempt = 0
        while True:
            last = None
            try:
                req = urllib.request.Request(url, headers=self._signed(method, url, headers), method=method)
                deadline = time.monotonic() + self.cfg["timeout"]
                with urllib.request.urlopen(req, timeout=min(self.cfg["stall"], self.cfg["timeout"])) as r:
                    body = bytearray()
                    while method != "HEAD":  # in pieces: a request never runs past its timeout
                        piece = r.read(1 << 20)
                        if not piece:
                            break
                        body += piece
                        if time.monotonic() > deadline:
                            raise TimeoutError(f"the request took more than timeout={self.cfg['timeout']:g} s")
                    length = r.headers.get("Content-Length")
                    if method != "HEAD" and length is not None and length.isdigit() and int(length) != len(body):
                        # the connection dropped mid-body (read in pieces, http.client does not raise)
                        raise http.client.IncompleteRead(bytes(body), int(length) - len(body))
                    answer = _Answer(r.status, r.headers, bytes(body))
            except urllib.error.HTTPError as e:
                answer = _Answer(e.code, e.headers, e.read(4096) if method != "HEAD" else b"")
            except (urllib.error.URLError, http.client.HTTPException, OSError) as e:  # dropped, refused, timed out
                answer, last = None, f"{type(e).__name__}: {getattr(e, 'reason', e)}"
            if answer is not None and answer.status not in _TRANSIENT:
                return answer
            if answer is not None:
                last = f"HTTP {answer.status}" + (f" {code}" if (code := error_code(answer.body)) else "")
            elapsed = time.monotonic() - t0
            wait = random.uniform(0, min(5.0, 0.05 * 2 ** min(attempt, 20)))
            if attempt >= self.cfg["retries"] or elapsed + wait > self.cfg["retry_seconds"]:
                raise RuntimeError(f"{where}: {last} after {attempt + 1} attempt{'s' * (attempt > 0)} in "
                                   f"{elapsed:.0f} s (retries={self.cfg['retries']}, retry_seconds="
                                   f"{self.cfg['retry_seconds']:g}); the store is unreachable or overloaded")
            time.sleep(wait)
            attempt += 1

    # ---- what the store asks ----------------------------------------------------------------------------
    def head(self, key: str, name: str) -> tuple[int, str] | None:
        """``(size, tag)`` of ``key``, None when it does not exist."""
        a = self.request("HEAD", self.url_of(key), {}, f"{name} (HEAD)")
        if a.status == 404:
            return None
        if not 200 <= a.status < 300:
            fail_status(f"{name} (HEAD)", a)
        size = a.headers.get("Content-Length")
        if size is None:
            raise RuntimeError(f"{name} (HEAD): the answer has no Content-Length: the size of the object is unknown")
        tag = a.headers.get("ETag") or (f"gen:{a.headers['x-goog-generation']}" if a.headers.get("x-goog-generation")
                                        else f"lm:{a.headers.get('Last-Modified', '')}")
        return int(size), tag

    def open_range(self, key: str, name: str, n: int) -> tuple[bytes, int, str] | None:
        """An open without HEAD (S3 refuses HEAD on a URL presigned for GET): one GET of the first ``n``
        (>= 1) bytes, no If-Match; ``(bytes, size, tag)`` (at most ``n`` bytes; the size from
        ``Content-Range``, a 200's length, or 0 for a 416, an empty object; the tag as :meth:`head` names
        it), or None when ``key`` does not exist (as http_store.cc's OpenRange)."""
        where = f"{name} (open, bytes 0-{n - 1})"
        a = self.request("GET", self.url_of(key), {"Range": f"bytes=0-{n - 1}"}, where)
        if a.status == 404:
            return None
        content_range = a.headers.get("Content-Range", "").strip()
        if a.status == 416:  # a range from byte 0 is unsatisfiable only for an empty object
            if content_range not in ("", "bytes */0"):
                raise RuntimeError(f"{where}: HTTP 416 for the object's first bytes, and its Content-Range does not "
                                   "say it is empty: a broken answer")
            total, body = 0, b""
        elif a.status == 206:
            m = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+)", content_range)
            if not m:
                raise RuntimeError(f"{where}: the answer has no valid Content-Range with the object's size")
            first, last, total = int(m[1]), int(m[2]), int(m[3])
            body = a.body
            if first != 0 or last - first + 1 != len(body) or len(body) != min(n, total):
                raise RuntimeError(f"{where}: the answer holds bytes {first}-{last} of {total} in {len(body)} bytes "
                                   "of body, not the range asked for: a short or broken answer; nothing of it is used")
        elif a.status == 200:  # the server ignored the range: the whole object
            total, body = len(a.body), a.body[:n]
        else:
            fail_status(where, a)
        etag, generation = a.headers.get("ETag"), a.headers.get("x-goog-generation")
        tag = etag or (f"gen:{generation}" if generation else
                       f"lm:{a.headers['Last-Modified']}" if a.headers.get("Last-Modified") else "")
        return bytes(body), total, tag

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
            fail_status(where, a)
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
        return a.body

    def list_page(self, bucket: str, prefix: str, delimiter: bool, continuation: str, name: str) -> str:
        q = {"list-type": "2", "prefix": prefix, **({"delimiter": "/"} if delimiter else {}),
             **({"continuation-token": continuation} if continuation else {})}
        query = "&".join(f"{k}={urllib.parse.quote(v, safe='~')}" for k, v in sorted(q.items()))
        a = self.request("GET", self.url_of(f"{bucket}/", query), {}, f"{name} (list)")
        if a.status != 200:
            fail_status(f"{name} (list)", a)
        return a.body.decode("utf-8")


def error_code(body: bytes) -> str:
    """``Code: Message`` of an S3 error body (never the rest: it may echo what was signed)."""
    text = body.decode("utf-8", "replace")
    code = re.search(r"<Code>(.{0,200}?)</Code>", text)
    msg = re.search(r"<Message>(.{0,200}?)</Message>", text)
    return "" if not code else code[1] + (f": {msg[1]}" if msg else "")


def fail_status(where: str, a: _Answer):
    code = error_code(a.body)
    said = f"HTTP {a.status}" + (f" {code}" if code else "")
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
