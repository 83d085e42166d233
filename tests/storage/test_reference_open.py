"""A reference set's open looks at each referenced file once, all of them together (issues 42 and 43): a
dataset of two variables over three NetCDF4 files in S3 (the benchmarks' parallel server, logged: see
tests/storage/request_log.py) plans both variables natively with one HEAD per file, in one round trip,
and its windows equal xarray's over the local files."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tests.storage.request_log import LoggingS3Server, waves
from tests.storage.s3_server import options
from tests.helpers import SEED

pytest.importorskip("kerchunk")
pytest.importorskip("xarray")

LATENCY = 0.05  # requests sent together overlap in time, one sent after another's answer does not


def _netcdf_along_time(tmp_path, files: int):
    """NetCDF4 files of two variables (gzip + shuffle chunks, a contiguous one) written by xarray with a CF
    time, combined along time by kerchunk: ``(paths, combined references)``."""
    import xarray as xr
    from kerchunk.combine import MultiZarrToZarr
    from kerchunk.hdf import SingleHdf5ToZarr

    rng = np.random.default_rng(SEED)
    paths = []
    for k in range(files):
        time = np.datetime64("2020-01-01T00", "ns") + np.arange(2 * k, 2 * k + 2) * np.timedelta64(6, "h")
        ds = xr.Dataset({"t": (("time", "lat", "lon"), rng.standard_normal((2, 10, 8)).astype("<f4")),
                         "q": (("time", "lat", "lon"), rng.standard_normal((2, 10, 8)).astype("<f4"))},
                        coords={"time": time})
        paths.append(str(tmp_path / f"part{k}.nc"))
        ds.to_netcdf(paths[-1], engine="h5netcdf", encoding={
            "t": {"zlib": True, "shuffle": True, "chunksizes": (1, 5, 4)}, "q": {"contiguous": True},
            "time": {"units": "hours since 2020-01-01"}})  # one unit for every file: kerchunk combines the values
    singles = [SingleHdf5ToZarr(p, inline_threshold=0).translate() for p in paths]
    return paths, MultiZarrToZarr(singles, concat_dims=["time"], identical_dims=["lat", "lon"],
                                  inline_threshold=0).translate()


def test_each_referenced_file_is_looked_at_once_and_all_at_once(tmp_path):
    import shutil

    import xarray as xr

    from dali_mesh import MeshInfo, NamedLayout, ZarrDatasetSource
    from dali_mesh.partition import take_window

    paths, refs = _netcdf_along_time(tmp_path, files=3)
    bucket = tmp_path / "root" / "data"
    bucket.mkdir(parents=True)
    for p in paths:
        shutil.copy(p, bucket / os.path.basename(p))
    moved = {k: [f"s3://data/{os.path.basename(v[0])}", *v[1:]] if isinstance(v, list) else v
             for k, v in refs["refs"].items()}
    (bucket / "era.json").write_text(json.dumps({**refs, "refs": moved}))
    layout = NamedLayout(MeshInfo((2,), ("mp",), (1,)), shard={"mp": "lat"}, halo={"lat": 1})
    with LoggingS3Server(root=str(tmp_path / "root"), latency=LATENCY) as server:
        server.take_log()
        src = ZarrDatasetSource("reference://s3://data/era.json", ["t", "q"], layout, batch_size=1, shuffle=False,
                                dtype=np.float32, storage_options=options(server.endpoint))
        for part, _ in src.parts:  # each variable's plan, as read_dataset makes them
            part.native_plans()
        log = server.take_log()
        shown = "\n".join(f"{r.method} {r.key} {r.range}" for r in log)
        heads = [r for r in log if r.method == "HEAD"]
        # each file looked at once for both variables' plans (before: once per variable, one after another)
        assert sorted(r.key for r in heads) == sorted(f"data/{os.path.basename(p)}" for p in paths), shown
        assert len(waves(heads)) == 1, shown
        ds = xr.concat([xr.load_dataset(p, engine="h5netcdf") for p in paths], "time")
        for sid in range(len(src)):
            t = src.time_index(sid)
            want = np.stack([ds["t"].values[t], ds["q"].values[t]])
            np.testing.assert_array_equal(src.read_sample(sid)[0], take_window(want, src.region))
