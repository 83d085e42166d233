"""The ``.npy`` format: one sample per file, read by byte ranges of its header's layout."""
from dali_mesh.formats.npy.npy_reader import (MAX_NATIVE_UNITS, NpyHeader, plan_npy_files, read_npy_header,
                                              read_npy_header_bytes, read_npy_window)

__all__ = ["MAX_NATIVE_UNITS", "NpyHeader", "plan_npy_files", "read_npy_header", "read_npy_header_bytes",
           "read_npy_window"]
