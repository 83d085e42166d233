"""The planner's fast path for windows whose boxes differ along one axis only (an index-set window's
rows, a long channel list): every box planned at once by ``_one_axis_units``. Differential fuzz over
C and Fortran order, a leading sample index, 1-4 axes, the rows' axis anywhere (a run of whole rows or
runs within rows), crops on the other axes and any id order: the bytes its units copy equal numpy's
fancy indexing, and its merged reads are the box-by-box planner's byte for byte."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import dali_mesh.plan.ranges as ranges
from dali_mesh import Layout
from dali_mesh.plan import plan_window
from dali_mesh.plan.ranges import StoredArray, plan_npy_units
from tests.helpers import mesh_of


@st.composite
def windows(draw):
    nd = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=nd, max_size=nd)))
    a = draw(st.integers(0, nd - 1))
    n = draw(st.integers(20, 120))
    shape = shape[:a] + (n,) + shape[a + 1:]
    ids = draw(st.lists(st.integers(0, n - 1), min_size=18, max_size=n, unique=True))
    if draw(st.booleans()):
        ids = sorted(ids)
    crop = [None if i == a or not draw(st.booleans()) else
            (lambda lo: (lo, draw(st.integers(lo + 1, shape[i]))))(draw(st.integers(0, shape[i] - 1)))
            for i in range(nd)]
    lead = draw(st.sampled_from([(), (3,)]))
    return shape, a, np.array(ids, np.int64), crop, lead, draw(st.booleans()), draw(st.sampled_from(["<f4", ">i2", "u1"]))


def _copy(units, data: bytes, size: int) -> bytes:
    fo, do, ub = units.expanded()
    out = bytearray(size)
    for f, d, u in zip(fo.tolist(), do.tolist(), ub.tolist()):
        out[d:d + u] = data[f:f + u]
    return bytes(out)


def _reads(units) -> list[tuple[int, int]]:
    """The merged reads: (first byte, end) of each group."""
    spans = units.file_off + units.spans
    return [(int(units.file_off[g0]), int(spans[g0:g1].max())) for g0, g1 in units.groups]


@settings(max_examples=300, deadline=None)
@given(w=windows())
def test_one_axis_units_copy_what_numpy_indexes_and_read_what_boxes_read(w):
    shape, a, ids, crop, lead, fortran, dtype = w
    mapped = shape[:a] + (ids.size,) + shape[a + 1:]
    region = Layout(mesh_of((1,), (0,)), batch=(), crop=crop).region(mapped)
    wplan = plan_window(region, {a: ids})
    full = lead + shape
    x = np.arange(int(np.prod(full)), dtype=np.int64).astype(dtype).reshape(full)
    data = (np.asfortranarray(x) if fortran else x).tobytes(order="F" if fortran else "C")
    offset = 128 if lead else 0  # where element 0 lies: after a header
    data = b"\xab" * offset + data
    header = StoredArray(full, np.dtype(dtype), fortran, offset)
    prefix = (2,) if lead else ()
    fast = plan_npy_units(header, wplan, prefix)
    staging_shape = wplan.window_shape[::-1] if fortran else wplan.window_shape
    got = np.frombuffer(_copy(fast, data, int(np.prod(staging_shape)) * x.itemsize), dtype).reshape(staging_shape)
    if fortran:
        got = got.transpose()
    idx = [np.arange(region.window_start[i], region.window_stop[i]) for i in range(len(shape))]
    idx[a] = ids[idx[a]]
    want = (x[prefix] if prefix else x)[np.ix_(*idx)]
    np.testing.assert_array_equal(got, want)
    # the box-by-box planner: the same runs, the same merged reads
    old, ranges._MANY_RUNS = ranges._MANY_RUNS, 10**9
    try:
        slow = plan_npy_units(header, wplan, prefix)
        assert ranges.count_npy_units(header, wplan, prefix, runs=True) == sum(1 for _ in zip(*slow.expanded()))
    finally:
        ranges._MANY_RUNS = old
    assert sorted(zip(*(c.tolist() for c in slow.expanded()))) == sorted(zip(*(c.tolist() for c in fast.expanded())))
    assert _reads(slow) == _reads(fast)
    assert ranges.count_npy_units(header, wplan, prefix) == fast.file_off.size


def test_half_a_million_rows_plan_in_a_second():
    """The reason for the fast path: (2,000,000, 8) float32 rows, a random half of them in random order
    (a graph partition before renumbering): 500,000 runs."""
    ids = np.random.default_rng(0).permutation(2_000_000)[:500_000]
    region = Layout(mesh_of((1,), (0,)), batch=()).region((ids.size, 8))
    wplan = plan_window(region, {0: ids})
    units = plan_npy_units(StoredArray((2_000_000, 8), np.dtype("<f4")), wplan)
    assert units.file_off.size == 500_000 and (units.unit_bytes == 32).all()
    assert np.array_equal(np.sort(units.file_off), np.sort(ids) * 32)


def test_the_fast_path_is_taken_where_it_plans_fewer_units():
    """Runs of whole rows (the rows' axis the run axis), and runs of single rows within rows, are planned
    at once; long runs within rows (a crop after the rows' axis) go to the box planner, whose repeats make
    one unit per run instead of one per row."""
    header = StoredArray((1000, 6), np.dtype("<f4"))
    lay = Layout(mesh_of((1,), (0,)), batch=())
    scattered = np.arange(0, 1000, 3)  # 334 runs of one row
    long_runs = np.concatenate([np.arange(a, a + 20) for a in range(0, 1000, 40)])  # 25 runs of 20 rows
    whole = plan_window(lay.region((scattered.size, 6)), {0: scattered})
    cropped = plan_window(Layout(mesh_of((1,), (0,)), batch=(), crop=[None, (1, 4)]).region((scattered.size, 6)),
                          {0: scattered})
    cropped_long = plan_window(Layout(mesh_of((1,), (0,)), batch=(), crop=[None, (1, 4)]).region((long_runs.size, 6)),
                               {0: long_runs})
    assert ranges._one_axis(header, whole) is not None and ranges._one_axis(header, cropped) is not None
    assert ranges._one_axis(header, cropped_long) is None
    assert plan_npy_units(header, cropped_long).file_off.size == 25  # a unit per run, its rows repeated
