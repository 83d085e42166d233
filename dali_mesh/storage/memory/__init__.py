"""The memory store: objects held in this process, ``memory://<name>/<key>``, written with
:meth:`MemoryStore.put` and read as every store's objects are, by Python's readers and by the native reader
(``csrc/storage/memory_store.cc``, reached through the byte stores' C API as the remote stores are). A format
written into memory reads back without a disk or a server: what tests use it for.

Each name is one store: ``MemoryStore("a")`` and ``MemoryStore("b")`` hold other objects, two stores of one
name the same ones. A write is a new version (tagged by the store's counter): an object opened reads the
version it opened, and its ``check_unchanged`` refuses it once its key holds another. Keys are any text
but NUL.

The objects live in the process that wrote them: a pickled store names them, and another process (one of
DALI's workers) finds none. They are held once per process, in the native core (the kernels library, which
the DALI plugin links): a write is seen at once by Python's readers, a PlanReader and ``fn.read_windows``.
"""
from __future__ import annotations

import ctypes
import re
import threading
from typing import Sequence

from dali_mesh.storage.byte_store import ByteStore, StoredObject, Version, write_spec
from dali_mesh.storage.errors import DataFileError, FileChangedError, MissingFileError, TruncatedFileError
from dali_mesh.storage.listing import list_all
from dali_mesh.storage.native_store import store_api, store_message

__all__ = ["MemoryObject", "MemoryStore", "resolve_memory"]

#: a store's name: its spec's one setting, and what its locations hold between "memory://" and the key
_NAME = re.compile(r"[A-Za-z0-9._-]+")
_ERR = 4096
_TAG = 1024

#: one write at a time, so that the version :meth:`MemoryStore.put` returns (its write, then a look at the key) is the
#: one its write made, not another thread's write or delete of the key in between
_writes = threading.Lock()


def _encoded(key: str) -> bytes:
    # surrogateescape: a key listed from bytes that are not UTF-8 is written back as those bytes
    return key.encode("utf-8", "surrogateescape")


class MemoryObject(StoredObject):
    """One object opened at its version; every read is of that version or a
    :class:`~dali_mesh.storage.errors.FileChangedError` (the store checks the tag)."""

    def __init__(self, store: "MemoryStore", key: str, version: Version) -> None:
        self.store, self.key = store, key
        self._version = version

    @property
    def version(self) -> Version:
        return self._version

    def readv(self, buffers: Sequence, offset: int) -> int:
        views = [memoryview(b).cast("B") for b in buffers]
        want = min(sum(len(v) for v in views), self._version.size - offset)
        if want <= 0:
            return 0
        if len(views) == 1 and not views[0].readonly:
            return self.store._get(self.key, views[0], want, offset, self._version)
        staged = bytearray(want)
        got = self.store._get(self.key, staged, want, offset, self._version)
        done = 0
        for v in views:
            take = min(len(v), got - done)
            v[:take] = staged[done:done + take]
            done += take
        return got

    def check_unchanged(self) -> None:
        now = self.store.stat(self.key)
        if now != self._version:
            raise FileChangedError(self.name, "changed while it was read (it was rewritten or deleted since it was "
                                              "opened); the window is not returned")


class MemoryStore(ByteStore):
    """The objects of the memory store ``name`` (see the module's doc)."""

    local = False
    native = True
    supports_listing = True

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(f"a memory store's name is letters, digits, '.', '-' and '_', got {name!r}")
        self.name = name
        self.spec = write_spec("memory", {"name": name})

    def name_of(self, key: str) -> str:
        return f"memory://{self.name}/{key}"

    # ---- writes -----------------------------------------------------------------------------------------
    def put(self, key: str, data) -> Version:
        """Writes ``data`` (bytes or any buffer) as the object ``key``, a new version; returns it."""
        # bytes pass as they are (the store copies them); another buffer is copied into bytes first
        payload = data if isinstance(data, bytes) else memoryview(data).cast("B").tobytes()
        with _writes:
            self._call(key, "dali_mesh_store_put", _encoded(self._checked(key)), payload, len(payload), None)
            version = self.stat(key)
        return version

    def delete(self, key: str) -> bool:
        """Removes the object ``key``; ``False`` when there was none."""
        with _writes:
            found = self._call(key, "dali_mesh_store_delete", _encoded(self._checked(key)))
        return found == 1

    # ---- reads ------------------------------------------------------------------------------------------
    def stat(self, key: str) -> Version | None:
        size, tag = ctypes.c_int64(), ctypes.create_string_buffer(_TAG)
        found = self._call(key, "dali_mesh_store_head", _encoded(self._checked(key)), ctypes.byref(size), tag, _TAG)
        return Version(size.value, -1, tag.value.decode()) if found else None

    def open(self, key: str, what: str = "file", *, direct: bool = False) -> MemoryObject:
        version = self.stat(key)
        if version is None:
            raise MissingFileError(self.name_of(key), f"no such {what} (no such object in this process's memory "
                                                      "store); check the key")
        return MemoryObject(self, key, version)

    def open_version(self, key: str, version: Version) -> MemoryObject:
        """``key`` at a version known already (a listing's): its reads fail if the key holds another."""
        return MemoryObject(self, key, version)

    def pins(self, version: Version | None) -> bool:
        """Every read names the version it reads (its tag), and the store refuses another."""
        return version is not None and bool(version.tag)

    def _get(self, key: str, dst, n: int, offset: int, version: Version | None) -> int:
        """``n`` bytes of ``key`` at ``offset`` into the writable buffer ``dst`` (fewer at the end of the
        object), of ``version`` when given; the bytes read."""
        buf = (ctypes.c_char * len(dst)).from_buffer(dst)
        tag, size = (version.tag, version.size) if version is not None else ("", -1)
        return self._call(key, "dali_mesh_store_get", _encoded(key), offset, n, tag.encode(), size, buf)

    def list(self, prefix: str, delimiter: bool = True) -> tuple[list[tuple[str, Version]], list[str]]:
        """The objects under ``prefix`` (keys and versions) and, with ``delimiter``, the prefixes one level
        down (each ending with '/'), read page by page as the store lists them (dali_mesh/storage/listing.py:
        a listing that would never end is an error)."""
        where = _encoded(self._checked(prefix))

        def call(token: bytes, out, size: int) -> int:
            return self._call(prefix, "dali_mesh_store_list", where, int(delimiter), token, out, size)

        objects, prefixes, _ = list_all(call, self.name_of(prefix))
        return objects, prefixes

    # ---- the C API ----------------------------------------------------------------------------------------
    def _checked(self, key: str) -> str:
        if "\0" in key:
            raise DataFileError(self.name_of(key.replace("\0", "\\x00")), "a key holds no NUL (the C API reads keys "
                                                                           "as C strings)")
        return key

    def _call(self, key: str, entry: str, *args) -> int:
        """``entry`` of the store C API (:func:`~dali_mesh.storage.remote.store_api`) for this store with
        ``args``, and the message-buffer pair: its result, or the error it names raised for ``key``."""
        err = ctypes.create_string_buffer(_ERR)
        got = getattr(store_api(), entry)(self.spec.encode(), *args, err, _ERR)
        if got < 0:
            self._raise(key, store_message(err))
        return got

    def _raise(self, key: str, message: str):
        name = self.name_of(key)
        message = message.removeprefix(name).lstrip(": ")
        if "no such object" in message:
            raise MissingFileError(name, message)
        if "replaced" in message or "changed while it was read" in message:
            raise FileChangedError(name, message)
        if "shorter than planned" in message:
            raise TruncatedFileError(name, message)
        raise DataFileError(name, message)

    def __reduce__(self):
        return (MemoryStore, (self.name,))

    def __repr__(self) -> str:
        return f"MemoryStore({self.name!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, MemoryStore) and other.name == self.name

    def __hash__(self) -> int:
        return hash(("memory", self.name))


def resolve_memory(location: str, options: dict) -> tuple[MemoryStore, str]:
    """The store and key of ``memory://<name>/<key>`` (no ``storage_options``)."""
    if options:
        raise ValueError(f"storage_options for memory:// locations take nothing, got {sorted(options)}")
    name, slash, key = location.split("://", 1)[1].partition("/")
    if not _NAME.fullmatch(name) or not slash or not key:
        raise DataFileError(location, "is not a memory://<name>/<key> location (a name of letters, digits, '.', "
                                      "'-' and '_', and a key)")
    return MemoryStore(name), key
