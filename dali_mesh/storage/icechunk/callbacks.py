"""The native reader's reads of an Icechunk snapshot, answered here (csrc/storage/callback_store.h): two ctypes
callbacks per store spec, bound in the process's one native core (the kernels library, which the DALI plugin links)
by :func:`bind_native_reads` when an :class:`~dali_mesh.storage.icechunk.IcechunkStore` is made, and their
unbinding at exit.

The callbacks run on the reader's threads and wait there for the library's calls. :func:`unbind_at_exit` must
run before DALI's exit hook (which joins its executor threads: a read never answered held that join until the
library gave up); DALI registers that hook when its pipeline module is first imported, possibly after a store
was made, so the unbinding is registered again at each binding and at the first read answered once DALI is
imported. What the exit does: docs/remote-storage.md, "Icechunk repositories".
"""
from __future__ import annotations

import atexit
import ctypes
import logging
import sys
import threading

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
#: the most the exit waits for the native reader's reads still in Python once the library's calls are cancelled
#: (docs/remote-storage.md: "at most 30 s")
EXIT_WAIT_S = 30.0
#: spec -> the store that answers the native reader's reads of that spec now (the latest made or bound)
_answering: dict = {}
#: spec -> its callbacks, never freed: a reader's thread may call one at any time until the stores are unbound
#: (at exit)
_callbacks: dict = {}
#: the kernels library, once a store was bound in it (the unbinding at exit has nothing to do before)
_library = None
_binding = threading.Lock()
#: whether the unbinding was last registered after DALI's exit hook (DALI's pipeline module imported by then)
_after_dali = False
_ordering = threading.Lock()


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


def _answers(spec: str) -> tuple:
    """The two callbacks of the native store ``spec``, reading through ``_answering[spec]`` at each call; they
    never raise (ctypes would print and return 0): a failure is -1 and its message."""

    def answer(key_p, err, err_cap, work) -> int:
        store, key = None, ""
        try:
            if not _after_dali:
                _exit_after_dali()
            store = _answering[spec]
            key = key_p.decode("utf-8", "surrogateescape")
            return work(store, key)
        except BaseException as e:  # noqa: BLE001 - every failure goes back to the reader, named
            _say(err, err_cap, _failure(store, key, e))
            return -1

    def head(key_p, size_p, tag, tag_cap, err, err_cap):
        def work(store, key: str) -> int:
            version = store.stat(key)
            if version is None:
                return 0
            size_p[0] = version.size
            _say(tag, tag_cap, version.tag)
            return 1

        return answer(key_p, err, err_cap, work)

    def read(key_p, n, offsets, sizes, dsts, got, err, err_cap):
        def work(store, key: str) -> int:
            datas = store.read_ranges(key, [(offsets[i], sizes[i]) for i in range(n)])
            for i, data in enumerate(datas):
                take = min(len(data), sizes[i])
                if take:
                    ctypes.memmove(dsts[i], data.ctypes.data, take)
                got[i] = take
            return 0

        return answer(key_p, err, err_cap, work)

    return _HEAD(head), _READ(read)


def _declare(lib) -> None:
    c, i64 = ctypes.c_char_p, ctypes.c_int64
    lib.dali_mesh_store_bind_reader.argtypes = [c, c, ctypes.c_void_p, ctypes.c_void_p, c, i64]
    lib.dali_mesh_store_bind_reader.restype = ctypes.c_int
    lib.dali_mesh_store_unbind_readers.argtypes = [ctypes.c_double]
    lib.dali_mesh_store_unbind_readers.restype = i64


def _bind(spec: str, name: str, head, read) -> None:
    """Binds the native store ``spec`` to the callbacks ``head`` and ``read`` (None, None: unbinds it)."""
    global _library
    from dali_mesh._kernels.library import bound  # noqa: PLC0415 - the native library, loaded on first use

    lib = _library = bound("icechunk_callbacks", _declare)
    err = ctypes.create_string_buffer(4096)
    if lib.dali_mesh_store_bind_reader(spec.encode(), name.encode(), head, read, err, len(err)) < 0:
        raise DataFileError(name or spec, f"the native reader cannot be given its reads: "
                                          f"{err.value.decode(errors='replace')}")


def bind_native_reads(store) -> None:
    """Makes the native store of ``store.spec`` read through ``store`` (an IcechunkStore, when it is made).
    The callbacks are made once per spec and kept for the process; a later store of the spec takes over their
    answers. Moves the unbinding to run first at exit (before DALI's shutdown, whose GIL it would wait for)."""
    with _binding:
        _answering[store.spec] = store
        if store.spec not in _callbacks:
            _callbacks[store.spec] = _answers(store.spec)
        head, read = _callbacks[store.spec]
        _bind(store.spec, store.name_of(""), ctypes.cast(head, ctypes.c_void_p), ctypes.cast(read, ctypes.c_void_p))
    _run_first_at_exit()


def unbind_native_reads(store) -> None:
    """Unbinds the native store of ``store.spec``: its reads then fail naming the store, until a store of the spec
    is bound again (:func:`bind_native_reads`)."""
    with _binding:
        _bind(store.spec, "", None, None)


def _run_first_at_exit() -> None:
    """Registers the unbinding again, so that it runs first among the exit hooks registered so far."""
    global _after_dali
    with _ordering:
        after_dali = "nvidia.dali.pipeline" in sys.modules  # DALI registers its hook when that module is imported
        atexit.unregister(unbind_at_exit)
        atexit.register(unbind_at_exit)
        _after_dali = after_dali


def _exit_after_dali() -> None:
    """At a read answered (on a reader's thread): the unbinding registered again once DALI is imported."""
    if "nvidia.dali.pipeline" in sys.modules:
        _run_first_at_exit()


def unbind_at_exit() -> None:
    """Cancels the library's calls in flight, unbinds the callback stores for good and waits (without the GIL: a
    ctypes call) at most :data:`EXIT_WAIT_S` for the reads in flight, so that no reader thread enters the
    interpreter while it is torn down; then waits (at most 2 s) for the calls cancelled to leave the library's
    runtime, which touches the interpreter once more."""
    cancel_all()
    lib = _library
    left = lib.dali_mesh_store_unbind_readers(EXIT_WAIT_S) if lib is not None else 0
    if left:
        log.warning("%d reads of Icechunk stores by the native reader were still in flight %.0f s after the "
                    "process began to exit", left, EXIT_WAIT_S)
    settle()
