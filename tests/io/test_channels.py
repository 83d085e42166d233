"""Channel subsets with repeats and in any order, on every read path, against ``a[channels]``.

Issue 9, item 1: ``channels=[4, 2, 4]`` on the preadv path gave zeros, stale values of the previous
sample or an IndexError naming no file; mmap, O_DIRECT, HDF5 and Zarr were right. Each output here
starts as a buffer full of a sentinel, as a pooled buffer holding the previous sample would.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dali_mesh import Layout, MeshInfo
from dali_mesh.io import DataFileError
from dali_mesh.plan import plan_window
from dali_mesh.formats.npy import read_npy_window
from dali_mesh.partition import BOUNDARIES, Region, take_window
from dali_mesh.source import HDF5Source, NumpySource, ZarrSource
from tests.helpers import one_rank_layout

h5py = pytest.importorskip("h5py")
zarr = pytest.importorskip("zarr")
from dali_mesh.formats.hdf5 import read_hdf5_window  # noqa: E402
from dali_mesh.formats.zarr import open_zarr_array, read_zarr_window  # noqa: E402

T, C, H, W = 3, 6, 9, 11
DATA = np.random.default_rng(3).standard_normal((T, C, H, W)).astype(">f4")
SENTINEL = np.float32(-12345.5)


@pytest.fixture(scope="module")
def readers(tmp_path_factory):
    d = tmp_path_factory.mktemp("channels")
    c_path, f_path = str(d / "c.npy"), str(d / "f.npy")
    np.save(c_path, DATA)
    np.save(f_path, np.asfortranarray(DATA))
    h5 = str(d / "a.h5")
    with h5py.File(h5, "w") as f:
        f.create_dataset("contiguous", data=DATA)
        f.create_dataset("chunked", data=DATA, chunks=(1, 2, 4, 5), compression="gzip")
    z2 = str(d / "a.zarr")
    a = zarr.create_array(store=z2, shape=DATA.shape, chunks=(1, 4, 4, 4), dtype="<f4", zarr_format=2)
    a[:] = DATA
    f5 = h5py.File(h5, "r")
    zarr_arr = open_zarr_array(z2)
    direct_ok = True
    try:
        read_npy_window(c_path, Region((0,), (1,), (0,), (1,), (0,), (1,), "constant"), prefix=(0, 0, 0),
                        direct=True)
    except Exception:  # this file system refuses O_DIRECT
        direct_ok = False

    def npy(path, **kw):
        return lambda region, out, t, ch: read_npy_window(path, region, out, prefix=(t,), index_maps={0: ch}, **kw)

    paths = {
        "preadv": npy(c_path, method="preadv"),
        "preadv-fortran": npy(f_path, method="preadv"),
        "preadv-gap0": npy(c_path, method="preadv", merge_gap=0, page_merge=False),
        "default": npy(c_path),
        "mmap": npy(c_path, method="mmap"),
        "mmap-fortran": npy(f_path, method="mmap"),
        "h5-contiguous": lambda region, out, t, ch: read_hdf5_window(
            f5["contiguous"], region, out, prefix=(t,), index_maps={0: ch}),
        "h5-chunked": lambda region, out, t, ch: read_hdf5_window(
            f5["chunked"], region, out, prefix=(t,), index_maps={0: ch}),
        "zarr": lambda region, out, t, ch: read_zarr_window(zarr_arr, region, out, prefix=(t,), index_maps={0: ch}),
    }
    if direct_ok:
        paths["direct"] = npy(c_path, direct=True)
    yield paths
    f5.close()


@st.composite
def channel_reads(draw):
    channels = draw(st.lists(st.integers(0, C - 1), min_size=1, max_size=9))
    t = draw(st.integers(0, T - 1))
    mode = draw(st.sampled_from(BOUNDARIES))
    shape = (len(channels), H, W)
    ds, de, ws, we = [], [], [], []
    for n in shape:
        a = draw(st.integers(0, n - 1))
        b = draw(st.integers(a + 1, n))
        if mode == "trim":
            u = draw(st.integers(a, b - 1))
            v = draw(st.integers(u + 1, b))
        else:
            u = draw(st.integers(a - 4, b - 1))
            v = draw(st.integers(u + 1, b + 4))
        ds.append(a), de.append(b), ws.append(u), we.append(v)
    return channels, t, Region(ds, de, ds, de, ws, we, mode, fill_value=-7)


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=channel_reads())
def test_channel_lists_with_repeats_on_every_read_path(readers, case):
    channels, t, region = case
    expected = take_window(DATA[t][channels], region)
    for name, read in readers.items():
        out = np.full(region.window_shape, SENTINEL, np.float32)  # a pooled buffer's old contents
        got = read(region, out, t, channels)
        assert got is out
        np.testing.assert_array_equal(got, expected, err_msg=f"{name}: channels {channels}, {region}")


def test_repeated_channels_are_read_once():
    """[4, 2, 4]: file channel 4 is read once and copied to window position 2."""
    region = Region((0, 0), (3, W), (0, 0), (3, W), (0, 0), (3, W), "constant")
    plan = plan_window(region, {0: [4, 2, 4]})
    assert sorted(r[1] for r in plan.axes[0].reads) == [2, 4]
    assert plan.axes[0].copy_dst.tolist() == [2] and plan.axes[0].copy_src.tolist() == [0]


# ---- a negative channel_axis selects channels (it was ignored: all channels came back) ----------------
@pytest.mark.parametrize("channel_axis", [-1, -2, -3])
def test_negative_channel_axis_every_source(tmp_path, channel_axis):
    h5py = pytest.importorskip("h5py")
    zarr = pytest.importorskip("zarr")
    a = np.arange(3 * 5 * 6, dtype="<f4").reshape(3, 5, 6)
    channels = [2, 0] if channel_axis == -3 else [4, 0, 1]
    want = np.take(a, channels, axis=channel_axis)
    np.save(tmp_path / "m.npy", a)
    with h5py.File(tmp_path / "m.h5", "w") as f:
        f.create_dataset("x", data=a[None])
    z = zarr.open_array(str(tmp_path / "m.zarr"), mode="w", shape=(1,) + a.shape, chunks=(1, 2, 2, 4), dtype="<f4")
    z[0] = a
    kw = dict(batch_size=1, shuffle=False, channels=channels, channel_axis=channel_axis)
    layout = Layout(MeshInfo((2,), ("mp",), (1,)), shard={"mp": 1}, halo=1, boundary="periodic")
    sources = {"npy": NumpySource([str(tmp_path / "m.npy")], layout, **kw),
               "npy-mmap": NumpySource([str(tmp_path / "m.npy")], layout, method="mmap", **kw),
               "h5": HDF5Source([str(tmp_path / "m.h5")], "x", layout, **kw),
               "zarr": ZarrSource([str(tmp_path / "m.zarr")], None, layout, **kw)}
    for name, src in sources.items():
        assert src.sample_shape == want.shape, name
        got = src.read_sample(0)[0]
        np.testing.assert_array_equal(got, take_window(want, src.region), err_msg=name)


def test_negative_index_map_in_the_readers(tmp_path):
    a = np.arange(4 * 7, dtype="<i4").reshape(4, 7)
    np.save(tmp_path / "m.npy", a)
    want = a[:, [6, 1, 1]]
    region = one_rank_layout().region(want.shape)
    for method in ("preadv", "mmap"):
        got = read_npy_window(str(tmp_path / "m.npy"), region, index_maps={-1: [6, 1, 1]}, method=method)
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("channel_axis", [3, -4])
def test_channel_axis_out_of_range_is_refused(tmp_path, channel_axis):
    np.save(tmp_path / "m.npy", np.zeros((2, 3, 4), np.float32))
    with pytest.raises(DataFileError, match=rf"m.npy: channel axis {channel_axis} is out of range for a sample of 3 axes"):
        NumpySource([str(tmp_path / "m.npy")], one_rank_layout(), channels=[0], channel_axis=channel_axis)
