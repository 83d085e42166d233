"""A :class:`PlanSet`: everything the native operator reads (plans, the file and chunk tables, one item
per sample id), its algebra (outputs sharing tables, joined outputs, channels stacked) and its
encoding into a plan file."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import NamedTuple, Sequence

import numpy as np

from dali_mesh.plan.encoding import _CODER, _PLAN_FILE, Field, _word, encode
from dali_mesh.plan.files import write_plan_file
from dali_mesh.plan.types import (CODECS, PLAN_MAGIC, AxisProgram, Coder, NotNativeError, PlanFile, PlanItem,
                                  PlanPart, ReadPlan, _EMPTY, _decode_item)

__all__ = ["EpochFetches", "PlanFetches", "PlanSet", "blosc_blocks", "stack_channels"]


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
        (its stored, compressed size; a Blosc chunk of which a window needs some blocks is read in
        parts, fewer bytes), the byte ranges of raw parts."""
        return self._item_reads(item)[0]

    def item_requests(self, item: int) -> int:
        """The reads the native reader makes for sample id ``item`` from local files: one per coded chunk and
        one per merged byte range of raw parts (what the read groups merge). From an object store a Blosc
        chunk read in parts takes two or three, and chunks side by side in one file one together
        (:meth:`fetches`)."""
        return self._item_reads(item)[1]

    def _item_reads(self, item: int) -> tuple[int, int]:
        if not 0 <= item < self._n_items:
            raise IndexError(f"item {item} is out of range for {self._n_items} items")
        i = 0
        for _ in range(item):  # items are variable-length: skip to this one
            i += 2 + 4 * int(self._item_words[i + 1])
        it, _ = _decode_item(self._item_words, i)
        chunks = self._chunk_rows
        seen, total, requests = set(), 0, 0
        for part in it.parts:
            plan = self.plans[part.plan]
            if plan.coded:
                if part.file not in seen:
                    seen.add(part.file)
                    total += max(0, chunks[part.file][2])
                    requests += chunks[part.file][2] > 0  # a chunk never written reads nothing
            else:
                total += plan.read_bytes
                requests += len(plan.group_begin)
        return total, requests

    def fetches(self, task_bytes: int = 4 << 20, headers: dict[int, bytes] | None = None) -> "PlanFetches":
        """What the native reader fetches from an object store for these items, batch by batch
        (:class:`PlanFetches`; ``task_bytes``: the operator's argument, which splits raw reads; ``headers``:
        coder index -> the first 16 bytes of one of its chunks, see :meth:`blosc_probes`)."""
        return PlanFetches(self, task_bytes, headers)

    def blosc_probes(self) -> list[tuple[int, int, int]]:
        """``(coder, file, offset)``: where one chunk of each Blosc coder that may be read in parts (at least
        256 KiB stored) starts in its file, for :meth:`fetches`' ``headers`` (chunks of one coder have the
        same block size: the reader guesses their blocks alike too)."""
        blosc = CODECS["blosc"] if self.coders else None
        out: dict[int, tuple[int, int, int]] = {}
        for file, offset, nbytes, coder in self._chunk_rows:
            steps = self.coders[coder].steps
            if coder not in out and nbytes >= _PARTS_MIN_STORED and len(steps) == 1 and int(steps[0][0]) == blosc:
                out[coder] = (coder, file, offset)
        return list(out.values())

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
        return write_plan_file(self.to_bytes(), directory)


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


# ---- what the native reader fetches from an object store --------------------------------------------------
# The reader's constants that these counts follow (csrc/, read there, never changed here): a Blosc chunk of at
# least 256 KiB stored whose parts cover less than 3/4 of it is read in parts (codecs.h kMinPartsBytes,
# MayReadInParts), first its first 4 KiB (header and block index), then its blocks' ranges, those closer than
# 64 KiB as one (reader/fetch_plan.cc ReadStored; a remote store merges wider gaps once it has measured its
# latency and bandwidth, PlanRequests: these are the counts of a link not measured yet); a raw group's
# buffers (its runs, and its gaps cut to a scratch of at most 1 MiB) go 1024 to a read (read_units.cc ReadGroups); raw groups larger than a task are split when the
# plan is loaded (tasks.cc SplitLargeGroups; tasks of at least batch_reader.h kMinTaskBytes).
_PARTS_MIN_STORED = 256 << 10
_PARTS_HEAD = 4096
_BLOSC_HEADER = 16
_PARTS_GAP = 64 << 10
_IOV_MAX = 1024
_MAX_SCRATCH = 1 << 20
_MIN_TASK_BYTES = 4096


class EpochFetches(NamedTuple):
    """What the native reader fetches for a list of sample ids read in batches (:meth:`PlanFetches.epoch`)."""

    batches: int
    requests: int         # GET requests
    bytes: int            # body bytes received
    round_trips: int      # summed over the batches: each batch's longest chain of requests sent in turn
    max_round_trips: int  # the most of one batch
    parts_chunks: int     # chunk reads in parts: their requests and bytes are estimated, see PlanFetches


class PlanFetches:
    """What the native reader (csrc/reader/batch_reader.cc) fetches from an object store for the items of a
    :class:`PlanSet`, batch by batch, from the plan alone (no data read; :meth:`PlanSet.fetches`).

    Requests and bytes of a batch:

    * a coded chunk the batch needs, however many of its parts copy from it: one ranged GET of its stored
      bytes; a chunk missing when planned: one GET that finds it still missing (no body); a shard's chunk
      its index lists as never written: none; chunks read whole that lie side by side in one file (gaps
      under 64 KiB): one GET together (:func:`_chunk_runs`);
    * a Blosc chunk of at least 256 KiB stored whose parts cover less than 3/4 of it: a GET of its first
      4 KiB (header and block index), then, when the blocks its parts touch (of the block size of
      ``headers``: one chunk's header per coder) still cover less than 3/4 of it, a GET per run of those
      blocks (runs closer than 64 KiB joined; a read in parts), else a GET of the rest. Where a chunk's
      blocks lie is known only once its index is read: a read in parts places them by taking every block
      to compress alike (an estimate, counted in ``parts_chunks``; the reader's guess of the blocks, learnt
      from the previous chunk, may fetch the header with the first blocks, one request fewer);
    * a raw part (bytes stored as they are): its groups, gaps included, split as the reader splits groups
      larger than ``task_bytes``, one GET per 1024 buffers of a group; and a GET of the header the plan
      checks, per task. Raw parts are read per sample, even two samples of a batch that read the same bytes.

    Objects are opened at the version the plan holds (an ETag: S3, GCS), which costs no request.

    Round trips, the model: every request of a batch is sent at once (the batch's tasks on the reader's
    threads and its fetch pool: enough threads assumed), so a batch takes as many round trips as its
    longest chain of requests that wait on each other: 1 for whole chunks; 2 for a chunk read in parts (its
    header and index, then its blocks: 1 when the reader's guess of the blocks, learnt from the array's
    previous chunk, holds, which is not counted); a raw task's check, then its groups one after another.
    The reader reads a batch ahead on object stores, so a batch's round trips overlap the use of the one
    before: what a training step must hide is the round trips of one batch.
    """

    def __init__(self, plans: PlanSet, task_bytes: int = 4 << 20, headers: dict[int, bytes] | None = None) -> None:
        # per Blosc coder: its chunks' block size, type size and whether stored as they are (no block index)
        self._blocks = {int(c): blosc_blocks(bytes(h)) for c, h in (headers or {}).items()}
        self._words = plans._item_words
        self._n_items = plans.num_items
        _, self._starts, self._counts = _item_rows(plans._item_words, plans.num_items)
        self._plans = plans.plans
        self._coded = np.asarray([bool(p.coded) for p in plans.plans], bool)
        # per plan: the requests, bytes and requests in turn of one raw part of it
        self._raw = np.asarray([(0, 0, 0) if p.coded else _raw_fetches(p, task_bytes) for p in plans.plans],
                               np.int64).reshape(-1, 3)
        rows = self._rows = np.asarray(plans._chunk_rows, np.int64).reshape(-1, 4)
        self._stored = rows[:, 2]
        in_parts, decoded = np.zeros(0, bool), np.zeros(0, np.int64)
        if plans.coders:
            blosc = CODECS["blosc"]
            in_parts = np.asarray([len(c.steps) == 1 and int(c.steps[0][0]) == blosc for c in plans.coders], bool)
            decoded = np.asarray([c.chunk_bytes for c in plans.coders], np.int64)
        self._coder = rows[:, 3]
        self._decoded = decoded[rows[:, 3]]
        self._may_parts = in_parts[rows[:, 3]] & (rows[:, 2] >= _PARTS_MIN_STORED)
        self._covered: dict = {}  # ((plan, base), ...) -> the merged ranges of a decoded chunk they copy

    def epoch(self, ids, batch_size: int = 1) -> EpochFetches:
        """What reading the sample ids ``ids``, in batches of ``batch_size`` in that order, fetches."""
        ids = np.asarray(ids, np.int64).reshape(-1)
        if ids.size and not (0 <= ids.min() and ids.max() < self._n_items):
            raise IndexError(f"sample ids {ids.min()}..{ids.max()} are out of range for {self._n_items} items")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        n_batches = -(-ids.size // batch_size)
        counts = self._counts[ids]
        pos = _part_positions(self._starts[ids], counts)
        batch = np.repeat(np.arange(ids.size, dtype=np.int64) // batch_size, counts)
        file, plan, base = (self._words[pos + k] for k in range(3))
        trips = np.zeros(n_batches, np.int64)
        coded = self._coded[plan]
        raw = self._raw[plan[~coded]]
        np.maximum.at(trips, batch[~coded], raw[:, 2])
        # each chunk once per batch: the (batch, chunk) pairs, their parts side by side
        chunk, cbatch, cplan, cbase = file[coded], batch[coded], plan[coded], base[coded]
        order = np.argsort(cbatch * max(1, self._stored.size) + chunk, kind="stable")
        key = (cbatch * max(1, self._stored.size) + chunk)[order]
        _, first, count = np.unique(key, return_index=True, return_counts=True)
        pair_chunk, pair_batch = chunk[order[first]], cbatch[order[first]]
        stored = self._stored[pair_chunk]
        requests = np.where(stored == -1, 1, stored > 0).astype(np.int64)
        got = np.maximum(stored, 0)
        turns = requests.copy()
        parts = 0
        whole = stored > 0  # read whole: fetched together with their neighbours in the file (below)
        spare_none: set[int] = set()  # coders whose blocks spared none of a chunk's ranges (read whole) so far
        for i in np.flatnonzero(self._may_parts[pair_chunk]):
            seg = order[first[i]:first[i] + count[i]]
            ranges = self._ranges(tuple(sorted(set(zip(cplan[seg].tolist(), cbase[seg].tolist())))))
            coder = int(self._coder[pair_chunk[i]])
            est = _parts_estimate(ranges, int(stored[i]), int(self._decoded[pair_chunk[i]]), self._blocks.get(coder))
            if est is not None and not est[3]:
                # its header showed blocks too large to spare any: the array's next chunks are read whole at
                # once (fetch_plan.cc FetchChunk)
                if coder in spare_none:
                    est = (1, est[1], 1, False)
                spare_none.add(coder)
            if est is not None:
                requests[i], got[i], turns[i], estimated = est
                parts += estimated
                whole[i] = False
        self._merge_neighbours(pair_batch, pair_chunk, whole, requests, got)
        np.maximum.at(trips, pair_batch, turns)
        return EpochFetches(n_batches, int(raw[:, 0].sum() + requests.sum()), int(raw[:, 1].sum() + got.sum()),
                            int(trips.sum()), int(trips.max(initial=0)), parts)

    def _merge_neighbours(self, pair_batch, pair_chunk, whole, requests, got) -> None:
        """Chunks of one batch read whole that lie next to each other in one file are fetched by one request
        (batch_reader.cc PlanMergedFetches, fetch_plan.cc ChunkRuns with a link not yet measured: chunks that
        overlap or touch, and gaps under 64 KiB; at most 64 MiB a request, 256 MiB a batch): ``requests``
        and ``got`` of the pairs ``(pair_batch, pair_chunk)`` rewritten, a run's request and bytes on its
        first chunk."""
        rows = self._rows
        idx = np.flatnonzero(whole)
        for b in np.unique(pair_batch[idx]):
            members = idx[pair_batch[idx] == b]
            if members.size < 2:
                continue
            spans = rows[pair_chunk[members]]
            held = 0
            for run in _chunk_runs(members, spans[:, 0], spans[:, 1], spans[:, 2]):
                lo = int(rows[pair_chunk[run[0]], 1])
                hi = int(max(rows[pair_chunk[k], 1] + rows[pair_chunk[k], 2] for k in run))
                if held + (hi - lo) > _MAX_MERGED_BATCH:
                    continue  # beyond what a batch holds merged: each chunk alone
                held += hi - lo
                requests[run] = 0
                got[run] = 0
                requests[run[0]], got[run[0]] = 1, hi - lo

    def _ranges(self, parts: tuple) -> list[tuple[int, int]]:
        """The bytes of a decoded chunk that ``parts`` (``(plan, base)`` pairs) copy out, merged, as the
        reader gathers them (read_units.cc AddUnitRanges: each unit from its first run to its last run's end)."""
        hit = self._covered.get(parts)
        if hit is None:
            spans = []
            for p, b in parts:
                plan = self._plans[p]
                lo = plan.file_off + b
                spans += zip(lo.tolist(), (lo + (plan.unit_count - 1) * plan.file_step + plan.unit_bytes).tolist())
            hit = []
            for lo, hi in sorted(spans):
                if hit and lo <= hit[-1][1]:
                    hit[-1] = (hit[-1][0], max(hit[-1][1], hi))
                else:
                    hit.append((lo, hi))
            if len(self._covered) < 4096:
                self._covered[parts] = hit
        return hit


#: fetch_plan.h's kLocalGap, kMaxMergedRequest and batch_reader.cc's kMaxMergedBatch
_LOCAL_GAP, _MAX_MERGED_REQUEST, _MAX_MERGED_BATCH = 64 << 10, 64 << 20, 256 << 20


def _chunk_runs(members, files, offsets, sizes) -> list[list[int]]:
    """fetch_plan.cc ChunkRuns on a link not yet measured: the members (two or more) fetched by one request
    each, in file and offset order (two keys of one range in the order given). A request ends at a gap of
    64 KiB or more after every earlier chunk of the file (not only the run's: after a run is cut, the next
    reads the gap its request reads); a run ends with its request, or where it would pass 64 MiB. Chunks of
    0 bytes are in none (tests/reader/test_chunk_runs.py holds this to the reader)."""
    order = np.lexsort((sizes, offsets, files))
    runs, run, run_lo, run_hi, file, file_hi = [], [], 0, 0, None, 0
    for k in order:
        if sizes[k] <= 0:
            continue
        lo = int(offsets[k])
        hi = lo + int(sizes[k])
        same_request = int(files[k]) == file and lo - file_hi < _LOCAL_GAP
        if run and (not same_request or max(run_hi, hi) - run_lo > _MAX_MERGED_REQUEST):
            if len(run) >= 2:
                runs.append(run)
            run = []
        if int(files[k]) != file:
            file, file_hi = int(files[k]), hi
        if not run:
            run_lo, run_hi = lo, hi
        run.append(int(members[k]))
        run_hi, file_hi = max(run_hi, hi), max(file_hi, hi)
    if len(run) >= 2:
        runs.append(run)
    return runs


def blosc_blocks(header: bytes) -> tuple[int, int, bool] | None:
    """``(block size, type size, memcpyed)`` from a Blosc1 chunk's 16-byte header, or ``None`` when the bytes
    are not one (the header's fields as csrc/codecs/blosc.cc BloscHeader reads them)."""
    if len(header) < _BLOSC_HEADER or not 1 <= header[0] <= 2 or header[3] < 1:
        return None
    return int.from_bytes(header[8:12], "little"), int(header[3]), bool(header[2] & 0x02)


def _parts_estimate(ranges: list[tuple[int, int]], stored: int, decoded: int,
                    blocks: tuple[int, int, bool] | None) -> tuple[int, int, int, bool] | None:
    """``(requests, bytes, round trips, estimated)`` of a Blosc chunk of ``stored`` bytes (``decoded`` decoded) that the
    decoded ``ranges`` cover less than 3/4 of, read as fetch_plan.cc ReadStored reads it, or ``None`` when those
    ranges cover more (read whole in one request). ``blocks``: :func:`blosc_blocks` of the array's chunks
    (``None``: not known, the ranges taken as the blocks). Its first read takes the first 4 KiB; then the
    whole chunk when the blocks touched cover 3/4 of it or more (BlockRuns; the array's next chunks then in one
    request: :meth:`PlanFetches.epoch`), else the rest of its block
    index and the touched blocks, whose stored bytes are placed by taking every block to compress alike
    (``estimated``: the chunk is read in parts, its blocks' bytes placed so)."""
    if sum(hi - lo for lo, hi in ranges) * 4 >= decoded * 3:
        return None
    head = min(stored, _PARTS_HEAD)
    if blocks is None:
        runs, index_end, per = ranges, 0, stored / decoded
    else:
        size, typesize, memcpyed = blocks
        runs = _blosc_merged(ranges, decoded, size, typesize)
        if runs is None:
            return 2, stored, 2, False  # its first 4 KiB, then the rest
        nblocks = -(-decoded // size)
        index_end = _BLOSC_HEADER + (0 if memcpyed else 4 * nblocks)
        per = 1.0 if memcpyed else (stored - index_end) / (nblocks * size)
    have = max(head, min(stored, index_end))
    todo: list[list[int]] = []  # the blocks' bytes not read yet, closer than 64 KiB joined
    for lo, hi in runs:
        lo, hi = max(have, index_end + int(lo * per)), min(stored, index_end + math.ceil(hi * per))
        if lo >= hi:
            continue
        if todo and lo - todo[-1][1] < _PARTS_GAP:
            todo[-1][1] = max(todo[-1][1], hi)
        else:
            todo.append([lo, hi])
    more = int(have > head)  # a block index longer than the first read: read before the blocks
    return 1 + more + len(todo), have + sum(hi - lo for lo, hi in todo), 1 + more + int(bool(todo)), True


def _blosc_merged(ranges: list[tuple[int, int]], decoded: int, size: int, typesize: int) -> list | None:
    """The runs of whole blocks of ``size`` bytes that the decoded ``ranges`` touch, runs closer than a block
    joined, or ``None`` when the chunk is read whole (codecs.cc BlockRuns: they cover 3/4 of it or more,
    or its blocks are not whole items)."""
    if typesize < 1 or size < 1 or size % typesize or decoded % typesize:
        return None
    runs: list[list[int]] = []
    for lo, hi in ranges:
        lo, hi = max(0, lo) // size * size, min(decoded, -(-hi // size) * size)
        if lo >= hi:
            continue
        if runs and lo - runs[-1][1] < size:
            runs[-1][1] = max(runs[-1][1], hi)
        else:
            runs.append([lo, hi])
    return runs if sum(hi - lo for lo, hi in runs) * 4 < decoded * 3 else None


def _raw_fetches(plan: ReadPlan, task_bytes: int) -> tuple[int, int, int]:
    """``(requests, bytes, requests in turn of its longest task)`` of one raw part of ``plan`` as the reader
    reads it: its groups split at ``task_bytes`` (tasks.cc SplitLargeGroups), each group a read per 1024
    buffers (read_units.cc ReadGroups: its runs, and its gaps cut to the scratch), gaps included; the groups
    in tasks of about ``task_bytes`` (SplitGroups), each task reading the header the plan checks first."""
    max_bytes = max(_MIN_TASK_BYTES, int(task_bytes))
    off, nbytes, count = plan.file_off, plan.unit_bytes, plan.unit_count
    step = np.where(count > 1, plan.file_step, 0)
    end = off + (count - 1) * step + nbytes
    begin, stop = plan.group_begin, plan.group_end
    # the scratch the gaps land in: the plan's largest gap as loaded (plan_file.cc), at most 1 MiB
    later = np.ones(off.size, bool)
    later[begin] = False
    gaps = np.concatenate([(step - nbytes)[count > 1], off[1:][later[1:]] - end[:-1][later[1:]]])
    scratch = max(1, min(int(gaps.max(initial=0)), _MAX_SCRATCH))
    split = bool(begin.size) and bool(np.any(end[stop - 1] - off[begin] > max_bytes))
    reads = []  # [first byte, end, buffers] per group as read
    for b, e in zip(begin.tolist(), stop.tolist()):
        reads += _group_reads(plan, b, e, max_bytes if split else None, scratch)
    tasks, acc, here = [], 0, 0  # requests in turn per task (tasks.cc SplitGroups)
    for first, last, buffers in reads:
        here += -(-buffers // _IOV_MAX)
        acc += last - first
        if acc >= max_bytes:
            tasks.append(here)
            acc = here = 0
    if here or not tasks:
        tasks.append(here)
    check = bool(plan.check) and plan.check_offset >= 0
    requests = sum(tasks) + check * len(tasks)
    got = sum(last - first for first, last, _ in reads) + check * len(plan.check) * len(tasks)
    return requests, got, max(tasks) + check


def _group_reads(plan: ReadPlan, b: int, e: int, max_bytes: int | None, scratch: int) -> list[list[int]]:
    """The reads of units ``[b, e)`` of ``plan`` (one group), as ``[first byte, end, buffers]``: one, or with
    ``max_bytes`` as many as tasks.cc SplitLargeGroups cuts the group into (a new group where a run would end
    more than ``max_bytes`` past the group's first byte: a unit's runs moved whole, a single run (or a run
    larger than ``max_bytes``) cut into pieces of whole items)."""
    out = [[0, 0, 0]]
    start = -1  # the file byte where the group being built starts

    def put(at: int, k: int, n: int, s: int) -> None:  # k runs of n bytes, s apart, from byte `at`
        g = out[-1]
        if g[2]:
            g[2] += -(-(at - g[1]) // scratch) if at > g[1] else 0
        else:
            g[0] = at
        g[2] += k + ((k - 1) * -(-(s - n) // scratch) if s > n else 0)
        g[1] = at + (k - 1) * s + n

    def room_at(at: int, need: int) -> int:
        nonlocal start
        if start < 0:
            start = at
        if start + max_bytes - at < need and out[-1][2]:
            out.append([0, 0, 0])
            start = at
        return start + max_bytes - at

    isz = plan.itemsize
    for u in range(b, e):
        at, n, k = int(plan.file_off[u]), int(plan.unit_bytes[u]), int(plan.unit_count[u])
        s = int(plan.file_step[u]) if k > 1 else 0
        if max_bytes is None:
            put(at, k, n, s)
        elif k > 1 and n <= max_bytes:
            j = 0
            while j < k:
                room = room_at(at + j * s, n)
                take = min(k - j, 1 if room < n else 1 + (room - n) // s)
                put(at + j * s, take, n, s)
                j += take
        else:
            piece = max(1, max_bytes // isz) * isz
            for j in range(k):
                done = 0
                while done < n:
                    room = max(room_at(at + j * s + done, isz), isz)
                    take = n - done
                    if take > room:
                        take = max(isz, room // isz * isz)
                    take = min(take, n - done, max(piece, isz))
                    put(at + j * s + done, 1, take, 0)
                    done += take
    return out


class _Spec(NamedTuple):
    spec: bytes


def _plan_file(f) -> PlanFile:
    return f if isinstance(f, PlanFile) else PlanFile(*f)
