"""The benchmarks' parallel S3 server (benchmarks/s3_server.py) in this process, with a log of every
request it answers: method, key, Range, and when it began and ended. What the tests of how many
requests and round trips a reader's open costs count; the server's own counts give totals only."""
from __future__ import annotations

import threading
import time
from typing import NamedTuple

from benchmarks.s3_server import CONTROL, S3Server, _Handler

__all__ = ["LoggedRequest", "LoggingS3Server", "round_trips", "waves"]


class LoggedRequest(NamedTuple):
    method: str  # GET, HEAD, LIST, PUT, ...
    key: str  # bucket/key, with the listing's query for a LIST
    range: str  # the Range header ("" for none)
    start: float  # time.monotonic() when its headers were read
    end: float  # when its answer was sent


class _LoggingHandler(_Handler):
    def _serve(self) -> None:
        if self.path.startswith(CONTROL):
            super()._serve()
            return
        owner = self.server.owner
        start = time.monotonic()
        with owner.log_lock:
            owner.pending += 1
        try:
            super()._serve()
        finally:
            kind = getattr(self, "_kind", self.command)
            entry = LoggedRequest(kind, self.path.lstrip("/"), self.headers.get("Range", ""), start, time.monotonic())
            with owner.log_lock:
                owner.log.append(entry)
                owner.pending -= 1


class LoggingS3Server(S3Server):
    """:class:`~benchmarks.s3_server.S3Server` that keeps ``log``, a :class:`LoggedRequest` per request
    answered (``take_log()``: those so far, then none)."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.log: list[LoggedRequest] = []
        self.pending = 0  # requests begun and not yet logged
        self.log_lock = threading.Lock()
        self._server.RequestHandlerClass = _LoggingHandler

    def take_log(self, wait: float = 5.0) -> list[LoggedRequest]:
        """The requests logged so far (by start), then none; first waits (at most ``wait`` s) for those in
        flight: a client may have its answer before the server's thread has logged it."""
        deadline = time.monotonic() + wait
        while True:
            with self.log_lock:
                if self.pending == 0 or time.monotonic() > deadline:
                    out, self.log = sorted(self.log, key=lambda r: r.start), []
                    return out
            time.sleep(0.002)


def waves(log: list[LoggedRequest]) -> list[list[LoggedRequest]]:
    """The log's requests in round trips: a request begins a new wave when it began after every request
    of the current wave had ended (it could have waited for their answers); requests that overlap in time
    are one wave. With a latency much longer than a request's local cost, the waves are the round trips
    a client waited for in turn."""
    out: list[list[LoggedRequest]] = []
    for r in sorted(log, key=lambda r: r.start):
        if out and r.start < max(x.end for x in out[-1]):
            out[-1].append(r)
        else:
            out.append([r])
    return out


def round_trips(log: list[LoggedRequest], latency: float) -> int:
    """The round trips a client waited for in turn, from when its requests began: a request that began at
    least ``0.8 * latency`` after the one before it waited for an answer (each answer takes ``latency``
    at the server); requests sent together begin within a moment. Unlike :func:`waves` it does not read
    the log's ends, which may trail the client's next request (the server logs after its last byte)."""
    starts = sorted(r.start for r in log)
    return len(starts) and 1 + sum(b - a >= 0.8 * latency for a, b in zip(starts, starts[1:]))
