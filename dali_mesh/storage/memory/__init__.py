"""The memory store: objects held in this process, ``memory://<name>/<key>``, written with
:meth:`MemoryStore.put` and read by Python's and the native reader (``csrc/storage/memory_store.cc``); the
worked example of docs/extending.md. Each name is one store; a write is a new version, which an object opened
before refuses. Keys are any text but NUL. The objects live in the native core of the process that wrote
them: a pickled store names them, and another process (a DALI worker) finds none.
"""
from __future__ import annotations

import re
import threading

from dali_mesh.storage.byte_store import Version, write_spec
from dali_mesh.storage.errors import DataFileError, MissingFileError
from dali_mesh.storage.native_store import NativeObject, NativeStore

__all__ = ["MemoryStore", "resolve_memory"]

#: a store's name: its spec's one setting, and what its locations hold between "memory://" and the key
_NAME = re.compile(r"[A-Za-z0-9._-]+")

#: one write at a time, so that the version :meth:`MemoryStore.put` returns (its write, then a look at the key) is the
#: one its write made, not another thread's write or delete of the key in between
_writes = threading.Lock()


class MemoryStore(NativeStore):
    """The objects of the memory store ``name`` (see the module's doc): an object opened reads the version it
    opened, or a :class:`~dali_mesh.storage.errors.FileChangedError` (the store checks the tag)."""

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
            self._call(key, "dali_mesh_store_put", self.encoded(key), payload, len(payload), None)
            version = self.stat(key)
        return version

    def delete(self, key: str) -> bool:
        """Removes the object ``key``; ``False`` when there was none."""
        with _writes:
            found = self._call(key, "dali_mesh_store_delete", self.encoded(key))
        return found == 1

    # ---- reads ------------------------------------------------------------------------------------------
    def open(self, key: str, what: str = "file", *, direct: bool = False) -> NativeObject:
        version = self.stat(key)
        if version is None:
            raise MissingFileError(self.name_of(key), f"no such {what} (no such object in this process's memory "
                                                      "store); check the key")
        return NativeObject(self, key, version)

    def pins(self, version: Version | None) -> bool:
        """Every read names the version it reads (its tag), and the store refuses another."""
        return version is not None and bool(version.tag)

    def __reduce__(self):
        return (MemoryStore, (self.name,))

    def __repr__(self) -> str:
        return f"MemoryStore({self.name!r})"


def resolve_memory(location: str, options: dict) -> tuple[MemoryStore, str]:
    """The store and key of ``memory://<name>/<key>`` (no ``storage_options``)."""
    if options:
        raise ValueError(f"storage_options for memory:// locations take nothing, got {sorted(options)}")
    name, slash, key = location.split("://", 1)[1].partition("/")
    if not _NAME.fullmatch(name) or not slash or not key:
        raise DataFileError(location, "is not a memory://<name>/<key> location (a name of letters, digits, '.', "
                                      "'-' and '_', and a key)")
    return MemoryStore(name), key
