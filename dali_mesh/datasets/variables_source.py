"""One source of a dataset's variables, whatever kind stores them: the channels of a sample picked
from the variables and levels of a :class:`~dali_mesh.datasets.variables.DatasetFormat` (a Zarr group,
NetCDF4 files), time selected by coordinate value and stride, each variable read by the array source
its format makes and stacked as ``(channel, *spatial)``.

:class:`~dali_mesh.ZarrDatasetSource` and :class:`~dali_mesh.NetCDFDatasetSource` are this source with
their kind (see :mod:`dali_mesh.weather` for the channels and layouts users give).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from dali_mesh._checks import is_int as _is_int
from dali_mesh.datasets.named_layout import NamedLayout
from dali_mesh.datasets.variables import DatasetFormat, dataset_format_named
from dali_mesh.io._common import DataFileError
from dali_mesh.partition import Layout, LayoutError
from dali_mesh.source import ForecastSpec, WindowSource

__all__ = ["Channel", "LEVEL_DIMS", "VariablesSource"]

#: names of the level dim, tried in order when ``level_dim`` is not given
LEVEL_DIMS = ("level", "pressure_level", "isobaricInhPa", "plev", "lev")


@dataclass(frozen=True)
class Channel:
    """One output channel: the variable and, for a variable with a level dim, the level's index and value."""

    variable: str
    level_index: int | None = None
    level: Any = None

    def __str__(self) -> str:
        return self.variable if self.level_index is None else f"{self.variable}@{self.level}"


class VariablesSource(WindowSource):
    """Channels from the variables (and levels) of a dataset, one sample per time step: what the
    dataset holds and how each variable is read is its format's (``format``); the channels, levels,
    time selection, forecast and statistics are this source's, the same for every format.

    Args:
        store: the dataset's location(s), as its format takes them (a Zarr group's folder; a NetCDF4
            file or a list of files).
        channels: the output channels, in order (see the module's docstring).
        layout: a ``Layout`` over ``(channel, *spatial)`` (the channel axis unsplit, no halo on it), or
            a :class:`NamedLayout`.
        time: ``(start, stop)`` by the time coordinate's values, both ends included (as
            ``xarray``'s ``sel(time=slice(start, stop))``): strings or ``datetime64``; ``None``: all.
        time_stride: a sample at every ``time_stride``-th step of the selection; or ``step`` (a
            ``timedelta64`` or a string such as ``"6h"``), a whole multiple of the coordinate's
            (regular) spacing.
        forecast: a :class:`~dali_mesh.ForecastSpec`; its steps are in samples: ``history=1`` with
            ``step="6h"`` is the input at ``t - 6h``.
        dtype: the output dtype (default: numpy's result type of the picked variables).
        mean, std: per-channel statistics (``C`` values, or PhysicsNeMo's ``(1, C, 1, 1)``; or the
            path of a ``.npy`` file of them, e.g. ``global_means.npy`` / ``global_stds.npy``):
            windows become ``(x - mean) / std`` (halo cells too), in the output dtype.
        time_dim, level_dim: the dims' names (default ``"time"``; the level dim: the first of
            ``LEVEL_DIMS`` a picked variable has).
        levels_by: ``"value"`` (the level coordinate's values) or ``"index"``.
        batch_size, shuffle, seed, drop_last, share: as the other sources.
        storage_options: for ``s3://``, ``gs://`` and ``https://`` stores (see :class:`NumpySource`).
        format: the kind of dataset: a :class:`~dali_mesh.datasets.variables.DatasetFormat` subclass
            or its registered name (``"zarr_group"``, ``"netcdf_files"``); default: the class's
            ``dataset_format`` (``ZarrDatasetSource``: a Zarr group).

    ``sample_id`` ``i`` is the time step ``time_index(i)``; ``time_of(i)`` its ``datetime64``.
    """

    fingerprint_fields = ("time_start",)
    #: the kind of dataset a subclass reads (``format=`` otherwise)
    dataset_format: type[DatasetFormat] | None = None

    def __init__(self, store, channels: Sequence, layout, *, time=None, time_stride: int = 1,
                 step=None, forecast: ForecastSpec | None = None, dtype=None, mean=None, std=None,
                 time_dim: str = "time", level_dim: str | None = None, levels_by: str = "value",
                 batch_size: int = 1, shuffle: bool = True, seed: int = 0, drop_last: bool = False,
                 share=None, storage_options: dict | None = None, format=None) -> None:
        if format is not None and self.dataset_format is not None and dataset_format_named(format) is not \
                self.dataset_format:
            raise ValueError(f"{type(self).__name__} reads {self.dataset_format.name} datasets, not {format!r}: "
                             "give the format to VariablesSource")
        kind = dataset_format_named(format if format is not None else self.dataset_format)
        self._use_storage_options(storage_options)  # checked and kept (no files yet)
        # the format resolves the store (or files) once, with these options, before it reads them
        self.dataset = kind(store, self.storage_options, time_dim)
        self.store, self.files = self.dataset.store, self.dataset.files
        variables = self.dataset.variables
        if levels_by not in ("value", "index"):
            raise ValueError(f"levels_by must be 'value' or 'index', got {levels_by!r}")
        if forecast is not None and not isinstance(forecast, ForecastSpec):
            raise TypeError(f"forecast must be a ForecastSpec, got {type(forecast).__name__}")
        if isinstance(channels, (str, bytes)) or not isinstance(channels, Sequence) or not channels:
            raise ValueError(f"channels must be a non-empty list of variables or (variable, level) picks, got {channels!r}")
        self.time_dim = time_dim
        picks = [self._pick(c, variables, level_dim, levels_by) for c in channels]
        self.channels = tuple(ch for _, chans, _ in picks for ch in chans)
        # the spatial dims: every picked variable's dims after time (and level), the same names and sizes
        first_var = picks[0][0]
        spatial = self._spatial(variables[first_var], picks[0][2])
        for var, _, lev in picks[1:]:
            other = self._spatial(variables[var], lev)
            if other != spatial:
                raise DataFileError(self.store, f"variable {var!r} has spatial dims {_dims_str(other)}, "
                                    f"variable {first_var!r} {_dims_str(spatial)}: every channel needs the same grid")
        self.spatial_dims = tuple(d for d, _ in spatial)
        self.dims = ("channel",) + self.spatial_dims
        # the time coordinate: the same length as every picked variable's time dim
        if time_dim not in variables:
            raise DataFileError(self.store, f"no time coordinate {time_dim!r} (the group has {sorted(variables)})")
        # the dataset in time order (the files of a NetCDF dataset) with its time coordinate
        self.dataset, times = self.dataset.in_time_order()
        self.store, self.files = self.dataset.store, self.dataset.files
        for var, _, _ in picks:
            n = variables[var].shape[0]
            if n != len(times):
                raise DataFileError(self.store, f"variable {var!r} has {n} steps along {time_dim!r}, the time "
                                    f"coordinate {len(times)}: not the same time axis")
        self._check_increasing(times)
        self.times = times
        start, stop = self._time_range(times, time)
        stride = self._stride(times, start, stop, time_stride, step)
        if forecast is not None or stride > 1:
            self._check_regular(times, start, stop, "a forecast" if forecast is not None else f"a stride of {stride}")
        if isinstance(layout, NamedLayout):
            layout = layout.resolve(self.dims)
        if not isinstance(layout, Layout):
            raise TypeError(f"layout must be a dali_mesh.Layout or NamedLayout, got {type(layout).__name__}")
        super().__init__(layout, batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last, share=share)
        self.forecast = forecast
        self.window_names = ("input", "target") if forecast is not None and forecast.lead else (
            ("input",) if forecast is not None else ("window",))
        dtypes = [variables[v].dtype for v, _, _ in picks]
        self.dtype = np.dtype(dtype) if dtype is not None else np.result_type(*dtypes)
        # one array source (the format's) per run of channels from one variable, in output order
        fc = None if forecast is None else ForecastSpec(forecast.history, forecast.lead, forecast.stride * stride)
        ndim = 1 + len(self.spatial_dims)
        self._flat_layout = None
        self._parts: list[tuple[WindowSource, bool]] = []  # (source, has a channel axis), reading its own windows
        for var, chans, lev in _runs(picks):
            has_level = lev is not None
            if has_level:
                sub_layout = layout
            else:
                if self._flat_layout is None:
                    self._flat_layout = layout.without_axis(0, ndim)
                sub_layout = self._flat_layout
            sub = self.dataset.array_source(var, sub_layout, batch_size=batch_size, shuffle=shuffle, seed=seed,
                                            drop_last=drop_last, forecast=fc, time_range=(start, stop),
                                            time_stride=stride, channels=[c.level_index for c in chans] if has_level
                                            else None, channel_axis=0, share=share)
            self._parts.append((sub, has_level))
        self.num_samples = self._parts[0][0].num_samples
        self.time_start, self.time_stride = self._parts[0][0].time_start, stride
        self.sample_shape = (len(self.channels),) + tuple(s for _, s in spatial)
        self.sample_ndim = len(self.sample_shape)
        self.mean, self.std = self._stats(mean, "mean"), self._stats(std, "std")
        if (self.mean is None) != (self.std is None):
            raise ValueError("give both mean and std, or neither")
        if self.std is not None:
            for what, bad in (("mean", ~np.isfinite(self.mean)), ("std", ~np.isfinite(self.std) | (self.std == 0))):
                if bad.any():
                    values = getattr(self, what)
                    raise ValueError(f"{self.store}: {what} is {[float(values[i]) for i in np.flatnonzero(bad)]} for "
                                     f"channels {[str(self.channels[i]) for i in np.flatnonzero(bad)]}: every mean "
                                     "must be finite, every std finite and not 0")
        if layout.region(self.sample_shape).window_shape[0] != len(self.channels):
            raise LayoutError("the layout splits, crops or pads the channel axis (axis 0): split the spatial dims")
        self.region
        self._check_batches()

    # ---- set-up ------------------------------------------------------------------------------------
    def _level_dim(self, var, level_dim):
        dims = var.dims
        if level_dim is not None:
            return level_dim if level_dim in dims else None
        return next((d for d in LEVEL_DIMS if d in dims), None)

    def _pick(self, spec, variables, level_dim, levels_by):
        """``(variable, [Channel...], level dim or None)`` of one channel spec."""
        if isinstance(spec, str):
            name, levels = spec, None
        elif isinstance(spec, (tuple, list)) and len(spec) == 2 and isinstance(spec[0], str):
            name, levels = spec
        else:
            raise ValueError(f"channel {spec!r}: give a variable name or (variable, level(s))")
        coords = {n for n, v in variables.items() if len(v.dims) == 1 and v.dims[0] == n}
        if name not in variables or name in coords:
            data_vars = sorted(n for n in variables if n not in coords)
            raise DataFileError(self.store, f"no variable {name!r}; the dataset has {data_vars}")
        var = variables[name]
        decoding = var.cf_decoding()
        if decoding:
            raise DataFileError(self.store, f"variable {name!r}: {decoding}, while the reader returns the stored "
                                "values; store it decoded (e.g. xarray's to_zarr after decoding) or pick others")
        if not var.dims or var.dims[0] != self.time_dim:
            raise DataFileError(self.store, f"variable {name!r} has dims {var.dims}: the first must be "
                                f"{self.time_dim!r} (one sample per time step)")
        lev = self._level_dim(var, level_dim)
        if lev is None:
            if levels is not None:
                raise DataFileError(self.store, f"variable {name!r} has no level dim (dims {var.dims}); "
                                    f"give it without a level")
            return name, [Channel(name)], None
        if var.dims[1] != lev:
            raise DataFileError(self.store, f"variable {name!r} has dims {var.dims}: the level dim {lev!r} must "
                                "follow the time dim")
        n = var.shape[1]
        values = self.dataset.coordinate(lev) if lev in variables else np.arange(n)
        if len(values) != n:
            raise DataFileError(self.store, f"level coordinate {lev!r} has {len(values)} values, variable "
                                f"{name!r} {n} levels")
        wanted = list(range(n)) if levels is None else (list(levels) if isinstance(levels, (list, tuple, np.ndarray))
                                                       else [levels])
        out = []
        for w in wanted:
            if levels_by == "index" or levels is None:
                if not _is_int(w) or not -n <= int(w) < n:
                    raise DataFileError(self.store, f"variable {name!r}: level index {w!r} is out of range for "
                                        f"{n} levels")
                i = int(w) % n
            else:
                hits = np.flatnonzero(values == w)
                if hits.size == 0:
                    raise DataFileError(self.store, f"variable {name!r} has no level {w!r}; its {lev!r} values are "
                                        f"{values.tolist()}")
                if hits.size > 1:
                    raise DataFileError(self.store, f"variable {name!r}: level {w!r} appears {hits.size} times in "
                                        f"{lev!r} (indexes {hits.tolist()}): pick by index (levels_by='index')")
                i = int(hits[0])
            out.append(Channel(name, i, values[i].item()))
        return name, out, lev

    def _spatial(self, var, lev) -> tuple[tuple[str, int], ...]:
        skip = 2 if lev is not None else 1
        return tuple(zip(var.dims[skip:], var.shape[skip:]))

    def _time_range(self, times, time) -> tuple[int, int]:
        if time is None:
            return 0, len(times)
        try:
            lo, hi = time
        except (TypeError, ValueError):
            raise ValueError(f"time must be (start, stop), got {time!r}") from None
        try:
            lo = None if lo is None else np.datetime64(lo, "ns")
            hi = None if hi is None else np.datetime64(hi, "ns")
        except ValueError as e:
            raise ValueError(f"time {time!r}: {e}") from None
        start = 0 if lo is None else int(np.searchsorted(times, lo, side="left"))
        stop = len(times) if hi is None else int(np.searchsorted(times, hi, side="right"))
        if start >= stop:
            raise DataFileError(self.store, f"time {time!r} selects no step: the data run from {times[0]} to "
                                f"{times[-1]}")
        return start, stop

    def _check_increasing(self, times) -> None:
        """The time coordinate must increase strictly: a repeated or earlier time would make samples
        (and a forecast's input and target) other steps than their times say."""
        bad = np.flatnonzero(np.diff(times) <= np.timedelta64(0, "ns"))
        if bad.size:
            i = int(bad[0])
            raise DataFileError(self.store, f"the time coordinate {self.time_dim!r} does not increase: step {i} is "
                                f"{times[i]}, step {i + 1} {times[i + 1]}{self.dataset.where_step(i + 1)} (a repeated, "
                                "out-of-order or overlapping time)")

    def _check_regular(self, times, start, stop, what: str) -> None:
        """With a forecast or a stride, the steps of the selection must be equally spaced: a missing
        step would pair an input with a target (or take samples) further apart than the step."""
        dt = np.diff(times[start:stop])
        bad = np.flatnonzero(dt != dt[0]) if dt.size else dt
        if bad.size:
            k = int(bad[0])
            i = start + k
            raise DataFileError(self.store, f"{what} needs equally spaced times, but steps {start} and {start + 1} are "
                                f"{_td(dt[0])} apart, steps {i} and {i + 1} ({times[i]}, {times[i + 1]}"
                                f"{self.dataset.where_step(i + 1)}) {_td(dt[k])}: a step is missing or repeated; select a "
                                "regular range with time=(start, stop)")

    def _stride(self, times, start, stop, time_stride, step) -> int:
        if step is None:
            if not _is_int(time_stride) or time_stride < 1:
                raise ValueError(f"time_stride must be an integer >= 1, got {time_stride!r}")
            return int(time_stride)
        if time_stride != 1:
            raise ValueError("give step or time_stride, not both")
        try:
            step = np.timedelta64(step) if not isinstance(step, str) else _parse_step(step)
        except ValueError as e:
            raise ValueError(f"step {step!r}: {e}") from None
        dt = np.diff(times[start:stop])
        if dt.size and np.any(dt != dt[0]):
            raise DataFileError(self.store, f"step {step}: the time coordinate is not regular between "
                                f"{times[start]} and {times[stop - 1]}; give time_stride")
        spacing = dt[0] if dt.size else step
        k = step / spacing
        if k < 1 or k != int(k):
            raise DataFileError(self.store, f"step {_td(step)} is not a whole multiple of the data's spacing "
                                f"{_td(spacing)}")
        return int(k)

    def _stats(self, value, what):
        if value is None:
            return None
        if isinstance(value, (str, os.PathLike)):  # a .npy file, e.g. PhysicsNeMo's global_means.npy (1, C, 1, 1)
            value = np.load(os.fspath(value), allow_pickle=False)
        a = np.asarray(value, dtype=np.float64).reshape(-1)
        if a.size != len(self.channels):
            raise ValueError(f"{what} has {a.size} values for {len(self.channels)} channels")
        return a

    # ---- the variables -------------------------------------------------------------------------------
    @property
    def parts(self) -> list[tuple[WindowSource, bool]]:
        """The variables' sources in output order, ``(source, has a channel axis)``, reading what this
        source reads (its :attr:`reads`: a group reader's variables read the group window)."""
        parts = self._memo.get("parts")
        if parts is None:
            parts = self._memo["parts"] = [(sub.with_reads(self.reads), has) for sub, has in self._parts]
        return parts

    # ---- what the source says ----------------------------------------------------------------------
    def time_index(self, sample_id: int) -> int:
        """The time step (index into the time coordinate) of a sample."""
        return self.time_start + int(sample_id) * self.time_stride

    def step_of(self, sample_id: int) -> int:
        return self.time_index(sample_id)

    def coordinate(self, name: str) -> np.ndarray:
        """The stored values of coordinate ``name`` (e.g. ``"latitude"``), as the store holds them."""
        if name not in self.dataset.variables:
            raise DataFileError(self.store, f"no coordinate {name!r}")
        return np.asarray(self.dataset.coordinate(name))

    def window_coordinate(self, dim: str) -> np.ndarray:
        """This rank's window along spatial dim ``dim``: the coordinate's value at each position, halo
        included (a periodic halo takes the far side's values, a reflected one the mirrored ones; NaN
        at ``constant`` cells). The layout splits the stored order, so with latitude stored north to
        south (90 .. -90, as WeatherBench2 and ERA5 do) rank 0 holds the north, stored south to north
        the south: these values say which (for cos zenith, say)."""
        if dim not in self.spatial_dims:
            raise ValueError(f"no spatial dim {dim!r}; the samples' dims are {self.dims}")
        idx = self.region.window_index(self.dims.index(dim))
        values = self.coordinate(dim)
        out = values[np.where(idx < 0, 0, idx)].astype(np.float64 if values.dtype.kind in "iuf" else values.dtype)
        if (idx < 0).any():
            out[idx < 0] = np.nan
        return out

    def time_of(self, sample_id) -> np.ndarray:
        """The ``datetime64[ns]`` of sample id(s): what models with time features (cos zenith, time
        of year) need."""
        ids = np.asarray(sample_id, dtype=np.int64)
        return self.times[self.time_start + ids * self.time_stride]

    def _files_of(self, sample_id: int) -> str:
        return f"{self.store} step {self.time_index(sample_id)} ({', '.join(map(str, self.channels))})"

    def fingerprint(self) -> dict[str, Any]:
        fp = super().fingerprint()  # files, time_start, time_stride and forecast as the time series give them
        fp["channels"] = [str(c) for c in self.channels]
        return fp

    def native_plans(self, merge_gap: int = 0) -> tuple:
        from dali_mesh.plan import NotNativeError

        raise NotNativeError("a dataset of several variables is read natively by read_dataset (one reader per "
                             "variable), not by read_windows")

    # ---- reading in Python ---------------------------------------------------------------------------
    def _read(self, sample_id: int) -> tuple[np.ndarray, ...]:
        pieces = [sub._read(sample_id) for sub, _ in self.parts]
        axis = 0 if self.forecast is None else 1
        out = []
        for w in range(len(self.window_names)):
            blocks = [p[w] if has_level else np.expand_dims(p[w], axis)
                      for p, (_, has_level) in zip(pieces, self.parts)]
            win = np.concatenate(blocks, axis=axis).astype(self.dtype, copy=False)
            out.append(self._normalize(win, axis))
        return tuple(out)

    def _normalize(self, win: np.ndarray, axis: int) -> np.ndarray:
        """``(x - mean) / std`` computed in float64 for float64 windows, else in float32 (the native
        reader's and strided_slice's arithmetic), then cast to the output dtype."""
        if self.mean is None:
            return win
        shape = [1] * win.ndim
        shape[axis] = len(self.channels)
        math = np.float64 if self.dtype == np.float64 else np.float32
        mean = self.mean.reshape(shape).astype(math)
        std = self.std.reshape(shape).astype(math)
        return ((win.astype(math, copy=False) - mean) / std).astype(self.dtype, copy=False)


def _runs(picks):
    """Consecutive channels of one variable, as one part: ``(variable, [Channel...], level dim)``."""
    out = []
    for var, chans, lev in picks:
        if out and out[-1][0] == var and lev is not None:
            out[-1][1].extend(chans)
        else:
            out.append((var, list(chans), lev))
    return out


def _td(delta) -> str:
    """A timedelta in the largest unit that holds it exactly ("6 hours")."""
    ns = int(np.timedelta64(delta, "ns").astype(np.int64))
    for unit, size in (("days", 86400 * 10 ** 9), ("hours", 3600 * 10 ** 9), ("minutes", 60 * 10 ** 9),
                       ("seconds", 10 ** 9)):
        if ns % size == 0:
            return f"{ns // size} {unit}"
    return f"{ns} nanoseconds"


def _dims_str(spatial) -> str:
    return "(" + ", ".join(f"{d}: {n}" for d, n in spatial) + ")"


def _parse_step(text: str) -> np.timedelta64:
    units = {"h": "h", "hour": "h", "hours": "h", "d": "D", "day": "D", "days": "D", "m": "m", "min": "m",
             "minutes": "m", "s": "s", "seconds": "s"}
    t = text.strip().lower()
    num = t.rstrip("abcdefghijklmnopqrstuvwxyz ")
    unit = t[len(num):].strip()
    if not num or unit not in units:
        raise ValueError("expected a number and a unit, e.g. '6h', '1d', '30min'")
    return np.timedelta64(int(num), units[unit])
