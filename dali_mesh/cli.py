"""``dali-mesh``: the command line.

    dali-mesh plan --shape 8,721,1440 --mesh data_parallel=2,model_parallel=4 --shard model_parallel=1
    dali-mesh demo [--nproc 4] ...

Bad input gets one line on stderr and exit code 2, never a traceback.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

import numpy as np

from dali_mesh.io._common import DataFileError
from dali_mesh.mesh import MeshError, MeshInfo, parse_mesh_shape, resolve_mesh_shape
from dali_mesh.partition import BOUNDARIES, SPLITS, Layout, LayoutError

__all__ = ["main"]


class UsageError(ValueError):
    """Bad command-line input."""


def parse_ints(text: str, what: str) -> tuple[int, ...]:
    """``"8,721,1440"`` -> ``(8, 721, 1440)``."""
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise UsageError(f"malformed {what} {text!r}: expected comma-separated integers, e.g. 8,721,1440") from None
    return values


def parse_pairs(text: str | None, what: str) -> dict[str, str]:
    """``"1=2,2=1"`` -> ``{"1": "2", "2": "1"}``."""
    if not text:
        return {}
    out = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise UsageError(f"malformed {what} {text!r}: expected KEY=VALUE pairs separated by commas")
        if key.strip() in out:
            raise UsageError(f"malformed {what} {text!r}: {key.strip()!r} is given twice")
        out[key.strip()] = value.strip()
    return out


def _axis(key: str, what: str) -> int:
    try:
        return int(key)
    except ValueError:
        raise UsageError(f"{what}: axis {key!r} is not an integer") from None


def parse_halo(text: str | None) -> dict[int, int | tuple[int, int]] | int:
    """``"1=2,2=1"``, ``"1=2:3"`` (low:high) or a bare ``"2"`` for every axis."""
    if not text:
        return 0
    if "=" not in text:
        return _halo_value(text, "every axis")
    out: dict[int, int | tuple[int, int]] = {}
    for key, value in parse_pairs(text, "--halo").items():
        out[_axis(key, "--halo")] = _halo_value(value, f"axis {key}")
    return out


def _halo_value(value: str, where: str) -> int | tuple[int, int]:
    try:
        if ":" in value:
            lo, hi = value.split(":")
            return int(lo), int(hi)
        return int(value)
    except ValueError:
        raise UsageError(f"--halo: {value!r} for {where} is not an integer or LOW:HIGH") from None


def parse_boundary(text: str | None) -> str | dict[int, str]:
    """``"periodic"`` for every axis, or ``"1=constant,2=periodic"``."""
    if not text:
        return "constant"
    if "=" not in text:
        return text
    return {_axis(k, "--boundary"): v for k, v in parse_pairs(text, "--boundary").items()}


def parse_shard(text: str | None) -> dict[str, int]:
    return {name: _axis(axis, "--shard") for name, axis in parse_pairs(text, "--shard").items()}


def build_layout(args: argparse.Namespace, coordinate: Sequence[int] | None = None) -> tuple[Layout, tuple[int, ...]]:
    """The ``Layout`` and sample shape that ``--mesh --shard --batch --halo --boundary --split --crop`` describe."""
    shape = parse_ints(args.shape, "--shape")
    mesh_shape, names = parse_mesh_shape(args.mesh)
    if -1 in mesh_shape:
        if args.world_size is None:
            raise UsageError(f"--mesh {args.mesh!r} has a -1: give --world-size to infer it")
        mesh_shape = resolve_mesh_shape(mesh_shape, args.world_size)
    elif args.world_size is not None:
        resolve_mesh_shape(mesh_shape, args.world_size)
    mesh = MeshInfo(mesh_shape, names, coordinate or ())
    batch = args.batch.split(",") if args.batch else None
    crop = None
    if getattr(args, "crop", None):
        crop = []
        for part in args.crop.split(","):
            if part in ("", ":"):
                crop.append(None)
                continue
            lo, sep, hi = part.partition(":")
            if not sep:
                raise UsageError(f"malformed --crop {args.crop!r}: expected START:STOP per axis")
            try:
                crop.append((int(lo), int(hi)))
            except ValueError:
                raise UsageError(f"malformed --crop {args.crop!r}: {part!r} is not START:STOP") from None
    halo = parse_halo(args.halo)
    if isinstance(halo, tuple):  # LOW:HIGH for every axis
        halo = {a: halo for a in range(len(shape))}
    layout = Layout(
        mesh,
        shard=parse_shard(args.shard),
        batch=batch,
        crop=crop,
        halo=halo,
        boundary=parse_boundary(args.boundary),
        fill_value=args.fill_value,
        split=args.split,
    )
    layout.region(shape)  # check the layout against the shape now, before any output
    return layout, shape


def plan_rows(layout: Layout, shape: tuple[int, ...], dtype: str) -> list[dict]:
    itemsize = np.dtype(dtype).itemsize
    rows = []
    sample_cells = int(np.prod(shape))
    for rank, (coordinate, region) in enumerate(zip(layout.mesh.coordinates(), layout.regions(shape))):
        cells = int(np.prod(region.window_shape))
        rows.append({
            "rank": rank,
            "coordinate": dict(zip(layout.mesh.names, coordinate)),
            "start": list(region.start),
            "stop": list(region.stop),
            "window_start": list(region.window_start),
            "window_stop": list(region.window_stop),
            "window_shape": list(region.window_shape),
            "bytes": cells * itemsize,
            "fraction": cells / sample_cells,
        })
    return rows


def _fmt_box(lo: Sequence[int], hi: Sequence[int]) -> str:
    return "[" + ", ".join(f"{a}:{b}" for a, b in zip(lo, hi)) + "]"


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def format_table(rows: list[dict], layout: Layout, shape: tuple[int, ...], dtype: str) -> str:
    header = ["rank", "coordinate", "owned start:stop", "window", "window shape", "bytes", "fraction"]
    body = []
    for r in rows:
        body.append([
            str(r["rank"]),
            "(" + ", ".join(str(c) for c in r["coordinate"].values()) + ")",
            _fmt_box(r["start"], r["stop"]),
            _fmt_box(r["window_start"], r["window_stop"]),
            "x".join(str(s) for s in r["window_shape"]),
            _fmt_bytes(r["bytes"]),
            f"{100 * r['fraction']:.1f}%",
        ])
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(header)]
    lines = [
        f"sample {'x'.join(map(str, shape))} {dtype} ({_fmt_bytes(int(np.prod(shape)) * np.dtype(dtype).itemsize)}), "
        f"mesh {dict(zip(layout.mesh.names, layout.mesh.shape))}, shard {layout.shard_dims}, "
        f"batch {list(layout.batch_dims)}, replicas {list(layout.replica_dims)}, split {layout.split}",
        "  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip(),
        "  ".join("-" * w for w in widths),
    ]
    lines += ["  ".join(c.ljust(w) for c, w in zip(b, widths)).rstrip() for b in body]
    return "\n".join(lines)


def draw_png(path: str, layout: Layout, shape: tuple[int, ...]) -> None:
    """Draw the decomposition of the sharded axes: one colour per rank, halos hatched."""
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
    seen = set()
    for rank, region in enumerate(layout.regions(shape)):
        key = (region.start, region.stop)
        if key in seen:  # replicas and other sample groups share the same region
            continue
        seen.add(key)
        color = cmap(rank % 20)

        def box(lo, hi):
            y0, y1 = lo[ay], hi[ay]
            x0, x1 = (lo[ax], hi[ax]) if ax is not None else (0, 1)
            return x0, y0, x1 - x0, y1 - y0

        x, y, w, h = box(region.window_start, region.window_stop)
        plot.add_patch(Rectangle((x, y), w, h, fill=False, hatch="//", edgecolor=color, linewidth=0.8))
        x, y, w, h = box(region.start, region.stop)
        plot.add_patch(Rectangle((x, y), w, h, facecolor=color, alpha=0.6, edgecolor="black"))
        plot.text(x + w / 2, y + h / 2, f"rank {rank}", ha="center", va="center", fontsize=8)
    d0, d1 = layout.domain(shape)
    plot.add_patch(Rectangle(
        (d0[ax] if ax is not None else 0, d0[ay]),
        (d1[ax] - d0[ax]) if ax is not None else 1, d1[ay] - d0[ay],
        fill=False, edgecolor="black", linewidth=2))
    plot.autoscale_view()
    plot.invert_yaxis()
    plot.set_xlabel(f"axis {ax}" if ax is not None else "")
    plot.set_ylabel(f"axis {ay}")
    plot.set_title(f"{'x'.join(map(str, shape))} over mesh {dict(zip(layout.mesh.names, layout.mesh.shape))}"
                   f" ({layout.split}); hatched: halo")
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


def _add_layout_args(p: argparse.ArgumentParser, *, shape_required: bool) -> None:
    p.add_argument("--shape", required=shape_required, help="sample shape, e.g. 8,721,1440")
    p.add_argument("--mesh", required=True, help="mesh, e.g. data_parallel=2,model_parallel=4 (one dim may be -1)")
    p.add_argument("--shard", help="mesh dim -> sample axis, e.g. model_parallel=1")
    p.add_argument("--batch", help="mesh dims that split the dataset, comma-separated")
    p.add_argument("--halo", help="cells each side: 2 for every axis, or 1=2,2=1, or 1=LOW:HIGH")
    p.add_argument("--boundary", help=f"{'|'.join(BOUNDARIES)} for every axis, or 1=constant,2=periodic")
    p.add_argument("--fill-value", type=float, default=0.0, help="value of constant boundary cells")
    p.add_argument("--split", default="chunk", help=f"{'|'.join(SPLITS)} (default chunk)")
    p.add_argument("--crop", help="START:STOP per axis, e.g. :,0:720,: (the crop is the domain)")
    p.add_argument("--world-size", type=int, help="check the mesh against this world size (and infer a -1)")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line and exit 2, as argparse does, with our prefix
        self.exit(2, f"dali-mesh: error: {message}\n")


def make_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="dali-mesh", description="Partition-aware data loading for DALI and torch DeviceMesh")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    plan = sub.add_parser("plan", help="print every rank's region of a sample")
    _add_layout_args(plan, shape_required=True)
    plan.add_argument("--dtype", default="float32", help="sample dtype, for the byte counts")
    plan.add_argument("--json", action="store_true", help="print a JSON list, one object per rank")
    plan.add_argument("--png", metavar="FILE", help="draw the decomposition of the sharded axes")

    demo = sub.add_parser("demo", help="run one epoch on local ranks and verify every sample")
    _add_demo_args(demo)
    return parser


def _add_demo_args(p: argparse.ArgumentParser) -> None:
    try:
        from dali_mesh.demo import add_arguments  # noqa: PLC0415
    except ImportError:
        p.set_defaults(demo_missing=True)
        return
    add_arguments(p)


def cmd_plan(args: argparse.Namespace) -> int:
    try:
        dtype = np.dtype(args.dtype)
    except TypeError:
        raise UsageError(f"unknown --dtype {args.dtype!r}") from None
    if dtype.kind not in "biufc":
        raise UsageError(f"--dtype {args.dtype!r} is not a numeric dtype")
    layout, shape = build_layout(args)
    rows = plan_rows(layout, shape, args.dtype)
    if args.json:
        for r in rows:
            del r["fraction"]
        print(json.dumps(rows))
    else:
        print(format_table(rows, layout, shape, args.dtype))
    if args.png:
        try:
            draw_png(args.png, layout, shape)
        except OSError as e:
            raise UsageError(f"cannot write --png {args.png!r}: {e.strerror or e}") from None
        if not args.json:
            print(f"wrote {args.png}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    try:
        if args.command == "plan":
            return cmd_plan(args)
        if args.command == "demo":
            if getattr(args, "demo_missing", False):
                raise UsageError("the demo is not available in this build")
            from dali_mesh.demo import run  # noqa: PLC0415

            return run(args)
    except (UsageError, MeshError, LayoutError, DataFileError) as e:
        print(f"dali-mesh: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
