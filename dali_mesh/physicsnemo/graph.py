"""The rows of a PhysicsNeMo graph partition (``GraphPartition``, or a ``DistributedGraph`` holding
one): what each rank's ``DistributedGraph`` getters return, read from storage instead of from a global
tensor on every rank.

    >>> graph = DistributedGraph(offsets, indices, partition_size, graph_partition=partition)
    >>> src = ZarrSource(store, "features", layout, rows=partition_rows(graph, "src", axis=1))
    >>> local = ZarrSource(store, "features", layout, rows=partition_rows(graph, "local_src", axis=1,
    ...                                                                    indices=indices))

``nodes`` (each checked against PhysicsNeMo 2.2.2's own getters on gloo ranks,
tests/torch/test_graph_partitions.py), on rank r:

- ``"src"``: ``map_partitioned_src_ids_to_global``, what ``get_src_node_features_in_partition(x)`` returns;
- ``"dst"``: ``map_partitioned_dst_ids_to_global``, what ``get_dst_node_features_in_partition(x)`` returns;
- ``"edges"``: ``map_partitioned_edge_ids_to_global``, what ``get_edge_features_in_partition(e)`` returns;
- ``"local_src"``: the source nodes of r's local graph (its own and its halo), as ``local_indices`` indexes
  them: what ``get_src_node_features_in_local_graph(get_src_node_features_in_partition(x))`` returns,
  with no all-to-all.

The local graph's source list is not "own, then halo": PhysicsNeMo groups it by owning rank. It is
derived here from the partition's own fields, whatever their order: the source of local edge ``e`` is
global node ``indices[map_partitioned_edge_ids_to_global[e]]`` and sits at ``local_indices[e]``, so
the global CSC ``indices`` (every rank has them: the partition functions take them) are needed.
Nothing here imports PhysicsNeMo or torch: a partition is read through its attributes.
"""
from __future__ import annotations

import numpy as np

from dali_mesh.partition import LayoutError, Rows

__all__ = ["NODES", "partition_rows"]

NODES = ("src", "dst", "edges", "local_src")

_FIELDS = {"src": "map_partitioned_src_ids_to_global", "dst": "map_partitioned_dst_ids_to_global",
           "edges": "map_partitioned_edge_ids_to_global"}


def _numpy(t) -> np.ndarray:
    return np.asarray(t.detach().cpu().numpy() if hasattr(t, "detach") else t)


def _partition(graph):
    part = getattr(graph, "graph_partition", graph)
    if not hasattr(part, "map_partitioned_src_ids_to_global"):
        raise TypeError(f"expected a PhysicsNeMo GraphPartition or a DistributedGraph holding one, got "
                        f"{type(graph).__name__}")
    return part


def partition_rows(graph, nodes: str = "src", *, axis: int = 0, indices=None) -> Rows:
    """This rank's :class:`~dali_mesh.partition.Rows` of ``graph`` (a ``GraphPartition`` or a
    ``DistributedGraph``) for ``nodes`` (see the module's table), on sample ``axis``; ``indices``: the
    global CSC indices, for ``"local_src"`` only."""
    if nodes not in NODES:
        raise LayoutError(f"nodes must be one of {', '.join(map(repr, NODES))}, got {nodes!r}")
    part = _partition(graph)
    if nodes != "local_src":
        if indices is not None:
            raise LayoutError(f"indices are only for nodes='local_src', not {nodes!r}")
        return Rows(_numpy(getattr(part, _FIELDS[nodes])).astype(np.int64), axis)
    if indices is None:
        raise LayoutError("nodes='local_src' needs indices=, the global CSC indices the partition was made from")
    indices = _numpy(indices).astype(np.int64)
    edges = _numpy(part.map_partitioned_edge_ids_to_global).astype(np.int64)
    local = _numpy(part.local_indices).astype(np.int64)
    n = int(part.num_local_src_nodes)
    if edges.size != local.size:
        raise LayoutError(f"the partition has {edges.size} edges but {local.size} local indices")
    if edges.size and (edges.min() < 0 or edges.max() >= indices.size):
        raise LayoutError(f"the partition names edge {int(edges.max())}, but indices has {indices.size} edges: "
                          "give the indices the partition was made from")
    if local.size and (local.min() < 0 or local.max() >= n):
        raise LayoutError(f"local index {int(local.max())} is out of range for {n} local source nodes")
    ids = np.full(n, -1, np.int64)
    ids[local] = indices[edges]
    if n and ids.min() < 0:
        raise LayoutError(f"local source node {int(np.argmax(ids < 0))} is the source of no local edge: "
                          "the partition's local graph does not match indices")
    # PhysicsNeMo groups the list by owning rank: the rank's own rows are no prefix of it, so ``owned``
    # counts every row (Rows.owned is only ever a prefix's length)
    return Rows(ids, axis)
