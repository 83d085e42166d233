"""HDF5 (h5py hyperslabs) and Zarr (v2, v3 region reads) readers against the numpy oracle."""
from __future__ import annotations

import os
import re

import numpy as np
import pytest

from dali_mesh.io import DataFileError, IOStats, MissingArrayError, ShapeMismatchError
from dali_mesh.mesh import MeshInfo
from dali_mesh.partition import BOUNDARIES, Layout, Region, take_window

h5py = pytest.importorskip("h5py")
zarr = pytest.importorskip("zarr")
from dali_mesh.formats.hdf5 import open_hdf5_dataset, read_hdf5_window  # noqa: E402
from dali_mesh.formats.zarr import open_zarr_array, read_zarr_window  # noqa: E402

DATA = np.random.default_rng(0).standard_normal((3, 4, 10, 12)).astype(">f4")  # (time, channel, lat, lon)
CHUNKS = (1, 2, 5, 4)


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    d = tmp_path_factory.mktemp("stores")
    h5 = str(d / "a.h5")
    with h5py.File(h5, "w") as f:
        f.create_dataset("contiguous", data=DATA)
        f.create_dataset("chunked", data=DATA, chunks=CHUNKS, compression="gzip")
    z2 = str(d / "v2.zarr")
    a = zarr.create_array(store=z2, shape=DATA.shape, chunks=CHUNKS, dtype="<f4", zarr_format=2)
    a[:] = DATA
    z3 = str(d / "v3.zarr")
    g = zarr.open_group(z3, mode="w")
    a = g.create_array("fields", shape=DATA.shape, chunks=CHUNKS, dtype="<f4")
    a[:] = DATA
    arrays = {
        "h5-contiguous": open_hdf5_dataset(h5, "contiguous")[1],
        "h5-chunked": open_hdf5_dataset(h5, "chunked")[1],
        "zarr-v2": open_zarr_array(z2),
        "zarr-v3": open_zarr_array(z3, "fields"),
    }
    yield {"h5": h5, "z2": z2, "z3": z3, "arrays": arrays}
    for k in ("h5-contiguous", "h5-chunked"):
        arrays[k].file.close()


def _reader(kind):
    return read_hdf5_window if kind.startswith("h5") else read_zarr_window


@pytest.mark.parametrize("kind", ["h5-contiguous", "h5-chunked", "zarr-v2", "zarr-v3"])
@pytest.mark.parametrize("mode", BOUNDARIES)
def test_random_windows_match_take_window(stores, kind, mode):
    rng = np.random.default_rng(len(kind) * 7 + BOUNDARIES.index(mode))
    arr = stores["arrays"][kind]
    for _ in range(6):
        t = int(rng.integers(0, 3))
        channels = sorted(rng.choice(4, size=int(rng.integers(1, 5)), replace=False).tolist())
        shape = (len(channels), 10, 12)
        ds, de, ws, we = [], [], [], []
        for n in shape:
            a = int(rng.integers(0, n))
            b = int(rng.integers(a + 1, n + 1))
            u, v = (a, b) if mode == "trim" else (a - int(rng.integers(0, 7)), b + int(rng.integers(0, 7)))
            ds.append(a), de.append(b), ws.append(u), we.append(v)
        region = Region(ds, de, ds, de, ws, we, mode, fill_value=3)
        out = _reader(kind)(arr, region, prefix=(t,), index_maps={0: channels})
        assert out.dtype == np.dtype("float32")
        np.testing.assert_array_equal(out, take_window(DATA[t][channels].astype("<f4"), region))


def test_zarr_fetches_only_the_chunks_the_window_touches(stores):
    arr = stores["arrays"]["zarr-v3"]
    # lat rows 5..10 (chunk row 1 of 2), lon 0..12 (+1 periodic halo each side: lon 11 and 0),
    # channels 0..2 (chunk 0 of 2): 1 x 1 x 1 x 3 chunks
    region = Region((0, 0, 0), (4, 10, 12), (0, 5, 0), (2, 10, 12), (0, 5, -1), (2, 10, 13),
                    ("constant", "constant", "periodic"))
    stats = IOStats()
    out = read_zarr_window(arr, region, prefix=(1,), stats=stats)
    np.testing.assert_array_equal(out, take_window(DATA[1].astype("<f4"), region))
    assert stats.read_calls == 3
    assert 0 < stats.bytes_read <= 3 * np.prod(CHUNKS) * 4 + 3 * 64


def test_hdf5_chunk_bytes_counted(stores):
    ds = stores["arrays"]["h5-chunked"]
    region = Region((0, 0, 0), (4, 10, 12), (0, 0, 0), (2, 5, 4), (0, 0, 0), (2, 5, 4), "constant")
    stats = IOStats()
    read_hdf5_window(ds, region, prefix=(0,), stats=stats)
    info = ds.id.get_chunk_info_by_coord((0, 0, 0, 0))
    assert stats.read_calls == 1 and stats.bytes_read == info.size
    contiguous = IOStats()
    read_hdf5_window(stores["arrays"]["h5-contiguous"], region, prefix=(0,), stats=contiguous)
    assert contiguous.bytes_read == contiguous.window_bytes == 2 * 5 * 4 * 4


def test_layout_regions_tile_the_sample(stores):
    mesh = MeshInfo((2, 3), ("x", "y"), (0, 0))
    layout = Layout(mesh, shard={"x": 1, "y": 2}, halo={1: 1, 2: 2}, boundary={1: "symmetric", 2: "periodic"})
    for kind, arr in stores["arrays"].items():
        got = np.zeros((4, 10, 12), np.float32)
        for region in layout.regions((4, 10, 12)):
            win = _reader(kind)(arr, region, prefix=(2,))
            np.testing.assert_array_equal(win, take_window(DATA[2].astype("<f4"), region))
            got[tuple(slice(s, e) for s, e in zip(region.start, region.stop))] = win[region.owned_in_window]
        np.testing.assert_array_equal(got, DATA[2])


def test_missing_names_and_files(stores, tmp_path):
    with pytest.raises(MissingArrayError, match=r"a\.h5.*'nope'.*\['chunked', 'contiguous'\]"):
        open_hdf5_dataset(stores["h5"], "nope")
    with pytest.raises(MissingArrayError, match=r"v3\.zarr.*'nope'.*\['fields'\]"):
        open_zarr_array(stores["z3"], "nope")
    with pytest.raises(FileNotFoundError, match="missing.h5"):
        open_hdf5_dataset(str(tmp_path / "missing.h5"), "x")
    with pytest.raises(FileNotFoundError, match="missing.zarr"):
        open_zarr_array(str(tmp_path / "missing.zarr"), "x")
    noth5 = tmp_path / "not.h5"
    noth5.write_bytes(b"hello")
    with pytest.raises(ValueError, match=r"not\.h5.*cannot be opened as HDF5"):
        open_hdf5_dataset(str(noth5), "x")


def test_shape_mismatch_names_the_file(stores):
    region = Region((0, 0, 0), (4, 10, 12), (0, 0, 0), (4, 10, 12), (0, 0, 0), (4, 10, 12), "constant")
    with pytest.raises(ShapeMismatchError, match=r"a\.h5.*\(4, 10, 12\).*\(4, 10, 13\)"):
        read_hdf5_window(stores["arrays"]["h5-chunked"], region, prefix=(0,), expected_shape=(4, 10, 13))
    with pytest.raises(ShapeMismatchError, match=r"v2\.zarr.*\(4, 10, 12\).*\(4, 9, 12\)"):
        read_zarr_window(stores["arrays"]["zarr-v2"], region, prefix=(0,), expected_shape=(4, 9, 12))


def test_truncated_hdf5_and_corrupt_zarr_chunk_name_the_file(tmp_path):
    h5 = str(tmp_path / "cut.h5")
    with h5py.File(h5, "w") as f:
        f.create_dataset("x", data=np.arange(64 * 256, dtype=np.float64).reshape(64, 256))
    size = os.path.getsize(h5)
    with open(h5, "r+b") as f:
        f.truncate(size // 2)
    region = Region((0,), (256,), (0,), (256,), (0,), (256,), "constant")
    with pytest.raises(DataFileError, match=r"cut\.h5"):
        f, ds = open_hdf5_dataset(h5, "x")
        try:
            read_hdf5_window(ds, region, prefix=(63,))
        finally:
            f.close()
    z = str(tmp_path / "bad.zarr")
    arr = zarr.create_array(store=z, shape=(4, 8), chunks=(2, 8), dtype="f4")
    arr[:] = 1
    chunk = os.path.join(z, "c", "1", "0")
    with open(chunk, "wb") as f:
        f.write(b"not a zstd frame at all")
    region = Region((0,), (8,), (0,), (8,), (0,), (8,), "constant")
    a = open_zarr_array(z)
    np.testing.assert_array_equal(read_zarr_window(a, region, prefix=(0,)), np.ones(8, np.float32))
    with pytest.raises(DataFileError, match=r"bad\.zarr.*corrupt"):
        read_zarr_window(a, region, prefix=(3,))


# ---- issue 9: reads of files the user did not name, corrupt metadata, dtypes the pipeline cannot carry
ROW = Region((0,), (16,), (0,), (16,), (0,), (16,), "constant")


@pytest.fixture
def external_files(tmp_path):
    """One HDF5 file whose datasets read other files: raw storage in a plain file, an external
    link (and a soft link to it), a virtual dataset; plus the files they point at."""
    raw = tmp_path / "secret.bin"
    raw.write_bytes(bytes(range(64)))
    other = str(tmp_path / "other.h5")
    with h5py.File(other, "w") as f:
        f["x"] = np.arange(64, dtype="u1").reshape(4, 16) + 100
    h5 = str(tmp_path / "hostile.h5")
    layout = h5py.VirtualLayout(shape=(4, 16), dtype="u1")
    layout[:] = h5py.VirtualSource(other, "x", shape=(4, 16))
    with h5py.File(h5, "w") as f:
        f.create_dataset("raw", shape=(4, 16), dtype="u1", external=[(str(raw), 0, 64)])
        f["grp/link"] = h5py.ExternalLink(other, "/x")
        f["soft"] = h5py.SoftLink("/grp/link")
        f["ext_group"] = h5py.ExternalLink(other, "/")  # a group on the path is external
        f.create_virtual_dataset("virtual", layout, fillvalue=7)
        f["plain"] = np.arange(64, dtype="u1").reshape(4, 16)
    return h5, str(raw), other


@pytest.mark.parametrize("name, words", [
    ("raw", r"dataset /raw keeps its raw data in external file\(s\) \['.*secret\.bin'\]"),
    ("grp/link", r"dataset 'grp/link': /grp/link is an external link to '/x' in file '.*other\.h5'"),
    ("soft", r"dataset 'soft': /grp/link is an external link to '/x' in file '.*other\.h5'"),
    ("ext_group/x", r"/ext_group is an external link to '/' in file '.*other\.h5'"),
    ("virtual", r"dataset /virtual is a virtual dataset mapping \['.*other\.h5:x'\]"),
])
def test_hdf5_external_data_refused_by_default(external_files, name, words):
    h5, raw, other = external_files
    from dali_mesh.io import ExternalStorageError

    with pytest.raises(ExternalStorageError, match=words) as info:
        open_hdf5_dataset(h5, name)
    assert info.value.path == h5 and str(info.value).startswith(h5 + ": ")
    assert "allow_external=True" in str(info.value)
    # the user who means it opts in, and gets exactly what h5py would give
    f, ds = open_hdf5_dataset(h5, name, allow_external=True)
    try:
        expected = np.arange(64, dtype="u1").reshape(4, 16) + (0 if name == "raw" else 100)
        np.testing.assert_array_equal(read_hdf5_window(ds, ROW, prefix=(2,)), expected[2])
    finally:
        f.close()


def test_hdf5_plain_dataset_and_internal_soft_link_still_open(external_files, tmp_path):
    h5, _, _ = external_files
    with h5py.File(h5, "a") as f:
        f["alias"] = h5py.SoftLink("plain")  # relative, inside the file
        f["grp/up"] = h5py.SoftLink("/plain")
    for name in ("plain", "alias", "grp/up", "/plain"):
        f, ds = open_hdf5_dataset(h5, name)
        try:
            np.testing.assert_array_equal(read_hdf5_window(ds, ROW, prefix=(1,)), np.arange(16, 32, dtype="u1"))
        finally:
            f.close()
    loop = str(tmp_path / "loop.h5")
    with h5py.File(loop, "w") as f:
        f["a"] = h5py.SoftLink("/b")
        f["b"] = h5py.SoftLink("/a")
    with pytest.raises(DataFileError, match=r"loop\.h5"):
        open_hdf5_dataset(loop, "a")


def _lzf_file_with_unknown_filter(path):
    """A chunked dataset whose filter pipeline names filter 32123 (not registered anywhere): the
    lzf filter's id (32000) patched in the file."""
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.arange(1000, dtype="f4"), chunks=(100,), compression="lzf")
    data = bytearray(open(path, "rb").read())
    at = data.find(b"lzf\x00")
    assert data.count(b"lzf\x00") == 1 and data[at - 8 : at - 6] == (32000).to_bytes(2, "little")
    data[at - 8 : at - 6] = (32123).to_bytes(2, "little")
    open(path, "wb").write(bytes(data))


def test_hdf5_filter_not_available_is_named_not_truncation(tmp_path):
    from dali_mesh.io import UnsupportedFilterError

    path = str(tmp_path / "filtered.h5")
    _lzf_file_with_unknown_filter(path)
    assert not h5py.h5z.filter_avail(32123)
    with pytest.raises(UnsupportedFilterError, match=r"filtered\.h5: dataset /x needs HDF5 filter 32123 \(lzf\)") as info:
        open_hdf5_dataset(path, "x")
    assert "truncated" not in str(info.value)


def test_hdf5_header_claiming_2_40_elements_names_the_file(tmp_path):
    """A 3 KiB file whose dataspace claims 2**40 elements (dims and max dims patched): a DataFileError
    naming the file and the dataset before anything is allocated (before: a KeyError naming no file)."""
    path = str(tmp_path / "claims.h5")
    with h5py.File(path, "w") as f:
        f.create_dataset("c", data=np.arange(1337, dtype="u1"))
    data = bytearray(open(path, "rb").read())
    dims = (1337).to_bytes(8, "little")
    at = data.find(b"\x01\x01\x01\x00\x00\x00\x00\x00" + dims + dims)  # dataspace v1: rank 1, max dims
    assert at > 0
    data[at + 8 : at + 24] = (2**40).to_bytes(8, "little") * 2
    open(path, "wb").write(bytes(data))
    with pytest.raises(DataFileError, match=r"claims\.h5: dataset 'c' cannot be opened .*corrupt"):
        open_hdf5_dataset(path, "c")


@pytest.mark.parametrize("dtype", ["<c8", ">c16", np.longdouble])
def test_hdf5_and_zarr_refuse_dtypes_the_pipeline_cannot_carry(tmp_path, dtype):
    from dali_mesh.io import UnsupportedDtypeError

    h5 = str(tmp_path / "a.h5")
    with h5py.File(h5, "w") as f:
        f["x"] = np.zeros((2, 3), dtype)
    with pytest.raises(UnsupportedDtypeError, match=rf"a\.h5: dataset 'x': dtype {re.escape(str(np.dtype(dtype)))} is"):
        open_hdf5_dataset(h5, "x")
    if np.dtype(dtype).kind == "c":
        z = str(tmp_path / "a.zarr")
        zarr.create_array(store=z, shape=(2, 3), chunks=(2, 3), dtype=np.dtype(dtype).newbyteorder("<"))
        with pytest.raises(UnsupportedDtypeError, match=r"a\.zarr: .*dtype complex"):
            open_zarr_array(z)


@pytest.mark.parametrize("fmt", [2, 3])
def test_zarr_corrupt_metadata_is_not_reported_missing(tmp_path, fmt):
    z = str(tmp_path / "s.zarr")
    zarr.create_array(store=z, shape=(4, 8), chunks=(2, 8), dtype="f4", zarr_format=fmt)
    meta = os.path.join(z, ".zarray" if fmt == 2 else "zarr.json")
    with open(meta, "w") as f:
        f.write('{"shape": [4, 8], "chunks": ')
    from dali_mesh.io import HeaderError

    with pytest.raises(HeaderError, match=rf"s\.zarr: metadata of the array at the store's root \({re.escape(meta)}\) "
                                          r"cannot be read .*corrupt") as info:
        open_zarr_array(z)
    assert not isinstance(info.value, MissingArrayError)


@pytest.mark.parametrize("fmt", [2, 3])
def test_zarr_corrupt_metadata_in_an_object_store_is_not_reported_missing(fmt):
    """Issue 52: in a store that is no local folder (an object store, a reference set, memory://) the open's
    error was "has no array" whatever zarr-python said (its metadata files were looked for on the local disk)."""
    from dali_mesh.io import HeaderError
    from dali_mesh.storage import store_of

    key = ".zarray" if fmt == 2 else "zarr.json"
    store, _ = store_of(f"memory://corrupt-meta-{fmt}/s.zarr/{key}")
    store.put(f"s.zarr/{key}", b'{"shape": [4, 8], "chunks": ')
    with pytest.raises(HeaderError, match=r"memory://corrupt-meta-\d/s\.zarr: the array at the store's root cannot "
                                          r"be opened \(\w*Error: ") as info:
        open_zarr_array(f"memory://corrupt-meta-{fmt}/s.zarr")
    assert not isinstance(info.value, MissingArrayError)
    with pytest.raises(MissingArrayError, match="has no array"):  # missing is still missing
        open_zarr_array(f"memory://corrupt-meta-{fmt}/other.zarr")


def test_zarr_zero_chunks_are_refused(tmp_path):
    """Before: ZeroDivisionError at the first read."""
    import json

    z = str(tmp_path / "zero.zarr")
    zarr.create_array(store=z, shape=(4, 8), chunks=(2, 8), dtype="f4", zarr_format=2)
    meta = json.load(open(os.path.join(z, ".zarray")))
    meta["chunks"] = [0, 8]
    json.dump(meta, open(os.path.join(z, ".zarray"), "w"))
    from dali_mesh.io import HeaderError

    with pytest.raises(HeaderError, match=r"zero\.zarr: the array at the store's root has chunk shape \(0, 8\)"):
        open_zarr_array(z)
