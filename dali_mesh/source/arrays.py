"""Sources of samples along axis 0 of arrays, one array per file or store, in any registered format."""
from __future__ import annotations

import collections
import os

import numpy as np

from dali_mesh._checks import is_int as _is_int
from dali_mesh.io._common import DataFileError, ShapeMismatchError, check_frame, sample_shape
from dali_mesh.plan.chunks import SeriesFiles, plan_time_series
from dali_mesh.formats import FORMATS, HDF5, ZARR, ArrayFormat, format_named
from dali_mesh.plan.ranges import DEFAULT_MERGE_GAP
from dali_mesh.partition import Layout, Region
from dali_mesh.source.arguments import (channel_maps, check_group_rows, file_list, normalise_maps, resolve_rows,
                                        with_rows)
from dali_mesh.source.base import WindowSource
from dali_mesh.plan.forecast_spec import ForecastSpec

__all__ = ["ArraySource", "HDF5Source", "ZarrSource", "array_source", "pipeline_reader"]


def pipeline_reader(source):
    """What a pipeline reads for ``source``: its group reader when it is built with ``share=``
    (:meth:`WindowSource.group_reader`), else ``source`` itself, whatever it is (a wrapper that forwards
    its attributes keeps its own reads)."""
    return source.group_reader() if getattr(source, "share_dims", ()) else source


class ArraySource(WindowSource):
    """Samples along axis 0 (time) of one array per file or store, in any registered format
    (:mod:`dali_mesh.formats`: ``"hdf5"``, ``"zarr"``, or a format object); time runs across the
    files in order. :class:`HDF5Source` and :class:`ZarrSource` are this source with their format.

    Args:
        files: the files (or stores), in time order.
        name: the array (an HDF5 dataset's path, a Zarr array's path in its store; ``None``: the
            format's default, e.g. the only array).
        layout, batch_size, shuffle, seed, drop_last, channels, channel_axis, per_sample_shapes,
            reuse_buffers, share, rows: as :class:`NumpySource` (``rows.axis`` counts the sample's axes,
            after the time axis).
        format: the format's name or object.
        format_options: options of the format's reads (HDF5: ``h5_kwargs``).
        forecast: a :class:`ForecastSpec`: input and target steps of each sample.
        time_range: global steps ``start:stop`` to draw samples from.
        time_stride: a sample at every ``time_stride``-th step (6-hourly samples from hourly data: 6).
    """

    fingerprint_fields = ("name", "time_start")

    def __init__(self, files, name, layout, *, format, format_options: dict | None = None, batch_size=1,
                 shuffle=True, seed=0, drop_last=False, forecast: ForecastSpec | None = None, channels=None,
                 channel_axis=0, time_range: tuple[int, int] | None = None, time_stride: int = 1,
                 per_sample_shapes=False, reuse_buffers=True, share=None, storage_options: dict | None = None,
                 rows=None) -> None:
        super().__init__(layout, batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last,
                         per_sample_shapes=per_sample_shapes, reuse_buffers=reuse_buffers, share=share)
        self.format = format_named(format) if isinstance(format, str) else format
        if not isinstance(self.format, ArrayFormat) or not self.format.steps:
            raise ValueError(f"format must name a format of samples along axis 0 ({', '.join(n for n, f in FORMATS.items() if f.steps)}), "
                             f"got {format!r}")
        self.format_options = dict(format_options or {})
        self._kind = self.format.container
        self.files = file_list(files, type(self).__name__, self._kind)
        self._use_storage_options(storage_options)
        self.name = name
        self.forecast = forecast
        self.index_maps = channel_maps(channels, channel_axis)
        self.rows, self.group_rows = resolve_rows(rows, layout, self.share_dims)
        if forecast is not None and not isinstance(forecast, ForecastSpec):
            raise TypeError(f"forecast must be a ForecastSpec, got {type(forecast).__name__}")
        self.window_names = ("input", "target") if forecast is not None and forecast.lead else (
            ("input",) if forecast is not None else ("window",))
        lengths, shapes = [], []
        dtype0 = None
        for f in self.files:  # metadata only; handles are closed again (workers open their own)
            length, frame, dtype = self.format.step_info(f, self.name, **self.format_options)
            check_frame(frame, f)
            if dtype0 is None:
                self.index_maps = normalise_maps(self.index_maps, frame, f)
                check_group_rows(self.index_maps, self.rows, self.group_rows, layout, frame, f)
                self.index_maps = with_rows(self.index_maps, self.rows, layout, frame, f)
            frame = sample_shape(f, frame, index_maps=self.index_maps)
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
        return f"{self.format.array_word} {self.name!r}"

    def native_plans(self, merge_gap: int = DEFAULT_MERGE_GAP) -> tuple:
        regions = [self._file_region(fi) for fi in range(len(self.files))]
        series = SeriesFiles(self.format, self.files, self.name, regions, self._offsets, self.format_options,
                             self.index_maps, merge_gap)
        return plan_time_series(series, dtype=self.dtype, sample_ndim=self.sample_ndim, num_samples=self.num_samples,
                                time_start=self.time_start, forecast=self.forecast, sample_stride=self.time_stride,
                                per_sample_shapes=self.sample_shape is None)

    def _file_region(self, fi: int) -> Region:
        """The window of a step of file ``fi``."""
        return self.region if self.sample_shape is not None else self.region_of(self._frame_shapes[fi])

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
        h = handles[fi] = self.format.open(self.files[fi], self.name, **self.format_options)
        return h

    def _close(self, handle) -> None:
        self.format.close(handle)

    def _read_step(self, step: int, region: Region, out: np.ndarray, shape) -> None:
        fi, local = self.locate(step)
        self.format.fill_window(self._handle(fi), region, out, prefix=(local,), index_maps=self.index_maps,
                                expected_shape=shape, expected_dtype=self.dtype)

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


class HDF5Source(ArraySource):
    """Samples along axis 0 of dataset ``dataset`` in each HDF5 file (one file per year, say).

    Every step is one hyperslab read per box of this rank's window (``read_direct``). Arguments as
    :class:`ArraySource`, plus ``h5_kwargs`` (for ``h5py.File``, e.g. ``rdcc_nbytes``; and
    ``random_access=True``: see :func:`dali_mesh.formats.hdf5.open_hdf5_dataset`).
    ``allow_external=True`` lets datasets with external raw storage, external links or virtual
    datasets be read (refused by default: they can deliver files the user never named).
    """

    def __init__(self, files, dataset: str, layout: Layout, *, h5_kwargs: dict | None = None,
                 allow_external: bool = False, **kw) -> None:
        h5_kwargs = dict(h5_kwargs or {})
        if not isinstance(allow_external, (bool, np.bool_)):
            raise TypeError(f"allow_external must be True or False, got {allow_external!r}")
        # external raw storage, external links and virtual datasets can make a dataset deliver the
        # bytes of files the user never named: refused by the reader unless asked for
        h5_kwargs.setdefault("allow_external", bool(allow_external))
        super().__init__(files, dataset, layout, format=HDF5, format_options={"h5_kwargs": h5_kwargs}, **kw)

    @property
    def h5_kwargs(self) -> dict:
        return self.format_options["h5_kwargs"]


class ZarrSource(ArraySource):
    """Samples along axis 0 of array ``array`` in each Zarr store (v2 or v3; ``None``: the store is the
    array). Region reads fetch only the chunks this rank's window touches. Arguments as
    :class:`ArraySource`."""

    def __init__(self, stores, array: str | None, layout: Layout, **kw) -> None:
        super().__init__(stores, array, layout, format=ZARR, **kw)


#: the named sources of the formats that have one (their class name goes into checkpoints)
_SOURCE_CLASSES = {HDF5.name: HDF5Source, ZARR.name: ZarrSource}


def array_source(files, name, layout, *, format, allow_external: bool = False, **kw) -> ArraySource:
    """The source of ``format`` over ``files``: :class:`HDF5Source` or :class:`ZarrSource` for those
    formats, an :class:`ArraySource` for any other registered one. ``allow_external`` is HDF5's."""
    fmt = format_named(format) if isinstance(format, str) else format
    cls = _SOURCE_CLASSES.get(fmt.name)
    if cls is HDF5Source:
        return HDF5Source(files, name, layout, allow_external=allow_external, **kw)
    if cls is not None:
        return cls(files, name, layout, **kw)
    return ArraySource(files, name, layout, format=fmt, **kw)
