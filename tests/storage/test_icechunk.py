"""The Icechunk store (dali_mesh/storage/icechunk/): the shared store tests over a repository's snapshot;
repositories written here by the ``icechunk`` library (zarr-python writing into a writable session: native
chunks Zstd and Blosc, two commits, a tag), read by ``ZarrSource`` on every rank of 2- and 4-way splits with
halo at a branch, a tag and a snapshot id, equal to xarray reading the same snapshot (``xarray.open_zarr`` of
the session's store); a commit during an epoch, a pickled source and a checkpoint resumed after a new commit
read the snapshot they were pinned to; unknown and expired snapshots named; a repository in S3 (moto)."""
from __future__ import annotations

import datetime
import os
import pickle
import sys

import numpy as np
import pytest

from dali_mesh.storage import DataFileError, MissingFileError, NotRegularFileError, store_of
from tests.helpers import SEED, mesh_of
from tests.storage.s3_server import REGION, icechunk_storage, options, s3_endpoint  # noqa: F401 - s3_endpoint: a fixture
from tests.storage.store_tests import FileObjectTests, StoreTests

icechunk = pytest.importorskip("icechunk")
from dali_mesh.storage.icechunk import IcechunkStore  # noqa: E402

icechunk.set_logs_filter("error")  # a local repository warns at every open that it is not for concurrent commits
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: the arrays of the repositories: (time, lat, lon), chunks that no split's boundary follows
SHAPE, CHUNKS = (3, 18, 20), (1, 7, 8)


def _codecs():
    import zarr

    return {"t2m": zarr.codecs.ZstdCodec(level=3),
            "z": zarr.codecs.BloscCodec(cname="lz4", clevel=5, shuffle="bitshuffle", typesize=4)}


def _commit(repo, values: dict, message: str) -> str:
    """Writes ``values`` (name -> array) into the branch ``main`` with zarr-python and commits; the
    snapshot id."""
    import zarr

    session = repo.writable_session("main")
    group = zarr.open_group(session.store, mode="a")
    for name, x in values.items():
        if name in group:
            group[name][...] = x
        else:
            arr = group.create_array(name, shape=x.shape, chunks=CHUNKS, dtype=x.dtype, compressors=_codecs()[name],
                                     dimension_names=("time", "lat", "lon"))
            arr[...] = x
    return session.commit(message)


def _values(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(SHAPE).astype("<f4") for name in ("t2m", "z")}


def _oracle(repo, **version) -> dict:
    """Every array of the snapshot as xarray reads it from the library's own store."""
    import xarray as xr

    ds = xr.open_zarr(repo.readonly_session(**version).store, consolidated=False)
    return {name: ds[name].values for name in ds.data_vars}


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    """A local repository with two commits to ``main`` (every value changed) and the tag ``v1`` on the
    first: ``(path, repo, first snapshot, second snapshot)``."""
    path = str(tmp_path_factory.mktemp("ice") / "repo")
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(path))
    first = _commit(repo, _values(SEED), "first")
    repo.create_tag("v1", first)
    second = _commit(repo, _values(SEED + 1), "second")
    return path, repo, first, second


def _source(location, ranks: int, rank: int, halo: int = 2, boundary: str = "constant", name="t2m", **kw):
    from dali_mesh import Layout, ZarrSource

    layout = Layout(mesh_of((1, ranks), (0, rank)), shard={"m0": 0}, halo={0: halo}, boundary={0: boundary})
    return ZarrSource([location], name, layout, batch_size=1, shuffle=False, **kw)


def _check_windows(src, oracle: np.ndarray, what: str) -> None:
    from dali_mesh.partition import take_window

    for t in range(len(oracle)):
        np.testing.assert_array_equal(src.read_sample(t)[0], take_window(oracle[t], src.region),
                                      err_msg=f"{what}, step {t}, seed {SEED}")


# ---- the shared store tests ------------------------------------------------------------------------------
class TestIcechunkStore(StoreTests, FileObjectTests):
    """A store is pinned to the snapshot it was resolved at, so the fixture commits every key the tests put
    (``<name>/c/0``: the one chunk of an uncompressed uint8 array ``name``, the test's ``data``) before it
    resolves the store, and a put checks that the snapshot holds them."""

    NAMES = "abcdefgh"

    @pytest.fixture
    def store(self, tmp_path_factory, data):
        import zarr
        from zarr.core.buffer import default_buffer_prototype

        # not tmp_path: its name is the test's ("...names_no_secret"), and the spec names the repository
        path = str(tmp_path_factory.mktemp("store") / "repo")
        self.repo = icechunk.Repository.create(icechunk.local_filesystem_storage(path))
        session = self.repo.writable_session("main")
        group = zarr.open_group(session.store, mode="w")
        for name in self.NAMES:
            group.create_array(name, shape=(len(data),), chunks=(len(data),), dtype="u1", compressors=None)
            zarr.core.sync.sync(session.store.set(f"{name}/c/0", default_buffer_prototype().buffer.from_bytes(data)))
        session.commit("the objects of the store tests")
        self.data = data
        store, key = store_of(f"icechunk://{path}")
        assert isinstance(store, IcechunkStore) and key == ""
        return store

    def put(self, store, name, data):
        assert data == self.data and name in self.NAMES  # committed by the fixture
        return f"{name}/c/0"

    def missing_key(self, store):
        return "nothing/zarr.json"

    def test_a_rewrite_while_open_is_a_new_version_and_refused(self, store, data):
        """Not applicable as written: a snapshot's objects are never rewritten (a commit makes another
        snapshot), so an object opened is read as it was, after a commit too, and the store's versions stay."""
        import zarr

        key = self.put(store, "e", data)
        before = store.stat(key)
        with store.open(key) as obj:
            session = self.repo.writable_session("main")
            zarr.open_array(session.store, path="e")[...] = np.frombuffer(data[::-1], "u1")
            session.commit("rewrite e")
            assert obj.pread(len(data), 0) == data
            obj.check_unchanged()
        assert store.stat(key) == before and store.read_range(key, 0, 1 << 20) == data
        again, _ = store_of(f"icechunk://{store.repository}")  # the branch's new snapshot: the new bytes
        assert again.snapshot != store.snapshot and again.read_range(key, 0, 1 << 20) == data[::-1]


def test_names_specs_and_listing_name_the_snapshot(repository):
    path, repo, first, second = repository
    store, _ = store_of(f"icechunk://{path}")
    assert store.snapshot == second == repo.lookup_branch("main")
    assert store.spec == f"icechunk;repo={path};snapshot={second}"
    assert store.name_of("t2m/zarr.json") == f"icechunk://{path}@{second}/t2m/zarr.json"
    objects, prefixes = store.list("", delimiter=True)
    assert [k for k, _ in objects] == ["zarr.json"] and prefixes == ["t2m/", "z/"]
    assert store.list("t2m/c/", delimiter=True) == ([], ["t2m/c/0/", "t2m/c/1/", "t2m/c/2/"])
    objects, prefixes = store.list("/t2m/", delimiter=True)  # a zarr store over it asks with the root's "/"
    assert [k for k, _ in objects] == ["/t2m/zarr.json"] and prefixes == ["/t2m/c/"]
    chunks, _ = store.list("t2m/c/", delimiter=False)
    # every chunk of the (3, 18, 20) array in chunks of (1, 7, 8), by its v3 key
    assert [k for k, _ in chunks] == sorted(f"t2m/c/{t}/{i}/{j}" for t in range(3) for i in range(3) for j in range(3))
    for key, version in chunks[:4]:  # the sizes the library's own store gives
        assert version.size == len(store.read_range(key, 0, 1 << 30)) > 0


# ---- every window of every rank, at a branch, a tag and a snapshot id -----------------------------------
@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("version", ["branch", "tag", "snapshot", "in the location"])
def test_every_window_of_every_rank_equals_xarray_on_the_same_snapshot(repository, ranks, version):
    path, repo, first, second = repository
    chosen = {"branch": ({"branch": "main"}, second), "tag": ({"tag": "v1"}, first),
              "snapshot": ({"snapshot": first}, first), "in the location": ({}, second)}
    opts, snapshot = chosen[version]
    location = f"icechunk://{path}@{second}" if version == "in the location" else f"icechunk://{path}"
    oracle = _oracle(repo, snapshot_id=snapshot)
    other = _oracle(repo, snapshot_id=first if snapshot == second else second)
    assert not np.array_equal(oracle["t2m"], other["t2m"])  # the two snapshots differ everywhere
    for name in ("t2m", "z"):
        for rank in range(ranks):
            boundary = ("constant", "periodic", "reflect", "edge")[rank % 4]
            src = _source(location, ranks, rank, name=name, boundary=boundary, storage_options=opts)
            assert str(src.files[0]) == f"icechunk://{path}@{snapshot}"
            if rank == ranks - 1:  # what DALI's worker processes get
                src = pickle.loads(pickle.dumps(src))
            _check_windows(src, oracle[name], f"{name} at {version}, rank {rank} of {ranks}, {boundary}")


def test_a_commit_during_an_epoch_does_not_change_the_windows(tmp_path):
    path = str(tmp_path / "repo")
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(path))
    old = _values(SEED)
    pinned = _commit(repo, old, "first")
    src = _source(f"icechunk://{path}", 2, 1)  # the branch main, resolved here
    worker = pickle.loads(pickle.dumps(src))
    _check_windows(src, old["t2m"][:1], "before the commit")
    new = _values(SEED + 7)
    newer = _commit(repo, new, "during the epoch")
    assert newer != pinned
    for s, what in ((src, "the source"), (worker, "its pickle")):
        _check_windows(s, old["t2m"], f"{what}, after a commit during the epoch")
        assert s.fingerprint()["files"] == [f"icechunk://{path}@{pinned}"]
    # the commit is real: a source resolved now reads it
    _check_windows(_source(f"icechunk://{path}", 2, 1), new["t2m"], "a source made after the commit")


def test_a_checkpoint_resumed_after_a_new_commit_reads_the_recorded_snapshot(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    pytest.importorskip("nvidia.dali")
    from nvidia.dali import pipeline_def

    from dali_mesh.partition import take_window
    from dali_mesh.pipeline.external import partitioned_source
    from dali_mesh.torch import MeshLoader

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))  # spawned workers

    def loader(location):
        src = _source(location, 2, 0)
        src.batch_size = 1

        def make(checkpoint=None):
            @pipeline_def(batch_size=1, num_threads=1, device_id=None, py_num_workers=1, py_start_method="spawn",
                          enable_checkpointing=True, prefetch_queue_depth=1)
            def pipe():
                return partitioned_source(src)

            return pipe(checkpoint=checkpoint)

        return MeshLoader(make, src.layout), src

    path = str(tmp_path / "repo")
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(path))
    old = _values(SEED)
    recorded = _commit(repo, old, "first")
    first, src = loader(f"icechunk://{path}")
    next(first)
    state = first.state_dict()
    assert state["fingerprint"]["sources"][0]["files"] == [f"icechunk://{path}@{recorded}"]
    del first
    _commit(repo, _values(SEED + 3), "after the checkpoint")
    at_branch, _ = loader(f"icechunk://{path}")  # the branch has moved: another snapshot, refused
    with pytest.raises(ValueError, match=rf"files\[0\]: checkpoint '.*@{recorded}', this loader '.*@(?!{recorded})"):
        at_branch.load_state_dict(state)
    resumed, src = loader(state["fingerprint"]["sources"][0]["files"][0])  # the recorded location: that snapshot
    resumed.load_state_dict(state)
    batch = next(resumed)
    t = int(batch["sample_id"][0])
    assert t == 1
    np.testing.assert_array_equal(np.asarray(batch["window"][0]), take_window(old["t2m"][t], src.region))


# ---- versions and repositories that are not there -------------------------------------------------------
def test_an_unknown_snapshot_tag_or_branch_is_named(repository):
    path = repository[0]
    unknown = "0" * 19 + "1"
    with pytest.raises(DataFileError, match=rf"icechunk://{path}: has no snapshot '{unknown}' .*expired"):
        store_of(f"icechunk://{path}", {"snapshot": unknown})
    with pytest.raises(DataFileError, match=rf"has no snapshot '{unknown}'"):
        store_of(f"icechunk://{path}@{unknown}/t2m")
    with pytest.raises(DataFileError, match=r"has no tag 'v9' \(ref not found"):
        store_of(f"icechunk://{path}", {"tag": "v9"})
    with pytest.raises(DataFileError, match=r"has no branch 'dev'"):
        store_of(f"icechunk://{path}", {"branch": "dev"})
    with pytest.raises(ValueError, match=r"choose one version of the repository .*branch='main', tag='v1'"):
        store_of(f"icechunk://{path}", {"branch": "main", "tag": "v1"})
    with pytest.raises(ValueError, match=r"storage_options \['endpoint_url'\] are not options of a local"):
        store_of(f"icechunk://{path}", {"endpoint_url": "http://127.0.0.1:1"})


def test_a_missing_repository_and_a_missing_key_are_named(repository, tmp_path):
    with pytest.raises(DataFileError, match=rf"icechunk://{tmp_path}/none: cannot be opened as an Icechunk "
                                            r"repository \(the repository doesn't exist\)"):
        store_of(f"icechunk://{tmp_path}/none")
    store, _ = store_of(f"icechunk://{repository[0]}")
    with pytest.raises(MissingFileError, match=rf"@{store.snapshot}/q/zarr.json: no such file: snapshot"):
        store.open("q/zarr.json")


def test_a_mistyped_local_path_makes_no_folders(tmp_path):
    missing = tmp_path / "typo" / "era5"
    for opts in ({}, {"authorize_virtual": True}):
        with pytest.raises(DataFileError, match=r"the repository doesn't exist"):
            store_of(f"icechunk://{missing}", opts)
    assert not (tmp_path / "typo").exists()


@pytest.mark.parametrize("where", ["root", "below the root"])
def test_a_snapshot_whose_manifests_are_gone_fails_and_never_reads_fill_values(tmp_path, where):
    """The manifest objects deleted from the repository's storage (a partial copy, a collection): a read of a
    chunk fails naming the snapshot and the missing object, at the root and at a key below it (a location
    ``@<snapshot>/g``, as a checkpoint names it), where a look-up error of the library once read as "no such
    chunk" and the window as fill values."""
    import zarr

    path = str(tmp_path / "repo")
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(path))
    session = repo.writable_session("main")
    group = zarr.open_group(session.store, mode="w")
    if where != "root":
        group = group.create_group("g")
    x = (np.arange(3 * 16 * 16).reshape(3, 16, 16) + 1).astype("<f4")
    arr = group.create_array("t2m", shape=x.shape, chunks=(1, 8, 8), dtype="<f4", compressors=None, fill_value=0,
                             dimension_names=("time", "lat", "lon"))
    arr[...] = x
    snap = session.commit("first")
    src = _source(f"icechunk://{path}@{snap}" + ("" if where == "root" else "/g"), 2, 0, halo=0)
    np.testing.assert_array_equal(src.read_sample(0)[0], x[0, :8])
    manifests = os.listdir(os.path.join(path, "manifests"))
    assert manifests
    for name in manifests:
        os.remove(os.path.join(path, "manifests", name))
    src = _source(f"icechunk://{path}@{snap}" + ("" if where == "root" else "/g"), 2, 0, halo=0)
    with pytest.raises(DataFileError, match=rf"@{snap}.*manifests/\w+ not found"):
        src.read_sample(1)


def test_an_expired_and_collected_snapshot_is_named(tmp_path):
    path = str(tmp_path / "repo")
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(path))
    old = _commit(repo, _values(SEED), "first")
    store, _ = store_of(f"icechunk://{path}")
    pinned = pickle.loads(pickle.dumps(store))  # not opened yet: a worker process's store
    _commit(repo, _values(SEED + 1), "second")
    later = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=1)
    assert old in repo.expire_snapshots(later)
    repo.garbage_collect(later)
    with pytest.raises(DataFileError, match=rf"has no snapshot '{old}' .*expired .*garbage-collected"):
        store_of(f"icechunk://{path}@{old}")
    with pytest.raises(DataFileError, match=rf"has no snapshot '{old}'"):
        pinned.stat("t2m/zarr.json")


def test_without_icechunk_the_error_names_the_extra(repository, monkeypatch):
    monkeypatch.setitem(sys.modules, "icechunk", None)
    with pytest.raises(ImportError, match=r"pip install 'dali_mesh\[virtual\]'"):
        store_of(f"icechunk://{repository[0]}")


# ---- a repository in S3 -------------------------------------------------------------------------------------
def test_a_repository_in_s3_reads_with_the_sources_storage_options(s3_endpoint):
    opts = options(s3_endpoint, region=REGION)
    repo = icechunk.Repository.create(icechunk_storage(s3_endpoint, "data", "ice/repo"))
    first = _commit(repo, _values(SEED), "first")
    _commit(repo, _values(SEED + 1), "second")
    oracle = _oracle(repo, snapshot_id=first)
    for rank in range(2):
        src = _source("icechunk://s3://data/ice/repo", 2, rank, storage_options={**opts, "snapshot": first})
        store = src.files[0].store
        assert opts["secret"] not in store.spec and opts["secret"].encode() not in pickle.dumps(store)
        if rank == 1:
            src = pickle.loads(pickle.dumps(src))  # its store without credentials: the source carries them beside it
        _check_windows(src, oracle["t2m"], f"s3, rank {rank}")


# ---- the command line: --data icechunk://... with --branch / --tag / --snapshot ------------------------------
def _cli(capsys, argv):
    from dali_mesh.cli import main

    capsys.readouterr()
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("flags", [["--tag", "v1"], ["--branch", "main"], ["--snapshot", "first"], []])
def test_plan_data_reads_the_version_given_once(repository, capsys, flags):
    """Each rank's cold read is the stored sizes of the chunks of step 0 its window touches, as the library's
    own store of the version's snapshot gives them; the table names that snapshot."""
    import json

    from zarr.core.sync import sync

    path, repo, first, second = repository
    flags = [f if f != "first" else first for f in flags]
    snapshot = first if flags[:1] in (["--tag"], ["--snapshot"]) else second
    argv = ["plan", "--data", f"icechunk://{path}", "--dataset", "t2m", "--mesh", "model_parallel=2",
            "--shard", "model_parallel=0", *flags]
    code, out, err = _cli(capsys, argv + ["--json"])
    assert code == 0, err
    store = repo.readonly_session(snapshot_id=snapshot).store
    for row in json.loads(out):
        (lo, _), (hi, _) = row["window_start"], row["window_stop"]
        keys = [f"t2m/c/0/{i}/{j}" for i in range(lo // CHUNKS[1], (hi - 1) // CHUNKS[1] + 1)
                for j in range(-(-SHAPE[2] // CHUNKS[2]))]
        assert row["cold_bytes"] == sum(sync(store.getsize(k)) for k in keys), row
    code, out, err = _cli(capsys, argv)
    assert code == 0 and f"icechunk://{path}@{snapshot}" in out, out + err


@pytest.mark.parametrize("argv, message", [
    (["--tag", "v1", "--branch", "main"], "choose one version of the repository (a branch, a tag or a snapshot)"),
    (["--tag", "v9"], "has no tag 'v9'"),
    (["--snapshot", "0000000000000000000A"], "has no snapshot '0000000000000000000A'"),
])
def test_plan_version_flags_that_cannot_be_taken_are_one_line_errors(repository, capsys, argv, message):
    code, out, err = _cli(capsys, ["plan", "--data", f"icechunk://{repository[0]}", "--dataset", "t2m", "--mesh",
                                   "model_parallel=2", "--shard", "model_parallel=0", *argv])
    assert code == 2 and err.startswith("dali-mesh: error: ") and message in err and "\n" not in err.strip(), err


def test_version_flags_on_data_that_has_no_versions_are_refused(tmp_path, capsys):
    np.save(tmp_path / "s.npy", np.zeros((4, 4), np.float32))
    code, out, err = _cli(capsys, ["plan", "--data", str(tmp_path / "s.npy"), "--mesh", "model_parallel=2",
                                   "--shard", "model_parallel=0", "--tag", "v1"])
    assert code == 2 and "--tag choose a version of a versioned store (an icechunk:// repository)" in err, err
    code, out, err = _cli(capsys, ["plan", "--shape", "4,4", "--mesh", "model_parallel=2", "--shard",
                                   "model_parallel=0", "--branch", "main"])
    assert code == 2 and "--branch choose a version of --data (an icechunk:// repository): give --data" in err, err


@pytest.mark.timeout(240)
def test_demo_reads_a_tag_of_a_repository_on_every_rank(repository, tmp_path, monkeypatch, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("nvidia.dali")
    path = repository[0]
    monkeypatch.chdir(tmp_path)
    code, out, err = _cli(capsys, ["demo", "--data", f"icechunk://{path}", "--tag", "v1", "--dataset", "z",
                                   "--nproc", "2", "--mesh", "model_parallel=2", "--shard", "model_parallel=0",
                                   "--halo", "0=1", "--batch-size", "1", "--timeout", "200"])
    assert code == 0, out + err
    # read natively (the fallback's reason named the snapshot; the native reader's table names none)
    assert "reader: native (fn.dali_mesh.read_windows" in out and out.strip().endswith("all 3 samples verified"), out


# ---- virtual chunks: NetCDF4 files referenced by VirtualiZarr --------------------------------------------------
def _virtual_repository(tmp_path):
    """Two NetCDF4 files (gzip + shuffle chunks) written by xarray, along time, made one virtual dataset by
    VirtualiZarr and written into a repository whose config declares their folder as a virtual chunk
    container: ``(path, prefix, the values as xarray reads the files)``."""
    pytest.importorskip("virtualizarr")
    import xarray as xr
    from obspec_utils.registry import ObjectStoreRegistry
    from obstore.store import LocalStore
    from virtualizarr import open_virtual_dataset
    from virtualizarr.parsers import HDFParser

    rng = np.random.default_rng(SEED)
    files = []
    for i in range(2):
        x = rng.standard_normal((2, 10, 12)).astype("<f4")
        ds = xr.Dataset({"t2m": (("time", "lat", "lon"), x)}, coords={"time": np.arange(2 * i, 2 * i + 2)})
        files.append(str(tmp_path / f"t2m_{i}.nc"))
        ds.to_netcdf(files[-1], engine="h5netcdf",
                     encoding={"t2m": {"chunksizes": (1, 4, 6), "zlib": True, "shuffle": True}})
    registry = ObjectStoreRegistry({"file://": LocalStore()})
    parts = [open_virtual_dataset(f"file://{f}", registry=registry, parser=HDFParser()) for f in files]
    vds = xr.concat(parts, dim="time", coords="minimal", compat="override")
    prefix = f"file://{tmp_path}/"
    config = icechunk.RepositoryConfig.default()
    config.set_virtual_chunk_container(icechunk.VirtualChunkContainer(prefix, icechunk.local_filesystem_store(str(
        tmp_path))))
    path = str(tmp_path / "repo")
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(path), config=config)
    session = repo.writable_session("main")
    vds.vz.to_icechunk(session.store)
    session.commit("virtual t2m")
    oracle = np.concatenate([xr.open_dataset(f, engine="h5netcdf")["t2m"].values for f in files])
    return path, prefix, oracle


@pytest.mark.filterwarnings("ignore::UserWarning")  # zarr-python: numcodecs.shuffle / zlib are not in the v3 spec
@pytest.mark.parametrize("access", ["prefix", "all declared"])
def test_virtual_chunks_into_netcdf_files_read_as_xarray_reads_the_files(tmp_path, access):
    path, prefix, oracle = _virtual_repository(tmp_path)
    opts = {"authorize_virtual": [prefix] if access == "prefix" else True}
    for ranks in (2, 4):
        for rank in range(ranks):
            src = _source(f"icechunk://{path}", ranks, rank, halo=1, boundary="reflect", storage_options=opts)
            if rank == ranks - 1:
                src = pickle.loads(pickle.dumps(src))  # the authorisation goes with the store into a worker
            _check_windows(src, oracle, f"virtual, rank {rank} of {ranks}")


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_virtual_chunks_not_authorised_are_not_read(tmp_path):
    path, prefix, _ = _virtual_repository(tmp_path)
    src = _source(f"icechunk://{path}", 2, 0)
    with pytest.raises(DataFileError, match=rf"icechunk://{path}@\w{{20}}/t2m/c/0/\d/\d: cannot be read \(a virtual "
                                            rf"chunk .* {prefix}.*give storage_options authorize_virtual="):
        src.read_sample(0)
    with pytest.raises(ValueError, match=r"authorize_virtual must be a list of the URL prefixes"):
        store_of(f"icechunk://{path}", {"authorize_virtual": prefix})


def _capture_server():
    """A server on 127.0.0.1 that answers every request 404 and keeps its method, path and credential headers:
    ``(server, seen, endpoint)`` (the caller shuts it down)."""
    import http.server
    import threading

    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def _any(self):
            seen.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()
                                                   if k.lower() in ("authorization", "x-amz-security-token")}))
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_HEAD = _any

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, seen, f"http://127.0.0.1:{server.server_address[1]}"


@pytest.mark.parametrize("access", ["prefix", "all declared", "env"])
def test_a_virtual_container_gets_the_environments_credentials_only_when_the_source_says_env(
        tmp_path, monkeypatch, access):
    """A repository (anyone's) declares the container ``s3://data/`` at an endpoint of its choosing; the user's
    own keys are in the environment. Authorised by its prefix or as "every container declared", the
    container is read anonymously: the endpoint never sees the user's key id or session token (the
    library's default, the environment's credentials, sent them). ``{prefix: "env"}`` sends them: the
    user's choice, and this test's proof that the server would have seen them."""
    import zarr

    server, seen, endpoint = _capture_server()
    try:
        config = icechunk.RepositoryConfig.default()
        config.set_virtual_chunk_container(icechunk.VirtualChunkContainer("s3://data/", icechunk.s3_store(
            region="us-east-1", endpoint_url=endpoint, allow_http=True, force_path_style=True)))
        path = str(tmp_path / "repo")
        repo = icechunk.Repository.create(icechunk.local_filesystem_storage(path), config=config)
        session = repo.writable_session("main")
        zarr.open_group(session.store, mode="w").create_array(
            "t2m", shape=(2, 8, 8), chunks=(1, 8, 8), dtype="<f4", compressors=None, fill_value=0,
            dimension_names=("time", "lat", "lon"))
        for t in range(2):
            session.store.set_virtual_ref(f"t2m/c/{t}/0/0", "s3://data/era5.nc", offset=t * 256, length=256)
        session.commit("virtual")
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAUSERSOWNKEY00000")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "users-own-secret")
        monkeypatch.setenv("AWS_SESSION_TOKEN", "USERS-SESSION-TOKEN")
        monkeypatch.setenv("AWS_REGION", "us-east-1")
        given = {"prefix": ["s3://data/"], "all declared": True, "env": {"s3://data/": "env"}}[access]
        src = _source(f"icechunk://{path}", 1, 0, halo=0, storage_options={"authorize_virtual": given})
        with pytest.raises(DataFileError, match=r"t2m/c/0/0/0: cannot be read"):
            src.read_sample(0)
    finally:
        server.shutdown()
        server.server_close()
    assert seen, "the container's endpoint was never asked"
    sent = " ".join(str(headers) for _, _, headers in seen)
    if access == "env":
        assert "AKIAUSERSOWNKEY00000" in sent and "USERS-SESSION-TOKEN" in sent
    else:
        assert "AKIAUSERSOWNKEY00000" not in sent and "USERS-SESSION-TOKEN" not in sent
        assert all(not headers for _, _, headers in seen), seen


@pytest.mark.parametrize("access", ["prefix", "all declared"])
def test_a_virtual_chunk_in_a_fifo_refuses_the_snapshot_instead_of_waiting_for_ever(tmp_path, access):
    """A virtual chunk whose file, in an authorised local container, is a named pipe (a hostile repository, or
    a file replaced by one): the library's read would wait for ever; the source refuses the snapshot when it
    is made, naming the file. A regular file there is read."""
    import zarr

    data = np.arange(2 * 8 * 8, dtype="<f4").reshape(2, 8, 8)
    (tmp_path / "data.bin").write_bytes(data.tobytes())
    os.mkfifo(tmp_path / "pipe bin")
    prefix = f"file://{tmp_path}/"
    config = icechunk.RepositoryConfig.default()
    config.set_virtual_chunk_container(icechunk.VirtualChunkContainer(prefix, icechunk.local_filesystem_store(
        str(tmp_path))))
    path = str(tmp_path / "repo")
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(path), config=config)
    opts = {"authorize_virtual": [prefix] if access == "prefix" else True}
    for target, name in ((tmp_path / "data.bin", "ok"), (tmp_path / "pipe bin", "fifo")):
        session = repo.writable_session("main")
        arr = zarr.open_group(session.store, mode="a").create_array(
            name, shape=(2, 8, 8), chunks=(1, 8, 8), dtype="<f4", compressors=None, fill_value=0,
            dimension_names=("time", "lat", "lon"))
        for t in range(2):
            session.store.set_virtual_ref(f"{arr.path}/c/{t}/0/0", f"file://{target}", offset=t * 256, length=256,
                                          validate_container=False)
        snapshot = session.commit(name)
        if name == "ok":
            np.testing.assert_array_equal(_source(f"icechunk://{path}@{snapshot}", 1, 0, halo=0, name="ok",
                                                  storage_options=opts).read_sample(1)[0], data[1])
    with pytest.raises(NotRegularFileError, match=r"a virtual chunk of this snapshot is a range of .*pipe(%20| )bin, which "
                                                  r"is a FIFO"):
        _source(f"icechunk://{path}", 1, 0, halo=0, name="ok", storage_options=opts)


def test_every_container_declared_is_authorised_that_this_reader_can_read(tmp_path):
    """A repository declaring an Azure and a Tigris container beside a local one, read with ``authorize_virtual=
    True``: the repository opens and reads (Tigris is authorised as S3 is, anonymously; Azure is left
    unauthorised), where a container of a kind not handled once refused the whole repository; a ``;`` in a
    container's prefix is no error of the store's spec."""
    import zarr

    config = icechunk.RepositoryConfig.default()
    osc = icechunk.ObjectStoreConfig
    config.set_virtual_chunk_container(icechunk.VirtualChunkContainer("az://cont/", osc.Azure({})))
    config.set_virtual_chunk_container(icechunk.VirtualChunkContainer("tigris://b/", osc.Tigris(
        icechunk.S3Options(region="us-east-1"))))
    local = tmp_path / "a;b"
    local.mkdir()
    config.set_virtual_chunk_container(icechunk.VirtualChunkContainer(f"file://{local}/",
                                                                      icechunk.local_filesystem_store(str(local))))
    path = str(tmp_path / "repo")
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(path), config=config)
    session = repo.writable_session("main")
    x = np.arange(2 * 8 * 8, dtype="<f4").reshape(2, 8, 8)
    arr = zarr.open_group(session.store, mode="w").create_array("t2m", shape=x.shape, chunks=(1, 8, 8), dtype="<f4",
                                                               fill_value=0, dimension_names=("time", "lat", "lon"))
    arr[...] = x
    session.commit("native chunks")
    for given in (True, [f"file://{local}/"], {"tigris://b/": "anonymous"}):
        np.testing.assert_array_equal(_source(f"icechunk://{path}", 1, 0, halo=0, storage_options={
            "authorize_virtual": given}).read_sample(1)[0], x[1])


def test_an_unknown_way_of_reading_a_container_is_refused(tmp_path):
    path = str(tmp_path / "repo")
    icechunk.Repository.create(icechunk.local_filesystem_storage(path))
    with pytest.raises(ValueError, match=r"the container 's3://data/' is read 'anonymous' or 'env', got 'mine'"):
        store_of(f"icechunk://{path}", {"authorize_virtual": {"s3://data/": "mine"}})
    with pytest.raises(ValueError, match=r"'ftp://x/' is of a kind this reader does not authorise"):
        store_of(f"icechunk://{path}", {"authorize_virtual": ["ftp://x/"]})


def test_one_repository_read_from_two_services_or_with_other_keys_is_two_stores(repository):
    """A repository location's stores on two services (a mirror: the same snapshot ids), with other keys,
    or other virtual containers authorised, have other specs (each library's native store of a spec reads
    through one of them: one source's reads once went to the other's service); a pickled store keeps its
    spec, without its secrets."""
    path, _, first, _ = repository
    base = {"endpoint_url": "http://127.0.0.1:1", "region": REGION, "key": "KEY-A", "secret": "SECRET-OF-A"}
    stores = [IcechunkStore(f"s3://data/{path}", first, dict(base)),
              IcechunkStore(f"s3://data/{path}", first, {**base, "endpoint_url": "http://127.0.0.1:2"}),
              IcechunkStore(f"s3://data/{path}", first, {**base, "key": "KEY-B", "secret": "SECRET-OF-B"}),
              IcechunkStore(f"s3://data/{path}", first, {**base, "authorize_virtual": ["s3://data/"]}),
              IcechunkStore(f"s3://data/{path}", first, {**base, "anon": True})]
    assert len({s.spec for s in stores}) == len(stores)
    assert IcechunkStore(f"s3://data/{path}", first, dict(base)) == stores[0]
    for store in stores:
        again = pickle.loads(pickle.dumps(store))
        assert again.spec == store.spec and again == store
        assert b"SECRET-OF" not in pickle.dumps(store) and "SECRET-OF" not in store.spec


# ---- the weather dataset source over a repository --------------------------------------------------------------
def test_a_dataset_source_reads_variables_levels_forecasts_of_the_tagged_snapshot(tmp_path):
    """An xarray-written dataset (variables x levels x time) committed twice, read at the tag on the first by
    ``ZarrDatasetSource`` with forecasts, halos and normalisation, equal to xarray on that snapshot."""
    import pandas as pd
    import xarray as xr

    from dali_mesh import ForecastSpec, MeshInfo, NamedLayout, ZarrDatasetSource
    from dali_mesh.partition import take_window

    def dataset(seed):
        rng = np.random.default_rng(seed)
        return xr.Dataset(
            {"t2m": (("time", "latitude", "longitude"), rng.standard_normal((6, 9, 12)).astype("f4")),
             "z": (("time", "level", "latitude", "longitude"), rng.standard_normal((6, 3, 9, 12)).astype("f4"))},
            coords={"time": pd.date_range("2020-01-01", periods=6, freq="6h"), "level": [500, 850, 1000],
                    "latitude": np.linspace(80, -80, 9), "longitude": np.arange(12) * 30.0})

    path = str(tmp_path / "repo")
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(path))
    session = repo.writable_session("main")
    first = dataset(SEED)
    for name in first.data_vars:  # chunks that no split follows: a time step, 5 of the 9 latitudes
        first[name].encoding["chunks"] = (1,) * (first[name].ndim - 2) + (5, 12)
    first.to_zarr(session.store, consolidated=False, zarr_format=3)
    repo.create_tag("v1", session.commit("first"))
    session = repo.writable_session("main")
    dataset(SEED + 1).to_zarr(session.store, consolidated=False, mode="a")
    session.commit("second")

    oracle = xr.open_zarr(repo.readonly_session(tag="v1").store, consolidated=False)
    fields = np.stack([oracle["t2m"].values, oracle["z"].sel(level=850).values], axis=1).astype(np.float64)
    mean, std = np.array([0.5, -0.25]), np.array([2.0, 0.5])
    fc = ForecastSpec(1, 1)
    for rank in range(2):
        layout = NamedLayout(MeshInfo((2,), ("mp",), (rank,)), shard={"mp": "latitude"},
                             halo={"latitude": 1, "longitude": 2}, boundary={"latitude": "reflect", "longitude": "periodic"})
        src = ZarrDatasetSource(f"icechunk://{path}", ["t2m", ("z", 850)], layout, shuffle=False, forecast=fc,
                                mean=mean, std=std, storage_options={"tag": "v1"})
        for sid in range(src.num_samples):
            t = src.time_index(sid)
            got = src.read_sample(sid)
            for w, steps in enumerate((range(t - fc.history, t + 1), range(t + 1, t + fc.lead + 1))):
                want = np.stack([(take_window(fields[s], src.region) - mean[:, None, None]) / std[:, None, None]
                                 for s in steps])
                np.testing.assert_allclose(got[w], want, rtol=2e-6, atol=2e-6, err_msg=f"rank {rank}, sample {sid}")


# ---- a dataset's variables planned in turn: their manifests loaded together --------------------------------------
@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("where", ["root", "below the root"])
def test_a_datasets_variables_load_their_manifests_together(tmp_path, where):
    """read_dataset plans a dataset's variables one after another, and the library loads an array's manifest
    at the first look-up of one of its chunks: without ByteStore.warm, a round trip per variable at the open.
    Over the benchmarks' S3 server with a latency that makes requests sent together overlap: the manifests of
    the 3 data variables are fetched in one wave (the time coordinate's, read by the dataset's open, in one
    before), and a warm of arrays that are not there is no error; so for a dataset in a group below the root
    (``icechunk://...@SNAP/g``: the arrays are warmed at their keys in the repository, "g/t2m")."""
    import xarray as xr
    import zarr

    from dali_mesh import MeshInfo, NamedLayout, ZarrDatasetSource
    from dali_mesh.pipeline.dataset_reader import dataset_readers
    from tests.storage.request_log import LoggingS3Server, waves
    from tests.storage.s3_server import KEY, SECRET

    names = ("t2m", "u10", "v10")
    x = np.random.default_rng(SEED).standard_normal((4, 8, 12)).astype("f4")
    ds = xr.Dataset({v: (("time", "latitude", "longitude"), x + i) for i, v in enumerate(names)},
                    coords={"time": np.arange(4).astype("datetime64[h]")})
    with LoggingS3Server(buckets=["data"]) as s:
        storage = icechunk.s3_storage(bucket="data", prefix="repo", endpoint_url=s.endpoint, allow_http=True,
                                      force_path_style=True, region=REGION, access_key_id=KEY, secret_access_key=SECRET)
        session = icechunk.Repository.create(storage).writable_session("main")
        group = None if where == "root" else "g"
        ds.to_zarr(session.store, mode="w", consolidated=False, zarr_format=3, group=group,
                   encoding={v: {"chunks": (1, 8, 12), "compressors": zarr.codecs.ZstdCodec()} for v in names})
        snapshot = session.commit("three variables")
        s.configure(latency=0.1)
        layout = NamedLayout(MeshInfo((2,), ("mp",), (1,)), shard={"mp": "latitude"})
        location = "icechunk://s3://data/repo" + ("" if group is None else f"@{snapshot}/g")
        src = ZarrDatasetSource(location, list(names), layout, batch_size=1, shuffle=False,
                                dtype=np.float32, storage_options=options(s.endpoint, region=REGION))
        s.take_log()
        assert dataset_readers(src) == ["native"] * len(names)
        manifests = [r for r in s.take_log() if r.method == "GET" and "/manifests/" in r.key]
        assert len(manifests) == len(names), manifests
        assert len(waves(manifests)) == 1, manifests
        (store,) = src.stores()
        store.warm(["no/such/array", "", "t2m", "time"])
