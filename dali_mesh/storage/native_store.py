"""The one binding of the byte stores' C entry points (csrc/c_api/store_api.cc), and :class:`NativeStore`:
the base of every Python store whose versions, reads and listings are a native store's (remote, memory)."""
from __future__ import annotations

import ctypes
import json
import re

from typing import Sequence

from dali_mesh.storage import listing
from dali_mesh.storage.byte_store import ByteStore, StoredObject, Version, read_into
from dali_mesh.storage.credentials import Credentials
from dali_mesh.storage.errors import DataFileError, FileChangedError, MissingFileError, TruncatedFileError

__all__ = ["NativeObject", "NativeStore", "call", "fetch_counters", "give_credentials", "have_native_http",
           "store_api", "store_error", "store_message", "store_settings"]

_ERR = 4096
#: the longest version tag (ETag) a head or an open takes
_TAG = 1024


def store_api():
    """The kernels library with the byte stores' C entry points bound: the process's one native core, whose
    stores, credentials, caches and counters Python and the DALI plugin (which links it) share."""
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
    """Whether this build reads remote objects (it was built with libcurl)."""
    try:
        return bool(store_api().dali_mesh_store_have_http())
    except Exception:  # noqa: BLE001 - no kernels library: no native reads of any kind
        return False


def store_settings(spec: str) -> dict:
    """The settings of the store ``spec`` as C++ parsed them (``StoreSettings``; for ``s3``/``http`` the
    ``HttpStoreConfig`` fields, defaults filled in), also without libcurl. Raises ValueError for a spec its
    kind refuses."""
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


def store_error(name: str, message: str) -> DataFileError:
    """The error of a native store's ``message`` about the object ``name``, of the class its words say (no such
    object, replaced or changed while read, shorter than planned), the name said once: "NAME (bytes A-B): why"
    becomes "bytes A-B: why" after it."""
    message = re.sub(r"^\((.*?)\):\s*", r"\1: ", message.removeprefix(name).lstrip(" :"))
    if "no such object" in message:
        return MissingFileError(name, message)
    if "replaced" in message or "changed while it was read" in message:
        return FileChangedError(name, message)
    if "shorter than planned" in message or "past the end" in message:
        return TruncatedFileError(name, message)
    return DataFileError(name, message)


def call(name: str, entry: str, spec: str, *args) -> int:
    """``entry`` of the store C API for the store ``spec`` with ``args`` and a message buffer: its result (-2:
    the open's "no such object"), or its message raised for the object ``name`` (:func:`store_error`)."""
    err = ctypes.create_string_buffer(_ERR)
    got = getattr(store_api(), entry)(spec.encode(), *args, err, _ERR)
    if got == -1:
        raise store_error(name, store_message(err))
    return got


def give_credentials(spec: str, cred: Credentials) -> None:
    """Gives the native store ``spec`` the credentials ``cred``, which that store keeps."""
    key, secret, token = cred
    call(spec, "dali_mesh_store_credentials", spec, key.encode(), secret.encode(), token.encode())


class NativeObject(StoredObject):
    """One object of a :class:`NativeStore` opened at its version: every read names that version (its tag and
    size; an object store sends the tag as If-Match), and the native store refuses another."""

    def __init__(self, store: "NativeStore", key: str, version: Version) -> None:
        self.store, self.key = store, key
        self._version = version

    @property
    def version(self) -> Version:
        return self._version

    def _read(self, dst, n: int, offset: int) -> int:
        """``n`` bytes at ``offset`` (fewer at the end) into the writable buffer ``dst``: the bytes read."""
        return self.store._call(self.key, "dali_mesh_store_get", self.store.encoded(self.key), offset, n,
                                self._version.tag.encode(), self._version.size, (ctypes.c_char * n).from_buffer(dst))

    def readv(self, buffers: Sequence, offset: int) -> int:
        return read_into(buffers, offset, self._version.size, self._read)

    def check_unchanged(self) -> None:
        if self.store.stat(self.key) != self._version:
            raise FileChangedError(self.name, "changed while it was read (it was rewritten or deleted since it was "
                                              "opened); the window is not returned")


class NativeStore(ByteStore):
    """A store whose objects the native store of its spec holds or reaches (the remote stores, the memory
    store): Python's reads are that store's, through the C API, as the native reader's are."""

    native = True
    #: the objects it opens
    opens = NativeObject

    def _call(self, key: str, entry: str, *args) -> int:
        """:func:`call` of ``entry`` for this store, its errors naming ``key``."""
        return call(self.name_of(key), entry, self.spec, *args)

    def encoded(self, key: str) -> bytes:
        """``key`` as the C API takes it: UTF-8, a key listed from bytes that are not UTF-8 given back as those
        bytes (surrogateescape); a NUL, which would cut it where C reads it, refused."""
        if "\0" in key:
            raise DataFileError(self.name_of(key.replace("\0", "\\x00")), "a key holds no NUL (the C API reads keys "
                                                                            "as C strings)")
        return key.encode("utf-8", "surrogateescape")

    def stat(self, key: str) -> Version | None:
        size, tag = ctypes.c_int64(), ctypes.create_string_buffer(_TAG)
        found = self._call(key, "dali_mesh_store_head", self.encoded(key), ctypes.byref(size), tag, _TAG)
        return Version(size.value, -1, tag.value.decode()) if found else None

    def open_version(self, key: str, version: Version) -> NativeObject:
        """``key`` at a version known already (a listing's): no request; its reads fail if the key holds another."""
        return self.opens(self, key, version)

    def list(self, prefix: str, delimiter: bool = True) -> tuple[list[tuple[str, Version]], list[str]]:
        """The objects under ``prefix`` (keys and versions) and, with ``delimiter``, the prefixes one level down
        (each ending with '/'), every page. A listing that never ends (a token repeated, more than
        :data:`~dali_mesh.storage.listing.LIST_PAGES` pages or ``LIST_BYTES`` bytes) is an error."""
        return self.list_pages(prefix, delimiter)[:2]

    def list_pages(self, prefix: str, delimiter: bool = True,
                   pages: int | None = None) -> tuple[list[tuple[str, Version]], list[str], bool]:
        """:meth:`list` of at most ``pages`` pages (an open lists the first page beside its metadata GETs, one
        request, and lists the rest only when a plan needs it): ``(objects, prefixes, complete)``, ``complete``
        False when the listing goes on past them. The bounds are :mod:`~dali_mesh.storage.listing`'s, read when
        the listing starts."""
        name, where = self.name_of(prefix), self.encoded(prefix)

        def page(token: bytes, out, size: int) -> int:
            return call(name, "dali_mesh_store_list", self.spec, where, int(delimiter), token, out, size)

        return listing.list_all(page, name, pages=pages, most_pages=listing.LIST_PAGES,
                                most_bytes=listing.LIST_BYTES, page_bytes=listing.LIST_PAGE_BYTES)
