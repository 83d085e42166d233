"""The reader's fetch plan (csrc/c_api/fetch_api.cc): which requests fetch a set of wanted byte ranges
at a given latency and bandwidth, which chunks of a batch one request fetches together, and what a store's
requests were measured to cost."""
from __future__ import annotations

import ctypes

from dali_mesh._kernels.library import I64P, KernelsError, _i64, bound


def _declare(lib) -> None:
    """The argument and result types of the functions of csrc/c_api/fetch_api.cc and of
    store_api.cc's dali_mesh_store_round_trip."""
    lib.dali_mesh_plan_requests.argtypes = [I64P, ctypes.c_int64, ctypes.c_double, ctypes.c_double, I64P,
                                            ctypes.c_char_p, ctypes.c_int64]
    lib.dali_mesh_plan_requests.restype = ctypes.c_int64
    lib.dali_mesh_merge_gap.argtypes = [ctypes.c_double, ctypes.c_double]
    lib.dali_mesh_merge_gap.restype = ctypes.c_int64
    f64p = ctypes.POINTER(ctypes.c_double)
    lib.dali_mesh_chunk_runs.argtypes = [I64P, ctypes.c_int64, f64p, f64p, ctypes.c_int64, ctypes.c_int64, I64P,
                                         I64P, ctypes.c_char_p, ctypes.c_int64]
    lib.dali_mesh_chunk_runs.restype = ctypes.c_int64
    lib.dali_mesh_store_round_trip.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_double),
                                               ctypes.POINTER(ctypes.c_double), ctypes.c_char_p, ctypes.c_int64]
    lib.dali_mesh_store_round_trip.restype = ctypes.c_int


def _lib() -> ctypes.CDLL:
    return bound("fetch_api", _declare)


def plan_requests(wanted, latency_s: float, bytes_per_s: float) -> list[tuple[int, int]]:
    """The requests the reader sends for the byte ranges ``wanted`` (``[(first, stop), ...]``, sorted,
    disjoint, non-empty) to a store whose requests wait ``latency_s`` for their first byte and then bring
    ``bytes_per_s`` (0: not measured): ``[(first, stop), ...]``, each wanted range inside one
    (csrc/reader/fetch_plan.h PlanRequests); :class:`KernelsError` with the reader's reason."""
    wanted = [(int(lo), int(hi)) for lo, hi in wanted]
    out = (ctypes.c_int64 * max(2 * len(wanted), 1))()
    err = ctypes.create_string_buffer(1024)
    m = _lib().dali_mesh_plan_requests(_i64([v for r in wanted for v in r]), len(wanted), float(latency_s),
                                       float(bytes_per_s), out, err, len(err))
    if m < 0:
        raise KernelsError(err.value.decode(errors="replace"))
    return [(out[2 * k], out[2 * k + 1]) for k in range(m)]


def merge_gap(latency_s: float, bytes_per_s: float) -> int:
    """The widest gap between two ranges that the link reads rather than send another request: latency
    times bandwidth, at least the 64 KiB a local file's reads merge (fetch_plan.h MergeGap)."""
    return int(_lib().dali_mesh_merge_gap(float(latency_s), float(bytes_per_s)))


def chunk_runs(spans, costs=None, max_bytes: int = 0) -> list[list[int]]:
    """The chunks of a batch (read whole) that the reader fetches by one request each (csrc/reader/fetch_plan.h
    ChunkRuns): ``spans`` ``[(file, offset, nbytes), ...]``; ``costs`` ``[(latency s, bytes/s), ...]`` indexed
    by file (``None``: every file local); ``max_bytes`` a run's most bytes from its first to its last (0: the
    reader's own, 64 MiB). Runs of two chunks or more, as indices into ``spans`` in the order of file and
    offset; a chunk in none is fetched alone, one of 0 bytes not at all. :class:`KernelsError` with the
    reader's reason."""
    flat = [int(v) for s in spans for v in s]
    if len(flat) != 3 * len(spans):
        raise ValueError(f"spans must be (file, offset, nbytes) triples, got {spans!r}")
    n = len(spans)
    lat = rate = None
    n_files = 0
    if costs is not None:
        n_files = len(costs)
        lat = (ctypes.c_double * max(n_files, 1))(*[float(c[0]) for c in costs])
        rate = (ctypes.c_double * max(n_files, 1))(*[float(c[1]) for c in costs])
    index = (ctypes.c_int64 * max(n, 1))()
    run_end = (ctypes.c_int64 * max(n // 2, 1))()
    err = ctypes.create_string_buffer(1024)
    m = _lib().dali_mesh_chunk_runs(_i64(flat), n, lat, rate, n_files, int(max_bytes), index, run_end, err,
                                    len(err))
    if m < 0:
        raise KernelsError(err.value.decode(errors="replace"))
    ends = [0] + [run_end[r] for r in range(m)]
    return [[index[k] for k in range(ends[r], ends[r + 1])] for r in range(m)]


def store_round_trip(spec: str) -> tuple[float, float]:
    """``(latency s, bytes/s)`` of the requests of the store ``spec`` in this process's kernels library so
    far, as the fetch plan weighs them (byte_store.h RoundTripMeter: moving medians of the time to the
    first byte and of the rate of long bodies; 0 where not measured)."""
    latency, rate = ctypes.c_double(), ctypes.c_double()
    err = ctypes.create_string_buffer(1024)
    if _lib().dali_mesh_store_round_trip(spec.encode(), ctypes.byref(latency), ctypes.byref(rate), err, len(err)) < 0:
        raise KernelsError(err.value.decode(errors="replace"))
    return latency.value, rate.value
