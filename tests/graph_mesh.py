"""A 2-D mesh whose node ids follow no spatial order, and PhysicsNeMo's own graph partition functions,
for the graph tests and ``benchmarks/graph_bench.py``.

PhysicsNeMo's ``physicsnemo.nn`` imports timm, which imports torchvision, which does not load beside
the CPU torch these machines install; the module that holds the partition functions
(``physicsnemo/nn/module/gnn_layers/distributed_graph.py``) needs only ``physicsnemo.distributed``, so it
is loaded from its file (:func:`distributed_graph`): the real functions, not stubs."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np


def distributed_graph():
    """PhysicsNeMo's ``distributed_graph`` module (``GraphPartition``, ``DistributedGraph``,
    ``partition_graph_by_coordinate_bbox``, ``partition_graph_nodewise``, ...)."""
    name = "physicsnemo_distributed_graph"
    if name not in sys.modules:
        import physicsnemo

        path = Path(physicsnemo.__file__).parent / "nn/module/gnn_layers/distributed_graph.py"
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


def build_mesh(nx: int, ny: int, seed: int = 0):
    """A jittered ``nx`` x ``ny`` grid of nodes, 8-neighbour edges both ways, node ids randomly permuted:
    ``(coords (N, 2) float32, CSC offsets (N + 1,), indices (E,))`` (the sources of destination ``d`` are
    ``indices[offsets[d]:offsets[d + 1]]``)."""
    rng = np.random.default_rng(seed)
    n = nx * ny
    ii, jj = np.meshgrid(np.arange(nx), np.arange(ny), indexing="ij")
    old = (ii * ny + jj).ravel()
    xy = np.stack([ii.ravel() + rng.uniform(0.05, 0.95, n), jj.ravel() + rng.uniform(0.05, 0.95, n)], 1)
    src, dst = [], []
    for di in (-1, 0, 1):
        for dj in (-1, 0, 1):
            if di or dj:
                i2, j2 = ii.ravel() + di, jj.ravel() + dj
                ok = (i2 >= 0) & (i2 < nx) & (j2 >= 0) & (j2 < ny)
                src.append((i2 * ny + j2)[ok])
                dst.append(old[ok])
    perm = rng.permutation(n)  # the new id of old node k is perm[k]
    src, dst = perm[np.concatenate(src)], perm[np.concatenate(dst)]
    coords = np.empty((n, 2), np.float32)
    coords[perm] = xy
    order = np.lexsort((src, dst))
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(dst[order], minlength=n), out=offsets[1:])
    return coords, offsets, src[order].astype(np.int64)


def bbox_separators(nx: float, ny: float, p: int):
    """``p`` boxes as a grid over ``[0, nx) x [0, ny)`` (outer bounds open), as
    ``partition_graph_by_coordinate_bbox`` takes them: ``(mins, maxs)``."""
    px = {1: 1, 2: 2, 4: 2, 8: 4, 16: 4}[p]
    py = p // px
    xs, ys = np.linspace(0, nx, px + 1), np.linspace(0, ny, py + 1)
    mins, maxs = [], []
    for a in range(px):
        for b in range(py):
            mins.append([None if a == 0 else float(xs[a]), None if b == 0 else float(ys[b])])
            maxs.append([None if a == px - 1 else float(xs[a + 1]), None if b == py - 1 else float(ys[b + 1])])
    return mins, maxs


def bbox_partition(coords, offsets, indices, p: int, rank: int, extent):
    """PhysicsNeMo's ``partition_graph_by_coordinate_bbox`` for ``rank`` of ``p`` (boxes over ``extent``)."""
    import torch

    mins, maxs = bbox_separators(*extent, p)
    c = torch.from_numpy(np.ascontiguousarray(coords))
    return distributed_graph().partition_graph_by_coordinate_bbox(
        torch.from_numpy(offsets), torch.from_numpy(indices), c, c, mins, maxs, p, rank, torch.device("cpu"))
