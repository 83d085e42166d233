"""Command-line argument helpers shared by ``dali-mesh plan``, ``demo`` and ``convert``.

One home for turning the strings of ``--shape --mesh --shard --batch --halo --boundary --split
--crop --fill-value --dtype`` into values, so that :mod:`dali_mesh.cli` and :mod:`dali_mesh.cli.demo`
import this module and not each other. Every bad value raises :class:`UsageError`, whose text names
the option, the value and what to give instead; the CLI prints it as one line and exits with 2.
"""
from __future__ import annotations

import argparse
import math
import os

import numpy as np

from dali_mesh.cli.locations import format_of_location, name_of, scrub, shown
from dali_mesh.formats import FORMATS, ArrayFormat
from dali_mesh.mesh import MeshInfo, parse_mesh_shape, resolve_mesh_shape
from dali_mesh.partition import Layout, check_fill_value
from dali_mesh.storage import DataFileError, local_path_of, store_of

__all__ = [
    "UsageError",
    "parse_ints",
    "parse_pairs",
    "parse_halo",
    "parse_boundary",
    "parse_shard",
    "parse_channels",
    "parse_split",
    "parse_crop",
    "parse_dtype",
    "parse_mesh",
    "positive_int",
    "positive_float",
    "make_layout",
    "data_kind",
    "find_data",
    "add_allow_external_argument",
    "add_data_arguments",
    "add_version_arguments",
    "pin_version",
]


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


def parse_halo(text: str | None) -> dict[int, int | tuple[int, int]] | int | tuple[int, int]:
    """``"1=2,2=1"``, ``"1=2:3"`` (low:high) or a bare ``"2"`` / ``"1:2"`` for every axis."""
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
    """``"model_parallel=1"`` -> ``{"model_parallel": 1}``."""
    return {name: _axis(axis, "--shard") for name, axis in parse_pairs(text, "--shard").items()}


def parse_split(text: str | None) -> str | dict[str, list[int]]:
    """A rule name (``chunk``, ``physicsnemo``, ``even``) or explicit shard sizes per mesh dim:
    ``model_parallel=181/181/181/178`` (several dims separated by commas)."""
    if not text:
        return "chunk"
    if "=" not in text:
        return text
    out = {}
    for name, sizes in parse_pairs(text, "--split").items():
        try:
            out[name] = [int(s) for s in sizes.split("/")]
        except ValueError:
            raise UsageError(f"malformed --split {text!r}: sizes of {name!r} must be integers separated by '/', "
                             "e.g. model_parallel=181/181/181/178") from None
    return out


def parse_crop(text: str | None) -> list | None:
    """``":,0:720,:"`` -> ``[None, (0, 720), None]`` (START:STOP per axis, ``:`` for the whole axis)."""
    if not text:
        return None
    crop: list = []
    for part in text.split(","):
        if part in ("", ":"):
            crop.append(None)
            continue
        lo, sep, hi = part.partition(":")
        if not sep:
            raise UsageError(f"malformed --crop {text!r}: expected START:STOP per axis")
        try:
            crop.append((int(lo), int(hi)))
        except ValueError:
            raise UsageError(f"malformed --crop {text!r}: {part!r} is not START:STOP") from None
    return crop


def parse_dtype(text: str, what: str = "--dtype") -> np.dtype:
    """A plain numeric dtype (bool, integers, floats, complex) from its numpy name."""
    try:
        dtype = np.dtype(text)
    except (TypeError, SyntaxError, ValueError):  # numpy parses ',f4' with Python's parser: SyntaxError
        raise UsageError(f"unknown {what} {text!r}: give a numpy dtype name such as float32, uint8, <f4") from None
    if dtype.kind not in "biufc" or dtype.fields is not None or dtype.subdtype is not None:
        raise UsageError(f"{what} {text!r} is not a plain numeric dtype: give e.g. float32, int16, uint8")
    return dtype


def parse_mesh(text: str, world_size: int | None = None) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """``--mesh`` (and ``--world-size`` to check it and infer one ``-1``) -> ``(shape, names)``."""
    mesh_shape, names = parse_mesh_shape(text)
    if -1 in mesh_shape:
        if world_size is None:
            raise UsageError(f"--mesh {text!r} has a -1: give --world-size to infer it")
        mesh_shape = resolve_mesh_shape(mesh_shape, world_size)
    elif world_size is not None:
        resolve_mesh_shape(mesh_shape, world_size)
    return mesh_shape, names


def positive_int(text: str) -> int:
    """argparse ``type=`` for counts that must be at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def positive_float(text: str) -> float:
    """argparse ``type=`` for durations that must be finite and above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number of seconds above 0")
    return value


def make_layout(
    mesh: MeshInfo,
    ndim: int,
    *,
    shard: str | None,
    batch: str | None = None,
    halo: str | None = None,
    boundary: str | None = None,
    split: str | None = None,
    crop: str | None = None,
    fill_value: float = 0.0,
    dtype: np.dtype | None = None,
) -> Layout:
    """The ``Layout`` that the command-line strings describe, for samples of ``ndim`` axes
    (``--halo LOW:HIGH`` applies to every axis). ``dtype``: check ``fill_value`` against it."""
    halo_value = parse_halo(halo)
    if isinstance(halo_value, tuple):  # LOW:HIGH for every axis
        halo_value = {a: halo_value for a in range(ndim)}
    if dtype is not None:
        check_fill_value(fill_value, dtype, " (--fill-value against --dtype)")
    return Layout(
        mesh,
        shard=parse_shard(shard),
        batch=batch.split(",") if batch else None,
        crop=parse_crop(crop),
        halo=halo_value,
        boundary=parse_boundary(boundary),
        fill_value=fill_value,
        split=parse_split(split),
    )


def data_kind(path: str) -> str | None:
    """The name of the registered format (:mod:`dali_mesh.formats`) that reads ``path``, by its
    name, else ``None``."""
    fmt = format_of_location(path)
    return None if fmt is None else fmt.name


def is_zarr_group(location: str) -> bool:
    """Whether a weather dataset's location is a Zarr group (else NetCDF4 files): a folder here, and in
    an object store any name but a NetCDF4/HDF5 file's."""
    path = local_path_of(location)
    if path is not None:  # by path: a folder of this machine is asked of the file system
        return os.path.isdir(path)
    return not name_of(location).rstrip("/").lower().endswith((".nc", ".nc4", ".h5", ".hdf5", ".hdf"))


def find_data(path: str, what: str = "--data") -> tuple[ArrayFormat, list[str]]:
    """``(format, files)`` of a data path: one file or store of a registered format, or a folder
    of them (the first format found, in the registry's order; files sorted by name)."""
    names = ", ".join(s for f in FORMATS.values() for s in f.probe_names())
    said = shown(path)  # never the query of a presigned URL, nor user info
    store, key = store_of(path)
    if store.local_path(key) is None:  # s3://, gs://, https://: by name (an http(s) URL's without its query); a prefix is listed
        fmt = format_of_location(path)
        if fmt is not None:
            return fmt, [path]
        if not store.supports_listing:
            raise UsageError(f"{what} {said!r} is not a file or store of a known format ({names}), and its store "
                             "cannot list a folder")
        try:
            objects, prefixes = store.list(key.rstrip("/") + "/")
        except DataFileError as e:
            raise UsageError(f"{what} {said!r} is not a file or store of a known format ({names}), and "
                             f"{scrub(str(e), [path])}") from None
        entries = sorted(store.name_of(k) for k, _ in objects) + sorted(store.name_of(p.rstrip("/")) for p in prefixes)
        if not entries:
            raise UsageError(f"{what} {said!r} does not exist (no object under it)")
    else:
        if not os.path.exists(path):
            raise UsageError(f"{what} {said!r} does not exist")
        fmt = format_of_location(path)
        if fmt is not None and (fmt.container == "store" or not os.path.isdir(path)):
            return fmt, [path]
        if not os.path.isdir(path):
            raise UsageError(f"{what} {said!r} is neither a file or store of a known format ({names}) nor a folder "
                             "of them")
        entries = sorted(os.path.join(path, e) for e in os.listdir(path))
    for fmt in FORMATS.values():
        files = [e for e in entries if fmt.probe(e)]
        if files:
            return fmt, files
    for fmt in FORMATS.values():  # no name says: a store whose root is one (an icechunk:// repository), asked
        if fmt.container == "store" and store.local_path(key) is None and fmt.is_store(path):
            return fmt, [path]
    raise UsageError(f"{what} {said!r} holds no files of a known format ({names})")


def fmt_bytes(n: float) -> str:
    """``n`` bytes in B, KiB, MiB, GiB or TiB (one decimal), as the command line's tables print them."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def load_graph(path: str, what: str = "--graph") -> tuple[np.ndarray, np.ndarray]:
    """The CSR/CSC ``(offsets, indices)`` of a ``.npz`` file holding arrays ``offsets`` and ``indices``
    (checked against the nodes by :func:`dali_mesh.partition.rows._check_graph` where they are used)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            if not {"offsets", "indices"} <= set(z.files):
                raise UsageError(f"{what} {shown(path)!r} holds {sorted(z.files)}: it needs 'offsets' and 'indices' "
                                 "(CSR/CSC)")
            return z["offsets"], z["indices"]
    except (OSError, ValueError) as e:
        raise UsageError(f"{what} {shown(path)!r}: {e}") from None


def parse_channels(text: str) -> list:
    """``2m_temperature,geopotential@500,temperature@500/850`` as dataset channel picks (levels as
    numbers where they read as numbers)."""
    def level(v: str):
        for kind in (int, float):
            try:
                return kind(v)
            except ValueError:
                pass
        return v

    out = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            raise UsageError(f"--channels {text!r}: an empty channel")
        name, at, levels = item.partition("@")
        if not name:
            raise UsageError(f"--channels {text!r}: {item!r} names no variable")
        if not at:
            out.append(name)
            continue
        if not levels or any(not v.strip() for v in levels.split("/")):
            raise UsageError(f"--channels {text!r}: {item!r} names no level after '@' (give {name}@500 or "
                             f"{name}@500/850, or {name} for all its levels)")
        values = [level(v.strip()) for v in levels.split("/")]
        out.append((name, values if len(values) > 1 else values[0]))
    return out


#: the flags that choose a version of a versioned store (an Icechunk repository), as storage_options name them
VERSION_FLAGS = ("branch", "tag", "snapshot")


def add_data_arguments(p: argparse.ArgumentParser, *, data: str, channels: str, share: str,
                       data_metavar: str | None = None) -> None:
    """The arguments of the data a command reads, one definition for ``plan`` and ``demo``: ``--data`` (its
    help ``data``), ``--dataset``, its version (:func:`add_version_arguments`), ``--channels`` (``channels``:
    what the command gives of a sample of channels), ``--allow-external`` and ``--share`` (``share``: what the
    command does with shared reads, said before how they are shared)."""
    p.add_argument("--data", metavar=data_metavar, help=data)
    p.add_argument("--dataset", help="HDF5 dataset or Zarr array name (default: the only one there)")
    add_version_arguments(p)
    p.add_argument("--channels", metavar="VAR[@LEVEL[/LEVEL...]],...",
                   help="with --data STORE (an xarray-written Zarr group or a NetCDF4 file): the channels of a "
                        "sample, e.g. 2m_temperature,geopotential@500,temperature@500/850; the sample is then "
                        f"(channel, *spatial dims), {channels}")
    add_allow_external_argument(p)
    p.add_argument("--share", metavar="group|DIM,...",
                   help=f"{share} when the ranks that read the same samples share the reads (source share=...: "
                        "each sample's group window read once per group, the windows exchanged)")


def add_allow_external_argument(p: argparse.ArgumentParser) -> None:
    """``--allow-external``, as every command that reads HDF5 takes it."""
    p.add_argument("--allow-external", action="store_true",
                   help="read HDF5 datasets whose data lie in other files (external storage, external "
                        "links, virtual datasets); refused by default: a file must not make dali-mesh read "
                        "files you never named")


def add_version_arguments(p: argparse.ArgumentParser) -> None:
    """``--branch``, ``--tag`` and ``--snapshot``: which version of ``--data`` (an ``icechunk://`` repository)."""
    for flag, what in (("branch", "the tip of this branch (default main)"), ("tag", "this tag"),
                       ("snapshot", "this snapshot id")):
        p.add_argument(f"--{flag}", help=f"with --data icechunk://REPO: read {what}, resolved once to a snapshot id "
                                         "that every rank reads")


def pin_version(args: argparse.Namespace) -> None:
    """Resolves a versioned ``--data`` (an ``icechunk://`` repository) at the ``--branch``, ``--tag`` or
    ``--snapshot`` given (default: its store's, the branch main) ONCE, and puts the location of that
    snapshot (``icechunk://REPO@SNAPSHOT``) in ``args.data``: every rank of the demo, and every open of the
    plan, reads the same snapshot, whatever is committed meanwhile. Other locations are left as they are,
    and refuse the flags."""
    chosen = {k: getattr(args, k) for k in VERSION_FLAGS if getattr(args, k, None)}
    flags = ", ".join(f"--{k}" for k in chosen)
    if not getattr(args, "data", None):
        if chosen:
            raise UsageError(f"{flags} choose a version of --data (an icechunk:// repository): give --data")
        return
    try:
        store, key = store_of(args.data, chosen)
    except ValueError as e:  # two versions chosen, or a store that takes no such option (s3://)
        raise UsageError(f"--data {shown(args.data)!r}: {scrub(str(e), [args.data])}") from None
    if not store.versioned:
        if chosen:
            raise UsageError(f"{flags} choose a version of a versioned store (an icechunk:// repository); --data "
                             f"{shown(args.data)!r} has none")
        return
    args.data = store.name_of(key)
