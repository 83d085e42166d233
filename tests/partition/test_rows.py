"""Index-set windows (``Rows``): the rows of a node -> rank mapping or of contiguous shards, and the halo
of k hops of a CSR/CSC graph, against networkx's shortest paths and numpy/torch's split sizes; bad
input gets an error naming the id, position or size."""
from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from dali_mesh.partition import LayoutError, Rows, graph_halo


def _random_graph(rng, n, degree):
    """A CSR graph of ``n`` rows, each with up to ``degree`` random neighbours (repeats and self loops
    allowed: a graph file may hold them)."""
    counts = rng.integers(0, degree + 1, n)
    offsets = np.concatenate(([0], np.cumsum(counts)))
    return offsets, rng.integers(0, n, offsets[-1])


def _nx_halo(offsets, indices, own, hops):
    g = nx.DiGraph()
    g.add_nodes_from(range(len(offsets) - 1))
    for i in range(len(offsets) - 1):
        g.add_edges_from((i, int(j)) for j in indices[offsets[i]:offsets[i + 1]])
    reach = nx.multi_source_dijkstra_path_length(g, set(int(o) for o in own), cutoff=hops)
    return sorted(set(reach) - set(int(o) for o in own))


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 60), degree=st.integers(0, 4), ranks=st.integers(1, 5), hops=st.integers(0, 3),
       seed=st.integers(0, 2**32 - 1))
def test_assignment_rows_are_own_then_halo_of_k_hops_as_networkx_finds(n, degree, ranks, hops, seed):
    rng = np.random.default_rng(seed)
    offsets, indices = _random_graph(rng, n, degree)
    node_rank = rng.integers(0, ranks, n)
    for r in range(ranks):
        own = np.flatnonzero(node_rank == r)
        if own.size == 0:
            with pytest.raises(LayoutError, match=f"rank {r} owns no rows"):
                Rows.from_assignment(node_rank, r, graph=(offsets, indices), halo=hops)
            continue
        rows = Rows.from_assignment(node_rank, r, graph=(offsets, indices), halo=hops, axis=1)
        want = _nx_halo(offsets, indices, own, hops)
        assert rows.ids.tolist() == own.tolist() + want
        assert rows.owned == own.size and rows.halo == len(want) and rows.total == n and rows.axis == 1
        assert graph_halo(own, (offsets, indices), n, hops).tolist() == want


@pytest.mark.parametrize("split", ["chunk", "physicsnemo", "even"])
@pytest.mark.parametrize("n,k", [(10, 4), (5, 4), (721 * 1440, 8), (7, 7)])
def test_shard_rows_tile_the_axis_by_the_split_rule(split, n, k):
    torch = pytest.importorskip("torch")
    got = []
    for r in range(k):
        try:
            got.append(Rows.from_shards(n, k, r, split=split).ids)
        except LayoutError as e:
            assert "gets no rows" in str(e)
            got.append(np.empty(0, np.int64))
    assert np.concatenate(got).tolist() == list(range(n))
    sizes = [g.size for g in got]
    if split == "chunk":
        assert sizes[:len(torch.arange(n).chunk(k))] == [c.numel() for c in torch.arange(n).chunk(k)]
    elif split == "even":
        assert sizes == [a.size for a in np.array_split(np.arange(n), k)]


def test_shard_rows_with_a_graph_halo():
    # a ring of 12 nodes, each needing its two neighbours: rank 1 of 3 owns 4..7, one hop adds 3 and 8
    n = 12
    offsets = np.arange(0, 2 * n + 1, 2)
    indices = np.array([[(i - 1) % n, (i + 1) % n] for i in range(n)]).reshape(-1)
    rows = Rows.from_shards(n, 3, 1, graph=(offsets, indices), halo=1)
    assert rows.ids.tolist() == [4, 5, 6, 7, 3, 8] and rows.owned == 4
    assert Rows.from_shards(n, 3, 0, graph=(offsets, indices), halo=2).ids.tolist() == [0, 1, 2, 3, 4, 5, 10, 11]


@pytest.mark.parametrize("bad,match", [
    (dict(ids=[]), "rows is empty"),
    (dict(ids=[3, 1, 3]), r"id 3 is given twice \(positions 0 and 2\)"),
    (dict(ids=[1, -2]), "row id -2 at position 1 is negative"),
    (dict(ids=[0.5, 1.0]), "must hold integers"),
    (dict(ids=[[1, 2]]), "1-d array"),
    (dict(ids=[1, 9], total=9), "id 9 at position 1 is out of range for 9 rows"),
    (dict(ids=[1], owned=2), "owned must be an integer in 0..1"),
    (dict(ids=[1], axis=1.0), "axis must be an integer"),
    (dict(ids=np.array([3, 2**64 - 1], np.uint64)), "row id 18446744073709551615 at position 1 is out of range"),
    (dict(ids=[2**63 - 1], total=10), "id 9223372036854775807 at position 0 is out of range for 10 rows"),
])
def test_bad_rows_are_refused_naming_the_id(bad, match):
    with pytest.raises(LayoutError, match=match):
        Rows(**bad)


def test_repeated_rows_are_allowed_when_asked():
    assert Rows([3, 1, 3], unique=False).ids.tolist() == [3, 1, 3]


@pytest.mark.parametrize("graph,match", [
    ((np.array([0, 1, 2]), np.array([1, 0])), "graph offsets have 3 entries, but the graph's 4 rows need 5"),
    ((np.array([0, 1, 2, 2, 3]), np.array([1, 0])), "run from 0 to 3, but must run from 0 to the number of indices, 2"),
    ((np.array([0, 2, 1, 2, 2]), np.array([1, 0])), "offsets decrease at row 1"),
    ((np.array([0, 1, 2, 2, 2]), np.array([1, 4])), "graph index 4 at position 1 is out of range for 4 rows"),
    ((np.array([0, 1]),), "graph must be"),
])
def test_a_graph_whose_offsets_do_not_match_its_indices_is_refused(graph, match):
    with pytest.raises(LayoutError, match=match):
        Rows.from_assignment(np.array([0, 0, 1, 1]), 0, graph=graph, halo=1)


def test_a_halo_needs_a_graph_and_rows_compare_by_value():
    with pytest.raises(LayoutError, match="needs graph"):
        Rows.from_assignment([0, 1], 0, halo=1)
    a, b = Rows([4, 2, 9], axis=-1), Rows(np.array([4, 2, 9], np.int32), axis=-1)
    assert a == b and hash(a) == hash(b) and a != Rows([4, 2, 9], axis=0)
    assert a.normalized(3).axis == 2 and a.normalized(3).ids is a.ids
    assert a.runs() == 3 and Rows(np.arange(5, 50)).runs() == 1
    ids = np.array([5, 6])
    r = Rows(ids)
    ids[0] = 7  # the caller's array changed later changes nothing
    assert r.ids.tolist() == [5, 6] and not r.ids.flags.writeable


def test_a_mapping_with_unassigned_nodes_is_refused_naming_the_node():
    with pytest.raises(LayoutError, match="node_rank: rank -1 at position 2 is negative"):
        Rows.from_assignment([0, 1, -1, 0], 0)


def test_renumbered_rows_and_halos_refuse_foreign_ids():
    with pytest.raises(LayoutError, match="no permutation of 2 nodes: it names node 5 at position 1"):
        Rows([0]).renumbered([0, 5])
    with pytest.raises(LayoutError, match="partitioned from 4 rows, but the permutation has 3 nodes"):
        Rows.from_assignment([0, 0, 1, 1], 0).renumbered([2, 0, 1])
    offsets, indices = np.array([0, 1, 2, 2]), np.array([1, 0])
    with pytest.raises(LayoutError, match="own rows: row id 3 at position 1 is out of range for 3 rows"):
        graph_halo(np.array([0, 3]), (offsets, indices), 3, 1)
    with pytest.raises(LayoutError, match="graph offsets have 4 entries, but the graph's 4 rows need 5"):
        Rows.from_shards(4, 2, 0, graph=(offsets, indices))
    assert Rows([1, 2], total=5).digest() != Rows([1, 2], total=6).digest()
