"""Node order along a space-filling curve: meshes are often numbered in no spatial order, and then any
spatial partition touches every chunk and every compressed block of the features (measured: ~1.0x the
stored bytes per rank). Renumbered along a Hilbert or Morton (Z-order) curve of the node coordinates,
each partition's rows become a few long runs.

    >>> order = curve_order(coords, "hilbert")          # new id i is old id order[i]
    >>> new_features = features[..., order, :]            # what `dali-mesh convert --renumber` writes
    >>> new_offsets, new_indices = renumber_graph(offsets, indices, order)

Coordinates are scaled by one factor for every axis (the domain's aspect kept) onto a grid of
``2**bits`` cells per axis, ``bits * ndim <= 63``. The Hilbert index is John Skilling's transform
("Programming the Hilbert curve", AIP Conf. Proc. 707, 2004), the one the ``hilbertcurve`` package
implements point by point (the tests' oracle), here for every point at once.
"""
from __future__ import annotations

import numpy as np

from dali_mesh._checks import is_int
from dali_mesh.partition.checks import LayoutError
from dali_mesh.partition.rows import _check_graph, inverse_permutation, positions_within

__all__ = ["CURVES", "curve_index", "curve_order", "grid_coordinates", "renumber_graph"]

CURVES = ("hilbert", "morton")


def grid_coordinates(coords, bits: int) -> np.ndarray:
    """``coords`` (``(n, d)`` reals) as integers in ``0 .. 2**bits - 1``, one scale for every axis."""
    c = np.asarray(coords, dtype=np.float64)
    if c.ndim != 2 or c.shape[1] < 1:
        raise LayoutError(f"coordinates must be an (n, d) array, got shape {c.shape}")
    if not np.isfinite(c).all():
        i = int(np.argmax(~np.isfinite(c).all(axis=1)))
        raise LayoutError(f"coordinates of node {i} are not finite: {c[i].tolist()}")
    lo = c.min(axis=0) if c.size else np.zeros(c.shape[1])
    extent = float((c.max(axis=0) - lo).max()) if c.size else 0.0
    top = (1 << bits) - 1
    if extent == 0:
        return np.zeros(c.shape, np.uint64)
    return np.minimum(np.floor((c - lo) / extent * top + 0.5), top).astype(np.uint64)


def _check_bits(bits, d: int) -> int:
    if bits is None:  # at most 52 per axis: the grid's cells are computed in float64 (53 exact bits)
        return max(1, min(52, 63 // d)) if d <= 63 else 0
    if not is_int(bits) or not 1 <= bits <= 52 or bits * d > 63:
        raise LayoutError(f"bits must be an integer in 1..52 with bits * ndim <= 63 ({d} axes), got {bits!r}")
    return int(bits)


def curve_index(grid: np.ndarray, curve: str = "hilbert", bits: int | None = None) -> np.ndarray:
    """The position along ``curve`` of each point of ``grid`` (``(n, d)`` integers below ``2**bits``)."""
    if curve not in CURVES:
        raise LayoutError(f"curve must be one of {', '.join(CURVES)}, got {curve!r}")
    x = np.array(grid, dtype=np.uint64)
    n, d = x.shape
    bits = _check_bits(bits, d)
    if d > 63 or bits == 0:
        raise LayoutError(f"a curve index of {d} axes does not fit 63 bits")
    one = np.uint64(1)
    if curve == "hilbert" and d > 1:
        # Skilling's AxestoTranspose: undo the excess work, then Gray-encode
        q = one << np.uint64(bits - 1)
        while q > one:
            p = q - one
            for i in range(d):
                high = (x[:, i] & q) != 0
                x[high, 0] ^= p  # invert the low bits of axis 0
                t = (x[~high, 0] ^ x[~high, i]) & p  # exchange the low bits of axes 0 and i
                x[~high, 0] ^= t
                x[~high, i] ^= t
            q >>= one
        for i in range(1, d):
            x[:, i] ^= x[:, i - 1]
        t = np.zeros(n, np.uint64)
        q = one << np.uint64(bits - 1)
        while q > one:
            t[(x[:, d - 1] & q) != 0] ^= q - one
            q >>= one
        x ^= t[:, None]
    # the transpose (Hilbert) or the coordinates (Morton) interleaved, most significant bit first
    out = np.zeros(n, np.uint64)
    for b in range(bits - 1, -1, -1):
        for i in range(d):
            out = (out << one) | ((x[:, i] >> np.uint64(b)) & one)
    return out


def curve_order(coords, curve: str = "hilbert", bits: int | None = None) -> np.ndarray:
    """The permutation that renumbers nodes along ``curve`` of their coordinates: new id ``i`` is old
    id ``order[i]`` (ties keep the old order)."""
    c = np.asarray(coords)
    d = c.shape[1] if c.ndim == 2 else 0
    bits = _check_bits(bits, max(d, 1))
    return np.argsort(curve_index(grid_coordinates(c, bits), curve, bits), kind="stable").astype(np.int64)


def renumber_graph(offsets, indices, order) -> tuple[np.ndarray, np.ndarray]:
    """A CSR/CSC graph ``(offsets, indices)`` with its nodes renumbered by ``order`` (new id ``i`` is old
    id ``order[i]``): row ``i`` of the result is old row ``order[i]``, its indices the new ids."""
    new_of_old = inverse_permutation(order)
    order = np.asarray(order, np.int64)
    n = order.size
    offsets, indices = _check_graph((offsets, indices), n)
    counts = np.diff(offsets)[order]
    new_offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    starts = offsets[:-1][order]
    pos = np.repeat(starts, counts) + positions_within(counts)
    return new_offsets, new_of_old[indices[pos]]
