"""Index-set windows read natively (``rows=``): every rank's rows equal numpy's fancy indexing
``x[t][..., ids, ...]`` on ``.npy``, HDF5 (chunked gzip and contiguous) and Zarr (v2 Blosc whole-grid
chunks, v3 sharded Zstd), for random id sets (runs, gaps, single ids, the array's ends, any order);
only the Blosc blocks the rows touch are read; a checkpoint resumes; bad rows are refused naming the
id or the size."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from dali_mesh import HDF5Source, Layout, NumpySource, Rows, ZarrSource
from dali_mesh.partition import LayoutError
from tests.helpers import SEED, mesh_of, native_epoch, native_pipeline, row_stores

zarr = pytest.importorskip("zarr")
h5py = pytest.importorskip("h5py")
numcodecs = pytest.importorskip("numcodecs")

STEPS, N, F = 4, 3000, 3  # steps of (N nodes, F features): rows on axis 0 of a step


@pytest.fixture(scope="module", autouse=True)
def _plugin():
    from dali_mesh.pipeline.plugin import load_plugin

    load_plugin()


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """The same (STEPS, N, F) float32 array in every format, and the sources' makers."""
    x = np.random.default_rng(SEED).standard_normal((STEPS, N, F), dtype=np.float32)
    makers, _ = row_stores(str(tmp_path_factory.mktemp("rows")), x, blocksize=4096, inner=500, shard=(2, 1500),
                           h5_chunk=700)
    return x, makers


def _layout():
    return Layout(mesh_of((2,), (1,)), batch=())  # the mesh dim shards nothing: a graph's ranks


_epoch = native_epoch


@st.composite
def id_sets(draw):
    """Runs, gaps and single ids, sometimes the array's ends, in id order or shuffled."""
    runs = draw(st.lists(st.tuples(st.integers(0, N - 1), st.integers(1, 300)), min_size=0, max_size=6))
    singles = draw(st.lists(st.integers(0, N - 1), max_size=20))
    ends = draw(st.sampled_from([(), (0,), (N - 1,), (0, N - 1)]))
    ids = {i for a, k in runs for i in range(a, min(a + k, N))} | set(singles) | set(ends)
    ids = sorted(ids) or [draw(st.integers(0, N - 1))]
    if draw(st.booleans()):
        ids = list(np.random.default_rng(draw(st.integers(0, 2**16))).permutation(ids))
    return np.array(ids, np.int64)


KINDS = ["npy", "zarr_blosc", "zarr_sharded_zstd", "hdf5_chunked", "hdf5_contiguous"]


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ids=id_sets())
def test_rows_equal_numpy_fancy_indexing(stores, kind, ids):
    x, make = stores
    src = make[kind](_layout(), Rows(ids, axis=0), batch_size=2, shuffle=False)
    assert src.sample_shape == (ids.size, F)
    got = _epoch(src)
    assert sorted(got) == list(range(STEPS))
    for t, w in got.items():
        np.testing.assert_array_equal(w, x[t][ids], err_msg=f"{kind}, step {t}")


@pytest.mark.parametrize("kind", ["npy", "zarr_blosc"])
def test_rows_with_channels_on_another_axis_and_a_crop(stores, kind):
    x, make = stores
    ids = np.array([2999, 5, 6, 7, 1000, 0])
    lay = Layout(mesh_of((2,), (0,)), batch=(), crop=[None, (1, 3)])
    src = make[kind](lay, Rows(ids, axis=0), batch_size=2, shuffle=False, channels=[2, 0, 1], channel_axis=1)
    for t, w in _epoch(src).items():
        np.testing.assert_array_equal(w, x[t][ids][:, [2, 0, 1]][:, 1:3], err_msg=f"step {t}")


def _rchar() -> int:
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("rchar:")).split()[1])


def test_rows_of_a_whole_grid_blosc_chunk_read_only_the_blocks_they_touch(tmp_path):
    """Rows 100,000..104,999 of a whole-grid chunk of 400,000 rows x 12 bytes (Blosc blocks of 64 KiB:
    5,461 rows) lie in two or three blocks: a step reads those, the chunk's header and block offsets,
    and gaps under the local merge gap (64 KiB): a small part of the chunk's stored bytes, where a
    reader of whole chunks reads all of them."""
    n = 400_000
    x = np.random.default_rng(SEED).standard_normal((2, n, F), dtype=np.float32)
    store = str(tmp_path / "big.zarr")
    z = zarr.create_array(store, shape=x.shape, chunks=(1, n, F), dtype="f4", zarr_format=2,
                          compressors=numcodecs.Blosc("lz4", 5, numcodecs.Blosc.SHUFFLE, blocksize=1 << 16))
    z[:] = x
    src = ZarrSource([store], None, _layout(), rows=Rows(np.arange(100_000, 105_000), axis=0), batch_size=2,
                     shuffle=False)
    p = native_pipeline(src, threads=1, prefetch=False)
    before = _rchar()
    w, ids, _ = p.run()
    read = _rchar() - before
    for i in range(2):
        np.testing.assert_array_equal(np.array(w[i]), x[int(np.array(ids[i]))][100_000:105_000])
    stored = sum(len(open(f"{store}/{t}.0.0", "rb").read()) for t in range(2))
    assert read < 0.15 * stored, (read, stored)


def test_a_checkpoint_resumes_the_same_rows(stores):
    x, make = stores
    rows = Rows(np.r_[2990:3000, 0:10, 1500], axis=0)
    src = make["zarr_sharded_zstd"](_layout(), rows, batch_size=1, seed=3)
    p = native_pipeline(src)
    p.run()
    ck = p.checkpoint()
    want = [np.array(p.run()[0][0]) for _ in range(2)]
    again = native_pipeline(src, checkpoint=ck)
    for w in want:
        np.testing.assert_array_equal(np.array(again.run()[0][0]), w)
    assert src.fingerprint()["rows"] == rows.digest() and src.fingerprint()["channels"] is None


@pytest.mark.parametrize("kind", KINDS)
def test_bad_rows_are_refused_naming_the_id_or_the_size(stores, kind):
    x, make = stores
    with pytest.raises(LayoutError, match=rf"row id {N} \(position 1 of rows\) is out of range for axis 0 of {N}"):
        make[kind](_layout(), Rows([5, N], axis=0))
    with pytest.raises(LayoutError, match=f"partitioned from {N + 1} rows .* has {N}"):
        make[kind](_layout(), Rows.from_assignment(np.zeros(N + 1, np.int64), 0))
    with pytest.raises(LayoutError, match="shards sample axis 0"):
        make[kind](Layout(mesh_of((2,), (1,)), shard={"data_parallel": 0}, batch=()), Rows([5], axis=0))
    with pytest.raises(LayoutError, match="halo of"):
        make[kind](Layout(mesh_of((2,), (1,)), batch=(), halo={0: 1}), Rows([5], axis=0))
    with pytest.raises(LayoutError, match="rows and channels both index sample axis 1"):
        make[kind](_layout(), Rows([1], axis=-1), channels=[0], channel_axis=1)
    with pytest.raises(TypeError, match="rows must be a dali_mesh.partition.Rows"):
        make[kind](_layout(), [1, 2])


def test_rows_of_too_many_runs_for_a_native_plan_say_why(tmp_path, monkeypatch):
    """A chunked window gets a part per run of rows and chunk: past the native plan's limit (2M parts; a
    2M-node mesh in random order) the error names the runs and the fix, for Zarr and HDF5."""
    import dali_mesh.plan.chunks as chunks
    from dali_mesh.pipeline import native
    from dali_mesh.plan import NotNativeError

    monkeypatch.setattr(chunks, "MAX_NATIVE_PARTS", 5000)
    x = np.zeros((2, 20_000, 2), np.float32)
    store = str(tmp_path / "z.zarr")
    zarr.create_array(store, shape=x.shape, chunks=(1, 20_000, 2), dtype="f4", zarr_format=2)[:] = x
    h5 = str(tmp_path / "f.h5")
    with h5py.File(h5, "w") as f:
        f.create_dataset("x", data=x, chunks=(1, 5000, 2))
    ids = np.arange(0, 20_000, 2)  # 10,000 runs of one row
    for src in (ZarrSource([store], None, _layout(), rows=Rows(ids)), HDF5Source([h5], "x", _layout(), rows=Rows(ids))):
        with pytest.raises(NotNativeError, match=r"rows form 10,000 runs, .*dali-mesh convert --renumber"):
            native.plan_windows(src)


def test_a_read_groups_rows_are_every_members_and_checked(stores):
    """rows={coordinate: Rows} with share=: the group reader reads the union of its members' rows (in id
    order) and the source itself its own; a table without this rank's or a member's rows, of other axes,
    or of other than Rows is refused naming it; without share only this rank's rows are kept."""
    from dali_mesh.partition.read_groups import OwnReads

    _, make = stores
    lay = Layout(mesh_of((2, 2), (0, 1)), batch="data_parallel")
    table = {(0, 0): Rows([9, 4], axis=0), (0, 1): Rows([1, 2, 4], axis=0), (1, 0): Rows([7], axis=0)}
    for kind in KINDS:
        src = make[kind](lay, table, share="group")
        assert src.rows == table[(0, 1)] and src.sample_shape == (3, F)
        group = src.group_reader()
        assert group.index_maps[0].tolist() == [1, 2, 4, 9] and group.sample_shape == (4, F)
        back = group.with_reads(OwnReads())
        assert back.index_maps[0].tolist() == [1, 2, 4] and back.sample_shape == (3, F)
        assert src.fingerprint()["rows_table"] == make[kind](Layout(mesh_of((2, 2), (0, 0)), batch="data_parallel"),
                                                             table, share="group").fingerprint()["rows_table"]
        assert make[kind](lay, table).group_rows is None
    with pytest.raises(LayoutError, match=r"no Rows for this rank's coordinate \(0, 1\)"):
        make["npy"](lay, {(0, 0): Rows([1])}, share="group")
    with pytest.raises(LayoutError, match=r"no Rows for read group member \(0, 0\)"):
        make["npy"](lay, {(0, 1): Rows([1])}, share="group")
    with pytest.raises(LayoutError, match=r"member \(0, 0\) index axis 1, this rank's axis 0"):
        make["npy"](lay, {(0, 0): Rows([1], axis=1), (0, 1): Rows([1])}, share="group")
    # axis -2 and 0 of a 2-d sample are one axis
    assert make["npy"](lay, {(0, 0): Rows([1], axis=-2), (0, 1): Rows([2])}, share="group").group_rows
    with pytest.raises(LayoutError, match=r"names mesh coordinate \(1,\) twice"):
        make["npy"](Layout(mesh_of((2,), (1,)), batch=()), {1: Rows([1]), (1,): Rows([2])})
    with pytest.raises(TypeError, match="keys must be mesh coordinates"):
        make["npy"](lay, {"01": Rows([1])})
    with pytest.raises(TypeError, match="keys must be mesh coordinates"):
        make["npy"](lay, {(0, 1.0): Rows([1])})
    with pytest.raises(TypeError, match=r"rows\[\(0, 1\)\] must be a dali_mesh.partition.Rows"):
        make["npy"](lay, {(0, 0): Rows([1]), (0, 1): [1]}, share="group")
    with pytest.raises(LayoutError, match=rf"row id {N} \(position 0 of rows\) is out of range"):
        make["npy"](lay, {(0, 0): Rows([N]), (0, 1): Rows([1])}, share="group")


def test_a_crop_on_the_rows_axis_is_refused(stores):
    """The rows choose the rows: a crop on their axis (which would cut positions of the rows, and of a read
    group's union) is refused; a crop on another axis applies."""
    _, make = stores
    with pytest.raises(LayoutError, match="the layout crops sample axis 0, which rows= indexes"):
        make["npy"](Layout(mesh_of((2,), (1,)), batch=(), crop=[(1, 3), None]), Rows([5, 6, 7, 8]))


def test_rows_past_a_later_files_end_name_the_first_id(tmp_path):
    """With per-sample shapes a later file may be shorter than the rows: the error names the first id out
    of range and its position, never the whole list (millions of ids for a real partition)."""
    from dali_mesh.io import DataFileError

    files = [str(tmp_path / "a.npy"), str(tmp_path / "b.npy")]
    np.save(files[0], np.zeros((100, 2), np.float32))
    np.save(files[1], np.zeros((40, 2), np.float32))
    src = NumpySource(files, _layout(), rows=Rows(np.arange(0, 100, 2)), per_sample_shapes=True, shuffle=False)
    assert src.read_sample(0)[0].shape == (50, 2)
    with pytest.raises(DataFileError, match=r"index 40 \(position 20 of 50\) of axis 0 is out of range for size 40"):
        src.read_sample(1)
