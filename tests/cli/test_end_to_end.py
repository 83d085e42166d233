"""End to end on real processes (gloo, CPU): DALI pipelines with partitioned sources, MeshLoader,
windows against np.pad, sample groups, equal step counts, DTensor gathering and mid-epoch resume."""
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("nvidia.dali")

from dali_mesh.cli.launch import run_ranks  # noqa: E402



def _write_samples(folder, n, shape, seed=0):
    rng = np.random.default_rng(seed)
    files = []
    for i in range(n):
        f = os.path.join(folder, f"s{i:03d}.npy")
        np.save(f, rng.standard_normal(shape).astype(np.float32) + 1000 * i)
        files.append(f)
    return files


def _make_pipeline(source, batch_size):
    from nvidia.dali import pipeline_def

    from dali_mesh.pipeline.external import partitioned_source

    def make(checkpoint=None):
        @pipeline_def(batch_size=batch_size, num_threads=1, device_id=None, py_num_workers=1,
                      py_start_method="spawn", enable_checkpointing=True, prefetch_queue_depth=1)
        def pipe():
            return partitioned_source(source)

        return pipe(checkpoint=checkpoint)

    return make


def _epoch(loader):
    out = []
    for batch in loader:
        out.append((batch["sample_id"].numpy().copy(), batch["is_pad"].numpy().copy(), batch["window"].numpy().copy()))
    return out


def _check_rank(rank, world_size, mesh_shape, names, layout_kwargs, files, batch_size, resume_after, dtensor):
    import torch.distributed as dist
    from tests.helpers import np_pad_sample
    from torch.distributed.device_mesh import init_device_mesh

    from dali_mesh import Layout, MeshInfo
    from dali_mesh.source import NumpySource
    from dali_mesh.torch import MeshLoader, to_dtensor

    device_mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)
    layout = Layout(MeshInfo.from_device_mesh(device_mesh), **layout_kwargs)
    source = NumpySource(files, layout, batch_size=batch_size, seed=3)
    region = layout.region(source.sample_shape)
    make = _make_pipeline(source, batch_size)

    loader = MeshLoader(make, layout, sample_shape=source.sample_shape)
    # the state after `resume_after` steps, taken while the epoch goes on (a checkpoint must not
    # disturb the loader it was taken from)
    steps, state = [], None
    for batch in loader:
        steps.append((batch["sample_id"].numpy().copy(), batch["is_pad"].numpy().copy(),
                      batch["window"].numpy().copy()))
        if len(steps) == resume_after:
            state = loader.state_dict()

    # every window equals the np.pad oracle of its file
    for ids, pads, windows in steps:
        assert windows.shape == (batch_size,) + region.window_shape
        for sid, w in zip(ids, windows):
            np.testing.assert_array_equal(w, np_pad_sample(np.load(files[sid]), region), err_msg=f"sample {sid}")

    # the same number of steps on every rank; the same sample ids within a sample group, every step
    everyone = [None] * world_size
    dist.all_gather_object(everyone, (layout.batch_index, [s[0].tolist() for s in steps]))
    assert len({len(ids) for _, ids in everyone}) == 1, f"step counts differ: {[len(i) for _, i in everyone]}"
    mine = [s[0].tolist() for s in steps]
    for b, ids in everyone:
        if b == layout.batch_index:
            assert ids == mine
    # every sample arrives in the epoch, in some sample group
    real = {sid for b, ids in everyone for step in ids for sid in step}
    assert real == set(range(len(files)))

    if dtensor:  # halo stripped, gathered: the global batch of the first step
        dt = to_dtensor(torch.from_numpy(steps[0][2]), layout, source.sample_shape, device_mesh)
        groups = sorted({(b, tuple(ids[0])) for b, ids in everyone})
        expected = np.concatenate([np.stack([np.load(files[s]) for s in sids]) for _, sids in groups])
        np.testing.assert_array_equal(dt.full_tensor().numpy(), expected)

    # resume mid-epoch from a DALI checkpoint: the rest of the epoch and the next epoch are identical
    # to the uninterrupted loader's
    if resume_after is not None:
        assert state is not None, f"an epoch of {len(steps)} steps, none after step {resume_after}"
        resumed = MeshLoader(make, layout, sample_shape=source.sample_shape)
        resumed.load_state_dict(state)
        rest = _epoch(resumed)
        assert len(rest) == len(steps) - resume_after
        for (a_ids, a_pad, a_win), (b_ids, b_pad, b_win) in zip(rest, steps[resume_after:]):
            np.testing.assert_array_equal(a_ids, b_ids)
            np.testing.assert_array_equal(a_pad, b_pad)
            np.testing.assert_array_equal(a_win, b_win)
        resumed.reset()
        next_epoch = _epoch(resumed)
        expected_ids = [source.order(1)[0][i:i + batch_size].tolist() for i in range(0, len(source), batch_size)]
        assert [s[0].tolist() for s in next_epoch] == expected_ids


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_world4_mesh_2x2_windows_groups_steps_dtensor_resume(tmp_path):
    # 7 samples over 2 sample groups: not divisible, so one group pads; halo + periodic on W
    files = _write_samples(str(tmp_path), 7, (3, 10, 12))
    layout_kwargs = {"shard": {"model_parallel": 1}, "halo": {1: 2, 2: 1}, "boundary": {1: "reflect", 2: "periodic"}}
    run_ranks(_check_rank, 4, tmp_path, (2, 2), ("data_parallel", "model_parallel"), layout_kwargs, files, 2, 1,
              True, timeout_s=200)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_world8_two_model_parallel_dims_shard_h_and_w_periodic_w(tmp_path):
    files = _write_samples(str(tmp_path), 5, (2, 9, 14))
    layout_kwargs = {"shard": {"h": 1, "w": 2}, "batch": "data_parallel", "halo": {1: 1, 2: 3},
                     "boundary": {1: "constant", 2: "periodic"}, "fill_value": -5.0}
    run_ranks(_check_rank, 8, tmp_path, (2, 2, 2), ("data_parallel", "h", "w"), layout_kwargs, files, 1, None,
              False, timeout_s=280)


def _demo(argv, tmp_path, monkeypatch, capsys):
    """``dali-mesh demo`` run in this process (its ranks fork from the launcher's fork server, started
    once for the suite, instead of a new interpreter importing torch and DALI and starting its own:
    about 15 s of 2 cores each; tests/cli/test_demo.py does the same, and its bad-argument tests run
    ``python -m dali_mesh.cli``): ``(exit code, stdout, stderr)``."""
    from dali_mesh.cli import main

    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    code = main(["demo"] + argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_demo_runs_and_verifies(tmp_path, monkeypatch, capsys):
    code, out, err = _demo(["--nproc", "4", "--samples", "6", "--shape", "2,32,16", "--batch-size", "1",
                            "--timeout", "200"], tmp_path, monkeypatch, capsys)
    assert code == 0, out + err
    last = out.strip().splitlines()[-1]
    assert last.startswith("each rank read ") and last.endswith("of full-sample loading; all 6 samples verified")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_demo_fails_when_a_reader_fails(tmp_path, monkeypatch, capsys):
    code, out, err = _demo(["--nproc", "2", "--mesh", "model_parallel=2", "--shard", "model_parallel=1",
                            "--samples", "4", "--shape", "2,8,8", "--fail-rank", "1", "--timeout", "100"],
                           tmp_path, monkeypatch, capsys)
    assert code != 0
    assert "deliberate failure (--fail-rank)" in err and "sample_00000.npy" in err, out + err


def _dtensor_loader_rank(rank, world_size, files, batch_size):
    import h5py
    import torch.distributed as dist
    from nvidia.dali import pipeline_def
    from torch.distributed.device_mesh import init_device_mesh

    from dali_mesh import ForecastSpec, HDF5Source, Layout, MeshInfo
    from dali_mesh.pipeline.external import partitioned_source
    from dali_mesh.torch import MeshLoader

    device_mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("data_parallel", "model_parallel"))
    layout = Layout(MeshInfo.from_device_mesh(device_mesh), shard={"model_parallel": 2}, halo={1: 1, 2: 2},
                    boundary={2: "periodic"})
    source = HDF5Source(files, "fields", layout, batch_size=batch_size, seed=5,
                        forecast=ForecastSpec(history=1, lead=2))

    @pipeline_def(batch_size=batch_size, num_threads=1, device_id=None, py_num_workers=1, py_start_method="spawn",
                  prefetch_queue_depth=1)
    def pipe():
        return partitioned_source(source)

    loader = MeshLoader(pipe(), layout, output_map=source.output_names, output="dtensor",
                        device_mesh=device_mesh, sample_shape=source.sample_shape)
    steps = 0
    series = np.concatenate([h5py.File(f, "r")["fields"][:] for f in files])  # time runs across the files
    for batch in loader:
        steps += 1
        ids = [None] * world_size
        dist.all_gather_object(ids, (layout.batch_index, batch["sample_id"].tolist()))
        groups = [i for b, i in sorted(set((b, tuple(i)) for b, i in ids))]
        t = [[source.step_of(s) for s in g] for g in groups]
        expected_in = np.concatenate([np.stack([series[s - 1:s + 1] for s in g]) for g in t])
        expected_tg = np.concatenate([np.stack([series[s + 1:s + 3] for s in g]) for g in t])
        np.testing.assert_array_equal(batch["input"].full_tensor().numpy(), expected_in)
        np.testing.assert_array_equal(batch["target"].full_tensor().numpy(), expected_tg)
    assert steps == len(source) // batch_size


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_world4_meshloader_dtensor_output_with_forecast_steps(tmp_path):
    h5py = pytest.importorskip("h5py")
    rng = np.random.default_rng(0)
    files = []
    for year, steps in ((2020, 4), (2021, 5)):  # a forecast sample may cross the two files
        f = str(tmp_path / f"{year}.h5")
        with h5py.File(f, "w") as h:
            h.create_dataset("fields", data=rng.standard_normal((steps, 2, 6, 10)).astype(np.float32),
                             chunks=(1, 2, 3, 5))
        files.append(f)
    run_ranks(_dtensor_loader_rank, 4, tmp_path, files, 2, timeout_s=200)


@pytest.mark.timeout(240)
def test_demo_on_a_dataset_of_variables_and_levels(tmp_path, monkeypatch, capsys):
    """dali-mesh demo --data STORE --channels: an xarray-written Zarr group (zstd chunks), read natively
    by read_dataset on every rank, every window checked against the whole fields."""
    xr = pytest.importorskip("xarray")
    pd = pytest.importorskip("pandas")
    rng = np.random.default_rng(3)
    ds = xr.Dataset({"t2m": (("time", "latitude", "longitude"), rng.standard_normal((6, 10, 8)).astype("f4")),
                     "z": (("time", "level", "latitude", "longitude"), rng.standard_normal((6, 3, 10, 8)).astype("f4"))},
                    coords={"time": pd.date_range("2020-01-01", periods=6, freq="6h"), "level": [500, 700, 850]})
    store = str(tmp_path / "wb2.zarr")
    ds.to_zarr(store, zarr_format=3, mode="w", consolidated=False,
               encoding={"t2m": {"chunks": (1, 10, 8)}, "z": {"chunks": (1, 1, 5, 8)}})
    code, out, err = _demo(["--nproc", "2", "--mesh", "mp=2", "--shard", "mp=1", "--data", store, "--channels",
                            "t2m,z@850/500", "--batch-size", "1", "--halo", "1=1", "--timeout", "200"],
                           tmp_path, monkeypatch, capsys)
    assert code == 0, out + err
    assert "12 windows checked against the files" in out, out
    assert "reader: native" in out and out.strip().endswith("all 6 samples verified"), out
