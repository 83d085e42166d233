"""The reader's fetch plan (csrc/c_api/fetch_api.cc): which requests fetch a set of wanted byte ranges
at a given latency and bandwidth, which chunks of a batch one request fetches together, what a store's
requests were measured to cost, and what an epoch of the reader fetches (:class:`EpochFetches`, counted by
the reader's own code: ``dali-mesh plan`` and every cost estimate)."""
from __future__ import annotations

import ctypes
from typing import NamedTuple, Sequence

import numpy as np

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
    lib.dali_mesh_min_parts_bytes.argtypes = []
    lib.dali_mesh_min_parts_bytes.restype = ctypes.c_int64
    lib.dali_mesh_epoch_fetches.argtypes = [ctypes.c_char_p, I64P, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                            ctypes.c_int64, I64P, ctypes.c_char_p, ctypes.c_int64, f64p, f64p,
                                            ctypes.c_int64, I64P, ctypes.c_int64, ctypes.c_char_p, ctypes.c_int64]
    lib.dali_mesh_epoch_fetches.restype = ctypes.c_int64


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


def _costs(costs) -> tuple:
    """``(latencies, rates, count)`` of ``[(latency s, bytes/s), ...]`` as the C API takes them (``None``:
    ``(None, None, 0)``, each store's own measure)."""
    if costs is None:
        return None, None, 0
    return (*((ctypes.c_double * max(len(costs), 1))(*[float(c[k]) for c in costs]) for k in (0, 1)), len(costs))


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
    lat, rate, n_files = _costs(costs)
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


def min_parts_bytes() -> int:
    """The stored bytes from which a Blosc chunk may be read in parts (fetch_plan.h kMinPartsBytes)."""
    return int(_lib().dali_mesh_min_parts_bytes())


class EpochFetches(NamedTuple):
    """What the native reader fetches for a list of sample ids read in batches (:func:`epoch_fetches`)."""

    batches: int
    requests: int         # GET requests
    bytes: int            # body bytes received
    round_trips: int      # summed over the batches: each batch's longest chain of requests sent in turn
    max_round_trips: int  # the most of one batch
    parts_chunks: int     # chunk reads in parts: their blocks placed as if they compressed alike (estimated)

    @staticmethod
    def added(each: "Sequence[EpochFetches]") -> "EpochFetches":
        """Several ranks' epochs added up (``round_trips``: the most of one of them)."""
        return EpochFetches(sum(e.batches for e in each), sum(e.requests for e in each), sum(e.bytes for e in each),
                            max(e.round_trips for e in each), max(e.max_round_trips for e in each),
                            sum(e.parts_chunks for e in each))


def epoch_batches(plan_path: str, ids, batch_size: int = 1, *, outputs: int = 1, task_bytes: int = 4 << 20,
                  headers: dict[int, bytes] | None = None, costs: Sequence[tuple[float, float]] | None = None
                  ) -> np.ndarray:
    """Per batch ``(requests, bytes, round trips, chunks read in parts)`` (an int64 array of 4 columns) of the
    sample ids ``ids`` read in batches of ``batch_size`` from the plan file ``plan_path`` by the native reader
    (csrc/reader/fetch_epoch.h EpochFetches: the reader's own decisions, nothing read). ``headers``: coder index
    -> the first 16 bytes of one of its chunks (their Blosc header: where a chunk read in parts has its
    blocks); ``costs``: per store of the plan file (its store table, in order) ``(latency s, bytes/s)`` of a
    request (``None``: each store's own measure so far). :class:`KernelsError` with the reader's reason."""
    ids = np.ascontiguousarray(np.asarray(ids, np.int64).reshape(-1))
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    n_batches = -(-ids.size // batch_size)
    out = np.zeros((max(n_batches, 1), 4), np.int64)
    headers = headers or {}
    coders = [int(c) for c in headers]
    blob = b"".join(bytes(headers[c])[:16].ljust(16, b"\0") for c in headers)
    lat, rate, n_stores = _costs(costs)
    err = ctypes.create_string_buffer(2048)
    m = _lib().dali_mesh_epoch_fetches(
        str(plan_path).encode(), ids.ctypes.data_as(I64P), ids.size, int(batch_size), int(outputs), int(task_bytes),
        _i64(coders), blob, len(coders), lat, rate, n_stores, out.ctypes.data_as(I64P), out.size, err, len(err))
    if m < 0:
        raise KernelsError(err.value.decode(errors="replace"))
    return out[:m]


def epoch_fetches(plan_path: str, ids, batch_size: int = 1, **kw) -> EpochFetches:
    """:func:`epoch_batches` added up: an :class:`EpochFetches`."""
    per = epoch_batches(plan_path, ids, batch_size, **kw)
    return EpochFetches(int(per.shape[0]), int(per[:, 0].sum()), int(per[:, 1].sum()), int(per[:, 2].sum()),
                        int(per[:, 2].max(initial=0)), int(per[:, 3].sum()))
