"""Readers under faults made by real processes and real files (issue 9, items 6 and 7): a FIFO in
place of a data file, a file rewritten while it is read, a file emptied under a mapping.

Every case that could hang or kill the process runs in a subprocess with a deadline, so that on a
reader that blocks (a FIFO opened for reading waits for a writer for ever) or dies of SIGBUS the test
fails instead of hanging or taking pytest down.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from dali_mesh.formats.npy import read_npy_window
from dali_mesh.io import DataFileError, NotRegularFileError, TruncatedFileError
from dali_mesh.partition import Region

DEADLINE_S = 30  # generous on 2 busy cores; a blocked open never returns at all
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(script: str, timeout: float = DEADLINE_S) -> subprocess.CompletedProcess:
    """Run ``script`` in a fresh interpreter; a hang is a test failure, not a hung test."""
    try:
        return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=ROOT, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the reader did not return within {timeout} s (blocked?)")


# ---- a FIFO in place of a data file ----------------------------------------------------------------
_REPORT = """
import json, sys
def report(fn):
    try:
        fn()
        print(json.dumps({"raised": None}))
    except Exception as e:
        print(json.dumps({"raised": type(e).__name__, "mro": [c.__name__ for c in type(e).__mro__],
                          "message": str(e), "path": getattr(e, "path", None)}))
"""

_FIFO_CASES = {
    "npy header": "from dali_mesh.formats.npy import read_npy_header; report(lambda: read_npy_header(P))",
    "npy window": "from dali_mesh.formats.npy import read_npy_window; from dali_mesh.partition import Region; "
                  "report(lambda: read_npy_window(P, Region((0,), (4,), (0,), (4,), (0,), (4,), 'constant')))",
    "npy window direct": "from dali_mesh.formats.npy import read_npy_window; from dali_mesh.partition import Region; "
                         "report(lambda: read_npy_window(P, Region((0,), (4,), (0,), (4,), (0,), (4,), 'constant'), "
                         "direct=True))",
    "hdf5": "from dali_mesh.formats.hdf5 import open_hdf5_dataset; report(lambda: open_hdf5_dataset(P, 'x'))",
    "hdf5 random access": "from dali_mesh.formats.hdf5 import open_hdf5_dataset; "
                          "report(lambda: open_hdf5_dataset(P, 'x', random_access=True))",
}


@pytest.mark.parametrize("case", sorted(_FIFO_CASES))
def test_fifo_in_place_of_a_file_is_refused_without_blocking(tmp_path, case):
    path = str(tmp_path / ("data.h5" if case.startswith("hdf5") else "data.npy"))
    os.mkfifo(path)
    proc = _run(_REPORT + f"P = {path!r}\n" + _FIFO_CASES[case])
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["raised"] == "NotRegularFileError", got
    assert got["path"] == path and got["message"].startswith(f"{path}: is a FIFO (named pipe), not a regular")


@pytest.mark.parametrize("which", ["chunk", "metadata"])
def test_fifo_in_a_zarr_store_is_refused_without_blocking(tmp_path, which):
    zarr = pytest.importorskip("zarr")
    store = str(tmp_path / "s.zarr")
    arr = zarr.create_array(store=store, shape=(4, 8), chunks=(2, 8), dtype="f4", zarr_format=2)
    arr[:] = np.arange(32, dtype="f4").reshape(4, 8)
    victim = os.path.join(store, "1.0" if which == "chunk" else ".zarray")
    os.remove(victim)
    os.mkfifo(victim)
    proc = _run(_REPORT + f"""
from dali_mesh.formats.zarr import open_zarr_array, read_zarr_window
from dali_mesh.partition import Region
def go():
    a = open_zarr_array({store!r})
    read_zarr_window(a, Region((0,), (8,), (0,), (8,), (0,), (8,), 'constant'), prefix=(3,))
report(go)
""")
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["raised"] == "NotRegularFileError", got
    assert got["path"] == victim and "is a FIFO" in got["message"]


def test_regular_file_check_does_not_block_in_process(tmp_path):
    """The same refusal in this process, through a symlink to the FIFO (the open follows it)."""
    fifo = str(tmp_path / "pipe")
    os.mkfifo(fifo)
    link = str(tmp_path / "x.npy")
    os.symlink(fifo, link)
    # a writer that is never there would block a blocking open; if the open blocked, the alarm ends it
    def blocked(signum, frame):
        raise TimeoutError("the open of a FIFO blocked")

    old = signal.signal(signal.SIGALRM, blocked)
    signal.alarm(10)
    try:
        with pytest.raises(NotRegularFileError, match=r"x\.npy: is a FIFO"):
            read_npy_window(link, Region((0,), (4,), (0,), (4,), (0,), (4,), "constant"))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# ---- a file rewritten while it is read ---------------------------------------------------------------
_REWRITER = """
import os, random, sys, time
path, seconds = sys.argv[1], float(sys.argv[2])
data = open(path, "rb").read()
end = time.monotonic() + seconds
n = 0
rng = random.Random(0)
with open(path, "r+b", buffering=0) as f:
    while time.monotonic() < end:
        f.truncate(0)      # a reader that opened the whole file now faces an empty one
        f.seek(0)
        f.write(data)
        n += 1
        # whole for a moment, so that readers get past the header check into the data read
        time.sleep(rng.uniform(0, 0.002))
print(n)
"""

_READER = """
import json, sys, time
import numpy as np
from dali_mesh.formats.npy import read_npy_window
from dali_mesh.io import DataFileError
from dali_mesh.partition import Region, take_window
path, seconds = sys.argv[1], float(sys.argv[2])
# the file holds arange(256 * 4096) (the oracle is built here: np.load would race the writer too)
expected_full = np.arange(256 * 4096, dtype=np.float32).reshape(256, 4096)
# an innermost-axis window of small pieces: the case where method="auto" used to map the file
region = Region((0, 0), expected_full.shape, (0, 0), (expected_full.shape[0], 100), (0, 0),
                (expected_full.shape[0], 100), "constant")
expected = take_window(expected_full, region)
ok, errors, bad = 0, 0, []
out = np.empty(region.window_shape, expected.dtype)
end = time.monotonic() + seconds
while time.monotonic() < end:
    out[...] = -1
    try:
        read_npy_window(path, region, out)
    except DataFileError as e:
        errors += 1
        if e.path != path or not str(e).startswith(path + ": "):
            bad.append("error not naming the file: " + str(e))
        continue
    except Exception as e:
        bad.append("not a DataFileError: %s: %s" % (type(e).__name__, e))
        continue
    if np.array_equal(out, expected):
        ok += 1
    else:
        bad.append("wrong data")
print(json.dumps({"ok": ok, "errors": errors, "bad": bad[:5], "n_bad": len(bad)}))
"""


def test_concurrent_rewrite_never_kills_a_default_read(tmp_path):
    """A writer truncates and rewrites the file in a loop while a reader reads it with default
    settings. Before: the default picked mmap for this window and the reader died of SIGBUS (3 runs
    of 3 on the CI VM). Now every read is correct or a DataFileError naming the file, and the
    reader exits normally."""
    arr = np.arange(256 * 4096, dtype=np.float32).reshape(256, 4096)  # 4 MiB
    path = str(tmp_path / "hot.npy")
    np.save(path, arr)
    seconds = 3.0
    writer = subprocess.Popen([sys.executable, "-c", _REWRITER, path, str(seconds)], stdout=subprocess.PIPE, text=True)
    try:
        reader = subprocess.run([sys.executable, "-c", _READER, path, str(seconds)], cwd=ROOT, capture_output=True,
                                text=True, timeout=DEADLINE_S + seconds)
    except subprocess.TimeoutExpired:
        pytest.fail("the reader hung while the file was rewritten")
    finally:
        rewrites = writer.communicate(timeout=DEADLINE_S)[0]
    assert reader.returncode == 0, (
        f"reader ended with {reader.returncode}"
        f"{' (' + signal.Signals(-reader.returncode).name + ')' if reader.returncode < 0 else ''}: "
        f"{reader.stderr[-2000:]}")
    got = json.loads(reader.stdout.strip().splitlines()[-1])
    assert got["n_bad"] == 0, got
    # both outcomes occurred, so reads really raced the rewrites
    assert got["ok"] > 0 and got["errors"] > 0 and int(rewrites) > 0, (got, rewrites)


def test_file_emptied_before_mmap_is_named(tmp_path, monkeypatch):
    """method="mmap" on a file that is emptied (or changes size) after its header was read: an
    error naming the file. Before: ValueError "cannot mmap an empty file", no file named."""
    import dali_mesh.formats.npy.npy_reader as npy

    path = str(tmp_path / "gone.npy")
    np.save(path, np.arange(64, dtype=np.float32).reshape(8, 8))
    region = Region((0, 0), (8, 8), (0, 0), (8, 8), (0, 0), (8, 8), "constant")
    real = npy._read_header
    for size in (0, 100):
        np.save(path, np.arange(64, dtype=np.float32).reshape(8, 8))

        def header_then_truncate(obj, p, stats, size=size):
            h = real(obj, p, stats)
            os.truncate(p, size)  # another process empties the file right after the header was read
            return h

        monkeypatch.setattr(npy, "_read_header", header_then_truncate)
        with pytest.raises(DataFileError, match=r"gone\.npy: .*(changed size|shrank|memory-mapped)") as info:
            read_npy_window(path, region, method="mmap")
        assert info.value.path == path
        # the default path turns the same race into a TruncatedFileError naming the file
        np.save(path, np.arange(64, dtype=np.float32).reshape(8, 8))
        with pytest.raises(TruncatedFileError, match=r"gone\.npy"):
            read_npy_window(path, region)
        monkeypatch.setattr(npy, "_read_header", real)
