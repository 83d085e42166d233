"""Regression tests for defects a hostile-user review reproduced on the Python side (issues 9, 10):
negative channel axes, the watchdog on slow healthy workers, Ctrl-C on run_ranks, Zarr stores
written by convert, explicit sizes equal to chunk's, chunk advice for unequal shards, the watchdog's
reference cycle and the CLI's --allow-external. Each failed before its fix; numpy is the oracle."""
from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import time
import weakref

import numpy as np
import pytest

from dali_mesh import Layout, MeshInfo
from dali_mesh.io import DataFileError
from dali_mesh.io.npy import read_npy_window
from dali_mesh.partition import LayoutError, take_window
from dali_mesh.source import HDF5Source, NumpySource, ZarrSource

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.dirname(os.path.abspath(__file__))


def _one_rank(shard_axis=0):
    return Layout(MeshInfo((1,), ("mp",), (0,)), shard={"mp": shard_axis})


# ---- 1. a negative channel_axis selects channels (it was ignored: all channels came back) ----------------
@pytest.mark.parametrize("channel_axis", [-1, -2, -3])
def test_negative_channel_axis_every_source(tmp_path, channel_axis):
    h5py = pytest.importorskip("h5py")
    zarr = pytest.importorskip("zarr")
    a = np.arange(3 * 5 * 6, dtype="<f4").reshape(3, 5, 6)
    channels = [2, 0] if channel_axis == -3 else [4, 0, 1]
    want = np.take(a, channels, axis=channel_axis)
    np.save(tmp_path / "m.npy", a)
    with h5py.File(tmp_path / "m.h5", "w") as f:
        f.create_dataset("x", data=a[None])
    z = zarr.open_array(str(tmp_path / "m.zarr"), mode="w", shape=(1,) + a.shape, chunks=(1, 2, 2, 4), dtype="<f4")
    z[0] = a
    kw = dict(batch_size=1, shuffle=False, channels=channels, channel_axis=channel_axis)
    layout = Layout(MeshInfo((2,), ("mp",), (1,)), shard={"mp": 1}, halo=1, boundary="periodic")
    sources = {"npy": NumpySource([str(tmp_path / "m.npy")], layout, **kw),
               "npy-mmap": NumpySource([str(tmp_path / "m.npy")], layout, method="mmap", **kw),
               "h5": HDF5Source([str(tmp_path / "m.h5")], "x", layout, **kw),
               "zarr": ZarrSource([str(tmp_path / "m.zarr")], None, layout, **kw)}
    for name, src in sources.items():
        assert src.sample_shape == want.shape, name
        got = src.read_sample(0)[0]
        np.testing.assert_array_equal(got, take_window(want, src.region), err_msg=name)


def test_negative_index_map_in_the_readers(tmp_path):
    a = np.arange(4 * 7, dtype="<i4").reshape(4, 7)
    np.save(tmp_path / "m.npy", a)
    want = a[:, [6, 1, 1]]
    region = _one_rank().region(want.shape)
    for method in ("preadv", "mmap"):
        got = read_npy_window(str(tmp_path / "m.npy"), region, index_maps={-1: [6, 1, 1]}, method=method)
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("channel_axis", [3, -4])
def test_channel_axis_out_of_range_is_refused(tmp_path, channel_axis):
    np.save(tmp_path / "m.npy", np.zeros((2, 3, 4), np.float32))
    with pytest.raises(DataFileError, match=rf"m.npy: channel axis {channel_axis} is out of range for a sample of 3 axes"):
        NumpySource([str(tmp_path / "m.npy")], _one_rank(), channels=[0], channel_axis=channel_axis)


def test_negative_channel_axis_native_reader(tmp_path):
    pytest.importorskip("nvidia.dali")
    from nvidia.dali import pipeline_def

    from dali_mesh.pipeline import native
    from dali_mesh.fn import load_plugin

    try:
        ops = load_plugin()
    except ImportError as e:
        pytest.skip(f"plugin not built: {e}")
    if not hasattr(ops, "read_windows"):
        pytest.skip("the plugin has no read_windows operator")
    a = np.arange(3 * 3 * 6, dtype="<f4").reshape(3, 3, 6)
    np.save(tmp_path / "m.npy", a)
    src = NumpySource([str(tmp_path / "m.npy")], _one_rank(), batch_size=1, shuffle=False,
                      channels=[4, 0], channel_axis=-1)

    @pipeline_def(batch_size=1, num_threads=1, device_id=None)
    def pipe():
        return native.read_windows(src, fallback=False)

    p = pipe()
    p.build()
    np.testing.assert_array_equal(np.array(p.run()[0][0]), np.take(a, [4, 0], axis=-1))


# ---- 2. the first batch may take prefetch_queue_depth + 1 batch times; the build has no deadline ------------
def test_watchdog_deadline_in_batches():
    from dali_mesh.pipeline.watchdog import Watchdog, WorkerError, prefetch_batches

    dog = Watchdog(lambda: [], timeout=0.3, poll_s=0.05)
    try:
        assert dog.call(lambda: time.sleep(0.6) or "ok", batches=3) == "ok"
        assert dog.call(lambda: time.sleep(0.6) or "ok", batches=None) == "ok"
        with pytest.raises(WorkerError, match=r"no progress for 0.3 s .*timeout=0.3 s per batch"):
            dog.call(time.sleep, 0.6)
    finally:
        dog.close()

    class Pipe:
        _prefetch_queue_depth = 2

    assert prefetch_batches(Pipe()) == 3
    Pipe._prefetch_queue_depth = {"cpu": 1, "gpu": 4}
    assert prefetch_batches(Pipe()) == 5
    from dali_mesh.pipeline.registry import info_of

    pipe = Pipe()
    info_of(pipe).source_prefetch = 6  # a parallel source's own queue (partitioned_source records it)
    assert prefetch_batches(pipe) == 7


class SlowSource(NumpySource):
    """A healthy NumpySource whose reads take ``delay`` seconds."""

    delay = 0.0

    def _read(self, sample_id):
        time.sleep(self.delay)
        return super()._read(sample_id)


def test_slow_healthy_pipeline_is_not_killed(tmp_path, monkeypatch):
    pytest.importorskip("nvidia.dali")
    pytest.importorskip("torch")
    from nvidia.dali import pipeline_def

    from dali_mesh.fn import partitioned_source
    from dali_mesh.torch import MeshLoader

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([ROOT, TESTS, os.environ.get("PYTHONPATH", "")]))
    samples = [np.arange(3 * 8, dtype=np.float32).reshape(3, 8) + 100 * i for i in range(4)]
    files = []
    for i, s in enumerate(samples):
        files.append(str(tmp_path / f"s{i}.npy"))
        np.save(files[-1], s)
    layout = Layout(MeshInfo((2,), ("mp",), (1,)), shard={"mp": 1})
    src = SlowSource(files, layout, batch_size=2, shuffle=False)
    src.delay = 1.0  # a batch of 2 on 2 workers: ~1 s; the first batch waits ~3 batch times

    @pipeline_def(batch_size=2, num_threads=1, device_id=None, py_num_workers=2, py_start_method="spawn")
    def pipe():
        return partitioned_source(src)

    # not built: MeshLoader builds it (spawning workers takes seconds here, longer than timeout)
    loader = MeshLoader(pipe(), layout, sample_shape=(3, 8), timeout=1.6)
    try:
        got = {}
        for batch in loader:
            for sid, win in zip(batch["sample_id"].tolist(), batch["window"].numpy()):
                got[sid] = win
    finally:
        loader.close()
    assert sorted(got) == [0, 1, 2, 3]
    for sid, win in got.items():
        np.testing.assert_array_equal(win, take_window(samples[sid], layout.region((3, 8))))


# ---- 3. Ctrl-C on the parent of run_ranks stops every rank and what it started ---------------------------
def _sleeping_rank(rank, world_size, pid_dir):
    child = subprocess.Popen(["sleep", "300"])  # a helper of the rank (as DALI workers are)
    with open(os.path.join(pid_dir, f"{rank}.tmp"), "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
    os.rename(os.path.join(pid_dir, f"{rank}.tmp"), os.path.join(pid_dir, f"{rank}.pids"))
    time.sleep(300)


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_run_ranks_interrupted_stops_every_rank(tmp_path, sig):
    pytest.importorskip("torch")
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    script = textwrap.dedent(f"""
        import sys
        sys.path[:0] = [{ROOT!r}, {TESTS!r}]
        from test_review_fixes import _sleeping_rank
        from dali_mesh.cli.launch import run_ranks
        run_ranks(_sleeping_rank, 2, {str(tmp_path / 'run')!r}, {str(pid_dir)!r}, timeout_s=200)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, TESTS, os.environ.get("PYTHONPATH", "")]))
    parent = subprocess.Popen([sys.executable, "-c", script], env=env, stderr=subprocess.PIPE)
    pids = []
    try:
        end = time.monotonic() + 120
        while len(list(pid_dir.glob("*.pids"))) < 2:
            assert parent.poll() is None, parent.stderr.read().decode()[-2000:]
            assert time.monotonic() < end, "the ranks did not start within 120 s"
            time.sleep(0.1)
        pids = [int(p) for f in pid_dir.glob("*.pids") for p in f.read_text().split()]
        assert all(_alive(p) for p in pids)
        parent.send_signal(sig)
        parent.wait(timeout=30)
        end = time.monotonic() + 10
        while any(_alive(p) for p in pids) and time.monotonic() < end:
            time.sleep(0.1)
        assert not [p for p in pids if _alive(p)], "ranks or their helpers outlived the interrupted parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        for p in pids:
            if _alive(p):
                os.kill(p, signal.SIGKILL)


# ---- 4. a Zarr store written by convert is read without naming its one array -------------------------------
def test_convert_zarr_then_read_without_a_name(tmp_path, capsys):
    zarr = pytest.importorskip("zarr")
    from dali_mesh.cli import main
    from dali_mesh.io import MissingArrayError
    from dali_mesh.io.zarr import open_zarr_array

    a = np.arange(2 * 3 * 8 * 16, dtype="<f4").reshape(2, 3, 8, 16)
    for i in range(2):
        np.save(tmp_path / f"s{i}.npy", a[i])
    out = str(tmp_path / "o.zarr")
    assert main(["convert", str(tmp_path), out, "--mesh", "mp=4", "--shard", "mp=2", "--no-progress"]) == 0
    assert main(["plan", "--data", out, "--mesh", "mp=4", "--shard", "mp=2"]) == 0
    assert "1.00x the window bytes" in capsys.readouterr().out
    layout = Layout(MeshInfo((4,), ("mp",), (2,)), shard={"mp": 2})
    src = ZarrSource([out], None, layout, batch_size=1, shuffle=False)
    for i in range(2):
        np.testing.assert_array_equal(src.read_sample(i)[0], take_window(a[i], src.region))
    # a root group of several arrays: refused, listing them
    g = zarr.open_group(str(tmp_path / "two.zarr"), mode="w")
    g.create_array("a", shape=(2, 3), dtype="f4")
    g.create_array("b", shape=(2, 3), dtype="f4")
    with pytest.raises(MissingArrayError, match=r"holding 2 arrays \['a', 'b'\]: name the one to read"):
        open_zarr_array(str(tmp_path / "two.zarr"))


# ---- 5. explicit sizes equal to chunk's give DTensor placements; negative axes round trip -------------------
def test_explicit_sizes_equal_to_chunk_allow_dtensor():
    mesh = MeshInfo((4,), ("mp",), (1,))
    layout = Layout(mesh, shard={"mp": 1}, split={"mp": [181, 181, 181, 178]})
    assert layout.explicit_matches((3, 721)) and not layout.explicit_matches((3, 721), "even")
    assert layout.placement_spec(2, global_shape=(3, 721)) == (("shard", 2),)
    with pytest.raises(LayoutError, match=r"torch.chunk, which gives \{'mp': \[181, 181, 181, 179\]\} for sample shape \(3, 722\)"):
        layout.placement_spec(2, global_shape=(3, 722))
    with pytest.raises(LayoutError, match="pass global_shape="):
        layout.placement_spec(2)
    other = Layout(mesh, shard={"mp": 1}, split={"mp": [180, 181, 181, 179]})
    with pytest.raises(LayoutError, match="no DTensor for explicit split sizes"):
        other.placement_spec(2, global_shape=(3, 721))
    # nested mesh dims on one axis: chunk of 7 over 2 then 2 is 2,2 | 2,1; a crop is the domain
    nested = Layout(MeshInfo((2, 2), ("a", "b"), (0, 1)), shard={"a": 0, "b": 0}, split={"b": [2, 2, 2, 1]},
                    crop=[(1, None)])
    assert nested.explicit_matches((8,)) and not nested.explicit_matches((9,))
    chunk = Layout(MeshInfo((2, 2), ("a", "b"), (0, 1)), shard={"a": 0, "b": 0}, crop=[(1, None)])
    assert [r.shape for r in nested.regions((8,))] == [r.shape for r in chunk.regions((8,))]


def test_explicit_chunk_sizes_to_dtensor_single_rank(tmp_path):
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from dali_mesh.torch import to_dtensor

    if dist.is_initialized():
        pytest.skip("a process group is already running")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        dm = init_device_mesh("cpu", (1,), mesh_dim_names=("mp",))
        layout = Layout(MeshInfo((1,), ("mp",), (0,)), shard={"mp": 0}, split={"mp": [5]})
        local = torch.arange(2 * 5 * 3, dtype=torch.float32).reshape(2, 5, 3)
        t = to_dtensor(local, layout, (5, 3), dm)
        assert tuple(t.shape) == (2, 5, 3) and torch.equal(t.to_local(), local)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("ndim", [2, 3])
def test_from_placements_round_trip_negative_axes(ndim):
    mesh = MeshInfo((2, 2), ("dp", "mp"), (1, 0))
    layout = Layout(mesh, shard={"mp": -1}, batch="dp", halo={-1: 1}, boundary={-1: "periodic"})
    back = Layout.from_placements(mesh, layout.dtensor_placements(ndim, halo_stripped=True),
                                  halo={ndim - 1: 1}, boundary={ndim - 1: "periodic"})
    assert back == layout.normalized(ndim) and back.same_as(layout, ndim)
    assert back != layout  # equal only for a known ndim: -1 is another axis for another ndim
    assert not back.same_as(layout, ndim + 1)
    shape = (6,) * ndim
    assert back.regions(shape) == layout.regions(shape)
    with pytest.raises(LayoutError, match="out of range"):
        Layout(mesh, shard={"mp": -4}, batch="dp").normalized(3)


# ---- 6. chunk advice for unequal explicit sizes says plainly that no regular grid reads ~1.0x -----------------
def test_advice_for_unequal_explicit_sizes(tmp_path, capsys):
    pytest.importorskip("h5py")
    from dali_mesh.cli.advice import chunk_advice
    from dali_mesh.cli import main

    layout = Layout(MeshInfo((4,), ("mp",)), shard={"mp": 2}, split={"mp": [250, 262, 256, 256]})
    chunks, note = chunk_advice(layout, (4, 64, 1024), 4)
    assert chunks == (1, 4, 64, 262)
    assert "only common chunk width is 2 cells" in note and "256/256/256/256" in note
    # the common width when its chunks are large enough: a grid on every boundary, no note
    chunks, note = chunk_advice(layout, (512, 256, 1024), 4)
    assert chunks == (1, 512, 256, 2) and note is None
    a = np.arange(4 * 64 * 1024, dtype="<f4").reshape(4, 64, 1024)
    np.save(tmp_path / "u.npy", a)
    args = ["--mesh", "mp=4", "--shard", "mp=2", "--split", "mp=250/262/256/256"]
    assert main(["convert", str(tmp_path / "u.npy"), str(tmp_path / "u.h5"), "--no-progress"] + args) == 0
    assert "note: these chunks do not follow every shard boundary" in capsys.readouterr().out
    assert main(["plan", "--data", str(tmp_path / "u.npy")] + args) == 0
    out = capsys.readouterr().out.splitlines()[-1]
    assert out.startswith("advice: no chunk shape aligned with these shards reads ~1.0x") and "~2.05x" in out
    assert main(["plan", "--data", str(tmp_path / "u.h5")] + args) == 0
    out = capsys.readouterr().out.splitlines()[-1]
    assert "The data already has the best regular chunks found ((1, 4, 64, 262), ~2.05x)" in out
    assert "store the data chunked" not in out
    np.testing.assert_array_equal(__import__("h5py").File(tmp_path / "u.h5")["data"][0], a)


# ---- 7. watched_run holds the pipeline weakly; the CLI has --allow-external ---------------------------------
def test_watched_run_leaves_no_reference_cycle():
    pytest.importorskip("nvidia.dali")
    from nvidia.dali import fn, pipeline_def

    from dali_mesh.pipeline.watchdog import watched_run

    @pipeline_def(batch_size=1, num_threads=1, device_id=None)
    def pipe():
        return fn.external_source(source=lambda: [np.arange(3, dtype=np.float32)], batch=True)

    p = pipe()
    p.build()
    np.testing.assert_array_equal(np.array(watched_run(p, timeout=30)[0][0]), np.arange(3, dtype=np.float32))
    gc.collect()
    gc.disable()
    try:
        ref = weakref.ref(p)
        del p
        assert ref() is None, "the watchdog keeps a dropped pipeline (and its workers) alive"
    finally:
        gc.enable()


def test_cli_allow_external(tmp_path, capsys):
    h5py = pytest.importorskip("h5py")
    from dali_mesh.cli import main

    raw = np.arange(16, dtype="<f4")
    raw.tofile(tmp_path / "raw.bin")
    with h5py.File(tmp_path / "ext.h5", "w") as f:
        f.create_dataset("x", shape=(1, 4, 4), dtype="<f4", external=[(str(tmp_path / "raw.bin"), 0, raw.nbytes)])
    args = ["--mesh", "mp=1", "--shard", "mp=0"]
    assert main(["plan", "--data", str(tmp_path / "ext.h5")] + args) == 2
    assert "pass allow_external=True (dali-mesh commands: --allow-external)" in capsys.readouterr().err
    assert main(["plan", "--data", str(tmp_path / "ext.h5"), "--allow-external"] + args) == 0
    assert main(["convert", str(tmp_path / "ext.h5"), str(tmp_path / "o.h5"), "--no-progress"] + args) == 2
    capsys.readouterr()
    assert main(["convert", str(tmp_path / "ext.h5"), str(tmp_path / "o.h5"), "--no-progress",
                 "--allow-external"] + args) == 0
    with h5py.File(tmp_path / "o.h5") as f:
        np.testing.assert_array_equal(f["data"][0], raw.reshape(4, 4))
