"""Run a function on N real processes with a gloo process group on the CPU.

Rendezvous goes through a file store in a fresh temporary folder, so ports never collide; every
process group has a short timeout and is destroyed in ``finally``; a process that hangs past the
deadline is killed and the test fails with what every rank printed.
"""
from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import traceback


def _rank_main(fn, rank, world_size, store_path, result_dir, args, timeout_s):
    import torch.distributed as dist

    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
                       "OMP_NUM_THREADS": "1"})
    status = os.path.join(result_dir, f"rank{rank}.txt")
    try:
        dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world_size,
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


def run_ranks(fn, world_size: int, tmp_path, *args, timeout_s: float = 60.0) -> None:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` spawned processes; raise if any fails."""
    ctx = mp.get_context("spawn")
    store = os.path.join(str(tmp_path), "pg_store")
    results = os.path.join(str(tmp_path), "ranks")
    os.makedirs(results, exist_ok=True)
    procs = [ctx.Process(target=_rank_main, args=(fn, r, world_size, store, results, args, timeout_s / 2))
             for r in range(world_size)]
    for p in procs:
        p.start()
    deadline = datetime.datetime.now() + datetime.timedelta(seconds=timeout_s)
    for p in procs:
        p.join(max(0.0, (deadline - datetime.datetime.now()).total_seconds()))
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    reports = []
    for r, p in enumerate(procs):
        path = os.path.join(results, f"rank{r}.txt")
        text = open(path).read() if os.path.exists(path) else f"no report (exit code {p.exitcode})"
        if text != "ok":
            reports.append(f"--- rank {r} ---\n{text}")
    if hung:
        raise AssertionError(f"ranks {hung} did not finish within {timeout_s} s\n" + "\n".join(reports))
    if reports:
        raise AssertionError("\n".join(reports))
