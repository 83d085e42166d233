"""Sources in real DALI CPU pipelines: parallel workers (spawn), epochs, checkpoint resume, errors.

Each pipeline spawns a worker process (a few seconds on 2 cores), so these tests are few.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from dali_mesh import Layout, MeshInfo, sample_order
from dali_mesh.partition import take_window
from dali_mesh.source import NumpySource

dali = pytest.importorskip("nvidia.dali")
from nvidia.dali import pipeline_def  # noqa: E402

from dali_mesh.pipeline.external import partitioned_source  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BATCH = 2


@pytest.fixture(autouse=True)
def _workers_find_the_package(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))


def _files(tmp_path, n=7):
    files = []
    for i in range(n):
        p = str(tmp_path / f"sample{i}.npy")
        np.save(p, np.arange(5 * 12, dtype=np.float32).reshape(5, 12) + 100 * i)
        files.append(p)
    return files


def _source(files, **kw):
    mesh = MeshInfo((2, 3), ("data_parallel", "model_parallel"), (1, 2))
    layout = Layout(mesh, shard={"model_parallel": 1}, halo={1: 2}, boundary={1: "periodic"})
    return NumpySource(files, layout, batch_size=BATCH, seed=4, **kw)


def _pipe(src, **kw):
    @pipeline_def(batch_size=BATCH, num_threads=1, device_id=None, py_num_workers=1,
                  py_start_method="spawn", **kw)
    def pipe():
        return partitioned_source(src)

    p = pipe()
    p.build()
    return p


def _ids(outputs):
    return [int(np.array(outputs[1][k])) for k in range(BATCH)]


def _run_epoch(p):
    batches = []
    while True:
        try:
            w, sid, pad = p.run()
        except StopIteration:
            return batches
        batches.append([(np.array(w[k]), int(np.array(sid[k])), bool(np.array(pad[k]))) for k in range(BATCH)])


def test_parallel_source_two_epochs_match_the_oracle(tmp_path):
    files = _files(tmp_path)
    src = _source(files)
    p = _pipe(src)
    for epoch in (0, 1):
        batches = _run_epoch(p)
        ids, pads = sample_order(7, epoch, seed=4, batch_size=BATCH, batch_index=1, num_batch_groups=2)
        assert len(batches) == len(ids) // BATCH == 2  # StopIteration exactly after the last whole batch
        flat = [s for b in batches for s in b]
        assert [s[1] for s in flat] == ids.tolist() and [s[2] for s in flat] == pads.tolist()
        for window, sid, _ in flat:
            assert window.shape == (5, 8)
            np.testing.assert_array_equal(window, take_window(np.load(files[sid]), src.region))
        p.reset()


def test_checkpoint_restores_the_same_next_sample(tmp_path):
    files = _files(tmp_path, n=12)  # 6 per sample group: 3 batches per epoch
    src = _source(files)
    p = _pipe(src, enable_checkpointing=True)
    p.run()
    checkpoint = p.checkpoint()
    expected = _ids(p.run())
    del p
    restored = _pipe(src, enable_checkpointing=True, checkpoint=checkpoint)
    got = _ids(restored.run())
    assert got == expected
    ids, _ = sample_order(12, 0, seed=4, batch_size=BATCH, batch_index=1, num_batch_groups=2)
    assert got == ids[BATCH : 2 * BATCH].tolist()


def test_error_in_a_worker_names_the_file(tmp_path):
    files = _files(tmp_path, n=4)
    with open(files[3], "r+b") as f:  # no shuffle: sample group 1 of 2 reads files 1 and 3
        f.truncate(150)
    src = _source(files, shuffle=False)
    p = _pipe(src)
    with pytest.raises(Exception) as info:
        _run_epoch(p)
    assert "sample3.npy" in str(info.value) and "truncated" in str(info.value)


def test_batch_size_must_match_the_pipeline(tmp_path):
    src = _source(_files(tmp_path, n=2))

    @pipeline_def(batch_size=BATCH + 1, num_threads=1, device_id=None, py_num_workers=1,
                  py_start_method="spawn")
    def pipe():
        return partitioned_source(src)

    with pytest.raises(ValueError, match="batch_size is 3 but the source was built with batch_size=2"):
        pipe()


def test_hdf5_forecast_source_in_a_pipeline(tmp_path):
    """Four outputs (input, target, sample id, pad), h5py opened inside the worker process."""
    h5py = pytest.importorskip("h5py")
    from dali_mesh.source import ForecastSpec, HDF5Source

    years = [np.arange(n * 2 * 6 * 8, dtype=np.float32).reshape(n, 2, 6, 8) + 1000 * y for y, n in ((0, 3), (1, 4))]
    files = []
    for y, arr in enumerate(years):
        p = str(tmp_path / f"{2000 + y}.h5")
        with h5py.File(p, "w") as f:
            f.create_dataset("fields", data=arr)
        files.append(p)
    mesh = MeshInfo((1, 2), ("data_parallel", "model_parallel"), (0, 1))
    layout = Layout(mesh, shard={"model_parallel": 1}, halo={2: 1}, boundary={2: "periodic"})
    src = HDF5Source(files, "fields", layout, batch_size=BATCH, seed=1, forecast=ForecastSpec(history=1, lead=2))
    assert src.num_samples == 7 - 1 - 2

    @pipeline_def(batch_size=BATCH, num_threads=1, device_id=None, py_num_workers=1, py_start_method="spawn")
    def pipe():
        return partitioned_source(src, layout="FCHW")

    p = pipe()
    p.build()
    every = np.concatenate(years)
    seen = []
    for _ in range(2):
        inp, tgt, sid, pad = p.run()
        assert inp.layout() == "FCHW"
        for k in range(BATCH):
            t = src.step_of(int(np.array(sid[k])))
            seen.append(int(np.array(sid[k])))
            expected_in = np.stack([take_window(every[s], src.region) for s in (t - 1, t)])
            expected_tg = np.stack([take_window(every[s], src.region) for s in (t + 1, t + 2)])
            np.testing.assert_array_equal(np.array(inp[k]), expected_in)
            np.testing.assert_array_equal(np.array(tgt[k]), expected_tg)
    assert sorted(seen) == [0, 1, 2, 3]
    with pytest.raises(StopIteration):
        p.run()
