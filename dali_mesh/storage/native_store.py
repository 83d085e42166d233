"""The byte stores' C entry points (csrc/c_api/store_api.cc), bound once on the process's one native core
(the kernels library, which the DALI plugin links): every Python store that reads through a native store
(the remote stores, :class:`~dali_mesh.storage.memory.MemoryStore`) calls them here, none through another
store's module."""
from __future__ import annotations

import ctypes
import json

from dali_mesh.storage.credentials import Credentials
from dali_mesh.storage.errors import DataFileError

__all__ = ["fetch_counters", "give_credentials", "have_native_http", "store_api", "store_message", "store_settings"]

_ERR = 4096


def store_api():
    """The kernels library with the byte stores' C entry points bound (the one binding of
    csrc/c_api/store_api.cc): the process's one native core, which every Python store that reads through
    it (this module's RemoteStore, :class:`~dali_mesh.storage.memory.MemoryStore`) and the DALI plugin (which
    links it) share: the same stores, credentials, caches and counters."""
    from dali_mesh._kernels.library import bound  # noqa: PLC0415 - the native library, loaded on first use

    return bound("store_api", _bind)


def _bind(lib) -> None:
    c, i64, p = ctypes.c_char_p, ctypes.c_int64, ctypes.c_void_p
    lib.dali_mesh_store_have_http.restype = ctypes.c_int
    lib.dali_mesh_store_settings.argtypes = [c, c, i64, c, i64]
    lib.dali_mesh_store_settings.restype = i64
    lib.dali_mesh_store_credentials.argtypes = [c, c, c, c, c, i64]
    lib.dali_mesh_store_credentials.restype = ctypes.c_int
    lib.dali_mesh_store_head.argtypes = [c, c, ctypes.POINTER(i64), c, i64, c, i64]
    lib.dali_mesh_store_head.restype = i64
    lib.dali_mesh_store_get.argtypes = [c, c, i64, i64, c, i64, p, c, i64]
    lib.dali_mesh_store_get.restype = i64
    lib.dali_mesh_store_open.argtypes = [c, c, i64, p, ctypes.POINTER(i64), c, i64, c, i64]
    lib.dali_mesh_store_open.restype = i64
    lib.dali_mesh_store_list.argtypes = [c, c, ctypes.c_int, c, c, i64, c, i64]
    lib.dali_mesh_store_list.restype = i64
    lib.dali_mesh_store_put.argtypes = [c, c, p, i64, c, c, i64]
    lib.dali_mesh_store_put.restype = ctypes.c_int
    lib.dali_mesh_store_delete.argtypes = [c, c, c, i64]
    lib.dali_mesh_store_delete.restype = ctypes.c_int
    lib.dali_mesh_store_counters.argtypes = [ctypes.POINTER(i64), ctypes.POINTER(i64)]
    lib.dali_mesh_store_counters.restype = None


def fetch_counters() -> tuple[int, int]:
    """``(requests, body bytes)`` the native remote stores sent and received in this process so far: the
    native reader's (the DALI plugin's, a PlanReader's) and Python's planning and reads alike."""
    lib = store_api()
    requests, got = ctypes.c_int64(), ctypes.c_int64()
    lib.dali_mesh_store_counters(ctypes.byref(requests), ctypes.byref(got))
    return requests.value, got.value


def have_native_http() -> bool:
    """Whether this build reads remote objects through libcurl (it was built with
    ``libcurl4-openssl-dev``)."""
    try:
        return bool(store_api().dali_mesh_store_have_http())
    except Exception:  # noqa: BLE001 - no kernels library: no native reads of any kind
        return False


def store_settings(spec: str) -> dict:
    """The settings of the store ``spec`` as C++, the specs' one reader, parsed them (csrc/storage/byte_store.h
    ``StoreSettings``; an ``s3`` or ``http`` spec: the fields of ``HttpStoreConfig`` in http_store.h, the
    client's defaults filled in); also where this build has no libcurl. A ``ValueError`` naming the spec
    and what is wrong for one its kind refuses."""
    lib = store_api()
    err = ctypes.create_string_buffer(_ERR)
    size = 1024
    while True:
        out = ctypes.create_string_buffer(size)
        n = lib.dali_mesh_store_settings(spec.encode(), out, size, err, _ERR)
        if n < 0:
            raise ValueError(store_message(err))
        if n < size:
            return json.loads(out.value.decode("utf-8"))
        size = n + 1


def store_message(err) -> str:
    """The message an entry point of csrc/c_api/store_api.cc wrote into ``err`` (a ctypes buffer)."""
    text = err.value.decode("utf-8", "replace")
    return text.removeprefix("read_windows: ")


def give_credentials(spec: str, cred: Credentials) -> None:
    """Gives the native store ``spec`` the credentials ``cred``, which that store keeps."""
    err = ctypes.create_string_buffer(_ERR)
    key, secret, token = cred
    if store_api().dali_mesh_store_credentials(spec.encode(), key.encode(), secret.encode(), token.encode(), err,
                                               _ERR) < 0:
        raise DataFileError(spec, store_message(err))
