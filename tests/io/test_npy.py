"""The .npy reader against numpy: header parser, every boundary rule, byte counters, bad input."""
from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest

from dali_mesh.io import (
    DataFileError,
    HeaderError,
    IOStats,
    MissingFileError,
    NotRegularFileError,
    ShapeMismatchError,
    TruncatedFileError,
    UnsupportedDtypeError,
)
from dali_mesh.formats.npy import read_npy_header, read_npy_window
from dali_mesh.plan.ranges import plan_npy_reads
from dali_mesh.plan import plan_window
from dali_mesh.partition import BOUNDARIES, Layout, Region, take_window
from dali_mesh.mesh import MeshInfo
from tests.helpers import random_region
from tests.helpers import SEED  # noqa: E402

DTYPES = ["?", "i1", "u1", "<i2", ">u2", "<i4", ">i4", "<u4", "<i8", ">u8", "<f2", ">f2", "<f4",
          ">f4", "<f8", ">f8"]
# what DALI cannot carry: refused at header time, naming the file and the dtype
REFUSED_DTYPES = ["<c8", ">c16", "<M8[s]", ">m8[ms]", np.dtype(np.longdouble).str]


def _save(path, arr, version=None):
    with open(path, "wb") as f:
        np.lib.format.write_array(f, arr, version=version, allow_pickle=False)
    return str(path)


def _sample(dtype, shape, rng):
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.integers(0, 2, shape).astype(dt)
    if dt.kind in "mM":
        return rng.integers(-(10**6), 10**6, shape).astype(dt)
    if dt.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt)
    if dt.kind == "f":
        return rng.standard_normal(shape).astype(dt)
    return rng.integers(0, 100, shape).astype(dt)


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype_and_endianness_native_output(tmp_path, dtype):
    rng = np.random.default_rng(1)
    arr = _sample(dtype, (4, 5, 6), rng)
    path = _save(tmp_path / "a.npy", arr)
    for mode in ("constant", "periodic", "reflect"):
        region = random_region(rng, arr.shape, mode, dtype=arr.dtype)
        expected = take_window(arr, region)
        for method in ("preadv", "mmap"):
            out = read_npy_window(path, region, method=method)
            assert out.dtype.isnative and out.dtype == arr.dtype.newbyteorder("=")
            np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("dtype", REFUSED_DTYPES)
def test_dtypes_the_pipeline_cannot_carry_are_refused_at_header_time(tmp_path, dtype):
    arr = np.zeros((4, 4), dtype)
    path = _save(tmp_path / "a.npy", arr)
    for read in (lambda: read_npy_header(path), lambda: read_npy_window(path, REGION_2D)):
        with pytest.raises(UnsupportedDtypeError) as info:
            read()
        assert info.value.path == path and path in str(info.value)
        assert f"dtype {np.dtype(dtype)} is" in str(info.value)


@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)])
@pytest.mark.parametrize("fortran", [False, True])
def test_versions_and_orders(tmp_path, version, fortran):
    arr = np.arange(3 * 4 * 5, dtype="<f4").reshape(3, 4, 5)
    if fortran:
        arr = np.asfortranarray(arr)
    path = _save(tmp_path / "a.npy", arr, version)
    h = read_npy_header(path)
    assert h.version == version and h.fortran_order == fortran and h.shape == (3, 4, 5)
    assert h.data_offset + 3 * 4 * 5 * 4 == os.path.getsize(path)
    region = Region((0, 0, 0), (3, 4, 5), (1, 1, 1), (2, 3, 4), (0, -1, 0), (3, 5, 6), "periodic")
    for method in ("preadv", "mmap"):
        np.testing.assert_array_equal(read_npy_window(path, region, method=method), take_window(arr, region))


def test_version3_utf8_header(tmp_path):
    arr = np.arange(6, dtype=np.int16).reshape(2, 3)
    path = _save(tmp_path / "a.npy", arr, (3, 0))
    assert read_npy_header(path).version == (3, 0)
    region = Region((0, 0), (2, 3), (0, 0), (2, 3), (0, 0), (2, 3), "constant")
    np.testing.assert_array_equal(read_npy_window(path, region), arr)


@pytest.mark.parametrize("mode", BOUNDARIES)
@pytest.mark.parametrize("order", ["C", "F"])
def test_random_windows_match_take_window(tmp_path, mode, order):
    """Windows far outside small domains (halos wider than the domain: many periods), crops, and
    every merge gap, against the numpy oracle."""
    rng = np.random.default_rng(hash((mode, order)) % 2**32)
    arr = np.asarray(rng.standard_normal((5, 7, 9)).astype(">f8"), order=order)
    path = _save(tmp_path / "a.npy", arr)
    for _ in range(25):
        region = random_region(rng, arr.shape, mode, max_halo=12)
        expected = take_window(arr, region)
        for gap in (0, 64, 1 << 30):
            np.testing.assert_array_equal(read_npy_window(path, region, merge_gap=gap, method="preadv"), expected)
        np.testing.assert_array_equal(read_npy_window(path, region, page_merge=False, method="preadv"), expected)
        np.testing.assert_array_equal(read_npy_window(path, region, method="mmap"), expected)
        np.testing.assert_array_equal(read_npy_window(path, region), expected)


@pytest.mark.parametrize("method", [None, "auto"])
def test_default_and_auto_never_mmap(tmp_path, method):
    """An innermost-axis window of small pieces (where the old "auto" mapped the file): the default
    reads with preadv, whose counters are the exact bytes of the merged ranges, not whole pages."""
    arr = np.arange(64 * 4096, dtype=np.uint8).reshape(64, 4096)
    path = _save(tmp_path / "a.npy", arr)
    narrow = Region((0, 0), (64, 4096), (0, 0), (64, 100), (0, 0), (64, 100), "constant")
    kw = {} if method is None else {"method": method}
    stats = IOStats()
    np.testing.assert_array_equal(read_npy_window(path, narrow, merge_gap=0, page_merge=False, stats=stats, **kw),
                                  arr[:, :100])
    assert stats.read_calls == 1 + 64  # the header, then one preadv per row
    assert stats.bytes_read == 512 + 64 * 100
    mm = IOStats()
    read_npy_window(path, narrow, method="mmap", stats=mm)
    assert mm.bytes_read == 512 + 64 * 4096  # mmap counts pages: it ran only because it was asked


def test_mmap_method_counts_pages_touched(tmp_path):
    arr = np.zeros((64, 4096), np.uint8)
    path = _save(tmp_path / "a.npy", arr)
    region = Region((0, 0), (64, 4096), (0, 0), (64, 100), (0, 0), (64, 100), "constant")
    stats = IOStats()
    read_npy_window(path, region, method="mmap", stats=stats)
    assert stats.bytes_read == 512 + 64 * 4096  # header read + one page per row
    with pytest.raises(ValueError, match="method"):
        read_npy_window(path, region, method="mmap", direct=True)
    with pytest.raises(ValueError, match="'auto', 'preadv' or 'mmap'"):
        read_npy_window(path, region, method="aio")


def test_periodic_halo_is_read_from_the_far_side(tmp_path):
    """The periodic halo of the first rank is the data of the last rows: read, not padded."""
    arr = np.arange(8 * 6, dtype=np.int32).reshape(8, 6)
    path = _save(tmp_path / "a.npy", arr)
    layout = Layout(MeshInfo((4,), ("model_parallel",), (0,)), shard={"model_parallel": 0}, halo={0: 2},
                    boundary={0: "periodic"})
    region = layout.region(arr.shape)
    stats = IOStats()
    out = read_npy_window(path, region, stats=stats)
    np.testing.assert_array_equal(out[:2], arr[6:8])
    np.testing.assert_array_equal(out[2:], arr[0:4])
    assert stats.window_bytes == out.nbytes
    plan = plan_window(region)
    # two boxes: the far-side rows 6..8 and the rows 0..4, nothing else, no copies
    assert sorted(b[1] for b in plan.boxes()) == [(0, 0), (6, 0)]
    assert plan.axes[0].copy_dst.size == 0


def test_reflect_halo_copies_cells_already_read(tmp_path):
    arr = np.arange(10 * 3, dtype=np.float32).reshape(10, 3)
    region = Region((0, 0), (10, 3), (0, 0), (4, 3), (-2, 0), (6, 3), ("reflect", "constant"))
    plan = plan_window(region)
    assert [r[2] for r in plan.axes[0].reads] == [6]  # only rows 0..6 are read
    assert plan.axes[0].copy_dst.tolist() == [0, 1]
    path = _save(tmp_path / "a.npy", arr)
    np.testing.assert_array_equal(read_npy_window(path, region), take_window(arr, region))


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_bytes_read_is_the_window(tmp_path, axis):
    """Rank 1 of 4 along each axis: bytes read = the window + the header read; calls as planned."""
    shape = (4, 16, 64)
    arr = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    path = _save(tmp_path / "a.npy", arr)
    layout = Layout(MeshInfo((4,), ("mp",), (1,)), shard={"mp": axis})
    region = layout.region(shape)
    stats = IOStats()
    out = read_npy_window(path, region, merge_gap=0, page_merge=False, method="preadv", stats=stats)
    np.testing.assert_array_equal(out, take_window(arr, region))
    window = out.nbytes
    header_read = min(512, os.path.getsize(path))
    assert stats.window_bytes == window
    assert stats.bytes_read == window + header_read
    rows = {0: 1, 1: 4, 2: 4 * 16}[axis]  # contiguous runs of the window in the file
    assert stats.read_calls == 1 + rows
    # merging every gap reads one range: more bytes, one call
    merged = IOStats()
    read_npy_window(path, region, merge_gap=1 << 30, method="preadv", stats=merged)
    assert merged.read_calls == 2
    span = {0: window, 1: (4 - 1) * 16 * 64 * 4 + 4 * 64 * 4, 2: (4 * 16 - 1) * 64 * 4 + 16 * 4}[axis]
    assert merged.bytes_read == span + header_read


def test_many_iovecs_split_at_iov_max(tmp_path):
    """An innermost-axis window of 3000 rows merged into one range needs > IOV_MAX buffers."""
    arr = np.arange(3000 * 8, dtype=np.int16).reshape(3000, 8)
    path = _save(tmp_path / "a.npy", arr)
    region = Region((0, 0), (3000, 8), (0, 2), (3000, 4), (0, 2), (3000, 4), "constant")
    stats = IOStats()
    out = read_npy_window(path, region, merge_gap=4096, method="preadv", stats=stats)
    np.testing.assert_array_equal(out, arr[:, 2:4])
    assert stats.read_calls == 1 + -(-(2 * 3000 - 1) // os.sysconf("SC_IOV_MAX"))


def test_plan_merges_only_small_gaps(tmp_path):
    arr = np.zeros((4, 100), np.uint8)
    path = _save(tmp_path / "a.npy", arr)
    region = Region((0, 0), (4, 100), (0, 10), (4, 20), (0, 10), (4, 20), "constant")
    h = read_npy_header(path)
    plan = plan_window(region)
    fo, do, ub, groups = plan_npy_reads(h, plan, merge_gap=89, page_merge=False)
    assert ub.tolist() == [10] * 4 and do.tolist() == [0, 10, 20, 30]
    assert (fo - h.data_offset).tolist() == [10, 110, 210, 310]
    assert groups == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert plan_npy_reads(h, plan, merge_gap=90, page_merge=False)[3] == [(0, 4)]
    # the whole file lies in one page: merging costs no storage bytes, so it is merged anyway
    assert plan_npy_reads(h, plan, merge_gap=0)[3] == [(0, 4)]


def test_page_merge_merges_gaps_that_add_no_page(tmp_path):
    """Rows of 8 KiB, window 2 KiB per row at byte 3000 of each row: each range touches 2 pages and
    the gaps (6 KiB) hold no untouched page, so one read; with the window at byte 0 of 16 KiB rows
    every gap holds whole untouched pages: one read per row."""
    arr = np.zeros((16, 8192), np.uint8)
    path = _save(tmp_path / "a.npy", arr)
    h = read_npy_header(path)
    assert h.data_offset == 128  # so byte 3000 of a row + 2 KiB crosses a page boundary
    region = Region((0, 0), (16, 8192), (0, 3000), (16, 5048), (0, 3000), (16, 5048), "constant")
    assert plan_npy_reads(h, plan_window(region), merge_gap=0)[3] == [(0, 16)]
    assert len(plan_npy_reads(h, plan_window(region), merge_gap=0, page_merge=False)[3]) == 16
    arr = np.zeros((16, 16384), np.uint8)
    path = _save(tmp_path / "b.npy", arr)
    region = Region((0, 0), (16, 16384), (0, 0), (16, 2048), (0, 0), (16, 2048), "constant")
    assert len(plan_npy_reads(read_npy_header(path), plan_window(region), merge_gap=0)[3]) == 16


def test_prefix_and_channel_subset(tmp_path):
    arr = np.arange(3 * 5 * 4 * 6, dtype=np.float32).reshape(3, 5, 4, 6)
    path = _save(tmp_path / "a.npy", arr)
    channels = [4, 1, 2]
    region = Region((0, 0, 0), (3, 4, 6), (0, 1, 0), (3, 3, 6), (0, 0, -2), (3, 4, 8),
                    ("constant", "reflect", "periodic"))
    out = read_npy_window(path, region, prefix=(2,), index_maps={0: channels})
    np.testing.assert_array_equal(out, take_window(arr[2][channels], region))


def test_non_contiguous_out_and_fortran(tmp_path):
    arr = np.asfortranarray(np.arange(6 * 7 * 8, dtype=">i4").reshape(6, 7, 8))
    path = _save(tmp_path / "a.npy", arr)
    region = Region((0, 0, 0), (6, 7, 8), (1, 2, 3), (4, 5, 6), (0, 0, 1), (6, 7, 9),
                    ("edge", "symmetric", "periodic"))
    buf = np.full((8, 7, 6), -1, np.int32).transpose(2, 1, 0)  # an F-ordered window
    out = read_npy_window(path, region, out=buf)
    assert out is buf
    np.testing.assert_array_equal(out, take_window(arr, region))
    sliced = np.zeros((12, 7, 8), np.int32)[::2]  # neither C nor F contiguous
    np.testing.assert_array_equal(read_npy_window(path, region, out=sliced), take_window(arr, region))


def test_o_direct(tmp_path):
    arr = np.arange(64 * 1000, dtype=np.float32).reshape(64, 1000)
    path = _save(tmp_path / "a.npy", arr)
    region = Region((0, 0), (64, 1000), (16, 0), (32, 1000), (14, -3), (34, 1003), ("periodic", "periodic"))
    stats = IOStats()
    try:
        out = read_npy_window(path, region, direct=True, stats=stats)
    except OSError as e:
        pytest.skip(f"this file system refuses O_DIRECT: {e}")
    np.testing.assert_array_equal(out, take_window(arr, region))
    # page-aligned reads: at most one extra page on each end of each merged range
    assert stats.bytes_read % 4096 == 0 and stats.bytes_read <= out.nbytes + 3 * 2 * 4096


def test_empty_trim_window_is_defined(tmp_path):
    arr = np.arange(20, dtype=np.float64).reshape(4, 5)
    path = _save(tmp_path / "a.npy", arr)
    layout = Layout(MeshInfo((8,), ("mp",), (7,)), shard={"mp": 0}, halo=1, boundary="trim")
    region = layout.region(arr.shape)  # 4 rows over 8 ranks: rank 7 owns nothing
    stats = IOStats()
    out = read_npy_window(path, region, stats=stats)
    assert out.shape == region.window_shape and out.size == 0
    assert stats.bytes_read == min(512, os.path.getsize(path))  # the header only


# ---- bad input ------------------------------------------------------------------------------------
def _digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest(), os.stat(path).st_mtime_ns


REGION_2D = Region((0, 0), (4, 4), (0, 0), (2, 4), (0, 0), (2, 4), "constant")


def _write_raw(path, header: bytes, data: bytes = b"", version=(1, 0)):
    if version[0] == 1:
        pre = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little")
    else:
        pre = b"\x93NUMPY" + bytes(version) + len(header).to_bytes(4, "little")
    with open(path, "wb") as f:
        f.write(pre + header + data)
    return str(path)


def _patch(path, offset: int, data: bytes) -> str:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)
    return str(path)


def _header(d: str) -> bytes:
    h = d.encode("latin1")
    return h + b" " * ((64 - (10 + len(h) + 1) % 64) % 64) + b"\n"


@pytest.mark.parametrize(
    "name, make, cls, words",
    [
        ("truncated", lambda p: _write_raw(p, _header("{'descr': '<f4', 'fortran_order': False, 'shape': (4, 4), }"), b"\0" * 40),
         TruncatedFileError, "truncated"),
        ("longer", lambda p: _write_raw(p, _header("{'descr': '<f4', 'fortran_order': False, 'shape': (4, 4), }"), b"\0" * 80),
         HeaderError, "longer than its header"),
        ("magic", lambda p: open(p, "wb").write(b"PK\x03\x04 not numpy at all") and str(p), HeaderError, "magic"),
        ("version", lambda p: _write_raw(p, _header("{}"), version=(9, 0)), HeaderError, "version 9.0"),
        ("garbage", lambda p: _write_raw(p, _header("{'descr': '<f4', __import__('os')}")), HeaderError, "not a valid dict"),
        ("keys", lambda p: _write_raw(p, _header("{'descr': '<f4', 'shape': (4, 4)}")), HeaderError, "keys"),
        ("shape", lambda p: _write_raw(p, _header("{'descr': '<f4', 'fortran_order': False, 'shape': (4, -4), }")),
         HeaderError, "non-negative"),
        ("oversized", lambda p: _write_raw(p, b" " * 70000 + b"\n", version=(2, 0)), HeaderError, "larger than"),
        ("header past end", lambda p: open(p, "wb").write(b"\x93NUMPY\x01\x00\xff\x00{'descr'") and str(p),
         HeaderError, "truncated or corrupt"),
        ("object", lambda p: np.save(p, np.array([[1, None], [2, 3]], dtype=object), allow_pickle=True) or str(p),
         UnsupportedDtypeError, "object dtype"),
        ("structured", lambda p: np.save(p, np.zeros((4, 4), dtype=[("a", "<f4"), ("b", "<i4")])) or str(p),
         UnsupportedDtypeError, "structured"),
        ("string", lambda p: np.save(p, np.array([["ab"] * 4] * 4)) or str(p), UnsupportedDtypeError, "not a plain numeric"),
        # issue 9, item 13: each of these raised something other than a DataFileError, or was accepted
        ("unhashable key", lambda p: _write_raw(p, _header("{['descr']: '<f4', 'fortran_order': False, 'shape': (4, 4)}")),
         HeaderError, "not a valid dict"),
        ("non-string key", lambda p: _write_raw(p, _header("{1: 'x', 'descr': '<f4', 'fortran_order': False, 'shape': (4, 4)}")),
         HeaderError, "keys descr, fortran_order, shape; got 1, 'descr'"),
        ("descr comma", lambda p: _write_raw(p, _header("{'descr': ',<f4', 'fortran_order': False, 'shape': (4, 4), }"), b"\0" * 64),
         HeaderError, "',<f4' is not understood"),
        ("descr paren", lambda p: _write_raw(p, _header("{'descr': '(1e9,)f4', 'fortran_order': False, 'shape': (4, 4), }"), b"\0" * 64),
         HeaderError, "'(1e9,)f4' is not understood"),
        ("subarray", lambda p: _write_raw(p, _header("{'descr': '(2,)<f4', 'fortran_order': False, 'shape': (4, 4), }"), b"\0" * 128),
         UnsupportedDtypeError, "subarray"),
        ("70 dims", lambda p: _write_raw(p, _header("{'descr': '<f4', 'fortran_order': False, 'shape': %r, }" % ((1,) * 70,)), b"\0" * 4),
         HeaderError, "70 axes; numpy allows at most 64"),
        ("1000 dims", lambda p: _write_raw(p, _header("{'descr': '<f4', 'fortran_order': False, 'shape': %r, }" % ((1,) * 1000,)), b"\0" * 4),
         HeaderError, "1000 axes"),
        ("version 1.9", lambda p: _write_raw(p, _header("{'descr': '<f4', 'fortran_order': False, 'shape': (4, 4), }"), b"\0" * 64)
         and _patch(p, 7, b"\x09"), HeaderError, "version 1.9"),
        # a tiny file claiming 2**40 elements: refused from the header and the file size alone
        ("2**40 elements", lambda p: _write_raw(p, _header("{'descr': '<f8', 'fortran_order': False, 'shape': (1048576, 1048576), }"), b"\0" * 64),
         TruncatedFileError, "8796093022208 data bytes"),
        ("2**124 elements", lambda p: _write_raw(p, _header("{'descr': '<f8', 'fortran_order': False, 'shape': (%d, %d), }" % (2**62, 2**62))),
         TruncatedFileError, "truncated"),
    ],
)
def test_bad_files_raise_naming_the_file(tmp_path, name, make, cls, words):
    path = str(tmp_path / f"bad {name}.npy")
    make(path)
    before = _digest(path)
    with pytest.raises(cls) as info:
        read_npy_window(path, REGION_2D)
    assert path in str(info.value) and words in str(info.value)
    assert info.value.path == path
    assert _digest(path) == before  # untouched


def test_missing_file_names_it(tmp_path):
    path = str(tmp_path / "nope.npy")
    for read in (read_npy_header, lambda p: read_npy_window(p, REGION_2D)):
        with pytest.raises(FileNotFoundError, match="nope.npy") as info:
            read(path)
        # a DataFileError (one except clause for every reader error) that is still a FileNotFoundError
        assert isinstance(info.value, MissingFileError) and isinstance(info.value, DataFileError)
        assert info.value.path == path


@pytest.mark.parametrize("direct", [False, True])
def test_directory_named_like_a_file(tmp_path, direct):
    """Before: IsADirectoryError, and with direct=True a wrong "no O_DIRECT" message."""
    path = str(tmp_path / "x.npy")
    os.mkdir(path)
    with pytest.raises(NotRegularFileError, match=r"x\.npy: is a directory, not a regular \.npy file"):
        read_npy_window(path, REGION_2D, direct=direct)
    with pytest.raises(NotRegularFileError, match="directory"):
        read_npy_header(path)


def test_expected_shape_and_dtype(tmp_path):
    path = _save(tmp_path / "a.npy", np.zeros((4, 5), np.float32))
    with pytest.raises(ShapeMismatchError, match=r"a\.npy.*\(4, 5\).*\(4, 4\)"):
        read_npy_window(path, REGION_2D, expected_shape=(4, 4))
    with pytest.raises(ShapeMismatchError, match=r"a\.npy.*float64"):
        read_npy_window(path, REGION_2D, expected_shape=(4, 5), expected_dtype=np.float64)


def test_errors_pickle_with_their_path(tmp_path):
    import pickle

    err = TruncatedFileError(str(tmp_path / "x.npy"), "file is truncated")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is TruncatedFileError and back.path == err.path and str(back) == str(err)


def test_windows_of_every_rank_tile_the_domain(tmp_path):
    """All ranks' owned parts, read through the reader and stripped of halo, rebuild the crop."""
    arr = np.arange(9 * 13, dtype=np.int64).reshape(9, 13)
    path = _save(tmp_path / "a.npy", arr)
    mesh = MeshInfo((3, 2), ("a", "b"), (0, 0))
    layout = Layout(mesh, shard={"a": 0, "b": 1}, crop=((1, 9), (0, 11)), halo=2,
                    boundary={0: "reflect", 1: "periodic"}, split="even")
    got = np.full((9, 13), -1)
    for region in layout.regions(arr.shape):
        win = read_npy_window(path, region)
        np.testing.assert_array_equal(win, take_window(arr, region))
        got[tuple(slice(s, e) for s, e in zip(region.start, region.stop))] = win[region.owned_in_window]
    np.testing.assert_array_equal(got[1:9, 0:11], arr[1:9, 0:11])


def test_a_failing_read_is_named(tmp_path, monkeypatch):
    """EIO from the storage (faked here) arrives as a DataFileError naming the file, not a bare OSError."""
    import errno

    path = _save(tmp_path / "disk.npy", np.zeros((4, 4), np.float32))

    def failing_preadv(fd, buffers, offset):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "preadv", failing_preadv)
    with pytest.raises(DataFileError, match=r"disk\.npy: reading failed \(Input/output error\)") as info:
        read_npy_window(path, REGION_2D, method="preadv")
    assert info.value.path == path


# ---- issue 19: a plan's size is known before it is made ---------------------------------------------
def test_count_npy_units_equals_the_units_planned():
    """count_npy_units (the bound checked before planning) is the number of units plan_npy_units
    makes (with runs=True: the runs of plan_npy_reads), for random shapes, windows, orders and
    boundary rules."""
    from dali_mesh.plan.ranges import DEFAULT_MERGE_GAP, StoredArray, count_npy_units, plan_npy_units

    rng = np.random.default_rng(SEED)
    for _ in range(300):
        ndim = int(rng.integers(1, 5))
        shape = tuple(int(n) for n in rng.integers(1, 7, ndim))
        region = random_region(rng, shape, str(rng.choice(["constant", "periodic", "reflect", "edge", "trim"])))
        plan = plan_window(region)
        stored = StoredArray(shape, np.dtype("<f4"), bool(rng.integers(0, 2)), 128)
        for gap in (0, DEFAULT_MERGE_GAP):
            assert count_npy_units(stored, plan, merge_gap=gap) == len(plan_npy_units(stored, plan, merge_gap=gap)[0])
            runs = plan_npy_reads(stored, plan, merge_gap=gap)
            assert count_npy_units(stored, plan, merge_gap=gap, runs=True) == len(runs[0]), (shape, region)



def test_an_axis_plan_applied_to_a_row_is_numpys_pad():
    """plan_axis (which lists only the halo's positions: its in-domain run is computed) applied to
    one axis: its reads, copies and fills give np.pad's window, for random domains, windows (inside
    and across the domain, wider than it) and every rule; and a 2**30-cell axis plans
    without listing its cells."""
    from dali_mesh.plan.window import plan_axis
    from dali_mesh.partition import Region
    from tests.helpers import np_pad_window

    rng = np.random.default_rng(SEED)
    for _ in range(3000):
        n, d0 = int(rng.integers(1, 10)), int(rng.integers(0, 4))
        w0 = int(rng.integers(-12, n))
        w1 = max(w0 + int(rng.integers(1, 26)), 1)  # np_pad_window's windows meet the domain
        mode = str(rng.choice(["constant", "periodic", "reflect", "edge", "symmetric"]))
        row = np.arange(100, 100 + n + d0 + 3)
        ap = plan_axis(w0 + d0, w1 + d0, d0, d0 + n, mode)
        got = np.full(w1 - w0, -1)
        for dst, src, k in ap.reads:
            got[dst:dst + k] = row[src:src + k]
        got[ap.copy_dst] = got[ap.copy_src]
        got[ap.fill] = -7
        r = Region((d0,), (d0 + n,), (d0,), (d0 + n,), (w0 + d0,), (w1 + d0,), (mode,), -7)
        np.testing.assert_array_equal(got, np_pad_window(row[d0:d0 + n], r), err_msg=f"{n} {d0} {w0} {w1} {mode}")
        assert len(set(s for _, src, k in ap.reads for s in range(src, src + k))) == ap.read_cells  # each cell once
    ap = plan_axis(3, (1 << 30) + 5, 4, 1 << 30, "reflect")
    # one cell before the domain and five after it mirror cells inside: copies of read positions
    assert ap.reads == ((1, 4, (1 << 30) - 4),) and ap.fill.size == 0
    assert ap.copy_dst.tolist() == [0] + list(range((1 << 30) - 3, (1 << 30) + 2))
    assert ap.copy_src.tolist() == [2] + [(1 << 30) - 5 - k for k in range(5)]
