"""The byte-range read plan of the native reader: typed objects mirroring ``csrc/plan/plan.h``,
and the one field table per object that writes them into the plan file the C++ reader loads.

A plan turns one file layout (shape, dtype, header, byte order, C/Fortran order) and one rank's window
into

- units ``(file offset, window offset, bytes)``, each repeated ``unit_count`` times at ``file_step``
  and ``dst_step`` bytes further (the rows of a box: so a plan grows with a window's distinct runs, not
  with its elements), sorted by file offset, their spans disjoint, grouped into merged reads (one
  ``preadv`` each; the gaps of a group, between units and between a unit's runs, land in a scratch
  buffer),
- a byte-swap unit (the units read are swapped in place as they land),
- a finishing program: the Fortran transpose, then per axis copies (reflect, symmetric, edge,
  periodic halos wider than the domain) and constant fills, as :meth:`WindowPlan.finish` does,
- the bytes every file read by it must hold at ``check_offset`` (a header; with
  :data:`CHECK_JSON` a metadata file's JSON, compared in the canonical form the reader computes).

A :class:`PlanSet` holds the distinct plans, the file table and one :class:`PlanItem` per sample id
(its :class:`PlanPart` reads, then the plan whose program finishes the window).

The file is little-endian int64 words: :data:`PLAN_MAGIC`, then what the field tables below say, then a
checksum word (computed by the kernels library, the same code that verifies it). Each table is the
only description of its object's encoding: :func:`encode` writes it, the C++ loader reads it, and
``tests/io/test_read_plan.py`` holds the loader to it (``_kernels.plan_dump`` of a written plan
equals :meth:`ReadPlan.to_dict`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import Any, Mapping, NamedTuple

import numpy as np

from dali_mesh.partition import check_fill_value
from dali_mesh.plan.encoding import _READ_PLAN, encode
from dali_mesh.plan.window import WindowPlan
from dali_mesh.storage import store_of

__all__ = ["AxisProgram", "CHECK_JSON", "CODECS", "CODEC_LIBRARIES", "Coder", "NotNativeError", "PLAN_MAGIC",
           "PlanFile", "PlanItem", "PlanPart", "ReadPlan", "native_dtype_of", "native_store"]

#: The plan file's first 8 bytes: the format and its version (bumped whenever a table changes).
PLAN_MAGIC = b"DMPLAN08"
#: ``check_offset`` of a plan whose check is a JSON metadata file (a Zarr array's ``.zarray`` or
#: ``zarr.json``), compared whole in canonical form (``kCheckJson`` in csrc/plan/plan.h).
CHECK_JSON = -1

class _CodecColumn(Mapping):
    """One column of the reader's codec table by codec name (:func:`dali_mesh._kernels.codec_table`),
    read from the kernels library when first used. The table is defined once, in
    csrc/codecs/codec_table.inc, for C++, CMake and Python alike: a static copy here could drift from
    it. Every use of a codec's id or library is on the native path, which needs the library anyway
    (it writes the plan's checksum and reads the plan); without it, using the column raises
    :class:`dali_mesh._kernels.KernelsError` saying how to build it."""

    def __init__(self, column: str, *, built_in: bool = True) -> None:
        self._column = column
        self._built_in = built_in  # False: only the codecs decoded by a library
        self._map: dict | None = None

    def _table(self) -> dict:
        if self._map is None:
            from dali_mesh import _kernels  # noqa: PLC0415 - the library is loaded when first needed

            try:
                rows = _kernels.codec_table()
            except _kernels.KernelsError as e:
                raise _kernels.KernelsError(f"the codec table (dali_mesh.plan.CODECS, CODEC_LIBRARIES) is the "
                                            f"kernels library's: {e}") from e
            self._map = {r["name"]: r[self._column] for r in rows if self._built_in or r["library"]}
        return self._map

    def __getitem__(self, name: str):
        return self._table()[name]

    def __iter__(self):
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())

    def __repr__(self) -> str:
        try:
            return repr(self._table())
        except RuntimeError:
            return f"<the codec table's {self._column!r} column (the kernels library is not built)>"


#: codec ids of the plan file by name (``CodecId``: the codec table, csrc/codecs/codec_table.inc)
CODECS: Mapping[str, int] = _CodecColumn("id")
#: the library that decodes each codec in the reader (for messages about a build without it); the
#: steps built into the reader (shuffle, fletcher32) have none
CODEC_LIBRARIES: Mapping[str, str] = _CodecColumn("library", built_in=False)
#: dtype kinds DALI carries (complex, datetime and timedelta have no DALI type)
_NATIVE_KINDS = "biuf"


class NotNativeError(ValueError):
    """The source (or one of its files) cannot be read by the native operator; the message says
    why. ``read_windows`` then falls back to ``partitioned_source`` (unless told not to)."""


def native_store(location):
    """``(store, key)`` of ``location`` (:func:`dali_mesh.storage.store_of`), or :class:`NotNativeError`
    when the native reader has no store of that kind (``partitioned_source`` reads it in Python)."""
    store, key = store_of(location)
    if not store.native:
        raise NotNativeError(f"{location}: the native reader has no {store.spec!r} store; it is read by "
                             "partitioned_source")
    return store, key


def native_dtype_of(dtype: np.dtype, path: str) -> np.dtype:
    """``dtype`` in native byte order, or :class:`NotNativeError` if DALI has no type for it."""
    native = dtype if dtype.isnative else dtype.newbyteorder("=")
    if native.kind not in _NATIVE_KINDS:
        raise NotNativeError(f"{path}: dtype {dtype} has no DALI type")
    return native


@dataclass(frozen=True, eq=False)
class AxisProgram:
    """One axis of a plan's boundary program: window positions copied (``copy_dst`` from
    ``copy_src``) and filled with the fill value (``fills``)."""

    copy_dst: np.ndarray
    copy_src: np.ndarray
    fills: np.ndarray

    def to_dict(self) -> dict:
        return {k.name: [int(v) for v in getattr(self, k.name)] for k in fields(self)}


_EMPTY = np.empty(0, np.int64)


@dataclass(frozen=True, eq=False)
class ReadPlan:
    """A window read from one file layout (``ReadPlan`` in csrc/plan/plan.h; fields in file order)."""

    itemsize: int
    swap_unit: int                      # bytes of each value to reverse after reading (0: native order)
    fortran: int                        # 1: units address a C-order staging of the reversed window shape
    shape: tuple[int, ...]              # the window shape (output, C order)
    file_off: np.ndarray                # units, sorted by file offset, disjoint
    dst_off: np.ndarray
    unit_bytes: np.ndarray
    group_begin: np.ndarray             # units [begin, end) read in one call
    group_end: np.ndarray
    check_offset: int = 0               # where `check` lies in the file, or CHECK_JSON
    check: bytes = b""
    fill: bytes = b""                   # the fill value in the output type's bytes
    axes: tuple[AxisProgram, ...] = ()  # one per axis of `shape`
    coded: int = 0                      # 1: units address a decoded chunk (a part's file is a chunk)
    # each unit is ``unit_count`` runs of ``unit_bytes``, run ``j`` at ``file_step`` / ``dst_step`` times
    # ``j`` past its offsets (None: one run each)
    unit_count: np.ndarray | None = None
    file_step: np.ndarray | None = None
    dst_step: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = len(self.file_off)
        for name, default in (("unit_count", 1), ("file_step", 0), ("dst_step", 0)):
            v = getattr(self, name)
            object.__setattr__(self, name, np.full(n, default, np.int64) if v is None else np.asarray(v, np.int64))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def read_bytes(self) -> int:
        """The bytes its units read (every run of every unit)."""
        return int((self.unit_bytes * self.unit_count).sum())

    def to_bytes(self) -> bytes:
        return encode(_READ_PLAN, self)

    def to_dict(self) -> dict:
        """Plain values (lists of ints, bytes), as ``_kernels.plan_dump`` gives a loaded plan."""
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "axes":
                v = [a.to_dict() for a in v]
            elif isinstance(v, (np.ndarray, tuple)):
                v = [int(x) for x in v]
            elif f.name in ("fortran", "coded"):
                v = bool(v)
            out[f.name] = v
        return out

    def __eq__(self, other) -> bool:
        if not isinstance(other, ReadPlan):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    @property
    def key(self) -> bytes:
        """The plan's identity (its encoding): equal plans are stored once in a :class:`PlanSet`."""
        return self.to_bytes()

    @classmethod
    def from_units(cls, wplan, dtype: np.dtype, fortran: bool, file_off, dst_off, unit_bytes, groups,
                   check: bytes = b"", check_offset: int = 0, repeat=None) -> "ReadPlan":
        """A plan from its units (file offsets, window offsets, bytes; sorted by file offset,
        disjoint), their read groups ``[(begin, end), ...]`` and the boundary program of ``wplan``
        (a :class:`~dali_mesh.io.WindowPlan`), for a file of ``dtype`` (its byte order as stored).
        ``repeat``: ``(unit_count, file_step, dst_step)`` per unit, or None (one run each)."""
        dtype = np.dtype(dtype)
        native = dtype if dtype.isnative else dtype.newbyteorder("=")
        fill = b""
        if any(a.fill.size for a in wplan.axes):
            check_fill_value(wplan.fill_value, native, " (the planned files' dtype)")
            fill = np.asarray(wplan.fill_value).astype(native).tobytes()
        if dtype.isnative or dtype.itemsize == 1:  # isnative: also an explicit '<' on a little-endian host
            swap = 0
        else:
            swap = dtype.itemsize // 2 if dtype.kind == "c" else dtype.itemsize
        groups = list(groups)
        return cls(dtype.itemsize, swap, int(bool(fortran) and len(wplan.axes) > 1), tuple(wplan.window_shape),
                   np.asarray(file_off, np.int64), np.asarray(dst_off, np.int64), np.asarray(unit_bytes, np.int64),
                   np.asarray([g[0] for g in groups], np.int64), np.asarray([g[1] for g in groups], np.int64),
                   int(check_offset), bytes(check), fill,
                   tuple(AxisProgram(a.copy_dst, a.copy_src, a.fill) for a in wplan.axes), 0,
                   *(repeat if repeat is not None else (None, None, None)))

    @classmethod
    def finishing(cls, wplan, dtype: np.dtype, fortran: bool = False) -> "ReadPlan":
        """A plan that reads nothing and runs ``wplan``'s boundary program (the last step of a sample
        read in parts; with ``fortran``, after the transpose of parts that land in Fortran order)."""
        return cls.from_units(wplan, dtype, fortran, _EMPTY, _EMPTY, _EMPTY, [])

    @classmethod
    def reads_only(cls, window_shape, dtype: np.dtype, file_off, dst_off, unit_bytes, groups,
                   check: bytes = b"", check_offset: int = 0, coded: bool = False, repeat=None) -> "ReadPlan":
        """A plan of reads with no boundary program: one part of a sample read in parts (with
        ``coded``, its units copied from a decoded chunk: offsets in the chunk's decoded bytes)."""
        plan = cls.from_units(WindowPlan.reads_only(window_shape), dtype, False, file_off, dst_off, unit_bytes,
                              groups, check, check_offset, repeat)
        if coded:
            plan = dataclasses.replace(plan, coded=1)
        return plan


class Coder(NamedTuple):
    """How a chunk's stored bytes decode (``Coder`` in csrc/codecs/codecs.h): the steps ``(codec id, arg)`` in
    decode order (checksums, at most one decompressor, size-keeping steps), the decoded size, and a
    missing chunk's value (one item in the stored byte order; empty: zeros)."""

    steps: tuple[tuple[int, int], ...]
    chunk_bytes: int
    fill: bytes = b""

    @property
    def ids(self) -> list[int]:
        return [int(s[0]) for s in self.steps]

    @property
    def args(self) -> list[int]:
        return [int(s[1]) for s in self.steps]

    def to_dict(self) -> dict:
        return {"ids": self.ids, "args": self.args, "chunk_bytes": int(self.chunk_bytes), "fill": bytes(self.fill)}


class PlanFile(NamedTuple):
    """An object read by the plans: ``(store, key, version)`` and a check.

    ``store`` is the byte store's spec (``"file"``: this machine's files; no credential ever goes
    into it), ``key`` the object's key in it (a file's path). The version every read checks: ``size``
    and, for files, the modification time in ns ``mtime_ns`` (-1: not checked; HDF5 files check it:
    see csrc/plan/plan.h); an object store's ETag or generation ``tag`` (empty: none). ``check`` are bytes
    the object must hold at ``check_offset`` at every read (-1: none; a Zarr shard's index, so that a
    shard rewritten at the same size with its modification time put back is refused, not read
    through the index of its former version)."""

    key: str
    size: int = -1
    mtime_ns: int = -1
    check_offset: int = -1
    check: bytes = b""
    store: str = "file"
    tag: bytes = b""


class PlanPart(NamedTuple):
    """One read into a sample's window: the units of plan ``plan`` from file ``file``, at ``base``
    added to every file offset, landing ``dst_base`` bytes into the window (a forecast's step). With
    a coded plan, ``file`` is a chunk of :attr:`PlanSet.chunks` and ``base`` an offset into its
    decoded bytes."""

    file: int
    plan: int
    base: int
    dst_base: int = 0


class PlanItem(NamedTuple):
    """A sample id: its parts, then the finishing program of plan ``finish`` (which also gives the
    window shape)."""

    finish: int
    parts: list[PlanPart]


def _decode_item(words: np.ndarray, i: int) -> tuple[PlanItem, int]:
    """The item encoded at word ``i`` (its finish, its number of parts, then 4 words per part) and the
    index of the next one."""
    finish, n = int(words[i]), int(words[i + 1])
    parts = words[i + 2:i + 2 + 4 * n].reshape(n, 4)
    return PlanItem(finish, [PlanPart(*(int(v) for v in row)) for row in parts]), i + 2 + 4 * n
