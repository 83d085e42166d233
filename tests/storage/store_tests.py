"""The tests every byte store passes (as zarr-python's ``testing/store.py`` ``StoreTests``): a new
backend subclasses :class:`StoreTests`, says how to make an object and how to rewrite one, and
inherits the tests, not a copy of them. The oracle is the bytes the test wrote."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

from dali_mesh.storage import (ByteStore, FileChangedError, MissingFileError, TruncatedFileError,
                               attach_credentials, carry_credentials, read_exactly, readv_all)
from dali_mesh.io import IOStats


class StoreTests:
    """Subclasses define the fixture ``store`` (a :class:`ByteStore`) and the methods below."""

    def put(self, store: ByteStore, name: str, data: bytes) -> str:
        """Writes ``data`` as a new object; returns its key."""
        raise NotImplementedError

    def rewrite(self, store: ByteStore, key: str, data: bytes) -> None:
        """Replaces the object ``key`` with ``data`` in place (a new version)."""
        raise NotImplementedError

    def missing_key(self, store: ByteStore) -> str:
        raise NotImplementedError

    @pytest.fixture
    def data(self):
        return np.random.default_rng(7).integers(0, 256, 100_000, dtype=np.uint8).tobytes()

    def test_stat_gives_the_size_and_none_for_a_missing_key(self, store, data):
        key = self.put(store, "a", data)
        assert store.stat(key).size == len(data)
        assert store.stat(self.missing_key(store)) is None

    def test_open_of_a_missing_key_names_it(self, store):
        key = self.missing_key(store)
        with pytest.raises(MissingFileError, match="no such") as info:
            store.open(key)
        assert info.value.path == store.name_of(key)

    def test_readv_scatters_the_bytes_in_order(self, store, data):
        key = self.put(store, "b", data)
        rng = np.random.default_rng(1)
        with store.open(key) as obj:
            assert obj.version.size == len(data) and obj.size == len(data)
            for _ in range(50):
                offset = int(rng.integers(0, len(data)))
                lens = [int(v) for v in rng.integers(1, 3000, int(rng.integers(1, 6)))]
                lens[-1] = max(1, min(lens[-1], len(data) - offset - sum(lens[:-1]))) if \
                    offset + sum(lens) > len(data) else lens[-1]
                if offset + sum(lens) > len(data):
                    continue
                bufs = [bytearray(n) for n in lens]
                stats = IOStats()
                readv_all(obj, [memoryview(b) for b in bufs], lens, offset, stats)
                assert b"".join(bufs) == data[offset:offset + sum(lens)]
                assert stats.bytes_read == sum(lens) and stats.read_calls >= 1
            obj.check_unchanged()

    def test_reads_past_the_end_are_short_or_named(self, store, data):
        key = self.put(store, "c", data)
        with store.open(key) as obj:
            assert obj.pread(100, len(data) - 40) == data[-40:]
            assert obj.pread(10, len(data) + 5) == b""
            assert read_exactly(obj, 100, len(data) - 40, allow_short=True) == data[-40:]
            with pytest.raises(TruncatedFileError, match="truncated while reading") as info:
                read_exactly(obj, 100, len(data) - 40)
            assert info.value.path == obj.name
            a, b = bytearray(60), bytearray(60)  # 120 bytes asked of the last 100: the second ends early
            with pytest.raises(TruncatedFileError, match="truncated while reading"):
                readv_all(obj, [memoryview(a), memoryview(b)], [60, 60], len(data) - 100)
            assert bytes(a) + bytes(b[:40]) == data[-100:]

    def test_read_range_is_a_plan_time_read(self, store, data):
        key = self.put(store, "d", data)
        assert store.read_range(key, 1000, 500) == data[1000:1500]
        assert store.read_range(key, len(data) - 10, 500) == data[-10:]

    def test_a_rewrite_while_open_is_a_new_version_and_refused(self, store, data):
        key = self.put(store, "e", data)
        before = store.stat(key)
        with store.open(key) as obj:
            obj.check_unchanged()
            self.rewrite(store, key, data[::-1] + b"x")
            with pytest.raises(FileChangedError, match="changed while it was read") as info:
                obj.check_unchanged()
            assert info.value.path == obj.name
        assert store.stat(key) != before

    def test_prefetch_is_a_hint_that_never_raises(self, store, data):
        key = self.put(store, "f", data)
        store.prefetch(key, [(0, 4096), (len(data) - 10, 1 << 40), (2**62, 2**62)])
        store.prefetch(self.missing_key(store), [(0, 10)])

    def test_the_store_pickles_to_an_equal_store(self, store, data):
        key = self.put(store, "g", data)
        again = pickle.loads(pickle.dumps(store))
        assert again.spec == store.spec and again == store
        # its pickle holds no credential: a source carries them beside it and gives them to the store
        attach_credentials([again], carry_credentials([store]))
        with again.open(key) as obj:
            assert obj.pread(16, 0) == data[:16]

    def test_the_spec_names_no_secret(self, store):
        assert store.spec and "secret" not in store.spec.lower()


class FileObjectTests:
    """``ByteStore.open_file`` against ``io.BytesIO`` of the same bytes (mixed into StoreTests' users)."""

    def test_open_file_reads_and_seeks_as_bytesio(self, store, data):
        import io

        key = self.put(store, "h", data)
        rng = np.random.default_rng(2)
        oracle = io.BytesIO(data)
        with store.open_file(key) as f:
            for _ in range(200):
                whence = int(rng.integers(0, 3))
                offset = int(rng.integers(0 if whence == io.SEEK_SET else -50, len(data) + 50))
                base = {io.SEEK_SET: 0, io.SEEK_CUR: oracle.tell(), io.SEEK_END: len(data)}[whence]
                if base + offset < 0:
                    continue
                assert f.seek(offset, whence) == oracle.seek(offset, whence)
                n = int(rng.integers(0, 5000))
                assert f.read(n) == oracle.read(n)
                assert f.tell() == oracle.tell()
