"""Opening a remote Zarr array in the fewest round trips (issue 42): what ``ZarrSource(...)`` and its native
plan ask the server, counted by the benchmarks' parallel S3 server (tests/storage/request_log.py), for a
v2 Blosc array, a v3 sharded one and a v3 plain one; the windows read after such an open against
zarr-python's read of the local copy; and the checks it keeps (versions pinned, a rewrite refused)."""
from __future__ import annotations

import numpy as np
import pytest

from tests.storage.request_log import LoggingS3Server, waves
from tests.storage.s3_server import options

#: each answer's latency: requests sent together overlap in time, requests sent one after another's
#: answer do not, whatever the load of the machine (its cost is the clients', not measured here)
LATENCY = 0.05
SHAPE = (8, 3, 40, 48)


def _write(root, kind: str) -> np.ndarray:
    import numcodecs
    import zarr

    data = np.round(np.random.default_rng(42).normal(size=SHAPE), 2).astype("f4")
    path = root / "bench" / f"{kind}.zarr"
    if kind == "v2_blosc":
        z = zarr.create_array(path, shape=SHAPE, chunks=(1,) + SHAPE[1:], dtype="f4", zarr_format=2,
                              compressors=numcodecs.Blosc("lz4", 5, numcodecs.Blosc.SHUFFLE))
    elif kind == "v3_sharded":  # two shards of 4 steps
        z = zarr.create_array(path, shape=SHAPE, chunks=(1,) + SHAPE[1:], shards=(4,) + SHAPE[1:], dtype="f4",
                              compressors=zarr.codecs.ZstdCodec(level=3))
    else:
        z = zarr.create_array(path, shape=SHAPE, chunks=(1, 3, 20, 48), dtype="f4")
    z[:] = data
    return data


@pytest.fixture
def server(tmp_path):
    (tmp_path / "bench").mkdir()
    with LoggingS3Server(root=str(tmp_path), latency=LATENCY) as s:
        yield s


def _layout():
    from dali_mesh import Layout, MeshInfo

    return Layout(MeshInfo((1, 2), ("dp", "mp"), (0, 1)), shard={"mp": 1}, halo={1: 1}, boundary="reflect")


def _source(server, kind: str):
    from dali_mesh import ZarrSource

    return ZarrSource([f"s3://bench/{kind}.zarr"], None, _layout(), shuffle=False,
                      storage_options=options(server.endpoint))


@pytest.mark.parametrize("kind", ["v2_blosc", "v3_sharded", "v3_plain"])
def test_an_open_and_its_plan_are_one_round_trip_of_at_most_four_requests(server, tmp_path, kind):
    """Source and native plan: the metadata objects and the folder's listing in one wave (no HEAD, nothing
    read twice); a sharded array's two shard indexes in a second wave, together."""
    _write(tmp_path, kind)
    server.take_log()
    src = _source(server, kind)
    src.native_plans()
    log = server.take_log()
    shown = "\n".join(f"{r.method} {r.key} {r.range}" for r in log)
    trips = waves(log)
    assert [r.method for r in log].count("HEAD") == 0, shown
    assert [r.method for r in trips[0]].count("LIST") == 1, shown
    assert len(trips[0]) <= 4, shown
    keys = [r.key for r in log]
    assert len(keys) == len(set(keys)), f"an object read twice:\n{shown}"
    if kind == "v3_sharded":
        assert len(trips) == 2 and sorted(r.key for r in trips[1]) == [f"bench/{kind}.zarr/c/{s}/0/0/0"
                                                                        for s in (0, 1)], shown
    else:
        assert len(trips) == 1, shown


@pytest.mark.usefixtures("_plugin")
@pytest.mark.parametrize("kind", ["v2_blosc", "v3_sharded", "v3_plain"])
def test_windows_read_after_the_short_open_equal_zarr_python(server, tmp_path, kind):
    import zarr

    from dali_mesh.partition import take_window
    from tests.helpers import native_batches

    _write(tmp_path, kind)
    oracle = zarr.open_array(str(tmp_path / "bench" / f"{kind}.zarr"), mode="r")[:]
    src = _source(server, kind)
    got = dict(native_batches(src, 3))
    assert sorted(got) == [0, 1, 2]
    for sid, win in got.items():
        np.testing.assert_array_equal(win, take_window(oracle[sid], src.region), err_msg=f"{kind} sample {sid}")


@pytest.mark.usefixtures("_plugin")
def test_a_chunk_rewritten_between_the_open_and_the_read_is_refused(server, tmp_path):
    """The plan takes the chunks' ETags from the open's listing: a chunk replaced after it is refused at
    read time (If-Match), never read as the new version under the old plan."""
    import zarr

    from tests.helpers import native_batches

    data = _write(tmp_path, "v2_blosc")
    src = _source(server, "v2_blosc")
    z = zarr.open_array(str(tmp_path / "bench" / "v2_blosc.zarr"), mode="r+")
    z[0] = data[0] + 1
    with pytest.raises(Exception, match="replaced|changed") as e:
        native_batches(src, 1)
    assert "v2_blosc.zarr/0.0.0.0" in str(e.value)


def test_metadata_the_listing_names_at_another_version_is_read_again_and_checked(server, tmp_path):
    """The open's GET of the metadata and its listing are sent together: where the listing names another
    version than the GET's answer did (a rewrite between the two), the plan reads the metadata again at
    the listed version (one request) and refuses it when it differs from what the array was opened with."""
    from dali_mesh.io._common import DataFileError

    _write(tmp_path, "v3_plain")
    key = "bench/v3_plain.zarr/zarr.json"
    src = _source(server, "v3_plain")
    store = src.files[0].store
    kept = store.opened["bench/v3_plain.zarr"]
    data, size, _ = kept.objects[key]
    kept.objects[key] = (data, size, '"0123456789abcdef0123456789abcdef"')
    server.take_log()
    src.native_plans()  # the same bytes at the listed version: planned, after one more GET
    assert [(r.method, r.key) for r in server.take_log()] == [("GET", key)]

    src = _source(server, "v3_plain")
    kept = src.files[0].store.opened["bench/v3_plain.zarr"]
    other = data.replace(b'"shape": [\n    8,', b'"shape": [\n    7,')
    assert other != data
    kept.objects[key] = (other, len(other), '"0123456789abcdef0123456789abcdef"')
    # the plan's open takes the array the source's open made (kept.array); dropped here, it makes one
    # from the objects as changed above: as if the open's GET had answered those bytes
    kept.array = None
    with pytest.raises(DataFileError, match="changed while the plan was made"):
        src.native_plans()


@pytest.fixture
def _plugin():
    pytest.importorskip("nvidia.dali")
    from dali_mesh.pipeline.plugin import load_plugin

    load_plugin()
