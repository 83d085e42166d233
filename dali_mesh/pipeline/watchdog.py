"""The watchdog: a dead or stuck DALI worker process becomes an error instead of a hang.

Importing this module imports neither DALI nor torch (``dali_mesh`` re-exports ``WorkerError`` and
``watched_run``).

Why a watchdog: with two or more worker processes, DALI's ``pipe.run()`` waits for ever when one
worker is killed (SIGKILL) or stopped (SIGSTOP) (DALI issues #4963, #5623; with one worker DALI
raises at once). :class:`Watchdog` runs each call (``pipe.run()``, an iterator's ``next``) on one
helper thread and, while it waits, checks the pools' worker processes every ``poll_s`` seconds:

* a worker that has exited or been stopped: :class:`WorkerError` within about a second, naming its
  pid, how it ended, and the file it was reading (sources write ``reading <file>`` to a small
  per-worker status file before each read);
* no batch within ``timeout`` seconds (a worker blocked in a read, a hung file system):
  :class:`WorkerError` naming every worker and what it was doing. ``timeout`` is per batch: the
  first batch of an epoch may take ``prefetch_queue_depth + 1`` batch times (DALI fills its
  prefetch queue first), and building the pipeline (spawning its workers) has no deadline.

After a ``WorkerError`` the pipeline is unusable: the watchdog kills its remaining workers (so no
process lingers and DALI's own shutdown does not wait on a stopped worker), and every later call
raises at once. Build a new pipeline (``MeshLoader.load_state_dict`` resumes from a checkpoint).
"""
from __future__ import annotations

import atexit
import concurrent.futures
import logging
import queue
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import weakref

from dali_mesh.pipeline.registry import info_of

__all__ = ["DEFAULT_TIMEOUT_S", "Watchdog", "WorkerError", "prefetch_batches", "status_dir", "watched_run"]

log = logging.getLogger(__name__)

#: Seconds one batch may take before :class:`Watchdog` gives up (the first batch of an epoch may take
#: ``prefetch_queue_depth + 1`` times that; building a pipeline has no deadline). Generous: a cold
#: read of a large sample from network storage can take tens of seconds.
DEFAULT_TIMEOUT_S = 120.0

_status_lock = threading.Lock()
_status_dir: str | None = None


class _HelperThread:
    """One daemon thread that runs submitted calls in order. Daemon, unlike ``ThreadPoolExecutor``'s
    threads (joined at interpreter exit): a call stuck for ever must not keep the process alive."""

    def __init__(self) -> None:
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="dali_mesh_watchdog", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            task = self._tasks.get()
            if task is None:
                return
            future, fn, args = task
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as e:  # noqa: BLE001 - handed to the waiting caller
                    future.set_exception(e)
            # drop this call's references while waiting for the next one: an exception's traceback
            # holds the pipeline's frames, and a held pipeline keeps its worker processes alive
            task = future = fn = args = None

    def submit(self, fn, *args) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._tasks.put((future, fn, args))
        return future

    def shutdown(self) -> None:
        self._tasks.put(None)


class WorkerError(RuntimeError):
    """A DALI worker process died, was stopped, or made no progress before the deadline. The
    pipeline that raised it is unusable."""


def status_dir() -> str:
    """This process's folder of per-worker status files (created on first use, removed at exit):
    in ``/dev/shm`` where it exists, so a status write never touches storage.

    Removed at exit by ``atexit`` and, for a process that ends by ``os._exit`` after its
    ``multiprocessing`` target (as every ``multiprocessing`` child does), by ``multiprocessing``'s
    exit finalizers. A process killed outright cannot remove its folder: the next process that
    makes one removes the folders of this user's processes that are gone (the pid is in the name)."""
    global _status_dir
    with _status_lock:
        if _status_dir is None or not os.path.isdir(_status_dir):
            base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
            _sweep_status_dirs(base or tempfile.gettempdir())
            _status_dir = tempfile.mkdtemp(prefix=f"dali_mesh_status_{os.getpid()}_", dir=base)
            atexit.register(shutil.rmtree, _status_dir, True)
            from multiprocessing import util

            util.Finalize(None, shutil.rmtree, args=(_status_dir, True), exitpriority=0)
        return _status_dir


def _sweep_status_dirs(base: str) -> None:
    """Remove the status folders in ``base`` that belong to this user's processes that are gone."""
    try:
        names = os.listdir(base)
    except OSError:
        return
    for name in names:
        if not name.startswith("dali_mesh_status_"):
            continue
        pid = name[len("dali_mesh_status_"):].split("_", 1)[0]
        path = os.path.join(base, name)
        try:
            if not pid.isdigit() or os.lstat(path).st_uid != os.getuid():
                continue
            os.kill(int(pid), 0)  # alive (or another user's): kept
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except (OSError, ValueError):
            continue


def _read_status(folder: str | None, pid: int) -> str | None:
    if folder is None:
        return None
    try:
        with open(os.path.join(folder, str(pid)), "rb") as f:
            text = f.read().rstrip(b"\0 \n").decode("utf-8", "replace")
    except OSError:
        return None
    return text or None


def _proc_state(pid: int) -> str | None:
    """The kernel's one-letter state of ``pid`` (``R``, ``S``, ``D``, ``T`` stopped, ``t`` traced,
    ``Z`` zombie), or None when it no longer exists."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
    except OSError:
        return None
    return stat[stat.rfind(")") + 2:][:1] or None  # the name in parentheses may hold spaces


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _pool_processes(pipe) -> list:
    """The ``multiprocessing.Process`` objects of a DALI pipeline's worker pool (DALI 2.x keeps them
    in ``pipe._py_pool.pool._processes``), or ``[]`` before the pipeline is built."""
    pool = getattr(pipe, "_py_pool", None)
    procs = getattr(getattr(pool, "pool", None), "_processes", None)
    return list(procs) if procs else []


def _native_reads() -> str:
    """``; native reads in flight: <file> bytes a..b for N s, ...`` when the plugin is loaded and
    has reads running (a stuck native read names its file and byte range), else ``""``."""
    plugin = sys.modules.get("dali_mesh.pipeline.plugin")
    if plugin is None:
        return ""
    try:
        reads = plugin.reads_in_flight()
    except Exception:  # noqa: BLE001 - a description, never a second error
        return ""
    if not reads:
        return ""
    reads.sort(key=lambda r: -r["seconds"])
    shown = ", ".join(f"{r['path']} bytes {r['offset']}..{r['offset'] + r['bytes']} for {r['seconds']:.1f} s"
                      for r in reads[:8])
    return f"; native reads in flight: {shown}" + (f" (+{len(reads) - 8} more)" if len(reads) > 8 else "")


def _detach_observer(pipe) -> None:
    """After its workers were killed, let nothing wait for the thread of a DALI pool's ``Observer``:
    that thread closes the pool's result queue, whose lock a worker killed while holding it never
    gives back, and DALI's ``WorkerPool.close`` (run at exit) joins it: the process never exited
    (about one run in two). The thread is a daemon; without the join the interpreter exits."""
    proc_pool = getattr(getattr(pipe, "_py_pool", None), "pool", None)
    observer = getattr(proc_pool, "_observer", None)
    if observer is not None and getattr(observer, "thread", None) is not None:
        observer.thread = None  # Observer.close then only signals it, and does not join


class Watchdog:
    """Runs calls into DALI pipelines with a progress deadline and a check of their worker processes.

    Args:
        pipelines: a callable returning the DALI pipelines whose workers to watch (called at every
            check: a pipeline's pool exists only once it is built).
        timeout: seconds a call may wait for a batch; ``None`` or ``0`` turns the watchdog off (calls
            run on the caller's thread, nothing is checked: a dead worker then hangs, as in DALI).
        poll_s: seconds between worker checks.
        status_folder: where the sources write their per-worker status (default: :func:`status_dir`).

    Example::

        dog = Watchdog(lambda: [pipe], timeout=60)
        outputs = dog.call(pipe.run)
    """

    def __init__(self, pipelines, timeout: float | None = DEFAULT_TIMEOUT_S, *, poll_s: float = 0.2,
                 status_folder: str | None = None) -> None:
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0 \
                    or timeout == float("inf"):
                raise ValueError(f"timeout must be a finite number of seconds >= 0 (0 or None: no watchdog), "
                                 f"got {timeout!r}")
        self.timeout = float(timeout) if timeout else None
        self.poll_s = float(poll_s)
        self._pipelines = pipelines
        self._status_folder = status_folder
        self._executor: _HelperThread | None = None
        self._broken: str | None = None
        self.calls = 0  # calls made through watched_run (the first one waits for the prefetch queue)

    @property
    def broken(self) -> str | None:
        """Why the watched pipeline is unusable, or None."""
        return self._broken

    def call(self, fn, *args, what: str = "the next batch", batches: float | None = 1):
        """``fn(*args)`` on the helper thread (always the same one, as DALI expects one caller),
        waiting at most ``batches * timeout`` seconds; exceptions of ``fn`` (``StopIteration``
        included) pass through.

        ``batches``: how many batch times the call may take. The first batch waits for DALI to fill
        its prefetch queue (``prefetch_queue_depth + 1`` batches on slow workers), so a deadline of
        one batch time would kill a healthy pipeline there. ``None``: no deadline (building a
        pipeline, which spawns its workers) but dead or stopped workers are still reported."""
        if self._broken is not None:
            raise WorkerError(f"the pipeline is unusable after an earlier failure ({self._broken}); "
                              "build a new one (MeshLoader.load_state_dict resumes from a checkpoint)")
        if self.timeout is None:
            return fn(*args)
        if self._executor is None:
            self._executor = _HelperThread()
        future = self._executor.submit(fn, *args)
        deadline = None if batches is None else time.monotonic() + self.timeout * batches
        while True:
            try:
                error = future.exception(timeout=self.poll_s)
            except concurrent.futures.TimeoutError:
                pass
            else:
                if error is None:
                    return future.result()
                try:
                    if not isinstance(error, StopIteration) and isinstance(error, Exception):
                        # DALI sometimes notices a dead worker itself ("Worker data receiving
                        # interrupted", naming no worker and no file): say which, and what it read
                        problem = self._check_workers()
                        if problem is not None:
                            self._fail(problem, cause=error)
                    raise error
                finally:  # no cycle error -> traceback -> this frame -> error: free it by refcount
                    error = future = None
            problem = self._check_workers()
            if problem is None and deadline is not None and time.monotonic() > deadline:
                waited = self.timeout * batches
                problem = (f"no progress for {waited:g} s while waiting for {what} "
                           f"(timeout={self.timeout:g} s per batch"
                           + (f", x{batches:g} for this call" if batches != 1 else "")
                           + f"); workers: {self._describe_all()}" + _native_reads())
            if problem is not None:
                self._fail(problem)

    def _processes(self) -> list:
        procs = []
        for pipe in self._pipelines() or ():
            procs += _pool_processes(pipe)
        return procs

    def _status(self, pid: int) -> str:
        text = _read_status(self._status_folder or _status_dir, pid)
        return f"; it was {text}" if text else ""

    def _check_workers(self) -> str | None:
        problems = []
        for proc in self._processes():
            pid = proc.pid
            if pid is None:
                continue
            code = proc.exitcode
            state = _proc_state(pid)
            if code is not None or state in (None, "Z"):
                how = (f"was killed by {_signal_name(code)}" if code is not None and code < 0 else
                       f"exited with code {code}" if code is not None else "exited")
                problems.append(f"DALI worker process {pid} {how}{self._status(pid)}")
            elif state in ("T", "t"):
                problems.append(f"DALI worker process {pid} is stopped (SIGSTOP or a debugger; state "
                                f"{state}){self._status(pid)}")
        if not problems:
            return None
        # DALI stops the other workers once one exits (SIGTERM): name those last
        problems.sort(key=lambda p: "SIGTERM" in p)
        return "; ".join(problems)

    def _describe_all(self) -> str:
        out = []
        for proc in self._processes():
            if proc.pid is not None:
                text = _read_status(self._status_folder or _status_dir, proc.pid)
                out.append(f"pid {proc.pid} {text or 'no status'}")
        return ", ".join(out) or "none started"

    def _fail(self, problem: str, cause: BaseException | None = None) -> None:
        self._broken = problem
        # the pipeline cannot recover: kill its workers so that none lingers and DALI's shutdown
        # (which terminates and joins them) cannot wait on a stopped one
        for proc in self._processes():
            if proc.pid is not None and proc.exitcode is None:
                try:
                    os.kill(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        for pipe in self._pipelines() or ():
            _detach_observer(pipe)
        plugin = sys.modules.get("dali_mesh.pipeline.plugin")  # loaded: some pipeline reads natively
        if plugin is not None:
            try:
                plugin.cancel_reads()  # stuck native reads return (and the process can exit)
            except Exception:  # noqa: BLE001 - best effort, the error below matters more
                log.debug("cancelling native reads failed", exc_info=True)
        log.error("dali_mesh watchdog: %s", problem)
        raise WorkerError(f"{problem}. The pipeline is unusable now (its workers were stopped): build a "
                          "new one; MeshLoader.load_state_dict resumes from a checkpoint") from cause

    def __del__(self) -> None:
        # a dropped watchdog (its pipeline freed) lets its helper thread end too
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def close(self) -> None:
        """Let the helper thread go (a call stuck in a dead pipeline keeps it until the process exits)."""
        if self._executor is not None:
            self._executor.shutdown()
            self._executor = None


def prefetch_batches(pipe) -> int:
    """How many batch times the first output of ``pipe`` may take: DALI fills its prefetch queue
    (the pipeline's ``prefetch_queue_depth``, and each parallel external source's) before the first
    batch comes back, so a slow but healthy pipeline needs ``depth + 1`` batch times there."""
    depth = getattr(pipe, "_prefetch_queue_depth", 2)
    if isinstance(depth, dict):  # separated queues: {"cpu": n, "gpu": m}
        depth = max(depth.values(), default=2)
    try:
        depth = int(depth)
    except (TypeError, ValueError):
        depth = 2
    # the workers of a parallel external source fill their own queue too (partitioned_source records it)
    depth = max(depth, info_of(pipe).source_prefetch)
    return max(depth, 1) + 1


def watched_run(pipe, timeout: float | None = DEFAULT_TIMEOUT_S):
    """``pipe.run()`` under a :class:`Watchdog` kept on the pipeline: raises :class:`WorkerError`
    instead of waiting for ever on a dead or stopped worker (see the module docstring).

    ``timeout``: seconds per batch; the first call may take ``prefetch_queue_depth + 1`` times that
    (DALI fills its prefetch queue first). The watchdog holds the pipeline weakly: a pipeline
    dropped by its user is freed (and its workers stopped) without waiting for the garbage
    collector."""
    info = info_of(pipe)
    dog = info.watchdog
    first = dog is None or not dog.calls
    if dog is None or dog.timeout != (float(timeout) if timeout else None):
        ref = weakref.ref(pipe)
        dog = Watchdog(lambda: [p for p in (ref(),) if p is not None], timeout)
        info.watchdog = dog
    dog.calls += 1
    return dog.call(pipe.run, what="pipe.run()", batches=prefetch_batches(pipe) if first else 1)
