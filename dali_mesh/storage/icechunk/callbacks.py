"""The native reader's reads of an Icechunk snapshot, answered here (csrc/storage/callback_store.h): two ctypes
callbacks per library (the kernels library, the DALI plugin) and store spec, bound by
:meth:`~dali_mesh.storage.icechunk.IcechunkStore.give_to`, and their unbinding at exit.

The callbacks run on the reader's threads (DALI's executor threads, the kernels library's) and wait there for
the library's calls (:mod:`~dali_mesh.storage.icechunk.deadline`). At exit :func:`unbind_at_exit` runs first
among the exit hooks: it cancels every call of the library in flight (the reads waiting on them fail at once,
"the process is exiting"), unbinds every library's stores (later reads fail in C++ without entering Python)
and waits, at most :data:`EXIT_WAIT_S` in all, for the reads still in Python to return, then (at most 2 s)
for the calls cancelled to leave the library's runtime (:func:`~dali_mesh.storage.icechunk.deadline.settle`).
DALI's hook, which shuts its pipelines down and joins their executor threads, comes after it and finds them
done: before, a read whose requests were never answered held that join (and the exit) until the library gave
up.
"""
from __future__ import annotations

import atexit
import ctypes
import logging
import threading
import time

from dali_mesh.storage.errors import DataFileError
from dali_mesh.storage.icechunk.deadline import cancel_all, settle

__all__ = ["EXIT_WAIT_S", "bind_native_reads", "unbind_at_exit", "unbind_native_reads"]

log = logging.getLogger(__name__)

#: int64 head(key, int64 *size, char *tag, int64 tag_cap, char *err, int64 err_cap)
_HEAD = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int64), ctypes.c_void_p,
                         ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64)
#: int64 read(key, int64 n, const int64 *offsets, const int64 *sizes, char *const *dsts, int64 *got, char *err,
#: int64 err_cap)
_READ = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_char_p, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64),
                         ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_void_p),
                         ctypes.POINTER(ctypes.c_int64), ctypes.c_void_p, ctypes.c_int64)
#: the most the exit waits, in all (every library's stores together), for the native reader's reads still in
#: Python once the library's calls are cancelled (docs/remote-storage.md: "at most 30 s")
EXIT_WAIT_S = 30.0
#: (library handle, spec) -> the store that answers that library's reads of that spec now (the latest given)
_answering: dict = {}
#: (library handle, spec) -> its callbacks, never freed: a reader's thread may call one at any time until
#: the library is unbound (at exit)
_callbacks: dict = {}
#: library handle -> the library, for the unbinding at exit
_libraries: dict = {}
_binding = threading.Lock()


def _say(err, cap: int, text: str) -> None:
    data = text.encode("utf-8", "replace")[: max(0, cap - 1)]
    ctypes.memmove(err, data + b"\0", len(data) + 1)


def _failure(store, key: str, e: BaseException) -> str:
    """The message of a failed answer, naming the key (a DataFileError of the store names it already)."""
    if isinstance(e, DataFileError):
        return str(e)
    from dali_mesh.storage.icechunk.repository import short  # noqa: PLC0415 - only for a failure

    name = store.name_of(key) if store is not None else key
    return f"{name}: cannot be read ({type(e).__name__}: {short(e)})"


def _answers(slot: tuple) -> tuple:
    """The two callbacks of one library's store of one spec: they read through the store ``_answering``
    names for ``slot`` at each call. They never raise (ctypes would print and return 0): a failure is -1
    and its message."""

    def head(key_p, size_p, tag, tag_cap, err, err_cap):
        store, key = None, ""
        try:
            store = _answering[slot]
            key = key_p.decode("utf-8", "surrogateescape")
            version = store.stat(key)
            if version is None:
                return 0
            size_p[0] = version.size
            _say(tag, tag_cap, version.tag)
            return 1
        except BaseException as e:  # noqa: BLE001 - every failure goes back to the reader, named
            _say(err, err_cap, _failure(store, key, e))
            return -1

    def read(key_p, n, offsets, sizes, dsts, got, err, err_cap):
        store, key = None, ""
        try:
            store = _answering[slot]
            key = key_p.decode("utf-8", "surrogateescape")
            datas = store.read_ranges(key, [(offsets[i], sizes[i]) for i in range(n)])
            for i, data in enumerate(datas):
                take = min(len(data), sizes[i])
                if take:
                    ctypes.memmove(dsts[i], data.ctypes.data, take)
                got[i] = take
            return 0
        except BaseException as e:  # noqa: BLE001
            _say(err, err_cap, _failure(store, key, e))
            return -1

    return _HEAD(head), _READ(read)


def _declare(lib) -> None:
    c, i64 = ctypes.c_char_p, ctypes.c_int64
    lib.dali_mesh_store_bind_reader.argtypes = [c, c, ctypes.c_void_p, ctypes.c_void_p, c, i64]
    lib.dali_mesh_store_bind_reader.restype = ctypes.c_int
    lib.dali_mesh_store_unbind_readers.argtypes = [ctypes.c_double]
    lib.dali_mesh_store_unbind_readers.restype = i64


def bind_native_reads(lib, store) -> None:
    """Makes ``lib``'s store of ``store.spec`` (csrc/storage/callback_store.cc) read through ``store`` (an
    :class:`~dali_mesh.storage.icechunk.IcechunkStore`): its callbacks are made once per library and spec and
    kept for the life of the process; a later store of the spec takes over their answers (its
    :attr:`~dali_mesh.storage.icechunk.IcechunkStore.native_reads` then counts them). The first binding
    registers the unbinding at exit, and each moves it to run first among the exit hooks (before DALI's, which
    shuts its pipelines down: their reads then fail at once instead of waiting for a GIL held by that
    shutdown)."""
    _declare(lib)
    slot = (lib._handle, store.spec)
    with _binding:
        _answering[slot] = store
        if slot not in _callbacks:
            _callbacks[slot] = _answers(slot)
        head, read = _callbacks[slot]
        _libraries[lib._handle] = lib
        err = ctypes.create_string_buffer(4096)
        if lib.dali_mesh_store_bind_reader(store.spec.encode(), store.name_of("").encode(),
                                           ctypes.cast(head, ctypes.c_void_p), ctypes.cast(read, ctypes.c_void_p),
                                           err, len(err)) < 0:
            raise DataFileError(store.name_of(""), f"the native reader cannot be given its reads: "
                                                   f"{err.value.decode(errors='replace')}")
        atexit.unregister(unbind_at_exit)
        atexit.register(unbind_at_exit)


def unbind_native_reads(lib, store) -> None:
    """Unbinds ``lib``'s store of ``store.spec``: its reads then fail naming the store, until it is given
    again (:meth:`~dali_mesh.storage.icechunk.IcechunkStore.give_to`)."""
    _declare(lib)
    err = ctypes.create_string_buffer(4096)
    if lib.dali_mesh_store_bind_reader(store.spec.encode(), b"", None, None, err, len(err)) < 0:
        raise DataFileError(store.name_of(""), err.value.decode(errors="replace"))


def unbind_at_exit() -> None:
    """Cancels the library's calls in flight, unbinds every library's callback stores for good and waits
    (without the GIL: ctypes calls), at most :data:`EXIT_WAIT_S` for all of them together, for the reads in
    flight, so that no reader thread enters the interpreter while it is torn down; then waits (at most 2 s)
    for the calls cancelled to leave the library's runtime, which touches the interpreter once more."""
    cancel_all()
    libraries = list(_libraries.values())
    for lib in libraries:  # first every library refuses new reads (no wait), then the waits share one bound
        lib.dali_mesh_store_unbind_readers(0.0)
    deadline = time.monotonic() + EXIT_WAIT_S
    left = 0
    for lib in libraries:
        left += lib.dali_mesh_store_unbind_readers(max(0.0, deadline - time.monotonic()))
    if left:
        log.warning("%d reads of Icechunk stores by the native reader were still in flight %.0f s after the "
                    "process began to exit", left, EXIT_WAIT_S)
    settle()
