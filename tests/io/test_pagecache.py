"""dali_mesh.io.pagecache: eviction of the files a benchmark or the demo reads cold."""
from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from dali_mesh.io.pagecache import evict, read_bytes, walk_files


@pytest.mark.parametrize("as_", ["str", "pathlike", "list"])
def test_evict_takes_one_path_as_a_path(tmp_path, as_):
    """evict("file.npy") evicts that file (it iterated the letters of the name and opened "/")."""
    path = tmp_path / "f.npy"
    np.save(path, np.arange(1 << 18, dtype=np.float32))
    with open(path, "rb") as f:
        f.read()  # into the page cache
    arg = {"str": str(path), "pathlike": path, "list": [str(path)]}[as_]
    assert list(walk_files(arg)) == [str(path)]
    evict(arg)
    before = read_bytes()
    if before is None:
        pytest.skip("the kernel does not count read_bytes")
    with open(path, "rb") as f:
        f.read()
    assert read_bytes() - before >= os.path.getsize(path) - 4096  # all read from storage again: evicted


def test_evict_passes_over_a_fifo_without_waiting(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    done = threading.Event()
    t = threading.Thread(target=lambda: (evict([str(fifo)]), done.set()), daemon=True)
    t.start()
    assert done.wait(10), "evict blocked on a FIFO"
