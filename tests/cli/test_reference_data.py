"""``dali-mesh plan`` and ``demo`` with ``--data reference://...``: a Kerchunk reference set of an HDF5 file
(shuffle + deflate chunks) is a Zarr store at its root. The plan's cold bytes per rank are the referenced
ranges' lengths of the chunks its window touches (kerchunk's own set, read with json); the demo reads it on
every rank and checks every window against the file (h5py)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from dali_mesh.cli import main
from tests.helpers import SEED

pytest.importorskip("kerchunk")

SHAPE, CHUNKS = (4, 2, 24, 16), (1, 2, 8, 16)


@pytest.fixture
def reference_set(tmp_path):
    """``(reference:// location, the set as kerchunk wrote it, the array as h5py wrote it)``."""
    import h5py
    from kerchunk.hdf import SingleHdf5ToZarr

    x = np.random.default_rng(SEED).standard_normal(SHAPE).astype("<f4")
    path = str(tmp_path / "era.h5")
    with h5py.File(path, "w") as f:
        f.create_dataset("t2m", data=x, chunks=CHUNKS, compression="gzip", shuffle=True)
    refs = SingleHdf5ToZarr(path, inline_threshold=0).translate()
    (tmp_path / "era.json").write_text(json.dumps(refs))
    return f"reference://{tmp_path / 'era.json'}", refs, x


def _cli(capsys, argv):
    capsys.readouterr()
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_plan_counts_the_referenced_ranges_each_rank_touches(reference_set, capsys):
    location, refs, _ = reference_set
    code, out, err = _cli(capsys, ["plan", "--data", location, "--mesh", "model_parallel=3", "--shard",
                                   "model_parallel=1", "--halo", "1=2", "--json"])
    assert code == 0, err
    rows = json.loads(out)
    assert len(rows) == 3
    for row in rows:
        # rows of the (C, lat, lon) sample, the halo past the edges filled, not read
        lo, hi = max(row["window_start"][1], 0), min(row["window_stop"][1], SHAPE[2])
        touched = range(lo // CHUNKS[2], (hi - 1) // CHUNKS[2] + 1)
        assert row["cold_bytes"] == sum(refs["refs"][f"t2m/0.0.{i}.0"][2] for i in touched), row


@pytest.mark.timeout(240)
def test_demo_reads_a_reference_set_on_every_rank(reference_set, tmp_path, monkeypatch, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("nvidia.dali")
    monkeypatch.chdir(tmp_path)
    location, _, _ = reference_set
    code, out, err = _cli(capsys, ["demo", "--data", location, "--nproc", "2", "--mesh", "model_parallel=2",
                                   "--shard", "model_parallel=1", "--halo", "1=1", "--batch-size", "1",
                                   "--timeout", "200"])
    assert code == 0, out + err
    assert "reader: native" in out and out.strip().endswith("all 4 samples verified"), out
    # the set's files are read through the local store, which counts no fetch: no "0.0 MiB read" claimed
    assert "bytes: planned window bytes" in out, out
