"""``dali-mesh plan --data STORE --rows-from NODE_RANK.npy [--rows-axis A] [--graph G.npz --hops K]``: a
graph or mesh partition's cost per rank, before any training: its rows (own and halo), the runs they
form, and the stored bytes and reads the native reader takes for one sample, against the stored sample
(every rank's own read of the whole array). Where the ranks read most of every stored sample, the node
order is not spatial, and the command says what ``dali-mesh convert --renumber`` would change.

    | rank | rows (own + halo) | runs | window | read (one sample, stored) | read / window | read / stored | reads | blocks |
"""
from __future__ import annotations

import argparse
import math

import numpy as np

from dali_mesh.cli.options import UsageError, find_data, fmt_bytes as _fmt, load_graph, parse_mesh
from dali_mesh.cli.locations import shown
from dali_mesh.mesh import MeshInfo
from dali_mesh.partition import Layout, LayoutError, Rows
from dali_mesh.plan.ranges import Units

__all__ = ["add_arguments", "plan_rows"]

#: a rank reading more than this share of every stored sample is told that renumbering would help
SPATIAL_SHARE = 0.5


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rows-from", metavar="NODE_RANK.npy",
                   help="with --data: a graph partition, a .npy array giving each node's rank (any partitioner's "
                        "answer): per rank its rows, runs and the bytes the native reader takes")
    p.add_argument("--rows-axis", type=int, default=0, help="with --rows-from: the sample axis of the nodes (default 0)")
    p.add_argument("--graph", metavar="G.npz", help="with --rows-from: the graph's CSR/CSC 'offsets' and 'indices' "
                                                     "(for --hops)")
    p.add_argument("--hops", type=int, default=0, help="with --rows-from and --graph: a halo of this many hops")


def _source(fmt, files, dataset, layout, rows, allow_external):
    from dali_mesh.source import array_source, file_source  # noqa: PLC0415

    if not fmt.steps:
        return file_source(files, layout, format=fmt, batch_size=1, shuffle=False, rows=rows)
    return array_source(files, dataset or fmt.default_name(files[0]), layout, format=fmt, batch_size=1,
                        shuffle=False, rows=rows, allow_external=allow_external)


def _read(src, location, headers: dict) -> tuple[int, int, int | None]:
    """The stored bytes and reads of sample 0 of ``src`` as the native reader's own fetch code counts them
    (:meth:`PlanSet.fetches <dali_mesh.plan.plan_set.PlanSet.fetches>`: a Blosc chunk read in its blocks,
    placed from one chunk's header), and the compressed blocks it decodes (:func:`_blocks`)."""
    from dali_mesh.cli.advice import blosc_headers  # noqa: PLC0415
    from dali_mesh.pipeline.native import plan_windows  # noqa: PLC0415

    plans = plan_windows(src)[0]
    heads = blosc_headers(plans, location, headers)
    epoch = plans.fetches(headers=heads).epoch([0])
    return epoch.bytes, epoch.requests, _blocks(plans, heads)


def _blocks(plans, heads: dict[int, bytes]) -> int | None:
    """The compressed blocks sample 0 decodes: of a Blosc chunk the blocks its decoded ranges touch (the
    block size from bytes 8-11 of its coder's header), of any other coded chunk the chunk (one block);
    ``None`` for raw reads (``.npy``, contiguous HDF5: no blocks)."""
    item = plans.items[0]
    chunks = plans.chunks
    touched: set[tuple[int, int]] = set()
    coded = False
    for part in item.parts:
        plan = plans.plans[part.plan]
        if not plan.coded:
            continue
        coded = True
        _, _, _, coder = chunks[part.file]
        head = heads.get(coder)
        size = int.from_bytes(head[8:12], "little") if head is not None and len(head) >= 12 else 0
        if size <= 0:
            touched.add((part.file, 0))
            continue
        # every run of the plan's units in the decoded chunk (Units.expanded: each unit's repeats)
        offsets, _, lengths = Units(plan.file_off, plan.dst_off, plan.unit_bytes, plan.unit_count, plan.file_step,
                                    plan.dst_step, []).expanded()
        starts = part.base + offsets
        for a, b in zip((starts // size).tolist(), ((starts + lengths - 1) // size).tolist()):
            touched.update((part.file, k) for k in range(a, b + 1))
    return len(touched) if coded else None


def plan_rows(args: argparse.Namespace) -> int:
    """Print the table of the module's docstring for every rank of ``--mesh`` (its ranks numbered as
    the mapping numbers them)."""
    try:
        node_rank = np.load(args.rows_from, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise UsageError(f"--rows-from {shown(args.rows_from)!r}: {e}") from None
    graph = load_graph(args.graph) if args.graph else None
    if graph is None and args.hops:
        raise UsageError("--hops needs --graph")
    mesh_shape, names = parse_mesh(args.mesh, args.world_size)
    size = math.prod(mesh_shape)
    fmt, files = find_data(args.data)
    allow_external = bool(getattr(args, "allow_external", False))
    whole = Layout(MeshInfo(mesh_shape, names), batch=())
    try:
        every = Rows(np.arange(np.asarray(node_rank).size), args.rows_axis)
        probe = _source(fmt, files, args.dataset, whole, every, allow_external)
        headers: dict = {}
        stored, stored_reads, stored_blocks = _read(probe, files[0], headers)
        print(f"{shown(args.data)}: samples of {probe.sample_shape} {np.dtype(probe.dtype)}, nodes on axis "
              f"{args.rows_axis}; one sample stored: {_fmt(stored)} in {stored_reads} reads"
              + (f", {stored_blocks} compressed blocks" if stored_blocks is not None else ""))
        print("| rank | rows (own + halo) | runs | window | read (one sample, stored) | read / window | read / stored "
              "| reads | blocks |")
        print("|---|---|---|---|---|---|---|---|---|")
        shares = []
        itemsize = np.dtype(probe.dtype).itemsize
        row_cells = math.prod(probe.sample_shape) // probe.sample_shape[args.rows_axis]
        for rank in range(size):
            rows = Rows.from_assignment(node_rank, rank, graph=graph, halo=args.hops, axis=args.rows_axis)
            lay = Layout(MeshInfo(mesh_shape, names, MeshInfo(mesh_shape, names).coordinate_of(rank)), batch=())
            src = _source(fmt, files, args.dataset, lay, rows, allow_external)
            read, reads, blocks = _read(src, files[0], headers)
            window = len(rows) * row_cells * itemsize
            shares.append(read / stored if stored else 0.0)
            print(f"| {rank} | {rows.owned} + {rows.halo} | {rows.runs()} | {_fmt(window)} | {_fmt(read)} | "
                  f"{read / window:.2f}x | {shares[-1]:.2f}x | {reads} | {'-' if blocks is None else blocks} |")
    except LayoutError as e:
        raise UsageError(str(e)) from None
    if shares and np.median(shares) > SPATIAL_SHARE and size > 1:
        print(f"\nnote: each rank reads {np.median(shares):.2f}x of every stored sample (median), where its share "
              f"of the rows is about {1 / size:.2f}x: the node order is not spatial, so a partition's rows touch every "
              "chunk and compressed block. `dali-mesh convert --renumber hilbert --coords COORDS.npy` writes the "
              "nodes along a space-filling curve (and the permutation, to read rows in your numbering).")
    return 0
