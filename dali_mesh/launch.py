"""Run a function on N local processes, each a rank of one process group (gloo on the CPU, NCCL
with one GPU per rank when ``backend="nccl"``).

Rendezvous goes through a file store in a fresh temporary folder, so ports never collide; every
process group has a short timeout and is destroyed in ``finally``; a process that hangs past the
deadline is killed and the test fails with what every rank printed.
"""
from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import signal
import time
import traceback


def _rank_main(fn, rank, world_size, store_path, result_dir, args, timeout_s, backend):
    import torch.distributed as dist

    os.setpgid(0, 0)  # this rank and its helpers (DALI workers) form one group the parent can stop
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
                       "OMP_NUM_THREADS": "1"})
    status = os.path.join(result_dir, f"rank{rank}.txt")
    try:
        dist.init_process_group(backend, init_method=f"file://{store_path}", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
        try:
            fn(rank, world_size, *args)
        finally:
            dist.destroy_process_group()
    except BaseException:  # report anything, SystemExit included, to the parent
        with open(status, "w") as f:
            f.write(traceback.format_exc())
        os._exit(1)
    with open(status, "w") as f:
        f.write("ok")


class RankFailure(RuntimeError):
    """One or more ranks failed or hung; the message holds what each of them reported."""


def run_ranks(fn, world_size: int, tmp_path, *args, timeout_s: float = 60.0, backend: str = "gloo",
              grace_s: float = 3.0) -> None:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` spawned processes; raise ``RankFailure``
    with every failing rank's traceback if any fails or outlives ``timeout_s``. Once one rank fails,
    the others get ``grace_s`` seconds before they are stopped."""
    ctx = mp.get_context("spawn")
    store = os.path.join(str(tmp_path), "pg_store")
    results = os.path.join(str(tmp_path), "ranks")
    os.makedirs(results, exist_ok=True)
    procs = [ctx.Process(target=_rank_main, args=(fn, r, world_size, store, results, args, timeout_s / 2, backend))
             for r in range(world_size)]
    for p in procs:
        p.start()
    # wait; once a rank has failed, give the others a moment to fail too, then stop them: a peer
    # blocked in a collective on a dead rank would otherwise wait for the group's timeout
    deadline = time.monotonic() + timeout_s
    hung: list[int] = []
    while any(p.is_alive() for p in procs):
        failed = any(p.exitcode not in (None, 0) for p in procs)
        if failed:
            deadline = min(deadline, time.monotonic() + grace_s)
        if time.monotonic() > deadline:
            hung = [r for r, p in enumerate(procs) if p.is_alive()] if not failed else []
            break
        time.sleep(0.05)
    for p in procs:
        # stop the rank and whatever it started (DALI workers would otherwise outlive it)
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if p.is_alive():  # killed before it made its group
            p.kill()
        p.join()
    reports = []
    for r, p in enumerate(procs):
        path = os.path.join(results, f"rank{r}.txt")
        text = open(path).read() if os.path.exists(path) else f"no report (exit code {p.exitcode})"
        if text != "ok":
            reports.append(f"--- rank {r} ---\n{text}")
    if hung:
        raise RankFailure(f"ranks {hung} did not finish within {timeout_s} s\n" + "\n".join(reports))
    if reports:
        raise RankFailure("\n".join(reports))
