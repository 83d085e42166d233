"""The local launcher (dali_mesh.cli.launch.run_ranks): an interrupted parent stops every rank."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.helpers import ROOT


# ---- Ctrl-C on the parent of run_ranks stops every rank and what it started ---------------------------
def _sleeping_rank(rank, world_size, pid_dir):
    child = subprocess.Popen(["sleep", "300"])  # a helper of the rank (as DALI workers are)
    with open(os.path.join(pid_dir, f"{rank}.tmp"), "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
    os.rename(os.path.join(pid_dir, f"{rank}.tmp"), os.path.join(pid_dir, f"{rank}.pids"))
    time.sleep(300)


def _where(pid, pids) -> str:
    """The state, signal masks and kernel wait channel of the parent's threads and of the ranks."""
    out = []
    for p in [pid] + list(pids):
        try:
            status = open(f"/proc/{p}/status").read().splitlines()
            keep = [line for line in status if line.startswith(("Name", "State", "SigBlk", "SigIgn", "SigCgt", "SigPnd",
                                                                  "ShdPnd"))]
            tasks = os.listdir(f"/proc/{p}/task")
            chans = [open(f"/proc/{p}/task/{t}/wchan").read() for t in tasks]
            out.append(f"pid {p}: {'; '.join(keep)}; threads' wchan {chans}")
        except OSError as e:
            out.append(f"pid {p}: {e}")
    return " | ".join(out)


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_run_ranks_interrupted_stops_every_rank(tmp_path, sig):
    pytest.importorskip("torch")
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    # Ctrl-C as from an interactive shell: a test run started in the background (`make test &`, nohup)
    # inherits SIGINT ignored (POSIX shells ignore it in asynchronous commands), and so would the
    # parent here, which then never sees the SIGINT this test sends (the ignore showed in its SigIgn)
    script = textwrap.dedent(f"""
        import signal
        signal.signal(signal.SIGINT, signal.default_int_handler)
        import sys
        sys.path[:0] = [{ROOT!r}]
        from tests.cli.test_launch import _sleeping_rank
        from dali_mesh.cli.launch import run_ranks
        run_ranks(_sleeping_rank, 2, {str(tmp_path / 'run')!r}, {str(pid_dir)!r}, timeout_s=200)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    parent = subprocess.Popen([sys.executable, "-c", script], env=env, stderr=subprocess.PIPE)
    pids = []
    try:
        end = time.monotonic() + 120
        while len(list(pid_dir.glob("*.pids"))) < 2:
            assert parent.poll() is None, parent.stderr.read().decode()[-2000:]
            assert time.monotonic() < end, "the ranks did not start within 120 s"
            time.sleep(0.1)
        pids = [int(p) for f in pid_dir.glob("*.pids") for p in f.read_text().split()]
        assert all(_alive(p) for p in pids)
        parent.send_signal(sig)
        try:
            parent.wait(timeout=30)
        except subprocess.TimeoutExpired:  # say where it is
            pytest.fail(f"the interrupted parent did not exit within 30 s: {_where(parent.pid, pids)}")
        end = time.monotonic() + 10
        while any(_alive(p) for p in pids) and time.monotonic() < end:
            time.sleep(0.1)
        assert not [p for p in pids if _alive(p)], "ranks or their helpers outlived the interrupted parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        for p in pids:
            if _alive(p):
                os.kill(p, signal.SIGKILL)


# ---- ranks forked from the fork server see the caller as it is now, as spawned ranks would ------------
def _report_rank(rank, world_size, out_dir):
    import torch

    with open(os.path.join(out_dir, f"{rank}.json"), "w") as f:
        json.dump([os.environ.get("DALI_MESH_TEST_MARK"), os.environ["RANK"], os.getcwd(),
                   torch.get_num_threads(), os.getpgid(0) == os.getpid()], f)


def test_forked_ranks_get_the_callers_environment_and_folder_of_each_call(tmp_path, monkeypatch):
    """The fork server starts once per process with the environment of that moment; a later call's
    ranks must still see the caller's environment and working directory of that call (a variable set
    or removed in between, a `chdir`), each its own RANK, one intra-op thread, and its own process group."""
    pytest.importorskip("torch")
    from dali_mesh.cli.launch import run_ranks

    for k, mark in enumerate(["first", None, "third"]):
        out = tmp_path / f"out{k}"
        work = tmp_path / f"cwd{k}"
        out.mkdir()
        work.mkdir()
        if mark is None:
            monkeypatch.delenv("DALI_MESH_TEST_MARK", raising=False)
        else:
            monkeypatch.setenv("DALI_MESH_TEST_MARK", mark)
        monkeypatch.chdir(work)
        run_ranks(_report_rank, 2, tmp_path / f"run{k}", str(out), timeout_s=120)
        got = [json.loads((out / f"{r}.json").read_text()) for r in range(2)]
        assert got == [[mark, str(r), str(work), 1, True] for r in range(2)], got
