"""ZarrDatasetSource / read_dataset on stores written by xarray itself (issue 16): WeatherBench2-like
(Zarr v2) and ARCO-like (Zarr v3) groups of variables with and without a level dim, each its own
chunking, codec and dtype. Every window of every rank equals xarray's ``ds[var].sel(level=...)
.isel(time=...)`` stacked and cut by numpy's pad (take_window), natively and in Python."""
from __future__ import annotations

import itertools
import os

import numpy as np
import pytest

xr = pytest.importorskip("xarray")
pd = pytest.importorskip("pandas")
pytest.importorskip("zarr")
pytest.importorskip("nvidia.dali")

from dali_mesh import ForecastSpec, Layout, MeshInfo  # noqa: E402
from dali_mesh import NamedLayout, ZarrDatasetSource  # noqa: E402
from dali_mesh.io import DataFileError  # noqa: E402
from dali_mesh.partition import LayoutError, take_window  # noqa: E402

T, L, H, W = 16, 3, 11, 16
LEVELS = [500, 700, 850]


def _dataset(seed=0, float32=False):
    """Variables of dtypes f4, f4, f8 and i2 (``float32``: all f4, as WeatherBench2 and ARCO-ERA5 store
    them, which read_dataset reads with one operator)."""
    rng = np.random.default_rng(seed)
    time = pd.date_range("2016-01-01", periods=T, freq="6h")
    return xr.Dataset(
        {"2m_temperature": (("time", "latitude", "longitude"), rng.standard_normal((T, H, W)).astype("f4")),
         "geopotential": (("time", "level", "latitude", "longitude"), rng.standard_normal((T, L, H, W)).astype("f4")),
         "temperature": (("time", "level", "latitude", "longitude"),
                         rng.standard_normal((T, L, H, W)).astype("f4" if float32 else "f8")),
         "10m_u_component_of_wind": (("time", "latitude", "longitude"),
                                     (rng.standard_normal((T, H, W)) * 100).astype("f4" if float32 else "i2"))},
        coords={"time": time, "level": LEVELS, "latitude": np.linspace(90, -90, H),
                "longitude": np.linspace(0, 360, W, endpoint=False)})


@pytest.fixture(scope="module", params=[2, 3, "2f4"], ids=["wb2_v2", "arco_v3", "wb2_float32"])
def store(request, tmp_path_factory):
    """Per variable its own chunking and codec; "2f4": Zarr v2 with every variable float32 (one reader)."""
    import zarr

    path = str(tmp_path_factory.mktemp("ds") / f"era5_v{request.param}.zarr")
    fmt = 3 if request.param == 3 else 2
    ds = _dataset(fmt, float32=request.param == "2f4")
    if fmt == 2:
        from numcodecs import Blosc, Zstd

        enc = {"2m_temperature": {"chunks": (1, H, W), "compressors": [Blosc("lz4", 5, Blosc.SHUFFLE)]},
               "geopotential": {"chunks": (1, 1, 6, W), "compressors": [Zstd(3)]},
               "temperature": {"chunks": (2, 3, 4, 8), "compressors": None},
               "10m_u_component_of_wind": {"chunks": (4, 5, 5)}}
    else:
        from zarr.codecs import BloscCodec, ZstdCodec

        enc = {"2m_temperature": {"chunks": (1, H, W), "compressors": [BloscCodec(cname="zstd", clevel=3)]},
               "geopotential": {"chunks": (1, L, H, W), "compressors": [ZstdCodec(level=1)]},
               "temperature": {"chunks": (3, 1, 4, 16), "compressors": None},
               "10m_u_component_of_wind": {"chunks": (2, 11, 8)}}
    ds.to_zarr(path, zarr_format=fmt, encoding=enc, mode="w", consolidated=False)
    del zarr
    return path, xr.open_zarr(path, consolidated=False)


def _mixed_only(path):
    """Tests of what does not depend on the reader's path (refusals, coordinates, the wrapping) run on
    the two mixed-dtype stores only: the all-float32 store adds nothing there but minutes of CI."""
    if path.endswith("f4.zarr"):
        pytest.skip("the same on the all-float32 store")


CHANNELS = ["2m_temperature", ("geopotential", [850, 500]), ("temperature", 700), "10m_u_component_of_wind",
            ("geopotential", 700)]


_ORACLE: dict = {}  # (id(ds), t, dtype) -> (ds, fields): xarray reads each step once per store, not once per rank


def _oracle(ds, t, dtype):
    """xarray's fields of step t, stacked in CHANNELS order (read-only: shared by every caller)."""
    key = (id(ds), t, np.dtype(dtype).str)
    hit = _ORACLE.get(key)
    if hit is not None and hit[0] is ds:  # the entry holds ds, so its id names no other dataset
        return hit[1]
    fields = _oracle_fields(ds, t, dtype)
    fields.flags.writeable = False
    _ORACLE[key] = (ds, fields)
    return fields


def _oracle_fields(ds, t, dtype):
    f = [ds["2m_temperature"].isel(time=t).values]
    f += [ds["geopotential"].sel(level=lv).isel(time=t).values for lv in (850, 500)]
    f += [ds["temperature"].sel(level=700).isel(time=t).values, ds["10m_u_component_of_wind"].isel(time=t).values,
          ds["geopotential"].sel(level=700).isel(time=t).values]
    return np.stack(f).astype(dtype)


def _pipeline(src, reader="native"):
    from nvidia.dali import pipeline_def

    from dali_mesh.fn import partitioned_source, read_dataset

    if reader == "native":
        @pipeline_def(batch_size=src.batch_size, num_threads=2, device_id=None, enable_checkpointing=True)
        def pipe():
            return read_dataset(src, fallback=False)
    else:
        @pipeline_def(batch_size=src.batch_size, num_threads=1, device_id=None, py_num_workers=1,
                      py_start_method="spawn", enable_checkpointing=True)
        def pipe():
            return partitioned_source(src)
    p = pipe()
    p.build()
    return p


def test_metadata_dims_levels_dtypes(store):
    path, ds = store
    layout = NamedLayout(MeshInfo((3,), ("mp",), (1,)), shard={"mp": "latitude"})
    src = ZarrDatasetSource(path, CHANNELS, layout)
    assert src.dims == ("channel", "latitude", "longitude") and src.sample_shape == (6, H, W)
    assert [str(c) for c in src.channels] == ["2m_temperature", "geopotential@850", "geopotential@500",
                                               "temperature@700", "10m_u_component_of_wind", "geopotential@700"]
    float32 = path.endswith("f4.zarr")
    assert src.dtype == (np.float32 if float32 else np.float64)  # f4, f8 and i2 variables: numpy's result type
    assert src.layout == Layout(MeshInfo((3,), ("mp",), (1,)), shard={"mp": 1})
    np.testing.assert_array_equal(src.times, ds.time.values)
    # five parts: a run of channels of one variable is one part
    assert [(sub.name, has_level) for sub, has_level in src.parts] == [
        ("2m_temperature", False), ("geopotential", True), ("temperature", True), ("10m_u_component_of_wind", False),
        ("geopotential", True)]
    from dali_mesh.pipeline.dataset_reader import dataset_reader, dataset_readers

    assert dataset_readers(src) == ["native"] * 5
    assert dataset_reader(src) == ("one native reader" if float32 else
                                   "one reader per variable (the variables have different dtypes (float32, "
                                   "float32, float64, int16, float32))")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mesh_shape,forecast,step", [((1, 3), None, None), ((2, 2), (1, 2, 1), "12h"),
                                                      ((2, 3), (2, 0, 1), None)])
def test_every_window_of_every_rank_equals_xarray(store, mesh_shape, forecast, step):
    path, ds = store
    fc = None if forecast is None else ForecastSpec(*forecast)
    k = 1 if step is None else 2  # stored steps per sample step
    names = ("dp", "mp")
    checked = 0
    for coord in itertools.product(*(range(s) for s in mesh_shape)):
        mesh = MeshInfo(mesh_shape, names, coord)
        layout = NamedLayout(mesh, shard={"mp": "latitude"}, batch="dp", halo={"latitude": 2, "longitude": 1},
                             boundary={"latitude": "reflect", "longitude": "periodic"}, split="physicsnemo")
        src = ZarrDatasetSource(path, CHANNELS, layout, batch_size=2, seed=3, forecast=fc, step=step,
                                time=("2016-01-01T06", "2016-01-04T12"), dtype=np.float32)
        p = _pipeline(src)
        for epoch in range(2):
            seen = []
            for _ in range(len(src) // 2):
                outs = p.run()
                ids = outs[-2]
                for j in range(2):
                    sid = int(np.array(ids[j]))
                    t = src.time_index(sid)
                    seen.append(sid)
                    if fc is None:
                        want = [take_window(_oracle(ds, t, np.float32), src.region)]
                    else:
                        ins = [take_window(_oracle(ds, t + d * k, np.float32), src.region)
                               for d in range(-fc.history, 1)]
                        want = [np.stack(ins)]
                        if fc.lead:
                            want.append(np.stack([take_window(_oracle(ds, t + d * k, np.float32), src.region)
                                                  for d in range(1, fc.lead + 1)]))
                    for w, expect in enumerate(want):
                        got = np.array(outs[w][j])
                        np.testing.assert_array_equal(got, expect, err_msg=f"rank {coord} step {t} window {w}")
                        np.testing.assert_array_equal(src.read_sample(sid)[w], expect)  # the Python reader
                    assert src.time_of(sid) == ds.time.values[t]
                    checked += 1
            assert seen == src.order(epoch)[0].tolist()  # the source's stateless order, epoch by epoch
            p.reset()
    assert checked > 0


@pytest.mark.timeout(200)
def test_partitioned_source_and_normalisation(store, tmp_path):
    path, ds = store
    layout = Layout(MeshInfo((2,), ("mp",), (1,)), shard={"mp": 2}, halo={1: 1})
    mean = np.arange(6) * 0.5
    std = np.arange(6) + 1.0
    np.save(tmp_path / "global_stds.npy", std.reshape(1, 6, 1, 1))  # PhysicsNeMo's stats file shape
    src = ZarrDatasetSource(path, CHANNELS, layout, batch_size=2, shuffle=False, mean=mean,
                            std=str(tmp_path / "global_stds.npy"), dtype="f4")
    native, python = _pipeline(src), _pipeline(src, "python")
    for _ in range(len(src) // 2):
        (wn, idn, _), (wp, idp, _) = native.run(), python.run()
        assert np.array_equal(np.array(idn.as_tensor()), np.array(idp.as_tensor()))  # the same samples
        for j in range(2):
            t = src.time_index(int(np.array(idn[j])))
            want = (take_window(_oracle(ds, t, np.float64), src.region) - mean[:, None, None]) / std[:, None, None]
            np.testing.assert_allclose(np.array(wn[j]), want, rtol=2e-6, atol=2e-6)
            np.testing.assert_allclose(np.array(wp[j]), want, rtol=2e-6, atol=2e-6)
            assert np.array(wn[j]).dtype == np.float32


@pytest.mark.timeout(300)
def test_mesh_loader_checkpoint_resumes(store):
    torch = pytest.importorskip("torch")
    from nvidia.dali import pipeline_def

    from dali_mesh.fn import read_dataset
    from dali_mesh.torch import MeshLoader

    path, _ = store
    layout = Layout(MeshInfo((2,), ("mp",), (0,)), shard={"mp": 1})
    src = ZarrDatasetSource(path, CHANNELS[:3], layout, batch_size=2, seed=9)

    def make(checkpoint=None):
        @pipeline_def(batch_size=2, num_threads=1, device_id=None, enable_checkpointing=True)
        def pipe():
            return read_dataset(src)

        return pipe(checkpoint=checkpoint)

    loader = MeshLoader(make, layout)
    next(loader)
    state = loader.state_dict()
    assert state["fingerprint"]["sources"][0]["channels"][:2] == ["2m_temperature", "geopotential@850"]
    rest = [b["window"].clone() for b in loader]
    loader.load_state_dict(state)
    again = [b["window"] for b in loader]
    assert len(rest) == len(again) > 0 and all(torch.equal(a, b) for a, b in zip(rest, again))
    loader.close()


def test_refusals(store, tmp_path):
    path, ds = store
    _mixed_only(path)
    layout = Layout(MeshInfo((2,), ("mp",), (0,)), shard={"mp": 1})
    with pytest.raises(DataFileError, match=r"no variable 'humidity'; the dataset has \['10m_u_component"):
        ZarrDatasetSource(path, ["humidity"], layout)
    with pytest.raises(DataFileError, match=r"no variable 'level'"):
        ZarrDatasetSource(path, ["level"], layout)
    with pytest.raises(DataFileError, match=r"'geopotential' has no level 300; its 'level' values are \[500, 700, 850\]"):
        ZarrDatasetSource(path, [("geopotential", 300)], layout)
    with pytest.raises(DataFileError, match="level index 3 is out of range for 3 levels"):
        ZarrDatasetSource(path, [("geopotential", 3)], layout, levels_by="index")
    with pytest.raises(DataFileError, match="'2m_temperature' has no level dim"):
        ZarrDatasetSource(path, [("2m_temperature", 500)], layout)
    with pytest.raises(DataFileError, match=r"time \('2017-01-01', '2017-02-01'\) selects no step: the data run from "
                                            r"2016-01-01T00:00:00.000000000 to 2016-01-04T18"):
        ZarrDatasetSource(path, ["2m_temperature"], layout, time=("2017-01-01", "2017-02-01"))
    with pytest.raises(DataFileError, match="step 9 hours is not a whole multiple of the data's spacing 6 hours"):
        ZarrDatasetSource(path, ["2m_temperature"], layout, step="9h")
    with pytest.raises(LayoutError, match="no dim 'lat'; the samples' dims are \\('channel', 'latitude', 'longitude'\\)"):
        ZarrDatasetSource(path, ["2m_temperature"], NamedLayout(MeshInfo((2,), ("mp",), (0,)), shard={"mp": "lat"}))
    with pytest.raises(LayoutError, match="axis 0 is sharded"):
        ZarrDatasetSource(path, ["2m_temperature"], Layout(MeshInfo((2,), ("mp",), (0,)), shard={"mp": 0}))
    # a variable on another grid, and one with another time axis
    other = _dataset(7)
    other["coarse"] = (("time", "lat2", "lon2"), np.zeros((T, 5, 8), "f4"))
    other["short"] = (("t2", "latitude", "longitude"), np.zeros((3, H, W), "f4"))
    other = other.assign_coords(t2=pd.date_range("2016-01-01", periods=3, freq="6h"))
    bad = str(tmp_path / "bad.zarr")
    other.to_zarr(bad, zarr_format=2, mode="w", consolidated=False)
    with pytest.raises(DataFileError, match=r"variable 'coarse' has spatial dims \(lat2: 5, lon2: 8\), variable "
                                            r"'2m_temperature' \(latitude: 11, longitude: 16\)"):
        ZarrDatasetSource(bad, ["2m_temperature", "coarse"], layout)
    with pytest.raises(DataFileError, match=r"variable 'short' has dims \('t2', 'latitude', 'longitude'\): the "
                                            r"first must be 'time'"):
        ZarrDatasetSource(bad, ["2m_temperature", "short"], layout)
    # a fill value xarray masks to NaN, in this store's format: refused, not read raw
    fmt = 3 if path.endswith("v3.zarr") else 2
    masked = str(tmp_path / "masked.zarr")
    _dataset(3).to_zarr(masked, zarr_format=fmt, mode="w", consolidated=False,
                        encoding={"2m_temperature": {"_FillValue": -999.0}})
    with pytest.raises(DataFileError, match=r"'2m_temperature': its _FillValue \[-999.0\] is masked to NaN"):
        ZarrDatasetSource(masked, ["2m_temperature"], layout)
    assert ZarrDatasetSource(masked, ["geopotential"], layout).dtype == np.float32  # NaN fill: as stored


def test_cf_time_decoding_against_xarray(tmp_path):
    from dali_mesh.datasets import decode_cf_time

    for units, values in [("hours since 1959-01-01", np.arange(0, 48, 6)),
                          ("days since 2000-02-28 12:00:00", np.array([0, 1, 2, 366])),
                          ("seconds since 1970-01-01T00:00:00Z", np.array([0, 86400 * 365.25])),
                          ("minutes since 1900-1-1 0:0:0", np.array([-60, 0, 525600]))]:
        for calendar in ("standard", "proleptic_gregorian"):
            attrs = {"units": units, "calendar": calendar}
            want = xr.decode_cf(xr.Dataset({"time": ("time", values, attrs)})).time.values
            np.testing.assert_array_equal(decode_cf_time(values, attrs, "t"), want.astype("datetime64[ns]"))
    rng = np.random.default_rng(5)  # random units, reference dates and values, within datetime64[ns]
    for _ in range(60):
        unit = str(rng.choice(["days", "hours", "minutes", "seconds"]))
        ref = f"{int(rng.integers(1800, 2150))}-{int(rng.integers(1, 13))}-{int(rng.integers(1, 29))}"
        if rng.random() < 0.5:
            ref += f" {int(rng.integers(0, 24)):02d}:{int(rng.integers(0, 60)):02d}:00"
        span = {"days": 20000, "hours": 400000, "minutes": 10 ** 7, "seconds": 10 ** 9}[unit]
        values = np.sort(rng.integers(-span, span, 5))
        attrs = {"units": f"{unit} since {ref}", "calendar": str(rng.choice(["standard", "proleptic_gregorian"]))}
        want = xr.decode_cf(xr.Dataset({"time": ("time", values, attrs)})).time.values
        np.testing.assert_array_equal(decode_cf_time(values, attrs, "t"), want.astype("datetime64[ns]"), err_msg=str(attrs))
    with pytest.raises(ValueError, match="calendar 'noleap' is not supported"):
        decode_cf_time(np.arange(3), {"units": "days since 2000-01-01", "calendar": "noleap"}, "t")
    with pytest.raises(ValueError, match="before 1582-10-15 in the 'standard' calendar"):
        decode_cf_time(np.arange(3), {"units": "days since 1500-01-01"}, "t")
    with pytest.raises(ValueError, match="not '<unit> since <date>'"):
        decode_cf_time(np.arange(3), {"units": "days"}, "t")
    with pytest.raises(ValueError, match="overflow"):
        decode_cf_time(np.array([2 ** 62]), {"units": "days since 2000-01-01"}, "t")
    # a store with the noleap calendar is refused naming it
    ds = xr.Dataset({"x": (("time", "y"), np.zeros((3, 2), "f4"))},
                    coords={"time": ("time", np.arange(3), {"units": "days since 2000-01-01", "calendar": "noleap"})})
    path = str(tmp_path / "noleap.zarr")
    ds.to_zarr(path, zarr_format=2, mode="w", consolidated=False)
    with pytest.raises(ValueError, match="calendar 'noleap'"):
        ZarrDatasetSource(path, ["x"], Layout(MeshInfo((1,), ("mp",), (0,)), shard={"mp": 1}))


# ---- NetCDF4 ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=[False, True], ids=["mixed", "float32"])
def netcdf_files(request, tmp_path_factory):
    pytest.importorskip("h5netcdf")
    root = tmp_path_factory.mktemp("nc")
    ds = _dataset(11, float32=request.param)
    files = []
    for i, (a, b) in enumerate(((0, 7), (7, T))):  # two files that continue each other in time
        path = str(root / f"era5_{i}.nc")
        ds.isel(time=slice(a, b)).to_netcdf(path, engine="h5netcdf", encoding={
            "geopotential": {"zlib": True, "complevel": 3, "shuffle": True, "chunksizes": (1, 1, 6, W)},
            "temperature": {"chunksizes": (2, 3, 4, 8)}})
        files.append(path)
    return files, ds


@pytest.mark.timeout(200)
def test_netcdf4_files_equal_xarray(netcdf_files):
    from dali_mesh import NetCDFDatasetSource
    from dali_mesh.pipeline.dataset_reader import dataset_readers

    files, _ = netcdf_files
    ds = xr.concat([xr.open_dataset(f, engine="h5netcdf") for f in files], dim="time")
    for mp in range(3):
        layout = NamedLayout(MeshInfo((3,), ("mp",), (mp,)), shard={"mp": "latitude"}, halo={"longitude": 2},
                             boundary={"longitude": "periodic"})
        src = NetCDFDatasetSource(files, CHANNELS, layout, batch_size=2, seed=1, step="12h",
                                  forecast=ForecastSpec(1, 1), dtype="f8")
        assert dataset_readers(src) == ["native"] * 5
        np.testing.assert_array_equal(src.times, ds.time.values)
        p = _pipeline(src)
        for _ in range(len(src) // 2):
            inp, tgt, ids, _ = p.run()
            for j in range(2):
                t = src.time_index(int(np.array(ids[j])))  # samples cross the file boundary too
                want_in = np.stack([take_window(_oracle(ds, s, np.float64), src.region) for s in (t - 2, t)])
                np.testing.assert_array_equal(np.array(inp[j]), want_in, err_msg=f"rank {mp} step {t}")
                np.testing.assert_array_equal(np.array(tgt[j])[0], take_window(_oracle(ds, t + 2, np.float64),
                                                                               src.region))


def test_netcdf_refusals(netcdf_files, tmp_path):
    from dali_mesh import NetCDFDatasetSource
    from dali_mesh.io import HeaderError

    files, ds = netcdf_files
    layout = Layout(MeshInfo((1,), ("mp",), (0,)), shard={"mp": 1})
    classic = tmp_path / "classic.nc"
    classic.write_bytes(b"CDF\x01" + b"\0" * 64)
    with pytest.raises(HeaderError, match=r"is a NetCDF3 file \(classic format, CDF-1\)"):
        NetCDFDatasetSource(str(classic), ["x"], layout)
    # packed (scale_factor/add_offset) and masked (_FillValue) variables: xarray changes their values
    packed = str(tmp_path / "packed.nc")
    _dataset(1).to_netcdf(packed, engine="h5netcdf", encoding={
        "2m_temperature": {"dtype": "int16", "scale_factor": 0.01, "_FillValue": -32767},
        "10m_u_component_of_wind": {"_FillValue": -999}})
    with pytest.raises(DataFileError, match=r"'2m_temperature': it is packed \(scale_factor\): xarray unpacks it"):
        NetCDFDatasetSource(packed, ["2m_temperature"], layout)
    with pytest.raises(DataFileError, match=r"'10m_u_component_of_wind': its _FillValue \[-999\] is masked to NaN"):
        NetCDFDatasetSource(packed, ["10m_u_component_of_wind"], layout)
    assert NetCDFDatasetSource(packed, ["geopotential"], layout).sample_shape == (L, H, W)  # NaN fill: as stored
    # files that do not continue each other on one grid
    other = str(tmp_path / "other.nc")
    _dataset(2).isel(latitude=slice(0, 5)).to_netcdf(other, engine="h5netcdf")
    with pytest.raises(DataFileError, match="the files must hold the same variables on the same grid"):
        NetCDFDatasetSource([files[0], other], ["2m_temperature"], layout)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("output", ["dtensor", "shard_tensor"])
def test_dtensor_and_shard_tensor_output_of_a_dataset(store, process_group, output):
    """MeshLoader(output="dtensor" / "shard_tensor") over read_dataset on a (1, 1) mesh: the full tensor
    is xarray's stacked channels (a 1-rank gloo group; the multi-rank wrapping is the loader's, tested
    on 4 processes elsewhere)."""
    pytest.importorskip("torch")
    if output == "shard_tensor":
        pytest.importorskip("physicsnemo.domain_parallel", reason="PhysicsNeMo is not installed")
    from nvidia.dali import pipeline_def
    from torch.distributed.device_mesh import init_device_mesh

    from dali_mesh.fn import read_dataset
    from dali_mesh.torch import MeshLoader

    path, ds = store
    if output == "shard_tensor":
        _mixed_only(path)
    mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "mp"))
    layout = NamedLayout(MeshInfo.from_device_mesh(mesh), shard={"mp": "latitude"}, batch="dp").resolve(
        ("channel", "latitude", "longitude"))
    src = ZarrDatasetSource(path, CHANNELS, layout, batch_size=2, shuffle=False, dtype="f4")

    @pipeline_def(batch_size=2, num_threads=1, device_id=None)
    def pipe():
        return read_dataset(src)

    loader = MeshLoader(pipe(), layout, output=output, device_mesh=mesh, sample_shape=src.sample_shape)
    n = 0
    for batch in loader:
        dt = batch["window"]
        want_type = "DTensor" if output == "dtensor" else "ShardTensor"
        assert type(dt).__name__ == want_type and tuple(dt.shape) == (2,) + src.sample_shape
        want = np.stack([_oracle(ds, src.time_index(i), np.float32) for i in batch["sample_id"].tolist()])
        np.testing.assert_array_equal(dt.full_tensor().numpy(), want)
        n += 1
    assert n == len(src) // 2
    loader.close()


@pytest.mark.timeout(200)
def test_a_variable_that_is_not_native_falls_back_alone(tmp_path, caplog):
    """A variable with a filter the native reader does not decode (numcodecs Delta) is read by
    partitioned_source, with one log line naming it; the other variable stays native; the windows
    equal xarray's."""
    import logging

    from numcodecs import Delta
    from nvidia.dali import pipeline_def

    from dali_mesh.fn import read_dataset
    from dali_mesh.pipeline.dataset_reader import dataset_readers

    ds = _dataset(4)
    path = str(tmp_path / "filtered.zarr")
    ds.to_zarr(path, zarr_format=2, mode="w", consolidated=False,
               encoding={"2m_temperature": {"filters": [Delta(dtype="f4")]}})
    layout = Layout(MeshInfo((2,), ("mp",), (1,)), shard={"mp": 1}, halo={1: 1})
    src = ZarrDatasetSource(path, ["2m_temperature", ("geopotential", 700)], layout, batch_size=2, shuffle=False)
    readers = dataset_readers(src)
    assert readers[0].startswith("partitioned_source (") and "filters ['delta']" in readers[0] and readers[1] == "native"

    @pipeline_def(batch_size=2, num_threads=1, device_id=None, py_num_workers=1, py_start_method="spawn")
    def pipe():
        return read_dataset(src)

    with caplog.at_level(logging.INFO, logger="dali_mesh.pipeline.dataset_reader"):
        p = pipe()
    assert any("variable '2m_temperature'" in r.getMessage() for r in caplog.records)
    p.build()
    ds = xr.open_zarr(path, consolidated=False)  # float Delta is lossy: the oracle is the store as xarray reads it
    for _ in range(len(src) // 2):
        win, ids, _ = p.run()
        for j in range(2):
            t = src.time_index(int(np.array(ids[j])))
            want = np.stack([ds["2m_temperature"].isel(time=t).values,
                             ds["geopotential"].sel(level=700).isel(time=t).values])
            np.testing.assert_array_equal(np.array(win[j]), take_window(want, src.region))


@pytest.mark.timeout(200)
def test_one_operator_reads_every_float32_variable(store):
    """float32 variables (WeatherBench2, ARCO-ERA5): one read_windows operator reads them all, normalised
    in place (the pipeline holds no cat, cast or normalize); it reads what the variables' own plans read,
    and its windows equal read_dataset(stack=False) (one operator per variable, fn.cat, strided_slice) and
    xarray's, on every rank of a split that leaves ranks empty."""
    import re

    from dali_mesh.pipeline.dataset_reader import plan_dataset, read_dataset

    path, ds = store
    if not path.endswith("f4.zarr"):
        pytest.skip("the variables have several dtypes: one reader each")
    from nvidia.dali import pipeline_def

    mean, std = np.linspace(-1, 1, 6), np.linspace(0.5, 3, 6)
    for rank, fc in itertools.product(range(4), (None, ForecastSpec(1, 1))):
        if fc is not None and rank in (1, 2):
            continue
        layout = NamedLayout(MeshInfo((4,), ("mp",), (rank,)), shard={"mp": "latitude"}, crop={"latitude": (1, 4)},
                             halo={"latitude": 1, "longitude": 2}, boundary={"longitude": "periodic"},
                             split="physicsnemo")  # 3 rows over 4 ranks: ranks 0-2 empty
        src = ZarrDatasetSource(path, CHANNELS, layout, batch_size=2, shuffle=False, mean=mean, std=std, forecast=fc)
        parts, stacked = plan_dataset(src)
        assert stacked[0].item_read_bytes(1) == sum(p[0].item_read_bytes(1) for p in parts)
        pipes = []
        for stack in (True, False):
            @pipeline_def(batch_size=2, num_threads=2, device_id=None)
            def pipe():
                return read_dataset(src, fallback=False, stack=stack)

            p = pipe()
            p.build()
            pipes.append(p)
        ops = set(re.findall(rb"dali_mesh__\w+|Normalize|Cat|Cast", pipes[0].serialize()))
        assert ops == {b"dali_mesh__ReadWindows"}, ops
        norm = lambda x: (x - mean[:, None, None]) / std[:, None, None]  # noqa: E731
        for _ in range(len(src) // 2):
            one, per_variable = pipes[0].run(), pipes[1].run()
            for j in range(2):
                t = src.time_index(int(np.array(one[-2][j])))
                steps = [[0]] if fc is None else [[-1, 0], [1]]
                for w, ts in enumerate(steps):
                    want = np.stack([norm(take_window(_oracle(ds, t + d, np.float64), src.region)) for d in ts])
                    want = want[0] if fc is None else want
                    got = np.array(one[w][j])
                    assert got.shape == want.shape, (rank, fc, got.shape, want.shape)
                    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6, err_msg=f"rank {rank} step {t}")
                    np.testing.assert_allclose(np.array(per_variable[w][j]), got, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("fmt", [2, 3])
def test_consolidated_metadata_opens_and_a_stale_copy_is_not_trusted(tmp_path, fmt):
    """A store written with consolidated metadata (xarray's default) opens; the arrays' own metadata
    files are read, so a consolidated copy left stale (here: claiming other shapes) changes nothing."""
    import json

    ds = _dataset(5, float32=True)
    path = str(tmp_path / f"c{fmt}.zarr")
    ds.to_zarr(path, zarr_format=fmt, mode="w", consolidated=True)
    layout = NamedLayout(MeshInfo((2,), ("mp",), (1,)), shard={"mp": "latitude"})
    meta = os.path.join(path, ".zmetadata" if fmt == 2 else "zarr.json")
    assert os.path.exists(meta)
    doc = json.load(open(meta))
    if fmt == 2:
        doc["metadata"]["2m_temperature/.zarray"]["shape"] = [T + 5, H + 1, W]
    else:
        doc["consolidated_metadata"]["metadata"]["2m_temperature"]["shape"] = [T + 5, H + 1, W]
    json.dump(doc, open(meta, "w"))
    src = ZarrDatasetSource(path, ["2m_temperature", ("geopotential", 500)], layout, batch_size=2, shuffle=False)
    assert src.sample_shape == (2, H, W) and src.num_samples == T
    win, ids, _ = _pipeline(src).run()
    for j in range(2):
        t = src.time_index(int(np.array(ids[j])))
        want = np.stack([ds["2m_temperature"].values[t], ds["geopotential"].sel(level=500).values[t]])
        np.testing.assert_array_equal(np.array(win[j]), take_window(want, src.region))


def test_window_coordinate_follows_the_boundary_rule(store):
    """window_coordinate: the coordinate's values at this rank's window positions, as np.pad pads the
    stored coordinate (periodic: the far side's; constant: NaN); the stored order is split as stored."""
    path, ds = store
    _mixed_only(path)
    lat, lon = ds.latitude.values, ds.longitude.values
    rows = []
    for mp in range(3):
        layout = NamedLayout(MeshInfo((3,), ("mp",), (mp,)), shard={"mp": "latitude"},
                             halo={"latitude": 1, "longitude": 2}, boundary={"longitude": "periodic"})
        src = ZarrDatasetSource(path, ["2m_temperature"], layout)
        np.testing.assert_array_equal(src.coordinate("latitude"), lat)
        r = src.region
        want_lat = np.pad(lat, 1, constant_values=np.nan)[r.window_start[1] + 1:r.window_stop[1] + 1]
        want_lon = np.pad(lon, 2, mode="wrap")[r.window_start[2] + 2:r.window_stop[2] + 2]
        np.testing.assert_array_equal(src.window_coordinate("latitude"), want_lat)
        np.testing.assert_array_equal(src.window_coordinate("longitude"), want_lon)
        rows.append(src.window_coordinate("latitude"))
    assert rows[0][1] == 90 and rows[-1][-2] == -90  # stored north to south: rank 0 holds the north
    with pytest.raises(ValueError, match="no spatial dim 'level'"):
        src.window_coordinate("level")
    with pytest.raises(DataFileError, match="no coordinate 'height'"):
        src.coordinate("height")


def test_a_group_reader_reads_its_variables_group_windows_and_pickles(store):
    """share="group": the group reader of a dataset reads the group window with every variable (each
    variable's source is built over its own layout, the level-less ones without the channel axis), of
    this member's batches; pickled, as into DALI's workers, it reads the same. The source itself and its
    variables still read this rank's window, and neither shares a cache with the reader."""
    import pickle

    from dali_mesh.partition.read_groups import GroupReads, OwnReads, group_region

    path, ds = store
    _mixed_only(path)
    for coord in itertools.product(range(2), range(3)):
        mesh = MeshInfo((2, 3), ("dp", "mp"), coord)
        layout = NamedLayout(mesh, shard={"mp": "latitude"}, batch="dp", halo={"latitude": 2, "longitude": 1},
                             boundary={"latitude": "reflect", "longitude": "periodic"})
        src = ZarrDatasetSource(path, CHANNELS, layout, batch_size=2, seed=3, dtype=np.float32, share="group")
        reader = src.group_reader()
        assert reader.group_reader() is reader and reader.reads == GroupReads(("mp",)) and src.reads == OwnReads()
        assert [sub for sub, _ in src.parts] == [sub for sub, _ in src._parts]  # the same objects
        gw = group_region(src.layout, src.sample_shape, ("mp",))
        assert reader.region == gw and src.region == src.layout.region(src.sample_shape)
        for (sub, _), (own, _) in zip(reader.parts, src.parts):
            assert sub.reads == reader.reads and own.reads == OwnReads()
            assert sub.region == group_region(sub.layout, sub.sample_shape, ("mp",))
        ids, _ = reader.order(0)
        full, _ = src.order(0)
        assert ids.tolist() == [int(s) for b in range(coord[1], len(full) // 2, 3) for s in full[2 * b:2 * b + 2]]
        sid = int(ids[0])
        want = take_window(_oracle(ds, src.time_index(sid), np.float32), gw)
        np.testing.assert_array_equal(reader.read_sample(sid)[0], want)
        again = pickle.loads(pickle.dumps(reader))
        assert again.reads == reader.reads and again.order(0)[0].tolist() == ids.tolist()
        np.testing.assert_array_equal(again.read_sample(sid)[0], want)
        np.testing.assert_array_equal(src.read_sample(sid)[0], take_window(_oracle(ds, src.time_index(sid), np.float32),
                                                                            src.region))
        assert reader._memo is not src._memo and reader.parts[0][0]._memo is not src.parts[0][0]._memo


def test_a_source_without_share_is_its_own_group_reader(store):
    path, _ = store
    _mixed_only(path)
    layout = NamedLayout(MeshInfo((3,), ("mp",), (1,)), shard={"mp": "latitude"})
    src = ZarrDatasetSource(path, CHANNELS, layout, batch_size=2)
    assert src.share_dims == () and src.group_reader() is src and src.group == (1, 0)
