"""Space-filling curves for renumbering mesh nodes: the Hilbert index against the ``hilbertcurve``
package (Skilling's transform point by point), the curve's own defining property (consecutive cells
are neighbours), Morton's bit interleave, and graphs renumbered against networkx's relabelling."""
from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from dali_mesh.partition import LayoutError
from dali_mesh.partition.curves import curve_index, curve_order, grid_coordinates, renumber_graph

hilbertcurve = pytest.importorskip("hilbertcurve.hilbertcurve")


@settings(max_examples=40, deadline=None)
@given(d=st.integers(2, 5), bits=st.integers(1, 12), seed=st.integers(0, 2**32 - 1))
def test_hilbert_index_equals_the_hilbertcurve_package(d, bits, seed):
    bits = min(bits, 63 // d)
    g = np.random.default_rng(seed).integers(0, 2**bits, (200, d))
    want = hilbertcurve.HilbertCurve(bits, d).distances_from_points(g.tolist())
    assert curve_index(g, "hilbert", bits).tolist() == [int(w) for w in want]


@pytest.mark.parametrize("d,bits", [(2, 4), (3, 3), (2, 1)])
def test_consecutive_hilbert_cells_are_neighbours(d, bits):
    cells = np.array(np.meshgrid(*[np.arange(2**bits)] * d, indexing="ij")).reshape(d, -1).T
    idx = curve_index(cells, "hilbert", bits)
    assert sorted(idx.tolist()) == list(range(len(cells)))  # a bijection onto 0 .. 2**(d bits) - 1
    path = cells[np.argsort(idx)]
    assert (np.abs(np.diff(path, axis=0)).sum(axis=1) == 1).all()


def test_morton_interleaves_the_bits():
    g = np.random.default_rng(1).integers(0, 2**10, (300, 3))
    want = [sum(((int(p[i]) >> b) & 1) << (3 * b + (2 - i)) for b in range(10) for i in range(3)) for p in g]
    assert curve_index(g, "morton", 10).tolist() == want


def test_curve_order_keeps_near_nodes_near():
    """A grid of 256 x 256 nodes numbered at random: renumbered along either curve, the nodes of each
    quarter of the domain, and of a box of 100 x 77 nodes, form a few runs of ids (91 and 66 for the
    Hilbert curve, 105 and 101 for Morton's, where the random order makes about one run per node)."""
    rng = np.random.default_rng(2)
    xy = np.array(np.meshgrid(np.arange(256.0), np.arange(256.0), indexing="ij")).reshape(2, -1).T
    xy = xy[rng.permutation(len(xy))] + rng.uniform(-0.3, 0.3, xy.shape)
    for curve in ("hilbert", "morton"):
        order = curve_order(xy, curve)
        assert sorted(order.tolist()) == list(range(len(xy)))
        for x1, y1 in ((128, 128), (100, 77)):
            ids = np.flatnonzero((xy[order, 0] < x1) & (xy[order, 1] < y1))  # in the new numbering
            runs = 1 + np.count_nonzero(np.diff(ids) != 1)
            assert runs <= 200, (curve, x1, y1, runs)
    before = np.flatnonzero((xy[:, 0] < 128) & (xy[:, 1] < 128))
    assert 1 + np.count_nonzero(np.diff(before) != 1) > 5000


def test_renumbered_graph_is_networkxs_relabelling():
    rng = np.random.default_rng(3)
    n = 200
    counts = rng.integers(0, 5, n)
    offsets = np.concatenate(([0], np.cumsum(counts)))
    indices = rng.integers(0, n, offsets[-1])
    order = rng.permutation(n)
    new_offsets, new_indices = renumber_graph(offsets, indices, order)
    g = nx.MultiDiGraph()
    g.add_nodes_from(range(n))
    g.add_edges_from((i, int(j)) for i in range(n) for j in indices[offsets[i]:offsets[i + 1]])
    mapping = {int(old): new for new, old in enumerate(order)}
    h = nx.relabel_nodes(g, mapping)
    for i in range(n):
        assert sorted(new_indices[new_offsets[i]:new_offsets[i + 1]].tolist()) == sorted(v for _, v in h.out_edges(i))


def test_bad_coordinates_and_curves_are_refused():
    with pytest.raises(LayoutError, match="coordinates of node 1 are not finite"):
        grid_coordinates([[0.0, 1.0], [np.nan, 2.0]], 8)
    with pytest.raises(LayoutError, match=r"must be an \(n, d\) array"):
        curve_order([1.0, 2.0])
    with pytest.raises(LayoutError, match="curve must be one of hilbert, morton"):
        curve_index(np.zeros((2, 2)), "peano")
    with pytest.raises(LayoutError, match="bits \\* ndim <= 63"):
        curve_index(np.zeros((2, 3)), "hilbert", 22)
    with pytest.raises(LayoutError, match="offsets have 3 entries, but the graph's 3 rows need 4"):
        renumber_graph([0, 1, 2], [0, 1], [2, 0, 1])
    with pytest.raises(LayoutError, match="no permutation: it names no node 1"):
        renumber_graph([0, 1, 2], [1, 0], [0, 0])
    with pytest.raises(LayoutError, match="no permutation of 2 nodes: it names node 5 at position 1"):
        renumber_graph([0, 1, 2], [1, 0], [0, 5])
    with pytest.raises(LayoutError, match="bits must be an integer in 1..52"):
        curve_index(np.zeros((2, 1)), "hilbert", 53)
    assert curve_order(np.ones((5, 2))).tolist() == list(range(5))  # one point repeated: the old order


def test_one_axis_coordinates_keep_their_order():
    """A 1-d curve is the coordinate itself: the largest coordinates do not wrap to index 0 (the grid is at
    most 52 bits per axis, exact in float64)."""
    assert curve_order([[3.0], [1.0], [2.0]]).tolist() == [1, 2, 0]
    x = np.random.default_rng(5).standard_normal((1000, 1))
    assert curve_order(x, "morton").tolist() == np.argsort(x[:, 0], kind="stable").tolist()
