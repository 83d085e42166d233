"""ctypes access to ``libdali_mesh_kernels.so``, the DALI-free library built with the plugin.

It runs the same host code and kernels as the DALI operators ``strided_slice``, ``mesh_roi`` and
``read_windows`` (the read plans' loader and executor):

* ``backend="cpu"``: the CPU kernel, as the DALI CPU operator runs it (one thread);
* ``backend="emulate"``: the GPU kernel body run on the host thread by thread (the descriptors,
  vectorisation and index math that ship to the GPU, checked without one);
* ``backend="cuda"``: the CUDA kernel on device pointers (torch or cupy memory), see
  :func:`strided_slice_device`;
* the read plans written by :mod:`dali_mesh.plan`: :func:`plan_dump` (a plan file as the C++
  reader loads it), :func:`canonical_json` and :func:`plan_checksum` (the format's canonical JSON
  and checksum, as the reader computes them), and the test hooks :func:`check_device_fill` and
  :func:`plan_tasks`;
* the reader itself: :class:`PlanReader` reads a plan file's windows for a list of sample ids as
  ``fn.dali_mesh.read_windows`` does on the CPU (csrc/reader/), without DALI;
* the codecs: :func:`codec_table` (the one list of codecs, csrc/codecs/codec_table.inc, from which
  :data:`dali_mesh.plan.CODECS` comes), :func:`codec_available`, :func:`decode_chunk`.

Used by the tests and ``benchmarks/kernel_bench.py``; numpy only (no DALI, no torch).


One module per file of csrc/c_api/ (each declares its own functions' types): :mod:`.library` (loading,
the ABI check, the ids), :mod:`.kernel_api` (c_api.cc: the slice and mesh_roi kernels), :mod:`.plan_api`,
:mod:`.codec_api`, :mod:`.fetch_api`, :mod:`.reader_api`; the store's C API is bound where the stores are
(:mod:`dali_mesh.storage.remote`); :mod:`.numpy_reference` is the tests' oracle.
"""
from __future__ import annotations

from dali_mesh._kernels.library import (  # noqa: F401
    LIB_NAME, ABI_VERSION, DTYPE_IDS, BOUNDARY_IDS, SPLIT_IDS, KernelsError, library_path, load)
from dali_mesh._kernels.kernel_api import (  # noqa: F401
    has_cuda, fill_value_args, _call_slice, strided_slice_host, strided_slice_device, CudaLauncher, CONV_KINDS,
    gpu_plan_info, mesh_roi, floats_to_half, boundary_index, fast_div)
from dali_mesh._kernels.plan_api import (  # noqa: F401
    plan_dump, canonical_json, plan_checksum, check_device_fill, plan_tasks)
from dali_mesh._kernels.codec_api import (  # noqa: F401
    codec_table, codec_available, decode_chunk, decode_chunk_ranges, read_chunk_ranges)
from dali_mesh._kernels.fetch_api import chunk_runs, merge_gap, plan_requests, store_round_trip  # noqa: F401
from dali_mesh._kernels.reader_api import ahead_alive, PlanReader  # noqa: F401
from dali_mesh._kernels.numpy_reference import cast_saturate, reference_strided_slice  # noqa: F401

__all__ = [
    "DTYPE_IDS",
    "BOUNDARY_IDS",
    "SPLIT_IDS",
    "KernelsError",
    "library_path",
    "load",
    "has_cuda",
    "strided_slice_host",
    "strided_slice_device",
    "mesh_roi",
    "boundary_index",
    "fast_div",
    "gpu_plan_info",
    "plan_dump",
    "canonical_json",
    "plan_checksum",
    "check_device_fill",
    "plan_tasks",
    "PlanReader",
    "codec_table",
    "codec_available",
    "decode_chunk",
    "decode_chunk_ranges",
    "CudaLauncher",
]
