"""An Icechunk source in a forked process (dali_mesh/storage/icechunk/, dali_mesh/pipeline/external.py): the
icechunk library (1.1.21) waits for ever in a process forked from one that used it (its runtime's threads are
not in the child), so a store there refuses at its first read, before calling the library, naming the
repository and the start methods that work; DALI pipelines with forked workers over such a source are refused
when defined, and a worker's refusal reaches ``pipe.run()``; torch's DataLoader with forked workers raises it.
Every child here runs under a hard timeout (a join, a killed process group, the loader's ``timeout``), so a
regression fails instead of hanging. The advice is checked too: a spawned DataLoader's windows equal
zarr-python's on the same snapshot."""
from __future__ import annotations

import multiprocessing as mp
import pickle

import numpy as np
import pytest

from tests.helpers import SEED, mesh_of, run_python_bounded

icechunk = pytest.importorskip("icechunk")
from dali_mesh.storage.icechunk import ForkedProcessError  # noqa: E402

icechunk.set_logs_filter("error")  # a local repository warns at every open that it is not for concurrent commits
#: one array (time, lat, lon) in chunks no split follows; each child's join waits this long at most (s)
SHAPE, CHUNKS, JOIN_S = (3, 10, 6), (1, 4, 4), 60


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    """A local repository with one commit of a dataset xarray wrote (``t2m`` over time, lat, lon, random with
    the seed in SEED): ``(path, snapshot, values)`` with ``t2m`` as zarr-python reads it from the library's own
    store."""
    import pandas as pd
    import xarray as xr
    import zarr

    path = str(tmp_path_factory.mktemp("icefork") / "repo")
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(path))
    session = repo.writable_session("main")
    values = np.random.default_rng(SEED).standard_normal(SHAPE).astype("<f4")
    ds = xr.Dataset({"t2m": (("time", "lat", "lon"), values)},
                    coords={"time": pd.date_range("2020-01-01", periods=SHAPE[0], freq="6h"),
                            "lat": np.linspace(80, -80, SHAPE[1]), "lon": np.arange(SHAPE[2]) * 60.0})
    ds["t2m"].encoding["chunks"] = CHUNKS
    ds.to_zarr(session.store, consolidated=False, zarr_format=3)
    snapshot = session.commit("one")
    oracle = zarr.open_array(repo.readonly_session(snapshot_id=snapshot).store, path="t2m", mode="r")[...]
    return path, snapshot, oracle


def _source(path: str, rank: int = 1, **kw):
    from dali_mesh import Layout, ZarrSource

    layout = Layout(mesh_of((1, 2), (0, rank)), shard={"m0": 1}, halo={1: 1}, boundary={1: "periodic"})
    return ZarrSource([f"icechunk://{path}"], "t2m", layout, batch_size=1, shuffle=False, **kw)


def _check_refusal(text: str, path: str) -> None:
    """The refusal names the repository, why, and what to do (spawn, forkserver)."""
    assert f"icechunk://{path}" in text, text
    assert "forked from a process" in text and "icechunk library" in text, text
    assert 'py_start_method="spawn"' in text and 'multiprocessing_context="spawn" (or "forkserver")' in text, text


# ---- a forked child ---------------------------------------------------------------------------------------
def _child(conn, how: str, path: str, pickled: bytes | None, src) -> None:
    """Reads sample 0 the way ``how`` says; sends back ``(class name, message)`` of what it raised, or the
    window."""
    try:
        if how == "resolved here":
            got = _source(path).read_sample(0)[0]
        elif how == "unpickled here":
            got = pickle.loads(pickled).read_sample(0)[0]
        else:  # the parent's source object itself, with what it opened (a zarr array, the session)
            got = src.read_sample(0)[0]
        conn.send(("read", got))
    except BaseException as e:  # noqa: BLE001 - anything, to the parent
        conn.send((type(e).__name__, str(e)))
    finally:
        conn.close()


def _in_forked_child(*args):
    """``_child(*args)`` in a forked process, its answer; the process killed if it does not end in JOIN_S."""
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, *args))
    proc.start()
    try:
        if not parent.poll(JOIN_S):
            pytest.fail(f"the forked child neither read nor raised within {JOIN_S} s ({args[0]})")
        return parent.recv()
    finally:
        proc.join(5)
        if proc.is_alive():
            proc.kill()
            proc.join()


@pytest.mark.parametrize("how", ["the parent's source, read there", "the parent's source, unread",
                                 "unpickled here", "resolved here"])
def test_a_forked_child_refuses_at_its_first_read_naming_the_repository_and_spawn(repository, how):
    """Whatever the child holds (a source the parent read, with its open zarr array over the parent's session;
    one it only built; its pickle; a location it resolves itself), the first read refuses, naming the
    repository; the parent reads on, equal to zarr-python."""
    from dali_mesh.partition import take_window

    path, _, oracle = repository
    src = _source(path)
    if how == "the parent's source, read there":
        np.testing.assert_array_equal(src.read_sample(0)[0], take_window(oracle[0], src.region))
    kind, text = _in_forked_child(how, path, pickle.dumps(src), src)
    assert kind == "ForkedProcessError", (kind, text)
    _check_refusal(text, path)
    for t in range(SHAPE[0]):  # the parent is not harmed: its session still reads
        np.testing.assert_array_equal(src.read_sample(t)[0], take_window(oracle[t], src.region),
                                      err_msg=f"step {t}, seed {SEED}")


def test_the_refusal_survives_pickling_with_its_class_and_path(repository):
    path, snapshot, _ = repository
    err = ForkedProcessError(f"icechunk://{path}@{snapshot}", "cannot be read in this process")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is ForkedProcessError and back.path == err.path and str(back) == str(err)


_FORK_AFTER = """
import os, sys
import numpy as np
import icechunk
import dali_mesh  # registers the store's check at fork; the library is not imported by it
icechunk.set_logs_filter("error")
path, step = sys.argv[1], int(sys.argv[2])
if sys.argv[3] == "used":  # the user's own call of the library, before the loader forks
    icechunk.Repository.open(icechunk.local_filesystem_storage(path))
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    from dali_mesh import Layout, ZarrSource
    from tests.helpers import mesh_of
    try:
        layout = Layout(mesh_of((1, 2), (0, 1)), shard={"m0": 1}, halo={1: 1}, boundary={1: "periodic"})
        src = ZarrSource(["icechunk://" + path], "t2m", layout, batch_size=1, shuffle=False)
        np.save(sys.argv[4], src.read_sample(step)[0])
        msg = "read"
    except BaseException as e:
        msg = type(e).__name__ + ": " + str(e)
    os.write(w, msg.encode())
    os._exit(0)
os.close(w)
print(os.read(r, 100000).decode())
os.waitpid(pid, 0)
"""


@pytest.mark.parametrize("parent", ["used", "imported"])
def test_a_child_of_a_process_that_used_the_library_itself_refuses_and_of_one_that_imported_it_reads(
        repository, parent, tmp_path):
    """A process that used the icechunk library without dali_mesh (a repository opened to look at), then
    forked: its child's source refuses at once instead of waiting for ever. A process that only imported the
    library has started nothing: its child reads, equal to zarr-python."""
    from dali_mesh.partition import take_window

    path, _, oracle = repository
    out = str(tmp_path / "window.npy")
    stdout, stderr = run_python_bounded(_FORK_AFTER, path, "2", parent, out, timeout=JOIN_S)
    if parent == "used":
        assert stdout.startswith("ForkedProcessError: "), (stdout, stderr[-2000:])
        _check_refusal(stdout, path)
    else:
        assert stdout.strip() == "read", (stdout, stderr[-2000:])
        want = take_window(oracle[2], _source(path).region)
        np.testing.assert_array_equal(np.load(out), want, err_msg=f"seed {SEED}")


# ---- DALI ---------------------------------------------------------------------------------------------------
def test_dali_pipelines_with_forked_workers_over_a_repository_are_refused_when_defined(repository, tmp_path,
                                                                                      monkeypatch):
    """A native read_windows with forked workers is taken (no worker reads the store); ``partitioned_source``,
    and ``read_windows`` / ``read_dataset`` falling back to it (a store made not native here), refuse a pipeline whose py_start_method is "fork" (DALI's default), naming the repository and spawn;
    the same definitions with "spawn" are taken."""
    pytest.importorskip("nvidia.dali")
    from nvidia.dali import pipeline_def

    from dali_mesh import MeshInfo, NamedLayout, ZarrDatasetSource
    from dali_mesh.pipeline.dataset_reader import read_dataset
    from dali_mesh.pipeline.external import partitioned_source
    from dali_mesh.pipeline.native import read_windows

    path, snapshot, _ = repository
    src = _source(path)
    layout = NamedLayout(MeshInfo((2,), ("mp",), (0,)), shard={"mp": "lat"})
    dataset = ZarrDatasetSource(f"icechunk://{path}", ["t2m"], layout, shuffle=False, batch_size=1)
    readers = {"partitioned_source": lambda: partitioned_source(src),
               "read_windows": lambda: read_windows(src)[:1],
               "read_dataset": lambda: read_dataset(dataset)[:1]}

    # read natively (the reader's threads in this process call the library): forked workers read nothing
    @pipeline_def(batch_size=1, num_threads=1, device_id=None, py_num_workers=1, py_start_method="fork")
    def native_pipe():
        return read_windows(src, fallback=False)[:1]

    native_pipe()
    # where the native reader cannot read the store, read_windows and read_dataset fall back to the workers
    from dali_mesh.storage.icechunk import IcechunkStore

    monkeypatch.setattr(IcechunkStore, "native", False)
    for what, read in readers.items():
        for method in ("fork", "spawn"):
            @pipeline_def(batch_size=1, num_threads=1, device_id=None, py_num_workers=1, py_start_method=method)
            def pipe():
                return read()

            if method == "spawn":
                pipe()  # defined; not built (spawning workers is the checkpoint test's, test_icechunk.py)
                continue
            with pytest.raises(ValueError, match=rf"icechunk://{path}@{snapshot} \(IcechunkStore\) cannot be read by "
                                                 r"forked workers \(the pipeline's py_start_method is 'fork'.*"
                                                 r'py_start_method="spawn"'):
                pipe()


_DALI_WORKER = """
import sys
import numpy as np
from nvidia.dali import fn, pipeline_def, types
from dali_mesh import Layout, ZarrSource
from dali_mesh.source import pipeline_reader
from tests.helpers import mesh_of
layout = Layout(mesh_of((1, 2), (0, 1)), shard={"m0": 1})
src = ZarrSource(["icechunk://" + sys.argv[1]], "t2m", layout, batch_size=1, shuffle=False)
src.read_sample(0)  # the parent has read: its session and zarr array are what the worker inherits

@pipeline_def(batch_size=1, num_threads=1, device_id=None, py_num_workers=1, py_start_method="fork",
              prefetch_queue_depth=1)
def pipe():  # the source straight into DALI (not partitioned_source, which refuses this at definition)
    return tuple(fn.external_source(source=pipeline_reader(src), num_outputs=src.num_outputs, batch=False,
                                    parallel=True, dtype=[types.to_dali_type(d) for d in src.output_dtypes],
                                    ndim=list(src.output_ndims)))

p = pipe()
p.build()
try:
    p.run()
    print("ran")
except Exception as e:
    print("raised", type(e).__name__, str(e))
"""


def test_a_forked_dali_workers_refusal_reaches_pipe_run(repository):
    """A parallel external source over the repository defined by hand with forked workers: the worker's
    refusal comes out of ``pipe.run()`` as an exception naming the repository and spawn, within the
    timeout (the process group is killed otherwise: the defect was a wait for ever)."""
    pytest.importorskip("nvidia.dali")
    path, _, _ = repository
    stdout, stderr = run_python_bounded(_DALI_WORKER, path, timeout=JOIN_S)
    assert stdout.startswith("raised "), (stdout, stderr[-3000:])
    assert "ForkedProcessError" in stdout, stdout
    _check_refusal(stdout, path)


# ---- torch's DataLoader ----------------------------------------------------------------------------------------
class Windows:
    """A map-style dataset of a source's windows (what a user wraps a source in for torch's DataLoader)."""

    def __init__(self, src) -> None:
        self.src = src

    def __len__(self) -> int:
        return self.src.num_samples

    def __getitem__(self, i: int):
        return self.src.read_sample(i)[0]


def test_torch_dataloader_with_forked_workers_raises_the_refusal(repository):
    """DataLoader(num_workers=1, multiprocessing_context="fork") over the source (read in the parent first):
    the worker's refusal comes out of the loader, naming the repository and spawn; the loader's own timeout
    bounds a regression's wait."""
    torch = pytest.importorskip("torch")
    path, _, _ = repository
    src = _source(path)
    src.read_sample(0)
    loader = torch.utils.data.DataLoader(Windows(src), batch_size=None, num_workers=1, timeout=JOIN_S,
                                         multiprocessing_context="fork")
    # torch raises a RuntimeError with the worker's traceback for an exception it cannot rebuild from text
    with pytest.raises(RuntimeError, match=r"Caught ForkedProcessError in DataLoader worker") as info:
        list(loader)
    _check_refusal(str(info.value), path)


def test_torch_dataloader_with_spawned_workers_reads_every_window_as_zarr_python(repository, monkeypatch):
    """What the refusal advises: spawned DataLoader workers read every window, equal to zarr-python's."""
    torch = pytest.importorskip("torch")
    from dali_mesh.partition import take_window
    from tests.helpers import ROOT

    monkeypatch.setenv("PYTHONPATH", ROOT)  # the spawned worker imports this module (the dataset's class)
    path, _, oracle = repository
    src = _source(path)
    src.read_sample(0)
    loader = torch.utils.data.DataLoader(Windows(src), batch_size=None, num_workers=1, timeout=JOIN_S,
                                         multiprocessing_context="spawn")
    got = [np.asarray(w) for w in loader]
    assert len(got) == SHAPE[0]
    for t, window in enumerate(got):
        np.testing.assert_array_equal(window, take_window(oracle[t], src.region), err_msg=f"step {t}, seed {SEED}")
