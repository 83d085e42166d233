"""The base of the sources: the sample order and the DALI call protocol (see :mod:`dali_mesh.source`)."""
from __future__ import annotations

import copy
import hashlib
import logging
import os
from typing import Any, Sequence

import numpy as np

from dali_mesh._checks import is_int as _is_int
from dali_mesh.plan.ranges import DEFAULT_MERGE_GAP
from dali_mesh.plan import NotNativeError
from dali_mesh.partition import Layout, Region, SampleOrder
from dali_mesh.partition.read_groups import GroupReads, OwnReads, group_coordinates, share_dims
from dali_mesh.source.buffers import BufferPool
from dali_mesh.storage import attach_credentials, carry_credentials, resolve_locations, stores_of

__all__ = ["SEED_LIMIT", "WindowSource"]

log = logging.getLogger(__name__)

#: seeds are integers in [0, SEED_LIMIT): the sample order's generator takes 64 bits
SEED_LIMIT = 1 << 64


class WindowSource:
    """Base of the sources: the sample order and the DALI call protocol.

    Subclasses set ``num_samples``, ``sample_shape`` (``None`` with per-sample shapes), ``dtype``, and
    implement ``_read(sample_id) -> tuple of windows``.
    """

    window_names: tuple[str, ...] = ("window",)
    share_dims: tuple[str, ...] = ()  # read once per group: see __init__'s share
    reads: OwnReads | GroupReads = OwnReads()  # what this rank's reads are (group_reader: the group's)
    # what the fingerprint holds besides the order's settings (declared, never probed): every source
    # has these (the defaults where it has none); `fingerprint_fields` names further attributes a
    # source records (a time series: its array's name and first step)
    files: Sequence[str] = ()
    index_maps = None
    rows = None  # an index-set window (dali_mesh.partition.Rows), kept in index_maps on its axis
    group_rows = None  # with share=: {member coordinate: Rows} of this rank's read group (its reader reads the union)
    time_stride = 1
    forecast = None
    fingerprint_fields: tuple[str, ...] = ()

    def __init__(self, layout: Layout, *, batch_size: int = 1, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False, per_sample_shapes: bool = False,
                 reuse_buffers: bool = True, share=None) -> None:
        if not isinstance(layout, Layout):
            raise TypeError(f"layout must be a dali_mesh.Layout, got {type(layout).__name__}")
        if not _is_int(batch_size) or batch_size <= 0:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        if not _is_int(seed) or not 0 <= seed < SEED_LIMIT:
            raise ValueError(f"seed must be an integer in [0, 2**64), got {seed!r}: the sample order's "
                             "generator takes 64 bits, so other values would repeat or truncate a seed")
        self.layout = layout
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.per_sample_shapes = bool(per_sample_shapes)
        self.reuse_buffers = bool(reuse_buffers)
        self._memo: dict[str, Any] = {}
        # read once per group (dali_mesh.partition.read_groups): the mesh dims whose ranks split the reads
        self.share_dims = share_dims(layout, share)
        if self.share_dims and self.per_sample_shapes:
            raise ValueError("share= needs one sample shape (the group window is cut the same way for every "
                             "sample): per-sample shapes are read by each rank")
        self.reads: OwnReads | GroupReads = OwnReads()  # this rank's window of its sample group's order

    # ---- output buffers -----------------------------------------------------------------------------
    def _empty(self, shape, dtype) -> np.ndarray:
        """An output array, recycled from earlier calls when nobody holds it any more (a
        :class:`~dali_mesh.source.buffers.BufferPool` of ``batch_size + 2`` arrays per process)."""
        if not self.reuse_buffers:
            return np.empty(shape, dtype)
        pool = self._memo.get("buffers")
        if pool is None:
            pool = self._memo["buffers"] = BufferPool(self.batch_size + 2)
        return pool.empty(shape, dtype)

    # ---- read once per group --------------------------------------------------------------------------
    @property
    def group(self) -> tuple[int, int]:
        """``(size, index)`` of this rank's read group (``(1, 0)`` without ``share``)."""
        if not self.share_dims:
            return 1, 0
        members = group_coordinates(self.layout, self.share_dims)
        return len(members), members.index(tuple(self.layout.mesh.coordinate))

    def group_reader(self) -> "WindowSource":
        """What this rank's pipeline reads: the source itself, or with ``share`` the source reading
        :class:`~dali_mesh.partition.read_groups.GroupReads`: its windows are the group window and its
        epoch is this member's batches (batches ``index, index + size, ...``). ``MeshLoader`` cuts and
        exchanges the members' windows. A group reader's group reader is itself."""
        return self.with_reads(GroupReads(self.share_dims)) if self.share_dims else self

    def with_reads(self, reads: OwnReads | GroupReads) -> "WindowSource":
        """This source reading ``reads`` (its regions and its order), the rest the same: itself when it
        already does, else a copy of the state a pickle carries (``__getstate__``: no caches, no open
        handles, none shared with this source)."""
        if reads == self.reads:
            return self
        source = copy.copy(self)  # copy goes through __getstate__, as pickling into DALI's workers does
        source.reads = reads
        if self.group_rows is not None:
            source._read_rows_of(reads)
        return source

    def _read_rows_of(self, reads) -> None:
        """A source with the rows of its read group's members (``group_rows``) reads, as a group reader,
        the union of their rows (in id order: the group window's rows; ``GroupExchange`` cuts each
        member's out by position), and as itself its own."""
        from dali_mesh.source.arguments import group_row_ids  # noqa: PLC0415

        own = self.__dict__.setdefault("_own_reading", (self.index_maps, self.sample_shape, self.rows))
        maps, shape, rows = own
        if isinstance(reads, GroupReads):
            axis = rows.normalized(self.sample_ndim).axis
            union = group_row_ids(self.group_rows)
            maps = {**maps, axis: union}
            shape = tuple(len(union) if a == axis else n for a, n in enumerate(shape))
            rows = type(rows)(union, axis, total=rows.total)
        self.index_maps, self.sample_shape, self.rows = maps, shape, rows

    # ---- pickling: caches and open handles stay behind ---------------------------------------------
    def __getstate__(self):
        state = self.__dict__.copy()
        state["_memo"] = {}
        # the credentials of this source's stores go with it into DALI's workers (in memory, as its
        # storage_options; a store's own pickle holds none), so that each of its files reads there with
        # its own
        state["_carried"] = carry_credentials(self.stores())
        return state

    def __setstate__(self, state) -> None:
        carried = state.pop("_carried", {})
        self.__dict__.update(state)
        # each store object this source reads with takes them (not a table of the process: another
        # source of the same bucket keeps its own)
        attach_credentials(self.stores(), carried)

    # ---- where the bytes live -------------------------------------------------------------------------
    storage_options: dict | None = None

    def _use_storage_options(self, storage_options) -> None:
        """Keeps ``storage_options`` (for ``s3://``, ``gs://`` and ``https://`` locations; named as fsspec's
        s3fs names them) and resolves this source's files with them, once: each remote file becomes a
        :class:`~dali_mesh.storage.StoredLocation` carrying its store, which every reader below it, in
        this process and in DALI's worker processes, reads with (another source of the same bucket
        with other options reads with its own). They are never part of a fingerprint, a plan or a
        checkpoint."""
        if storage_options is not None and not isinstance(storage_options, dict):
            raise TypeError(f"storage_options must be a dict, got {type(storage_options).__name__}")
        self.storage_options = None if storage_options is None else dict(storage_options)
        self.files = resolve_locations(self.files, self.storage_options)

    def stores(self) -> list:
        """The distinct store objects this source reads with (its files' stores; none for local paths):
        what takes its credentials in a worker process (each store gives them to the process's one native
        core, which the DALI plugin reads through, when it takes them). A source that reads through stores
        held elsewhere than in :attr:`files` names them here too."""
        return stores_of(self.files)

    # ---- what a checkpoint is valid for -------------------------------------------------------------
    def fingerprint(self) -> dict[str, Any]:
        """Plain data that decides which sample comes at ``(epoch, idx_in_epoch)``: a checkpoint taken
        with one fingerprint resumes at another position under another (see ``MeshLoader``)."""
        # plain strings (a StoredLocation's name, not the location with its store): a checkpoint loads with
        # torch.load's weights_only default and names no store's settings
        fp = {"class": type(self).__name__, "files": [str.__str__(os.fspath(f)) for f in self.files],
              "num_samples": int(self.num_samples), "seed": self.seed, "shuffle": self.shuffle,
              "drop_last": self.drop_last, "batch_size": self.batch_size,
              "sample_shape": None if self.sample_shape is None else list(self.sample_shape),
              "dtype": str(np.dtype(self.dtype)), "layout": repr(self.layout),
              "channels": None if not self.index_maps else
              {int(a): m.tolist() for a, m in self.index_maps.items()
               if self.rows is None or a != self.rows.normalized(self.sample_ndim).axis} or None}
        if self.rows is not None:  # absent without rows: old checkpoints still resume
            fp["rows"] = self.rows.digest()
        if self.group_rows is not None:  # the group's rows, the same on every member (what they agree on)
            h = hashlib.sha256()
            for c in sorted(self.group_rows):
                h.update(repr(c).encode() + self.group_rows[c].digest().encode())
            fp["rows_table"] = h.hexdigest()
        for attr in self.fingerprint_fields:
            value = getattr(self, attr)
            fp[attr] = str.__str__(value) if isinstance(value, str) else value
        if self.share_dims:  # absent without share: old checkpoints still resume
            fp["share"] = list(self.share_dims)
        if self.time_stride != 1:  # absent at 1: old checkpoints still resume
            fp["time_stride"] = self.time_stride
        forecast = self.forecast
        if forecast is not None:
            # stride 1 keeps the fingerprint of checkpoints saved before strides existed
            fp["forecast"] = [forecast.history, forecast.lead] + ([forecast.stride] if forecast.stride != 1 else [])
        return fp

    # ---- sample order -------------------------------------------------------------------------------
    def sample_order(self, epoch: int) -> SampleOrder:
        """This rank's :class:`dali_mesh.partition.SampleOrder` for ``epoch``: ``(sample_id, is_pad)``
        per index in O(1) time and memory, whatever the sample count (a file claiming 2**40 steps
        costs nothing until read)."""
        memo = self._memo.get("sample_order")
        if memo is not None and memo.epoch == epoch:
            return memo
        res = self.reads.order_of(self.layout, self.layout.order(
            self.num_samples, epoch, seed=self.seed, shuffle=self.shuffle, batch_size=self.batch_size,
            drop_last=self.drop_last))
        self._memo["sample_order"] = res
        return res

    def order(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """This rank's ``(sample_ids, is_pad)`` arrays for ``epoch`` (see :func:`dali_mesh.sample_order`);
        memory proportional to the epoch (kept for the last epoch asked): the sources themselves use
        :meth:`sample_order`, O(1) per index."""
        memo = self._memo.get("order_arrays")
        if memo is None or memo[0] != epoch:
            memo = self._memo["order_arrays"] = (epoch, self.sample_order(epoch).arrays())
        return memo[1]

    def __len__(self) -> int:
        """Samples per epoch for this rank (a whole number of batches, the same on every rank)."""
        return len(self.sample_order(0))

    @property
    def num_batches(self) -> int:
        return len(self) // self.batch_size

    def _check_batches(self) -> None:
        """A source that makes no whole batch would end every epoch before it starts."""
        if len(self) == 0:
            raise ValueError(
                f"{type(self).__name__}: {self.num_samples} samples over {self.layout.num_batch_groups} sample "
                f"groups make no whole batch of {self.batch_size} with drop_last=True: lower batch_size, or "
                "keep drop_last=False (padded batches)")

    # ---- regions --------------------------------------------------------------------------------------
    @property
    def region(self) -> Region | None:
        """This rank's region of every sample (``None`` with per-sample shapes)."""
        if self.sample_shape is None:
            return None
        reg = self._memo.get("region")
        if reg is None:
            reg = self._memo["region"] = self.region_of(self.sample_shape)
        return reg

    def region_of(self, shape: Sequence[int]) -> Region:
        """The window this source reads of a sample of ``shape`` (this rank's, or a group reader's group
        window: see :attr:`reads`)."""
        return self.reads.region_of(self.layout, shape)

    # ---- outputs --------------------------------------------------------------------------------------
    @property
    def num_outputs(self) -> int:
        return len(self.window_names) + 2

    @property
    def output_names(self) -> tuple[str, ...]:
        return self.window_names + ("sample_id", "is_pad")

    @property
    def output_dtypes(self) -> tuple[np.dtype, ...]:
        return (np.dtype(self.dtype),) * len(self.window_names) + (np.dtype(np.int64), np.dtype(bool))

    @property
    def output_ndims(self) -> tuple[int, ...]:
        return self._window_ndims() + (0, 0)

    def _window_ndims(self) -> tuple[int, ...]:
        # a forecast stacks its steps on a leading axis
        extra = 1 if self.forecast is not None else 0
        return (self.sample_ndim + extra,) * len(self.window_names)

    def read_sample(self, sample_id: int) -> tuple[np.ndarray, ...]:
        """This rank's window(s) of sample ``sample_id`` (no DALI needed)."""
        if not 0 <= sample_id < self.num_samples:
            raise IndexError(f"sample id {sample_id} is out of range for {self.num_samples} samples")
        return self._read(int(sample_id))

    def __call__(self, sample_info) -> tuple[np.ndarray, ...]:
        order = self.sample_order(int(sample_info.epoch_idx))
        i = int(sample_info.idx_in_epoch)
        if i >= len(order):
            raise StopIteration
        sample_id, is_pad = order[i]
        return self._read(sample_id) + (np.array(sample_id, np.int64), np.array(is_pad))

    def _files_of(self, sample_id: int) -> str:
        """The file(s) sample ``sample_id`` is read from, for status and error messages."""
        return "?"

    def native_plans(self, merge_gap: int = DEFAULT_MERGE_GAP) -> tuple:
        """The native reader's plans of this rank's windows, one
        :class:`~dali_mesh.plan.PlanSet` per window output (:attr:`window_names`), or
        :class:`~dali_mesh.plan.NotNativeError` saying why this source is not read natively."""
        raise NotNativeError(f"{type(self).__name__} is not read natively (NumpySource, HDF5Source and "
                             "ZarrSource are, for uncompressed data)")

    def _read(self, sample_id: int) -> tuple[np.ndarray, ...]:  # pragma: no cover - abstract
        raise NotImplementedError
