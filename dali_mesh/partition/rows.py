"""Index-set windows (graph and unstructured-mesh partitions): along one sample axis (nodes, cells,
edges) a rank's window is a list of row ids in the partition's order, not a box.

    >>> node_rank = np.array([0, 1, 0, 1, 1, 0])       # a partitioner's answer (METIS, a curve, boxes)
    >>> offsets, indices = np.array([0, 1, 3, 5, 6, 8, 9]), np.array([1, 0, 2, 1, 3, 2, 3, 5, 4])
    >>> Rows.from_assignment(node_rank, 0, graph=(offsets, indices), halo=1).ids
    array([0, 2, 5, 1, 3, 4])

    every rank (own rows in id order, then the halo's, in id order):
    rank0 -- own [0, 2, 5]  halo [1, 3, 4]
    rank1 -- own [1, 3, 4]  halo [0, 2, 5]

A :class:`Rows` is a plain value: nothing here reads a file or needs a process group. A source given
``rows=`` reads, for every sample, ``sample[..., ids, ...]`` on ``rows.axis`` (numpy's fancy indexing is
the oracle), only those rows' bytes: runs of adjacent ids are what the fetch plan reads. The other axes
stay boxes (the layout's crop, never a shard or a halo on the rows' axis).

Graphs are CSR/CSC arrays ``(offsets, indices)``: the neighbours of node ``i`` whose features it needs
are ``indices[offsets[i]:offsets[i + 1]]`` (PhysicsNeMo's CSC graph: the source nodes of destination
node ``i``). A halo of ``k`` hops is every node reached in at most ``k`` steps from the rank's own rows
that is not its own.
"""
from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np

from dali_mesh._checks import is_int
from dali_mesh.partition.checks import LayoutError
from dali_mesh.partition.rules import split_sizes

__all__ = ["Rows", "graph_halo", "inverse_permutation", "positions_within"]


def positions_within(counts) -> np.ndarray:
    """For groups of ``counts`` items laid end to end, each item's position within its group:
    ``[0, 1, 2, 0, 1]`` for counts ``[3, 2]`` (``np.repeat(starts, counts) + positions_within(counts)``
    lists every group's range of ``starts[i] .. starts[i] + counts[i] - 1``, concatenated)."""
    counts = np.asarray(counts, np.int64)
    return np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)


def _ids(values, what: str, kind: str = "row id") -> np.ndarray:
    """``values`` as a read-only 1-d int64 array: integers only (a float or bool array is refused: it
    would silently become other ids), none negative, none past int64."""
    a = np.asarray(values)
    if a.ndim != 1:
        raise LayoutError(f"{what} must be a 1-d array of {kind}s, got an array of shape {a.shape}")
    if a.size and not np.issubdtype(a.dtype, np.integer):
        raise LayoutError(f"{what} must hold integers, got dtype {a.dtype}")
    if a.size and a.dtype.kind == "u" and a.max() > np.iinfo(np.int64).max:
        i = int(np.argmax(a > np.iinfo(np.int64).max))
        raise LayoutError(f"{what}: {kind} {int(a[i])} at position {i} is out of range")
    a = np.array(a, dtype=np.int64)  # a copy: a caller's array changed later changes nothing here
    if a.size and a.min() < 0:
        i = int(np.argmax(a < 0))
        raise LayoutError(f"{what}: {kind} {int(a[i])} at position {i} is negative")
    a.setflags(write=False)
    return a


def _check_graph(graph, num_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """``(offsets, indices)`` checked: ``num_rows + 1`` non-decreasing offsets from 0 to
    ``len(indices)``, every index a row id below ``num_rows``."""
    try:
        offsets, indices = graph
    except (TypeError, ValueError):
        raise LayoutError("graph must be (offsets, indices), CSR/CSC arrays") from None
    offsets, indices = _ids(offsets, "graph offsets", "offset"), _ids(indices, "graph indices", "index")
    if offsets.size != num_rows + 1:
        raise LayoutError(f"graph offsets have {offsets.size} entries, but the graph's {num_rows} rows need "
                          f"{num_rows + 1} (one per row, then the end)")
    if offsets[0] != 0 or offsets[-1] != indices.size:
        raise LayoutError(f"graph offsets run from {int(offsets[0])} to {int(offsets[-1])}, but must run from 0 "
                          f"to the number of indices, {indices.size}")
    steps = np.diff(offsets)
    if steps.size and steps.min() < 0:
        i = int(np.argmax(steps < 0))
        raise LayoutError(f"graph offsets decrease at row {i} ({int(offsets[i])} then {int(offsets[i + 1])})")
    if indices.size and indices.max() >= num_rows:
        i = int(np.argmax(indices >= num_rows))
        raise LayoutError(f"graph index {int(indices[i])} at position {i} is out of range for {num_rows} rows")
    return offsets, indices


def inverse_permutation(order, what: str = "order") -> np.ndarray:
    """``new_of_old`` of a permutation ``order`` (new id ``i`` is old id ``order[i]``), checked: every id in
    ``0 .. len(order) - 1`` exactly once, else a :class:`LayoutError` naming the first id out of range or
    left out."""
    order = _ids(order, what, "node id")
    n = order.size
    if n and int(order.max()) >= n:
        i = int(np.argmax(order >= n))
        raise LayoutError(f"{what} is no permutation of {n} nodes: it names node {int(order[i])} at position {i}")
    new_of_old = np.full(n, -1, np.int64)
    new_of_old[order] = np.arange(n, dtype=np.int64)
    if n and (new_of_old < 0).any():
        raise LayoutError(f"{what} is no permutation: it names no node {int(np.argmax(new_of_old < 0))} "
                          "(and another one twice)")
    return new_of_old


def graph_halo(own: np.ndarray, graph, num_rows: int, hops: int) -> np.ndarray:
    """The rows reached from ``own`` in 1..``hops`` steps of ``graph`` that are not in ``own``, in id
    order (``hops=0``: none)."""
    if not is_int(hops) or hops < 0:
        raise LayoutError(f"halo must be a number of hops >= 0, got {hops!r}")
    if hops == 0:
        return np.empty(0, np.int64)
    offsets, indices = _check_graph(graph, num_rows)
    own = _ids(own, "own rows")
    if own.size and int(own.max()) >= num_rows:
        i = int(np.argmax(own >= num_rows))
        raise LayoutError(f"own rows: row id {int(own[i])} at position {i} is out of range for {num_rows} rows")
    seen = np.zeros(num_rows, bool)
    seen[own] = True
    frontier = own
    for _ in range(hops):
        if frontier.size == 0:
            break
        starts = offsets[frontier]
        lengths = offsets[frontier + 1] - starts
        # every neighbour of the frontier at once: positions starts[i] .. stops[i] - 1, concatenated
        pos = np.repeat(starts, lengths) + positions_within(lengths)
        nxt = np.unique(indices[pos])
        nxt = nxt[~seen[nxt]]
        seen[nxt] = True
        frontier = nxt
    seen[own] = False
    return np.flatnonzero(seen).astype(np.int64)


class Rows:
    """The rows a rank reads along one sample axis: ``ids`` in the partition's order (its own rows,
    then its halo), ``owned`` of them its own.

    Args:
        ids: global row ids (a 1-d integer array), in the order the rank's tensor holds them.
        axis: the sample axis they index (negative counts from the end, as numpy does).
        owned: how many of the first ``ids`` are the rank's own (default: all).
        unique: refuse an id given twice (default). A partition whose local graph names one node twice
            may pass ``unique=False``: the row is read once and copied.
        total: the number of rows of the axis the partition was made for (a node -> rank mapping's
            length), when known: a source refuses an array whose axis has another length.

    Empty partitions are refused: a rank with no rows has nothing to read, and a tensor of no rows
    usually means a partition of fewer nodes than ranks. ``Rows`` are compared by value.
    """

    def __init__(self, ids, axis: int = 0, *, owned: int | None = None, unique: bool = True,
                 total: int | None = None) -> None:
        if not is_int(axis):
            raise LayoutError(f"axis must be an integer, got {axis!r}")
        self.ids = _ids(ids, "rows")
        self.axis = int(axis)
        if self.ids.size == 0:
            raise LayoutError("rows is empty: this rank's partition holds no rows (fewer rows than ranks?)")
        self.owned = self.ids.size if owned is None else owned
        if not is_int(self.owned) or not 0 <= self.owned <= self.ids.size:
            raise LayoutError(f"owned must be an integer in 0..{self.ids.size} (the number of ids), got {owned!r}")
        self.owned = int(self.owned)
        if total is not None and (not is_int(total) or total < 1):
            raise LayoutError(f"total must be a number of rows >= 1, got {total!r}")
        self.total = None if total is None else int(total)
        if self.total is not None and int(self.ids.max()) >= self.total:
            i = int(np.argmax(self.ids >= self.total))
            raise LayoutError(f"rows: id {int(self.ids[i])} at position {i} is out of range for {self.total} rows")
        if unique:
            s = np.sort(self.ids)
            dup = np.flatnonzero(s[1:] == s[:-1])
            if dup.size:
                i = int(s[dup[0]])
                where = np.flatnonzero(self.ids == i)[:2].tolist()
                raise LayoutError(f"rows: id {i} is given twice (positions {where[0]} and {where[1]}); "
                                  "pass unique=False where the partition repeats rows")

    # ---- sources ---------------------------------------------------------------------------------------
    @classmethod
    def from_assignment(cls, node_rank, rank: int, *, graph=None, halo: int = 0, axis: int = 0) -> "Rows":
        """Rank ``rank``'s rows of a node -> rank mapping (any partitioner's answer: METIS, a
        space-filling curve, coordinate boxes): its own rows in id order, then the rows of a ``halo``
        of that many hops of ``graph`` (``(offsets, indices)``), in id order."""
        node_rank = _ids(node_rank, "node_rank", "rank")
        if not is_int(rank) or rank < 0:
            raise LayoutError(f"rank must be an integer >= 0, got {rank!r}")
        own = np.flatnonzero(node_rank == rank)
        if own.size == 0:
            ranks = np.unique(node_rank)
            raise LayoutError(f"rank {rank} owns no rows of the mapping ({node_rank.size} rows, {ranks.size} "
                              f"ranks named, from {int(ranks[0]) if ranks.size else '-'} to "
                              f"{int(ranks[-1]) if ranks.size else '-'})")
        return cls._own_then_halo(own, node_rank.size, graph, halo, axis)

    @classmethod
    def from_shards(cls, num_rows: int, num_ranks: int, rank: int, *, split: str = "chunk", graph=None,
                    halo: int = 0, axis: int = 0) -> "Rows":
        """Rank ``rank``'s contiguous shard of ``num_rows`` rows over ``num_ranks`` (a flattened grid
        sharded 1-d, as Anemoi shards its grid), sized by ``split`` (``chunk``, ``physicsnemo``, ``even``:
        :func:`~dali_mesh.partition.split_sizes`), then a halo of ``halo`` hops of ``graph``."""
        for name, v, low in (("num_rows", num_rows, 1), ("num_ranks", num_ranks, 1)):
            if not is_int(v) or v < low:
                raise LayoutError(f"{name} must be an integer >= {low}, got {v!r}")
        if not is_int(rank) or not 0 <= rank < num_ranks:
            raise LayoutError(f"rank must be in 0..{num_ranks - 1}, got {rank!r}")
        sizes = split_sizes(int(num_rows), int(num_ranks), split)
        start = int(sum(sizes[:rank]))
        own = np.arange(start, start + sizes[rank], dtype=np.int64)
        if own.size == 0:
            raise LayoutError(f"rank {rank} of {num_ranks} gets no rows of {num_rows} under split {split!r} "
                              f"(sizes {list(sizes)})")
        return cls._own_then_halo(own, int(num_rows), graph, halo, axis)

    @classmethod
    def _own_then_halo(cls, own: np.ndarray, num_rows: int, graph, halo: int, axis: int) -> "Rows":
        """``own``, then the rows ``halo`` hops of ``graph`` away (a graph given without a halo is still
        checked against ``num_rows``)."""
        if halo and graph is None:
            raise LayoutError("a halo of hops needs graph=(offsets, indices)")
        far = graph_halo(own, graph, num_rows, halo) if halo else np.empty(0, np.int64)
        if graph is not None and not halo:
            _check_graph(graph, num_rows)
        return cls(np.concatenate((own, far)), axis, owned=own.size, total=num_rows)

    def renumbered(self, order) -> "Rows":
        """These rows in a copy whose nodes were renumbered by ``order`` (new id ``i`` is old id
        ``order[i]``: ``dali-mesh convert --renumber``'s ``node_permutation``): the same rows in the same
        order, so a tensor read from the copy equals one read from the original, in the user's numbering."""
        new_of_old = inverse_permutation(order)
        n = new_of_old.size
        if self.total is not None and self.total != n:
            raise LayoutError(f"the rows were partitioned from {self.total} rows, but the permutation has {n} nodes")
        if int(self.ids.max()) >= n:
            raise LayoutError(f"rows name id {int(self.ids.max())}, but the permutation has {n} nodes")
        out = object.__new__(Rows)
        out.__dict__.update(self.__dict__, ids=new_of_old[self.ids], total=n)
        out.ids.setflags(write=False)
        return out

    # ---- value -----------------------------------------------------------------------------------------
    @property
    def halo(self) -> int:
        """How many rows are halo (after the owned ones)."""
        return self.ids.size - self.owned

    def __len__(self) -> int:
        return int(self.ids.size)

    def digest(self) -> str:
        """A sha256 of the axis, the owned count, the total and the ids: what a fingerprint holds instead
        of millions of ids (the axis as given: compare ``normalized(ndim)`` rows)."""
        h = hashlib.sha256(np.array([self.axis, self.owned, -1 if self.total is None else self.total], np.int64).tobytes())
        h.update(self.ids.tobytes())
        return h.hexdigest()

    def runs(self) -> int:
        """How many runs of ids that step by one (in this order) the rows form: the reads they cost
        before the fetch plan merges near ones."""
        return int(1 + np.count_nonzero(np.diff(self.ids) != 1))

    def normalized(self, ndim: int) -> "Rows":
        """These rows on a sample of ``ndim`` axes, the axis counted from 0."""
        if not -ndim <= self.axis < ndim:
            raise LayoutError(f"rows axis {self.axis} is out of range for a sample of {ndim} axes")
        if self.axis >= 0:
            return self
        out = object.__new__(Rows)
        out.__dict__.update(self.__dict__, axis=self.axis % ndim)
        return out

    def __eq__(self, other) -> bool:
        if not isinstance(other, Rows):
            return NotImplemented
        return ((self.axis, self.owned, self.total) == (other.axis, other.owned, other.total)
                and np.array_equal(self.ids, other.ids))

    def __hash__(self) -> int:
        return hash(self.digest())

    def __repr__(self) -> str:
        head = ", ".join(str(int(i)) for i in self.ids[:4]) + (", ..." if self.ids.size > 4 else "")
        return (f"Rows(axis={self.axis}, {self.ids.size} ids [{head}], owned={self.owned}, "
                f"runs={self.runs()})")

