"""dali_mesh.physicsnemo.ERA5HDF5Datapipe against PhysicsNeMo's own ERA5HDF5Datapipe (issue 18): the same
files, arguments and order give, batch for batch and bit for bit, PhysicsNeMo's invar / outvar /
cos_zenith / time_of_year_idx cut to each rank's band. PhysicsNeMo's datapipe runs in a subprocess
(tests/torch/physicsnemo_era5_reference.py, which says why). Skipped where PhysicsNeMo is not installed."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("h5py")
pytest.importorskip("physicsnemo.distributed", reason="PhysicsNeMo is not installed (make test installs it)")

from dali_mesh import Layout, MeshInfo  # noqa: E402
from dali_mesh.partition import LayoutError, take_window  # noqa: E402
from tests.helpers import write_era5_folder  # noqa: E402
from tests.storage.s3_server import client, options, s3_endpoint, upload  # noqa: E402, F401

STEPS, CHANNELS, H, W = 13, 4, 10, 12
REFERENCE = os.path.join(os.path.dirname(__file__), "physicsnemo_era5_reference.py")

# name -> (PhysicsNeMo's arguments, data-parallel rank/size); every config on 3 model-parallel ranks
CONFIGS = {
    f"h{h}s{s}st{st}": (dict(num_history=h, num_steps=s, stride=st, channels=[0, 2, 3], batch_size=2,
                             use_cos_zenith=True, latlon_resolution=(H, W), use_time_of_year_index=True,
                             cos_zenith_args={"dt": 6.0, "start_year": 2000}), (1, 2))
    # an orthogonal array of num_history x num_steps x stride: every pair of their values appears once
    for h, s, st in ((0, 1, 1), (0, 2, 2), (1, 1, 2), (1, 2, 1))
}
CONFIGS["unshuffled_patch"] = (dict(num_history=1, num_steps=1, stride=1, batch_size=3, shuffle=False,
                                    patch_size=(4, 5), num_samples_per_year=7, use_time_of_year_index=True), (0, 1))
CONFIGS["no_stats_dp3"] = (dict(num_history=0, num_steps=1, stride=3, batch_size=1, channels=[1]), (2, 3))


@pytest.fixture(scope="module", autouse=True)
def physicsnemo_datapipes():
    """The drop-in's cos zenith uses PhysicsNeMo's own DALI function and lat/lon grid, from modules
    that import here only around their package __init__s (see _physicsnemo_stub.py)."""
    from tests.torch import _physicsnemo_stub

    _physicsnemo_stub.install()
    yield
    _physicsnemo_stub.uninstall()


@pytest.fixture(scope="module")
def era5(tmp_path_factory):
    """Two year files (2001 is chunked and gzip+shuffle compressed), PhysicsNeMo's stats files."""
    root = tmp_path_factory.mktemp("era5")
    years = write_era5_folder(root, np.random.default_rng(18), (STEPS, CHANNELS, H, W), (1, 2, 5, 12), marked=True)
    (root / "data" / "notes.h5").write_bytes(b"not a year file")  # PhysicsNeMo's ????.h5 rule skips it
    return root, years


@pytest.fixture(scope="module")
def reference(era5, tmp_path_factory):
    """Every batch of two epochs of PhysicsNeMo's datapipe, per config."""
    root, _ = era5
    out = tmp_path_factory.mktemp("reference")
    configs = {}
    for name, (kw, (rank, world)) in CONFIGS.items():
        stats = None if name.startswith("no_stats") else str(root / "stats")
        configs[name] = dict(kw, data_dir=str(root / "data"), stats_dir=stats, device="cpu", num_workers=1,
                             process_rank=rank, world_size=world)
    # two processes, half the configs each: both cores (each process spends most of its time alone)
    names = sorted(configs)
    procs = []
    for k, part in enumerate((names[0::2], names[1::2])):
        (out / f"configs{k}.json").write_text(json.dumps({n: configs[n] for n in part}))
        procs.append(subprocess.Popen([sys.executable, REFERENCE, str(out / f"configs{k}.json"), str(out)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=out))
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=400)
        assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    return {name: dict(np.load(out / f"{name}.npz")) for name in CONFIGS}


def _ours(root, name, mp_rank, *, dirs=None, **extra):
    """Our datapipe over ``root``'s folders (``dirs``: other ``(data_dir, stats_dir)``) as rank
    ``mp_rank`` of 3 of a lat split, with the config's data-parallel rank."""
    from dali_mesh.physicsnemo import ERA5HDF5Datapipe

    kw, (rank, world) = CONFIGS[name]
    mesh = MeshInfo((world, 3), ("dp", "mp"), (rank, mp_rank))
    layout = extra.pop("layout", None)
    if layout is None:
        crop = None if "patch_size" not in kw else [None, (0, 8), (0, 10)]
        layout = Layout(mesh, shard={"mp": 1}, batch="dp", split="physicsnemo", crop=crop)
    data, stats = dirs or (str(root / "data"), str(root / "stats"))
    stats = None if name.startswith("no_stats") else stats
    return ERA5HDF5Datapipe(data, stats, device="cpu", num_workers=1, layout=layout, **kw, **extra)


def _band(full, region, key):
    """PhysicsNeMo's whole-field output cut to the rank's owned rows and columns."""
    rows = slice(region.start[1], region.stop[1])
    cols = slice(region.start[2], region.stop[2])
    return full if key == "time_of_year_idx" else full[..., rows, cols]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_batch_for_batch_physicsnemo(era5, reference, name):
    from dali_mesh.pipeline import native

    root, _ = era5
    ref = reference[name]
    for mp_rank in range(3):
        pipe = _ours(root, name, mp_rank)
        native.plan_windows(pipe.source)  # read natively (no fallback): raises NotNativeError otherwise
        assert len(pipe) == int(ref["len"]) > 0
        for epoch in range(2):
            n = 0
            for b, batch in enumerate(pipe):
                (got,) = batch
                keys = sorted(k.split("/")[2] for k in ref if k.startswith(f"{epoch}/{b}/"))
                assert sorted(got) == keys
                for k in keys:
                    want = _band(ref[f"{epoch}/{b}/{k}"], pipe.region, k)
                    have = got[k].numpy()
                    assert have.shape == want.shape and have.dtype == want.dtype, (k, have.shape, want.shape)
                    np.testing.assert_array_equal(have, want, err_msg=f"{name} rank {mp_rank} epoch {epoch} "
                                                                      f"batch {b} {k}")
                n += 1
            assert n == len(pipe)
        pipe.close()


@pytest.mark.timeout(300)
def test_halo_windows_follow_the_boundary_rules(era5, reference):
    # halo rows reflected at the poles, columns periodic: PhysicsNeMo's field, windowed by numpy's pad
    root, _ = era5
    name = "h1s1st2"
    ref = reference[name]
    for mp_rank in (0, 2):
        mesh = MeshInfo((2, 3), ("dp", "mp"), (1, mp_rank))
        layout = Layout(mesh, shard={"mp": 1}, batch="dp", split="physicsnemo", halo={1: 1, 2: 2},
                        boundary={1: "reflect", 2: "periodic"})
        pipe = _ours(root, name, mp_rank, layout=layout)
        (got,) = next(iter(pipe))
        for k in ("invar", "outvar", "cos_zenith"):
            full = ref[f"0/0/{k}"]
            region = layout.region((full.shape[-3],) + full.shape[-2:])
            want = np.stack([np.stack([take_window(s, region) for s in steps]) for steps in full])
            np.testing.assert_array_equal(got[k].numpy(), want, err_msg=f"rank {mp_rank} {k}")
        pipe.close()


@pytest.mark.timeout(300)
def test_dali_mesh_order_takes_every_sample_once_within_years(era5):
    from dali_mesh.physicsnemo import ERA5HDF5Datapipe

    root, years = era5
    seen = []
    for dp in range(2):
        layout = Layout(MeshInfo((2, 2), ("dp", "mp"), (dp, 1)), shard={"mp": 2}, batch="dp", split="physicsnemo")
        pipe = ERA5HDF5Datapipe(str(root / "data"), None, channels=[1, 2], batch_size=2, num_history=1,
                                num_steps=1, stride=2, shuffle=True, device="cpu", layout=layout, order="dali_mesh",
                                seed=5, use_time_of_year_index=True)
        region = pipe.region
        for (batch,) in pipe:
            for i, doy in enumerate(batch["time_of_year_idx"].reshape(-1).tolist()):
                # which year: the data encode it (1000 per year, rounded)
                year = 2000 + round(float(batch["invar"][i, 0, 0, 0, 0]) / 1000)
                seen.append((year, doy))
                a = years[year]
                want = np.stack([take_window(a[t, [1, 2]], region) for t in (doy, doy + 2)])
                np.testing.assert_array_equal(batch["invar"][i].numpy(), want)
                np.testing.assert_array_equal(batch["outvar"][i].numpy(), take_window(a[doy + 4, [1, 2]], region)[None])
        pipe.close()
    # 13 - 4 = 9 samples a year, floored to 8 for 2 data-parallel ranks: 16, each once per epoch
    assert sorted(seen) == [(y, i) for y in (2000, 2001) for i in range(8)]


@pytest.mark.timeout(300)
def test_checkpoint_resumes_mid_epoch(era5, reference):
    root, _ = era5
    name = "h0s1st1"
    pipe = _ours(root, name, 1)
    it = iter(pipe)
    next(it)
    state = pipe.state_dict()
    rest = [b[0]["invar"].clone() for b in it]
    pipe.close()
    again = _ours(root, name, 1)
    again.load_state_dict(state)
    resumed = [b[0]["invar"] for b in again]
    assert len(resumed) == len(rest) == len(again) - 1
    for a, b in zip(rest, resumed):
        assert torch.equal(a, b)
    again.close()


def test_refusals(era5, tmp_path, monkeypatch):
    from dali_mesh.io import DataFileError
    from dali_mesh.physicsnemo import ERA5HDF5Datapipe

    root, years = era5
    data = str(root / "data")
    with pytest.raises(ValueError, match="interpolation_type='INTERP_LINEAR'.*does not resize"):
        ERA5HDF5Datapipe(data, device="cpu", interpolation_type="INTERP_LINEAR", latlon_resolution=(5, 6))
    with pytest.raises(IOError, match="data directory .* does not exist"):
        ERA5HDF5Datapipe(str(tmp_path / "nowhere"), device="cpu")
    with pytest.raises(IOError, match=r"no year files \(\?\?\?\?\.h5\)"):
        ERA5HDF5Datapipe(str(tmp_path), device="cpu")
    with pytest.raises(ValueError, match="greater than the number of fields 4"):
        ERA5HDF5Datapipe(data, channels=[0, 4], device="cpu")
    with pytest.raises(ValueError, match=r"num_samples_per_year \(13\) > number of samples available \(12\)"):
        ERA5HDF5Datapipe(data, num_samples_per_year=13, device="cpu")
    with pytest.raises(ValueError, match="Not enough number of samples per year"):
        ERA5HDF5Datapipe(data, num_history=6, num_steps=7, device="cpu")
    mp = Layout(MeshInfo((3,), ("mp",), (0,)), shard={"mp": 1}, split="physicsnemo")
    with pytest.raises(ValueError, match=r"latlon_resolution \(5, 6\) is not the fields' \(10, 12\)"):
        ERA5HDF5Datapipe(data, device="cpu", use_cos_zenith=True, latlon_resolution=(5, 6), layout=mp)
    with pytest.raises(ValueError, match="latlon_resolution must be set"):
        ERA5HDF5Datapipe(data, device="cpu", use_cos_zenith=True)
    dp = Layout(MeshInfo((2, 3), ("dp", "mp"), (1, 0)), shard={"mp": 1}, batch="dp")
    with pytest.raises(ValueError, match=r"process_rank 0 / world_size 2 disagree with the layout's batch dims"):
        ERA5HDF5Datapipe(data, device="cpu", layout=dp, process_rank=0, world_size=2)
    with pytest.raises(LayoutError, match=r"domain \(10, 12\) of \(lat, lon\) is not the fields' \(8, 10\)"):
        ERA5HDF5Datapipe(data, device="cpu", layout=mp, patch_size=(4, 5))
    import dali_mesh.physicsnemo.era5 as era5_module

    with monkeypatch.context() as m:  # as if DistributedManager had made a 2-D mesh
        m.setattr(era5_module, "_physicsnemo_mesh", lambda: MeshInfo((2, 2), ("dp", "mp"), (0, 0)))
        with pytest.raises(LayoutError, match="shard= is needed on a 2-D mesh"):
            ERA5HDF5Datapipe(data, device="cpu")
    with pytest.raises(ValueError, match="order must be one of 'physicsnemo', 'dali_mesh'"):
        ERA5HDF5Datapipe(data, device="cpu", order="nope")
    # a later year shorter than the first: PhysicsNeMo would index past it; refused naming the file
    import h5py

    short = tmp_path / "short"
    short.mkdir()
    for y, n in ((2000, 13), (2001, 9)):
        with h5py.File(short / f"{y}.h5", "w") as f:
            f["fields"] = years[y][:n]
    with pytest.raises(DataFileError, match=r"2001\.h5.*holds 9 steps, fewer than the 13"):
        ERA5HDF5Datapipe(str(short), device="cpu", num_steps=1)
    # PhysicsNeMo's sample order is not split into read groups: a group reader would read every batch
    from dali_mesh import ForecastSpec
    from dali_mesh.physicsnemo.era5_source import ERA5Source

    files = sorted(str(p) for p in (root / "data").glob("*.h5"))
    with pytest.raises(ValueError, match="ERA5Source does not take share="):
        ERA5Source(files, dp, forecast=ForecastSpec(0, 1), process_rank=1, world_size=2, share="group")



def _shard_tensor_rank(rank, world_size, data):
    """On a (dp 2, mp 2) mesh: ShardTensor output gathers to the fields h5py reads (no stats), and the
    mesh can come from PhysicsNeMo's DistributedManager instead of device_mesh=."""
    import h5py
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from dali_mesh.physicsnemo import ERA5HDF5Datapipe
    from tests.torch import _physicsnemo_stub
    from tests.torch.test_physicsnemo_real import _manager

    _physicsnemo_stub.install()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "mp"))
    years = {int(p[-7:-3]): h5py.File(p, "r")["fields"][:] for p in sorted(glob.glob(os.path.join(data, "????.h5")))}
    kw = dict(channels=[0, 3], batch_size=2, num_history=1, num_steps=1, stride=2, device="cpu",
              use_time_of_year_index=True, shard={"mp": "lat"})
    pipe = ERA5HDF5Datapipe(data, **kw, device_mesh=mesh, output="shard_tensor")
    assert pipe.world_size == 2 and pipe.process_rank == mesh.get_local_rank(0)
    n = 0
    for (batch,) in pipe:
        inv, outv = batch["invar"], batch["outvar"]
        assert type(inv).__name__ == "ShardTensor" and inv.shape == (4, 2, 2, H, W) and outv.shape == (4, 1, 2, H, W)
        doys = [None] * world_size
        dist.all_gather_object(doys, (mesh.get_local_rank(0), batch["time_of_year_idx"].reshape(-1).tolist()))
        doys = [d for _, d in sorted(set((g, tuple(d)) for g, d in doys))]
        full_in, full_out = inv.full_tensor().numpy(), outv.full_tensor().numpy()
        for i, doy in enumerate(d for group in doys for d in group):
            year = 2000 + round(float(full_in[i, 0, 0, 0, 0]) / 1000)
            a = years[year]
            np.testing.assert_array_equal(full_in[i], a[[doy, doy + 2]][:, [0, 3]])
            np.testing.assert_array_equal(full_out[i], a[[doy + 4]][:, [0, 3]])
        n += 1
    assert n == len(pipe) > 0
    pipe.close()

    # the mesh from PhysicsNeMo's DistributedManager (no device_mesh=): the same layout
    manager = _manager(rank, world_size)
    manager.initialize_mesh(mesh_shape=(2, 2), mesh_dim_names=("dp", "mp"))
    again = ERA5HDF5Datapipe(data, **kw)
    assert again.layout == pipe.layout, (again.layout, pipe.layout)
    again.close()


@pytest.mark.timeout(300)
def test_shard_tensor_output_on_four_gloo_ranks(era5, tmp_path, monkeypatch):
    from dali_mesh.cli.launch import run_ranks

    root, _ = era5
    top = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([top, os.environ.get("PYTHONPATH", "")]))
    run_ranks(_shard_tensor_rank, 4, tmp_path, str(root / "data"), timeout_s=240)


@pytest.mark.timeout(300)
def test_an_epoch_left_part_way_is_finished_before_the_next(era5, reference):
    # a `break` after one batch: the next `for` is PhysicsNeMo's epoch 1, whole, from its first batch
    root, _ = era5
    name = "h0s1st1"
    ref = reference[name]
    pipe = _ours(root, name, 0)
    for _ in pipe:
        break
    got = [batch[0]["invar"].numpy() for batch in pipe]
    assert len(got) == len(pipe)
    for b, have in enumerate(got):
        np.testing.assert_array_equal(have, _band(ref[f"1/{b}/invar"], pipe.region, "invar"), err_msg=f"batch {b}")
    pipe.close()


def test_negative_channel_indexes_count_from_the_last_field(era5):
    """Issue 29 item 14: ``channels=[-1, 1]`` is the last field and field 1, as numpy (and so
    PhysicsNeMo's datapipe, which indexes the fields and the stats with them) takes it."""
    from dali_mesh.physicsnemo import ERA5HDF5Datapipe

    root, _ = era5
    layout = Layout(MeshInfo((3,), ("mp",), (1,)), shard={"mp": 1}, split="physicsnemo")
    kw = dict(device="cpu", num_workers=1, layout=layout, batch_size=2, shuffle=False, num_steps=1)
    neg = ERA5HDF5Datapipe(str(root / "data"), str(root / "stats"), channels=[-1, 1], **kw)
    pos = ERA5HDF5Datapipe(str(root / "data"), str(root / "stats"), channels=[CHANNELS - 1, 1], **kw)
    assert neg.channels == [CHANNELS - 1, 1]
    means = np.load(root / "stats" / "global_means.npy")
    np.testing.assert_array_equal(neg.mu, means[:, [-1, 1]])
    for (a,), (b,) in zip(neg, pos):
        for k in a:
            np.testing.assert_array_equal(a[k].numpy(), b[k].numpy())
    neg.close()
    pos.close()
    with pytest.raises(ValueError, match="greater than the number of fields 4"):
        ERA5HDF5Datapipe(str(root / "data"), channels=[-5], device="cpu")


# ---- data_dir and stats_dir in object storage (issue 31) ----------------------------------------------
@pytest.fixture(scope="module")
def era5_s3(era5, s3_endpoint):
    """The module's year files (notes.h5 too) and stats under ``s3://data/physicsnemo-era5/`` on the
    tests' moto server, and a year file one level deeper (not a year file of the prefix, as the local
    glob does not descend either)."""
    root, _ = era5
    data = upload(s3_endpoint, root / "data", "data", "physicsnemo-era5/data")
    stats = upload(s3_endpoint, root / "stats", "data", "physicsnemo-era5/stats")
    client(s3_endpoint).upload_file(str(root / "data" / "2000.h5"), "data", "physicsnemo-era5/data/old/1999.h5")
    return data, stats, options(s3_endpoint)


@pytest.mark.timeout(120)
def test_s3_prefixes_give_the_local_folders_batches(era5, era5_s3):
    """``data_dir``/``stats_dir`` as ``s3://`` prefixes with ``storage_options``: the same year files,
    statistics and, on every rank of the lat split, the same batches (invar, outvar, cos_zenith,
    time_of_year_idx) as over the local folders, read natively."""
    from dali_mesh.pipeline import native

    root, _ = era5
    data, stats, opts = era5_s3
    name = "h1s2st1"  # stats, cos zenith and the time index; data-parallel rank 1 of 2
    for mp_rank in range(3):
        local = _ours(root, name, mp_rank)
        remote = _ours(root, name, mp_rank, dirs=(data + "/", stats), storage_options=opts)
        assert remote.data_paths == [f"{data}/2000.h5", f"{data}/2001.h5"]
        assert remote.data_dir == data and remote.stats_dir == stats
        native.plan_windows(remote.source)  # read natively (no fallback): raises NotNativeError otherwise
        np.testing.assert_array_equal(remote.mu, local.mu)
        np.testing.assert_array_equal(remote.sd, local.sd)
        assert remote.region == local.region and len(remote) == len(local) > 0
        want = [batch for (batch,) in local]
        got = [batch for (batch,) in remote]
        assert len(got) == len(want) == len(local)
        for b, (have, expect) in enumerate(zip(got, want)):
            assert sorted(have) == sorted(expect) == sorted(local.output_keys)
            for k in expect:
                assert have[k].dtype == expect[k].dtype
                np.testing.assert_array_equal(have[k].numpy(), expect[k].numpy(),
                                              err_msg=f"rank {mp_rank} batch {b} {k}")
        local.close()
        remote.close()


def test_s3_prefixes_without_year_files_or_stats_are_named(era5_s3):
    from dali_mesh.physicsnemo import ERA5HDF5Datapipe

    data, stats, opts = era5_s3
    nowhere = data.rsplit("/", 1)[0] + "/nowhere"
    with pytest.raises(IOError, match=rf"no year files \(\?\?\?\?\.h5\) in {nowhere} \(nothing is stored under it\)"):
        ERA5HDF5Datapipe(nowhere, device="cpu", storage_options=opts)
    with pytest.raises(IOError, match=rf"no year files \(\?\?\?\?\.h5\) in {stats} \(it holds 2 objects, none named"):
        ERA5HDF5Datapipe(stats, device="cpu", storage_options=opts)
    with pytest.raises(IOError, match=rf"Mean statistics file {data}/global_means\.npy not found"):
        ERA5HDF5Datapipe(data, data, device="cpu", storage_options=opts)
    # plain HTTP(S) has no listing: refused before any request, naming the location
    with pytest.raises(IOError, match=r"data directory https://127\.0\.0\.1:9/era5: its store \(http\) cannot list a folder"):
        ERA5HDF5Datapipe("https://127.0.0.1:9/era5/", device="cpu")
