"""Run a function on N local processes, each a rank of one process group (gloo on the CPU, NCCL
with one GPU per rank when ``backend="nccl"``).

Rendezvous goes through a file store in a fresh temporary folder, so ports never collide; every
process group has a short timeout and is destroyed in ``finally``; a process that hangs past the
deadline is killed and the test fails with what every rank printed.

Gloo ranks are forks of a fork server (``multiprocessing``'s "forkserver") that imported ``PRELOAD``
once (torch's import alone is 2-3 s of one core, paid by every spawned rank before); each rank gets
the caller's environment, ``sys.path`` and working directory as a spawned one would. NCCL ranks (one
GPU each) are spawned: a fresh interpreter, no state from any other process.
"""
from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import signal
import time
import traceback

#: what the fork server imports before it forks the gloo ranks: modules that initialise no GPU when
#: imported (DALI's own default start method for its workers, fork, relies on that for nvidia.dali);
#: the one thread they start, numpy's OpenBLAS pool, is made fork-safe by OpenBLAS. A module that
#: fails to import is skipped (as ``multiprocessing`` does). DeviceMesh and DTensor (the demo's and
#: MeshLoader's ranks build both) and torch._dynamo, which DTensor.from_local imports on its first call:
#: 2-3 s of one core per rank when each rank imported them itself (4 ranks on 2 cores, bytecode cached,
#: 2026-12-04); none of them starts a thread
PRELOAD = ["numpy", "torch", "torch.distributed", "torch.distributed.device_mesh", "torch.distributed.tensor",
           "torch._dynamo", "nvidia.dali.fn"]


def _context(backend: str):
    if backend == "nccl":
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))  # read when the server starts: once per process
    return ctx


def _rank_main(fn, rank, world_size, store_path, result_dir, args, timeout_s, backend, environ):
    import torch
    import torch.distributed as dist

    # the caller's environment now, not the fork server's from when it started
    os.environ.clear()
    os.environ.update(environ)
    os.setpgid(0, 0)  # this rank and its helpers (DALI workers) form one group the parent can stop
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
                       "OMP_NUM_THREADS": "1"})
    # one intra-op thread (the ranks share the cores): torch read OMP_NUM_THREADS when it was imported,
    # before this rank set it
    torch.set_num_threads(1)
    status = os.path.join(result_dir, f"rank{rank}.txt")
    try:
        dist.init_process_group(backend, init_method=f"file://{store_path}", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
        try:
            fn(rank, world_size, *args)
            _leave_together()
        finally:
            dist.destroy_process_group()
    except BaseException as e:  # report anything, SystemExit included, to the parent
        with open(status, "w") as f:
            f.write(e.report if isinstance(e, RankError) else traceback.format_exc())
        os._exit(1)
    with open(status, "w") as f:
        f.write("ok")


def _leave_together() -> None:
    """Wait until every rank has finished its function. A rank that exits at once closes its gloo
    sockets with a peer's handshake bytes unread: the kernel resets the connection and a slower peer
    still in ``init_process_group`` fails with "Connection closed by peer" (seen in the suite on a
    loaded 2-core machine). A barrier that fails (a peer died or raised, and reports that itself) is
    not this rank's failure. NCCL ranks (never seen to race so, and untested here without GPUs) skip it."""
    import torch.distributed as dist

    if dist.get_backend() != "gloo":
        return
    try:
        dist.barrier()
    except Exception:  # noqa: BLE001, S110 - the failing peer's own report says what happened
        pass


def _stop_ranks(procs) -> None:
    """SIGKILL every started rank's process group (the rank and whatever it started: DALI workers would
    otherwise outlive it) and reap the ranks. Safe to call more than once, or on ranks never started."""
    for p in procs:
        if p.pid is None:  # never started
            continue
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if p.is_alive():  # killed before it made its group
            p.kill()
    for p in procs:
        if p.pid is not None:
            p.join()


def _raise_on_sigterm():
    """Turn SIGTERM into ``SystemExit`` while the ranks run (so ``finally`` stops them); returns a
    function restoring the previous handler. Only the main thread can set handlers: elsewhere a no-op."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def on_term(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, on_term)
    return lambda: signal.signal(signal.SIGTERM, previous)


class RankError(Exception):
    """What a rank's function raises to report ``report`` (one line: an error in the user's data or
    arguments) instead of its traceback."""

    def __init__(self, report: str) -> None:
        super().__init__(report)
        self.report = report


class RankFailure(RuntimeError):
    """One or more ranks failed or hung; the message holds what each of them reported, ``reports`` the
    same by rank (``hung``: the ranks that did not finish)."""

    def __init__(self, message: str, reports: dict | None = None, hung=()) -> None:
        super().__init__(message)
        self.reports = dict(reports or {})
        self.hung = list(hung)


def run_ranks(fn, world_size: int, tmp_path, *args, timeout_s: float = 60.0, backend: str = "gloo",
              grace_s: float = 3.0) -> None:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` processes (see the module); raise ``RankFailure``
    with every failing rank's traceback if any fails or outlives ``timeout_s``. Once one rank fails,
    the others get ``grace_s`` seconds before they are stopped."""
    ctx = _context(backend)
    store = os.path.join(str(tmp_path), "pg_store")
    results = os.path.join(str(tmp_path), "ranks")
    os.makedirs(results, exist_ok=True)
    procs = [ctx.Process(target=_rank_main, args=(fn, r, world_size, store, results, args, timeout_s / 2, backend,
                                                     dict(os.environ)))
             for r in range(world_size)]
    hung: list[int] = []
    # Ctrl-C reaches the parent only (each rank is the leader of its own process group), and SIGTERM
    # would end the parent without cleanup: either way every rank (and its DALI workers) must be
    # stopped before the caller removes the folder the ranks work in
    restore = _raise_on_sigterm()
    try:
        for p in procs:
            p.start()
        # wait; once a rank has failed, give the others a moment to fail too, then stop them: a peer
        # blocked in a collective on a dead rank would otherwise wait for the group's timeout
        deadline = time.monotonic() + timeout_s
        while any(p.is_alive() for p in procs):
            failed = any(p.exitcode not in (None, 0) for p in procs)
            if failed:
                deadline = min(deadline, time.monotonic() + grace_s)
            if time.monotonic() > deadline:
                hung = [r for r, p in enumerate(procs) if p.is_alive()] if not failed else []
                break
            time.sleep(0.05)
    finally:
        # a second Ctrl-C must not cut the cleanup short: held until the ranks are stopped
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            _stop_ranks(procs)
        finally:
            restore()
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    reports = {}
    for r, p in enumerate(procs):
        path = os.path.join(results, f"rank{r}.txt")
        text = open(path).read() if os.path.exists(path) else f"no report (exit code {p.exitcode})"
        if text != "ok":
            reports[r] = text
    text = "\n".join(f"--- rank {r} ---\n{t}" for r, t in reports.items())
    if hung:
        raise RankFailure(f"ranks {hung} did not finish within {timeout_s} s\n" + text, reports, hung)
    if reports:
        raise RankFailure(text, reports)
