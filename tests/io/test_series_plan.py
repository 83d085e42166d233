"""A time series' plan is data from its format: ``ArrayFormat.plan_steps`` returns a ``StepReads`` (the
parts of each step, its finishing plan and window plan) into the series' ``PlanSet``, with a number of parts
it may make; ``plan_time_series`` takes the ``ForecastSpec`` whole. The oracle of the reads is numpy
(the windows the native reader makes from the plans, against ``take_window`` of what was written)."""
from __future__ import annotations

import h5py
import numpy as np
import pytest
import zarr

from dali_mesh import ForecastSpec, HDF5Source, Layout, MeshInfo, ZarrSource
from dali_mesh import _kernels
from dali_mesh.formats import HDF5, ZARR
from dali_mesh.partition import take_window
from dali_mesh.plan import NotNativeError, PlanSet
from dali_mesh.plan import chunks as plan_chunks
from dali_mesh.plan.chunks import StepReads

DATA = np.random.default_rng(3).standard_normal((8, 6, 10)).astype(np.float32)


def _layout():
    # rank 1 of 2 along axis 1 (columns 5..9) with one column of halo: two chunks of 4 columns per step
    return Layout(MeshInfo((2,), ("mp",), (1,)), shard={"mp": 1}, halo={1: 1}, boundary="periodic")


@pytest.fixture(params=["hdf5", "zarr"])
def series(request, tmp_path):
    if request.param == "hdf5":
        path = str(tmp_path / "x.h5")
        with h5py.File(path, "w") as f:
            f.create_dataset("v", data=DATA, chunks=(2, 6, 4))
        return HDF5, path, HDF5Source([path], "v", _layout(), batch_size=1, shuffle=False)
    path = str(tmp_path / "x.zarr")
    arr = zarr.create_array(path, shape=DATA.shape, chunks=(2, 6, 4), dtype=DATA.dtype, compressors=None)
    arr[...] = DATA
    return ZARR, path, ZarrSource([path], None, _layout(), batch_size=1, shuffle=False)


def test_a_format_plans_steps_as_data_into_the_plan_set_it_is_given(series):
    fmt, path, src = series
    plans = PlanSet(np.dtype(np.float32), 2)
    got = fmt.plan_steps(path, src.name, (2, 6), src.region, plans=plans, max_parts=1000, merge_gap=0)
    assert isinstance(got, StepReads)
    assert got.parts.shape[:1] == (4,) and got.parts.shape[2] == 3  # 4 steps, (file, plan, base) per part
    assert set(got.parts[..., 0].ravel()) <= set(range(len(plans.files)))
    assert set(got.parts[..., 1].ravel()) | {got.finish} <= set(range(len(plans.plans)))
    assert got.wplan.window_shape == src.region.window_shape


def _fits(fmt, path, src, steps, max_parts) -> bool:
    try:
        fmt.plan_steps(path, src.name, steps, src.region, plans=PlanSet(np.dtype(np.float32), 2), max_parts=max_parts,
                       merge_gap=0)
        return True
    except NotNativeError as e:
        assert "MAX_NATIVE_PARTS" in str(e)
        return False


def _least(fits) -> int:
    """The least n >= 0 with fits(n), fits being monotone (False below it, True from it on)."""
    lo, hi = 0, 1 << 22
    assert fits(hi)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid + 1, hi)
    return lo


def test_the_parts_a_format_may_make_are_a_number_it_is_given(series):
    """The planner refuses before it makes more parts than it was given, and counts at least those it
    makes."""
    fmt, path, src = series
    assert not _fits(fmt, path, src, (0, 8), 0)
    least = _least(lambda n: _fits(fmt, path, src, (0, 8), n))
    made = fmt.plan_steps(path, src.name, (0, 8), src.region, plans=PlanSet(np.dtype(np.float32), 2), max_parts=least,
                          merge_gap=0).parts
    assert made.shape[0] * made.shape[1] <= least
    assert _least(lambda n: _fits(fmt, path, src, (0, 4), n)) < least  # fewer steps, fewer parts


def test_a_file_of_another_dtype_than_the_series_is_not_planned(series):
    fmt, path, src = series
    with pytest.raises(NotNativeError, match="dtype float32 is not the series' float64"):
        fmt.plan_steps(path, src.name, (0, 2), src.region, plans=PlanSet(np.dtype(np.float64), 2), max_parts=100,
                       merge_gap=0)


def test_the_series_budget_counts_every_output_of_a_forecast(series, monkeypatch):
    """A forecast of history 1 and lead 1 reads each part three times: the limit is on all of them."""
    fmt, path, src = series
    fc = type(src)([path], src.name, _layout(), batch_size=1, shuffle=False, forecast=ForecastSpec(history=1, lead=1))
    def series_fits(limit):
        monkeypatch.setattr(plan_chunks, "MAX_NATIVE_PARTS", limit)
        try:
            fc.native_plans()
            return True
        except NotNativeError as e:
            assert "MAX_NATIVE_PARTS" in str(e)
            return False

    # the steps the forecast reads (0..7), each part read by three outputs' steps: 3x the planner's own count
    least = _least(lambda n: _fits(fmt, path, src, (0, 8), n))
    assert _least(series_fits) == 3 * least
    monkeypatch.setattr(plan_chunks, "MAX_NATIVE_PARTS", 3 * least)
    plans = fc.native_plans()
    # the plans read what numpy says: input steps t-1, t and target t+1 of each sample
    path_plan = PlanSet.joined(plans).write()
    reader = _kernels.PlanReader(path_plan, np.float32, outputs=2)
    try:
        for i in range(fc.num_samples):
            (inp,), (tgt,) = reader.read([i])
            t = fc.step_of(i)
            want_in = np.stack([take_window(DATA[t + d], fc.region) for d in (-1, 0)])
            np.testing.assert_array_equal(inp, want_in)
            np.testing.assert_array_equal(tgt[0], take_window(DATA[t + 1], fc.region))
    finally:
        reader.close()
