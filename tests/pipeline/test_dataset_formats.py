"""Datasets as a format of variables (issue 41): each kind of dataset (a Zarr group, NetCDF4 files)
says what variables it holds, their dims, shapes and coordinates, as xarray opens the same store
(``xr.open_zarr``; ``xr.open_dataset(engine="h5netcdf")``), and makes the array source of each; one
``VariablesSource`` reads any registered kind; and a dataset read in a pipeline is registered there
once, by the entry point, with no reader's part left behind."""
from __future__ import annotations

import numpy as np
import pytest

xr = pytest.importorskip("xarray")
pd = pytest.importorskip("pandas")
pytest.importorskip("zarr")

from dali_mesh import Layout, MeshInfo, NetCDFDatasetSource, ZarrDatasetSource  # noqa: E402
from dali_mesh.datasets import (DATASET_FORMATS, NetCDFFiles, VariablesSource, ZarrGroup,  # noqa: E402
                                dataset_format_named, register_dataset_format)
from dali_mesh.partition import take_window  # noqa: E402

T, L, H, W = 8, 3, 5, 8
LAYOUT = Layout(MeshInfo((2,), ("mp",), (1,)), shard={"mp": 1}, halo={1: 1})


def _ds():
    rng = np.random.default_rng(2)
    return xr.Dataset(
        {"t2m": (("time", "latitude", "longitude"), rng.standard_normal((T, H, W)).astype("f4")),
         "z": (("time", "level", "latitude", "longitude"), rng.standard_normal((T, L, H, W)).astype("f8")),
         "lsm": (("latitude", "longitude"), rng.random((H, W)).astype("f4"))},  # no time dim: a constant field
        coords={"time": pd.date_range("2021-03-01", periods=T, freq="6h"), "level": [500, 700, 850],
                "latitude": np.linspace(90, -90, H), "longitude": np.linspace(0, 360, W, endpoint=False)})


def _agrees_with_xarray(dataset, opened, times):
    """Every variable and coordinate xarray opens, with its dims and shape; the data variables' dtypes;
    the 1-D coordinates' values, and the time axis decoded as xarray decodes it."""
    assert set(dataset.variables) == set(opened.variables)
    for name, var in dataset.variables.items():
        assert var.name == name and var.dims == opened[name].dims and var.shape == opened[name].shape, name
        if name in opened.data_vars:
            assert var.dtype == opened[name].dtype, name
    for name in ("level", "latitude", "longitude"):
        np.testing.assert_array_equal(dataset.coordinate(name), opened[name].values)
    np.testing.assert_array_equal(times, opened.time.values)


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_a_zarr_group_has_the_variables_xarray_opens(tmp_path, zarr_format):
    path = str(tmp_path / f"g{zarr_format}.zarr")
    _ds().to_zarr(path, zarr_format=zarr_format, mode="w", consolidated=False)
    opened = xr.open_zarr(path, consolidated=False)
    group = ZarrGroup(path)
    ordered, times = group.in_time_order()
    assert ordered is group and group.files == [path] and group.store == path
    _agrees_with_xarray(group, opened, times)
    assert all(v.locations == (path,) for v in group.variables.values())
    # the array source of one variable reads what xarray reads of it
    z = group.array_source("z", LAYOUT, channels=[2, 0], channel_axis=0, shuffle=False)
    for t in (0, T - 1):
        want = opened["z"].isel(time=t, level=[2, 0]).values
        np.testing.assert_array_equal(z.read_sample(t)[0], take_window(want, z.region))


def test_netcdf_files_have_the_variables_xarray_opens_in_time_order(tmp_path):
    ds = _ds()
    early, late = str(tmp_path / "early.nc"), str(tmp_path / "late.nc")
    ds.isel(time=slice(0, 3)).to_netcdf(early, engine="h5netcdf")
    ds.isel(time=slice(3, T)).to_netcdf(late, engine="h5netcdf")
    per_file = [xr.open_dataset(f, engine="h5netcdf") for f in (early, late)]
    opened = xr.combine_by_coords(per_file, data_vars="minimal", compat="no_conflicts")  # one time axis, constant fields kept
    files = NetCDFFiles([late, early])  # listed out of order
    assert files.files == [late, early]
    ordered, times = files.in_time_order()
    assert ordered.files == [early, late] and files.files == [late, early]  # a new value; the given one is kept
    assert ordered.where_step(2) == f" in {early}" and ordered.where_step(3) == f" in {late}"
    _agrees_with_xarray(ordered, opened, times)
    assert all(v.locations == (early, late) for v in ordered.variables.values())
    for name, var in NetCDFFiles(early).variables.items():  # one file: xarray's open_dataset of it
        assert (var.dims, var.shape) == (per_file[0][name].dims, per_file[0][name].shape), name
    t2m = ordered.array_source("t2m", LAYOUT.without_axis(0, 3), shuffle=False)
    for t in range(T):  # across the file boundary
        np.testing.assert_array_equal(t2m.read_sample(t)[0], take_window(opened["t2m"].isel(time=t).values,
                                                                          t2m.region))


def test_kinds_are_registered_by_name_and_one_source_reads_any(tmp_path):
    path = str(tmp_path / "g.zarr")
    ds = _ds()
    ds.to_zarr(path, zarr_format=2, mode="w", consolidated=False)
    assert DATASET_FORMATS["zarr_group"] is ZarrGroup and DATASET_FORMATS["netcdf_files"] is NetCDFFiles
    assert dataset_format_named("netcdf_files") is NetCDFFiles and dataset_format_named(ZarrGroup) is ZarrGroup
    with pytest.raises(ValueError, match=r"dataset format 'grib' is not one of \['netcdf_files', 'zarr_group'"):
        dataset_format_named("grib")
    with pytest.raises(TypeError, match="a dataset format is a DatasetFormat subclass with a name"):
        register_dataset_format(dict)
    kw = dict(batch_size=2, seed=4)
    zarr_src = ZarrDatasetSource(path, ["t2m", ("z", 700)], LAYOUT, **kw)
    plain = VariablesSource(path, ["t2m", ("z", 700)], LAYOUT, format="zarr_group", **kw)
    want = zarr_src.fingerprint()
    assert plain.fingerprint() == {**want, "class": "VariablesSource"} and want["class"] == "ZarrDatasetSource"
    np.testing.assert_array_equal(plain.read_sample(3)[0], zarr_src.read_sample(3)[0])
    with pytest.raises(ValueError, match="ZarrDatasetSource reads zarr_group datasets, not 'netcdf_files'"):
        ZarrDatasetSource(path, ["t2m"], LAYOUT, format="netcdf_files")

    # a kind from elsewhere: registered, it is read by the same source (here a group of another name)
    @register_dataset_format
    class Renamed(ZarrGroup):
        name = "test_renamed_group"

    try:
        other = VariablesSource(path, ["t2m", ("z", 700)], LAYOUT, format="test_renamed_group", **kw)
        assert isinstance(other.dataset, Renamed) and other.fingerprint() == plain.fingerprint()
        want = np.stack([ds["t2m"].isel(time=5).values, ds["z"].sel(level=700).isel(time=5).values]).astype("f8")
        np.testing.assert_array_equal(other.read_sample(5)[0], take_window(want, other.region))
    finally:
        del DATASET_FORMATS[Renamed.name]


def test_reading_datasets_in_a_pipeline_registers_each_once(tmp_path):
    """Two datasets (one read by one operator, one with a variable that falls back to
    partitioned_source) and a source read twice in one pipeline definition: the pipeline holds the
    sources the user read, in order, each time it was read, and no variable's reader."""
    pytest.importorskip("nvidia.dali")
    from numcodecs import Delta
    from nvidia.dali import pipeline_def

    from dali_mesh.fn import partitioned_source, read_dataset, read_windows
    from dali_mesh.pipeline.dataset_reader import dataset_readers
    from dali_mesh.pipeline.registry import info_of, sources_of

    ds = _ds()
    native, filtered, nc = str(tmp_path / "n.zarr"), str(tmp_path / "f.zarr"), str(tmp_path / "d.nc")
    ds.to_zarr(native, zarr_format=2, mode="w", consolidated=False)
    ds.to_zarr(filtered, zarr_format=2, mode="w", consolidated=False, encoding={"t2m": {"filters": [Delta("f4")]}})
    ds.to_netcdf(nc, engine="h5netcdf")
    first = ZarrDatasetSource(native, ["t2m", ("z", 500)], LAYOUT, batch_size=2, dtype="f4")
    mixed = ZarrDatasetSource(filtered, ["t2m", ("z", 500)], LAYOUT, batch_size=2)
    netcdf = NetCDFDatasetSource(nc, [("z", [850, 500])], LAYOUT, batch_size=2)
    assert dataset_readers(mixed)[0].startswith("partitioned_source") and dataset_readers(mixed)[1] == "native"
    not_native = mixed.parts[0][0]  # the filtered variable alone: read_windows falls back for it

    @pipeline_def(batch_size=2, num_threads=1, device_id=None, py_num_workers=1, py_start_method="spawn")
    def pipe():
        a = read_dataset(first)
        b = read_dataset(mixed)
        c = read_dataset(netcdf)
        d = read_dataset(first)  # the same dataset twice
        e = read_windows(not_native)
        f = partitioned_source(netcdf.parts[0][0], prefetch_queue_depth=3)
        return a[0], b[0], c[0], d[0], e[0], f[0]

    p = pipe()
    got = sources_of(p)
    assert [id(s) for s in got] == [id(s) for s in (first, mixed, netcdf, first, not_native, netcdf.parts[0][0])]
    assert info_of(p).source_prefetch == 3

    @pipeline_def(batch_size=2, num_threads=1, device_id=None, py_num_workers=1, py_start_method="spawn")
    def fallback_only():
        return read_dataset(mixed)[0]

    q = fallback_only()
    assert sources_of(q) == [mixed] and info_of(q).source_prefetch == 2  # the fallback variable's queue
