"""A ``.npy`` file rewritten in place while the Python reader reads windows of it (issue 29 item 8):
every window equals the window of one version of the file, or the read raises a
:class:`DataFileError` naming the file (:class:`FileChangedError` when the file's identity changed
during the read). Never a window that mixes two versions. Two writers: ``np.save`` over the file
(truncated, then written) and an overwrite of its data in place (``r+``, as a memmap writes)."""
from __future__ import annotations

import multiprocessing as mp
import os
import time

import numpy as np
import pytest

from dali_mesh.io import DataFileError, FileChangedError, read_npy_window
from dali_mesh.mesh import MeshInfo
from dali_mesh.partition import Layout, take_window

SHAPE = (32, 256, 128)  # 4 MiB of float32; an innermost split reads it in thousands of ranges


def _rewrite(path, how, versions, stop_at):
    """Write the versions over ``path`` in turn until ``stop_at`` (time.monotonic)."""
    k = 0
    fd = os.open(path, os.O_RDWR) if how == "overwrite" else None
    offset = os.path.getsize(path) - versions[0].nbytes
    while time.monotonic() < stop_at:
        v = versions[k % len(versions)]
        if fd is None:
            np.save(path, v)
        else:
            os.pwrite(fd, v.tobytes(), offset)
        k += 1
        time.sleep(0.003 * (k % 4))  # whole versions stand for a while, some writes follow at once
    if fd is not None:
        os.close(fd)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["np.save", "overwrite"])
def test_a_window_is_never_of_two_versions(tmp_path, how):
    path = str(tmp_path / "x.npy")
    versions = [np.full(SHAPE, v, np.float32) for v in (1.0, 2.0)]
    np.save(path, versions[0])
    region = Layout(MeshInfo((4,), ("mp",), (1,)), shard={"mp": 2}, halo={2: 3}).region(SHAPE)
    wants = [take_window(v, region) for v in versions]
    seconds = 2.0
    writer = mp.get_context("fork").Process(target=_rewrite, args=(path, how, versions, time.monotonic() + seconds))
    writer.start()
    good = changed = other = 0
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                w = read_npy_window(path, region)
            except FileChangedError as e:
                assert path in str(e) and "changed while it was read" in str(e)
                changed += 1
                continue
            except DataFileError as e:  # truncated, a header half written: named, never data
                assert path in str(e)
                other += 1
                continue
            assert any(np.array_equal(w, want) for want in wants), (
                f"a window mixing two versions: values {np.unique(w).tolist()}")
            good += 1
    finally:
        writer.join(30)
    assert good > 0 and changed + other > 0, (good, changed, other)
    if how == "overwrite":
        assert changed > 0  # the overwrite truncates nothing: only the file's identity tells
