"""The native reader's planning does not grow with the step count (issue 11 review, issue 9 item 11).

A tiny file claiming 2**31 steps must not hang (or fill memory) while the pipeline is defined; a
legitimate chunked HDF5 file of many steps plans per chunk layout, not per step; a Zarr chunk that
was never written is named. Windows are checked against ``take_window`` of numpy's data.
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from dali_mesh.partition import take_window

pytest.importorskip("nvidia.dali")

from dali_mesh.pipeline import native  # noqa: E402
from dali_mesh import Layout, MeshInfo
from dali_mesh.source import NumpySource, ZarrSource
dali = pytest.importorskip("nvidia.dali")
from nvidia.dali import pipeline_def  # noqa: E402
from tests.helpers import SEED  # noqa: E402
from tests.helpers import native_pipeline  # noqa: E402
from tests.helpers import mesh_of  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run_bounded(code: str, timeout: float = 60) -> str:
    """``code`` in a fresh interpreter, killed after ``timeout`` s (a hang guard, not a timing check)."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                           timeout=timeout, cwd=ROOT, env=env)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"still running after {timeout} s (the plan grows with the step count?): {e.stderr}")
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def _write_huge_zarr(path: str, steps: int, frame=(4, 6)) -> np.ndarray:
    """A Zarr v2 store claiming ``steps`` steps, uncompressed, chunks of one step, only step 0 written
    (a few hundred bytes on disk)."""
    os.makedirs(path)
    meta = {"zarr_format": 2, "shape": [steps, *frame], "chunks": [1, *frame], "dtype": "<f4",
            "compressor": None, "filters": None, "fill_value": 0.0, "order": "C"}
    with open(os.path.join(path, ".zarray"), "w") as f:
        json.dump(meta, f)
    step0 = np.arange(np.prod(frame), dtype="<f4").reshape(frame) + 1
    with open(os.path.join(path, "0." + ".".join("0" * len(frame))), "wb") as f:
        f.write(step0.tobytes())
    return step0


def test_two_to_the_31_steps_define_and_read_without_planning_every_step(tmp_path):
    # Before: read_windows walked every sample id (and a set of every step) while the pipeline was
    # defined, and hung with memory growing. Now: above MAX_NATIVE_SAMPLES the source goes to
    # partitioned_source with one log line, and the written step reads right.
    h5py = pytest.importorskip("h5py")
    zpath = str(tmp_path / "huge.zarr")
    step0 = _write_huge_zarr(zpath, 2**31)
    hpath = str(tmp_path / "huge.h5")
    with h5py.File(hpath, "w") as f:
        ds = f.create_dataset("x", shape=(2**31, 4, 6), chunks=(1, 4, 6), dtype="<f4")
        ds[0] = step0
    out = _run_bounded(f"""
        import logging, sys
        import numpy as np
        from nvidia.dali import pipeline_def
        from dali_mesh import Layout, MeshInfo
        from dali_mesh.pipeline import native
        from dali_mesh.source import HDF5Source, ZarrSource
        from dali_mesh.partition import take_window
        logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="LOG %(message)s")
        lay = Layout(MeshInfo((2,), ("mp",), (1,)), shard={{"mp": 1}}, halo={{1: 1}}, boundary="periodic")
        step0 = np.arange(24, dtype=np.float32).reshape(4, 6) + 1
        for src in (ZarrSource([{zpath!r}], None, lay, batch_size=2, shuffle=False),
                    HDF5Source([{hpath!r}], "x", lay, batch_size=2, shuffle=False)):
            assert src.num_samples == 2**31
            with __import__("pytest").raises(native.NotNativeError, match="MAX_NATIVE_SAMPLES"):
                native.plan_windows(src)

            @pipeline_def(batch_size=2, num_threads=1, device_id=None, py_num_workers=1)
            def pipe():
                return native.read_windows(src)

            p = pipe()
            p.build()
            wins, ids, pads = p.run()
            assert int(np.array(ids[0])) == 0
            np.testing.assert_array_equal(np.array(wins[0]), take_window(step0, src.region))
            np.testing.assert_array_equal(np.array(wins[1]), take_window(np.zeros((4, 6), np.float32), src.region))
            print("OK", type(src).__name__)
        """)
    assert out.count("OK") == 2, out
    assert out.count("LOG read_windows:") == 2 and "using partitioned_source" in out, out


def test_missing_zarr_chunk_is_named(tmp_path, caplog):
    zpath = str(tmp_path / "z.zarr")
    _write_huge_zarr(zpath, 6)  # steps 1..5 never written
    lay = Layout(MeshInfo((2,), ("mp",), (0,)), shard={"mp": 0})
    from dali_mesh.source import ZarrSource

    src = ZarrSource([zpath], None, lay, batch_size=1, shuffle=False)
    missing = os.path.join(zpath, "1.0.0")
    with pytest.raises(native.NotNativeError, match=f"{missing}: chunk file missing"):
        native.plan_windows(src)

    @pipeline_def(batch_size=1, num_threads=1, device_id=None)
    def pipe():
        return native.read_windows(src, fallback=False)

    with pytest.raises(native.NotNativeError, match=f"{missing}: chunk file missing"):
        pipe()

    @pipeline_def(batch_size=1, num_threads=1, device_id=None)
    def fallback():
        return native.read_windows(src)

    with caplog.at_level(logging.INFO, logger="dali_mesh.pipeline.native"):
        fallback()  # defined, not built: the log line says why the source is not read natively
    assert any(missing in r.getMessage() and "partitioned_source" in r.getMessage() for r in caplog.records)


def _chunked_h5(path: str, steps: int, frame=(3, 8), chunks=(4, 3, 4)) -> np.ndarray:
    h5py = pytest.importorskip("h5py")
    data = np.random.default_rng(SEED).integers(-1000, 1000, (steps,) + frame).astype(np.int16)
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=data, chunks=chunks)
    return data


def test_many_chunked_hdf5_steps_plan_per_chunk_layout(tmp_path, monkeypatch):
    # Before: the units of every step were planned anew (0.5 ms a step: 20,000 steps took 10 s),
    # after a chunk lookup that itself grows with the chunk count. Now the window's chunk pieces
    # are planned once, whatever the step count (the bases per step are numpy arithmetic, the chunk
    # offsets one pass over the index), and every step reads its own chunk.
    from dali_mesh.source import HDF5Source

    path = str(tmp_path / "many.h5")
    data = _chunked_h5(path, 20000)
    lay = Layout(MeshInfo((1, 2), ("dp", "mp"), (0, 1)), shard={"mp": 1}, halo={1: 3},
                 boundary="reflect")
    src = HDF5Source([path], "x", lay, batch_size=16, shuffle=True, seed=3)
    calls = []
    from dali_mesh.plan import chunks

    real = chunks.plan_npy_units
    monkeypatch.setattr(chunks, "plan_npy_units", lambda *a, **k: calls.append(1) or real(*a, **k))
    (plan,) = native.plan_windows(src)
    assert 0 < len(calls) <= 4  # the window's chunk pieces (2 chunks of 4 columns, 1 of 3 channels)
    # a finishing plan, then one merged plan per layout of the chunks relative to each other
    assert 2 <= len(plan.plans) <= 1 + chunks.MAX_MERGED_LAYOUTS
    assert plan.num_items == 20000
    assert {len(parts) for _, parts in plan.items[:100]} == {1}  # one read part per step

    p = native_pipeline(src, batch_size=16)
    seen = 0
    for _ in range(4):
        wins, ids, _ = p.run()
        for w, sid in zip(wins, ids):
            t = src.step_of(int(np.array(sid)))
            np.testing.assert_array_equal(np.array(w), take_window(data[t], src.region), err_msg=f"step {t}")
            seen += 1
    assert seen == 64


@pytest.mark.parametrize("chunks", [((4, 3, 4), (4, 3, 4)), ((3, 1, 8), (3, 1, 8)), ((4, 3, 4), (1, 3, 8))])
@pytest.mark.parametrize("merge", [True, False])
def test_chunked_hdf5_forecast_items(tmp_path, monkeypatch, chunks, merge):
    # forecast windows stack steps that lie in different chunks (and files, chunked alike or not:
    # then steps have different numbers of parts): each step's parts at its place in the window;
    # merged (a plan per layout of the chunks) or not (a part per chunk piece)
    from dali_mesh.source import ForecastSpec, HDF5Source

    if not merge:
        from dali_mesh.plan import chunks as io_chunks

        monkeypatch.setattr(io_chunks, "MAX_MERGED_LAYOUTS", 0)

    files, data = [], []
    for i, steps in enumerate((7, 6)):
        files.append(str(tmp_path / f"f{i}.h5"))
        data.append(_chunked_h5(files[-1], steps, chunks=chunks[i]) + 3 * i)
    # the second file holds other values: rewrite it
    import h5py

    with h5py.File(files[1], "r+") as f:
        f["x"][...] = data[1]
    full = np.concatenate(data)
    lay = Layout(MeshInfo((2,), ("mp",), (0,)), shard={"mp": 1}, halo={1: 2}, boundary="periodic")
    src = HDF5Source(files, "x", lay, batch_size=2, shuffle=False, forecast=ForecastSpec(history=1, lead=2))
    parts = {len(p) for _, p in native.plan_windows(src)[0].items}
    assert parts == {2} if merge else max(parts) > 2  # input: 2 steps of one part each, or more parts

    p = native_pipeline(src, batch_size=2)
    n = 0
    for _ in range(len(src) // 2):
        inp, tgt, ids, pads = p.run()
        for x, y, sid, pad in zip(inp, tgt, ids, pads):
            t = src.step_of(int(np.array(sid)))
            want_x = np.stack([take_window(full[s], src.region) for s in range(t - 1, t + 1)])
            want_y = np.stack([take_window(full[s], src.region) for s in range(t + 1, t + 3)])
            np.testing.assert_array_equal(np.array(x), want_x, err_msg=f"step {t}")
            np.testing.assert_array_equal(np.array(y), want_y, err_msg=f"step {t}")
            n += 1
    assert n == len(src)


# ---- the sample-id source: O(1) per index --------------------------------------------------------------
@pytest.mark.timeout(180)
def test_sample_ids_of_a_huge_claimed_sample_count_cost_one_batch():
    """A source claiming 2**40 samples: one call gives one batch from the stateless order (building
    the epoch's arrays would need terabytes)."""
    from dali_mesh.partition import SampleOrder

    layout = Layout(MeshInfo((2,), ("data_parallel",), (1,)), shard={})
    src = NumpySource.__new__(NumpySource)  # only what _SampleIds and sample_order read
    src.layout, src.num_samples, src.seed, src.shuffle = layout, 1 << 40, 7, True
    src.batch_size, src.drop_last, src._memo = 3, False, {}

    class Info:
        epoch_idx, iteration = 2, 1234567

    ids, pads, nxt = native._SampleIds(src, ahead=2)(Info)
    order = src.sample_order(2)
    assert isinstance(order, SampleOrder) and len(order) >= (1 << 39)
    want = [order[3 * 1234567 + k] for k in range(3)]
    assert [int(i) for i in ids] == [s for s, _ in want]
    assert [bool(p) for p in pads] == [p for _, p in want]
    assert all(0 <= int(i) < (1 << 40) for i in ids)
    # the two batches read ahead: per sample its id in each
    assert [[int(i) for i in n] for n in nxt] == [[order[3 * (1234567 + b) + k][0] for b in (1, 2)] for k in range(3)]


# ---- issue 19: planning is bounded before the work ---------------------------------------------------
@pytest.mark.timeout(30)
def test_a_small_zarray_claiming_a_huge_unwritten_grid_falls_back_quickly(tmp_path):
    """A 150-byte .zarray whose window covers 524,288 never-written chunks (131,072 took 60-151 s and 1.2 GiB
    before falling back: every chunk piece was planned, then the first missing file found)."""
    import json

    store = tmp_path / "tiny.zarr"
    store.mkdir()
    (store / ".zarray").write_text(json.dumps({
        "zarr_format": 2, "shape": [1, 1024, 1024], "chunks": [1, 1, 1], "dtype": "<f4", "compressor": None,
        "fill_value": 0.0, "filters": None, "order": "C"}))
    src = ZarrSource([str(store)], None, Layout(mesh_of((1, 2), (0, 1)), shard={"m0": 1}), batch_size=1)
    with pytest.raises(native.NotNativeError, match="chunk file missing"):
        native.plan_windows(src)


# ---- issue 19 item 12: a plan grows with the window's distinct runs, not its elements ------------------
def _rows_source(kind, path, data, layout):
    from dali_mesh.source import HDF5Source

    if kind == "npy":
        files = []
        for i, d in enumerate(data):
            files.append(f"{path}.{i}.npy")
            np.save(files[-1], d)
        return NumpySource(files, layout, batch_size=2, shuffle=False)
    if kind == "zarr":
        import zarr
        from numcodecs import Blosc

        z = zarr.create_array(path, shape=data.shape, chunks=(1, data.shape[1] // 4, 4), dtype="f4", zarr_format=2,
                              compressors=[Blosc("lz4", 5, Blosc.SHUFFLE)])
        z[:] = data
        return ZarrSource([path], None, layout, batch_size=2, shuffle=False)
    import h5py

    with h5py.File(path, "w") as f:
        if kind == "hdf5":
            f["x"] = data  # contiguous
        else:  # gzip chunks
            f.create_dataset("x", data=data, chunks=(1, data.shape[1] // 4, 4), compression="gzip")
    return HDF5Source([path], "x", layout, batch_size=2, shuffle=False)


@pytest.mark.parametrize("kind", ["npy", "zarr", "hdf5", "hdf5_gzip"])
def test_a_window_of_many_rows_plans_in_runs_not_elements(tmp_path, kind):
    # Before: a (2**24, 4) float32 file split on its last axis planned one unit (24 bytes) per row, a
    # 384 MiB plan (6x the window; 2.4 GiB at definition). The rows of a box are one unit repeated at
    # the row stride now: here 2**20 rows plan in a few hundred bytes (24 MiB before), and read as
    # numpy reads them, on 2 threads (the reads split into tasks of a repeated unit's runs).
    rows = 1 << 20 if kind in ("npy", "hdf5") else 1 << 18
    rng = np.random.default_rng(SEED)
    data = rng.standard_normal((2, rows, 4)).astype("f4")
    lay = Layout(mesh_of((1, 4), (0, 2)), shard={"m0": 1})
    src = _rows_source(kind, str(tmp_path / "rows"), data, lay)
    (plan,) = native.plan_windows(src)
    size = len(plan.to_bytes())
    assert size < 64 << 10, size
    runs = sum(int(p.unit_count.sum()) for p in plan.plans)
    assert runs >= rows  # the same runs as before: one per row (per chunk's rows, decoded)
    p = native_pipeline(src, task_bytes=1 << 20)
    wins, ids, _ = p.run()
    for w, sid in zip(wins, ids):
        np.testing.assert_array_equal(np.array(w), take_window(data[int(np.array(sid))], src.region))


@pytest.mark.parametrize("kind", ["npy", "zarr", "hdf5"])
@pytest.mark.parametrize("rank", [0, 1, 3])
def test_rows_whose_boxes_interleave_are_planned_run_by_run(tmp_path, kind, rank):
    # a periodic halo on the split (last) axis: the edge ranks' windows take columns from both ends of
    # every row, two boxes whose repeated units would interleave in the file: planned run by run
    # (as before), the inner rank's in repeated units; every window as numpy's
    rows = 1 << 12
    rng = np.random.default_rng(SEED + rank)
    data = rng.standard_normal((2, rows, 4)).astype("f4")
    lay = Layout(mesh_of((1, 4), (0, rank)), shard={"m0": 1}, halo={1: 1}, boundary={0: "reflect", 1: "periodic"})
    src = _rows_source(kind, str(tmp_path / "rows"), data, lay)
    (plan,) = native.plan_windows(src)
    units = sum(len(p.file_off) for p in plan.plans)
    assert units < 64 if rank == 1 and kind != "zarr" else units > 0
    for threads in (1, 2):
        p = native_pipeline(src, threads=threads, task_bytes=4096)
        wins, ids, _ = p.run()
        for w, sid in zip(wins, ids):
            np.testing.assert_array_equal(np.array(w), take_window(data[int(np.array(sid))], src.region))
