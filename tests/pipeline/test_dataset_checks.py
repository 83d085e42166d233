"""What a dataset source must refuse or decode as xarray does (issue 29, "trust first", items 4, 5
and 12): ``_Unsigned`` integers, normalisation in a float64 output, time coordinates that do not
increase (or not by one step under a forecast or a stride), NetCDF files out of time order or given
twice, a level value that appears twice, ``z@`` on the command line, and statistics that are not
finite. Each case checks xarray's (or numpy's) reading first, so that the test says what the
reader must agree with."""
from __future__ import annotations

import numpy as np
import pytest

xr = pytest.importorskip("xarray")
pd = pytest.importorskip("pandas")
pytest.importorskip("zarr")
pytest.importorskip("nvidia.dali")

from dali_mesh import ForecastSpec, Layout, MeshInfo  # noqa: E402
from dali_mesh import NetCDFDatasetSource, ZarrDatasetSource  # noqa: E402
from dali_mesh.io import DataFileError  # noqa: E402
from dali_mesh.partition import take_window  # noqa: E402

T, H, W = 6, 5, 8
LAYOUT = Layout(MeshInfo((2,), ("mp",), (1,)), shard={"mp": 1})


def _ds(times=None, levels=(500, 850), dtype="f4"):
    rng = np.random.default_rng(3)
    time = pd.date_range("2020-01-01", periods=T, freq="6h") if times is None else pd.DatetimeIndex(times)
    return xr.Dataset(
        {"t2m": (("time", "latitude", "longitude"), (rng.standard_normal((len(time), H, W)) * 50).astype(dtype)),
         "z": (("time", "level", "latitude", "longitude"),
               rng.standard_normal((len(time), len(levels), H, W)).astype(dtype))},
        coords={"time": time, "level": list(levels), "latitude": np.linspace(90, -90, H),
                "longitude": np.linspace(0, 360, W, endpoint=False)})


def _write(ds, path, fmt):
    if fmt == "nc":
        ds.to_netcdf(path, engine="h5netcdf")
    else:
        ds.to_zarr(path, zarr_format=fmt, mode="w", consolidated=False)
    return path


def _source(path, fmt, channels, **kw):
    cls = NetCDFDatasetSource if fmt == "nc" else ZarrDatasetSource
    return cls(path, channels, kw.pop("layout", LAYOUT), **kw)


@pytest.mark.parametrize("fmt", ["nc", 2, 3])
def test_unsigned_integers_are_refused_naming_the_variable(tmp_path, fmt):
    ds = _ds()
    ds["u8"] = (("time", "latitude", "longitude"), np.full((T, H, W), 222, np.uint8).view(np.int8))
    ds["u8"].attrs["_Unsigned"] = "true"
    path = _write(ds, str(tmp_path / f"u.{fmt}"), fmt)
    opened = xr.open_dataset(path, engine="h5netcdf") if fmt == "nc" else xr.open_zarr(path, consolidated=False)
    assert opened["u8"].dtype == np.uint8 and int(opened["u8"][0, 0, 0]) == 222  # xarray's reading
    with pytest.raises(DataFileError, match=r"'u8': its _Unsigned attribute 'true' makes xarray read its int8 "
                                            r"values as uint8"):
        _source(path, fmt, ["u8"])
    assert _source(path, fmt, ["t2m"]).sample_shape == (1, H, W)  # the other variables still read


def _run(src, reader):
    from nvidia.dali import pipeline_def

    from dali_mesh.fn import partitioned_source, read_dataset

    @pipeline_def(batch_size=src.batch_size, num_threads=1, device_id=None, py_num_workers=1,
                  py_start_method="spawn", enable_checkpointing=True)
    def pipe():
        return read_dataset(src, fallback=False) if reader == "native" else partitioned_source(src)

    p = pipe()
    p.build()
    return p


@pytest.mark.timeout(200)
@pytest.mark.parametrize("forecast", [None, ForecastSpec(1, 1)])
def test_float64_output_is_normalised_in_float64(tmp_path, forecast):
    """Item 5: with ``dtype="f8"``, ``(x - mean) / std`` in float64, natively and in Python: the same
    bits as numpy's float64 arithmetic on xarray's values (mean -56.6 is not a float32)."""
    path = _write(_ds(), str(tmp_path / "n.zarr"), 2)
    opened = xr.open_zarr(path, consolidated=False)
    mean, std = np.array([-56.6, 0.1, 1e-3]), np.array([3.3, 0.7, 1.9])
    src = ZarrDatasetSource(path, ["t2m", ("z", [850, 500])], LAYOUT, batch_size=2, shuffle=False, dtype="f8",
                            mean=mean, std=std, forecast=forecast)
    for reader in ("native", "python"):
        p = _run(src, reader)
        outs = p.run()
        ids = outs[-2]
        for j in range(2):
            t = src.time_index(int(np.array(ids[j])))
            steps = [t] if forecast is None else [t - 1, t]
            want = []
            for s in steps:
                x = np.stack([opened["t2m"].isel(time=s).values, opened["z"].sel(level=850).isel(time=s).values,
                              opened["z"].sel(level=500).isel(time=s).values]).astype(np.float64)
                want.append((take_window(x, src.region) - mean[:, None, None]) / std[:, None, None])
            want = want[0] if forecast is None else np.stack(want)
            got = np.array(outs[0][j])
            assert got.dtype == np.float64
            np.testing.assert_array_equal(got, want, err_msg=reader)


@pytest.mark.parametrize("fmt", ["nc", 2])
def test_times_that_do_not_increase_are_refused_naming_the_pair(tmp_path, fmt):
    t = list(pd.date_range("2020-01-01", periods=T, freq="6h"))
    dup = t[:3] + [t[2]] + t[4:]
    path = _write(_ds(dup), str(tmp_path / f"d.{fmt}"), fmt)
    with pytest.raises(DataFileError, match=r"does not increase: step 2 is 2020-01-01T12:00:00.000000000, step 3 "
                                            r"2020-01-01T12:00:00.000000000"):
        _source(path, fmt, ["t2m"])
    back = t[:2] + [t[3], t[2]] + t[4:]
    path = _write(_ds(back), str(tmp_path / f"b.{fmt}"), fmt)
    with pytest.raises(KeyError):  # xarray's sel refuses a time index out of order too
        (xr.open_dataset(path, engine="h5netcdf") if fmt == "nc" else xr.open_zarr(path, consolidated=False)) \
            .sel(time=slice("2020-01-01", "2020-01-02"))
    with pytest.raises(DataFileError, match="does not increase: step 2 is 2020-01-01T18"):
        _source(path, fmt, ["t2m"])


def test_a_forecast_or_stride_over_a_missing_step_is_refused(tmp_path):
    t = list(pd.date_range("2020-01-01", periods=T + 1, freq="6h"))
    gap = t[:3] + t[4:]  # 12:00 then 00:00: a step missing
    path = _write(_ds(gap), str(tmp_path / "g.zarr"), 2)
    assert _source(path, 2, ["t2m"]).num_samples == T  # samples alone: each is its own time
    with pytest.raises(DataFileError, match=r"a forecast needs equally spaced times.*steps 2 and 3 .* 12 hours"):
        _source(path, 2, ["t2m"], forecast=ForecastSpec(1, 1))
    with pytest.raises(DataFileError, match="a stride of 2 needs equally spaced times"):
        _source(path, 2, ["t2m"], time_stride=2)
    # a regular range of it reads
    assert _source(path, 2, ["t2m"], forecast=ForecastSpec(0, 1), time=("2020-01-01T18", None)).num_samples > 0


def test_netcdf_files_are_taken_in_time_order_and_each_once(tmp_path):
    ds = _ds()
    a, b = str(tmp_path / "a.nc"), str(tmp_path / "b.nc")
    ds.isel(time=slice(3, T)).to_netcdf(a, engine="h5netcdf")  # the later file listed first
    ds.isel(time=slice(0, 3)).to_netcdf(b, engine="h5netcdf")
    want = xr.combine_by_coords([xr.open_dataset(f, engine="h5netcdf") for f in (a, b)])  # xarray sorts them by time
    src = NetCDFDatasetSource([a, b], ["t2m"], LAYOUT, forecast=ForecastSpec(1, 1), batch_size=1, shuffle=False)
    np.testing.assert_array_equal(src.times, want.time.values)
    assert src.files == [b, a]
    p = _run(src, "native")
    for _ in range(len(src)):
        inp, tgt, ids, _ = p.run()
        t = src.time_index(int(np.array(ids[0])))
        np.testing.assert_array_equal(np.array(tgt[0])[0, 0], take_window(want["t2m"].isel(time=t + 1).values[None],
                                                                          src.region)[0])
    with pytest.raises(DataFileError, match="is given twice"):
        NetCDFDatasetSource([a, b, a], ["t2m"], LAYOUT)
    c = str(tmp_path / "c.nc")
    ds.isel(time=slice(2, 5)).to_netcdf(c, engine="h5netcdf")  # overlaps both
    with pytest.raises(DataFileError, match=r"does not increase: step 2 is .*, step 3 .* in .*c\.nc"):
        NetCDFDatasetSource([a, b, c], ["t2m"], LAYOUT)


def test_a_repeated_level_value_is_refused_naming_it(tmp_path):
    path = _write(_ds(levels=(500, 500, 850)), str(tmp_path / "l.zarr"), 3)
    assert xr.open_zarr(path, consolidated=False)["z"].sel(level=500).shape[1] == 2  # xarray returns both
    with pytest.raises(DataFileError, match=r"'z': level 500 appears 2 times in 'level' \(indexes \[0, 1\]\)"):
        _source(path, 3, [("z", 500)])
    assert _source(path, 3, [("z", 850)]).channels[0].level_index == 2
    assert _source(path, 3, [("z", 1)], levels_by="index").channels[0].level_index == 1


def test_statistics_that_are_not_finite_are_refused_when_the_source_is_made(tmp_path):
    path = _write(_ds(), str(tmp_path / "s.zarr"), 2)
    for mean, std, what in (([0, np.nan], [1, 1], "mean"), ([0, 0], [np.inf, 1], "std"), ([0, 0], [1, 0], "std")):
        with pytest.raises(ValueError, match=rf"{path}: {what} is .* for channels \[.*\]"):
            _source(path, 2, ["t2m", ("z", 500)], mean=mean, std=std)


def test_cli_channels_refuse_an_empty_level():
    from dali_mesh.cli.options import UsageError, parse_channels

    assert parse_channels("t2m,z@500/850") == ["t2m", ("z", [500, 850])]
    for bad in ("z@", "t2m,z@", "z@500/", "@500"):
        with pytest.raises(UsageError, match="names no"):
            parse_channels(bad)
