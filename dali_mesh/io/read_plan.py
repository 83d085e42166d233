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
only description of its object's encoding: :func:`encode` writes it, :func:`decode` reads it back, and
``tests/io/test_read_plan.py`` holds the C++ loader to it (``_kernels.plan_dump`` of a written plan
equals :meth:`ReadPlan.to_dict`).
"""
from __future__ import annotations

import atexit
import hashlib
import os
import stat
import tempfile
import threading
import dataclasses
from dataclasses import dataclass, field, fields
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

from dali_mesh.io._common import DataFileError
from dali_mesh.io._plan import WindowPlan
from dali_mesh.partition import check_fill_value
from dali_mesh.storage import store_of

__all__ = ["AxisProgram", "CHECK_JSON", "CODECS", "Coder", "NotNativeError", "PLAN_MAGIC", "PlanFile", "PlanItem", "PlanPart",
           "PlanFolderError", "PlanSet", "ReadPlan", "decode", "encode", "native_dtype_of", "stack_channels"]

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
                raise _kernels.KernelsError(f"the codec table (dali_mesh.io.read_plan.CODECS, CODEC_LIBRARIES) is the "
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


def native_dtype_of(dtype: np.dtype, path: str) -> np.dtype:
    """``dtype`` in native byte order, or :class:`NotNativeError` if DALI has no type for it."""
    native = dtype if dtype.isnative else dtype.newbyteorder("=")
    if native.kind not in _NATIVE_KINDS:
        raise NotNativeError(f"{path}: dtype {dtype} has no DALI type")
    return native


# ---- the field tables -----------------------------------------------------------------------------
class Field(NamedTuple):
    """One entry of an object's encoding, in file order.

    ``kind``: ``int`` (one word), ``count`` (one word: the length of the array field named by
    ``of``; several arrays may share one count), ``ints`` (the words of an array, its length given
    by the count field named by ``of``), ``bytes`` (a length word, the bytes, zero padding to 8),
    ``records`` (one record per entry of the count field ``of``, each encoded by ``table``)."""

    name: str
    kind: str
    of: str | None = None
    table: tuple | None = None


_AXIS_PROGRAM = (
    Field("n_copies", "count", "copy_dst"),
    Field("copy_dst", "ints", "n_copies"),
    Field("copy_src", "ints", "n_copies"),
    Field("n_fills", "count", "fills"),
    Field("fills", "ints", "n_fills"),
)

_READ_PLAN = (
    Field("ndim", "count", "shape"),
    Field("itemsize", "int"),
    Field("swap_unit", "int"),
    Field("fortran", "int"),
    Field("coded", "int"),
    Field("shape", "ints", "ndim"),
    Field("n_units", "count", "file_off"),
    Field("n_groups", "count", "group_begin"),
    Field("file_off", "ints", "n_units"),
    Field("dst_off", "ints", "n_units"),
    Field("unit_bytes", "ints", "n_units"),
    Field("unit_count", "ints", "n_units"),
    Field("file_step", "ints", "n_units"),
    Field("dst_step", "ints", "n_units"),
    Field("group_begin", "ints", "n_groups"),
    Field("group_end", "ints", "n_groups"),
    Field("check_offset", "int"),
    Field("check", "bytes"),
    Field("fill", "bytes"),
    Field("axes", "records", "ndim", _AXIS_PROGRAM),
)

_PLAN_FILE = (Field("store", "int"), Field("key", "bytes"), Field("size", "int"), Field("mtime_ns", "int"),
              Field("tag", "bytes"), Field("check_offset", "int"), Field("check", "bytes"))

_CODER = (
    Field("n_steps", "count", "ids"),
    Field("ids", "ints", "n_steps"),
    Field("args", "ints", "n_steps"),
    Field("chunk_bytes", "int"),
    Field("fill", "bytes"),
)


def _word(v) -> bytes:
    return int(v).to_bytes(8, "little", signed=True)


def encode(table: tuple, obj) -> bytes:
    """``obj``'s bytes by ``table`` (a count field is written from the length of the field it counts)."""
    out = []
    for f in table:
        if f.kind == "count":
            out.append(_word(len(getattr(obj, f.of))))
        elif f.kind == "int":
            out.append(_word(getattr(obj, f.name)))
        elif f.kind == "ints":
            out.append(np.asarray(getattr(obj, f.name), np.int64).astype("<i8").tobytes())
        elif f.kind == "bytes":
            b = getattr(obj, f.name)
            out += [_word(len(b)), b, b"\0" * (-len(b) % 8)]
        else:  # records
            out += [encode(f.table, r) for r in getattr(obj, f.name)]
    return b"".join(out)


def decode(table: tuple, words: np.ndarray, pos: int = 0) -> tuple[dict, int]:
    """The fields of one object encoded by ``table`` at word ``pos`` of ``words`` (``<i8``), and the
    position after it. Counts are checked against the words left, so a short buffer raises."""
    out: dict[str, Any] = {}
    counts: dict[str, int] = {}

    def take(n: int) -> np.ndarray:
        nonlocal pos
        if n < 0 or pos + n > words.size:
            raise ValueError(f"plan bytes end inside a field (needs {n} words at word {pos} of {words.size})")
        pos += n
        return words[pos - n:pos]

    for f in table:
        if f.kind in ("count", "int"):
            v = int(take(1)[0])
            if f.kind == "count":
                counts[f.name] = v
            else:
                out[f.name] = v
        elif f.kind == "ints":
            out[f.name] = take(counts[f.of]).astype(np.int64)
        elif f.kind == "bytes":
            n = int(take(1)[0])
            out[f.name] = take((n + 7) // 8).tobytes()[:n] if n >= 0 else take(-1)
        else:
            recs = []
            for _ in range(counts[f.of]):
                r, pos = decode(f.table, words, pos)
                recs.append(r)
            out[f.name] = recs
    return out, pos


# ---- the objects ----------------------------------------------------------------------------------
def _ints_equal(a, b) -> bool:
    return np.array_equal(np.asarray(a, np.int64), np.asarray(b, np.int64))


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

    @classmethod
    def from_bytes(cls, data: bytes) -> "ReadPlan":
        d, _ = decode(_READ_PLAN, np.frombuffer(data, "<i8"))
        return cls.from_dict(d)

    @classmethod
    def from_dict(cls, d: dict) -> "ReadPlan":
        axes = tuple(AxisProgram(*(np.asarray(a[k], np.int64) for k in ("copy_dst", "copy_src", "fills")))
                     for a in d["axes"])
        return cls(int(d["itemsize"]), int(d["swap_unit"]), int(d["fortran"]), tuple(int(s) for s in d["shape"]),
                   *(np.asarray(d[k], np.int64) for k in ("file_off", "dst_off", "unit_bytes", "group_begin",
                                                           "group_end")),
                   int(d["check_offset"]), bytes(d["check"]), bytes(d["fill"]), axes, int(d.get("coded", 0)),
                   *(d.get(k) for k in ("unit_count", "file_step", "dst_step")))

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


_written: set[str] = set()
_written_lock = threading.Lock()


@dataclass
class PlanSet:
    """Everything the operator needs (``PlanSet`` in csrc/plan/plan.h): the distinct plans, the file
    table, one item per sample id, and the output dtype (native byte order) and number of axes."""

    dtype: np.dtype
    ndim: int
    plans: list[ReadPlan] = field(default_factory=list)
    files: list[PlanFile] = field(default_factory=list)
    _plan_index: dict = field(default_factory=dict, repr=False)
    file_index: dict = field(default_factory=dict, repr=False)  # (store, key) -> index in files
    # the items encoded (int64 words: per item finish, number of parts, then (file, plan, base,
    # dst_base) per part), built with numpy for time series of many steps: a list of tuples per
    # step would cost more than the reads it plans
    _item_words: np.ndarray = field(default_factory=lambda: _EMPTY, repr=False)
    _n_items: int = 0
    coders: list[Coder] = field(default_factory=list)
    _coder_index: dict = field(default_factory=dict, repr=False)
    # the chunk table: per chunk (file, offset, stored bytes or -1 if missing, coder), and the
    # index of each (file, offset) for chunks added twice
    _chunk_rows: list = field(default_factory=list, repr=False)
    _chunk_index: dict = field(default_factory=dict, repr=False)

    @property
    def window_shapes(self) -> list[tuple[int, ...]]:
        """The window shape of each plan."""
        return [p.shape for p in self.plans]

    @property
    def items(self) -> list[PlanItem]:
        """Per sample id: its :class:`PlanItem`."""
        out, i = [], 0
        for _ in range(self._n_items):
            item, i = _decode_item(self._item_words, i)
            out.append(item)
        return out

    @items.setter
    def items(self, value: Sequence) -> None:
        words = []
        for finish, parts in value:
            words += [finish, len(parts)] + [int(v) for p in parts for v in PlanPart(*p)]
        self.set_item_words(np.asarray(words, np.int64), len(value))

    def set_item_words(self, words: np.ndarray, n_items: int) -> None:
        """The items as encoded words: per item its finishing plan, its number of parts, then
        ``(file, plan, base, dst_base)`` per part."""
        self._item_words, self._n_items = np.ascontiguousarray(words, np.int64), int(n_items)

    @property
    def num_items(self) -> int:
        return self._n_items

    def add_plan(self, plan: ReadPlan) -> int:
        """The index of ``plan`` in :attr:`plans` (added the first time: equal plans are stored once)."""
        key = plan.key
        idx = self._plan_index.get(key)
        if idx is None:
            idx = self._plan_index[key] = len(self.plans)
            self.plans.append(plan)
        return idx

    def add_file(self, key: str, size: int = -1, mtime_ns: int = -1, check_offset: int = -1,
                 check: bytes = b"", store: str = "file", tag: bytes = b"") -> int:
        """The index of object ``key`` of the store ``store`` (its spec) in :attr:`files` (added the first
        time, with the version (size, modification time, tag) and bytes at ``check_offset`` every read
        checks; -1: not checked)."""
        idx = self.file_index.get((store, key))
        if idx is None:
            idx = self.file_index[(store, key)] = len(self.files)
            self.files.append(PlanFile(key, int(size), int(mtime_ns), int(check_offset), bytes(check), str(store),
                                       bytes(tag)))
        return idx

    def file_of(self, key: str, store: str = "file") -> int | None:
        """The index of object ``key`` of ``store`` in :attr:`files`, or ``None``."""
        return self.file_index.get((store, key))

    def add_coder(self, coder: Coder) -> int:
        """The index of ``coder`` in :attr:`coders` (equal coders are stored once)."""
        key = (tuple(map(tuple, coder.steps)), int(coder.chunk_bytes), bytes(coder.fill))
        idx = self._coder_index.get(key)
        if idx is None:
            idx = self._coder_index[key] = len(self.coders)
            self.coders.append(Coder(key[0], key[1], key[2]))
        return idx

    def item_read_bytes(self, item: int) -> int:
        """The stored bytes the native reader reads for sample id ``item``: each coded chunk once
        (its stored, compressed size), the byte ranges of raw parts."""
        if not 0 <= item < self._n_items:
            raise IndexError(f"item {item} is out of range for {self._n_items} items")
        i = 0
        for _ in range(item):  # items are variable-length: skip to this one
            i += 2 + 4 * int(self._item_words[i + 1])
        it, _ = _decode_item(self._item_words, i)
        chunks = self._chunk_rows
        seen, total = set(), 0
        for part in it.parts:
            plan = self.plans[part.plan]
            if plan.coded:
                if part.file not in seen:
                    seen.add(part.file)
                    total += max(0, chunks[part.file][2])
            else:
                total += plan.read_bytes
        return total

    def add_chunk(self, file: int, offset: int, nbytes: int, coder: int) -> int:
        """The index of the chunk stored at ``offset`` of file ``file`` (``nbytes`` stored bytes; -1: the
        file was never written; -2: a shard's index lists it as never written) in the chunk table
        (added the first time)."""
        key = (int(file), int(offset), int(nbytes))
        idx = self._chunk_index.get(key)
        if idx is None:
            idx = self._chunk_index[key] = len(self._chunk_rows)
            self._chunk_rows.append((int(file), int(offset), int(nbytes), int(coder)))
        return idx

    @property
    def chunks(self) -> list[tuple[int, int, int, int]]:
        """The chunk table: ``(file, offset, stored bytes or -1, coder)`` per chunk."""
        return list(self._chunk_rows)

    def sharing_tables(self, ndim: int) -> "PlanSet":
        """An empty plan set of ``ndim`` axes whose plan and file tables are this one's (the outputs
        of a forecast: input and target share the plans and files, each has its own items)."""
        out = PlanSet(self.dtype, ndim)
        out.plans, out.files, out._plan_index, out.file_index = self.plans, self.files, self._plan_index, \
            self.file_index
        out.coders, out._coder_index, out._chunk_rows, out._chunk_index = self.coders, self._coder_index, \
            self._chunk_rows, self._chunk_index
        return out

    @staticmethod
    def joined(sets: Sequence["PlanSet"]) -> "PlanSet":
        """One plan set of the windows of several outputs (a forecast's input and target): their
        items one output after another, each output one item per sample id, for
        ``read_windows(..., outputs=len(sets))``, and one table of plans, files and chunks (sets made
        by :meth:`sharing_tables` have it already; others are re-indexed into it, equal entries
        stored once). The operator then reads each batch's windows of every output as one batch, so a
        chunk they share is read and decoded once."""
        first = sets[0]
        if len({s.num_items for s in sets}) != 1:
            raise ValueError("PlanSet.joined: the outputs have different numbers of items: "
                             f"{[s.num_items for s in sets]}")
        if len({(s.dtype, s.ndim) for s in sets}) != 1:
            raise ValueError("PlanSet.joined: the outputs' windows differ in dtype or axes: "
                             f"{[(str(s.dtype), s.ndim) for s in sets]}")
        n = sum(s.num_items for s in sets)
        if all(s.plans is first.plans and s._chunk_rows is first._chunk_rows for s in sets):
            out = first.sharing_tables(first.ndim)
            out.set_item_words(np.concatenate([s._item_words for s in sets]), n)
            return out
        out = PlanSet(first.dtype, first.ndim)
        out.set_item_words(np.concatenate([_encoded_items(*_reindexed(out, s)) for s in sets]), n)
        return out

    def to_bytes(self) -> bytes:
        from dali_mesh import _kernels  # the checksum is the reader's own code

        files = [_plan_file(f) for f in self.files]
        stores = list(dict.fromkeys(f.store for f in files)) or ["file"]
        store_index = {spec: i for i, spec in enumerate(stores)}
        out = [PLAN_MAGIC, _word(len(stores))]
        out += [encode((Field("spec", "bytes"),), _Spec(spec.encode())) for spec in stores]
        out += [_word(len(self.plans)), _word(len(files)), _word(self.num_items), _word(len(self.coders)),
                _word(len(self._chunk_rows))]
        out += [encode(_PLAN_FILE, f._replace(key=os.fsencode(f.key), store=store_index[f.store])) for f in files]
        out += [encode(_CODER, c) for c in self.coders]
        out.append(np.asarray(self._chunk_rows, np.int64).reshape(-1).astype("<i8").tobytes())
        out += [p.to_bytes() for p in self.plans]
        out.append(self._item_words.astype("<i8").tobytes())
        body = b"".join(out)
        return body + _kernels.plan_checksum(body[len(PLAN_MAGIC):])

    def write(self, directory: str | None = None) -> str:
        """Store the plan file where the reader opens it and return its path.

        By default the plan lives in this process's memory: a sealed ``memfd`` (no one can change
        it once written, another user cannot reach it, and the kernel frees it when the process
        ends, however it ends: no plan is left behind by SIGKILL or ``os._exit``), named
        ``/proc/self/fd/N``. Equal plans of one process share it.

        With ``directory`` (or where memfds do not exist) the plan is a file there, named by content
        and process, written through a new file opened with ``O_EXCL | O_NOFOLLOW`` and renamed
        into place; the folder must be a real folder owned by this user that no one else can write
        (:class:`PlanFolderError` otherwise: another user could replace a plan with one that reads
        any file this user can read). Files are removed at exit.
        """
        data = self.to_bytes()
        if directory is None:
            path = _sealed_plan(data)
            if path is not None:
                return path
            directory = _default_plan_folder()
        directory = os.fspath(directory)
        _check_private_folder(directory, create=True)
        path = os.path.join(directory, f"{hashlib.sha256(data).hexdigest()[:32]}.{os.getpid()}.dmplan")
        if not os.path.exists(path):
            tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC,
                         0o600)
            try:
                _write_all(fd, data)
            finally:
                os.close(fd)
            os.replace(tmp, path)  # atomic: a reader never sees half a plan
        with _written_lock:
            if not _written:
                atexit.register(_remove_written)
            _written.add(path)
        return path


def _item_rows(words: np.ndarray, n_items: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The encoded items as arrays: per item its finishing plan, the word index of its first part and
    its number of parts."""
    if n_items == 0:
        return _EMPTY, _EMPTY, _EMPTY
    p = int(words[1])
    width = 2 + 4 * p
    if words.size == n_items * width and np.all(words[1::width] == p):  # every item has p parts
        starts = np.arange(n_items, dtype=np.int64) * width
        return words[starts].copy(), starts + 2, np.full(n_items, p, np.int64)
    finish, starts, counts = (np.empty(n_items, np.int64) for _ in range(3))
    i = 0
    for k in range(n_items):
        finish[k], counts[k], starts[k] = words[i], words[i + 1], i + 2
        i += 2 + 4 * int(words[i + 1])
    return finish, starts, counts


def _part_positions(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The word index of every part of every item, item by item: ``counts[i]`` parts of 4 words from
    word ``starts[i]``."""
    n = int(counts.sum())
    return np.repeat(starts, counts) + 4 * (np.arange(n) - np.repeat(np.cumsum(counts) - counts, counts))


def _reindexed(out: PlanSet, s: PlanSet, item_rows=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``s``'s items as arrays, its files, plans, coders and chunks added to ``out``'s tables and
    re-indexed into them: per item its finishing plan and number of parts, and the ``(file or chunk,
    plan, base, dst_base)`` of every part, item by item. ``item_rows``: ``_item_rows`` of ``s``'s
    items, if the caller has them already."""
    fmap = np.asarray([out.add_file(*f) for f in s.files], np.int64)
    pmap = np.asarray([out.add_plan(p) for p in s.plans], np.int64)
    cmap = np.asarray([out.add_coder(k) for k in s.coders], np.int64)
    chmap = np.asarray([out.add_chunk(int(fmap[f]), o, b, int(cmap[k])) for f, o, b, k in s._chunk_rows], np.int64)
    coded = np.asarray([bool(p.coded) for p in s.plans], bool)
    finish, starts, counts = item_rows if item_rows is not None else _item_rows(s._item_words, s.num_items)
    idx = _part_positions(starts, counts)
    rows = s._item_words[idx[:, None] + np.arange(4)].reshape(idx.size, 4).copy()
    if idx.size:
        # a coded part's file is a chunk (the chunk table's index), a raw part's a file
        is_chunk = coded[rows[:, 1]]
        rows[is_chunk, 0] = chmap[rows[is_chunk, 0]]
        rows[~is_chunk, 0] = fmap[rows[~is_chunk, 0]]
        rows[:, 1] = pmap[rows[:, 1]]
    return (pmap[finish] if finish.size else finish), counts, rows


def _encoded_items(finish: np.ndarray, counts: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Items as the plan file's words (see :meth:`PlanSet.set_item_words`): per item its finishing
    plan, ``counts`` parts, and their 4-word ``rows``, item by item."""
    words = np.empty(int(2 * finish.size + 4 * counts.sum()), np.int64)
    item_start = (np.cumsum(2 + 4 * counts) - (2 + 4 * counts)).astype(np.int64)  # (none for no items)
    words[item_start] = finish
    words[item_start + 1] = counts
    words[_part_positions(item_start + 2, counts)[:, None] + np.arange(4)] = rows
    return words


def stack_channels(sets: Sequence["PlanSet"], channel_axis: int, has_channel_axis: Sequence[bool]) -> "PlanSet":
    """One plan set whose windows stack the windows of ``sets`` on ``channel_axis`` (the plans of one
    window output of several sources with the same sample order and spatial window: a dataset's
    variables), so that one operator reads every part of a sample into its place in the stacked
    window and finishes it once. A set whose windows have no channel axis (a variable without
    levels) adds one channel. Raises :class:`NotNativeError` when the windows do not stack: other
    dtypes, Fortran-order plans, other numbers of samples, or boundary programs that differ off the
    channel axis (or act on it)."""
    first = sets[0]
    if any(s.dtype != first.dtype for s in sets):
        raise NotNativeError(f"the variables have different dtypes ({', '.join(str(s.dtype) for s in sets)})")
    if any(s.num_items != first.num_items for s in sets):
        raise NotNativeError("the variables have different numbers of samples")
    if any(p.fortran for s in sets for p in s.plans):
        raise NotNativeError("a variable is stored in Fortran order")
    isz = first.dtype.itemsize
    # per set: its finishing plans as (prefix axes, spatial axes, channels); every finishing plan of every
    # set must have the same prefix (a forecast's step axis) and spatial axes, programs and fill
    views = []
    for s, has_c in zip(sets, has_channel_axis):
        finish, starts, counts = _item_rows(s._item_words, s.num_items)
        view = {}
        for f in np.unique(finish):
            plan = s.plans[int(f)]
            c = plan.shape[channel_axis] if has_c else 1
            cut = channel_axis + 1 if has_c else channel_axis
            if has_c and (plan.axes[channel_axis].copy_dst.size or plan.axes[channel_axis].fills.size):
                raise NotNativeError("a boundary program acts on the channel axis")
            key = (plan.shape[:channel_axis], plan.shape[cut:], plan.fill,
                   tuple(tuple(tuple(int(v) for v in getattr(a, k)) for k in ("copy_dst", "copy_src", "fills"))
                         for a in plan.axes[:channel_axis] + plan.axes[cut:]))
            view[int(f)] = (key, c, plan.axes[:channel_axis], plan.axes[cut:])
        views.append((finish, starts, counts, view))
    keys = {v[0] for _, _, _, view in views for v in view.values()}
    if len(keys) != 1:
        raise NotNativeError("the variables' windows differ off the channel axis (shape or boundary program)")
    channels = [next(iter(view.values()))[1] for _, _, _, view in views]
    if any(len({v[1] for v in view.values()}) != 1 for _, _, _, view in views):
        raise NotNativeError("a variable's windows differ in channels")
    (prefix, spatial, fill, _), = keys
    c_total = sum(channels)
    plane = int(np.prod(spatial, dtype=np.int64)) * isz
    step_all = c_total * plane
    some = next(iter(views[0][3].values()))
    empty = AxisProgram(_EMPTY, _EMPTY, _EMPTY)
    stacked = ReadPlan(isz, 0, 0, tuple(prefix) + (c_total,) + tuple(spatial), _EMPTY, _EMPTY, _EMPTY, _EMPTY,
                       _EMPTY, 0, b"", fill, tuple(some[2]) + (empty,) + tuple(some[3]))
    out = PlanSet(first.dtype, len(stacked.shape))
    finish = out.add_plan(stacked)
    # the tables of every set, re-indexed into out's
    blocks, c0 = [], 0
    for s, (s_finish, starts, counts, _), c in zip(sets, views, channels):
        _, counts, rows = _reindexed(out, s, (s_finish, starts, counts))
        step_v = c * plane
        if rows.size and step_v:  # (an empty window reads nothing: its parts' places do not matter)
            rows[:, 3] = rows[:, 3] // step_v * step_all + c0 * plane + rows[:, 3] % step_v
        blocks.append((counts, rows))
        c0 += c
    n = first.num_items
    # each item's parts: the first set's, then the next set's, ...
    item_of = np.concatenate([np.repeat(np.arange(n, dtype=np.int64), cnt) for cnt, _ in blocks])
    rows = np.concatenate([r for _, r in blocks])[np.argsort(item_of, kind="stable")]
    out.set_item_words(_encoded_items(np.full(n, finish, np.int64), sum(b[0] for b in blocks), rows), n)
    return out


class _Spec(NamedTuple):
    spec: bytes


class PlanFolderError(DataFileError):
    """A folder for plan files that another user could write into (or not a folder of this user)."""


def _plan_file(f) -> PlanFile:
    return f if isinstance(f, PlanFile) else PlanFile(*f)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


_sealed: dict[bytes, str] = {}


def _sealed_plan(data: bytes) -> str | None:
    """``data`` in a sealed memfd of this process, as ``/proc/self/fd/N`` (kept open until exit), or
    None where there are no memfds (then a private folder is used)."""
    import fcntl

    memfd_create = getattr(os, "memfd_create", None)
    seals = [getattr(fcntl, n, None) for n in ("F_ADD_SEALS", "F_SEAL_SHRINK", "F_SEAL_GROW", "F_SEAL_WRITE",
                                               "F_SEAL_SEAL")]
    if memfd_create is None or None in seals or not os.path.isdir("/proc/self/fd"):
        return None
    key = hashlib.sha256(data).digest()
    with _written_lock:
        path = _sealed.get(key)
        if path is not None:
            return path
        try:
            fd = memfd_create("dali_mesh_plan", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        except OSError:  # a kernel without memfds
            return None
        try:
            _write_all(fd, data)
            fcntl.fcntl(fd, seals[0], seals[1] | seals[2] | seals[3] | seals[4])
        except BaseException:
            os.close(fd)
            raise
        path = _sealed[key] = f"/proc/self/fd/{fd}"
        return path


def _default_plan_folder() -> str:
    """``<tmp>/dali_mesh_plans_<uid>`` if it is this user's private folder (made so if absent), else a
    new private folder (``mkdtemp``): a folder someone else made first is never used."""
    folder = os.path.join(tempfile.gettempdir(), f"dali_mesh_plans_{os.getuid()}")
    try:
        _check_private_folder(folder, create=True)
        return folder
    except PlanFolderError:
        return tempfile.mkdtemp(prefix=f"dali_mesh_plans_{os.getuid()}_")


def _check_private_folder(folder: str, *, create: bool) -> None:
    """A real folder (not a link) owned by this user, writable by no one else; made (0700) if
    absent and ``create``."""
    if create:
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass
        except OSError as e:
            raise PlanFolderError(folder, f"cannot be made as a folder for plan files ({e.strerror or e})") from None
    try:
        st = os.lstat(folder)
    except OSError as e:
        raise PlanFolderError(folder, f"is no folder for plan files ({e.strerror or e})") from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise PlanFolderError(folder, "is not a folder (a link or a file): plan files are written only into a "
                              "folder of this user's own")
    if st.st_uid != os.getuid():
        raise PlanFolderError(folder, f"belongs to uid {st.st_uid}, not to this user ({os.getuid()}): its owner "
                              "could replace a plan with one that reads any file you can read; use a folder "
                              "of your own (plan_dir=...)")
    if st.st_mode & 0o022:
        raise PlanFolderError(folder, f"is writable by others (mode {stat.S_IMODE(st.st_mode):o}): they could "
                              "replace a plan with one that reads any file you can read; chmod go-w it or use "
                              "another folder (plan_dir=...)")


def _remove_written() -> None:
    for p in list(_written):
        try:
            os.unlink(p)
        except OSError:
            pass


def read_file_at(path: str, offset: int, size: int) -> bytes:
    """``size`` bytes of ``path`` (a location: a path or a URL) at ``offset`` (fewer at the end), for
    plan-time checks, read through its byte store."""
    store, key = store_of(path)
    return store.read_range(key, offset, size)
