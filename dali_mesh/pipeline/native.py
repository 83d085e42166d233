"""The native reader: plan in Python, read in C++ (``fn.dali_mesh.read_windows``).

:func:`read_windows` puts a dali_mesh source's windows into the pipeline without Python on the hot
path: the format-specific work (parse a header, find a dataset's offset) turns each distinct file
layout and this rank's :class:`~dali_mesh.Region` into a byte-range plan once
(:func:`dali_mesh.io._plan.plan_window`, :func:`dali_mesh.io.npy.plan_npy_reads`); the plans, the
file table and one item per sample id (file, plan, base offset) go to the operator in a plan file
written once. Per batch, a cheap batch-mode ``fn.external_source`` gives the sample ids and pad
flags from the stateless sample order (so checkpoint and resume behave as with
``partitioned_source``), and the operator ``preadv``-s the ranges on DALI's threads straight into
its output (CPU), or into pinned staging copied to the GPU (``device="gpu"``), then does the byte
swap (as the ranges land), the Fortran-order transpose and the boundary cells (copies and constant
fills). On the GPU the boundary cells are filled on the device by the strided-slice kernel wherever
a plan's copies and fills are one strided slice of the cells read (constant, reflect, symmetric,
edge; periodic halos are read from the far side as ranges of their own); other plans (halos wider
than the axis that chain copies) are finished in pinned memory (``DALI_MESH_DEVICE_FILL=0``: all).

Which sources take the native path:

======================================  ===================================================
source                                  path
======================================  ===================================================
``NumpySource`` (C or Fortran order,    native; one plan per distinct header (shape, dtype,
either byte order, channel subsets,     byte order, C/Fortran order), so files that differ in
per-sample shapes)                      byte order or order mix freely; every header is read
                                        once when the plan is made (one small read per file),
                                        and each file's header bytes and size are checked when
                                        read
``HDF5Source``, contiguous dataset      native; one plan per file layout, a base offset per step
``HDF5Source``, chunked without         native; the chunk offsets from one pass over the chunk
filters (uncompressed), every chunk     index; steps whose chunks lie alike relative to each
touched written                         other share one plan (one part per step, reads merged),
                                        up to ``MAX_MERGED_LAYOUTS`` per file; beyond, a part
                                        per chunk piece, its plan shared by all steps
``ZarrSource`` v2/v3, uncompressed,     native; one part per chunk file touched (plans shared
local store, every chunk touched        by all steps, as above), then one finishing plan
written                                 (boundary cells)
forecasts of the two above              native; one operator per output (input, target), each
                                        step a part at its place in the stacked window
everything else (``direct=True``,       ``partitioned_source`` (a one-line log says why)
compressed HDF5 or Zarr, sharded Zarr,
chunks never written, forecasts with
per-sample shapes, more than
``MAX_NATIVE_SAMPLES`` samples or
``MAX_NATIVE_PARTS`` chunk reads)
======================================  ===================================================

Planning costs one small read per ``.npy`` file, and per HDF5 file or Zarr store one pass over
its chunk index (or one ``stat`` per chunk file touched); the plans are as many as the distinct
layouts (headers; chunk pieces of one window), never one per step. The items (one per sample id:
its parts) are numpy arithmetic; above ``MAX_NATIVE_SAMPLES`` (2**20) samples the plan file would
be large, so such sources (a file claiming 2**31 steps, say) are read by ``partitioned_source``,
whose sample order and reads cost nothing per step until a step is read.

Every read checks that the file is still what was planned for: a regular file of the planned size,
holding the planned bytes where its layout is described (a ``.npy`` header; an HDF5 dataset's
object header: shape, dtype, data address, chunking; a Zarr array's metadata file, compared in a
canonical form that leaves out its attributes, so that adding one does not stop the reads). A file
truncated, grown, or rewritten with another layout after the plan was made is an error naming it,
never garbage; one rewritten with the same layout is read anew. Each read task opens, checks, reads
and closes its file, so a batch of many-chunk Zarr samples holds one descriptor per thread. (Not caught: an HDF5 file rewritten
with the same object header but its chunks at other offsets.) The plan file ends with a checksum:
a corrupt one is refused.

Importing this module imports DALI (as :mod:`dali_mesh.fn` does).
"""
from __future__ import annotations

import atexit
import hashlib
import itertools
import logging
import math
import os
import tempfile
import threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Sequence

import numpy as np

from dali_mesh.io._plan import WindowPlan, plan_window
from dali_mesh.io.npy import DEFAULT_MERGE_GAP, _group, plan_npy_reads, read_npy_header
from dali_mesh.partition import check_fill_value

__all__ = ["NotNativeError", "NativePlan", "plan_source", "plan_windows", "read_windows", "PLAN_MAGIC"]

log = logging.getLogger(__name__)

PLAN_MAGIC = b"DMPLAN02"
# dtypes DALI carries (complex, datetime and timedelta have no DALI type)
_NATIVE_KINDS = "biuf"
_written: set[str] = set()
_written_lock = threading.Lock()


class NotNativeError(ValueError):
    """The source (or one of its files) cannot be read by the native operator; the message says
    why. :func:`read_windows` then falls back to ``partitioned_source`` (unless told not to)."""


@dataclass
class NativePlan:
    """Everything the operator needs: the distinct plans (encoded), the file table, one item per
    sample id, and the output dtype (native byte order) and number of axes."""

    dtype: np.dtype
    ndim: int
    plans: list[bytes] = field(default_factory=list)
    files: list[tuple[str, int]] = field(default_factory=list)  # (path, expected size or -1)
    # per sample id: (finishing plan, [(file, plan, base offset, window byte offset), ...]): the
    # parts read into its window (one per file touched, per step of a forecast), then the plan
    # whose transpose and boundary cells finish it
    _items: list[tuple[int, list[tuple[int, int, int, int]]]] = field(default_factory=list)
    window_shapes: list[tuple[int, ...]] = field(default_factory=list)  # per plan
    _plan_index: dict = field(default_factory=dict, repr=False)
    file_index: dict = field(default_factory=dict, repr=False)  # path -> index in files
    # the items already encoded (int64 words, as to_bytes writes them), built with numpy for time
    # series of many steps: a list of tuples per step would cost more than the reads it plans
    _item_words: np.ndarray | None = field(default=None, repr=False)
    _n_items: int = 0

    @property
    def items(self) -> list[tuple[int, list[tuple[int, int, int, int]]]]:
        """Per sample id: ``(finishing plan, [(file, plan, base offset, window byte offset), ...])``."""
        if self._item_words is None:
            return self._items
        out, w, i = [], self._item_words, 0
        for _ in range(self._n_items):
            finish, n = int(w[i]), int(w[i + 1])
            parts = w[i + 2:i + 2 + 4 * n].reshape(n, 4)
            out.append((finish, [tuple(int(v) for v in row) for row in parts]))
            i += 2 + 4 * n
        return out

    @items.setter
    def items(self, value) -> None:
        self._items, self._item_words, self._n_items = list(value), None, 0

    def set_item_words(self, words: np.ndarray, n_items: int) -> None:
        """The items as encoded words: per item its finishing plan, its number of parts, then
        ``(file, plan, base, window byte offset)`` per part."""
        self._items, self._item_words, self._n_items = [], np.ascontiguousarray(words, np.int64), int(n_items)

    @property
    def num_items(self) -> int:
        return self._n_items if self._item_words is not None else len(self._items)

    def add_plan(self, key, build) -> int:
        """Index of the plan for ``key``; ``build()`` makes ``(encoded, window_shape)`` the first time."""
        idx = self._plan_index.get(key)
        if idx is None:
            body, shape = build()
            idx = self._plan_index[key] = len(self.plans)
            self.plans.append(body)
            self.window_shapes.append(tuple(shape))
        return idx

    def to_bytes(self) -> bytes:
        out = [PLAN_MAGIC, _ints(len(self.plans), len(self.files), self.num_items)]
        for path, size in self.files:
            out += [_bytes(os.fsencode(path)), _ints(size)]
        out += self.plans
        if self._item_words is not None:
            out.append(self._item_words.astype("<i8").tobytes())
        for finish, parts in self._items:
            out += [_ints(finish, len(parts)), _arr(parts)]
        body = b"".join(out)
        return body + _checksum(body[len(PLAN_MAGIC):])

    def write(self, directory: str | None = None) -> str:
        """Write the plan file and return its path. Named by content and process (equal plans of one
        process share a file; another process, e.g. a replica rank with the same window, writes
        its own, since each removes its files when it exits)."""
        data = self.to_bytes()
        directory = directory or os.path.join(tempfile.gettempdir(), f"dali_mesh_plans_{os.getuid()}")
        os.makedirs(directory, mode=0o700, exist_ok=True)
        path = os.path.join(directory, f"{hashlib.sha256(data).hexdigest()[:32]}.{os.getpid()}.dmplan")
        if not os.path.exists(path):
            tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)  # atomic: a reader never sees half a plan
        with _written_lock:
            if not _written:
                atexit.register(_remove_written)
            _written.add(path)
        return path


def _remove_written() -> None:
    for p in list(_written):
        try:
            os.unlink(p)
        except OSError:
            pass


# check_offset of a plan whose check is a JSON metadata file's canonical form (kCheckJson in
# csrc/read_plan.h)
CHECK_JSON = -1
_JSON_SPACE = frozenset(b" \t\n\r")
_JSON_IGNORED = (b'"attributes"', b'"dimension_names"')


def _canonical_json(text: bytes) -> bytes | None:
    """A JSON object's canonical form, as CanonicalJson in csrc/read_plan.cc computes it (the two
    must agree byte for byte): whitespace outside strings dropped, the top-level members sorted by
    their key as written, ``"attributes"`` and ``"dimension_names"`` left out, values as written.
    ``None`` when ``text`` is not one JSON object."""
    s = bytearray()
    in_str = False
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if in_str:
            s.append(c)
            if c == 0x5C:  # backslash: the next byte is part of the string
                i += 1
                if i >= n:
                    return None
                s.append(text[i])
            elif c == 0x22:
                in_str = False
        elif c not in _JSON_SPACE:
            s.append(c)
            in_str = c == 0x22
        i += 1
    if in_str or len(s) < 2 or s[0] != 0x7B or s[-1] != 0x7D:
        return None
    s = bytes(s)
    end, i, members = len(s) - 1, 1, []
    while i < end:
        if s[i] != 0x22:
            return None
        k = i + 1
        while k < end and s[k] != 0x22:
            k += 2 if s[k] == 0x5C else 1
        if k >= end or s[k + 1] != 0x3A:
            return None
        key, v = s[i:k + 1], k + 2
        depth, in_str, i = 0, False, v
        while i < end:
            c = s[i]
            if in_str:
                if c == 0x5C:
                    i += 1
                elif c == 0x22:
                    in_str = False
            elif c == 0x22:
                in_str = True
            elif c in (0x7B, 0x5B):
                depth += 1
            elif c in (0x7D, 0x5D):
                depth -= 1
                if depth < 0:
                    return None
            elif c == 0x2C and depth == 0:
                break
            i += 1
        if in_str or depth or i == v or i > end:
            return None
        members.append((key, s[v:i]))
        if i < end:
            i += 1
            if i == end:
                return None
    members.sort()
    return b"{" + b",".join(k + b":" + v for k, v in members if k not in _JSON_IGNORED) + b"}"


def _checksum(words: bytes) -> bytes:
    """The plan file's last word: sum of word_i * k_i mod 2**64 (k_i odd), as read_plan.cc checks it,
    so that a corrupt plan file is refused: any change of one word changes the sum."""
    w = np.frombuffer(words, "<u8").astype(np.uint64)
    k = (np.arange(w.size, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(0x632BE59BD9B4E019)) | np.uint64(1)
    with np.errstate(over="ignore"):
        return np.array([np.sum(w * k, dtype=np.uint64)], "<u8").tobytes()


def _ints(*values) -> bytes:
    return np.asarray(values, np.int64).astype("<i8").tobytes()


def _arr(a) -> bytes:
    return np.asarray(a, np.int64).astype("<i8").tobytes()


def _bytes(b: bytes) -> bytes:
    pad = -len(b) % 8
    return _ints(len(b)) + b + b"\0" * pad


def _swap_unit(dtype: np.dtype) -> int:
    if dtype.isnative or dtype.itemsize == 1:  # isnative: also an explicit '<' on a little-endian host
        return 0
    return dtype.itemsize // 2 if dtype.kind == "c" else dtype.itemsize


def encode_plan(plan: WindowPlan, file_layout, *, check: bytes = b"", merge_gap: int = DEFAULT_MERGE_GAP,
                prefix: Sequence[int] = (), check_offset: int = 0) -> bytes:
    """One plan's bytes: the window ``plan`` read from an array stored as ``file_layout`` (``shape``,
    stored ``dtype``, ``fortran_order``, ``data_offset``: the offset of element 0 relative to the
    item's base offset), with ``check`` the bytes expected at file offset ``check_offset``."""
    fo, do, ub, groups = plan_npy_reads(file_layout, plan, prefix, merge_gap)
    return encode_units(plan, np.dtype(file_layout.dtype), bool(file_layout.fortran_order), fo, do, ub,
                        groups, check, check_offset)


def encode_units(plan: WindowPlan, dtype: np.dtype, fortran: bool, fo, do, ub, groups,
                 check: bytes = b"", check_offset: int = 0) -> bytes:
    """One plan's bytes from its units (file offsets, window offsets, bytes; sorted by file offset,
    disjoint), their read groups, and the boundary program of ``plan``; every file read by it must
    hold ``check`` at byte ``check_offset`` (a header: a file rewritten with another layout since
    the plan was made is refused, not read)."""
    native = dtype if dtype.isnative else dtype.newbyteorder("=")
    gb = [g[0] for g in groups]
    ge = [g[1] for g in groups]
    fill = b""
    if any(a.fill.size for a in plan.axes):
        check_fill_value(plan.fill_value, native, " (the planned files' dtype)")
        fill = np.asarray(plan.fill_value).astype(native).tobytes()
    fortran = fortran and len(plan.axes) > 1
    out = [_ints(len(plan.axes), dtype.itemsize, _swap_unit(dtype), int(fortran)),
           _arr(plan.window_shape), _ints(len(fo), len(groups)), _arr(fo), _arr(do), _arr(ub),
           _arr(gb), _arr(ge), _ints(check_offset), _bytes(check), _bytes(fill)]
    for a in plan.axes:
        out += [_ints(a.copy_dst.size), _arr(a.copy_dst), _arr(a.copy_src), _ints(a.fill.size), _arr(a.fill)]
    return b"".join(out)


def _check_dtype(dtype: np.dtype, path: str) -> np.dtype:
    native = dtype if dtype.isnative else dtype.newbyteorder("=")
    if native.kind not in _NATIVE_KINDS:
        raise NotNativeError(f"{path}: dtype {dtype} has no DALI type")
    return native


# ---- planners per source kind ---------------------------------------------------------------------
def _head_and_size(path: str, n: int) -> tuple[bytes, int]:
    """The first ``n`` bytes and the size of ``path``, opened as the readers open files (read-only,
    refusing anything but a regular file)."""
    from dali_mesh.io.npy import _open

    fd = _open(path)
    try:
        return os.pread(fd, n, 0), os.fstat(fd).st_size
    finally:
        os.close(fd)


def _npy_headers(files: Sequence[str], first):
    """Every file's ``(header, header bytes)``. A file whose header bytes and size equal those of a
    header already parsed shares it (one small read, no parse); any other is parsed. Read on a few
    threads when there are many, since cold storage answers many small reads at once faster than
    one after another."""
    from dali_mesh.io._common import DataFileError

    with open(first.path, "rb") as f:
        first_check = f.read(first.data_offset)
    known = {first_check: first}  # header bytes -> parsed header (size checked per file)

    def one(path):
        try:
            head, size = _head_and_size(path, 4096)
        except OSError as e:
            raise DataFileError(path, f"cannot be read ({e})") from None
        # the header's length from its prefix (as numpy writes it: magic, version, length)
        if len(head) >= 10 and head[6] in (1, 2, 3):
            n = 10 + int.from_bytes(head[8:10], "little") if head[6] == 1 else \
                12 + int.from_bytes(head[8:12], "little")
            h = known.get(head[:n])
            if h is not None and size == h.file_size:
                return h, head[:n]
        h = read_npy_header(path)
        with open(h.path, "rb") as f:
            check = f.read(h.data_offset)
        known.setdefault(check, h)
        return h, check

    rest = files[1:]
    if len(rest) <= 1024:
        return [(first, first_check)] + [one(f) for f in rest]
    from concurrent.futures import ThreadPoolExecutor

    # a few long slices, not a task per file (a task costs more than a warm read)
    step = -(-len(rest) // 8)
    with ThreadPoolExecutor(8) as ex:
        parts = list(ex.map(lambda i: [one(f) for f in rest[i:i + step]], range(0, len(rest), step)))
    return [(first, first_check)] + [h for part in parts for h in part]


def _plan_numpy(source, merge_gap: int) -> NativePlan:
    from dali_mesh.io._common import ShapeMismatchError
    from dali_mesh.source import _apply_maps, _check_frame

    if source.direct:
        raise NotNativeError("NumpySource(direct=True) asks for O_DIRECT, which the native reader does not do")
    files = source.files
    first = read_npy_header(files[0])
    native = _check_dtype(first.dtype, files[0])
    if source.sample_shape is not None:
        shape = _apply_maps(first.shape, source.index_maps, files[0])
        if shape != source.sample_shape or native != source.dtype:
            raise ShapeMismatchError(
                files[0], f"shape {shape} {native} differs from the {source.sample_shape} {source.dtype} "
                "the source was made with: the file changed; make the source again")
    plans = NativePlan(native, source.sample_ndim)
    # one plan per distinct header (its bytes: shape, dtype with its byte order, C or Fortran order,
    # header length): files that differ only in byte order or order are read natively, each by its
    # own plan, as the Python readers read them. Every header is read once here (one small read per
    # file); at every read the operator checks the file still holds the header planned for it.
    plan_of_header: dict = {}
    items = []
    for i, (h, check) in enumerate(_npy_headers(files, first)):
        if h.native_dtype != native:
            raise ShapeMismatchError(h.path, f"dtype {h.native_dtype} differs from the first file's ({files[0]}) {native}")
        if check not in plan_of_header:
            _check_frame(h.shape, h.path)
            shape = _apply_maps(h.shape, source.index_maps, h.path)
            if source.sample_shape is not None:
                if shape != source.sample_shape:
                    raise ShapeMismatchError(
                        h.path, f"shape {shape} differs from the first file's ({files[0]}) {source.sample_shape}; "
                        "make every file the same, or pass per_sample_shapes=True")
                region = source.region
            else:
                region = source.region_of(shape)
            wplan = plan_window(region, source.index_maps)
            lay = SimpleNamespace(shape=h.shape, dtype=h.dtype, fortran_order=h.fortran_order,
                                  data_offset=h.data_offset)
            plan_of_header[check] = plans.add_plan(
                check, lambda: (encode_plan(wplan, lay, check=check, merge_gap=merge_gap), wplan.window_shape))
        k = plan_of_header[check]
        plans.files.append((files[i], h.file_size))
        items.append((k, [(i, k, 0, 0)]))
    plans.items = items
    return plans


class _Boxes:
    """A window plan's boxes cut to one chunk: what :func:`plan_npy_reads` needs of a plan."""

    def __init__(self, boxes, window_shape):
        self._boxes, self.window_shape = boxes, window_shape

    def boxes(self):
        return iter(self._boxes)


def _pieces(start: int, length: int, chunk: int):
    """``(offset in the box, chunk index, start in the chunk, length)`` of a run cut by a chunk grid."""
    out, pos = [], start
    while pos < start + length:
        c = pos // chunk
        n = min(start + length, (c + 1) * chunk) - pos
        out.append((pos - start, c, pos - c * chunk, n))
        pos += n
    return out


def _read_at(path: str, offset: int, size: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(size)


def _hdf5_header_check(ds, path) -> tuple[int, bytes]:
    """``(offset, bytes)`` of the first chunk of the dataset's object header (its dataspace,
    datatype and storage layout messages: shape, dtype, data address, chunking): the operator
    checks them at every read, so a file rewritten with another layout since the plan is refused."""
    import h5py

    addr = int(h5py.h5o.get_info(ds.id).addr)
    head = _read_at(path, addr, 64)
    if head[:4] == b"OHDR":  # version 2: signature, version, flags, [times], [phase change], chunk 0 size
        flags = head[5]
        pos = 6 + (16 if flags & 0x20 else 0) + (4 if flags & 0x10 else 0)
        width = 1 << (flags & 3)
        size = pos + width + int.from_bytes(head[pos:pos + width], "little") + 4  # + checksum
    elif head[:1] == b"\x01":  # version 1: 16-byte prefix, chunk 0 size at byte 8
        size = 16 + int.from_bytes(head[8:12], "little")
    else:
        raise NotNativeError(f"{path}: dataset {ds.name!r}: object header of unknown version at byte {addr}")
    check = _read_at(path, addr, size)
    if len(check) != size:
        raise NotNativeError(f"{path}: dataset {ds.name!r}: object header at byte {addr} runs past the end of the file")
    return addr, check


def _chunk_pieces(wplan: WindowPlan, chunks, stored: np.dtype, merge_gap: int):
    """The window's boxes cut by the chunk grid of the axes after the step axis: per piece, the
    units ``(file offsets, window offsets, bytes, groups)`` read from a raw C-order chunk of shape
    ``chunks`` for the chunk's first step (the units of step ``j`` of the chunk lie ``j``
    step-strides further: the part's base says so), and the chunk indices of its axes after the
    step axis."""
    shape = wplan.window_shape
    out = []
    for wst, fst, ln in wplan.boxes():
        per_axis = [_pieces(f, n, c) for f, n, c in zip(fst, ln, chunks[1:])]
        for combo in itertools.product(*per_axis):
            box = (tuple(w + p[0] for w, p in zip(wst, combo)), tuple(p[2] for p in combo),
                   tuple(p[3] for p in combo))
            lay = SimpleNamespace(shape=chunks, dtype=stored, fortran_order=False, data_offset=0)
            out.append((plan_npy_reads(lay, _Boxes([box], shape), (0,), merge_gap), tuple(p[1] for p in combo)))
    return out


def _piece_plans(pieces, plans, shape, stored, check=b"", check_at=0) -> list[int]:
    """A plan per chunk piece (its units, no boundary program)."""
    out = []
    for (fo, do, ub, groups), _ in pieces:
        body = encode_units(_no_finish(shape), stored, False, fo, do, ub, groups, check, check_at)
        out.append(plans.add_plan(body, lambda: (body, shape)))
    return out


#: chunked HDF5: at most this many merged plans per file (steps whose chunks lie at the same
#: relative offsets share one); a file with more layouts keeps a part per chunk piece
MAX_MERGED_LAYOUTS = 64


def _merge_pieces(parts, pieces, plans, shape, stored, merge_gap, check, check_at):
    """Parts ``(steps, P, 3)`` of one file merged into one part per step where few layouts exist:
    the steps whose pieces lie at the same offsets relative to each other (files written step by
    step: all of them) share one plan reading all their units, merged into fewer reads, and the
    file is opened and checked once per sample instead of once per piece. ``None`` if not worth it."""
    n, p = parts.shape[:2]
    if p < 2 or n == 0:
        return None
    bases = parts[:, :, 2]
    b0 = bases.min(axis=1)
    keys, inverse = np.unique(bases - b0[:, None], axis=0, return_inverse=True)
    if len(keys) > MAX_MERGED_LAYOUTS:
        return None
    merged = []
    for rel in keys:
        fo = np.concatenate([u[0][0] + r for u, r in zip(pieces, rel)])
        do = np.concatenate([u[0][1] for u in pieces])
        ub = np.concatenate([u[0][2] for u in pieces])
        order = np.argsort(fo, kind="stable")
        fo, do, ub = fo[order], do[order], ub[order]
        if np.any(fo[1:] < fo[:-1] + ub[:-1]):
            return None  # chunks that share bytes (a crafted file): a plan's reads must be disjoint
        body = encode_units(_no_finish(shape), stored, False, fo, do, ub, _group(fo, ub, merge_gap, True),
                            check, check_at)
        merged.append(plans.add_plan(body, lambda: (body, shape)))
    out = np.empty((n, 1, 3), np.int64)
    out[:, 0, 0] = parts[:, 0, 0]
    out[:, 0, 1] = np.asarray(merged, np.int64)[np.asarray(inverse).reshape(-1)]
    out[:, 0, 2] = b0
    return out


def _hdf5_chunk_offsets(ds, path) -> dict:
    """``{chunk's first element: (byte offset, stored bytes)}`` of every chunk written. One pass over
    the chunk index (``chunk_iter``): looking chunks up one by one costs time that grows with
    their number, per lookup."""
    out = {}
    if hasattr(ds.id, "chunk_iter"):
        ds.id.chunk_iter(lambda c: out.__setitem__(tuple(c.chunk_offset), (c.byte_offset, c.size)))
        return out
    for i in range(ds.id.get_num_chunks()):  # pragma: no cover - HDF5 < 1.12.3
        c = ds.id.get_chunk_info(i)
        out[tuple(c.chunk_offset)] = (c.byte_offset, c.size)
    return out


def _hdf5_steps(source, merge_gap: int, plans_of, ranges, budget):
    """Parts of the needed steps of an HDF5Source: ``{file: (parts, finish, wplan)}``, ``parts`` an
    array ``(steps, parts per step, 3)`` of ``(file, plan, base)`` for local steps ``ranges[file]``.
    Contiguous datasets: one plan, a base offset per step. Chunked datasets without filters: one
    part per box and chunk touched, its plan shared by every step (the units relative to the
    chunk's first step), its base the chunk's offset plus the step's place in the chunk: the plans
    are as many as the chunks one window touches, whatever the number of steps."""
    from dali_mesh.io.hdf5 import open_hdf5_dataset

    out = {}
    for fi, (l0, l1) in sorted(ranges.items()):
        path = source.files[fi]
        locals_ = np.arange(l0, l1, dtype=np.int64)
        f, ds = open_hdf5_dataset(path, source.name, **source.h5_kwargs)
        try:
            dcpl = ds.id.get_create_plist()
            if dcpl.get_nfilters():
                raise NotNativeError(f"{path}: dataset {source.name!r} is compressed or filtered "
                                     f"({dcpl.get_nfilters()} filters); it is decoded by partitioned_source")
            if ds.external or ds.is_virtual:
                raise NotNativeError(f"{path}: dataset {source.name!r} has external or virtual storage")
            if not os.path.samefile(ds.file.filename, path):
                # an external link (allow_external=True): the offsets are in another file
                raise NotNativeError(f"{path}: dataset {source.name!r} lives in {ds.file.filename} "
                                     "(an external link)")
            plans = plans_of(_check_dtype(ds.dtype, path))
            check_at, check = _hdf5_header_check(ds, path)
            frame = tuple(ds.shape[1:])
            region = source.region if source.sample_shape is not None else source.region_of(
                source._frame_shapes[fi])
            wplan = plan_window(region, source.index_maps)
            shape = wplan.window_shape
            fidx = len(plans.files)
            plans.files.append((path, os.path.getsize(path)))
            if ds.chunks is None:
                budget(locals_.size)
                offset = ds.id.get_offset()
                if offset is None:
                    raise NotNativeError(f"{path}: dataset {source.name!r} has no stored data (never written)")
                lay = SimpleNamespace(shape=frame, dtype=ds.dtype, fortran_order=False, data_offset=0)
                pidx = plans.add_plan(("contiguous", frame, ds.dtype.str, shape, check_at, check), lambda: (
                    encode_plan(wplan, lay, merge_gap=merge_gap, check=check, check_offset=check_at), shape))
                step_bytes = math.prod(frame) * ds.dtype.itemsize
                parts = np.stack([np.full_like(locals_, fidx), np.full_like(locals_, pidx),
                                  int(offset) + locals_ * step_bytes], -1)[:, None, :]
                out[fi] = (parts, pidx, wplan)
                continue
            chunks = tuple(int(c) for c in ds.chunks)
            ct, chunk_bytes = chunks[0], math.prod(chunks) * ds.dtype.itemsize
            step_stride = math.prod(chunks[1:]) * ds.dtype.itemsize  # one step inside a chunk
            fin_body = encode_units(wplan, ds.dtype, False, [], [], [], [])
            finish = plans.add_plan(fin_body, lambda: (fin_body, shape))
            pieces = _chunk_pieces(wplan, chunks, ds.dtype, merge_gap)
            budget(locals_.size * len(pieces))
            offsets = _hdf5_chunk_offsets(ds, path) if pieces else {}
            first_chunk = l0 // ct
            chunk_ids = np.arange(first_chunk, (l1 - 1) // ct + 1, dtype=np.int64)
            parts = np.empty((locals_.size, len(pieces), 3), np.int64)
            for j, (_, coords) in enumerate(pieces):
                base = np.empty(chunk_ids.size, np.int64)
                for k, c in enumerate(chunk_ids):
                    coord = (int(c) * ct,) + tuple(i * n for i, n in zip(coords, chunks[1:]))
                    info = offsets.get(coord)
                    if info is None or info[0] is None:
                        raise NotNativeError(f"{path}: chunk {coord} of dataset {ds.name} was never written "
                                             "(it reads as fill values)")
                    if info[1] != chunk_bytes:
                        raise NotNativeError(f"{path}: chunk {coord} of dataset {ds.name} is stored in "
                                             f"{info[1]} bytes, not as raw data")
                    base[k] = info[0]
                parts[:, j, 0] = fidx
                parts[:, j, 2] = base[locals_ // ct - first_chunk] + (locals_ % ct) * step_stride
            merged = _merge_pieces(parts, pieces, plans, shape, ds.dtype, merge_gap, check, check_at)
            if merged is None:
                parts[:, :, 1] = _piece_plans(pieces, plans, shape, ds.dtype, check, check_at)
            else:
                parts = merged
            out[fi] = (parts, finish, wplan)
        finally:
            f.close()
    return out


def _no_finish(window_shape):
    """A stand-in plan with no boundary program: the parts of a multi-file sample only read."""
    empty = np.empty(0, np.int64)
    axis = SimpleNamespace(copy_dst=empty, copy_src=empty, fill=empty)
    return SimpleNamespace(axes=[axis] * len(window_shape), window_shape=tuple(window_shape), fill_value=0)


def _zarr_stored_dtype(arr, path) -> np.dtype:
    """The dtype of the bytes in an uncompressed chunk file, or :class:`NotNativeError`."""
    md = arr.metadata
    if md.zarr_format == 2:
        if md.compressor is not None or md.filters:
            raise NotNativeError(f"{path}: Zarr array {arr.path!r} is compressed or filtered; it is decoded by "
                                 "partitioned_source")
        if md.order != "C":
            raise NotNativeError(f"{path}: Zarr array {arr.path!r} stores chunks in order {md.order!r}")
        return np.dtype(arr.dtype)
    codecs = list(md.codecs)
    if len(codecs) != 1 or type(codecs[0]).__name__ != "BytesCodec" or type(md.chunk_grid).__name__ != "RegularChunkGrid":
        raise NotNativeError(f"{path}: Zarr array {arr.path!r} has codecs {[type(c).__name__ for c in codecs]} "
                             "(compression, sharding or transposition); it is decoded by partitioned_source")
    endian = getattr(codecs[0].endian, "value", None)
    dtype = np.dtype(arr.dtype)
    if dtype.itemsize > 1 and endian in ("little", "big"):
        dtype = dtype.newbyteorder("<" if endian == "little" else ">")
    return dtype


def _zarr_steps(source, merge_gap: int, plans_of, ranges, budget):
    """Parts of the needed steps of a ZarrSource (uncompressed v2/v3, local stores), as
    :func:`_hdf5_steps`: per step the array's metadata file (checked, nothing read), then one part
    per box and chunk file touched (every chunk file is a raw C-order array of the full chunk
    shape), its plan shared by every step, its base the step's place in the chunk; then a finishing
    plan (boundary cells). Every chunk file needed is looked at once (its size): a missing one
    sends the source to ``partitioned_source``, which reads it as fill values."""
    from dali_mesh.io.zarr import open_zarr_array

    out = {}
    for fi, (l0, l1) in sorted(ranges.items()):
        store = source.files[fi]
        locals_ = np.arange(l0, l1, dtype=np.int64)
        arr = open_zarr_array(store, source.name)  # a local directory store (LocalStore) at `store`
        root = os.fspath(store)
        stored = _zarr_stored_dtype(arr, store)
        plans = plans_of(_check_dtype(stored, store))
        chunks = tuple(int(c) for c in arr.chunks)
        ct = chunks[0]
        chunk_bytes = math.prod(chunks) * stored.itemsize
        step_stride = math.prod(chunks[1:]) * stored.itemsize
        region = source.region if source.sample_shape is not None else source.region_of(
            source._frame_shapes[fi])
        wplan = plan_window(region, source.index_maps)
        shape = wplan.window_shape
        fin_body = encode_units(wplan, stored, False, [], [], [], [])
        finish = plans.add_plan(fin_body, lambda: (fin_body, shape))
        # the array's metadata file, checked whole at every read (a part that reads nothing): chunk
        # files of an array rewritten with another shape, chunking or dtype are refused, not read
        meta = os.path.join(root, *arr.path.split("/"), ".zarray" if arr.metadata.zarr_format == 2 else "zarr.json") \
            if arr.path else os.path.join(root, ".zarray" if arr.metadata.zarr_format == 2 else "zarr.json")
        try:
            meta_bytes = _read_at(meta, 0, 1 << 30)
        except OSError as e:
            raise NotNativeError(f"{store}: the metadata file {meta} cannot be read ({e})") from None
        # in canonical form, attributes left out: adding one (z.attrs[...] = ...) rewrites zarr.json
        # but not the chunks, so the reads go on; any other change is refused
        canon = _canonical_json(meta_bytes)
        if canon is None:
            raise NotNativeError(f"{meta}: the metadata file is not one JSON object")
        meta_body = encode_units(_no_finish(shape), stored, False, [], [], [], [], canon, CHECK_JSON)
        meta_plan = plans.add_plan(meta_body, lambda: (meta_body, shape))
        meta_file = plans.file_index.get(meta)
        if meta_file is None:
            meta_file = plans.file_index[meta] = len(plans.files)
            plans.files.append((meta, -1))  # its size changes with its attributes
        pieces = _chunk_pieces(wplan, chunks, stored, merge_gap)
        piece_plans = _piece_plans(pieces, plans, shape, stored)
        budget(locals_.size * (1 + len(pieces)))
        first_chunk = l0 // ct
        chunk_ids = range(first_chunk, (l1 - 1) // ct + 1)
        parts = np.empty((locals_.size, 1 + len(pieces), 3), np.int64)
        parts[:, 0] = (meta_file, meta_plan, 0)
        for j, ((_, coords), pidx) in enumerate(zip(pieces, piece_plans)):
            files = np.empty(len(chunk_ids), np.int64)
            for k, c in enumerate(chunk_ids):
                key = arr.metadata.encode_chunk_key((c,) + coords)
                path = os.path.join(root, *arr.path.split("/"), *key.split("/")) if arr.path else \
                    os.path.join(root, *key.split("/"))
                fidx = plans.file_index.get(path)
                if fidx is None:
                    try:
                        size = os.stat(path).st_size
                    except FileNotFoundError:
                        raise NotNativeError(f"{path}: chunk file missing (it reads as fill values)") from None
                    if size != chunk_bytes:
                        raise NotNativeError(f"{path}: chunk file of {size} bytes, not the {chunk_bytes} of a "
                                             "raw chunk")
                    fidx = plans.file_index[path] = len(plans.files)
                    plans.files.append((path, chunk_bytes))
                files[k] = fidx
            parts[:, 1 + j, 0] = files[locals_ // ct - first_chunk]
            parts[:, 1 + j, 1] = pidx
            parts[:, 1 + j, 2] = (locals_ % ct) * step_stride
        out[fi] = (parts, finish, wplan)
    return out


#: The most samples (and parts: reads of one file or chunk, over all samples) the native reader
#: plans; a source with more (a file claiming 2**31 steps, say) is read by ``partitioned_source``,
#: whose sample order and reads cost nothing per step until a step is read. The plan file holds 2
#: words per sample and 4 per part: at the limits about 80 MB, written once per process.
MAX_NATIVE_SAMPLES = 1 << 20
MAX_NATIVE_PARTS = 1 << 21


def _item_words(finish: np.ndarray, parts: np.ndarray) -> np.ndarray:
    """Encoded items: per row ``finish[i]``, the number of parts, then ``parts[i]`` (``(n, P, 4)``)."""
    n, p = parts.shape[:2]
    words = np.empty((n, 2 + 4 * p), np.int64)
    words[:, 0] = finish
    words[:, 1] = p
    words[:, 2:] = parts.reshape(n, 4 * p)
    return words.ravel()


def _plan_time_series(source, merge_gap: int, steps_of) -> tuple[NativePlan, ...]:
    """The plans of an HDF5Source or ZarrSource: one :class:`NativePlan` per output window (the
    window; or a forecast's input and, with a lead, target: steps stacked on a new leading axis).
    They share the plan and file tables. The work is per file and per chunk touched, the per-step
    part is numpy arithmetic (bases and indices), so 20,000 steps plan in a fraction of a second."""
    fc = source.forecast
    if fc is not None and source.sample_shape is None:
        raise NotNativeError("a forecast with per-sample shapes is read by partitioned_source")
    n_samples = int(source.num_samples)
    if n_samples > MAX_NATIVE_SAMPLES:
        raise NotNativeError(f"{source.files[0]}: {n_samples} samples are more than the native reader plans "
                             f"(dali_mesh.pipeline.native.MAX_NATIVE_SAMPLES = {MAX_NATIVE_SAMPLES}); they are read by "
                             "partitioned_source")
    spans = [(0, 0)] if fc is None else [(-fc.history, 0)] + ([(1, fc.lead)] if fc.lead else [])
    k = fc.history if fc is not None else 0
    m = fc.lead if fc is not None else 0
    g0 = source.time_start - k  # global steps [g0, g1) are read by some sample
    g1 = source.time_start + n_samples + m
    offsets = source._offsets
    ranges = {}
    for fi in range(len(source.files)):
        a, b = max(g0, int(offsets[fi])), min(g1, int(offsets[fi + 1]))
        if a < b:
            ranges[fi] = (a - int(offsets[fi]), b - int(offsets[fi]))
    reads = sum(hi - lo + 1 for lo, hi in spans)
    used = [0]

    def budget(n_parts: int) -> None:
        # parts over the steps, times the steps per sample: what the items will hold
        used[0] += n_parts
        if used[0] * reads > MAX_NATIVE_PARTS:
            raise NotNativeError(f"{source.files[0]}: the samples read more than "
                                 f"dali_mesh.pipeline.native.MAX_NATIVE_PARTS = {MAX_NATIVE_PARTS} file parts "
                                 "(chunks) in all; they are read by partitioned_source")

    shared: list[NativePlan] = []

    def plans_of(native_dtype) -> NativePlan:
        if not shared:
            shared.append(NativePlan(native_dtype, source.sample_ndim))
        return shared[0]

    steps = steps_of(source, merge_gap, plans_of, ranges, budget)
    base = shared[0]
    # per needed step (global step - g0): its file's parts and finishing plan
    order = sorted(steps)
    widths = {steps[fi][0].shape[1] for fi in order}
    outs = []
    for lo, hi in spans:
        out = NativePlan(base.dtype, source.sample_ndim + (fc is not None))
        out.plans, out.files, out.window_shapes, out._plan_index = (base.plans, base.files, base.window_shapes,
                                                                    base._plan_index)
        out.file_index = base.file_index
        if fc is None:
            # one item per step, in order; files may differ in parts per step: encoded file by file
            words = []
            for fi in order:
                parts, finish, _ = steps[fi]
                p4 = np.zeros(parts.shape[:2] + (4,), np.int64)
                p4[..., :3] = parts
                words.append(_item_words(np.full(parts.shape[0], finish, np.int64), p4))
            out.set_item_words(np.concatenate(words), n_samples)
            outs.append(out)
            continue
        n = hi - lo + 1
        wplan = steps[order[0]][2]
        step_bytes = math.prod(wplan.window_shape) * base.dtype.itemsize
        # the stacked window: a leading step axis without boundary cells, then the step's axes
        empty = np.empty(0, np.int64)
        stacked = SimpleNamespace(
            axes=[SimpleNamespace(copy_dst=empty, copy_src=empty, fill=empty)] + list(wplan.axes),
            window_shape=(n,) + wplan.window_shape, fill_value=wplan.fill_value)
        body = encode_units(stacked, base.dtype, False, [], [], [], [])
        finish = base.add_plan(body, lambda: (body, stacked.window_shape))
        rows = (np.arange(n_samples, dtype=np.int64) + (source.time_start - g0))[:, None] + np.arange(lo, hi + 1)
        if len(widths) == 1:
            table = np.concatenate([steps[fi][0] for fi in order])  # (steps, P, 3)
            p = table.shape[1]
            p4 = np.zeros((n_samples, n, p, 4), np.int64)
            p4[..., :3] = table[rows]
            p4[..., 3] = (np.arange(n, dtype=np.int64) * step_bytes)[None, :, None]
            out.set_item_words(_item_words(np.full(n_samples, finish, np.int64), p4.reshape(n_samples, n * p, 4)),
                               n_samples)
        else:  # files chunked differently: steps with different numbers of parts
            table = [row for fi in order for row in steps[fi][0]]
            out.items = [(finish, [tuple(int(v) for v in q) + (j * step_bytes,)
                                   for j, r in enumerate(rs) for q in table[r]]) for rs in rows]
        outs.append(out)
    return tuple(outs)


def plan_source(source, *, merge_gap: int = DEFAULT_MERGE_GAP) -> NativePlan:
    """The native plan of ``source``'s first window for this rank (see :func:`plan_windows`)."""
    return plan_windows(source, merge_gap=merge_gap)[0]


def plan_windows(source, *, merge_gap: int = DEFAULT_MERGE_GAP) -> tuple[NativePlan, ...]:
    """The native plans of ``source`` for this rank, one per window output (``source.window_names``:
    the window, or a forecast's input and target), or :class:`NotNativeError` saying why not."""
    from dali_mesh.source import HDF5Source, NumpySource, ZarrSource

    if isinstance(source, NumpySource):
        return (_plan_numpy(source, merge_gap),)
    if isinstance(source, HDF5Source):
        return _plan_time_series(source, merge_gap, _hdf5_steps)
    if isinstance(source, ZarrSource):
        return _plan_time_series(source, merge_gap, _zarr_steps)
    raise NotNativeError(f"{type(source).__name__} is not read natively (NumpySource, HDF5Source and "
                         "ZarrSource are, for uncompressed data)")


# ---- the pipeline side ---------------------------------------------------------------------------
class _SampleIds:
    """Batch-mode external source: this rank's sample ids and pad flags of one batch, from the
    source's stateless sample order (``BatchInfo``: iteration and epoch), so DALI's checkpoints
    resume it exactly. ``StopIteration`` after the last whole batch."""

    def __init__(self, source) -> None:
        self.source = source

    def __call__(self, info):
        # O(1) per index (SampleOrder), not the epoch's arrays: a source claiming 2**40 samples costs
        # one batch's worth per call
        order = self.source.sample_order(int(info.epoch_idx))
        bs = self.source.batch_size
        i0 = int(info.iteration) * bs
        if i0 >= len(order):
            raise StopIteration
        batch = [order[i] for i in range(i0, min(i0 + bs, len(order)))]
        return ([np.array(int(s), np.int64) for s, _ in batch], [np.array(bool(p)) for _, p in batch])


def read_windows(source, device: str = "cpu", *, name: str | None = None, layout: str | None = None,
                 fallback: bool = True, task_bytes: int = 4 << 20, prefetch: bool = True,
                 merge_gap: int = DEFAULT_MERGE_GAP, plan_dir: str | None = None, **kwargs):
    """This rank's windows of ``source``, read by the native operator (``fn.dali_mesh.read_windows``).

    Outputs as :func:`dali_mesh.fn.partitioned_source`: ``(window, sample_id, is_pad)``, or with a
    forecast ``(input, target, sample_id, is_pad)`` (steps stacked on a leading axis); the sample
    order, padding and checkpointing are the same. Needs no Python worker processes
    (``py_num_workers`` is unused); reads run on the pipeline's ``num_threads``.

    Args:
        source: a :class:`~dali_mesh.NumpySource`, :class:`~dali_mesh.HDF5Source` or
            :class:`~dali_mesh.ZarrSource` (see the table above for what is read natively).
        device: ``"cpu"``, or ``"gpu"``: the window lands in GPU memory (pinned staging, one
            asynchronous copy, halo cells filled on the device; the sample id and pad flag stay on
            the CPU).
        name: the sample-id external source's name.
        layout: DALI layout string of the window (e.g. ``"CHW"``).
        fallback: when the source cannot be read natively, log one line why and return
            ``partitioned_source(source, device, ...)`` (``False``: raise :class:`NotNativeError`).
        task_bytes: bytes per thread-pool task (a large window is read by every thread).
        prefetch: announce every range of a batch to the kernel (``POSIX_FADV_WILLNEED``) when its
            files are opened: cold, all of them are read at once (exactly the ranges, no more).
        merge_gap: byte ranges at most this far apart are read in one call (as the Python reader).
        plan_dir: where to write the plan file (default: a per-user temp directory).
        kwargs: passed to the ``partitioned_source`` fallback.
    """
    from nvidia.dali import fn, types

    from dali_mesh.pipeline.external import current_pipeline_for

    if device not in ("cpu", "gpu"):
        raise ValueError(f"device must be 'cpu' or 'gpu', got {device!r}")
    pipe = current_pipeline_for(source)
    try:
        plans = plan_windows(source, merge_gap=merge_gap)
    except NotNativeError as e:
        if not fallback:
            raise
        from dali_mesh.pipeline.external import partitioned_source

        log.info("read_windows: %s; using partitioned_source", e)
        return partitioned_source(source, device, name=name, layout=layout, **kwargs)
    from dali_mesh.pipeline.plugin import load_plugin

    ops = load_plugin()
    paths = [p.write(plan_dir) for p in plans]
    if pipe is not None:  # as partitioned_source does: MeshLoader checks it and fingerprints checkpoints
        pipe._dali_mesh_sources = getattr(pipe, "_dali_mesh_sources", []) + [source]
    ids, pads = fn.external_source(source=_SampleIds(source), num_outputs=2, batch=True,
                                   batch_info=True, dtype=[types.INT64, types.BOOL], ndim=[0, 0],
                                   name=name)
    wins = []
    for plan, path in zip(plans, paths):
        win = ops.read_windows(ids, plan_file=path, dtype=types.to_dali_type(plan.dtype),
                               task_bytes=int(task_bytes), prefetch=bool(prefetch),
                               device="mixed" if device == "gpu" else "cpu")
        if layout is not None:
            win = fn.reshape(win, layout=layout)
        wins.append(win)
    return (*wins, ids, pads)
