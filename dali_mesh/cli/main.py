"""``dali-mesh``: the command line.

    dali-mesh plan --shape 8,721,1440 --mesh data_parallel=2,model_parallel=4 --shard model_parallel=1
    dali-mesh plan --data era5.npy --mesh model_parallel=4 --shard model_parallel=2   # layout advice
    dali-mesh convert src_dir/ dst.zarr --mesh model_parallel=4 --shard model_parallel=2
    dali-mesh demo [--nproc 4] ...

Bad input gets one line on stderr and exit code 2, never a traceback.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Iterator, Sequence

import numpy as np

from dali_mesh.cli.options import (
    UsageError,
    add_allow_external_argument,
    add_data_arguments,
    fmt_bytes,
    is_zarr_group,
    make_layout,
    parse_boundary,
    parse_channels,
    parse_dtype,
    parse_halo,
    parse_ints,
    parse_mesh,
    parse_pairs,
    parse_shard,
    pin_version,
    positive_int,
)
from dali_mesh.cli.locations import scrub, scrub_logs, shown
from dali_mesh.io._common import DataFileError
from dali_mesh.mesh import MeshError, MeshInfo
from dali_mesh.partition import BOUNDARIES, SPLITS, Layout, LayoutError

__all__ = ["main", "MAX_ROWS", "UsageError", "parse_boundary", "parse_halo", "parse_ints", "parse_pairs",
           "parse_shard"]

#: ``plan`` prints at most this many ranks unless ``--all`` is given (a mesh of 2**40 ranks must not
#: print, or hold, 2**40 rows by accident); ``--rank`` / ``--ranks`` pick the rows wanted.
MAX_ROWS = 4096


def build_layout(args: argparse.Namespace, coordinate: Sequence[int] | None = None,
                 shape: tuple[int, ...] | None = None, dtype: np.dtype | None = None
                 ) -> tuple[Layout, tuple[int, ...]]:
    """The ``Layout`` and sample shape that ``--mesh --shard --batch --halo --boundary --split --crop`` describe."""
    if shape is None:
        shape = parse_ints(args.shape, "--shape")
    mesh_shape, names = parse_mesh(args.mesh, args.world_size)
    mesh = MeshInfo(mesh_shape, names, coordinate or ())
    layout = make_layout(mesh, len(shape), shard=args.shard, batch=args.batch, halo=args.halo,
                         boundary=args.boundary, split=args.split, crop=getattr(args, "crop", None),
                         fill_value=args.fill_value, dtype=dtype)
    layout.region(shape)  # check the layout against the shape now, before any output
    return layout, shape


def selected_ranks(args: argparse.Namespace, size: int) -> range:
    """The ranks ``--rank`` / ``--ranks A:B`` / ``--all`` ask for; more than ``MAX_ROWS`` only with ``--all``."""
    if args.rank is not None and args.ranks is not None:
        raise UsageError("give --rank or --ranks, not both")
    if args.rank is not None:
        if not 0 <= args.rank < size:
            raise UsageError(f"--rank {args.rank} is out of range for a mesh of {size} ranks (0..{size - 1})")
        return range(args.rank, args.rank + 1)
    if args.ranks is not None:
        lo, sep, hi = args.ranks.partition(":")
        try:
            a = int(lo) if lo.strip() else 0
            b = int(hi) if hi.strip() else size
        except ValueError:
            a = b = None
        if not sep or a is None or not 0 <= a < b <= size:
            raise UsageError(f"--ranks {args.ranks!r}: expected START:STOP with 0 <= START < STOP <= {size}")
        chosen = range(a, b)
    else:
        chosen = range(size)
    if len(chosen) > MAX_ROWS and not args.all:
        raise UsageError(f"the mesh has {size} ranks and {len(chosen)} rows were asked for; plan prints at most "
                         f"{MAX_ROWS} rows: pick some with --rank R or --ranks A:B, or give --all")
    return chosen


def plan_rows(layout: Layout, shape: tuple[int, ...], dtype, ranks: Sequence[int] | None = None) -> Iterator[dict]:
    """One row per rank in ``ranks`` (every rank by default), computed one at a time: O(1) per rank."""
    itemsize = np.dtype(dtype).itemsize
    sample_cells = int(np.prod(shape))
    mesh = layout.mesh
    for rank in (range(mesh.size) if ranks is None else ranks):
        coordinate = mesh.coordinate_of(rank)
        region = layout.region(shape, coordinate)
        cells = int(np.prod(region.window_shape))
        yield {
            "rank": rank,
            "coordinate": dict(zip(mesh.names, coordinate)),
            "start": list(region.start),
            "stop": list(region.stop),
            "window_start": list(region.window_start),
            "window_stop": list(region.window_stop),
            "window_shape": list(region.window_shape),
            "bytes": cells * itemsize,
            "fraction": cells / sample_cells,
        }


def _fmt_box(lo: Sequence[int], hi: Sequence[int]) -> str:
    return "[" + ", ".join(f"{a}:{b}" for a, b in zip(lo, hi)) + "]"


_fmt_bytes = fmt_bytes  # the name tests and advice callers use


_HEADER = ["rank", "coordinate", "owned start:stop", "window", "window shape", "bytes", "fraction"]
_ADVICE_HEADER = ["cold read", "x window"]


def _cells(r: dict) -> list[str]:
    cells = [
        str(r["rank"]),
        "(" + ", ".join(str(c) for c in r["coordinate"].values()) + ")",
        _fmt_box(r["start"], r["stop"]),
        _fmt_box(r["window_start"], r["window_stop"]),
        "x".join(str(s) for s in r["window_shape"]),
        _fmt_bytes(r["bytes"]),
        f"{100 * r['fraction']:.1f}%",
    ]
    if "cold_bytes" in r:
        cells += [_fmt_bytes(r["cold_bytes"]), f"{r['cold_bytes'] / r['needed_bytes']:.2f}x" if r["needed_bytes"] else "-"]
    return cells


def format_title(layout: Layout, shape: tuple[int, ...], dtype) -> str:
    return (f"sample {'x'.join(map(str, shape))} {np.dtype(dtype)} "
            f"({_fmt_bytes(int(np.prod(shape)) * np.dtype(dtype).itemsize)}), "
            f"mesh {dict(zip(layout.mesh.names, layout.mesh.shape))}, shard {layout.shard_dims}, "
            f"batch {list(layout.batch_dims)}, replicas {list(layout.replica_dims)}, split {_split_text(layout)}")


def _split_text(layout: Layout) -> str:
    sizes = getattr(layout, "split_sizes", None)
    if not sizes:
        return str(layout.split)
    return ",".join(f"{name}={'/'.join(map(str, s))}" for name, s in sizes.items())


def _table_lines(rows: Iterator[dict], layout, shape, dtype, sizing: list[dict]) -> Iterator[str]:
    """Table lines; column widths come from ``sizing`` (a few rows: all of them when they are few,
    the first and last ones otherwise; a longer cell only shifts its own line)."""
    body = [_cells(r) for r in sizing]
    header = _HEADER + (_ADVICE_HEADER if sizing and "cold_bytes" in sizing[0] else [])
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(header)]
    yield format_title(layout, shape, dtype)
    yield "  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip()
    yield "  ".join("-" * w for w in widths)
    for r in rows:
        yield "  ".join(c.ljust(w) for c, w in zip(_cells(r), widths)).rstrip()


#: halo bands are drawn at least this fraction of the plotted extent wide (a 1-cell halo of a
#: 721-row axis would be a fraction of a pixel); the real widths are in the title
MIN_HALO_FRACTION = 0.012


def halo_bands(region, ay: int, ax: int | None, extent: tuple[float, float]) -> list[tuple[float, float, float, float]]:
    """The halo of ``region`` on the plotted axes as bands ``(x, y, w, h)`` outside its owned box: on
    each side with halo cells, a band as long as the window and as wide as the halo, widened to at
    least ``MIN_HALO_FRACTION`` of the plotted ``extent`` (x, y) so that a halo of one cell shows,
    and drawn away from the owned box (never over it)."""
    if any(s == e for s, e in zip(region.start, region.stop)):
        return []  # an empty shard has no halo
    y0, y1 = region.start[ay], region.stop[ay]
    wy0, wy1 = region.window_start[ay], region.window_stop[ay]
    if ax is None:
        x0, x1, wx0, wx1 = 0, 1, 0, 1
    else:
        x0, x1 = region.start[ax], region.stop[ax]
        wx0, wx1 = region.window_start[ax], region.window_stop[ax]
    min_x, min_y = MIN_HALO_FRACTION * extent[0], MIN_HALO_FRACTION * extent[1]
    bands = []
    if wy0 < y0:
        h = max(y0 - wy0, min_y)
        bands.append((wx0, y0 - h, wx1 - wx0, h))
    if wy1 > y1:
        bands.append((wx0, y1, wx1 - wx0, max(wy1 - y1, min_y)))
    if wx0 < x0:
        w = max(x0 - wx0, min_x)
        bands.append((x0 - w, y0, w, y1 - y0))
    if wx1 > x1:
        bands.append((x1, y0, max(wx1 - x1, min_x), y1 - y0))
    return bands


def draw_png(path: str, layout: Layout, shape: tuple[int, ...], ranks: Sequence[int] | None = None) -> None:
    """Draw the decomposition of the sharded axes: one colour per rank, each owned region solid,
    its halo as hatched bands beside it (widened so that one cell shows) and its window outlined."""
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
        from matplotlib.patches import Rectangle  # noqa: PLC0415
    except ImportError:
        raise UsageError("--png needs matplotlib (pip install matplotlib)") from None
    ndim = len(shape)
    axes = sorted({a for a in layout.shard_axes(ndim) if a >= 0})
    if not axes:
        axes = [ndim - 1]
    if len(axes) == 1:  # draw the sharded axis against the last other axis (or a unit strip)
        other = [a for a in range(ndim) if a != axes[0]]
        axes = [axes[0], other[-1]] if other else [axes[0], None]
    ay, ax = axes[0], axes[1]
    fig, plot = plt.subplots(figsize=(8, 6))
    cmap = plt.get_cmap("tab20")
    d0, d1 = layout.domain(shape)
    extent = ((d1[ax] - d0[ax]) if ax is not None else 1, d1[ay] - d0[ay])
    halo = layout.halo_pairs(ndim)
    seen = set()
    for rank in (range(layout.mesh.size) if ranks is None else ranks):
        region = layout.region(shape, layout.mesh.coordinate_of(rank))
        key = (region.start, region.stop)
        if key in seen:  # replicas and other sample groups share the same region
            continue
        seen.add(key)
        color = cmap(rank % 20)

        def box(lo, hi):
            y0, y1 = lo[ay], hi[ay]
            x0, x1 = (lo[ax], hi[ax]) if ax is not None else (0, 1)
            return x0, y0, x1 - x0, y1 - y0

        for bx, by, bw, bh in halo_bands(region, ay, ax, extent):
            plot.add_patch(Rectangle((bx, by), bw, bh, facecolor="white", hatch="////", edgecolor=color,
                                     linewidth=0.6))
        x, y, w, h = box(region.window_start, region.window_stop)
        plot.add_patch(Rectangle((x, y), w, h, fill=False, linestyle="--", edgecolor=color, linewidth=0.8))
        x, y, w, h = box(region.start, region.stop)
        plot.add_patch(Rectangle((x, y), w, h, facecolor=color, alpha=0.8, edgecolor="black"))
        plot.text(x + w / 2, y + h / 2, f"rank {rank}", ha="center", va="center", fontsize=8)
    plot.add_patch(Rectangle(
        (d0[ax] if ax is not None else 0, d0[ay]),
        (d1[ax] - d0[ax]) if ax is not None else 1, d1[ay] - d0[ay],
        fill=False, edgecolor="black", linewidth=2))
    plot.autoscale_view()
    plot.invert_yaxis()
    plot.set_xlabel(f"axis {ax}" if ax is not None else "")
    plot.set_ylabel(f"axis {ay}")
    widths = ", ".join(f"axis {a}: {halo[a][0]}/{halo[a][1]}" for a in (ay, ax) if a is not None and any(halo[a]))
    plot.set_title(f"{'x'.join(map(str, shape))} over mesh {dict(zip(layout.mesh.names, layout.mesh.shape))}"
                   f" ({layout.split}); solid: owned, dashed: window"
                   + (f"\nhatched: halo ({widths} cells low/high; drawn at least "
                      f"{MIN_HALO_FRACTION:.1%} of the axis wide)" if widths else ""), fontsize=9)
    # format="png" and a path ending in .png (checked before): matplotlib writes exactly `path`
    fig.savefig(path, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)


def check_png_path(path: str) -> None:
    """``--png`` writes exactly the path given: a file ending in ``.png`` whose folder exists."""
    if os.path.isdir(path):
        raise UsageError(f"--png {path!r} is a directory: give a file name ending in .png, e.g. {os.path.join(path, 'plan.png')}")
    if not path.lower().endswith(".png"):
        raise UsageError(f"--png {path!r} does not end in .png: give a file name ending in .png")
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        raise UsageError(f"--png {path!r}: folder {folder!r} does not exist")


def _add_layout_args(p: argparse.ArgumentParser, *, shape_required: bool) -> None:
    p.add_argument("--shape", required=shape_required, help="sample shape, e.g. 8,721,1440")
    p.add_argument("--mesh", required=True, help="mesh, e.g. data_parallel=2,model_parallel=4 (one dim may be -1)")
    p.add_argument("--shard", help="mesh dim -> sample axis, e.g. model_parallel=1")
    p.add_argument("--batch", help="mesh dims that split the dataset, comma-separated")
    p.add_argument("--halo", help="cells each side: 2 for every axis, or 1=2,2=1, or 1=LOW:HIGH")
    p.add_argument("--boundary", help=f"{'|'.join(BOUNDARIES)} for every axis, or 1=constant,2=periodic")
    p.add_argument("--fill-value", type=float, default=0.0, help="value of constant boundary cells")
    p.add_argument("--split", default="chunk",
                   help=f"{'|'.join(SPLITS)} (default chunk), or explicit sizes: model_parallel=181/181/181/178")
    p.add_argument("--crop", help="START:STOP per axis, e.g. :,0:720,: (the crop is the domain)")
    p.add_argument("--world-size", type=int, help="check the mesh against this world size (and infer a -1)")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line and exit 2, as argparse does, with our prefix
        self.exit(2, f"dali-mesh: error: {scrub(message)}\n")  # it may quote an argument: a presigned URL


def make_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="dali-mesh", description="Partition-aware data loading for DALI and torch DeviceMesh")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    plan = sub.add_parser("plan", help="print every rank's region of a sample (and, with --data, its cold read)")
    _add_layout_args(plan, shape_required=False)
    plan.add_argument("--dtype", default=None, help="sample dtype, for the byte counts (default float32)")
    plan.add_argument("--json", action="store_true", help="print a JSON list, one object per rank")
    plan.add_argument("--png", metavar="FILE.png", help="draw the decomposition of the sharded axes to exactly this file")
    plan.add_argument("--rank", type=int, help="print only this rank")
    plan.add_argument("--ranks", metavar="A:B", help="print ranks A..B-1")
    plan.add_argument("--all", action="store_true", help=f"print every rank even when there are more than {MAX_ROWS}")
    add_data_arguments(plan, data_metavar="FILE",
                       data="a .npy file, HDF5 file or Zarr store (or a folder of them): take the sample shape and "
                            "dtype from it and add, per rank, the bytes a cold read pulls and a chunk shape that fits",
                       channels="and each rank's row gives the bytes the native reader pulls",
                       share="with --data: also the bytes read per rank")
    from dali_mesh.cli import graph_plan  # noqa: PLC0415

    graph_plan.add_arguments(plan)
    plan.add_argument("--batch-size", type=positive_int, default=None, metavar="N",
                      help="with --data in object storage: samples per batch of the epoch counted (default 1; a "
                           "chunk several samples of a batch need is fetched once)")
    plan.add_argument("--get-price", type=_price, default=None, metavar="USD",
                      help="with --data in object storage: USD per 1,000 GET requests (default "
                           "S3 Standard's 0.0004, us-east-1)")
    plan.add_argument("--egress-price", type=_price, default=None, metavar="USD",
                      help="with --data in object storage: USD per GB sent out of the store's region (default 0.09, "
                           "S3 to the internet, us-east-1; 0 for readers inside the region)")

    conv = sub.add_parser("convert", help="copy data to HDF5 or Zarr with chunks aligned to the layout's shards")
    conv.add_argument("src", help=".npy file, folder of per-sample .npy files, HDF5 file or Zarr store")
    conv.add_argument("dst", help="output: a .h5/.hdf5 file or a .zarr store")
    _add_layout_args(conv, shape_required=False)
    conv.add_argument("--dataset", help="source HDF5 dataset or Zarr array name (default: the only one there)")
    add_allow_external_argument(conv)
    conv.add_argument("--name", default="data", help="dataset / array name in DST (default data)")
    conv.add_argument("--chunks", default="auto",
                      help="auto (one chunk per rank's owned region per sample, finer above 64 MiB) or a shape, "
                           "e.g. 1,8,721,360")
    conv.add_argument("--workers", type=positive_int, default=4, help="parallel copy threads (default 4)")
    conv.add_argument("--overwrite", action="store_true", help="replace an existing DST")
    conv.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    conv.add_argument("--renumber", choices=("hilbert", "morton"),
                      help="renumber the nodes of --node-axis along this space-filling curve of --coords, so that a "
                           "spatial graph partition reads a few runs of rows (writes node_permutation, "
                           "node_coordinates and the --graph's graph_offsets, graph_indices beside the data)")
    conv.add_argument("--coords", help="with --renumber: a .npy file of the nodes' (n, d) coordinates")
    conv.add_argument("--graph", help="with --renumber: a .npz file of the graph's CSR/CSC 'offsets' and 'indices', "
                                      "written renumbered")
    conv.add_argument("--node-axis", type=int, default=0,
                      help="with --renumber: the sample axis of the nodes (default 0)")

    demo = sub.add_parser("demo", help="run one epoch on local ranks and verify every sample")
    _add_demo_args(demo)
    return parser


def _price(text: str) -> float:
    """A price in USD: a number, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a price in USD (a number, 0 or more)")
    return value


def _prices(args: argparse.Namespace):
    """The ``Prices`` of ``--get-price`` and ``--egress-price`` (S3 Standard's where not given)."""
    from dali_mesh.cli.advice import S3_STANDARD, Prices  # noqa: PLC0415

    return Prices(S3_STANDARD.get_per_1000 if args.get_price is None else args.get_price,
                  S3_STANDARD.egress_per_gb if args.egress_price is None else args.egress_price)


def _add_demo_args(p: argparse.ArgumentParser) -> None:
    try:
        from dali_mesh.cli.demo import add_arguments  # noqa: PLC0415
    except ImportError:
        p.set_defaults(demo_missing=True)
        return
    add_arguments(p)


def _dataset_source(args, layout, share=None):
    from dali_mesh.weather import NetCDFDatasetSource, ZarrDatasetSource  # noqa: PLC0415

    cls = ZarrDatasetSource if is_zarr_group(args.data) else NetCDFDatasetSource
    return cls(args.data, parse_channels(args.channels), layout, shuffle=False, share=share)


def _share_arg(args):
    """``--share``: ``"group"`` or the mesh dims named, or ``None``."""
    text = getattr(args, "share", None)
    if not text:
        return None
    return "group" if text == "group" else [d.strip() for d in text.split(",") if d.strip()]


def share_lines(layout, shape, share, group_bytes, own_bytes, window_bytes) -> list[str]:
    """What ``--share`` adds under the table, for this layout's rank's group: per rank, the bytes read
    for one sample on average with the reads shared (``group_bytes()``: the group window's, over the
    group's size) against reading independently (``own_bytes(coordinate)`` of each member), and the
    window bytes exchanged (``window_bytes(region)``)."""
    from dali_mesh.partition.read_groups import group_coordinates, share_dims  # noqa: PLC0415

    dims = share_dims(layout, share)
    if not dims:
        return ["share: no mesh dim to share over (every mesh dim splits the batch, or has one rank)"]
    members = group_coordinates(layout, dims)
    g = len(members)
    grouped = group_bytes()
    own = sum(own_bytes(c) for c in members) / g
    moved = sum(window_bytes(layout.region(shape, c)) for c in members) / g * (g - 1) / g
    ratio = f"{grouped / g / own:.2f}x" if own else "-"
    return [f"share={share if isinstance(share, str) else ','.join(share)}: groups of {g} ranks over "
            f"{', '.join(dims)} (ranks {', '.join(str(layout.mesh.rank_of(c)) for c in members)}, ...); each "
            f"sample's group window is read by one member: {_fmt_bytes(int(grouped))} per sample, "
            f"{_fmt_bytes(int(grouped / g))} per rank on average, against {_fmt_bytes(int(own))} per rank reading "
            f"independently ({ratio}); then about {_fmt_bytes(int(moved))} of windows per rank per sample are "
            "sent, and as many received"]


def cmd_plan_dataset(args: argparse.Namespace) -> int:
    """``plan --data STORE --channels ...``: per rank the window and the stored bytes the native reader
    pulls for the first sample (each variable planned as read_dataset reads it), and per variable the
    reader taken."""
    from dali_mesh.pipeline.dataset_reader import plan_dataset, reader_of  # noqa: PLC0415

    for flag in ("dataset", "png", "json", "batch_size", "get_price", "egress_price"):
        if getattr(args, flag) not in (None, False):
            raise UsageError(f"--{flag.replace('_', '-')} does not go with --channels")
    one = Layout(MeshInfo((1,), ("all",), (0,)))
    probe = _dataset_source(args, one)
    shape, dtype = probe.sample_shape, np.dtype(probe.dtype)
    if args.shape and parse_ints(args.shape, "--shape") != shape:
        raise UsageError(f"--shape {args.shape} disagrees with the channels' samples {shape}: leave --shape out")
    layout, shape = build_layout(args, shape=shape, dtype=dtype)
    ranks = selected_ranks(args, layout.mesh.size)
    print(f"{shown(args.data)}: samples (channel, {', '.join(probe.spatial_dims)}) = {shape} {dtype}, "
          f"{len(probe.channels)} channels ({', '.join(map(str, probe.channels))}), {probe.num_samples} steps")
    print("| rank | coordinate | window | window bytes (stored dtypes) | read bytes (one sample, stored) | read / window |")
    print("|---|---|---|---|---|---|")
    readers = reader = None
    total_w = total_r = 0
    for rank in ranks:
        coord = layout.mesh.coordinate_of(rank)
        rank_layout, _ = build_layout(args, coordinate=coord, shape=shape, dtype=dtype)
        src = _dataset_source(args, rank_layout)
        # the window in the stored dtypes (the output's cast aside), part by part
        window = sum(int(np.prod(sub.region.window_shape)) * np.dtype(sub.dtype).itemsize for sub, _ in src.parts)
        parts, stacked = plan_dataset(src, stack=reader is None)  # the reader line is the first rank's
        read = sum(p[0].item_read_bytes(0) for p in parts if not isinstance(p, str))
        why = [p if isinstance(p, str) else "native" for p in parts]
        readers = readers or list(zip((sub.name for sub, _ in src.parts), why))
        reader = reader or reader_of(stacked)
        total_w, total_r = total_w + window, total_r + read
        ratio = f"{read / window:.2f}x" if window else "-"
        print(f"| {rank} | {coord} | {src.region.window_shape} | {_fmt_bytes(window)} | {_fmt_bytes(read)} | {ratio} |")
    if reader:
        print(f"read_dataset: {reader}")
    share = _share_arg(args)
    if share is not None:
        def read_of(src):  # the stored bytes the native reader pulls for sample 0
            parts, _ = plan_dataset(src.group_reader(), stack=False)
            return sum(p[0].item_read_bytes(0) for p in parts if not isinstance(p, str))

        def own(c):
            return read_of(_dataset_source(args, build_layout(args, coordinate=c, shape=shape, dtype=dtype)[0]))

        for line in share_lines(layout, shape, share, lambda: read_of(_dataset_source(args, layout, share=share)),
                                own, lambda r: int(np.prod(r.window_shape)) * dtype.itemsize):
            print(line)
    for name, why in readers or []:
        print(f"variable {name}: reader: {why}")
    if total_w:
        print(f"read of one sample per rank: {total_r / total_w:.2f}x the window bytes in all (stored, compressed "
              "bytes of the chunks the windows touch; a chunk larger than a window is read whole)")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    if getattr(args, "rows_from", None):
        if not args.data:
            raise UsageError("--rows-from goes with --data STORE")
        from dali_mesh.cli import graph_plan  # noqa: PLC0415

        return graph_plan.plan_rows(args)
    if getattr(args, "graph", None) or getattr(args, "hops", 0):
        raise UsageError("--graph and --hops go with --rows-from")
    if getattr(args, "channels", None):
        if not args.data:
            raise UsageError("--channels goes with --data STORE")
        return cmd_plan_dataset(args)
    advice = None
    if args.png:
        check_png_path(args.png)
    if args.data:
        from dali_mesh.cli.advice import open_layout_target  # noqa: PLC0415

        target = open_layout_target(args.data, args.dataset, allow_external=args.allow_external)
        shape, dtype = target.sample_shape, target.dtype
        if args.shape and parse_ints(args.shape, "--shape") != shape:
            raise UsageError(f"--shape {args.shape} disagrees with --data {shown(args.data)!r} (samples of {shape}): "
                             "leave --shape out")
        if args.dtype and parse_dtype(args.dtype) != dtype:
            raise UsageError(f"--dtype {args.dtype} disagrees with --data {shown(args.data)!r} ({dtype}): leave --dtype out")
        advice = target
    else:
        if not args.shape:
            raise UsageError("plan needs --shape (e.g. --shape 8,721,1440) or --data FILE")
        if args.dataset:
            raise UsageError("--dataset goes with --data")
        dtype = parse_dtype(args.dtype or "float32")
        shape = None
    layout, shape = build_layout(args, shape=shape, dtype=dtype)
    for flag in ("share", "batch_size", "get_price", "egress_price"):
        if getattr(args, flag, None) is not None and advice is None:
            raise UsageError(f"--{flag.replace('_', '-')} goes with --data")
    batch_size = args.batch_size or 1

    def layout_of(rank: int) -> Layout:
        return build_layout(args, coordinate=layout.mesh.coordinate_of(rank), shape=shape, dtype=dtype)[0]

    ranks = selected_ranks(args, layout.mesh.size)
    rows: Iterator[dict] = plan_rows(layout, shape, dtype, ranks)
    if advice is not None:
        rows = advice.annotate(layout, rows)
    if args.json and advice is not None:  # object storage: what each rank's epoch fetches, and costs
        rows = advice.epoch_rows(layout_of, rows, _share_arg(args), batch_size=batch_size, prices=_prices(args))
    if args.json:
        out = sys.stdout
        out.write("[")
        for i, r in enumerate(rows):  # streamed: memory does not grow with the number of rows
            del r["fraction"]
            out.write((", " if i else "") + json.dumps(r))
        out.write("]\n")
    else:
        head = list(plan_rows(layout, shape, dtype, ranks[:64]))
        if len(ranks) > 128:
            head += list(plan_rows(layout, shape, dtype, ranks[-64:]))
        if advice is not None:
            head = list(advice.annotate(layout, iter(head)))
        for line in _table_lines(rows, layout, shape, dtype, head):
            print(line)
        if advice is not None:
            for line in advice.summary(layout):
                print(line)
            share = _share_arg(args)
            if share is not None:
                from dali_mesh.partition.read_groups import group_region, share_dims  # noqa: PLC0415

                dims = share_dims(layout, share)
                for line in share_lines(layout, shape, share,
                                        lambda: advice.cost(group_region(layout, shape, dims))[1],
                                        lambda c: advice.cost(layout.region(shape, c))[1],
                                        lambda r: int(np.prod(r.window_shape)) * np.dtype(dtype).itemsize):
                    print(line)
            # object storage: what the native reader fetches (bytes and requests), per rank, for one sample
            # and one epoch, and what the epoch costs
            for line in advice.fetch_lines(layout_of, ranks, share, _fmt_bytes):
                print(line)
            for line in advice.epoch_lines(layout_of, ranks, share, batch_size=batch_size, prices=_prices(args),
                                           fmt=_fmt_bytes):
                print(line)
    if args.png:
        try:
            draw_png(args.png, layout, shape, ranks)
        except OSError as e:
            raise UsageError(f"cannot write --png {args.png!r}: {e.strerror or e}") from None
        if not args.json:
            print(f"wrote {args.png}")
    return 0


def _os_reason(e: BaseException) -> str:
    """What an I/O error says, on one line (HDF5's messages span lines and name buffers and times)."""
    import re  # noqa: PLC0415

    if isinstance(e, OSError) and e.strerror and not str(e).startswith("["):
        text = e.strerror + (f" ({e.filename})" if e.filename else "")
    else:
        text = str(e)
    m = re.search(r"error message = '([^']*)'", text)
    if m:
        errno = re.search(r"errno = (\d+)", text)
        text = m.group(1) + (f" (errno {errno.group(1)})" if errno else "")
    return " ".join(text.split())


def cmd_convert(args: argparse.Namespace) -> int:
    import signal  # noqa: PLC0415

    from dali_mesh.cli.convert import convert  # noqa: PLC0415

    def terminated(signum, frame):  # SIGTERM: unwind like Ctrl-C, so that the partial copy is removed
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        report = convert(args)
    except KeyboardInterrupt:
        print("dali-mesh: convert interrupted; the partial copy is removed", file=sys.stderr)
        return 130
    except (OSError, RuntimeError) as e:  # a full disk, a read-only folder (h5py raises either)
        raise UsageError(f"convert failed writing the copy: {_os_reason(e)}; the partial copy is removed") from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(report)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    # the locations given: every message is scrubbed of their credentials (a presigned URL's query,
    # user info) before it is printed, whichever part of dali_mesh wrote it
    given = [getattr(args, k, None) for k in ("data", "src", "dst")]
    scrub_logs(given)
    try:
        if args.command in ("plan", "demo"):
            pin_version(args)  # a branch or tag resolved once: every rank reads one snapshot
        if args.command == "plan":
            return cmd_plan(args)
        if args.command == "convert":
            return cmd_convert(args)
        if args.command == "demo":
            if getattr(args, "demo_missing", False):
                raise UsageError("the demo is not available in this build")
            from dali_mesh.cli.demo import run  # noqa: PLC0415

            return run(args)
    except (UsageError, MeshError, LayoutError, DataFileError) as e:
        print(f"dali-mesh: error: {scrub(str(e), given)}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except Exception as e:  # a defect, or an error no check foresaw: the traceback, for a report, scrubbed
        import traceback  # noqa: PLC0415

        sys.stderr.write(scrub("".join(traceback.format_exception(e)), given))
        return 1
    return 2


