"""A :class:`PlanSet`: everything the native operator reads (plans, the file and chunk tables, one item
per sample id), its algebra (outputs sharing tables, joined outputs, channels stacked) and its
encoding into a plan file."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import NamedTuple, Sequence

import numpy as np

from dali_mesh.plan.encoding import _CODER, _PLAN_FILE, Field, _word, encode
from dali_mesh.plan.files import write_plan_file
from dali_mesh.plan.types import (CODECS, PLAN_MAGIC, AxisProgram, Coder, NotNativeError, PlanFile, PlanItem,
                                  PlanPart, ReadPlan, _EMPTY, _decode_item)

__all__ = ["PlanEpochs", "PlanSet", "stack_channels"]


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
        it, _ = _decode_item(self._item_words, int(_item_rows(self._item_words, self._n_items)[1][item]) - 2)
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

    def fetches(self, task_bytes: int = 4 << 20, headers: dict[int, bytes] | None = None,
                costs=None) -> "PlanEpochs":
        """What the native reader fetches from an object store for these items, batch by batch
        (:class:`PlanEpochs`; ``task_bytes``: the operator's argument, which splits raw reads; ``headers``:
        coder index -> the first 16 bytes of one of its chunks, see :meth:`blosc_probes`; ``costs``: per store
        of the plan file ``(latency s, bytes/s)``, ``None``: each store's own measure)."""
        return PlanEpochs(self, task_bytes, headers, costs)

    def blosc_probes(self) -> list[tuple[int, int, int]]:
        """``(coder, file, offset)``: where one chunk of each Blosc coder that may be read in parts (at least
        256 KiB stored) starts in its file, for :meth:`fetches`' ``headers`` (chunks of one coder have the
        same block size: the reader guesses their blocks alike too)."""
        from dali_mesh._kernels.fetch_api import min_parts_bytes  # noqa: PLC0415

        blosc = CODECS["blosc"] if self.coders else None
        least = min_parts_bytes() if self.coders else 0
        out: dict[int, tuple[int, int, int]] = {}
        for file, offset, nbytes, coder in self._chunk_rows:
            steps = self.coders[coder].steps
            if coder not in out and nbytes >= least and len(steps) == 1 and int(steps[0][0]) == blosc:
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
class PlanEpochs:
    """What the native reader fetches for the items of a :class:`PlanSet`, batch by batch, from the plan
    alone (no data read; :meth:`PlanSet.fetches`): the reader's own code counts it (csrc/reader/fetch_epoch.h,
    through :func:`dali_mesh._kernels.fetch_api.epoch_fetches`), so the counts are a real epoch's, but for
    where the blocks of a Blosc chunk read in parts lie (placed as if they compressed alike, from one
    header of its coder: ``parts_chunks`` counts those reads). The plan is written once (a sealed memfd)."""

    def __init__(self, plans: PlanSet, task_bytes: int = 4 << 20, headers: dict[int, bytes] | None = None,
                 costs=None) -> None:
        self.path = plans.write()
        self._kw = dict(task_bytes=int(task_bytes), headers=dict(headers or {}), costs=costs)

    def epoch(self, ids, batch_size: int = 1):
        """What reading the sample ids ``ids``, in batches of ``batch_size`` in that order, fetches: an
        :class:`~dali_mesh._kernels.fetch_api.EpochFetches`."""
        from dali_mesh._kernels.fetch_api import epoch_fetches  # noqa: PLC0415

        return epoch_fetches(self.path, ids, batch_size, **self._kw)


class _Spec(NamedTuple):
    spec: bytes


def _plan_file(f) -> PlanFile:
    return f if isinstance(f, PlanFile) else PlanFile(*f)
