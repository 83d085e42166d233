"""The format objects (dali_mesh/formats/) against the formats' own libraries: numpy, h5py and
zarr-python describe and read the same arrays; a source given a format reads what the named source
of that format reads."""
from __future__ import annotations

import pickle

import h5py
import numcodecs
import numpy as np
import pytest
import zarr

from dali_mesh import Layout, MeshInfo
from dali_mesh.formats import FORMATS, HDF5, NPY, ZARR, format_named, format_of
from dali_mesh.partition import take_window
from dali_mesh.source import ArraySource, HDF5Source, ZarrSource, array_source

DATA = np.random.default_rng(3).standard_normal((6, 10, 12)).astype(np.float32)


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    d = tmp_path_factory.mktemp("formats")
    np.save(d / "a.npy", DATA[0].astype(">f4"))
    with h5py.File(d / "b.h5", "w") as f:
        f.create_dataset("x", data=DATA, chunks=(1, 5, 6), compression="gzip", shuffle=True)
    zarr.create_array(str(d / "c.zarr"), shape=DATA.shape, chunks=(1, 5, 12), shards=(2, 10, 12), dtype="f4")[:] = DATA
    zarr.create_array(str(d / "d.zarr"), shape=DATA.shape, chunks=(1, 5, 6), dtype="f4", zarr_format=2,
                      compressors=[numcodecs.Blosc("lz4")])[:] = DATA
    return {k: str(d / k) for k in ("a.npy", "b.h5", "c.zarr", "d.zarr")}


def test_each_location_is_found_by_its_format(stores):
    assert [format_of(stores[k]) for k in ("a.npy", "b.h5", "c.zarr", "d.zarr")] == [NPY, HDF5, ZARR, ZARR]
    assert format_of("x.txt") is None and format_of("/data/X.H5") is HDF5
    assert set(FORMATS) == {"npy", "hdf5", "zarr"} and format_named("zarr") is ZARR
    with pytest.raises(ValueError, match="no format named 'tiff'"):
        format_named("tiff")
    assert all(pickle.loads(pickle.dumps(f)) is f for f in FORMATS.values())


def test_info_says_what_the_libraries_say(stores):
    assert NPY.info(stores["a.npy"]) == (DATA.shape[1:], np.dtype("f4"), None, ())
    with h5py.File(stores["b.h5"]) as f:
        ds = f["x"]
        want = (ds.shape, ds.dtype, ds.chunks)
    got = HDF5.info(stores["b.h5"], "x")
    assert (got.shape, got.dtype, got.chunks) == want and got.codecs == ("shuffle", "deflate")
    assert HDF5.default_name(stores["b.h5"]) == "x"
    for key, codecs in (("c.zarr", ("sharding", "zstd")), ("d.zarr", ("blosc",))):
        arr = zarr.open_array(stores[key], mode="r")
        got = ZARR.info(stores[key])
        assert (got.shape, got.dtype, got.chunks, got.codecs) == (arr.shape, arr.dtype, arr.chunks, codecs)
        assert ZARR.step_info(stores[key]) == (DATA.shape[0], DATA.shape[1:], np.dtype("f4"))


@pytest.mark.parametrize("key,name", [("b.h5", "x"), ("c.zarr", None), ("d.zarr", None)])
def test_a_window_read_by_a_format_equals_the_libraries_whole_read(stores, key, name):
    fmt = format_of(stores[key])
    layout = Layout(MeshInfo((3,), ("mp",), (1,)), shard={"mp": 0}, halo={0: 2, 1: 1}, boundary="reflect")
    region = layout.region(DATA.shape[1:])
    handle = fmt.open(stores[key], name)
    try:
        for step in (0, 5):
            whole = fmt.read_whole(handle, step)
            np.testing.assert_array_equal(whole, DATA[step])
            out = np.empty(region.window_shape, np.float32)
            fmt.read_window(handle, region, out, prefix=(step,))
            np.testing.assert_array_equal(out, take_window(DATA[step], region))
    finally:
        fmt.close(handle)


def test_a_source_given_a_format_reads_as_the_named_source(stores):
    layout = Layout(MeshInfo((2,), ("mp",), (1,)), shard={"mp": 1}, halo={1: 1})
    named = {"hdf5": HDF5Source([stores["b.h5"]], "x", layout, batch_size=1, shuffle=False),
             "zarr": ZarrSource([stores["d.zarr"]], None, layout, batch_size=1, shuffle=False)}
    for fmt, src in named.items():
        plain = ArraySource(src.files, src.name, layout, format=fmt, batch_size=1, shuffle=False,
                            format_options=src.format_options)
        made = array_source(src.files, src.name, layout, format=fmt, batch_size=1, shuffle=False)
        assert type(made) is type(src) and made.fingerprint() == src.fingerprint()
        for i in range(src.num_samples):
            want = take_window(DATA[i], src.region)
            for s in (src, plain, made):
                np.testing.assert_array_equal(s.read_sample(i)[0], want)
    with pytest.raises(ValueError, match="format must name a format of samples along axis 0"):
        ArraySource([stores["a.npy"]], None, layout, format="npy")


# ---- writing: what convert writes, read back by the formats' own libraries ---------------------------
def _read_with_library(path, fmt, name):
    if fmt is HDF5:
        with h5py.File(path, "r") as f:
            ds = f[name]
            return ds[()], ds.chunks, ds.compression, None
    arr = zarr.open_array(path, path=name, mode="r")
    return arr[...], arr.chunks, arr.compressors, arr.metadata.zarr_format


@pytest.mark.parametrize("fmt,suffix,options", [(HDF5, ".h5", {}), (ZARR, ".zarr", {}),
                                                (ZARR, ".zarr", {"zarr_format": 2})],
                         ids=["hdf5", "zarr-v3", "zarr-v2"])
@pytest.mark.parametrize("dtype", ["<f4", "<i2", "u1", "<f8"])
def test_each_writable_format_round_trips(tmp_path, fmt, suffix, options, dtype):
    """Samples written by several threads, in chunks that do not divide the array, read back bit for
    bit by h5py / zarr-python; uncompressed, in the chunks asked for."""
    from concurrent.futures import ThreadPoolExecutor

    data = (DATA * 50).astype(dtype)
    if data.dtype.kind == "f":  # bit patterns a value compare would miss
        data.flat[:3] = [np.nan, -0.0, np.inf]
    path = str(tmp_path / ("copy" + suffix))
    assert format_of(path) is fmt and suffix in fmt.write_suffixes
    chunks = (1, 4, 5)
    with fmt.create(path, "data", data.shape, data.dtype, chunks, **options) as out:
        with ThreadPoolExecutor(3) as pool:
            list(pool.map(lambda i: out.write(i, data[i]), range(len(data))))
    back, got_chunks, codecs, zarr_format = _read_with_library(path, fmt, "data")
    assert back.dtype == data.dtype and back.shape == data.shape and got_chunks == chunks
    assert np.array_equal(back.view(np.uint8), data.view(np.uint8))
    assert not codecs and zarr_format == options.get("zarr_format", 3 if fmt is ZARR else None)
    # and the format's own reader reads it
    handle = fmt.open(path, "data")
    try:
        np.testing.assert_array_equal(fmt.read_whole(handle, 5), data[5])
    finally:
        fmt.close(handle)


@pytest.mark.parametrize("zarr_format", [3, 2])
def test_a_zarr_copy_stores_every_chunk_even_all_zero_ones(tmp_path, zarr_format):
    """Every rank's read is the same size: zarr would skip all-zero chunks (write_empty_chunks)."""
    path = str(tmp_path / "zeros.zarr")
    with ZARR.create(path, "data", (2, 4, 6), "f4", (1, 2, 3), zarr_format=zarr_format) as out:
        out.write(0, np.zeros((4, 6), np.float32))
        out.write(1, np.ones((4, 6), np.float32))
    arr = zarr.open_array(path, path="data", mode="r")
    assert arr.nchunks_initialized == arr.nchunks == 8
    assert ZARR.is_store(path) and not ZARR.is_store(str(tmp_path)) and not HDF5.is_store(path)


def test_a_failed_copy_is_discarded_and_npy_is_not_written(tmp_path):
    from dali_mesh.io import DataFileError, NotWritableError
    from dali_mesh.formats import written_suffixes

    path = str(tmp_path / "x.h5")
    with pytest.raises(DataFileError, match="the source failed"):
        with HDF5.create(path, "data", (2, 3), "f4", (1, 3)) as out:
            out.write(0, np.ones(3, np.float32))
            raise DataFileError(path, "the source failed")
    with HDF5.create(path, "data", (2, 3), "f4", (1, 3)) as out:  # closed, so it can be written again
        out.write(1, np.full(3, 2, np.float32))
    with h5py.File(path, "r") as f:
        np.testing.assert_array_equal(f["data"][()], [[0, 0, 0], [2, 2, 2]])
    assert written_suffixes() == (".h5", ".hdf5", ".zarr") and NPY.write_suffixes == ()
    with pytest.raises(NotWritableError, match=r"x\.npy: the npy format is read, not written: dali_mesh writes "
                                               r"\.h5, \.hdf5, \.zarr"):
        NPY.create(str(tmp_path / "x.npy"), "data", (2, 3), "f4", (1, 3))
    with pytest.raises(ValueError, match="zarr_format must be 2 or 3, got 4"):
        ZARR.create(str(tmp_path / "x.zarr"), "data", (2, 3), "f4", (1, 3), zarr_format=4)


def test_zarr_metadata_changed_between_open_and_plan_is_refused(tmp_path, monkeypatch):
    """The array the planner opened (zarr-python's read of its metadata) and the metadata object the plan
    holds (read again, in an object store at the ETag the plan names it by) must agree: an array rewritten
    between the two reads, here f4 -> i4 with the same chunks, is refused, never planned with one
    version's dtype and read with the other's chunks."""
    pytest.importorskip("nvidia.dali")
    import json

    import zarr
    from nvidia.dali import pipeline_def

    import dali_mesh.formats.zarr.zarr_planner as dm_zarr
    from dali_mesh import ZarrSource
    from dali_mesh.pipeline import native
    from dali_mesh.storage import DataFileError
    from tests.helpers import one_rank_layout

    path = tmp_path / "a.zarr"
    zarr.create_array(path, shape=(2, 4, 6), chunks=(1, 4, 6), dtype="f4", zarr_format=2)[:] = 1.5
    src = ZarrSource([str(path)], None, one_rank_layout(), batch_size=1, shuffle=False)
    opened = dm_zarr.open_zarr_array

    def open_then_rewrite(*args, **kw):
        arr = opened(*args, **kw)
        meta = json.loads((path / ".zarray").read_text())
        meta["dtype"] = "<i4"
        (path / ".zarray").write_text(json.dumps(meta))
        return arr

    monkeypatch.setattr(dm_zarr, "open_zarr_array", open_then_rewrite)

    @pipeline_def(batch_size=1, num_threads=1, device_id=None)
    def pipe():
        return native.read_windows(src, fallback=False)[0]

    with pytest.raises(DataFileError, match="changed while the plan was made"):
        pipe().build()
