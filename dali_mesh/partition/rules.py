"""The split rules (how an axis of ``n`` cells is sized over ``k`` ranks) and the boundary rules
(which cell a position outside the domain reads): pure functions of plain numbers, the reference the
C++ ``mesh_roi`` and the kernels are held to."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from dali_mesh.partition.checks import LayoutError, _normalize_axis

#: Boundary rules, numpy's names and meanings (``periodic`` is numpy's ``wrap``); ``trim`` clips.
BOUNDARIES = ("constant", "periodic", "reflect", "symmetric", "edge", "trim")
#: Split rules: torch.chunk / DTensor, PhysicsNeMo's compute_split_shapes, numpy's array_split.
SPLITS = ("chunk", "physicsnemo", "even")
#: other names of the rules, by what the libraries call them: ``"dtensor"`` is torch's DTensor ``Shard``
#: (torch.chunk); ``"shard_tensor"`` is what PhysicsNeMo's ShardTensor makes itself (its "chunk":
#: ``compute_split_shapes``). A Layout keeps the rule's own name.
SPLIT_ALIASES = {"dtensor": "chunk", "shard_tensor": "physicsnemo"}


# ---- split rules --------------------------------------------------------------------------------
def _check_split(rule: str) -> None:
    if rule not in SPLITS:
        aliases = ", ".join(f"{a} = {r}" for a, r in SPLIT_ALIASES.items())
        raise LayoutError(f"unknown split {rule!r}; expected one of {', '.join(SPLITS)} (or {aliases})")


def shard_extent(n: int, k: int, i: int, rule: str = "chunk") -> tuple[int, int]:
    """``(offset, size)`` of shard ``i`` of ``k`` of an axis of ``n`` cells, in O(1).

    ``chunk``: ceil(n/k) each, trailing shards smaller or empty (torch.chunk, DTensor ``Shard``).
    ``physicsnemo``: ceil(n/k) each and the last gets the rest; if the last would be empty,
    floor(n/k) each and the last gets the rest (PhysicsNeMo ``compute_split_shapes``).
    ``even``: the first ``n mod k`` get floor(n/k)+1, the rest floor(n/k) (numpy ``array_split``).
    """
    _check_split(rule)
    if n < 0 or k <= 0 or not 0 <= i < k:
        raise LayoutError(f"shard {i} of {k} of an axis of {n} cells is not defined")
    if rule == "chunk":
        c = -(-n // k)
        offset = min(i * c, n)
        return offset, min(c, n - offset)
    if rule == "physicsnemo":
        c = -(-n // k)
        if n - c * (k - 1) <= 0:
            c = n // k
        offset = i * c
        return offset, (n - offset if i == k - 1 else c)
    q, r = divmod(n, k)
    return i * q + min(i, r), q + (1 if i < r else 0)


def split_sizes(n: int, k: int, rule: str = "chunk") -> tuple[int, ...]:
    """Sizes of the ``k`` shards of an axis of ``n`` cells.

    >>> split_sizes(5, 4, "chunk"), split_sizes(5, 4, "physicsnemo"), split_sizes(5, 4, "even")
    ((2, 2, 1, 0), (1, 1, 1, 2), (2, 1, 1, 1))
    """
    return tuple(shard_extent(n, k, i, rule)[1] for i in range(k))


# ---- boundary rules ------------------------------------------------------------------------------
def _check_boundary(mode: str) -> None:
    if mode not in BOUNDARIES:
        raise LayoutError(f"unknown boundary {mode!r}; expected one of {', '.join(BOUNDARIES)}")


def boundary_index(r, n: int, mode: str):
    """Index in ``[0, n)`` that ``np.pad(..., mode)`` copies to position ``r`` (relative to the domain
    start), or ``-1`` where ``constant`` (or ``trim``) has no source cell. ``r`` may be an int or an
    integer ndarray; any number of periods.

    ``periodic``: period n. ``reflect`` (edge not repeated): period 2n-2 (n == 1 repeats the value).
    ``symmetric`` (edge repeated): period 2n. ``edge``: clamped.
    """
    _check_boundary(mode)
    if n <= 0:
        raise LayoutError(f"boundary index on an axis of {n} cells")
    scalar = np.ndim(r) == 0
    r = np.asarray(r, dtype=np.int64)
    if mode == "periodic":
        out = np.mod(r, n)
    elif mode == "reflect":
        if n == 1:
            out = np.zeros_like(r)
        else:
            m = np.mod(r, 2 * n - 2)
            out = np.where(m < n, m, 2 * n - 2 - m)
    elif mode == "symmetric":
        m = np.mod(r, 2 * n)
        out = np.where(m < n, m, 2 * n - 1 - m)
    elif mode == "edge":
        out = np.clip(r, 0, n - 1)
    else:  # constant, trim
        out = np.where((r >= 0) & (r < n), r, -1)
    return int(out) if scalar else out



def _nested_sizes(n: int, counts: Sequence[int], rule: str) -> list[int]:
    """Sizes of the combined shards of an axis of ``n`` cells split by ``rule`` over nested mesh dims of
    ``counts`` ranks (outer first, each splitting the previous shard), row-major: as ``region`` does."""
    sizes = [n]
    for k in counts:
        sizes = [s for size in sizes for s in split_sizes(size, k, rule)]
    return sizes


def _axis_groups(shard: Sequence[tuple[int, int]], ndim: int | None) -> dict[int, list[int]]:
    """Sample axis -> the mesh dims that shard it, outer (earlier) first."""
    groups: dict[int, list[int]] = {}
    for d, a in shard:
        groups.setdefault(a if ndim is None else _normalize_axis(a, ndim, "shard"), []).append(d)
    return groups


