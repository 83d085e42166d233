"""``dali-mesh convert --renumber``: mesh nodes numbered in no spatial order renumbered along a Hilbert or
Morton curve of their coordinates; the features, the permutation, the coordinates and the graph written
and verified; rows given in the user's numbering read back as they were (``Rows.renumbered``); a
spatial partition's rows become a few runs; bad input refused naming it, nothing left behind."""
from __future__ import annotations

import os

import numpy as np
import pytest

from dali_mesh import HDF5Source, Layout, Rows, ZarrSource
from dali_mesh.cli import main
from dali_mesh.partition import LayoutError, curve_order, renumber_graph
from tests.graph_mesh import build_mesh
from tests.helpers import mesh_of, native_pipeline

zarr = pytest.importorskip("zarr")
h5py = pytest.importorskip("h5py")

NX, NY, STEPS = 48, 40, 3


@pytest.fixture
def mesh_files(tmp_path):
    coords, offsets, indices = build_mesh(NX, NY, seed=3)
    x = np.random.default_rng(4).standard_normal((STEPS, len(coords), 2), dtype=np.float32)
    src = tmp_path / "src"
    src.mkdir()
    for t in range(STEPS):
        np.save(src / f"s{t}.npy", x[t])
    np.save(tmp_path / "coords.npy", coords)
    np.savez(tmp_path / "graph.npz", offsets=offsets, indices=indices)
    return tmp_path, x, coords, offsets, indices


def _read(src):
    w, ids, _ = native_pipeline(src).run()
    return {int(np.array(ids[i])): np.array(w[i]) for i in range(len(w))}


@pytest.mark.parametrize("dst,curve", [("out.zarr", "hilbert"), ("out.h5", "morton")])
def test_renumbered_copy_holds_the_permuted_features_graph_and_permutation(mesh_files, dst, curve, capsys):
    tmp, x, coords, offsets, indices = mesh_files
    out = str(tmp / dst)
    assert main(["convert", str(tmp / "src"), out, "--mesh", "data_parallel=1", "--renumber", curve,
                 "--coords", str(tmp / "coords.npy"), "--graph", str(tmp / "graph.npz"), "--no-progress"]) == 0
    assert f"renumbered along a {curve} curve" in capsys.readouterr().out
    order = curve_order(coords, curve)
    if dst.endswith(".zarr"):
        got = {k: zarr.open_array(f"{out}/{k}", mode="r")[:] for k in
               ("data", "node_permutation", "node_coordinates", "graph_offsets", "graph_indices")}
    else:
        with h5py.File(out) as f:
            got = {k: f[k][()] for k in f}
    assert np.array_equal(got["node_permutation"], order)
    np.testing.assert_array_equal(got["data"], x[:, order])
    np.testing.assert_array_equal(got["node_coordinates"], coords[order])
    new_offsets, new_indices = renumber_graph(offsets, indices, order)
    assert np.array_equal(got["graph_offsets"], new_offsets) and np.array_equal(got["graph_indices"], new_indices)
    # a node's neighbours are the same nodes under their new ids
    new_of_old = np.argsort(order)
    for old in (0, 17, len(coords) - 1):
        new = new_of_old[old]
        assert sorted(got["graph_indices"][got["graph_offsets"][new]:got["graph_offsets"][new + 1]]) == \
            sorted(new_of_old[indices[offsets[old]:offsets[old + 1]]])

    # rows given in the user's (old) numbering read back in that numbering, from the renumbered copy
    old_ids = np.flatnonzero((coords[:, 0] < 20) & (coords[:, 1] >= 13))
    rows = Rows(old_ids, axis=0).renumbered(got["node_permutation"])
    lay = Layout(mesh_of((1,), (0,)), batch=())
    src = (ZarrSource([out], "data", lay, rows=rows, batch_size=STEPS, shuffle=False) if dst.endswith(".zarr")
           else HDF5Source([out], "data", lay, rows=rows, batch_size=STEPS, shuffle=False))
    for t, w in _read(src).items():
        np.testing.assert_array_equal(w, x[t][old_ids])
    # the same box of the domain: hundreds of runs before, a few after
    assert Rows(old_ids).runs() > 200 and Rows(np.sort(new_of_old[old_ids])).runs() <= 40


def test_renumbered_rows_refuse_a_foreign_permutation():
    with pytest.raises(LayoutError, match="no permutation: it names no node 1"):
        Rows([0]).renumbered([0, 0, 2])
    with pytest.raises(LayoutError, match="rows name id 5, but the permutation has 3 nodes"):
        Rows([5]).renumbered([2, 0, 1])


@pytest.mark.parametrize("argv,message", [
    (["--renumber", "hilbert"], "--renumber needs --coords"),
    (["--coords", "{tmp}/coords.npy"], "--coords and --graph are for --renumber"),
    (["--renumber", "hilbert", "--coords", "{tmp}/short.npy"], "--coords give 10 nodes, but axis 0 of the samples"),
    (["--renumber", "hilbert", "--coords", "{tmp}/coords.npy", "--node-axis", "2"], "--node-axis 2 is out of range"),
    (["--renumber", "hilbert", "--coords", "{tmp}/coords.npy", "--graph", "{tmp}/nokeys.npz"],
     "holds ['a']: it needs 'offsets' and 'indices'"),
    (["--renumber", "hilbert", "--coords", "{tmp}/coords.npy", "--graph", "{tmp}/badgraph.npz"],
     "graph offsets have 3 entries, but the graph's 1920 rows need 1921"),
    (["--renumber", "hilbert", "--coords", "{tmp}/coords.npy", "--name", "node_permutation"],
     "is one of the arrays --renumber writes"),
    (["--renumber", "hilbert", "--coords", "{tmp}/nan.npy"], "coordinates of node 0 are not finite"),
])
def test_bad_renumbering_is_refused_naming_it(mesh_files, argv, message, capsys):
    tmp, *_ = mesh_files
    np.save(tmp / "short.npy", np.zeros((10, 2)))
    np.save(tmp / "nan.npy", np.full((NX * NY, 2), np.nan))
    np.savez(tmp / "nokeys.npz", a=np.zeros(2))
    np.savez(tmp / "badgraph.npz", offsets=np.array([0, 1, 2]), indices=np.array([0, 1]))
    before = sorted(os.listdir(tmp))
    argv = [a.replace("{tmp}", str(tmp)) for a in argv]
    assert main(["convert", str(tmp / "src"), str(tmp / "out.zarr"), "--mesh", "data_parallel=1", "--no-progress"]
                + argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err, err
    assert sorted(os.listdir(tmp)) == before  # nothing written


def test_plan_rows_says_the_node_order_is_not_spatial_until_renumbered(tmp_path, capsys):
    """``dali-mesh plan --rows-from``: per rank its rows, runs and the stored bytes the native reader
    takes for one sample; on a Blosc whole-grid chunk in random node order every rank reads the whole
    chunk and is told to renumber; renumbered along the Hilbert curve, each reads about its quarter."""
    numcodecs = pytest.importorskip("numcodecs")
    from tests.graph_mesh import bbox_separators

    coords, offsets, indices = build_mesh(200, 200, seed=1)
    owner = np.zeros(len(coords), np.int64)
    for r, (lo, hi) in enumerate(zip(*bbox_separators(200, 200, 4))):
        m = np.ones(len(coords), bool)
        for d in range(2):
            m &= (coords[:, d] >= lo[d] if lo[d] is not None else True) & (coords[:, d] < hi[d] if hi[d] is not None else True)
        owner[m] = r
    x = np.sin(coords[:, :1] / 9 + np.arange(4)).astype(np.float32)[None].repeat(2, 0)
    order = curve_order(coords, "hilbert")
    np.savez(tmp_path / "g.npz", offsets=offsets, indices=indices)
    shares, blocks = {}, {}
    for name, feats, own in (("random", x, owner), ("hilbert", x[:, order], owner[order])):
        store = str(tmp_path / f"{name}.zarr")
        z = zarr.create_array(store, shape=feats.shape, chunks=(1, len(coords), 4), dtype="f4", zarr_format=2,
                              compressors=numcodecs.Blosc("lz4", 5, numcodecs.Blosc.SHUFFLE, blocksize=1 << 14))
        z[:] = feats
        np.save(tmp_path / f"{name}_owner.npy", own)
        assert main(["plan", "--data", store, "--mesh", "graph=4", "--rows-from", str(tmp_path / f"{name}_owner.npy")]) == 0
        out = capsys.readouterr().out
        rows = [[c.strip() for c in line.split("|")[1:-1]] for line in out.splitlines() if line[:3] in ("| 0", "| 1", "| 2", "| 3")]
        assert [r[1] for r in rows] == [f"{(own == k).sum()} + 0" for k in range(4)], out
        shares[name] = [float(r[6].rstrip("x")) for r in rows]
        blocks[name] = ([int(r[8]) for r in rows], int(out.split(" compressed blocks")[0].rsplit(" ", 1)[1]))
        assert ("the node order is not spatial" in out) == (name == "random"), out
    assert min(shares["random"]) > 0.9 and max(shares["hilbert"]) < 0.45, shares
    # the compressed blocks decoded: every block of the chunk in random order, about a quarter renumbered
    each, total = blocks["random"]
    assert each == [total] * 4 and total > 8, blocks
    each, total = blocks["hilbert"]
    assert max(each) <= total // 2, blocks
    # with a halo of one hop from the graph
    assert main(["plan", "--data", str(tmp_path / "random.zarr"), "--mesh", "graph=4", "--rows-from",
                 str(tmp_path / "random_owner.npy"), "--graph", str(tmp_path / "g.npz"), "--hops", "1"]) == 0
    assert "| 0 | 10000 + 2" in capsys.readouterr().out
    assert main(["plan", "--data", str(tmp_path / "random.zarr"), "--mesh", "graph=4", "--hops", "1"]) == 2
    assert "--graph and --hops go with --rows-from" in capsys.readouterr().err
