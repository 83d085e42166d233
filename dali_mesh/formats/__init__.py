"""Formats as rooms: one folder per storage format (:mod:`.npy`, :mod:`.hdf5`, :mod:`.zarr`), each with its
reader, planner, writer, layout advice and the format object that registers itself
(:class:`ArrayFormat`); the registry (:mod:`.format_registry`) finds them, and the formats of other
packages through the ``dali_mesh.formats`` entry-point group.

Adding a format is one folder: a subclass of :class:`ArrayFormat` (``info``, ``open``, ``read_window``,
``read_whole``; ``create``, ``plan_steps``, ``advice_target`` where it can) and its registration."""
from dali_mesh.formats.array_format import ArrayFormat, ArrayInfo
from dali_mesh.formats.format_registry import (ENTRY_POINT_GROUP, FORMATS, FormatPluginError, format_named, format_of,
                                               register_format, written_suffixes)
# the built-in formats, registered in the order a folder is searched
from dali_mesh.formats.npy.npy_format import NPY
from dali_mesh.formats.hdf5.hdf5_format import HDF5
from dali_mesh.formats.zarr.zarr_format import ZARR

__all__ = ["ArrayFormat", "ArrayInfo", "ENTRY_POINT_GROUP", "FORMATS", "FormatPluginError", "HDF5", "NPY", "ZARR",
           "format_named", "format_of", "register_format", "written_suffixes"]
