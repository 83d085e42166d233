"""The local POSIX store (dali_mesh/storage/local.py): the shared store tests, and what only files
have (FIFOs, folders, O_DIRECT, keys given as paths or file:// URLs)."""
from __future__ import annotations

import os

import pytest

from dali_mesh.storage import LOCAL, NotRegularFileError, UnsupportedLocationError, store_of
from tests.storage.store_tests import StoreTests


class TestLocalStore(StoreTests):
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
    with pytest.raises(NotRegularFileError, match="directory"):
        LOCAL.open(str(tmp_path))


def test_locations_resolve_to_the_local_store_or_are_refused(tmp_path):
    assert store_of(str(tmp_path / "a.npy")) == (LOCAL, str(tmp_path / "a.npy"))
    assert store_of(tmp_path / "a.npy") == (LOCAL, str(tmp_path / "a.npy"))
    assert store_of(f"file://{tmp_path}/a.npy") == (LOCAL, f"{tmp_path}/a.npy")
    assert store_of("relative/x.zarr") == (LOCAL, "relative/x.zarr")
    with pytest.raises(UnsupportedLocationError, match=r"no store of this build reads az:// locations"):
        store_of("az://container/blob")
