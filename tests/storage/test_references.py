"""The reference store (dali_mesh/storage/references/): the shared store tests over a Kerchunk reference set
whose keys are ranges of files written here; every form of a set (spec 0 and 1, templates, generated keys,
inline text and base64, whole files and ranges) against the bytes written; NetCDF4/HDF5 files written by
h5py and xarray, referenced by kerchunk, read by ``ZarrSource`` on every rank of a split with halo and equal
to h5py / xarray reading the files; a missing and a truncated referenced file named with the key."""
from __future__ import annotations

import base64
import json
import os
import pickle
import sys

import numpy as np
import pytest

from dali_mesh.storage import DataFileError, FileChangedError, MissingFileError, TruncatedFileError, store_of
from tests.helpers import SEED, mesh_of
from tests.storage.s3_server import SECRET, options, s3_endpoint, upload  # noqa: F401 - s3_endpoint: a fixture
from tests.storage.store_tests import FileObjectTests, StoreTests

pytest.importorskip("kerchunk")
from dali_mesh.storage.references import ReferenceStore  # noqa: E402

#: bytes before and after each put's data in its file: a key is a range inside a file, not all of it
_HEAD, _TAIL = 37, 11


def _write_set(path, document: dict) -> str:
    path.write_text(json.dumps(document))
    return str(path)


class TestReferenceStore(StoreTests, FileObjectTests):
    """A put writes a file (the data between other bytes) and adds a key for its range to the set's file;
    a rewrite rewrites the referenced file in place (the set still names its range). The store reads its
    set at its first use: each test puts before it reads."""

    @pytest.fixture
    def store(self, tmp_path_factory):
        # not tmp_path: its name is the test's ("...names_no_secret"), and the spec names the set's file
        tmp_path = self.dir = tmp_path_factory.mktemp("refs")
        self.refs = tmp_path / "refs.json"
        self.document = {"version": 1, "templates": {"d": str(tmp_path)},
                         "refs": {".zgroup": '{"zarr_format":2}',
                                  "inline": "base64:" + base64.b64encode(b"\0\1").decode()}}
        _write_set(self.refs, self.document)
        return ReferenceStore(str(self.refs))

    def _file(self, name, data: bytes) -> None:
        rng = np.random.default_rng(len(data))
        (self.dir / f"{name}.bin").write_bytes(rng.bytes(_HEAD) + data + rng.bytes(_TAIL))

    def put(self, store, name, data):
        self._file(name, data)
        self.document["refs"][f"vars/{name}"] = ["{{d}}/" + f"{name}.bin", _HEAD, len(data)]
        _write_set(self.refs, self.document)
        return f"vars/{name}"

    def rewrite(self, store, key, data):
        self._file(key.split("/")[1], data)

    def missing_key(self, store):
        return "vars/missing"


# ---- the forms of a reference set -------------------------------------------------------------------
def _files(tmp_path, n=3, size=5000):
    rng = np.random.default_rng(SEED)
    found = {}
    for i in range(n):
        found[i] = rng.bytes(size + i)
        (tmp_path / f"f{i}.bin").write_bytes(found[i])
    return found


def test_a_version_0_set_reads_inline_text_whole_files_and_ranges(tmp_path):
    files = _files(tmp_path)
    refs = _write_set(tmp_path / "v0.json", {
        "a/text": "some text", "a/whole": [str(tmp_path / "f0.bin")], "a/range": [str(tmp_path / "f1.bin"), 100, 900],
        "b/uri": [f"file://{tmp_path}/f2.bin", 4000, 1002]})
    store, key = store_of(f"reference://{refs}")
    assert isinstance(store, ReferenceStore) and key == ""
    assert store.read_range("a/text", 0, 100) == b"some text"
    assert store.read_range("a/whole", 0, 1 << 20) == files[0]
    assert store.read_range("a/range", 0, 1 << 20) == files[1][100:1000]
    assert store.read_range("a/range", 850, 1 << 20) == files[1][950:1000]  # never past the range's end
    assert store.read_range("b/uri", 0, 1 << 20) == files[2][4000:]
    assert store.stat("a/range").size == 900 and store.stat("a/whole").size == len(files[0])
    objects, prefixes = store.list("", delimiter=True)
    assert objects == [] and prefixes == ["a/", "b/"]
    objects, _ = store.list("a/", delimiter=False)
    assert [k for k, _ in objects] == ["a/range", "a/text", "a/whole"]
    assert [v.size for _, v in objects] == [900, 9, len(files[0])]


def test_a_version_1_set_with_templates_generated_keys_and_base64(tmp_path):
    pytest.importorskip("jinja2")  # fsspec renders generated keys with it
    files = _files(tmp_path, n=2, size=3000)
    refs = _write_set(tmp_path / "v1.json", {
        "version": 1,
        "templates": {"root": str(tmp_path)},
        "gen": [{"key": "g/{{i}}.{{j}}", "url": "{{root}}/f{{i}}.bin", "offset": "{{1000 * j}}", "length": "1000",
                 "dimensions": {"i": {"stop": 2}, "j": [0, 1, 2]}}],
        "refs": {"raw": "base64:" + base64.b64encode(bytes(range(256))).decode(), "t": ["{{root}}/f1.bin", 10, 20]}})
    store = ReferenceStore(refs)
    for i in range(2):
        for j in range(3):
            assert store.read_range(f"g/{i}.{j}", 0, 1 << 20) == files[i][1000 * j:1000 * (j + 1)]
    assert store.read_range("raw", 0, 1000) == bytes(range(256))
    assert store.read_range("t", 5, 100) == files[1][15:30]
    listed = [k for k, _ in store.list("g/", delimiter=False)[0]]
    assert listed == sorted(f"g/{i}.{j}" for i in range(2) for j in range(3))


def test_a_set_that_is_not_one_is_named(tmp_path):
    (tmp_path / "bad.json").write_text("[1, 2")
    (tmp_path / "v9.json").write_text('{"version": 9, "refs": {}}')
    with pytest.raises(DataFileError, match=r"bad\.json: is not a JSON reference set"):
        ReferenceStore(str(tmp_path / "bad.json")).stat("x")
    with pytest.raises(DataFileError, match=r"v9\.json: cannot be read as a Kerchunk reference set .*version: 9"):
        ReferenceStore(str(tmp_path / "v9.json")).stat("x")
    with pytest.raises(DataFileError, match=r"nothing\.json: no such reference file"):
        ReferenceStore(str(tmp_path / "nothing.json")).stat("x")


def test_without_fsspec_the_error_names_the_extra(tmp_path, monkeypatch):
    refs = _write_set(tmp_path / "r.json", {"k": "v"})
    monkeypatch.setitem(sys.modules, "fsspec.implementations.reference", None)
    with pytest.raises(ImportError, match=r"pip install 'dali_mesh\[virtual\]'"):
        ReferenceStore(refs).stat("k")


# ---- NetCDF4/HDF5 files through kerchunk, read by ZarrSource ----------------------------------------
def _h5_file(path, data: dict) -> str:
    import h5py

    with h5py.File(path, "w") as f:
        for name, (values, kw) in data.items():
            f.create_dataset(name, data=values, **kw)
    return str(path)


def _kerchunk(path: str, out, inline_threshold: int = 0) -> str:
    from kerchunk.hdf import SingleHdf5ToZarr

    return _write_set(out, SingleHdf5ToZarr(path, inline_threshold=inline_threshold).translate())


def _each_rank(location, name, oracle, ranks: int, halo: int, boundary: str):
    """Every rank's window of every step of ``name`` (a split of the last axis in ``ranks`` with ``halo``)
    against the window of ``oracle``."""
    from dali_mesh import Layout, ZarrSource
    from dali_mesh.partition import take_window

    for r in range(ranks):
        layout = Layout(mesh_of((1, ranks), (0, r)), shard={"m0": oracle.ndim - 2}, halo={oracle.ndim - 2: halo},
                        boundary={oracle.ndim - 2: boundary})
        src = ZarrSource([location], name, layout, batch_size=1, shuffle=False)
        if r == ranks - 1:  # what DALI's worker processes get: the set's bytes and its files' stores
            src = pickle.loads(pickle.dumps(src))
        for t in range(len(oracle)):
            np.testing.assert_array_equal(src.read_sample(t)[0], take_window(oracle[t], src.region),
                                          err_msg=f"{name}, rank {r} of {ranks}, step {t}, seed {SEED}")


@pytest.mark.parametrize("inline_threshold", [0, 300])
def test_hdf5_chunked_gzip_shuffle_and_contiguous_read_as_h5py_reads_them(tmp_path, inline_threshold):
    import h5py

    rng = np.random.default_rng(SEED)
    t2m = rng.standard_normal((4, 13, 18)).astype("<f4")
    u = rng.integers(-1000, 1000, (3, 9, 11)).astype("<i2")
    path = _h5_file(tmp_path / "a.h5", {"t2m": (t2m, dict(chunks=(1, 5, 6), compression="gzip", shuffle=True)),
                                        "u": (u, {})})
    refs = _kerchunk(path, tmp_path / "a.json", inline_threshold)
    with h5py.File(path, "r") as f:  # the oracle: h5py reading the original file
        oracles = {"t2m": f["t2m"][...], "u": f["u"][...]}
    for name, oracle in oracles.items():
        for ranks, halo, boundary in ((2, 2, "constant"), (4, 1, "periodic")):
            _each_rank(f"reference://{refs}", name, oracle, ranks, halo, boundary)


def test_the_only_array_of_a_set_is_found_by_listing_it(tmp_path):
    from dali_mesh import Layout, ZarrSource

    x = np.arange(2 * 4 * 6, dtype="<f4").reshape(2, 4, 6)
    refs = _kerchunk(_h5_file(tmp_path / "one.h5", {"only": (x, dict(chunks=(1, 2, 6)))}), tmp_path / "one.json")
    src = ZarrSource([f"reference://{refs}"], None, Layout(mesh_of((1,), (0,))), batch_size=1, shuffle=False)
    np.testing.assert_array_equal(src.read_sample(1)[0], x[1])


def test_netcdf4_written_by_xarray_reads_as_xarray_reads_it(tmp_path):
    xr = pytest.importorskip("xarray")
    rng = np.random.default_rng(SEED)
    ds = xr.Dataset({"z500": (("time", "lat", "lon"), rng.standard_normal((3, 12, 16)).astype("<f4")),
                     "tp": (("time", "lat", "lon"), rng.standard_normal((3, 12, 16)).astype("<f8"))})
    path = str(tmp_path / "era.nc")
    ds.to_netcdf(path, engine="h5netcdf", encoding={"z500": {"zlib": True, "shuffle": True, "chunksizes": (1, 6, 8)},
                                                    "tp": {"contiguous": True}})
    refs = _kerchunk(path, tmp_path / "era.json")
    with xr.open_dataset(path, engine="h5netcdf") as opened:
        oracles = {name: opened[name].values for name in ("z500", "tp")}
    for name, oracle in oracles.items():
        _each_rank(f"reference://{refs}", name, oracle, 2, 3, "reflect")


def test_two_files_combined_along_time_read_as_xarray_reads_them(tmp_path):
    xr = pytest.importorskip("xarray")
    from kerchunk.combine import MultiZarrToZarr
    from kerchunk.hdf import SingleHdf5ToZarr

    rng = np.random.default_rng(SEED)
    parts = []
    for k in range(2):
        ds = xr.Dataset({"t": (("time", "lat", "lon"), rng.standard_normal((2, 10, 8)).astype("<f4"))},
                        coords={"time": np.arange(2 * k, 2 * k + 2, dtype="i8")})
        path = str(tmp_path / f"part{k}.nc")
        ds.to_netcdf(path, engine="h5netcdf", encoding={"t": {"zlib": True, "shuffle": True, "chunksizes": (1, 5, 4)}})
        parts.append(path)
    singles = [SingleHdf5ToZarr(p, inline_threshold=0).translate() for p in parts]
    combined = MultiZarrToZarr(singles, concat_dims=["time"], identical_dims=["lat", "lon"]).translate()
    refs = _write_set(tmp_path / "combined.json", combined)
    opened = [xr.open_dataset(p, engine="h5netcdf") for p in parts]  # open_mfdataset needs dask
    oracle = xr.concat(opened, dim="time")["t"].values
    for one in opened:
        one.close()
    assert oracle.shape == (4, 10, 8)
    _each_rank(f"reference://{refs}", "t", oracle, 2, 2, "edge")


def _parquet_set(refs: dict, folder, record_size: int = 5) -> str:
    """``refs`` written as a folder of Parquet references by kerchunk (fsspec's LazyReferenceMapper, as
    VirtualiZarr's ``to_kerchunk(format="parquet")`` does); a few chunks a record: a set of many files."""
    from kerchunk.df import refs_to_dataframe

    refs_to_dataframe(refs, str(folder), record_size=record_size)
    return str(folder)


def _netcdf_along_time(tmp_path, files: int = 3):
    """NetCDF4 files written by xarray (gzip + shuffle chunks, a contiguous variable), combined along
    time by kerchunk: ``(paths, combined references)``."""
    xr = pytest.importorskip("xarray")
    from kerchunk.combine import MultiZarrToZarr
    from kerchunk.hdf import SingleHdf5ToZarr

    rng = np.random.default_rng(SEED)
    paths = []
    for k in range(files):
        ds = xr.Dataset({"t": (("time", "lat", "lon"), rng.standard_normal((2, 10, 8)).astype("<f4")),
                         "q": (("time", "lat", "lon"), rng.integers(0, 9, (2, 10, 8)).astype("<i2"))},
                        coords={"time": np.arange(2 * k, 2 * k + 2, dtype="i8")})
        path = str(tmp_path / f"part{k}.nc")
        ds.to_netcdf(path, engine="h5netcdf", encoding={"t": {"zlib": True, "shuffle": True, "chunksizes": (1, 5, 4)},
                                                        "q": {"contiguous": True}})
        paths.append(path)
    singles = [SingleHdf5ToZarr(p, inline_threshold=0).translate() for p in paths]
    return paths, MultiZarrToZarr(singles, concat_dims=["time"], identical_dims=["lat", "lon"],
                                  inline_threshold=0).translate()


def test_parquet_references_read_as_xarray_reads_them(tmp_path):
    """A folder of Parquet references (kerchunk's, of NetCDF4 files along time): every rank's windows equal
    to xarray opening the same folder through fsspec, natively planned from the original files' ranges."""
    xr = pytest.importorskip("xarray")
    pytest.importorskip("fastparquet")
    from dali_mesh import Layout, ZarrSource
    from dali_mesh.partition import take_window

    paths, refs = _netcdf_along_time(tmp_path)
    folder = _parquet_set(refs, tmp_path / "refs.parq")
    with xr.open_dataset("reference://", engine="zarr", consolidated=False, chunks=None,
                         backend_kwargs={"storage_options": {"fo": folder, "remote_protocol": "file"}}) as opened:
        oracles = {name: opened[name].values for name in ("t", "q")}
    assert oracles["t"].shape == (6, 10, 8)
    for name, oracle in oracles.items():
        _each_rank(f"reference://{folder}", name, oracle, 2, 2, "periodic")
        layout = Layout(mesh_of((1, 2), (0, 1)), shard={"m0": 1}, halo={1: 1}, boundary={1: "symmetric"})
        src = ZarrSource([f"reference://{folder}"], name, layout, batch_size=1, shuffle=False)
        plan, wins = _read_natively(src)
        assert sorted(f.key for f in plan.files) == sorted(paths)  # the original files, nothing else
        for t, w in wins.items():
            np.testing.assert_array_equal(w, take_window(oracle[t], src.region), err_msg=f"{name}, step {t}")


def test_parquet_references_in_s3_read_with_the_sources_storage_options(tmp_path, s3_endpoint):
    pytest.importorskip("fastparquet")
    xr = pytest.importorskip("xarray")
    paths, refs = _netcdf_along_time(tmp_path, files=2)
    prefix = f"parquet/{SEED}"
    targets = {p: upload(s3_endpoint, p, "data", f"{prefix}/{os.path.basename(p)}") for p in paths}
    moved = {k: [targets[v[0]], *v[1:]] if isinstance(v, list) else v for k, v in refs["refs"].items()}
    folder = _parquet_set({**refs, "refs": moved}, tmp_path / "s3.parq")
    for root, _, names in os.walk(folder):
        for n in names:
            rel = os.path.relpath(os.path.join(root, n), folder)
            location = upload(s3_endpoint, os.path.join(root, n), "data", f"{prefix}/s3.parq/{rel}")
    location = location[:location.index("/s3.parq/") + len("/s3.parq")]
    opened = [xr.open_dataset(p, engine="h5netcdf") for p in paths]
    oracle = xr.concat(opened, dim="time")["t"].values
    for one in opened:
        one.close()
    from dali_mesh import Layout, ZarrSource
    from dali_mesh.partition import take_window

    layout = Layout(mesh_of((1, 2), (0, 1)), shard={"m0": 0}, halo={0: 2})
    src = ZarrSource([f"reference://{location}"], "t", layout, batch_size=1, shuffle=False,
                     storage_options=options(s3_endpoint))
    for s in (src, pickle.loads(pickle.dumps(src))):
        for t in range(len(oracle)):
            np.testing.assert_array_equal(s.read_sample(t)[0], take_window(oracle[t], src.region))


def test_a_folder_without_references_is_named(tmp_path):
    (tmp_path / "empty.parq").mkdir()
    with pytest.raises(DataFileError, match=r"empty\.parq: no such reference file, nor a folder of Parquet "
                                            r"references \(with a \.zmetadata\)"):
        ReferenceStore(str(tmp_path / "empty.parq")).stat("x/.zarray")


def _move_targets(refs: dict, url: str) -> dict:
    """``refs`` (kerchunk's) with every referenced file's URL replaced by ``url``."""
    moved = {k: [url, *v[1:]] if isinstance(v, list) else v for k, v in refs["refs"].items()}
    return {**refs, "refs": moved}


def _file_in_memory(tmp_path, stem: str, x):
    """An HDF5 file of ``x`` (chunks of 1 x 3 x 10) copied into a memory store of its own and removed from
    disk, and its references (kerchunk's) pointing there: ``(store name, store, references)``."""
    from dali_mesh.storage.memory import MemoryStore
    from kerchunk.hdf import SingleHdf5ToZarr

    path = _h5_file(tmp_path / f"{stem}.h5", {"x": (x, dict(chunks=(1, 3, 10)))})
    name = f"refs-{stem}-{SEED}"
    memory = MemoryStore(name)
    memory.put(f"{stem}.h5", (tmp_path / f"{stem}.h5").read_bytes())
    refs = _move_targets(SingleHdf5ToZarr(path, inline_threshold=0).translate(), f"memory://{name}/{stem}.h5")
    os.remove(path)  # read from memory only
    return name, memory, refs


def test_a_set_and_its_file_in_memory_read_through_the_memory_store(tmp_path):
    x = np.random.default_rng(SEED).standard_normal((3, 6, 10)).astype("<f8")
    name, memory, refs = _file_in_memory(tmp_path, "m", x)
    memory.put("refs.json", json.dumps(refs).encode())
    _each_rank(f"reference://memory://{name}/refs.json", "x", x, 2, 1, "symmetric")


def test_a_set_and_its_file_in_s3_read_with_the_sources_storage_options(tmp_path, s3_endpoint):
    from dali_mesh import Layout, ZarrSource
    from dali_mesh.partition import take_window
    from kerchunk.hdf import SingleHdf5ToZarr

    x = np.random.default_rng(SEED).standard_normal((2, 8, 9)).astype("<f4")
    path = _h5_file(tmp_path / "s.h5", {"x": (x, dict(chunks=(1, 4, 9), compression="gzip", shuffle=True))})
    prefix = f"refs/{SEED}"
    target = upload(s3_endpoint, path, "data", f"{prefix}/s.h5")
    refs = _write_set(tmp_path / "s.json", _move_targets(SingleHdf5ToZarr(path, inline_threshold=0).translate(),
                                                         target))
    location = "reference://" + upload(s3_endpoint, refs, "data", f"{prefix}/s.json")
    layout = Layout(mesh_of((1, 2), (0, 1)), shard={"m0": 1}, halo={1: 2})
    src = ZarrSource([location], "x", layout, batch_size=1, shuffle=False, storage_options=options(s3_endpoint))
    again = pickle.loads(pickle.dumps(src))  # a worker process: the credentials carried beside, not pickled
    assert SECRET.encode() not in pickle.dumps(src.stores())
    for s in (src, again):
        for t in range(2):
            np.testing.assert_array_equal(s.read_sample(t)[0], take_window(x[t], src.region))
    with pytest.raises(DataFileError, match=r"403|Forbidden|denied|credentials"):  # the options are what signs
        ReferenceStore(location.removeprefix("reference://"), options(s3_endpoint, anon=True)).stat("x/.zarray")


def _target_stores(refs_path, opts) -> dict:
    """The referenced URL -> the store that reads it, of a local set at ``refs_path`` read with ``opts``."""
    store, _ = store_of(f"reference://{refs_path}", opts)
    store._load()
    return {url: store_of(loc)[0] for url, loc in store._targets.items()}


def test_the_sources_options_sign_the_files_of_one_service_only(tmp_path):
    """storage_options are one service's: a set naming s3:// and https:// files signs the s3:// ones with
    them and reads the https:// ones without; one naming gs:// and s3:// files with options is refused
    (an AWS key would sign requests to Google, or Google's HMAC keys to AWS), and read without options or
    with the gs:// files' own (reference_options)."""
    opts = {"key": "AKIAUSERSAWSKEY00000", "secret": "users-aws-secret", "endpoint_url": "http://127.0.0.1:9"}
    mixed = _write_set(tmp_path / "mixed.json", {"version": 1, "refs": {
        ".zgroup": '{"zarr_format":2}', "a/0": ["https://example.org/a.nc", 0, 10], "b/0": ["s3://bkt/b.nc", 0, 10]}})
    stores = _target_stores(mixed, opts)
    assert stores["s3://bkt/b.nc"]._credentials.key == opts["key"]
    assert stores["https://example.org/a.nc"]._credentials is None
    assert "127.0.0.1:9" not in stores["https://example.org/a.nc"].spec
    two = _write_set(tmp_path / "two.json", {"version": 1, "refs": {
        ".zgroup": '{"zarr_format":2}', "a/0": ["gs://public/a.nc", 0, 10], "b/0": ["s3://bkt/b.nc", 0, 10]}})
    with pytest.raises(DataFileError, match=r"refers to files of gs://, s3:// \(gs://public, s3://bkt\): the "
                                            r"storage_options \['endpoint_url', 'key', 'secret'\] are one service's, "
                                            r"and the set cannot say which.*reference_options="):
        _target_stores(two, opts)
    stores = _target_stores(two, {**opts, "reference_options": {"gs": {"anon": True}}})  # the gs:// files' own
    assert stores["s3://bkt/b.nc"]._credentials.key == opts["key"]
    assert stores["gs://public/a.nc"].anon and "127.0.0.1:9" not in stores["gs://public/a.nc"].spec
    stores = _target_stores(two, {})
    assert all(s._credentials is None or s._credentials.key != opts["key"] for s in stores.values())
    only = _write_set(tmp_path / "only.json", {"version": 1, "refs": {
        ".zgroup": '{"zarr_format":2}', "b/0": ["s3://bkt/b.nc", 0, 10], "c/0": ["s3://bkt/c.nc", 0, 10]}})
    assert all(s._credentials.key == opts["key"] for s in _target_stores(only, opts).values())


@pytest.mark.parametrize("offset,length", [(-16, 256), (-256, 256), (272, -256), (16, 0), (16.5, 256), ("16", 256),
                                           (True, 256), (16, 2.0)])
def test_a_reference_whose_range_is_no_range_is_refused_naming_the_key(tmp_path, offset, length):
    """Negative offsets and lengths, an empty range, a float, a string or a bool where a whole number should be
    (a crafted or corrupt set): the read and the native planner's look-up name the key and the range, where
    they once failed as a corrupt plan, an OSError, a reshape, or read a float truncated to an int."""
    data = tmp_path / "data.bin"
    data.write_bytes(bytes(range(256)) * 3)
    refs = _write_set(tmp_path / "bad.json", {"version": 1, "refs": {"a/0": [str(data), offset, length]}})
    store, _ = store_of(f"reference://{refs}")
    for look in (store.stat, store.locate, lambda k: store.open(k)):
        with pytest.raises(DataFileError, match=r"#a/0: (refers to bytes .* an offset must be a whole number|has a "
                                                r"reference that is not).*the reference set is corrupt"):
            look("a/0")


def test_the_clients_settings_and_anonymity_reach_every_service(tmp_path):
    """Timeouts, retries, the range cache and ``anon`` are no service's credentials: every referenced file's
    store takes them, whichever scheme the keys went to (a set of s3:// and https:// files read with a cache
    once left the https:// files without it), and a set of gs:// and s3:// files reads anonymously."""
    cache = str(tmp_path / "cache")
    opts = {"key": "AKIAUSERSAWSKEY00000", "secret": "users-aws-secret", "timeout": 7, "retries": 2, "cache_dir": cache}
    mixed = _write_set(tmp_path / "mixed.json", {"version": 1, "refs": {
        ".zgroup": '{"zarr_format":2}', "a/0": ["https://example.org/a.nc", 0, 10], "b/0": ["s3://bkt/b.nc", 0, 10]}})
    for url, store in _target_stores(mixed, opts).items():
        assert all(f in store.spec for f in ("timeout=7", "retries=2", f"cache={cache}")), (url, store.spec)
    two = _write_set(tmp_path / "two.json", {"version": 1, "refs": {
        ".zgroup": '{"zarr_format":2}', "a/0": ["gs://public/a.nc", 0, 10], "b/0": ["s3://bkt/b.nc", 0, 10]}})
    assert all(s.anon for s in _target_stores(two, {"anon": True, "timeout": 7}).values())


def test_a_presigned_references_query_is_never_in_an_error(tmp_path):
    refs = _write_set(tmp_path / "q.json", {"version": 1, "refs": {
        "a/0": ["https://example.org/a.nc?X-Amz-Signature=SIGSECRET&X-Amz-Security-Token=TOKSECRET", 16, 0]}})
    with pytest.raises(DataFileError) as e:
        store_of(f"reference://{refs}")[0].stat("a/0")
    assert "SECRET" not in str(e.value) and "example.org/a.nc?" in str(e.value)


def test_a_set_may_not_refer_to_sets_or_repositories(tmp_path):
    refs = tmp_path / "self.json"
    _write_set(refs, {"version": 1, "refs": {".zgroup": '{"zarr_format":2}', "a/0": [f"reference://{refs}", 0, 4]}})
    with pytest.raises(DataFileError, match=r"refers to reference://.*: a reference set's references are files"):
        store_of(f"reference://{refs}")[0].stat("a/0")


def test_a_set_in_s3_may_not_name_local_files(tmp_path, s3_endpoint):
    secret = tmp_path / "private_key"
    secret.write_bytes(b"-----BEGIN PRIVATE KEY----- not for the set's author")
    refs = _write_set(tmp_path / "s.json", {"version": 1, "refs": {
        ".zgroup": '{"zarr_format":2}', "a/0": [str(secret), 0, 10], "b/0": [f"file://{secret}", 0, 10]}})
    location = "reference://" + upload(s3_endpoint, refs, "data", f"refs/{SEED}/local.json")
    with pytest.raises(DataFileError, match=r"refers to the local file .*private_key: a reference set read from "
                                            r"s3:// may not name files of this machine"):
        ReferenceStore(location.removeprefix("reference://"), options(s3_endpoint)).stat("a/0")


# ---- native reads: the planner reads the ranges of the original files --------------------------------
def _read_natively(src):
    """Every window of ``src``'s rank by the native reader (its plan written and read by the kernels
    library), and the plan."""
    from dali_mesh import _kernels
    from dali_mesh.pipeline import native

    (plan,) = native.plan_windows(src)
    ids = list(range(plan.num_items))
    folder = os.path.dirname(str(src.files[0]).removeprefix("reference://"))  # the plan beside the set
    with _kernels.PlanReader(plan.write(folder), plan.dtype, outputs=1) as reader:
        (wins,) = reader.read(ids, threads=2)
    return plan, dict(zip(ids, wins))


def test_raw_shuffled_and_deflated_chunks_and_contiguous_datasets_are_read_natively_from_the_original_file(tmp_path):
    import h5py

    from dali_mesh import Layout, ZarrSource
    from dali_mesh.partition import take_window
    from dali_mesh.plan import CODECS
    from dali_mesh.pipeline import native

    rng = np.random.default_rng(SEED)
    x = rng.standard_normal((5, 10, 12)).astype("<f8")
    path = _h5_file(tmp_path / "n.h5", {"c": (x, {}), "k": (x.astype("<i2"), dict(chunks=(2, 5, 12))),
                                        "z": (x, dict(chunks=(1, 5, 12), compression="gzip", shuffle=True))})
    refs = _kerchunk(path, tmp_path / "n.json")
    with h5py.File(path, "r") as f:
        oracles = {name: f[name][...] for name in ("c", "k")}
    for name, oracle in oracles.items():
        for r in range(2):
            layout = Layout(mesh_of((1, 2), (0, r)), shard={"m0": 0}, halo={0: 2}, boundary={0: "periodic"})
            src = ZarrSource([f"reference://{refs}"], name, layout, batch_size=1, shuffle=False)
            plan, wins = _read_natively(src)
            assert [(f.store, f.key) for f in plan.files] == [("file", path)]  # the original file, no other
            for t, w in wins.items():
                np.testing.assert_array_equal(w, take_window(oracle[t], src.region), err_msg=f"{name}, rank {r}, {t}")
    # HDF5's shuffle + deflate, as kerchunk writes them (v2 filters [shuffle, zlib], no compressor): one
    # coder that inflates then unshuffles, each chunk read at its offset in the original file
    for r in range(2):
        layout = Layout(mesh_of((1, 2), (0, r)), shard={"m0": 0}, halo={0: 2}, boundary={0: "periodic"})
        src = ZarrSource([f"reference://{refs}"], "z", layout, batch_size=1, shuffle=False)
        plan, wins = _read_natively(src)
        assert [(f.store, f.key) for f in plan.files] == [("file", path)]
        assert [c.steps for c in plan.coders] == [((CODECS["zlib"], 0), (CODECS["shuffle"], 8))]
        for t, w in wins.items():
            np.testing.assert_array_equal(w, take_window(x[t], src.region), err_msg=f"z, rank {r}, {t}")


def test_compressed_chunks_packed_in_one_file_are_read_natively_at_their_offsets(tmp_path):
    """A Zarr v2 array (zlib chunks) whose chunk objects are packed into one file, and a set naming each
    chunk's range there (what kerchunk makes of an archive): the coded chunks are read at their offsets."""
    zarr = pytest.importorskip("zarr")
    from numcodecs import Zlib

    from dali_mesh import Layout, ZarrSource
    from dali_mesh.partition import take_window

    x = np.random.default_rng(SEED).integers(0, 50, (4, 9, 14)).astype("<i4")
    written: dict = {}
    zarr.create_array(zarr.storage.MemoryStore(written), shape=x.shape, chunks=(1, 4, 5), dtype="<i4",
                      zarr_format=2, compressors=Zlib(level=1))[:] = x
    blob, refs = bytearray(b"head"), {}
    for key, buf in sorted(written.items()):
        data = buf.to_bytes()
        if key.startswith("."):
            refs[f"x/{key}"] = data.decode()
        else:
            refs[f"x/{key}"] = [str(tmp_path / "packed.bin"), len(blob), len(data)]
            blob += data
    (tmp_path / "packed.bin").write_bytes(bytes(blob))
    location = "reference://" + _write_set(tmp_path / "packed.json", {"version": 1, "refs": refs})
    for r in range(2):
        layout = Layout(mesh_of((1, 2), (0, r)), shard={"m0": 1}, halo={1: 3}, boundary={1: "reflect"})
        src = ZarrSource([location], "x", layout, batch_size=1, shuffle=False)
        plan, wins = _read_natively(src)
        assert [f.key for f in plan.files] == [str(tmp_path / "packed.bin")]
        for t, w in wins.items():
            np.testing.assert_array_equal(w, take_window(x[t], src.region), err_msg=f"rank {r}, step {t}")
    # the packed file's version is the plan's: a rewrite after the plan is refused by the reader, at
    # another size and at the same size
    from dali_mesh import _kernels

    path = plan.write(str(tmp_path))
    packed = tmp_path / "packed.bin"
    packed.write_bytes(bytes(blob) + b"more")
    with _kernels.PlanReader(path, plan.dtype, outputs=1) as reader:
        with pytest.raises(Exception, match=r"packed\.bin: the file is \d+ bytes, but the plan .* expects \d+: it "
                                             "changed since the plan was made"):
            reader.read([0], threads=1)
    packed.write_bytes(bytes(blob))
    os.utime(packed, ns=(1, 10**9))  # another modification time, however fast the rewrite was
    with _kernels.PlanReader(path, plan.dtype, outputs=1) as reader:
        with pytest.raises(Exception, match=r"packed\.bin.*(modified|changed) since the plan was made"):
            reader.read([0], threads=1)


def test_a_dali_pipeline_reads_a_set_whose_file_is_in_memory_natively(tmp_path):
    """``fn.read_windows`` without a fallback: the plugin's own memory store is given the referenced
    file (the reference store gives its files' stores to the plugin) and reads its ranges."""
    pytest.importorskip("nvidia.dali")
    from nvidia.dali import pipeline_def

    from dali_mesh import Layout, ZarrSource
    from dali_mesh.fn import read_windows
    from dali_mesh.partition import take_window

    x = np.random.default_rng(SEED).standard_normal((4, 6, 10)).astype("<f4")
    _, _, refs = _file_in_memory(tmp_path, "p", x)
    location = "reference://" + _write_set(tmp_path / "p.json", refs)
    layout = Layout(mesh_of((1, 2), (0, 1)), shard={"m0": 0}, halo={0: 1}, boundary={0: "periodic"})
    src = ZarrSource([location], "x", layout, batch_size=2, shuffle=False)

    @pipeline_def(batch_size=2, num_threads=2, device_id=None)
    def pipe():
        return read_windows(src, fallback=False)

    p = pipe()
    p.build()
    got = {}
    for _ in range(2):
        w, ids, _ = p.run()
        got.update((int(np.array(ids[j])), np.array(w[j])) for j in range(2))
    assert sorted(got) == list(range(4))
    for t, w in got.items():
        np.testing.assert_array_equal(w, take_window(x[t], src.region), err_msg=f"step {t}, seed {SEED}")


# ---- a referenced file missing, truncated or rewritten ------------------------------------------------
@pytest.fixture
def referenced(tmp_path):
    """A chunked HDF5 file, its reference set, and the ZarrSource of rank 0 of 2."""
    from dali_mesh import Layout, ZarrSource

    x = np.arange(2 * 8 * 10, dtype="<f4").reshape(2, 8, 10)
    path = _h5_file(tmp_path / "r.h5", {"x": (x, dict(chunks=(1, 4, 5), compression="gzip", shuffle=True))})
    refs = _kerchunk(path, tmp_path / "r.json")
    layout = Layout(mesh_of((1, 2), (0, 0)), shard={"m0": 1}, halo={1: 1})
    return path, refs, ZarrSource([f"reference://{refs}"], "x", layout, batch_size=1, shuffle=False)


def test_a_missing_referenced_file_is_named_with_the_key(referenced):
    path, refs, src = referenced
    os.remove(path)
    with pytest.raises(DataFileError, match=rf"{refs}#x/1\.\d\.\d: refers to {path}, which does not exist") as info:
        src.read_sample(1)
    assert not isinstance(info.value, MissingFileError)  # never a chunk read as the fill value


def test_a_truncated_referenced_file_is_named_with_the_key(referenced):
    path, refs, src = referenced
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    with pytest.raises(TruncatedFileError, match=rf"{refs}#x/1\.\d\.\d: refers to bytes \d+\.\.\d+ of {path}, which "
                                                 r"holds \d+ bytes"):
        src.read_sample(1)


def test_a_referenced_file_rewritten_during_a_read_is_refused(referenced):
    path, refs, _ = referenced
    store = ReferenceStore(refs)
    with store.open("x/0.0.0") as obj:
        head = obj.pread(4, 0)
        with open(path, "ab") as f:
            f.write(b"more")
        assert obj.pread(4, 0) == head
        with pytest.raises(FileChangedError, match=rf"{refs}#x/0\.0\.0: changed while it was read: its referenced "
                                                   rf"file {path}"):
            obj.check_unchanged()



# ---- weather datasets over references ---------------------------------------------------------------
_LEVELS = [500, 700, 850]


@pytest.fixture(scope="module")
def virtual_dataset(tmp_path_factory):
    """Three NetCDF4 files along time written by xarray (variables with and without levels: gzip+shuffle
    chunks whole-field and in latitude bands, and a contiguous one), combined along time by kerchunk's
    MultiZarrToZarr; the set as JSON and as Parquet: ``(folder, paths, {form: location})``."""
    xr = pytest.importorskip("xarray")
    pd = pytest.importorskip("pandas")
    from kerchunk.combine import MultiZarrToZarr
    from kerchunk.hdf import SingleHdf5ToZarr

    tmp_path = tmp_path_factory.mktemp("virtual")
    t, h, w = 4, 11, 16
    paths = []
    for k in range(3):
        rng = np.random.default_rng(SEED + k)
        ds = xr.Dataset(
            {"t2m": (("time", "latitude", "longitude"), rng.standard_normal((t, h, w)).astype("f4")),
             "z": (("time", "level", "latitude", "longitude"), rng.standard_normal((t, 3, h, w)).astype("f4")),
             "u10": (("time", "latitude", "longitude"), rng.standard_normal((t, h, w)).astype("f4"))},
            coords={"time": pd.date_range("2016-01-01", periods=3 * t, freq="6h")[k * t:(k + 1) * t],
                    "level": _LEVELS, "latitude": np.linspace(90, -90, h),
                    "longitude": np.linspace(0, 360, w, endpoint=False)})
        path = str(tmp_path / f"era{k}.nc")
        # one time unit for all files, as archives write it: MultiZarrToZarr concatenates the stored values
        ds.to_netcdf(path, engine="h5netcdf", encoding={
            "time": {"units": "hours since 2016-01-01"},
            "t2m": {"zlib": True, "shuffle": True, "chunksizes": (1, h, w)},
            "z": {"zlib": True, "shuffle": True, "complevel": 1, "chunksizes": (1, 1, 6, w)},
            "u10": {"contiguous": True}})
        paths.append(path)
    singles = [SingleHdf5ToZarr(p, inline_threshold=0).translate() for p in paths]
    refs = MultiZarrToZarr(singles, concat_dims=["time"], identical_dims=["level", "latitude", "longitude"],
                           inline_threshold=0).translate()
    forms = {"json": _write_set(tmp_path / "era.json", refs)}
    if _has("fastparquet"):
        forms["parquet"] = _parquet_set(refs, tmp_path / "era.parq", record_size=7)
    if _has("virtualizarr"):
        forms.update(_virtualizarr_sets(paths, tmp_path))
    return tmp_path, paths, refs, forms


def _virtualizarr_sets(paths, tmp_path) -> dict:
    """VirtualiZarr's sets of ``paths`` (its HDF parser, concatenated along time by xarray, the coordinates
    loaded): ``to_kerchunk`` JSON, and Parquet where fastparquet is installed."""
    import warnings

    import xarray as xr
    from obspec_utils.registry import ObjectStoreRegistry
    from obstore.store import LocalStore
    from virtualizarr import open_virtual_dataset
    from virtualizarr.parsers import HDFParser

    registry = ObjectStoreRegistry({"file://": LocalStore()})
    with warnings.catch_warnings():  # numcodecs codecs "not in the Zarr v3 specification": what it writes
        warnings.simplefilter("ignore")
        parts = [open_virtual_dataset(f"file://{p}", registry=registry, parser=HDFParser(),
                                      loadable_variables=["time", "level", "latitude", "longitude"]) for p in paths]
        combined = xr.concat(parts, dim="time", coords="minimal", compat="override", combine_attrs="override")
        out = {"virtualizarr_json": str(tmp_path / "vz.json")}
        combined.vz.to_kerchunk(out["virtualizarr_json"], format="json")
        if _has("fastparquet"):
            out["virtualizarr_parquet"] = str(tmp_path / "vz.parq")
            combined.vz.to_kerchunk(out["virtualizarr_parquet"], format="parquet")
    return out


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _xarray_over(location: str):
    """xarray opening the local reference set through fsspec's ReferenceFileSystem (the oracle)."""
    import xarray as xr

    return xr.open_dataset("reference://", engine="zarr", consolidated=False, chunks=None,
                           backend_kwargs={"storage_options": {"fo": location}})


_CHANNELS = ["t2m", ("z", [850, 500]), "u10", ("z", 700)]


def _dataset_fields(ds, t) -> np.ndarray:
    f = [ds["t2m"].isel(time=t).values] + [ds["z"].sel(level=lv).isel(time=t).values for lv in (850, 500)]
    f += [ds["u10"].isel(time=t).values, ds["z"].sel(level=700).isel(time=t).values]
    return np.stack(f).astype("f4")


@pytest.mark.parametrize("form", ["json", "parquet", "virtualizarr_json", "virtualizarr_parquet"])
def test_a_weather_dataset_over_references_equals_xarray_on_every_rank(virtual_dataset, form):
    """ZarrDatasetSource over a reference set of NetCDF4 files along time (variables x levels x time,
    forecasts; kerchunk's and VirtualiZarr's, JSON and Parquet): every window of every rank, read by
    read_dataset natively (no fallback) and in Python, equal to xarray opening the same set through fsspec."""
    pytest.importorskip("nvidia.dali")
    from nvidia.dali import pipeline_def

    from dali_mesh import ForecastSpec, MeshInfo, NamedLayout, ZarrDatasetSource
    from dali_mesh.fn import read_dataset
    from dali_mesh.partition import take_window

    _, _, _, forms = virtual_dataset
    if form not in forms:
        pytest.skip("fastparquet or virtualizarr is not installed")
    location = forms[form]
    with _xarray_over(location) as ds:
        fields = [_dataset_fields(ds, t) for t in range(ds.sizes["time"])]
        times = ds.time.values
    fc = ForecastSpec(1, 1)
    for coord in range(3):
        layout = NamedLayout(MeshInfo((1, 3), ("dp", "mp"), (0, coord)), shard={"mp": "latitude"}, batch="dp",
                             halo={"latitude": 2, "longitude": 1},
                             boundary={"latitude": "reflect", "longitude": "periodic"})
        src = ZarrDatasetSource(f"reference://{location}", _CHANNELS, layout, batch_size=2, shuffle=False,
                                forecast=fc, dtype=np.float32)
        np.testing.assert_array_equal(src.times, times)

        @pipeline_def(batch_size=2, num_threads=2, device_id=None)
        def pipe():
            return read_dataset(src, fallback=False)

        p = pipe()
        p.build()
        for _ in range(len(src) // 2):
            inp, tgt, ids, _ = p.run()
            for j in range(2):
                sid = int(np.array(ids[j]))
                t = src.time_index(sid)
                want = (np.stack([take_window(fields[s], src.region) for s in (t - 1, t)]),
                        take_window(fields[t + 1], src.region)[None])
                for got, expect in zip((np.array(inp[j]), np.array(tgt[j])), want):
                    np.testing.assert_array_equal(got, expect, err_msg=f"{form}, rank {coord}, step {t}")
                for got, expect in zip(src.read_sample(sid), want):
                    np.testing.assert_array_equal(got, expect, err_msg=f"{form}, rank {coord}, step {t}, Python")


def test_a_weather_dataset_over_references_in_s3(virtual_dataset, s3_endpoint):
    """The set and the NetCDF4 files in (moto's) S3, the set naming s3:// URLs: the windows equal xarray's
    over the set of the files uploaded, read with the source's storage_options (pickled as a worker gets
    it)."""
    from dali_mesh import MeshInfo, NamedLayout, ZarrDatasetSource
    from dali_mesh.partition import take_window

    tmp_path, paths, refs, forms = virtual_dataset
    prefix = f"dataset/{SEED}"
    targets = {p: upload(s3_endpoint, p, "data", f"{prefix}/{os.path.basename(p)}") for p in paths}
    moved = {k: [targets[v[0]], *v[1:]] if isinstance(v, list) else v for k, v in refs["refs"].items()}
    local = _write_set(tmp_path / "era-s3.json", {**refs, "refs": moved})
    location = upload(s3_endpoint, local, "data", f"{prefix}/era.json")
    with _xarray_over(forms["json"]) as ds:  # the same set over the files uploaded (the same bytes)
        fields = [_dataset_fields(ds, t) for t in range(ds.sizes["time"])]
    layout = NamedLayout(MeshInfo((3,), ("mp",), (1,)), shard={"mp": "latitude"}, halo={"latitude": 1})
    src = ZarrDatasetSource(f"reference://{location}", _CHANNELS, layout, batch_size=1, shuffle=False,
                            dtype=np.float32, storage_options=options(s3_endpoint))
    for s in (src, pickle.loads(pickle.dumps(src))):
        for sid in range(len(s)):
            np.testing.assert_array_equal(s.read_sample(sid)[0], take_window(fields[s.time_index(sid)], src.region))
    if not _has("nvidia.dali"):
        return
    from nvidia.dali import pipeline_def

    from dali_mesh.fn import read_dataset

    @pipeline_def(batch_size=1, num_threads=2, device_id=None)
    def pipe():
        return read_dataset(src, fallback=False)[0]  # the plugin reads the files' ranges from S3 itself

    p = pipe()
    p.build()
    for sid in range(len(src)):
        (w,) = p.run()
        np.testing.assert_array_equal(np.array(w[0]), take_window(fields[src.time_index(sid)], src.region))
