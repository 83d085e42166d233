"""A ``.npy`` file rewritten in place while the Python reader reads windows of it (issue 29 item 8):
every window equals the window of one version of the file, or the read raises a
:class:`DataFileError` naming the file (:class:`FileChangedError` when the file's identity changed
during the read). Never a window that mixes two versions.

``np.save`` over a file truncates it, then writes it: a read that starts while it writes sees a
short file (refused), and a rewrite that starts after the read opened the file stamps its times,
which the read compares after it reads. What no stat can tell: an overwrite in place without a
change of size (``r+``, a memmap) whose write had begun before the read opened the file and is
stalled while it reads (a file's times are stamped when a write starts); the README says so."""
from __future__ import annotations

import multiprocessing as mp
import os
import time

import numpy as np
import pytest

from dali_mesh.formats.npy import read_npy_window
from dali_mesh.io import DataFileError, FileChangedError
from dali_mesh.formats.npy import npy_reader as npy_module
from dali_mesh.mesh import MeshInfo
from dali_mesh.partition import Layout, take_window

SHAPE = (32, 256, 128)  # 4 MiB of float32; an innermost split reads it in thousands of ranges


def _region():
    return Layout(MeshInfo((4,), ("mp",), (1,)), shard={"mp": 2}, halo={2: 3}).region(SHAPE)


def test_a_rewrite_between_two_reads_of_a_window_is_refused(tmp_path, monkeypatch):
    """Deterministic: the file is saved over (np.save, the same size) after the first of the
    window's reads; the window would mix the versions, so the read raises, naming the file."""
    path = str(tmp_path / "x.npy")
    versions = [np.full(SHAPE, v, np.float32) for v in (1.0, 2.0)]
    np.save(path, versions[0])
    real = npy_module.readv_all
    calls = []

    def preadv_then_rewrite(*args, **kwargs):
        out = real(*args, **kwargs)
        calls.append(1)
        if len(calls) == 1:
            np.save(path, versions[1])
        return out

    monkeypatch.setattr(npy_module, "readv_all", preadv_then_rewrite)
    monkeypatch.setattr(npy_module, "DEFAULT_MERGE_GAP", 0)
    with pytest.raises(FileChangedError, match=f"{path}: changed while it was read"):
        read_npy_window(path, _region(), merge_gap=0, page_merge=False)
    assert len(calls) > 1  # the window took several reads
    monkeypatch.setattr(npy_module, "readv_all", real)
    np.testing.assert_array_equal(read_npy_window(path, _region()), take_window(versions[1], _region()))


def _rewrite(path, versions, stop_at):
    """np.save the versions over ``path`` in turn until ``stop_at`` (time.monotonic)."""
    k = 0
    while time.monotonic() < stop_at:
        np.save(path, versions[k % len(versions)])
        k += 1
        time.sleep(0.004 * (k % 4))  # whole versions stand for a while, some rewrites follow at once


def race_with_saves(path, versions, read, wants, seconds=2.0, refusals=(DataFileError,)) -> tuple[int, int]:
    """``read()`` windows for ``seconds`` while another process saves ``versions`` over ``path`` in
    turn: each window must equal one of ``wants``, or ``read`` raises one of ``refusals`` naming
    ``path``. Returns (windows read, refusals)."""
    writer = mp.get_context("fork").Process(target=_rewrite, args=(path, versions, time.monotonic() + seconds))
    writer.start()
    good = refused = 0
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                w = read()
            except refusals as e:  # changed, truncated, a header half written: named, never data
                assert path in str(e), str(e)[-600:]
                refused += 1
                continue
            if w is None:
                continue
            assert any(np.array_equal(w, want) for want in wants), (
                f"a window mixing two versions: values {np.unique(w).tolist()}")
            good += 1
    finally:
        writer.join(30)
    return good, refused


@pytest.mark.timeout(60)
def test_a_window_is_never_of_two_versions(tmp_path):
    """A writer saves two versions over the file in turn while windows are read."""
    path = str(tmp_path / "x.npy")
    versions = [np.full(SHAPE, v, np.float32) for v in (1.0, 2.0)]
    np.save(path, versions[0])
    region = _region()
    good, refused = race_with_saves(path, versions, lambda: read_npy_window(path, region),
                                    [take_window(v, region) for v in versions])
    assert good > 0 and refused > 0, (good, refused)
