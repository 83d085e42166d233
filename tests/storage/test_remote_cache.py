"""The local cache of fetched ranges (``storage_options`` ``cache_dir`` / ``cache_bytes``:
csrc/storage/range_cache.cc) against a real S3 server behind a counting proxy: a second read of the
same ranges fetches nothing and returns the same bytes; a damaged entry is fetched again; a replaced
object is never served at its new version from the old entries; the folder is this user's only and
bounded; several processes share it."""
from __future__ import annotations

import os
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from dali_mesh.storage import DataFileError, store_of
from dali_mesh.storage.remote import have_native_http
from tests.storage.fault_proxy import proxy  # noqa: F401
from tests.storage.s3_server import client, options, s3_endpoint, upload  # noqa: F401

pytestmark = [pytest.mark.skipif(not have_native_http(), reason="this build has no libcurl"),
              pytest.mark.timeout(120)]


@pytest.fixture
def obj(s3_endpoint, request):
    data = np.random.default_rng(zlib.crc32(request.node.name.encode())).bytes(50_000)
    name = f"cache/{request.node.name}.bin"
    client(s3_endpoint).put_object(Bucket="data", Key=name, Body=data)
    return f"data/{name}", data


def opened(store, key):
    """``key`` opened at the version a HEAD names, as a plan opens it: no first bytes are fetched with
    the open (``store.open``'s GET), so every read below goes to the server."""
    return store.open_version(key, store.stat(key))


def _entries(folder) -> list[Path]:
    """The cache's entries: in its own subfolder of ``cache_dir``."""
    return [p for p in Path(folder, "dali_mesh-cache-v1").glob("??/*") if not p.name.startswith(".")]


def test_a_second_read_of_a_range_fetches_nothing(proxy, obj, tmp_path):
    key, data = obj
    store, key = store_of(f"s3://{key}", options(proxy.endpoint, cache_dir=str(tmp_path / "c")))
    with opened(store, key) as o:
        for offset, n in [(0, 1000), (20_000, 7000), (49_000, 1000)]:
            assert o.pread(n, offset) == data[offset:offset + n]
        gets = proxy.count("GET")
        assert gets == 3
        for offset, n in [(0, 1000), (20_000, 7000), (49_000, 1000)]:
            assert o.pread(n, offset) == data[offset:offset + n]
        assert proxy.count("GET") == gets  # every range from the cache
        assert o.pread(500, 100) == data[100:600] and proxy.count("GET") == gets + 1  # another range: fetched
    assert len(_entries(tmp_path / "c")) == 4
    assert oct(os.stat(tmp_path / "c").st_mode & 0o777) == "0o700"


def test_a_damaged_entry_is_fetched_again(proxy, obj, tmp_path):
    key, data = obj
    store, key = store_of(f"s3://{key}", options(proxy.endpoint, cache_dir=str(tmp_path / "c")))
    with opened(store, key) as o:
        assert o.pread(4000, 1000) == data[1000:5000]
        (entry,) = _entries(tmp_path / "c")
        raw = bytearray(entry.read_bytes())
        raw[-10] ^= 0xFF  # one bit flipped in the cached bytes
        entry.write_bytes(bytes(raw))
        assert o.pread(4000, 1000) == data[1000:5000]
        assert proxy.count("GET") == 2
        entry.write_bytes(bytes(raw[:-100]))  # a truncated entry
        assert o.pread(4000, 1000) == data[1000:5000]
        assert proxy.count("GET") == 3


def test_a_replaced_object_is_not_served_from_the_old_entries(proxy, obj, tmp_path, s3_endpoint):
    key, data = obj
    opts = options(proxy.endpoint, cache_dir=str(tmp_path / "c"))
    store, key = store_of(f"s3://{key}", opts)
    with opened(store, key) as o:
        assert o.pread(1000, 0) == data[:1000]
    new = bytes(reversed(data))
    client(s3_endpoint).put_object(Bucket="data", Key=key.split("/", 1)[1], Body=new)
    with opened(store, key) as o:  # the new version (its ETag): not the cached bytes
        assert o.pread(1000, 0) == new[:1000]


def test_the_folder_must_be_this_users_own(proxy, obj, tmp_path):
    key, _ = obj
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    store, key = store_of(f"s3://{key}", options(proxy.endpoint, cache_dir=str(shared)))
    with pytest.raises(DataFileError, match="writable by others"), opened(store, key) as o:
        o.pread(10, 0)
    with pytest.raises(ValueError, match="cache_bytes needs cache_dir"):
        store_of(f"s3://{key}", options(proxy.endpoint, cache_bytes=10))
    with pytest.raises(ValueError, match="cache_bytes must be a positive integer"):
        store_of(f"s3://{key}", options(proxy.endpoint, cache_dir=str(tmp_path / "c"), cache_bytes=0))


def test_the_folder_stays_within_its_bound(proxy, obj, tmp_path):
    key, data = obj
    store, key = store_of(f"s3://{key}", options(proxy.endpoint, cache_dir=str(tmp_path / "c"), cache_bytes=20_000))
    with opened(store, key) as o:
        for i in range(40):
            assert o.pread(1000, i * 1000) == data[i * 1000:(i + 1) * 1000]
        total = sum(p.stat().st_size for p in _entries(tmp_path / "c"))
        assert 0 < total <= 20_000 + 2 * 1200  # evicted to 90% whenever a tenth of the bound was written
        assert o.pread(1000, 39_000) == data[39_000:40_000]  # the newest entries stay
        assert proxy.count("GET") == 40


_READER = r"""
import sys
from dali_mesh.storage import store_of
loc, endpoint, cache, key, secret = sys.argv[1:]
store, k = store_of(loc, {"key": key, "secret": secret, "endpoint_url": endpoint, "cache_dir": cache})
with store.open_version(k, store.stat(k)) as o:  # no first bytes kept: every read through the cache
    for r in range(3):
        for i in range(50):
            sys.stdout.buffer.write(o.pread(1000, i * 1000))
"""


@pytest.mark.usefixtures("proxy")
def test_several_processes_share_the_folder(obj, tmp_path, s3_endpoint):
    from tests.storage.s3_server import KEY, SECRET

    key, data = obj
    cache = str(tmp_path / "c")
    procs = [subprocess.Popen([sys.executable, "-c", _READER, f"s3://{key}", s3_endpoint, cache, KEY, SECRET],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(Path(__file__).parents[2]))
             for _ in range(3)]
    for p in procs:
        out, err = p.communicate(timeout=100)
        assert p.returncode == 0, err.decode()[-2000:]
        assert out == data * 3
    assert len(_entries(cache)) == 50
    assert not list(Path(cache, "dali_mesh-cache-v1").glob("??/.dmrc-tmp-*"))  # every entry renamed into place


@pytest.mark.usefixtures("proxy")
def test_a_second_epoch_of_the_native_reader_reads_the_cache(proxy, tmp_path, s3_endpoint):
    pytest.importorskip("nvidia.dali")
    import zarr
    from numcodecs import Blosc

    from dali_mesh import Layout, MeshInfo, ZarrSource
    from dali_mesh.partition import take_window
    from dali_mesh.pipeline.plugin import load_plugin
    from tests.helpers import native_batches

    load_plugin()
    arr = np.random.default_rng(3).normal(size=(4, 2, 64, 48)).astype("f4")
    z = zarr.create_array(tmp_path / "w.zarr", shape=arr.shape, chunks=(1, 2, 64, 48), dtype="f4", zarr_format=2,
                          compressors=[Blosc("lz4", 5, Blosc.SHUFFLE, blocksize=1024)])
    z[:] = arr
    location = upload(s3_endpoint, tmp_path / "w.zarr", "data", "cache/w.zarr")
    layout = Layout(MeshInfo((1, 4), ("dp", "mp"), (0, 1)), shard={"mp": 1}, halo={1: 1}, boundary="reflect")
    opts = options(proxy.endpoint, cache_dir=str(tmp_path / "c"))
    import re

    for epoch in range(2):
        src = ZarrSource([location], None, layout, shuffle=False, storage_options=opts)
        before = len(proxy.requests)
        got = dict(native_batches(src, 4))
        for sid, win in got.items():
            np.testing.assert_array_equal(win, take_window(arr[sid], src.region))
        # the chunk objects' GETs (v2 keys "<t>.<c>.<y>.<x>"; planning reads metadata again)
        chunk_gets = [r for r in proxy.requests[before:] if r[0] == "GET" and re.search(r"/w\.zarr/\d+\.", r[1])]
        if epoch == 0:
            assert len(chunk_gets) >= 4  # a chunk at least once
        else:  # every chunk range comes from the cache
            assert chunk_gets == []


def test_chunks_read_in_parts_come_from_the_cache_in_the_next_epoch_of_one_pipeline(proxy, tmp_path, s3_endpoint):
    """Whole-field Blosc chunks read in parts with ``cache_dir``: the second epoch of the same pipeline
    sends no request for a chunk. (Without a cache, a read in parts starts from the previous chunk's
    layout, and the next epoch's first chunk would ask for other ranges than this epoch's: with a cache
    the ranges are the exact parts, the same each epoch.)"""
    pytest.importorskip("nvidia.dali")
    import re

    import zarr
    from numcodecs import Blosc

    from dali_mesh import Layout, MeshInfo, ZarrSource
    from dali_mesh.partition import take_window
    from tests.helpers import native_pipeline

    arr = np.round(np.random.default_rng(4).normal(size=(3, 4, 360, 720)), 1).astype("f4")
    z = zarr.create_array(tmp_path / "g.zarr", shape=arr.shape, chunks=(1, 4, 360, 720), dtype="f4", zarr_format=2,
                          compressors=[Blosc("lz4", 5, Blosc.SHUFFLE)])
    z[:] = arr
    location = upload(s3_endpoint, tmp_path / "g.zarr", "data", "cache/g.zarr")
    assert client(s3_endpoint).head_object(Bucket="data", Key="cache/g.zarr/0.0.0.0")["ContentLength"] > 2 * (256 << 10)
    layout = Layout(MeshInfo((1, 4), ("dp", "mp"), (0, 1)), shard={"mp": 1})  # a band of latitude rows
    src = ZarrSource([location], None, layout, batch_size=1, shuffle=False,
                     storage_options=options(proxy.endpoint, cache_dir=str(tmp_path / "c")))
    pipe = native_pipeline(src, plan_dir=str(tmp_path / "plans"))
    counts = []
    for epoch in range(2):
        before = len(proxy.requests)
        for _ in range(3):
            try:
                w, ids, _ = pipe.run()
            except StopIteration:
                pipe.reset()
                w, ids, _ = pipe.run()
            np.testing.assert_array_equal(np.array(w[0]), take_window(arr[int(np.array(ids[0]))], src.region))
        chunk_gets = [r for r in proxy.requests[before:] if r[0] == "GET" and re.search(r"/g\.zarr/\d+\.", r[1])]
        counts.append(len(chunk_gets))
        if epoch == 0:  # read in parts: the header and index, then the band's blocks
            assert all(r[2] for r in chunk_gets) and len(chunk_gets) >= 2 * 3, chunk_gets
    assert counts[1] == 0, counts
