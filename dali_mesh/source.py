"""Stateless, picklable external sources: each call returns this rank's window of one sample.

A source is called by DALI's ``fn.external_source(source, batch=False, parallel=True)`` with a
``SampleInfo``; ``(epoch_idx, idx_in_epoch)`` goes through the sample order
(:func:`dali_mesh.sample_order`, with the layout's ``batch_index`` and ``num_batch_groups``) to a
sample id, and the source returns ``(window[s]..., sample_id, is_pad)``. The answer is a pure function
of the source's settings and those two numbers, so DALI's worker processes and DALI checkpointing
need nothing else. ``StopIteration`` is raised at ``idx_in_epoch == len(source)``: the end of the last
whole batch (every rank of every sample group gets the same number of batches).

This module imports numpy and dali_mesh only: DALI's ``spawn`` workers import nothing heavy (h5py
or zarr only when an HDF5 or Zarr source reads).

Sources:
    NumpySource(files, layout)                 one sample per ``.npy`` file
    HDF5Source(files, dataset, layout)         samples along axis 0 of a dataset, across files
    ZarrSource(stores, array, layout)          the same for Zarr arrays (v2 or v3)
HDF5Source and ZarrSource take ``forecast=ForecastSpec(history=k, lead=m, stride=s)``: the sample at
step t is the input steps ``t-k*s, .., t-s, t`` and the target steps ``t+s, .., t+m*s`` (crossing files
where needed), both windows of the same region; and ``channels=[...]`` (a subset of ``channel_axis`` of each step).
"""
from __future__ import annotations

import collections
import copy
import logging
import os
import sys
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from dali_mesh._checks import is_int as _is_int
from dali_mesh.io._common import (DataFileError, ShapeMismatchError, apply_index_maps, check_frame, native_dtype,
                                  normalise_index_maps)
from dali_mesh.io.chunks import plan_time_series
from dali_mesh.io.npy import DEFAULT_MERGE_GAP, plan_npy_files, read_npy_header, read_npy_window
from dali_mesh.io.read_plan import NotNativeError
from dali_mesh.partition import GroupOrder, Layout, Region, SampleOrder
from dali_mesh.partition.read_groups import group_coordinates, group_region, share_dims

__all__ = ["ForecastSpec", "NumpySource", "HDF5Source", "ZarrSource", "WindowSource"]

log = logging.getLogger(__name__)

#: seeds are integers in [0, SEED_LIMIT): the sample order's generator takes 64 bits
SEED_LIMIT = 1 << 64
_STATUS_BYTES = 1024


@dataclass(frozen=True)
class ForecastSpec:
    """Input steps ``t - history*stride, .., t - stride, t`` and target steps ``t + stride, ..,
    t + lead*stride`` of a sample at step ``t``: ``stride`` stored steps between the forecast's steps
    (PhysicsNeMo's ERA5 ``stride``: 6-hourly steps from hourly data is ``stride=6``). Samples still
    start at every stored step."""

    history: int = 0
    lead: int = 1
    stride: int = 1

    def __post_init__(self) -> None:
        for name in ("history", "lead", "stride"):
            v = getattr(self, name)
            low = 1 if name == "stride" else 0
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
                raise ValueError(f"ForecastSpec.{name} must be an integer >= {low}, got {v!r}")

    @property
    def span(self) -> int:
        """Stored steps from a sample's first input step to its last step: ``(history + lead) * stride``."""
        return (self.history + self.lead) * self.stride

    def input_offsets(self) -> range:
        """The input steps relative to ``t``: ``-history*stride .. 0`` in steps of ``stride``."""
        return range(-self.history * self.stride, 1, self.stride)

    def target_offsets(self) -> range:
        """The target steps relative to ``t``: ``stride .. lead*stride`` in steps of ``stride``."""
        return range(self.stride, self.lead * self.stride + 1, self.stride)


class WindowSource:
    """Base of the sources: the sample order and the DALI call protocol.

    Subclasses set ``num_samples``, ``sample_shape`` (``None`` with per-sample shapes), ``dtype``, and
    implement ``_read(sample_id) -> tuple of windows``.
    """

    window_names: tuple[str, ...] = ("window",)
    share_dims: tuple[str, ...] = ()  # read once per group: see __init__'s share
    _reading = False  # a group reader (group_reader)

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
        self._status_dir: str | None = None  # set by partitioned_source: where workers say what they read
        self._memo: dict[str, Any] = {}
        # read once per group (dali_mesh.partition.share): the mesh dims whose ranks split the reads
        self.share_dims = share_dims(layout, share)
        if self.share_dims and self.per_sample_shapes:
            raise ValueError("share= needs one sample shape (the group window is cut the same way for every "
                             "sample): per-sample shapes are read by each rank")
        self._reading = False  # a group reader (group_reader): group windows of this member's batches

    # ---- output buffers -----------------------------------------------------------------------------
    def _empty(self, shape, dtype) -> np.ndarray:
        """An output array, recycled from earlier calls when nobody holds it any more.

        Fresh large arrays cost a page fault per page (glibc hands 16 MiB blocks back to the kernel
        when they are freed); DALI's worker copies each batch into shared memory and drops it, so a
        window returned two batches ago is free again. An array is reused only when its reference
        count shows that the pool alone holds it (a caller's reference, a view or a memoryview of it
        keeps it out), so no one ever sees their array overwritten. At most ``batch_size + 2``
        arrays are kept per process.
        """
        if not self.reuse_buffers:
            return np.empty(shape, dtype)
        pool = self._memo.setdefault("buffers", [])
        shape, dtype = tuple(shape), np.dtype(dtype)
        for buf in pool:
            # held by: the pool list, this loop variable and getrefcount's argument
            if sys.getrefcount(buf) <= 3 and buf.shape == shape and buf.dtype == dtype:
                return buf
        buf = np.empty(shape, dtype)
        if len(pool) >= self.batch_size + 2:
            pool.pop(0)
        pool.append(buf)
        return buf

    # ---- read once per group --------------------------------------------------------------------------
    @property
    def group(self) -> tuple[int, int]:
        """``(size, index)`` of this rank's read group (``(1, 0)`` without ``share``)."""
        if not self.share_dims:
            return 1, 0
        members = group_coordinates(self.layout, self.share_dims)
        return len(members), members.index(tuple(self.layout.mesh.coordinate))

    def group_reader(self) -> "WindowSource":
        """What this rank's pipeline reads: the source itself, or with ``share`` a copy whose windows are
        the group window and whose epoch is this member's batches (batches ``index, index + size, ...``).
        ``MeshLoader`` cuts and exchanges the members' windows."""
        if not self.share_dims or self._reading:
            return self
        reader = copy.copy(self)
        reader._memo = {}
        reader._reading = True
        return reader

    # ---- pickling: caches and open handles stay behind ---------------------------------------------
    def __getstate__(self):
        state = self.__dict__.copy()
        state["_memo"] = {}
        return state

    # ---- what a checkpoint is valid for -------------------------------------------------------------
    def fingerprint(self) -> dict[str, Any]:
        """Plain data that decides which sample comes at ``(epoch, idx_in_epoch)``: a checkpoint taken
        with one fingerprint resumes at another position under another (see ``MeshLoader``)."""
        fp = {"class": type(self).__name__, "files": list(getattr(self, "files", [])),
              "num_samples": int(self.num_samples), "seed": self.seed, "shuffle": self.shuffle,
              "drop_last": self.drop_last, "batch_size": self.batch_size,
              "sample_shape": None if self.sample_shape is None else list(self.sample_shape),
              "dtype": str(np.dtype(self.dtype)), "layout": repr(self.layout),
              "channels": None if not getattr(self, "index_maps", None) else
              {int(a): m.tolist() for a, m in self.index_maps.items()}}
        for attr in ("name", "time_start"):
            if hasattr(self, attr):
                fp[attr] = getattr(self, attr)
        if self.share_dims:  # absent without share: old checkpoints still resume
            fp["share"] = list(self.share_dims)
        if getattr(self, "time_stride", 1) != 1:  # absent at 1: old checkpoints still resume
            fp["time_stride"] = self.time_stride
        forecast = getattr(self, "forecast", None)
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
        res = self.layout.order(self.num_samples, epoch, seed=self.seed, shuffle=self.shuffle,
                                batch_size=self.batch_size, drop_last=self.drop_last)
        if self._reading:  # this member's batches of the group's order
            res = GroupOrder(res, self.batch_size, *self.group)
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
        if self._reading:  # a group reader reads the group window
            return group_region(self.layout, tuple(shape), self.share_dims)
        return self.layout.region(tuple(shape))

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
        extra = 1 if getattr(self, "forecast", None) is not None else 0
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
        self._note(f"reading sample {sample_id} from {self._files_of(sample_id)}")
        out = self._read(sample_id) + (np.array(sample_id, np.int64), np.array(is_pad))
        self._note(f"idle (last read sample {sample_id} from {self._files_of(sample_id)})")
        return out

    def _files_of(self, sample_id: int) -> str:
        """The file(s) sample ``sample_id`` is read from, for status and error messages."""
        return "?"

    def _note(self, text: str) -> None:
        """Write what this worker process is doing to its status file (``<status dir>/<pid>``), so that
        a watchdog in the main process can name the file a dead or stuck worker was reading. One
        ``pwrite`` to ``/dev/shm``; nothing when no status folder was set."""
        if self._status_dir is None:
            return
        pid = os.getpid()
        memo = self._memo.get("status")
        if memo is None or memo[0] != pid:  # a forked worker must not write to its parent's file
            try:
                fd = os.open(os.path.join(self._status_dir, str(pid)), os.O_WRONLY | os.O_CREAT, 0o600)
            except OSError as e:  # diagnostics only: never fail a read for them
                log.debug("no worker status file in %s: %s", self._status_dir, e)
                self._status_dir = None
                return
            memo = self._memo["status"] = (pid, fd)
        data = text.encode("utf-8", "replace")[:_STATUS_BYTES - 1]
        os.pwrite(memo[1], data + b"\0" * (_STATUS_BYTES - len(data)), 0)

    def native_plans(self, merge_gap: int = DEFAULT_MERGE_GAP) -> tuple:
        """The native reader's plans of this rank's windows, one
        :class:`~dali_mesh.io.read_plan.PlanSet` per window output (:attr:`window_names`), or
        :class:`~dali_mesh.io.read_plan.NotNativeError` saying why this source is not read natively."""
        raise NotNativeError(f"{type(self).__name__} is not read natively (NumpySource, HDF5Source and "
                             "ZarrSource are, for uncompressed data)")

    def _read(self, sample_id: int) -> tuple[np.ndarray, ...]:  # pragma: no cover - abstract
        raise NotImplementedError


def _channel_maps(channels, channel_axis):
    if channels is None:
        return None
    if not _is_int(channel_axis):
        raise ValueError(f"channel_axis must be an integer, got {channel_axis!r}")
    values = [channels] if _is_int(channels) else channels
    try:
        values = list(np.asarray(values, dtype=object).reshape(-1))
    except (TypeError, ValueError):
        raise ValueError(f"channels must be a sequence of integers, got {channels!r}") from None
    bad = [v for v in values if not _is_int(v)]
    if bad:
        raise ValueError(f"channels must be integers, got {bad[0]!r} in {channels!r}")
    ch = np.asarray([int(v) for v in values], dtype=np.int64)
    if ch.size == 0:
        raise ValueError("channels is empty: give at least one channel index, or None for all")
    return {int(channel_axis): ch}


def check_sample_shape(shape, what: str = "sample_shape") -> tuple[int, ...]:
    """``shape`` as a tuple of ints: integers (numpy's too) > 0 only; ``8.5``, ``True`` or strings are
    refused (they would silently become 8 or 1)."""
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
        raise ValueError(f"{what} must be a sequence of positive integers, got {shape!r}")
    shape = tuple(shape)
    bad = [s for s in shape if not _is_int(s) or s <= 0]
    if bad or not shape:
        raise ValueError(f"{what} must be a non-empty sequence of positive integers, got {shape!r}"
                         + (f" ({bad[0]!r} is not one)" if bad else ""))
    return tuple(int(s) for s in shape)


def _file_list(files, who: str, kind: str) -> list[str]:
    if isinstance(files, (str, bytes, os.PathLike)):  # one path would otherwise be read as its letters
        raise TypeError(f"{who} takes a list of {kind}s, got one path {os.fspath(files)!r}: pass [path]")
    out = [os.fspath(f) for f in files]
    if not out:
        raise ValueError(f"{who} needs at least one {kind}")
    return out


def _normalise_maps(maps, shape, path):
    """``maps`` keyed by non-negative axes of a sample of ``shape`` (``channel_axis=-1`` is the last
    axis): the readers' plans look maps up by non-negative axis, so a negative key must be resolved
    once, where the sample's number of axes is known."""
    if not maps:
        return maps
    return normalise_index_maps(maps, len(shape), path)


# ---- one sample per .npy file ---------------------------------------------------------------------
class NumpySource(WindowSource):
    """One sample per ``.npy`` file; this rank's window of it.

    Args:
        files: the ``.npy`` paths; the sample id is the index in this list.
        layout: the ``Layout`` (its mesh coordinate decides the window and the sample group).
        batch_size: the pipeline's batch size (the sample order pads to whole batches).
        shuffle, seed, drop_last: the sample order (:func:`dali_mesh.sample_order`).
        channels, channel_axis: read only these indices of ``channel_axis`` (the sample shape then
            has ``len(channels)`` there; the layout applies to that shape).
        per_sample_shapes: allow files of different shapes (the region is computed per file);
            otherwise every file must match the first (shape and dtype), or an error names it.
        merge_gap, direct, method: passed to :func:`dali_mesh.io.read_npy_window`.
        check_files: read every header now (errors name the first bad file) instead of on first use.
        reuse_buffers: recycle output arrays that nobody holds any more (see ``_empty``).
        share: ``"group"`` (or a list of mesh dim names): read once per group; the ranks that read the
            same samples (every mesh dim that does not split the batch, or the dims named) split the
            batches, each reads its batches' group window and ``MeshLoader`` exchanges the members'
            windows over torch.distributed (:mod:`dali_mesh.torch.share`). The same for every source.
    """

    def __init__(self, files: Sequence[str | os.PathLike], layout: Layout, *, batch_size: int = 1,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False,
                 channels: Sequence[int] | None = None, channel_axis: int = 0,
                 per_sample_shapes: bool = False, merge_gap: int = DEFAULT_MERGE_GAP,
                 direct: bool = False, method: str = "auto", check_files: bool = False,
                 reuse_buffers: bool = True, share=None) -> None:
        super().__init__(layout, batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last,
                         per_sample_shapes=per_sample_shapes, reuse_buffers=reuse_buffers, share=share)
        self.files = _file_list(files, "NumpySource", "file")
        self.num_samples = len(self.files)
        self.index_maps = _channel_maps(channels, channel_axis)
        if not _is_int(merge_gap) or merge_gap < 0:
            raise ValueError(f"merge_gap must be an integer >= 0 (bytes), got {merge_gap!r}")
        self.merge_gap = int(merge_gap)
        self.direct = bool(direct)
        if method not in ("auto", "preadv", "mmap"):
            raise ValueError(f"method must be 'auto', 'preadv' or 'mmap', got {method!r}")
        self.method = method
        first = read_npy_header(self.files[0])
        check_frame(first.shape, self.files[0])
        self.index_maps = _normalise_maps(self.index_maps, first.shape, self.files[0])
        shape = apply_index_maps(first.shape, self.index_maps, self.files[0])
        self.sample_ndim = len(shape)
        self.dtype = first.native_dtype
        self.sample_shape = None if per_sample_shapes else shape
        if self.sample_shape is not None:
            self.region  # fail now if the layout does not fit the data
        self._check_batches()
        if check_files:
            for f in self.files[1:]:
                h = read_npy_header(f)
                check_frame(h.shape, f)
                s = apply_index_maps(h.shape, self.index_maps, f)
                if h.native_dtype != self.dtype or (not per_sample_shapes and s != shape):
                    raise ShapeMismatchError(
                        f, f"shape {s} {h.native_dtype} differs from the first file's ({self.files[0]}) "
                        f"{shape} {self.dtype}; make every file the same, or pass per_sample_shapes=True")

    def _read(self, sample_id: int) -> tuple[np.ndarray, ...]:
        path = self.files[sample_id]
        if self.sample_shape is None:
            h = read_npy_header(path)
            check_frame(h.shape, path)
            region = self.region_of(apply_index_maps(h.shape, self.index_maps, path))
            expected = None
        else:
            region, expected = self.region, self.sample_shape
        out = read_npy_window(path, region, self._empty(region.window_shape, self.dtype),
                              prefix=(), index_maps=self.index_maps,
                              merge_gap=self.merge_gap, direct=self.direct, method=self.method,
                              expected_shape=expected, expected_dtype=self.dtype)
        return (out,)

    def _files_of(self, sample_id: int) -> str:
        return self.files[sample_id]

    def native_plans(self, merge_gap: int = DEFAULT_MERGE_GAP) -> tuple:
        if self.direct:
            raise NotNativeError("NumpySource(direct=True) asks for O_DIRECT, which the native reader does not do")
        return (plan_npy_files(self.files, region_of=self.region_of, index_maps=self.index_maps,
                               sample_shape=self.sample_shape, dtype=self.dtype, sample_ndim=self.sample_ndim,
                               merge_gap=merge_gap),)


def pipeline_reader(source):
    """What a pipeline reads for ``source``: its group reader when it is built with ``share=``
    (:meth:`WindowSource.group_reader`), else ``source`` itself, whatever it is (a wrapper that forwards
    its attributes keeps its own reads)."""
    return source.group_reader() if getattr(source, "share_dims", ()) else source


# ---- samples along axis 0 of arrays in several files ------------------------------------------------
class _TimeSeriesSource(WindowSource):
    """Samples along axis 0 (time) of one array per file; time runs across the files in order."""

    _kind = "file"

    def __init__(self, files, name, layout, *, batch_size=1, shuffle=True, seed=0, drop_last=False,
                 forecast: ForecastSpec | None = None, channels=None, channel_axis=0,
                 time_range: tuple[int, int] | None = None, time_stride: int = 1, per_sample_shapes=False,
                 reuse_buffers=True, share=None) -> None:
        super().__init__(layout, batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last,
                         per_sample_shapes=per_sample_shapes, reuse_buffers=reuse_buffers, share=share)
        self.files = _file_list(files, type(self).__name__, self._kind)
        self.name = name
        self.forecast = forecast
        self.index_maps = _channel_maps(channels, channel_axis)
        if forecast is not None and not isinstance(forecast, ForecastSpec):
            raise TypeError(f"forecast must be a ForecastSpec, got {type(forecast).__name__}")
        self.window_names = ("input", "target") if forecast is not None and forecast.lead else (
            ("input",) if forecast is not None else ("window",))
        lengths, shapes = [], []
        dtype0 = None
        for f in self.files:  # metadata only; handles are closed again (workers open their own)
            length, frame, dtype = self._meta(f)
            check_frame(frame, f)
            if dtype0 is None:
                self.index_maps = _normalise_maps(self.index_maps, frame, f)
            frame = apply_index_maps(frame, self.index_maps, f)
            if dtype0 is None:
                dtype0, frame0 = dtype, frame
            elif dtype != dtype0 or (frame != frame0 and not per_sample_shapes):
                raise ShapeMismatchError(
                    f, f"{self._what()} has steps of shape {frame} {dtype}, the first {self._kind} "
                    f"({self.files[0]}) {frame0} {dtype0}; make them the same, or pass per_sample_shapes=True")
            lengths.append(length)
            shapes.append(frame)
        self.dtype = dtype0
        self.sample_ndim = len(frame0)
        self.sample_shape = None if per_sample_shapes else frame0
        self._frame_shapes = shapes
        self._offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
        total = int(self._offsets[-1])
        if time_range is None:
            start, stop = 0, total
        else:
            try:
                start, stop = time_range
            except (TypeError, ValueError):
                raise ValueError(f"time_range must be (start, stop), got {time_range!r}") from None
            if not (_is_int(start) and _is_int(stop)):
                raise ValueError(f"time_range must be two integers (start, stop), got {time_range!r}")
            start, stop = int(start), int(stop)
        if not 0 <= start <= stop or stop > total:
            raise DataFileError(
                self.files[-1], f"time range {start}:{stop} runs past the data: the {self._kind}s hold "
                f"{total} steps ({', '.join(f'{os.path.basename(f)}: {n}' for f, n in zip(self.files, lengths))})")
        if not _is_int(time_stride) or time_stride < 1:
            raise ValueError(f"time_stride must be an integer >= 1, got {time_stride!r}")
        self.time_stride = int(time_stride)
        k = forecast.history * forecast.stride if forecast else 0
        span = forecast.span if forecast else 0
        self.time_start = start + k  # step t of sample id 0; sample i is step time_start + i * time_stride
        free = stop - start - span  # the steps a sample may start at
        self.num_samples = (free - 1) // self.time_stride + 1 if free > 0 else 0
        if self.num_samples <= 0:
            what = "" if forecast is None else \
                f" (history {forecast.history}, lead {forecast.lead}, stride {forecast.stride})"
            raise DataFileError(
                self.files[-1], f"a sample spans {span + 1} consecutive steps{what} "
                f"but the time range {start}:{stop} holds {stop - start}: the time window runs past the data")
        if self.sample_shape is not None:
            self.region
        self._check_batches()

    def _what(self) -> str:
        return f"{self._kind_name()} {self.name!r}"

    def native_plans(self, merge_gap: int = DEFAULT_MERGE_GAP) -> tuple:
        fc = self.forecast

        def steps_of(plans_of, ranges, budget):
            return {fi: self._plan_steps(fi, steps, plans_of=plans_of, budget=budget, merge_gap=merge_gap)
                    for fi, steps in sorted(ranges.items())}

        return plan_time_series(self.files[0], num_samples=self.num_samples, time_start=self.time_start,
                                file_offsets=self._offsets, sample_ndim=self.sample_ndim,
                                history=None if fc is None else fc.history, lead=0 if fc is None else fc.lead,
                                stride=1 if fc is None else fc.stride, sample_stride=self.time_stride,
                                per_sample_shapes=self.sample_shape is None, steps_of=steps_of)

    def _file_region(self, fi: int) -> Region:
        """The window of a step of file ``fi``."""
        return self.region if self.sample_shape is not None else self.region_of(self._frame_shapes[fi])

    def _kind_name(self) -> str:
        return "dataset"

    def step_of(self, sample_id: int) -> int:
        """The global step ``t`` of a sample id."""
        return self.time_start + int(sample_id) * self.time_stride

    def _files_of(self, sample_id: int) -> str:
        t = self.step_of(sample_id)
        fc = self.forecast
        k, m = (fc.history * fc.stride, fc.lead * fc.stride) if fc else (0, 0)
        first, last = self.locate(t - k), self.locate(t + m)
        if first[0] == last[0]:
            return f"{self.files[first[0]]} steps {first[1]}..{last[1]}"
        return f"{self.files[first[0]]} step {first[1]} .. {self.files[last[0]]} step {last[1]}"

    def locate(self, step: int) -> tuple[int, int]:
        """``(file index, index in that file)`` of a global step."""
        fi = int(np.searchsorted(self._offsets, step, side="right") - 1)
        return fi, int(step - self._offsets[fi])

    #: open files kept per process (least recently used closed first): a data set of thousands of
    #: year or step files must not need thousands of descriptors (RLIMIT_NOFILE is often 1024)
    max_open_files = 16

    def _handle(self, fi: int):
        handles = self._memo.get("handles")
        if handles is None:
            handles = self._memo["handles"] = collections.OrderedDict()
        h = handles.get(fi)
        if h is not None:
            handles.move_to_end(fi)
            return h
        while len(handles) >= max(1, int(self.max_open_files)):
            self._close(handles.popitem(last=False)[1])
        h = handles[fi] = self._open(self.files[fi])
        return h

    def _close(self, handle) -> None:
        """Close a handle of :meth:`_open` (nothing to close by default)."""

    def _read_step(self, step: int, region: Region, out: np.ndarray, shape) -> None:
        fi, local = self.locate(step)
        self._read_into(self._handle(fi), region, out, local, shape)

    def _read(self, sample_id: int) -> tuple[np.ndarray, ...]:
        t = self.step_of(sample_id)
        if self.sample_shape is None:
            shape = self._frame_shapes[self.locate(t)[0]]
            region = self.region_of(shape)
        else:
            shape, region = self.sample_shape, self.region
        if self.forecast is None:
            out = self._empty(region.window_shape, self.dtype)
            self._read_step(t, region, out, shape)
            return (out,)
        fc = self.forecast
        inp = self._empty((fc.history + 1,) + region.window_shape, self.dtype)
        for j, d in enumerate(fc.input_offsets()):
            self._read_step(t + d, region, inp[j], shape)
        if not fc.lead:
            return (inp,)
        tgt = self._empty((fc.lead,) + region.window_shape, self.dtype)
        for j, d in enumerate(fc.target_offsets()):
            self._read_step(t + d, region, tgt[j], shape)
        return inp, tgt


class HDF5Source(_TimeSeriesSource):
    """Samples along axis 0 of dataset ``dataset`` in each HDF5 file (one file per year, say).

    Every step is one hyperslab read per box of this rank's window (``read_direct``). Arguments as
    :class:`NumpySource`, plus ``forecast`` (:class:`ForecastSpec`), ``time_range`` (global steps
    ``start:stop`` to draw samples from), ``time_stride`` (a sample at every ``time_stride``-th step
    of it: 6-hourly samples from hourly data is ``time_stride=6``) and ``h5_kwargs`` (for ``h5py.File``, e.g. ``rdcc_nbytes``;
    and ``random_access=True``: see :func:`dali_mesh.io.hdf5.open_hdf5_dataset`).
    ``allow_external=True`` lets datasets with external raw storage, external links or virtual
    datasets be read (refused by default: they can deliver files the user never named).
    """

    _kind = "file"

    def __init__(self, files, dataset: str, layout: Layout, *, h5_kwargs: dict | None = None,
                 allow_external: bool = False, **kw) -> None:
        self.h5_kwargs = dict(h5_kwargs or {})
        if not isinstance(allow_external, (bool, np.bool_)):
            raise TypeError(f"allow_external must be True or False, got {allow_external!r}")
        # external raw storage, external links and virtual datasets can make a dataset deliver the
        # bytes of files the user never named: refused by the reader unless asked for
        self.h5_kwargs.setdefault("allow_external", bool(allow_external))
        super().__init__(files, dataset, layout, **kw)

    def _meta(self, path):
        from dali_mesh.io.hdf5 import hdf5_sample_info, open_hdf5_dataset

        f, ds = open_hdf5_dataset(path, self.name, **self.h5_kwargs)
        try:
            if ds.ndim < 2:
                raise DataFileError(path, f"dataset {self.name!r} has shape {ds.shape}: need (step, ...) with at least 2 axes")
            frame, dtype, length = hdf5_sample_info(ds, 1)
            return length, frame, dtype
        finally:
            f.close()

    def _open(self, path):
        from dali_mesh.io.hdf5 import open_hdf5_dataset

        return open_hdf5_dataset(path, self.name, **self.h5_kwargs) + (path,)

    def _close(self, handle) -> None:
        handle[0].close()

    def _plan_steps(self, fi: int, steps, **kw):
        from dali_mesh.io.hdf5 import plan_hdf5_steps

        return plan_hdf5_steps(self.files[fi], self.name, steps, self._file_region(fi), index_maps=self.index_maps,
                               h5_kwargs=self.h5_kwargs, **kw)

    def _read_into(self, handle, region, out, local, shape) -> None:
        from dali_mesh.io.hdf5 import read_hdf5_window

        read_hdf5_window(handle[1], region, out, prefix=(local,), index_maps=self.index_maps,
                         expected_shape=shape, expected_dtype=self.dtype, path=handle[2])


class ZarrSource(_TimeSeriesSource):
    """Samples along axis 0 of array ``array`` in each Zarr store (v2 or v3; ``None``: the store is the
    array). Region reads fetch only the chunks this rank's window touches. Arguments as
    :class:`HDF5Source`."""

    _kind = "store"

    def __init__(self, stores, array: str | None, layout: Layout, **kw) -> None:
        super().__init__(stores, array, layout, **kw)

    def _kind_name(self) -> str:
        return "array"

    def _meta(self, path):
        from dali_mesh.io.zarr import open_zarr_array

        arr = open_zarr_array(path, self.name)
        if arr.ndim < 2:
            raise DataFileError(path, f"array {self.name!r} has shape {arr.shape}: need (step, ...) with at least 2 axes")
        return arr.shape[0], tuple(arr.shape[1:]), native_dtype(arr.dtype)

    def _open(self, path):
        from dali_mesh.io.zarr import open_zarr_array

        return open_zarr_array(path, self.name)

    def _plan_steps(self, fi: int, steps, **kw):
        from dali_mesh.io.zarr import plan_zarr_steps

        return plan_zarr_steps(self.files[fi], self.name, steps, self._file_region(fi), index_maps=self.index_maps,
                               **kw)

    def _read_into(self, handle, region, out, local, shape) -> None:
        from dali_mesh.io.zarr import read_zarr_window

        read_zarr_window(handle, region, out, prefix=(local,), index_maps=self.index_maps,
                         expected_shape=shape, expected_dtype=self.dtype)
