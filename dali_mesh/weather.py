"""Weather datasets as users store them: the channels of a sample picked from the variables and pressure
levels of an xarray-written Zarr group (WeatherBench2 / ARCO-ERA5 layouts), time selected by
coordinate value and stride.

``ZarrDatasetSource(store, channels, layout)`` stacks the picked channels of one time step as
``(channel, *spatial)`` (e.g. ``(C, latitude, longitude)``). Each variable is read by its own
:class:`~dali_mesh.ZarrSource` (its own chunking, codec and dtype; only this rank's window, natively
where it can be) and the result is cast to one dtype. :func:`dali_mesh.pipeline.dataset_reader.read_dataset`
reads it in a pipeline (one native operator for every variable of one dtype, each chunk decoded into
its place in the stacked window; otherwise one reader per variable, concatenated on DALI's threads);
as a plain source (``partitioned_source``) its workers read every variable in Python.

Channels: ``"2m_temperature"`` (a variable without a level dim; with one: all its levels),
``("geopotential", 500)`` or ``("temperature", [500, 850])`` (levels by the level coordinate's values;
``levels_by="index"`` for positions). The layout splits the output ``(channel, *spatial)``: give a
:class:`~dali_mesh.Layout` with axis numbers, or :class:`NamedLayout` with dim names
(``shard={"model_parallel": "latitude"}``).
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from dali_mesh._checks import is_int as _is_int
from dali_mesh.io._common import DataFileError
from dali_mesh.io.cf_variables import (decode_cf_time, open_dataset_group, open_netcdf_variables, read_coordinate,
                                  read_netcdf_coordinate)
from dali_mesh.mesh import MeshInfo
from dali_mesh.partition import Layout, LayoutError
from dali_mesh.source import ForecastSpec, HDF5Source, WindowSource, ZarrSource
from dali_mesh.storage import local_path_of, resolve_locations, store_of

__all__ = ["ZarrDatasetSource", "NetCDFDatasetSource", "NamedLayout", "Channel"]

log = logging.getLogger(__name__)

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


@dataclass(frozen=True)
class NamedLayout:
    """A :class:`~dali_mesh.Layout` whose axes are dim names (``"latitude"``) or ``"channel"``; the
    source resolves them against its output dims. Arguments as ``Layout``'s, keyed by dim name."""

    mesh: MeshInfo
    shard: Mapping[str, str] | None = None
    batch: Any = None
    crop: Mapping[str, Any] | None = None
    halo: Any = 0
    boundary: Any = "constant"
    fill_value: float = 0
    split: Any = "chunk"

    def resolve(self, dims: Sequence[str]) -> Layout:
        dims = tuple(dims)

        def axis(name, what):
            if _is_int(name):
                return int(name)
            if name not in dims:
                raise LayoutError(f"{what}: no dim {name!r}; the samples' dims are {dims}")
            return dims.index(name)

        def keyed(value, what):
            return {axis(k, what): v for k, v in value.items()} if isinstance(value, Mapping) else value

        crop = None
        if self.crop is not None:
            crop = [None] * len(dims)
            for k, v in self.crop.items():
                crop[axis(k, "crop")] = v
        return Layout(self.mesh, shard={m: axis(a, "shard") for m, a in (self.shard or {}).items()}, batch=self.batch,
                      crop=crop, halo=keyed(self.halo, "halo"), boundary=keyed(self.boundary, "boundary"),
                      fill_value=self.fill_value, split=self.split)


class _DatasetSource(WindowSource):
    """Channels from the variables (and levels) of a dataset, one sample per time step (see
    :class:`ZarrDatasetSource` and :class:`NetCDFDatasetSource` for the formats).

    Args:
        store: the dataset (see the format's class).
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

    ``sample_id`` ``i`` is the time step ``time_index(i)``; ``time_of(i)`` its ``datetime64``.
    """

    fingerprint_fields = ("time_start",)

    def __init__(self, store, channels: Sequence, layout, *, time=None, time_stride: int = 1,
                 step=None, forecast: ForecastSpec | None = None, dtype=None, mean=None, std=None,
                 time_dim: str = "time", level_dim: str | None = None, levels_by: str = "value",
                 batch_size: int = 1, shuffle: bool = True, seed: int = 0, drop_last: bool = False,
                 share=None, storage_options: dict | None = None) -> None:
        self._use_storage_options(storage_options)  # checked and kept (no files yet)
        # the store (or files) resolved once, with these options, before anything is read from them
        many = not isinstance(store, (str, bytes, os.PathLike))
        resolved = resolve_locations(list(store) if many else [store], self.storage_options)
        self._set_store(resolved if many else resolved[0])
        variables = self._variables()
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
        times = self._times(variables)
        for var, _, _ in picks:
            n = self._steps(variables, var)
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
        # one ZarrSource per run of channels from one variable, in output order
        fc = None if forecast is None else ForecastSpec(forecast.history, forecast.lead, forecast.stride * stride)
        ndim = 1 + len(self.spatial_dims)
        self._flat_layout = None
        self._parts: list[tuple[ZarrSource, bool]] = []  # (source, has a channel axis), reading its own windows
        for var, chans, lev in _runs(picks):
            has_level = lev is not None
            if has_level:
                sub_layout = layout
            else:
                if self._flat_layout is None:
                    self._flat_layout = layout.without_axis(0, ndim)
                sub_layout = self._flat_layout
            sub = self._sub_source(var, sub_layout, batch_size=batch_size, shuffle=shuffle, seed=seed,
                                   drop_last=drop_last, forecast=fc, time_range=(start, stop), time_stride=stride,
                                   channels=[c.level_index for c in chans] if has_level else None, channel_axis=0,
                                   share=share)
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
        values = self._coordinate(lev) if lev in variables else np.arange(n)
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
                                f"{times[i]}, step {i + 1} {times[i + 1]}{self._where_step(i + 1)} (a repeated, "
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
                                f"{self._where_step(i + 1)}) {_td(dt[k])}: a step is missing or repeated; select a "
                                "regular range with time=(start, stop)")

    def _where_step(self, i: int) -> str:
        """Where time step ``i`` is stored, for messages (a file of several)."""
        return ""

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

    # ---- the format ----------------------------------------------------------------------------------
    def _set_store(self, store) -> None:
        self.store = os.fspath(store)
        self.files = [self.store]

    def _times(self, variables) -> np.ndarray:
        return decode_cf_time(self._coordinate(self.time_dim), variables[self.time_dim].attrs,
                              f"{self.store}: {self.time_dim!r}")

    def _steps(self, variables, var) -> int:
        return variables[var].shape[0]

    def _variables(self):  # pragma: no cover - per format
        raise NotImplementedError

    def _coordinate(self, name):  # pragma: no cover - per format
        raise NotImplementedError

    def _sub_source(self, var, layout, **kw):  # pragma: no cover - per format
        raise NotImplementedError

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
        if name not in self._variables():
            raise DataFileError(self.store, f"no coordinate {name!r}")
        return np.asarray(self._coordinate(name))

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


class ZarrDatasetSource(_DatasetSource):
    """Channels from the variables (and levels) of an xarray-written Zarr group (v2 or v3, as
    ``xarray.Dataset.to_zarr`` writes it: WeatherBench2, ARCO-ERA5), one sample per time step.
    Arguments: see :class:`_DatasetSource`; ``store`` is the group's folder."""

    def _variables(self):
        return open_dataset_group(self.store)

    def _coordinate(self, name):
        return read_coordinate(self.store, name)

    def _sub_source(self, var, layout, **kw):
        return ZarrSource([self.store], var, layout, **kw)


class NetCDFDatasetSource(_DatasetSource):
    """Channels from the variables of NetCDF4 files (HDF5 underneath, as the netCDF library, h5netcdf
    and xarray's ``to_netcdf`` write them), one sample per time step; ``store`` is one file or a
    list of files that continue each other in time (one per year or month, the same variables and
    grid), the time coordinate concatenated. NetCDF3 files are refused naming the format.
    Arguments: see :class:`_DatasetSource`."""

    def _set_store(self, store) -> None:
        files = [os.fspath(store)] if isinstance(store, (str, bytes, os.PathLike)) else [os.fspath(f) for f in store]
        if not files:
            raise ValueError("NetCDFDatasetSource needs at least one file")
        seen = {}
        for f in files:
            if local_path_of(f) is None:  # an object: its location names it
                key = f
            else:
                try:
                    st = os.stat(f)
                except OSError as e:
                    raise DataFileError(f, f"cannot be read ({e.strerror})") from None
                key = (st.st_dev, st.st_ino)
            if key in seen:
                raise DataFileError(f, f"is given twice (as {seen[key]!r} and {f!r}): each file once, please")
            seen[key] = f
        self.files = files
        self.store = files[0]
        self._per_file = [open_netcdf_variables(f) for f in files]
        first = {n: (v.dims, v.shape[1:] if v.dims and v.dims[0] == "time" else v.shape, v.dtype)
                 for n, v in self._per_file[0].items()}
        for f, vs in zip(files[1:], self._per_file[1:]):
            for n, (dims, frame, dtype) in first.items():
                v = vs.get(n)
                other = None if v is None else (v.dims, v.shape[1:] if v.dims and v.dims[0] == "time" else v.shape,
                                                v.dtype)
                if other != (dims, frame, dtype):
                    raise DataFileError(f, f"variable {n!r} is {other} here, {(dims, frame, dtype)} in {files[0]}: "
                                        "the files must hold the same variables on the same grid")

    def _variables(self):
        return self._per_file[0]

    def _coordinate(self, name):
        return read_netcdf_coordinate(self.store, name)

    def _times(self, variables) -> np.ndarray:
        parts = [decode_cf_time(read_netcdf_coordinate(f, self.time_dim), vs[self.time_dim].attrs,
                                f"{f}: {self.time_dim!r}") for f, vs in zip(self.files, self._per_file)]
        # the files in time order, as xarray's open_mfdataset(combine="by_coords") takes them (one per
        # year or month, listed or globbed in any order); a file without steps goes first
        earliest = np.datetime64(-(2 ** 63) + 1, "ns")
        order = sorted(range(len(parts)), key=lambda k: (parts[k][0] if len(parts[k]) else earliest, k))
        self.files = [self.files[k] for k in order]
        self._per_file = [self._per_file[k] for k in order]
        parts = [parts[k] for k in order]
        self.store = self.files[0]
        self._file_starts = np.cumsum([0] + [len(p) for p in parts])
        return np.concatenate(parts)

    def _where_step(self, i: int) -> str:
        k = int(np.searchsorted(self._file_starts, i, side="right")) - 1
        return f" in {self.files[k]}"

    def _steps(self, variables, var) -> int:
        return sum(vs[var].shape[0] for vs in self._per_file)

    def _sub_source(self, var, layout, **kw):
        return HDF5Source(self.files, var, layout, **kw)


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
