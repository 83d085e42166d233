"""The CPU an open of a remote Zarr array saves (issue 42, "open to first batch"): the plan's open takes
the zarr-python array the source's open made from the same objects (no second parse, no request), and
an open whose metadata objects show an array at the store's root skips zarr-python's open of the root
as a group, where zarr-python itself (the oracle) refuses to open it as one. Windows after such an open
equal zarr-python's."""
from __future__ import annotations

import numpy as np
import pytest

from tests.storage.request_log import LoggingS3Server
from tests.storage.s3_server import options

SHAPE = (4, 3, 20, 24)


def _write(root, kind: str) -> np.ndarray:
    """A store of ``kind`` in ``root/bench/KIND.zarr``: an array at its root (v2, v3), or a group holding
    one array ``a`` or two (``a``, ``b``); returns the array ``a``'s (or the root array's) data."""
    import numcodecs
    import zarr

    data = np.arange(np.prod(SHAPE), dtype="f4").reshape(SHAPE)
    path = str(root / "bench" / f"{kind}.zarr")
    fmt = 2 if kind.startswith("v2") else 3
    comp = numcodecs.Blosc("lz4", 5, numcodecs.Blosc.SHUFFLE) if fmt == 2 else zarr.codecs.ZstdCodec(level=1)
    if kind.endswith("_array"):
        z = zarr.create_array(path, shape=SHAPE, chunks=(1,) + SHAPE[1:], dtype="f4", zarr_format=fmt,
                              compressors=comp)
    else:
        grp = zarr.open_group(path, mode="w", zarr_format=fmt)
        z = grp.create_array("a", shape=SHAPE, chunks=(1,) + SHAPE[1:], dtype="f4", compressors=comp)
        if kind.endswith("_two"):
            grp.create_array("b", shape=(2,), dtype="f4")
    z[:] = data
    return data


@pytest.fixture
def server(tmp_path):
    (tmp_path / "bench").mkdir()
    with LoggingS3Server(root=str(tmp_path)) as s:
        yield s


def _location(server, kind: str):
    from dali_mesh.storage import resolve_locations

    return resolve_locations([f"s3://bench/{kind}.zarr"], options(server.endpoint))[0]


KINDS = ["v2_array", "v3_array", "v2_group_one", "v3_group_one", "v3_group_two", "v2_group_two"]


@pytest.mark.parametrize("kind", KINDS)
def test_root_is_array_only_where_zarr_python_opens_no_group(server, tmp_path, kind):
    import zarr

    from dali_mesh.formats.zarr.zarr_reader import _root_is_array
    from dali_mesh.storage.zarr_store import open_array_objects

    _write(tmp_path, kind)
    loc = _location(server, kind)
    store, key = loc.store, loc.key
    store.opened = {}
    opened = open_array_objects(store, key, None)
    try:  # the oracle: zarr-python's own open of the local copy's root as a group
        zarr.open_group(str(tmp_path / "bench" / f"{kind}.zarr"), mode="r")
        a_group = True
    except Exception:  # noqa: BLE001 - zarr raises several kinds for "not a group"
        a_group = False
    assert a_group == ("group" in kind)  # the stores are what they are meant to be
    # skipped exactly where zarr-python would refuse the group (and so never where it would open one)
    assert _root_is_array(opened) == (not a_group), (kind, opened)


@pytest.mark.parametrize("kind", ["v2_array", "v3_array", "v2_group_one", "v3_group_one"])
def test_the_plans_open_takes_the_sources_array_without_a_request(server, tmp_path, kind):
    import zarr

    from dali_mesh.formats.zarr.zarr_reader import open_zarr_array

    _write(tmp_path, kind)
    loc = _location(server, kind)
    first = open_zarr_array(loc)
    server.take_log()
    again = open_zarr_array(loc, reuse=True)
    assert again is first and server.take_log() == []
    oracle = zarr.open_array(str(tmp_path / "bench" / f"{kind}.zarr"), path="" if kind.endswith("_array") else "a",
                             mode="r")
    assert (first.shape, first.dtype, first.chunks, first.path) == (oracle.shape, oracle.dtype, oracle.chunks,
                                                                    oracle.path)
    # taken once: a later plan's open reads the store again (what it holds now)
    third = open_zarr_array(loc, reuse=True)
    assert third is not first and len(server.take_log()) >= 1
    np.testing.assert_array_equal(third[1], oracle[1])


def test_a_group_of_two_arrays_is_still_refused(server, tmp_path):
    from dali_mesh.formats.zarr.zarr_reader import open_zarr_array
    from dali_mesh.io._common import MissingArrayError

    _write(tmp_path, "v3_group_two")
    with pytest.raises(MissingArrayError, match=r"holding 2 arrays \['a', 'b'\]"):
        open_zarr_array(_location(server, "v3_group_two"))


@pytest.mark.usefixtures("_plugin")
@pytest.mark.parametrize("kind", ["v2_array", "v3_group_one"])
def test_windows_after_the_trimmed_open_equal_zarr_python(server, tmp_path, kind):
    from dali_mesh import Layout, MeshInfo, ZarrSource
    from dali_mesh.partition import take_window
    from tests.helpers import native_batches

    data = _write(tmp_path, kind)
    layout = Layout(MeshInfo((1, 2), ("dp", "mp"), (0, 1)), shard={"mp": 1}, halo={1: 1}, boundary="reflect")
    src = ZarrSource([f"s3://bench/{kind}.zarr"], None, layout, shuffle=False,
                     storage_options=options(server.endpoint))
    got = dict(native_batches(src, SHAPE[0]))
    assert sorted(got) == list(range(SHAPE[0]))
    for sid, win in got.items():
        np.testing.assert_array_equal(win, take_window(data[sid], src.region), err_msg=f"{kind} sample {sid}")


@pytest.fixture
def _plugin():
    pytest.importorskip("nvidia.dali")
    from dali_mesh.pipeline.plugin import load_plugin

    load_plugin()
