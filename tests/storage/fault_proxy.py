"""A forwarding HTTP proxy on 127.0.0.1 that breaks answers on purpose, for the tests of the remote
store's client (retries, stalls, broken answers, denied access) and, with added latency, for its
benchmarks. Nothing here reaches beyond 127.0.0.1.

The proxy is an ordinary server to the client (``endpoint_url`` is the proxy's): each request goes
to the upstream server (the tests' moto) with every header as sent, the ``Host`` header included, so
that SigV4 signatures made for the proxy's address stay valid upstream. Connections are kept alive
(HTTP/1.1), as libcurl reuses them.

Faults are a list of :class:`Fault`; each request takes the first one that matches it (its method,
a substring of its path) and has answers left (``times``)::

    proxy.add("status", status=503, key="a.bin", times=2)   # the next two GETs of a.bin: 503
    proxy.add("drop", after=100)                           # the next GET: cut after 100 body bytes
    proxy.count("GET")                                      # GETs seen so far

Kinds of fault (``status``, ``seconds``, ``after`` and ``value`` as each needs):

======================  ====================================================================================
``"status"``            answer ``status`` with S3's XML error body (the upstream is not asked); 403 is a
                        ``SignatureDoesNotMatch`` whose ``<StringToSign>`` holds :data:`ECHO`
``"stall"``             headers and ``after`` body bytes (default: half), then ``seconds`` of silence, then
                        the rest (if the client is still there)
``"hang"``              no answer at all for ``seconds`` (default: until the proxy stops), then the
                        connection is closed
``"drop"``              headers and ``after`` body bytes (default: half), then the connection is closed
``"short"``             a body ``value`` bytes (default 1) shorter than the upstream's, with a
                        ``Content-Length`` that matches it (``Content-Range`` unchanged: it claims more)
``"long"``              ``value`` bytes (default 7) appended to the body, ``Content-Length`` matching
``"bad_range"``         ``Content-Range`` with first and last byte moved by ``value`` (default 1), body
                        unchanged
``"wrong_length"``      the whole body under ``Content-Length: value`` (smaller: the bytes past it come
                        50 ms later; or larger), then the connection is closed
``"unpinned"``          a server that ignores ``If-Match`` and sends no ``ETag``: the request goes upstream
                        without its ``If-Match``, the answer comes back without its ``ETag``
``"echo"``              403 ``AccessDenied`` whose ``<Message>`` echoes the request's ``Authorization`` and
                        ``x-amz-security-token`` headers and its query (as some servers and proxies do)
======================  ====================================================================================
"""
from __future__ import annotations

import http.client
import http.server
import re
import socket
import threading
import urllib.parse
from dataclasses import dataclass, field

import pytest

__all__ = ["ECHO", "Fault", "FaultProxy", "proxy"]

#: the text a 403's <StringToSign> holds: an error message that shows it leaked the server's echo
ECHO = "SECRET-ECHO"
KINDS = ("status", "stall", "hang", "drop", "short", "long", "bad_range", "wrong_length", "unpinned", "echo")
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
               "transfer-encoding", "upgrade"}
_S3_CODES = {403: ("SignatureDoesNotMatch", "The request signature we calculated does not match the signature "
                                            "you provided. Check your key and signing method."),
             404: ("NoSuchKey", "The specified key does not exist."),
             408: ("RequestTimeout", "Your socket connection to the server was not read from or written to "
                                     "within the timeout period."),
             412: ("PreconditionFailed", "At least one of the pre-conditions you specified did not hold"),
             416: ("InvalidRange", "The requested range is not satisfiable"),
             429: ("TooManyRequests", "Please reduce your request rate."),
             500: ("InternalError", "We encountered an internal error. Please try again."),
             502: ("BadGateway", "Bad gateway."),
             503: ("SlowDown", "Please reduce your request rate."),
             504: ("GatewayTimeout", "Gateway timeout.")}


@dataclass
class Fault:
    """One kind of broken answer for the next ``times`` requests whose method is ``method`` (``None``:
    any) and whose path contains ``key``."""

    kind: str
    method: str | None = "GET"
    key: str = ""
    times: int = 1
    status: int = 503
    seconds: float = 0.0
    after: int | None = None
    value: int | None = None
    used: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; known: {KINDS}")

    def matches(self, method: str, path: str) -> bool:
        return self.used < self.times and (self.method is None or self.method == method) and self.key in path


def s3_error_body(status: int, resource: str) -> bytes:
    code, message = _S3_CODES.get(status, ("Error", http.client.responses.get(status, "error")))
    extra = ""
    if code == "SignatureDoesNotMatch":
        extra = (f"<AWSAccessKeyId>AKIDTESTKEY0000000000</AWSAccessKeyId><StringToSign>AWS4-HMAC-SHA256\n"
                 f"20240101T000000Z\n20240101/us-east-1/s3/aws4_request\n{ECHO}</StringToSign>"
                 f"<CanonicalRequest>GET\n{resource}\n{ECHO}</CanonicalRequest>")
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
            f"{extra}<Resource>{resource}</Resource><RequestId>FAULTPROXY0001</RequestId></Error>").encode()


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: libcurl reuses its connections
    server: "_Server"

    def log_message(self, format, *args) -> None:  # noqa: A002 - the base class's name
        pass

    def setup(self) -> None:
        super().setup()
        # the answer's headers and body go out in two writes: with Nagle's algorithm a small body waits
        # for the client's delayed ACK of the headers (~40 ms on Linux), more than latency= says
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.upstream: http.client.HTTPConnection | None = None
        with self.server.owner._lock:
            self.server.owner._connections.add(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        except OSError:
            pass
        if self.upstream is not None:
            self.upstream.close()
        with self.server.owner._lock:
            self.server.owner._connections.discard(self.connection)

    def do_GET(self) -> None:  # noqa: N802 - http.server's names
        self._serve()

    def do_HEAD(self) -> None:  # noqa: N802
        self._serve()

    def do_PUT(self) -> None:  # noqa: N802
        self._serve()

    def do_POST(self) -> None:  # noqa: N802
        self._serve()

    def do_DELETE(self) -> None:  # noqa: N802
        self._serve()

    # ---- one request ------------------------------------------------------------------------------------
    def _serve(self) -> None:
        owner = self.server.owner
        fault = owner._take(self.command, self.path, self.headers.get("Range"))
        if owner.latency:
            owner._stopped.wait(owner.latency)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        try:
            if fault is not None and fault.kind == "hang":
                owner._stopped.wait(fault.seconds or None)
                self._close()
                return
            if fault is not None and fault.kind == "status":
                self._send_error(fault.status)
                return
            if fault is not None and fault.kind == "echo":
                self._send_echo()
                return
            status, reason, headers, content = self._forward(body, drop_if_match=fault is not None
                                                             and fault.kind == "unpinned")
            self._answer(fault, status, reason, headers, content)
        except OSError:  # the client went away (it gave up on a stall): nothing more to send
            self.close_connection = True

    def _forward(self, body: bytes, drop_if_match: bool = False):
        """The upstream's answer to this request: ``(status, reason, [(name, value)], body)``
        (``drop_if_match``: sent without its If-Match header)."""
        for again in (False, True):
            if self.upstream is None:
                self.upstream = http.client.HTTPConnection(self.server.owner.upstream_host,
                                                           self.server.owner.upstream_port, timeout=60)
            try:
                self.upstream.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                for name, value in self.headers.items():
                    if name.lower() not in _HOP_BY_HOP and not (drop_if_match and name.lower() == "if-match"):
                        self.upstream.putheader(name, value)  # Host too: the signature covers it
                self.upstream.endheaders(body or None)
                resp = self.upstream.getresponse()
                content = resp.read()
            except (http.client.HTTPException, OSError):
                self.upstream.close()
                self.upstream = None
                if again:
                    raise
                continue
            if resp.will_close:
                self.upstream.close()
                self.upstream = None
            headers = [(k, v) for k, v in resp.getheaders()
                       if k.lower() not in _HOP_BY_HOP and k.lower() not in ("server", "date")]
            return resp.status, resp.reason, headers, content
        raise AssertionError("unreachable")

    def _send_error(self, status: int) -> None:
        body = s3_error_body(status, urllib.parse.urlsplit(self.path).path)
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _send_echo(self) -> None:
        query = urllib.parse.urlsplit(self.path).query
        echoed = (f"Access Denied for Authorization: {self.headers.get('Authorization', '')} with token "
                  f"{self.headers.get('x-amz-security-token', '')} and query {query}")
        body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code><Message>{echoed}'
                f"</Message><RequestId>FAULTPROXY0002</RequestId></Error>").encode()
        self.send_response(403)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _answer(self, fault: Fault | None, status: int, reason: str, headers, content: bytes) -> None:
        kind = fault.kind if fault is not None else None
        sent_length = None  # from the upstream, for HEAD; else the body's
        rest = []
        for k, v in headers:
            if k.lower() == "content-length":
                sent_length = v
            elif k.lower() == "etag" and kind == "unpinned":
                pass
            elif k.lower() == "content-range" and kind == "bad_range":
                shift = fault.value if fault.value is not None else 1
                m = re.fullmatch(r"bytes (\d+)-(\d+)/(\S+)", v)
                rest.append((k, f"bytes {int(m[1]) + shift}-{int(m[2]) + shift}/{m[3]}" if m else "bytes garbage"))
            else:
                rest.append((k, v))
        if kind == "short":
            content = content[: max(0, len(content) - (fault.value if fault.value is not None else 1))]
        elif kind == "long":
            content = content + b"X" * (fault.value if fault.value is not None else 7)
        if self.command == "HEAD":
            length = sent_length if sent_length is not None else "0"
        elif kind == "wrong_length":
            length = str(fault.value if fault.value is not None else max(0, len(content) - 1))
        else:
            length = str(len(content))
        self.send_response(status, reason)
        for k, v in rest:
            self.send_header(k, v)
        self.send_header("Content-Length", length)
        if kind in ("drop", "wrong_length"):
            self.send_header("Connection", "keep-alive")  # the client must not expect the close
        self.end_headers()
        if self.command == "HEAD":
            return
        after = fault.after if fault is not None and fault.after is not None else len(content) // 2
        if kind == "drop":
            self.wfile.write(content[:after])
            self._close()
        elif kind == "stall":
            self.wfile.write(content[:after])
            self.wfile.flush()
            self.server.owner._stopped.wait(fault.seconds)
            self.wfile.write(content[after:])
        elif kind == "wrong_length":
            # the bytes past Content-Length come a moment later, as the last packets of a large body
            # would: the client has taken its answer by then and finds them on the connection
            claimed = int(length)
            self.wfile.write(content[:claimed])
            self.server.owner._stopped.wait(0.05)
            self.wfile.write(content[claimed:])
            self._close()
        else:
            self.wfile.write(content)

    def _close(self) -> None:
        """Ends the connection at once (the client sees it dropped, not a clean end of an answer)."""
        self.close_connection = True
        try:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    owner: "FaultProxy"


class FaultProxy:
    """The proxy (see the module's doc): ``start()`` it in front of ``upstream`` (``http://host:port``),
    read its :attr:`endpoint`, ``add`` faults, read the counts, ``stop()`` it."""

    def __init__(self, upstream: str, latency: float = 0.0) -> None:
        parts = urllib.parse.urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"the upstream must be http://host:port, got {upstream!r}")
        self.upstream_host, self.upstream_port = parts.hostname, parts.port or 80
        #: seconds added before each request is served (for benchmarks of a distant store)
        self.latency = latency
        self.faults: list[Fault] = []
        #: ``(method, path, Range header or None, kind of the fault applied or None)`` of each request
        self.requests: list[tuple[str, str, str | None, str | None]] = []
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._connections: set[socket.socket] = set()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "FaultProxy":
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.owner = self
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fault-proxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stops serving, wakes every stalled or hanging answer and closes every open connection."""
        self._stopped.set()
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            connections = list(self._connections)
        for c in connections:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._thread.join(10)

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- faults and counts --------------------------------------------------------------------------
    def add(self, kind: str, *, method: str | None = "GET", key: str = "", times: int = 1, **params) -> Fault:
        """Breaks the next ``times`` answers to ``method`` requests of paths containing ``key``
        (see the module's doc for ``kind`` and its ``params``)."""
        fault = Fault(kind, method=method, key=key, times=times, **params)
        with self._lock:
            self.faults.append(fault)
        return fault

    def clear(self) -> None:
        """Removes every fault not used up."""
        with self._lock:
            self.faults.clear()

    def reset_counts(self) -> None:
        with self._lock:
            self.requests.clear()

    def count(self, method: str | None = None, key: str = "") -> int:
        """Requests seen (of ``method``, or any; of paths containing ``key``)."""
        with self._lock:
            return sum(1 for m, p, _, _ in self.requests if (method is None or m == method) and key in p)

    @property
    def counts(self) -> dict[str, int]:
        """Requests seen per method."""
        out: dict[str, int] = {}
        with self._lock:
            for m, _, _, _ in self.requests:
                out[m] = out.get(m, 0) + 1
        return out

    def _take(self, method: str, path: str, range_header: str | None) -> Fault | None:
        with self._lock:
            fault = next((f for f in self.faults if f.matches(method, path)), None)
            if fault is not None:
                fault.used += 1
            self.requests.append((method, path, range_header, fault.kind if fault else None))
            return fault


@pytest.fixture
def proxy(s3_endpoint):
    """A :class:`FaultProxy` in front of the session's moto server (``proxy.endpoint`` is its URL)."""
    p = FaultProxy(s3_endpoint).start()
    try:
        yield p
    finally:
        p.stop()

