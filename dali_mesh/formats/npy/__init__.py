"""The ``.npy`` format: one sample per file, read by byte ranges of its header's layout
(:mod:`.npy_reader`) and planned natively (:mod:`.npy_planner`)."""
from dali_mesh.formats.npy.npy_planner import MAX_NATIVE_UNITS, plan_npy_files
from dali_mesh.formats.npy.npy_reader import NpyHeader, read_npy_header, read_npy_header_bytes, read_npy_window

__all__ = ["MAX_NATIVE_UNITS", "NpyHeader", "plan_npy_files", "read_npy_header", "read_npy_header_bytes",
           "read_npy_window"]
