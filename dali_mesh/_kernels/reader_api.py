"""The native reader driven without DALI (csrc/c_api/reader_api.cc): :class:`PlanReader` reads a plan
file's windows for a list of sample ids as ``fn.dali_mesh.read_windows`` does on the CPU."""
from __future__ import annotations

import ctypes
import os
from typing import Sequence

import numpy as np

from dali_mesh._kernels.library import DTYPE_IDS, F32P, I64P, VPP, KernelsError, _i64, bound


def _declare(lib) -> None:
    """The argument and result types of the functions of csrc/c_api/reader_api.cc."""
    lib.dali_mesh_reader_open.restype = ctypes.c_void_p
    lib.dali_mesh_reader_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int,
                                          F32P, F32P, ctypes.c_int64, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                          ctypes.c_int64, ctypes.c_char_p, ctypes.c_int64]
    lib.dali_mesh_reader_close.restype = None
    lib.dali_mesh_reader_close.argtypes = [ctypes.c_void_p]
    lib.dali_mesh_reader_shapes.restype = ctypes.c_int64
    lib.dali_mesh_reader_shapes.argtypes = [ctypes.c_void_p, I64P, ctypes.c_int64, I64P, I64P, ctypes.c_int64,
                                            ctypes.c_char_p, ctypes.c_int64]
    lib.dali_mesh_reader_read.restype = ctypes.c_int64
    lib.dali_mesh_reader_read.argtypes = [ctypes.c_void_p, I64P, ctypes.c_int64, VPP, I64P, ctypes.c_int,
                                          ctypes.c_char_p, ctypes.c_int64]
    lib.dali_mesh_reader_read_ahead.restype = ctypes.c_int64
    lib.dali_mesh_reader_read_ahead.argtypes = [ctypes.c_void_p, I64P, ctypes.c_int64, ctypes.c_int, ctypes.c_char_p,
                                                ctypes.c_int64]
    lib.dali_mesh_reader_read_ahead_batches.restype = ctypes.c_int64
    lib.dali_mesh_reader_read_ahead_batches.argtypes = [ctypes.c_void_p, I64P, ctypes.c_int64, I64P, ctypes.c_int,
                                                        ctypes.c_int, ctypes.c_char_p, ctypes.c_int64]
    lib.dali_mesh_reader_ahead_budget.restype = None
    lib.dali_mesh_reader_ahead_budget.argtypes = [ctypes.c_void_p, I64P]
    lib.dali_mesh_reader_ahead_alive.restype = ctypes.c_int64
    lib.dali_mesh_reader_ahead_alive.argtypes = []
    lib.dali_mesh_reader_ahead_counts.restype = None
    lib.dali_mesh_reader_ahead_counts.argtypes = [ctypes.c_void_p, I64P]


def _lib() -> ctypes.CDLL:
    return bound("reader_api", _declare)


def ahead_alive() -> int:
    """Batches read ahead whose buffers exist now in this process (each is freed once its batch was
    read, dropped or taken back and its job has ended): what a test of leaks counts."""
    return int(_lib().dali_mesh_reader_ahead_alive())


class PlanReader:
    """The native reader's batch reader (csrc/reader/batch_reader.h) on the plan file at
    ``plan_path``, driven without DALI: :meth:`read` gives the windows of a list of sample ids as
    ``fn.dali_mesh.read_windows`` gives them on the CPU (the same prefetch, read tasks of about
    ``task_bytes``, chunks decoded once per batch, file versions checked per batch, boundary cells
    and normalisation), its tasks on ``threads`` threads of the library's own.

    Args:
        plan_path: a plan file written by :meth:`dali_mesh.plan.PlanSet.write`.
        dtype: the windows' numpy dtype (native byte order, the plans' item size).
        outputs: windows per sample id (a forecast's input and target: 2).
        task_bytes, prefetch: as the operator's arguments.
        normalize: ``(channel_axis, mean, std)``, as ``read_windows(normalize=...)``.
        read_ahead: the operator's argument: ``0`` never, ``1`` when the plans read an object
            store, ``2`` always (:meth:`read_ahead`).
        read_ahead_batches, read_ahead_bytes: as the operator's arguments: the most batches read
            ahead besides the one read (1 to 8), and what they hold together at most
            (:meth:`ahead_budget`).

    The loader's and the reader's errors raise :class:`KernelsError` with the reader's message.
    Use as a context manager, or call :meth:`close`.
    """

    MAX_NDIM = 32

    def __init__(self, plan_path: str, dtype, *, outputs: int = 1, task_bytes: int = 4 << 20, prefetch: bool = True,
                 normalize=None, read_ahead: int = 1, read_ahead_batches: int = 1,
                 read_ahead_bytes: int = 1 << 30) -> None:
        self.dtype = np.dtype(dtype)
        self.outputs = int(outputs)
        axis, mean, std = normalize if normalize is not None else (-1, (), ())
        mean, std = np.ascontiguousarray(mean, np.float32), np.ascontiguousarray(std, np.float32)
        if mean.shape != std.shape:
            raise ValueError(f"normalize: {mean.size} means but {std.size} standard deviations")
        f32p = ctypes.POINTER(ctypes.c_float)
        err = ctypes.create_string_buffer(1024)
        self._lib = _lib()
        self._handle = self._lib.dali_mesh_reader_open(
            os.fsencode(plan_path), DTYPE_IDS[self.dtype], self.outputs, int(task_bytes), int(bool(prefetch)),
            mean.ctypes.data_as(f32p), std.ctypes.data_as(f32p), mean.size, int(axis), int(read_ahead),
            int(read_ahead_batches), int(read_ahead_bytes), err, len(err))
        if not self._handle:
            raise KernelsError(err.value.decode(errors="replace"))

    def shapes(self, ids: Sequence[int]) -> list[tuple[int, ...]]:
        """The shapes of the windows of the batch ``ids``: ``outputs * len(ids)`` of them, output
        ``k``'s window of ``ids[i]`` at ``k * len(ids) + i``."""
        ids = list(ids)
        return self._shapes(_i64(ids), len(ids))

    def read(self, ids: Sequence[int], *, threads: int = 1) -> list[list[np.ndarray]]:
        """The windows of the batch ``ids`` (sample ids of the plan set), read on ``threads``
        threads: ``[output][i]`` is output ``k``'s window of ``ids[i]``."""
        ids = list(ids)
        n = len(ids)
        c_ids = _i64(ids)
        shapes = self._shapes(c_ids, n)
        wins = [np.empty(shape, self.dtype) for shape in shapes]
        ptrs = (ctypes.c_void_p * max(len(wins), 1))(*[w.ctypes.data for w in wins])
        sizes = _i64([w.nbytes for w in wins] or [0])
        err = ctypes.create_string_buffer(4096)
        if self._lib.dali_mesh_reader_read(self._handle, c_ids, n, ptrs, sizes, int(threads), err, len(err)) < 0:
            raise KernelsError(err.value.decode(errors="replace"))
        return [wins[k * n:(k + 1) * n] for k in range(self.outputs)]

    def read_ahead(self, ids: Sequence[int], *, threads: int = 1) -> bool:
        """Starts reading the batch ``ids`` in the background (as the operator reads the next
        batch while it reads this one): a later :meth:`read` of the same ids waits for it and copies
        its windows, or raises its error. Whether it was started (reading ahead is on, the batch fits
        and its ids are in range)."""
        ids = list(ids)
        err = ctypes.create_string_buffer(4096)
        got = self._lib.dali_mesh_reader_read_ahead(self._handle, _i64(ids), len(ids), int(threads), err, len(err))
        if got < 0:
            raise KernelsError(err.value.decode(errors="replace"))
        return bool(got)

    def read_ahead_batches(self, ids: Sequence[int], following: Sequence[Sequence[int]], *, threads: int = 1) -> int:
        """As ``read_windows`` does before it reads the batch ``ids``: the batches ``following`` it (each
        of ``len(ids)`` ids) are read ahead in order, up to the first that does not fit ``read_ahead_bytes``,
        and those read ahead that are neither ``ids`` nor among them are dropped. Call :meth:`read` of
        ``ids`` next. How many are being read ahead."""
        ids = list(ids)
        flat = [int(i) for batch in following for i in batch]
        if any(len(batch) != len(ids) for batch in following):
            raise ValueError(f"every following batch must have {len(ids)} ids, as the batch read")
        err = ctypes.create_string_buffer(4096)
        got = self._lib.dali_mesh_reader_read_ahead_batches(self._handle, _i64(ids), len(ids), _i64(flat or [0]),
                                                            len(following), int(threads), err, len(err))
        if got < 0:
            raise KernelsError(err.value.decode(errors="replace"))
        return int(got)

    def ahead_budget(self) -> dict:
        """What the batches read ahead hold against ``read_ahead_bytes`` (csrc/reader/read_units.h
        ``AheadBudget``): ``bound``, ``held`` (bytes counted now), ``peak`` (the most counted so far),
        ``waits`` (fetches that waited for room), ``longest_wait`` (seconds), and ``in_flight`` (batches
        read ahead whose reads have not ended)."""
        out = (ctypes.c_int64 * 6)()
        self._lib.dali_mesh_reader_ahead_budget(self._handle, out)
        return {"bound": int(out[0]), "held": int(out[1]), "peak": int(out[2]), "waits": int(out[3]),
                "longest_wait": out[4] / 1e6, "in_flight": int(out[5])}

    def ahead_counts(self) -> tuple[int, int, int]:
        """``(used, dropped, failed)``: batches read from what was read ahead, batches read ahead then
        dropped unused, and batches whose read ahead failed (read again by :meth:`read`)."""
        out = (ctypes.c_int64 * 3)()
        self._lib.dali_mesh_reader_ahead_counts(self._handle, out)
        return int(out[0]), int(out[1]), int(out[2])

    def _shapes(self, c_ids, n: int) -> list[tuple[int, ...]]:
        count = self.outputs * n
        ndims = (ctypes.c_int64 * max(count, 1))()
        extents = (ctypes.c_int64 * max(count * self.MAX_NDIM, 1))()
        err = ctypes.create_string_buffer(4096)
        got = self._lib.dali_mesh_reader_shapes(self._handle, c_ids, n, ndims, extents, self.MAX_NDIM, err, len(err))
        if got < 0:
            raise KernelsError(err.value.decode(errors="replace"))
        return [tuple(extents[j * self.MAX_NDIM:j * self.MAX_NDIM + ndims[j]]) for j in range(got)]

    def close(self) -> None:
        if getattr(self, "_handle", None):
            self._lib.dali_mesh_reader_close(self._handle)
            self._handle = None

    def __enter__(self) -> "PlanReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

