"""Formats as rooms: one folder per storage format (:mod:`.npy`, :mod:`.hdf5`, :mod:`.zarr`), each with its
reader, planner, writer, layout advice and the format object that registers itself; the registry finds
them, and formats of other packages through the ``dali_mesh.formats`` entry-point group."""
from dali_mesh.formats.format_registry import (FORMATS, HDF5, NPY, ZARR, ArrayFormat, ArrayInfo, format_named, format_of,
                                        register_format, written_suffixes)

__all__ = ["ArrayFormat", "ArrayInfo", "FORMATS", "HDF5", "NPY", "ZARR", "format_named", "format_of",
           "register_format", "written_suffixes"]
