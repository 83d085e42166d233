"""Datasets as a format of variables: a kind of dataset (:class:`DatasetFormat`: an xarray-written
Zarr group, NetCDF4 files), registered by name, says what variables it holds (:class:`Variable`:
location, array name, dims, shape, dtype), reads its coordinates and CF time axis, and makes the
array source of each variable; one :class:`VariablesSource` composes those array sources into
channels, whatever the kind. A new kind is one module with a :class:`DatasetFormat` subclass and
:func:`register_dataset_format`.

==================  =====================  ==========================================
name                class                  variables read by
==================  =====================  ==========================================
``zarr_group``      :class:`ZarrGroup`     :class:`~dali_mesh.ZarrSource` of the group
``netcdf_files``    :class:`NetCDFFiles`   :class:`~dali_mesh.HDF5Source` of every file
==================  =====================  ==========================================

anemoi-datasets stores (every variable in one array ``data`` of (dates, variables, ensembles, cells)) are
read by :class:`AnemoiDatasetSource`, one :class:`~dali_mesh.ZarrSource` of ``data`` with the variables
chosen by name, by grid shard or by a graph partition's rows (:mod:`dali_mesh.datasets.anemoi`).
"""
from __future__ import annotations

from dali_mesh.datasets.anemoi import AnemoiDatasetSource
from dali_mesh.datasets.cf_time import CALENDARS, decode_cf_time
from dali_mesh.datasets.named_layout import NamedLayout
from dali_mesh.datasets.netcdf_files import NetCDFFiles
from dali_mesh.datasets.variables import (DATASET_FORMATS, DatasetFormat, Variable, dataset_format_named,
                                          register_dataset_format)
from dali_mesh.datasets.variables_source import Channel, VariablesSource
from dali_mesh.datasets.zarr_group import ZarrGroup

__all__ = ["AnemoiDatasetSource", "CALENDARS", "Channel", "DATASET_FORMATS", "DatasetFormat", "NamedLayout", "NetCDFFiles", "Variable",
           "VariablesSource", "ZarrGroup", "dataset_format_named", "decode_cf_time", "register_dataset_format"]
