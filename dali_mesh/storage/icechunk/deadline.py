"""Calls of the icechunk library under a deadline, cancelled when the process exits.

The library bounds no call of an object store by time (icechunk 1.1.21: its S3 client drops an answer's body
that stalls, ``network_stream_timeout_seconds``, but waits for ever for an answer that never starts, and
retries each request itself up to 10 times), so a server that accepts connections and never answers holds
the caller for ever: the source's construction, a read, and at exit every thread whose read waits on one
(DALI's executor threads, which its pipelines' shutdown joins). Every call of the library here is therefore
made through its ``_async`` form, awaited on this module's event loop (a daemon thread of this process), and
given ``timeout`` seconds: past them it is cancelled (the library drops its requests: pyo3's futures are
cancelled with the asyncio task that awaits them) and :class:`IcechunkTimeoutError` names the repository,
what was asked and the option that bounds it. When the process exits, :func:`cancel_all` cancels every call
in flight and refuses new ones (:class:`IcechunkExitError`), so that the threads waiting on them return at
once (see :func:`~dali_mesh.storage.icechunk.callbacks.unbind_at_exit`).
"""
from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import os
import threading
from typing import Awaitable, Callable

from dali_mesh.storage.errors import DataFileError

__all__ = ["DEFAULT_TIMEOUT_S", "IcechunkExitError", "IcechunkTimeoutError", "bounded", "call", "cancel_all",
           "timeout_of"]

#: seconds one call of the library may take when storage_options give no ``timeout`` (a request of the s3://
#: store may take as long: remote.py's ``timeout``)
DEFAULT_TIMEOUT_S = 300.0
#: how much longer than its timeout a caller waits for a call whose cancellation the loop has not answered
_GRACE_S = 10.0


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


def _after_fork_in_child() -> None:
    """A forked child has none of its parent's threads: its own loop, locks and calls."""
    global _lock, _exiting, _runner, _waits, _tasks
    _lock, _exiting, _runner, _waits, _tasks = threading.Lock(), threading.Event(), None, set(), set()


os.register_at_fork(after_in_child=_after_fork_in_child)


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


def _too_long(name: str, what: str, timeout: float) -> IcechunkTimeoutError:
    return IcechunkTimeoutError(name, f"{what} did not finish within {timeout:g} s (storage_options timeout="
                                      f"{timeout:g}): the repository's storage did not answer in time (a server "
                                      f"that stopped answering, or a network that stalls); the call was cancelled. "
                                      f"Check the storage and its endpoint, or give a larger timeout= for a slow one")


async def bounded(make: Callable[[], Awaitable], name: str, what: str, timeout: float, *, exit_error: bool = True):
    """Awaits ``make()`` (a call of the library) on the running loop for at most ``timeout`` seconds, cancelled
    past them (:class:`IcechunkTimeoutError`) or when the process exits (:class:`IcechunkExitError`; without
    ``exit_error`` it stays cancelled: :func:`call` says so itself); ``name`` and ``what`` (``"opening the
    repository"``) say in those errors what was asked."""
    if _exiting.is_set():
        raise _exit_error(name, what)
    entry = (asyncio.get_running_loop(), asyncio.current_task())
    with _lock:
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
            inner.cancel()  # drops the library's requests
    if not done:
        raise _too_long(name, what, timeout)
    return inner.result()


def _loop() -> asyncio.AbstractEventLoop:
    """This process's loop of the library's calls (started at its first call, on a daemon thread: it never
    holds up the exit). The first call also makes the exit cancel the calls in flight: a thread that waits on
    one (DALI's, in a callback of a pipeline that its shutdown joins at exit) then returns at once. The native
    reader's unbinding (callbacks.py) does it too, first among the exit hooks."""
    global _runner
    with _lock:
        if _runner is None or _runner[0] != os.getpid():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="dali-mesh-icechunk", daemon=True).start()
            if _runner is None:
                atexit.register(cancel_all)
            _runner = (os.getpid(), loop)
        return _runner[1]


def call(make: Callable[[], Awaitable], name: str, what: str, timeout: float):
    """The result of ``make()`` (a call of the library's ``_async`` API) awaited by :func:`bounded` on this
    process's loop, waited for by the calling thread (without the GIL)."""
    if _exiting.is_set():
        raise _exit_error(name, what)
    future = asyncio.run_coroutine_threadsafe(bounded(make, name, what, timeout, exit_error=False), _loop())
    with _lock:
        _waits.add(future)
    try:
        done, _ = concurrent.futures.wait([future], timeout=timeout + _GRACE_S)
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
    _exiting.set()
    with _lock:
        waits, tasks = list(_waits), list(_tasks)
    for future in waits:
        future.cancel()  # wakes its waiter at once; its task is cancelled on the loop
    for loop, task in tasks:
        try:
            loop.call_soon_threadsafe(task.cancel)
        except RuntimeError:  # that loop is closed: nothing runs there any more
            continue
    return len(waits) + len(tasks)
