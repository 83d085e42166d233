"""Sources without DALI: the sample order, windows against the oracle, forecasting, bad input."""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from dali_mesh import Layout, MeshInfo, sample_order
from dali_mesh.io import DataFileError, ShapeMismatchError, TruncatedFileError
from dali_mesh.partition import take_window
from dali_mesh.source import ForecastSpec, HDF5Source, NumpySource, ZarrSource
from tests.helpers import run_python  # noqa: E402


def info(idx, epoch=0):
    return SimpleNamespace(idx_in_epoch=idx, idx_in_batch=0, iteration=0, epoch_idx=epoch)


def _npy_files(tmp_path, n=7, shape=(6, 10), dtype=np.float32):
    files = []
    for i in range(n):
        p = str(tmp_path / f"s{i:02d}.npy")
        np.save(p, (np.arange(np.prod(shape)).reshape(shape) + 1000 * i).astype(dtype))
        files.append(p)
    return files


def _layout(coordinate, **kw):
    mesh = MeshInfo((2, 2), ("data_parallel", "model_parallel"), coordinate)
    kw.setdefault("shard", {"model_parallel": 1})
    return Layout(mesh, **kw)


def test_numpy_source_follows_sample_order_and_stops_on_a_batch_boundary(tmp_path):
    files = _npy_files(tmp_path)
    for coordinate in [(0, 0), (0, 1), (1, 0), (1, 1)]:
        layout = _layout(coordinate, halo={1: 3}, boundary={1: "periodic"})
        src = NumpySource(files, layout, batch_size=3, seed=5)
        for epoch in (0, 1):
            ids, pads = sample_order(7, epoch, seed=5, batch_size=3, batch_index=coordinate[0],
                                     num_batch_groups=2)
            assert len(src) == len(ids) == 6  # ceil(7 / 2) = 4 -> padded to 2 batches of 3
            for i in range(len(src)):
                window, sid, pad = src(info(i, epoch))
                assert int(sid) == ids[i] and bool(pad) == pads[i]
                assert sid.dtype == np.int64 and pad.dtype == bool and sid.ndim == pad.ndim == 0
                np.testing.assert_array_equal(window, take_window(np.load(files[ids[i]]), src.region))
            with pytest.raises(StopIteration):
                src(info(len(src), epoch))
    assert src.output_ndims == (2, 0, 0) and src.num_outputs == 3


def test_sample_groups_split_the_data_and_replicas_agree(tmp_path):
    files = _npy_files(tmp_path, n=8)
    seen = []
    for b in (0, 1):
        left = NumpySource(files, _layout((b, 0)), batch_size=2, seed=1)
        right = NumpySource(files, _layout((b, 1)), batch_size=2, seed=1)
        ids_left = [int(left(info(i, 3))[1]) for i in range(len(left))]
        ids_right = [int(right(info(i, 3))[1]) for i in range(len(right))]
        assert ids_left == ids_right  # same sample group: same samples, different windows
        seen += ids_left
    assert sorted(seen) == list(range(8))


def test_drop_last_and_no_shuffle(tmp_path):
    files = _npy_files(tmp_path, n=7)
    src = NumpySource(files, _layout((1, 0)), batch_size=2, shuffle=False, drop_last=True)
    assert len(src) == 2  # floor(7 / 2) = 3 samples per group: one whole batch of 2
    assert [int(src(info(i))[1]) for i in range(2)] == [1, 3]
    with pytest.raises(StopIteration):
        src(info(2))


def test_pickle_round_trip_reads_the_same(tmp_path):
    files = _npy_files(tmp_path)
    src = NumpySource(files, _layout((0, 1), halo=1, boundary="reflect"), batch_size=2, channels=[5, 0, 2])
    first = src(info(1))
    back = pickle.loads(pickle.dumps(src))
    again = back(info(1))
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(first[0], take_window(np.load(files[int(first[1])])[[5, 0, 2]], src.region))


def test_shape_mismatch_names_the_file_unless_per_sample_shapes(tmp_path):
    files = _npy_files(tmp_path, n=3)
    odd = str(tmp_path / "odd.npy")
    np.save(odd, np.zeros((6, 12), np.float32))
    files.append(odd)
    src = NumpySource(files, _layout((0, 1)), batch_size=1, shuffle=False)
    with pytest.raises(ShapeMismatchError, match=r"odd\.npy.*\(6, 12\).*\(6, 10\)"):
        src.read_sample(3)
    with pytest.raises(ShapeMismatchError, match=r"odd\.npy"):
        NumpySource(files, _layout((0, 1)), check_files=True)
    per = NumpySource(files, _layout((0, 1), halo=1), per_sample_shapes=True)
    assert per.region is None
    (window,) = per.read_sample(3)
    region = per.region_of((6, 12))
    assert window.shape == region.window_shape == (8, 8)  # (6 + 2 halo, 12 / 2 + 2 halo)


def test_missing_and_truncated_files_name_the_file(tmp_path):
    files = _npy_files(tmp_path, n=3)
    os.remove(files[1])
    with open(files[2], "r+b") as f:
        f.truncate(200)
    src = NumpySource(files, _layout((0, 0)), shuffle=False)
    with pytest.raises(FileNotFoundError, match=r"s01\.npy"):
        src.read_sample(1)
    with pytest.raises(TruncatedFileError, match=r"s02\.npy.*truncated"):
        src.read_sample(2)
    with pytest.raises(FileNotFoundError, match=r"nope\.npy"):
        NumpySource([str(tmp_path / "nope.npy")], _layout((0, 0)))


def test_trim_rank_with_nothing_gets_an_empty_window(tmp_path):
    files = _npy_files(tmp_path, n=2, shape=(3, 4))
    mesh = MeshInfo((8,), ("model_parallel",), (6,))
    src = NumpySource(files, Layout(mesh, shard={"model_parallel": 1}, halo=1, boundary="trim"))
    window, _, _ = src(info(0))
    assert window.shape == (3, 0)


# ---- time series across files: HDF5 and Zarr ------------------------------------------------------
YEARS = [np.random.default_rng(y).standard_normal((n, 3, 8, 10)).astype(np.float32)
         for y, n in ((2000, 5), (2001, 4), (2002, 6))]
ALL = np.concatenate(YEARS)


@pytest.fixture(scope="module")
def year_files(tmp_path_factory):
    import h5py
    import zarr

    d = tmp_path_factory.mktemp("years")
    h5, zs = [], []
    for y, arr in zip((2000, 2001, 2002), YEARS):
        p = str(d / f"{y}.h5")
        with h5py.File(p, "w") as f:
            f.create_dataset("fields", data=arr, chunks=(1, 1, 4, 10))
        h5.append(p)
        z = str(d / f"{y}.zarr")
        g = zarr.open_group(z, mode="w", zarr_format=2 if y == 2001 else 3)
        g.create_array("fields", shape=arr.shape, chunks=(1, 3, 4, 5), dtype="f4")[:] = arr
        zs.append(z)
    return h5, zs


@pytest.mark.parametrize("kind,stride", [("hdf5", 1), ("zarr", 1), ("hdf5", 2), ("zarr", 2)])
def test_forecast_crosses_year_files(year_files, kind, stride):
    files = year_files[0] if kind == "hdf5" else year_files[1]
    cls = HDF5Source if kind == "hdf5" else ZarrSource
    layout = _layout((1, 1), shard={"model_parallel": 1}, halo={1: 1, 2: 2},
                     boundary={1: "reflect", 2: "periodic"})
    src = cls(files, "fields", layout, batch_size=2, seed=2,
              forecast=ForecastSpec(history=2, lead=3, stride=stride), channels=[2, 0])
    assert src.num_samples == 15 - 5 * stride and src.output_names == ("input", "target", "sample_id", "is_pad")
    assert src.output_ndims == (4, 4, 0, 0)
    assert src.step_of(0) == 2 * stride
    region = src.region
    for i in range(len(src)):
        inp, tgt, sid, pad = src(info(i, 1))
        t = src.step_of(int(sid))
        exp_in = np.stack([take_window(s[[2, 0]], region) for s in ALL[t - 2 * stride:t + 1:stride]])
        exp_tg = np.stack([take_window(s[[2, 0]], region) for s in ALL[t + stride:t + 3 * stride + 1:stride]])
        np.testing.assert_array_equal(inp, exp_in)
        np.testing.assert_array_equal(tgt, exp_tg)
    assert {src.locate(s)[0] for s in range(15)} == {0, 1, 2}
    assert pickle.loads(pickle.dumps(src)).read_sample(4)[1].shape == (3,) + region.window_shape


def test_plain_samples_and_time_range(year_files):
    h5, _ = year_files
    src = HDF5Source(h5, "fields", _layout((0, 0)), shuffle=False, time_range=(3, 12))
    assert src.num_samples == 9 and src.output_names == ("window", "sample_id", "is_pad")
    (w,) = src.read_sample(0)
    np.testing.assert_array_equal(w, take_window(ALL[3], src.region))
    src = HDF5Source(h5, "fields", _layout((0, 0)), forecast=ForecastSpec(history=1, lead=0))
    assert src.output_names == ("input", "sample_id", "is_pad") and src.read_sample(0)[0].shape[0] == 2
    # every 4th step of 3:12 (the Python reader; the native one: tests/pipeline/test_read_windows.py)
    src = ZarrSource(year_files[1], "fields", _layout((0, 0)), shuffle=False, time_range=(3, 12), time_stride=4)
    assert src.num_samples == 3 and [src.step_of(i) for i in range(3)] == [3, 7, 11]
    for i, t in enumerate((3, 7, 11)):
        np.testing.assert_array_equal(src.read_sample(i)[0], take_window(ALL[t], src.region))
    assert src.fingerprint()["time_stride"] == 4 and "time_stride" not in HDF5Source(h5, "fields", _layout((0, 0))).fingerprint()


def test_time_window_past_the_data(year_files):
    h5, zs = year_files
    with pytest.raises(DataFileError, match=r"2002\.h5.*time range 0:16 runs past the data.*15 steps"):
        HDF5Source(h5, "fields", _layout((0, 0)), time_range=(0, 16))
    with pytest.raises(DataFileError, match=r"2002\.zarr.*spans 17 consecutive steps \(history 10, lead 6, stride 1\)"):
        ZarrSource(zs, "fields", _layout((0, 0)), forecast=ForecastSpec(history=10, lead=6))
    with pytest.raises(DataFileError, match=r"spans 16 consecutive steps \(history 1, lead 4, stride 3\)"):
        ZarrSource(zs, "fields", _layout((0, 0)), forecast=ForecastSpec(history=1, lead=4, stride=3))
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="ForecastSpec.stride must be an integer >= 1"):
            ForecastSpec(stride=bad)


def test_time_series_bad_files(year_files, tmp_path):
    import h5py

    h5, zs = year_files
    odd = str(tmp_path / "odd.h5")
    with h5py.File(odd, "w") as f:
        f.create_dataset("fields", data=np.zeros((2, 3, 8, 11), np.float32))
        f.create_dataset("other", data=np.zeros((2, 3, 8, 10), np.float32))
    with pytest.raises(ShapeMismatchError, match=r"odd\.h5.*\(3, 8, 11\)"):
        HDF5Source(h5 + [odd], "fields", _layout((0, 0)))
    with pytest.raises(DataFileError, match=r"2000\.h5.*no dataset 'temperature'"):
        HDF5Source(h5, "temperature", _layout((0, 0)))
    with pytest.raises(DataFileError, match=r"2000\.zarr.*no array 'temperature'"):
        ZarrSource(zs, "temperature", _layout((0, 0)))
    with pytest.raises(FileNotFoundError, match=r"gone\.h5"):
        HDF5Source([str(tmp_path / "gone.h5")], "fields", _layout((0, 0)))
    per = HDF5Source(h5 + [odd], "fields", _layout((0, 0), halo=1), per_sample_shapes=True, shuffle=False)
    (w,) = per.read_sample(15)
    assert w.shape == per.region_of((3, 8, 11)).window_shape


def test_import_is_light():
    """DALI's spawn workers unpickle sources: importing them must not pull torch, DALI, h5py, zarr."""
    code = ("import sys, dali_mesh, dali_mesh.io, dali_mesh.source, dali_mesh.pipeline.watchdog, dali_mesh.pipeline.external; "
            "bad = [m for m in ('torch', 'nvidia.dali', 'h5py', 'zarr') if m in sys.modules]; "
            "sys.exit(f'imported {bad}' if bad else 0)")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    res = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": root})
    assert res.returncode == 0, res.stderr + res.stdout


def test_output_buffers_are_recycled_only_when_nobody_holds_them(tmp_path):
    files = _npy_files(tmp_path, n=4)
    src = NumpySource(files, _layout((0, 1)), batch_size=2, shuffle=False)
    held = src.read_sample(0)[0]
    address = held.__array_interface__["data"][0]
    second = src.read_sample(1)[0]
    assert second.__array_interface__["data"][0] != address  # `held` is still ours: not reused
    np.testing.assert_array_equal(held, take_window(np.load(files[0]), src.region))
    view = second[1:]
    del second
    third = src.read_sample(2)[0]  # `view` keeps the second buffer alive, so a third one is made
    np.testing.assert_array_equal(view, take_window(np.load(files[1]), src.region)[1:])
    del held
    again = src.read_sample(3)[0]  # the first buffer is free again
    assert again.__array_interface__["data"][0] == address
    np.testing.assert_array_equal(again, take_window(np.load(files[3]), src.region))
    np.testing.assert_array_equal(third, take_window(np.load(files[2]), src.region))
    fresh = NumpySource(files, _layout((0, 1)), reuse_buffers=False)
    a = fresh.read_sample(0)[0]
    b = fresh.read_sample(0)[0]
    assert a is not b


def test_a_source_over_2_to_the_40_steps_needs_no_table(tmp_path):
    """The sample order is O(1) per index: a small chunked file claiming 2**40 steps (unwritten
    chunks read as the fill value) makes a source at once, without a 2**40-entry permutation."""
    import tracemalloc

    h5py = pytest.importorskip("h5py")
    path = str(tmp_path / "huge.h5")
    with h5py.File(path, "w") as f:
        f.create_dataset("x", shape=(2 ** 40, 4, 6), chunks=(1, 4, 6), dtype="f4", fillvalue=7.0)
    layout = _layout((1, 0))
    tracemalloc.start()
    try:
        src = HDF5Source([path], "x", layout, batch_size=4, seed=3)
        assert src.num_samples == 2 ** 40 and len(src) == 2 ** 39
        order = layout.order(2 ** 40, 2, seed=3, batch_size=4)
        for i in (0, 1, len(src) // 3, len(src) - 1):
            window, sid, pad = src(info(i, epoch=2))
            assert (int(sid), bool(pad)) == order[i]
            assert window.shape == (4, 3) and (window == 7.0).all()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"peak Python allocation {peak} bytes"
    with pytest.raises(StopIteration):
        src(info(len(src), epoch=2))


def test_hdf5_source_passes_allow_external_to_the_reader(tmp_path):
    h5py = pytest.importorskip("h5py")
    raw = tmp_path / "raw.bin"
    data = np.arange(4 * 2 * 6, dtype=np.uint8).reshape(4, 2, 6)
    raw.write_bytes(data.tobytes())
    path = str(tmp_path / "ext.h5")
    with h5py.File(path, "w") as f:
        f.create_dataset("x", shape=data.shape, dtype="u1", external=[(str(raw), 0, data.nbytes)])
    layout = _layout((0, 1))
    with pytest.raises(DataFileError, match=r"ext\.h5.*external file"):
        HDF5Source([path], "x", layout)
    src = HDF5Source([path], "x", layout, allow_external=True, shuffle=False)
    window, sid, _ = src(info(0))
    np.testing.assert_array_equal(window, take_window(data[int(sid)], src.region))
    with pytest.raises(TypeError, match="allow_external must be True or False, got 'yes'"):
        HDF5Source([path], "x", layout, allow_external="yes")


# ---- issue 19: a bounded number of open files per process ------------------------------------------
@pytest.mark.timeout(120)
def test_many_hdf5_files_read_under_a_low_open_file_limit(tmp_path):
    """One open HDF5 handle per file per worker: 200 gzip files under RLIMIT_NOFILE 64 failed with
    EMFILE. The handles are an LRU of ``max_open_files``; every step still equals h5py's."""
    h5py = pytest.importorskip("h5py")
    files = []
    for i in range(200):
        files.append(str(tmp_path / f"y{i:03d}.h5"))
        with h5py.File(files[-1], "w") as f:
            f.create_dataset("fields", data=np.full((1, 2, 6, 4), i, np.float32), compression="gzip")
    proc = run_python(f"""
        import resource
        import numpy as np
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        from dali_mesh import HDF5Source, Layout, MeshInfo
        layout = Layout(MeshInfo((1, 2), ("data_parallel", "mp"), (0, 1)), shard={{"mp": 2}})
        src = HDF5Source({files!r}, "fields", layout, batch_size=4, shuffle=False)
        for _ in range(2):  # twice: handles closed and opened again
            for i in range(200):
                (w,) = src.read_sample(i)
                assert w.shape == (2, 6, 2) and (w == i).all(), (i, w)
        assert len(src._memo["handles"]) <= src.max_open_files
        print("ok")
    """, timeout=100)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
