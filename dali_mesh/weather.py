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

Both sources are :class:`~dali_mesh.datasets.variables_source.VariablesSource` with their kind of
dataset (:mod:`dali_mesh.datasets`: a format of variables, registered by name), where a new kind is
added without a new source.
"""
from __future__ import annotations

from dali_mesh.datasets import NamedLayout, NetCDFFiles, VariablesSource, ZarrGroup
from dali_mesh.datasets.variables_source import LEVEL_DIMS, Channel

__all__ = ["ZarrDatasetSource", "NetCDFDatasetSource", "NamedLayout", "Channel", "LEVEL_DIMS"]


class ZarrDatasetSource(VariablesSource):
    """Channels from the variables (and levels) of an xarray-written Zarr group (v2 or v3, as
    ``xarray.Dataset.to_zarr`` writes it: WeatherBench2, ARCO-ERA5), one sample per time step.
    Arguments: see :class:`~dali_mesh.datasets.variables_source.VariablesSource`; ``store`` is the
    group's folder."""

    dataset_format = ZarrGroup


class NetCDFDatasetSource(VariablesSource):
    """Channels from the variables of NetCDF4 files (HDF5 underneath, as the netCDF library, h5netcdf
    and xarray's ``to_netcdf`` write them), one sample per time step; ``store`` is one file or a
    list of files that continue each other in time (one per year or month, the same variables and
    grid), the time coordinate concatenated. NetCDF3 files are refused naming the format.
    Arguments: see :class:`~dali_mesh.datasets.variables_source.VariablesSource`."""

    dataset_format = NetCDFFiles
