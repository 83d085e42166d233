"""The local POSIX store (dali_mesh/storage/local.py): the shared store tests, and what only files
have (FIFOs, folders, O_DIRECT, keys given as paths or file:// URLs)."""
from __future__ import annotations

import os

import pytest

from dali_mesh.storage import LOCAL, LocalStore, NotRegularFileError, UnsupportedLocationError, store_of
from tests.storage.store_tests import FileObjectTests, StoreTests


class TestLocalStore(StoreTests, FileObjectTests):
    @pytest.fixture
    def store(self, tmp_path):
        self.folder = tmp_path
        return LOCAL

    def put(self, store, name, data):
        path = self.folder / name
        path.write_bytes(data)
        return str(path)

    def rewrite(self, store, key, data):
        with open(key, "r+b") as f:  # in place: the same inode
            f.write(data)

    def missing_key(self, store):
        return str(self.folder / "missing.bin")


def test_a_fifo_or_a_folder_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(NotRegularFileError, match="FIFO"):
        LOCAL.open(str(fifo))
    with pytest.raises(NotRegularFileError, match="FIFO"):
        LOCAL.stat(str(fifo))
    with pytest.raises(NotRegularFileError, match="FIFO"):  # a plan-time read too (it used to open() and wait)
        LOCAL.read_range(str(fifo), 0, 16)
    with pytest.raises(NotRegularFileError, match="directory"):
        LOCAL.open(str(tmp_path))


def test_locations_resolve_to_the_local_store_or_are_refused(tmp_path):
    assert store_of(str(tmp_path / "a.npy")) == (LOCAL, str(tmp_path / "a.npy"))
    assert store_of(tmp_path / "a.npy") == (LOCAL, str(tmp_path / "a.npy"))
    assert store_of(f"file://{tmp_path}/a.npy") == (LOCAL, f"{tmp_path}/a.npy")
    assert store_of("relative/x.zarr") == (LOCAL, "relative/x.zarr")
    with pytest.raises(UnsupportedLocationError, match=r"no store of this build reads az:// locations"):
        store_of("az://container/blob")


class _ThroughObjects(LocalStore):
    """This machine's files as if they were remote objects: no local fast path (h5py reads a file
    object of ranged reads), no native store (plans fall back to Python)."""

    spec = "objects-test"
    native = False

    def local_path(self, key):
        return None  # no file of this machine to hand to a library by path

    def __reduce__(self):
        return (_ThroughObjects, ())


def test_a_store_that_is_not_local_is_read_through_the_seam(tmp_path):
    """A non-local store: HDF5Source reads through StoredFile (h5py on ranged reads) and equals the
    local read; the native plan says it is not native (the pipeline falls back)."""
    import h5py
    import numpy as np

    from dali_mesh import Layout, MeshInfo
    from dali_mesh.plan import NotNativeError
    from dali_mesh.partition import take_window
    from dali_mesh.source import HDF5Source
    from dali_mesh.storage import register_scheme

    data = np.random.default_rng(5).standard_normal((4, 9, 11)).astype(np.float32)
    with h5py.File(tmp_path / "x.h5", "w") as f:
        f.create_dataset("v", data=data, chunks=(1, 3, 11), compression="gzip")
    register_scheme("objects-test", lambda location, options: (_ThroughObjects(), location.split("://", 1)[1]))
    layout = Layout(MeshInfo((3,), ("mp",), (2,)), shard={"mp": 0}, halo={0: 1, 1: 2}, boundary="periodic")
    src = HDF5Source([f"objects-test://{tmp_path}/x.h5"], "v", layout, batch_size=1, shuffle=False)
    for i in range(4):
        np.testing.assert_array_equal(src.read_sample(i)[0], take_window(data[i], src.region))
    with pytest.raises(NotNativeError, match="native reader has no 'objects-test' store"):
        src.native_plans()


def test_file_urls_follow_rfc_8089(tmp_path):
    """Issue 40, finding 17: ``file://localhost/abs`` is this host's ``/abs`` (it was read as the relative
    path ``localhost/abs``); a URL naming another host is refused, never read as a relative path."""
    (tmp_path / "a.npy").write_bytes(b"x")
    assert store_of(f"file://localhost{tmp_path}/a.npy") == (LOCAL, f"{tmp_path}/a.npy")
    assert store_of(f"file://LOCALHOST{tmp_path}/a.npy") == (LOCAL, f"{tmp_path}/a.npy")
    assert store_of(f"file://{tmp_path}/a.npy") == (LOCAL, f"{tmp_path}/a.npy")
    for url in ("file://server/share/a.npy", "file://data/a.npy"):
        with pytest.raises(UnsupportedLocationError, match="file:// URLs are read on this host only"):
            store_of(url)



def test_stores_say_whether_they_list():
    """Issue 41 (the store seam): listing is a capability asked for (``supports_listing``), never probed with
    hasattr; a store that does not list says so in a DataFileError naming it."""
    from dali_mesh.storage import DataFileError
    from dali_mesh.storage.remote import RemoteStore

    assert not LOCAL.supports_listing
    with pytest.raises(DataFileError, match="cannot list a folder"):
        LOCAL.list("/tmp/")
    assert RemoteStore("s3", endpoint="http://127.0.0.1:9", anon=True).supports_listing
    http = RemoteStore("http")
    assert not http.supports_listing
    with pytest.raises(DataFileError, match="cannot be listed"):
        http.list("https://host/folder/")
