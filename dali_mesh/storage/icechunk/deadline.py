"""Calls of the icechunk library under a deadline, cancelled when the process exits (why and what the errors
say: docs/failure-behaviour.md, "Object storage", and docs/remote-storage.md, "Icechunk repositories").

Each call is made through the library's ``_async`` form, awaited on this module's event loop (a daemon
thread) for ``timeout`` seconds. Cancelling a call's future (pyo3-async-runtimes') only signals the library's
runtime, which drops the call when it next polls it and then touches the interpreter once more (it asks the
future whether it was cancelled). At exit :func:`cancel_all` cancels every call in flight and refuses new ones,
and :func:`settle` waits (at most :data:`SETTLE_S`) for them to leave the runtime: one that touched the
interpreter after teardown made pyo3 panic ("The Python interpreter is not initialized").
"""
from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import os
import sys
import threading
import time
import weakref
from typing import Awaitable, Callable

from dali_mesh.storage.errors import DataFileError

__all__ = ["DEFAULT_TIMEOUT_S", "IcechunkExitError", "IcechunkTimeoutError", "SETTLE_S", "bounded", "call",
           "cancel_all", "exit_calls", "settle", "timeout_of"]

#: seconds one call of the library may take without a ``timeout`` option (as long as one s3:// request may)
DEFAULT_TIMEOUT_S = 300.0
#: how much longer than its timeout a caller waits for a call whose cancellation the loop has not answered
_GRACE_S = 10.0
#: the most the exit waits for the calls cancelled to leave the library's runtime (:func:`settle`)
SETTLE_S = 2.0
#: how long after its cancellation a call on another loop than this module's (zarr-python's), which cannot be
#: watched, is taken to have left the library's runtime (measured here: under 1 ms, idle)
_SETTLE_UNWATCHED_S = 0.5
#: the most :func:`bounded` waits for ``why`` after a timeout
_WHY_S = 2.0


class IcechunkTimeoutError(DataFileError, TimeoutError):
    """A call of the icechunk library (opening a repository, a session, a read) did not finish within the
    source's ``timeout``: cancelled. ``path`` names the repository (or the key read)."""


class IcechunkExitError(DataFileError):
    """A call of the icechunk library cancelled, or refused, because the process is exiting."""


_lock = threading.Lock()
_exiting = threading.Event()
#: the futures that threads of this process wait on (:func:`call`), and the tasks of :func:`bounded` on any
#: event loop (zarr-python's too): what :func:`cancel_all` cancels
_waits: set = set()
_tasks: set = set()
#: ``(pid, loop)``: this process's event loop of the library's calls
_runner: tuple | None = None
#: the library's futures of this process's loop whose call is still in the library's runtime (:func:`settle`)
_in_library: weakref.WeakSet = weakref.WeakSet()
#: when a call on another loop was last cancelled (its leaving the runtime cannot be watched)
_unwatched_cancel = [float("-inf")]
#: when the library's runtime last asked one of this loop's futures whether it was cancelled
_last_touch = [float("-inf")]


def _after_fork_in_child() -> None:
    """A forked child has none of its parent's threads: its own loop, locks and calls."""
    global _lock, _exiting, _runner, _waits, _tasks, _in_library
    _lock, _exiting, _runner, _waits, _tasks = threading.Lock(), threading.Event(), None, set(), set()
    _in_library, _unwatched_cancel[0], _last_touch[0] = weakref.WeakSet(), float("-inf"), float("-inf")


os.register_at_fork(after_in_child=_after_fork_in_child)


class _Future(asyncio.Future):
    """A future of this module's loop, as the library's calls return them (pyo3-async-runtimes: the loop's
    ``create_future``, with a ``PyDoneCallback``). Such a call is in the library's runtime until its task
    asks the future, from the runtime's thread, whether it was cancelled, then sets its result
    (``call_soon_threadsafe``: the waiter may have it before that thread leaves the interpreter; 1.1.21)."""

    def add_done_callback(self, fn, *, context=None):
        if type(fn).__name__ == "PyDoneCallback":
            _in_library.add(self)
        super().add_done_callback(fn, context=context)

    def cancelled(self) -> bool:
        answer = super().cancelled()
        if threading.get_ident() != getattr(self.get_loop(), "thread_ident", None):
            _in_library.discard(self)  # the library's runtime is done with the call
            _last_touch[0] = time.monotonic()
        return answer


class _Loop(asyncio.SelectorEventLoop):
    """This module's event loop, whose futures are :class:`_Future` objects."""

    thread_ident: int | None = None

    def run_forever(self):
        self.thread_ident = threading.get_ident()
        super().run_forever()

    def create_future(self):
        return _Future(loop=self)


def timeout_of(options: dict, name: str) -> float:
    """The ``timeout`` of ``options`` (seconds, a number > 0; default :data:`DEFAULT_TIMEOUT_S`)."""
    value = options.get("timeout")
    if value is None:
        return DEFAULT_TIMEOUT_S
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value <= 1e6:
        raise ValueError(f"{name}: storage_options timeout must be a number of seconds > 0 (the most one call of the "
                         f"icechunk library may take), got {value!r}")
    return float(value)


def _exit_error(name: str, what: str) -> IcechunkExitError:
    return IcechunkExitError(name, f"{what} was cancelled: the process is exiting")


def _too_long(name: str, what: str, timeout: float, cause: str | None = None) -> IcechunkTimeoutError:
    if cause:
        said = f": {cause}; the call was cancelled. Check the storage and its endpoint"
    else:  # nothing is known: the library retries failed requests, refused connections included, until then
        said = ("; the call was cancelled. Nothing says why (the library retries failed requests until then: an "
                "endpoint that refuses connections or fails them, a server that does not answer, a network that "
                "stalls): check the storage and its endpoint (storage_options endpoint_url=, region=)")
    return IcechunkTimeoutError(name, f"{what} did not finish within {timeout:g} s (storage_options timeout="
                                      f"{timeout:g}){said}, or give a larger timeout= for a slow one")


async def _cause(why: Callable[[], str | None] | None) -> str | None:
    """``why()`` (a blocking look at the storage: its endpoint's connection) run on a daemon thread of its own,
    never holding up the loop or the exit, for at most :data:`_WHY_S`; None if it says nothing in time."""
    if why is None:
        return None
    loop = asyncio.get_running_loop()
    answer = loop.create_future()

    def run() -> None:
        try:
            text = why()
        except Exception:  # noqa: BLE001 - a look that fails says nothing
            text = None
        try:
            loop.call_soon_threadsafe(lambda: answer.done() or answer.set_result(text))
        except RuntimeError:  # the loop is closed
            pass

    threading.Thread(target=run, name="dali-mesh-icechunk-why", daemon=True).start()
    try:
        return await asyncio.wait_for(answer, _WHY_S)
    except asyncio.TimeoutError:
        return None


async def bounded(make: Callable[[], Awaitable], name: str, what: str, timeout: float, *, exit_error: bool = True,
                  why: Callable[[], str | None] | None = None):
    """Awaits ``make()`` (a call of the library) for at most ``timeout`` seconds. Raises
    :class:`IcechunkTimeoutError` past them (with what ``why()`` finds of the cause), and
    :class:`IcechunkExitError` at exit (without ``exit_error``: CancelledError, for :func:`call`); ``name``
    and ``what`` (``"opening the repository"``) name what was asked."""
    loop = asyncio.get_running_loop()
    entry = (loop, asyncio.current_task())
    with _lock:  # looked at and registered at once: cancel_all's snapshot has it, or it sees the exit
        if _exiting.is_set():
            raise _exit_error(name, what)
        _tasks.add(entry)
    inner = None
    try:
        inner = asyncio.ensure_future(make())
        done, _ = await asyncio.wait({inner}, timeout=timeout)
    except asyncio.CancelledError:
        if exit_error and _exiting.is_set():
            raise _exit_error(name, what) from None
        raise
    finally:
        with _lock:
            _tasks.discard(entry)
        if inner is not None and not inner.done():
            inner.cancel()  # the library drops the call when its runtime next polls it (see the module's doc)
            if not isinstance(loop, _Loop):
                _unwatched_cancel[0] = time.monotonic()
    if not done:
        raise _too_long(name, what, timeout, await _cause(why))
    return inner.result()


def _loop() -> asyncio.AbstractEventLoop:
    """This process's loop of the library's calls, started at the first call on a daemon thread, which also
    registers :func:`exit_calls` at exit (so a DALI thread waiting on a call, which its pipeline's shutdown
    joins, returns at once; callbacks.py's unbinding does it too, first among the exit hooks)."""
    global _runner
    with _lock:
        if _runner is None or _runner[0] != os.getpid():
            loop = _Loop()
            threading.Thread(target=loop.run_forever, name="dali-mesh-icechunk", daemon=True).start()
            if _runner is None:
                atexit.register(exit_calls)
            _runner = (os.getpid(), loop)
        return _runner[1]


def call(make: Callable[[], Awaitable], name: str, what: str, timeout: float, *,
         why: Callable[[], str | None] | None = None):
    """The result of ``make()`` (a call of the library's ``_async`` API), :func:`bounded` on this process's
    loop, waited for by the calling thread without the GIL."""
    if _exiting.is_set():
        raise _exit_error(name, what)
    future = asyncio.run_coroutine_threadsafe(bounded(make, name, what, timeout, exit_error=False, why=why),
                                              _loop())
    with _lock:  # looked at and registered at once (see bounded)
        exiting = _exiting.is_set()
        if not exiting:
            _waits.add(future)
    if exiting:
        future.cancel()
        raise _exit_error(name, what)
    try:
        done, _ = concurrent.futures.wait([future], timeout=timeout + _GRACE_S + _WHY_S)
    finally:
        with _lock:
            _waits.discard(future)
    if future.cancelled():
        raise _exit_error(name, what)
    if not done:  # the loop did not answer the cancellation: never wait longer than the call's bound
        future.cancel()
        raise _too_long(name, what, timeout)
    return future.result()


def cancel_all() -> int:
    """Cancels every call of the library in flight in this process and refuses later ones: the process exits.
    Returns how many were cancelled."""
    with _lock:  # no call registers between the exit's start and the snapshot (see bounded)
        _exiting.set()
        waits, tasks = list(_waits), list(_tasks)
    for future in waits:
        future.cancel()  # wakes its waiter at once; its task is cancelled on the loop
    for loop, task in tasks:
        try:
            loop.call_soon_threadsafe(task.cancel)
        except RuntimeError:  # that loop is closed: nothing runs there any more
            continue
        if not isinstance(loop, _Loop):
            _unwatched_cancel[0] = time.monotonic()
    return len(waits) + len(tasks)


def _foreign_thread_in_python() -> bool:
    """Whether a thread Python did not start (the library runtime's) is in the interpreter, or in a call that
    will take it again (``call_soon_threadsafe``'s socket write): after teardown such a thread kills the process."""
    dummy = getattr(threading, "_DummyThread", ())
    ours = {t.ident for t in threading.enumerate() if not isinstance(t, dummy)}
    return any(ident not in ours for ident in sys._current_frames())


def settle(limit: float = SETTLE_S) -> bool:
    """Waits at most ``limit`` seconds until the library's runtime is done with the calls cancelled or in
    flight (this loop's: their last touch seen; another loop's: :data:`_SETTLE_UNWATCHED_S` after their
    cancellation) and none of its threads is in the interpreter. Returns whether they are done."""
    end = time.monotonic() + limit
    while True:
        now = time.monotonic()
        if (not len(_in_library) and now >= _unwatched_cancel[0] + _SETTLE_UNWATCHED_S
                and now >= _last_touch[0] + 0.02 and not _foreign_thread_in_python()):
            return True
        if now >= end:
            return False
        time.sleep(0.005)


def exit_calls() -> None:
    """At exit: :func:`cancel_all`, then :func:`settle`."""
    cancel_all()
    settle()
