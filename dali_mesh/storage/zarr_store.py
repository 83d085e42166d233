"""A read-only zarr-python store over a byte store (``ByteStore.zarr_store``), so zarr-python reads through
the same client, credentials and version checks as the rest of dali_mesh.

An open of a remote array costs one round trip (:func:`open_array_objects`): its metadata objects by
concurrent GETs (no HEAD) beside the first page of its folder's listing, kept (:class:`OpenedObjects`) for
zarr-python's reads and for the plan that follows, which reuses them and the array parsed from them."""
from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from typing import AsyncIterator, Iterable

from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, Store, SuffixByteRequest
from zarr.core.buffer import Buffer, BufferPrototype

from dali_mesh.storage.errors import DataFileError, MissingFileError

__all__ = ["ARRAY_DOCUMENTS", "ByteZarrStore", "OpenedObjects", "fetch_pool", "open_array_objects", "open_objects"]

#: the metadata objects of an array that zarr-python's open asks for (v3's, v2's array and attributes)
ARRAY_DOCUMENTS = ("zarr.json", ".zarray", ".zattrs")
#: and of a v2 group: read too where the store cannot list (elsewhere the listing says whether they exist)
GROUP_DOCUMENTS = (".zgroup", ".zmetadata")
#: a whole object up to this size is read in one request (no HEAD first: metadata, small chunks)
ONE_READ = 1 << 20
#: the most requests an open (metadata, shard indexes) has in flight at once
OPEN_THREADS = 16
_pool: tuple[int, ThreadPoolExecutor] | None = None


def fetch_pool() -> ThreadPoolExecutor:
    """The threads an open sends its requests on, kept for the process (made again in a forked child,
    where the parent's threads do not run); the C client releases the GIL while it waits."""
    global _pool
    if _pool is None or _pool[0] != os.getpid():
        _pool = (os.getpid(), ThreadPoolExecutor(OPEN_THREADS, thread_name_prefix="dali_mesh-open"))
    return _pool[1]


class OpenedObjects:
    """The objects under ``prefix`` that one open read, each at the version its answer named:
    ``objects`` maps a key to ``(bytes, size, tag)``, or to ``None`` where the object was missing; ``listing``
    the objects the prefix's listing (sent beside those GETs) named, ``None`` where the store cannot list,
    ``complete`` whether it is every page (then a key under the prefix that it lacks is missing)."""

    def __init__(self, prefix: str, objects: dict, listing: dict | None, complete: bool) -> None:
        self.prefix, self.objects, self.listing, self.complete = prefix.rstrip("/"), objects, listing, complete
        #: the zarr-python array the source's open made from these objects, reused by the plan's open
        self.array = None

    def missing(self, key: str) -> bool:
        """Whether this open knows ``key`` is missing (its GET found nothing, or the complete listing lacks it)."""
        if key in self.objects:
            return self.objects[key] is None
        return self.covers(key) and key not in self.listing

    def covers(self, key: str) -> bool:
        """Whether the complete listing says whether ``key`` exists (it lies under the prefix)."""
        return self.listing is not None and self.complete and key.startswith(self.prefix + "/")

    def __repr__(self) -> str:
        return f"OpenedObjects({self.prefix!r}, {len(self.objects)} read, {len(self.listing or ())} listed)"


def _read_whole(store, key: str):
    """``(bytes, size, tag)`` of ``key`` by one GET of its first :data:`ONE_READ` bytes, ``None`` when it
    is missing, or ``...`` when it is larger (read later at one version, as zarr-python asks)."""
    found = store.open_range(key, ONE_READ)
    return found if found is None or len(found[0]) == found[1] else ...


def open_objects(store, prefix: str, names: Iterable[str], *, list_folder: bool = True) -> OpenedObjects:
    """Reads the objects ``prefix/NAME`` of ``store`` (a store with ``open_range``: one GET each, no HEAD)
    and, where it ``supports_listing``, the first page of ``prefix/``'s listing, all at once on
    :func:`fetch_pool`: one round trip. A listing refused (a key allowed GetObject, not ListBucket) is no
    listing: reads then ask the store."""
    pool = fetch_pool()
    listing = pool.submit(store.list_pages, prefix + "/", False, 1) if list_folder and store.supports_listing \
        else None
    gets = {f"{prefix}/{name}": pool.submit(_read_whole, store, f"{prefix}/{name}") for name in names}
    objects, failed = {}, None
    for key, fut in gets.items():  # every answer waited for before an error is raised
        try:
            got = fut.result()
        except Exception as e:  # noqa: BLE001 - the first raised once all are in
            failed = failed or e
            continue
        if got is not ...:
            objects[key] = got
    listed, complete = None, False
    if listing is not None:
        try:
            found, _, complete = listing.result()
            listed = dict(found)
        except DataFileError:
            listed = None
    if failed is not None:
        raise failed
    return OpenedObjects(prefix, objects, listed, complete)


def open_array_objects(store, root: str, name: str | None, *, reuse: bool = False) -> OpenedObjects | None:
    """What the open of array ``name`` (``None``: the store's root, an array or a group holding one) of the
    store rooted at ``root`` reads in its one round trip (:func:`open_objects` of its folder), kept by the
    store (``store.opened``) for the plan that follows; ``reuse``: the plan's open, which takes (and so
    ends) what an earlier open kept, if any. ``None`` for a store that keeps nothing (local files, memory:
    no round trips to save)."""
    kept = getattr(store, "opened", None)
    if kept is None or not hasattr(store, "open_range"):
        return None
    folder = "/".join(p for p in (root.rstrip("/"), (name or "").strip("/")) if p)
    if reuse:
        found = kept.pop(folder, None)
        if found is not None:
            return found
    names = ARRAY_DOCUMENTS + (() if name or store.supports_listing else GROUP_DOCUMENTS)
    opened = kept[folder] = open_objects(store, folder, names)
    return opened


class ByteZarrStore(Store):
    """The objects of ``store`` under ``root`` (a key prefix) as a read-only zarr store."""

    supports_writes = False
    supports_deletes = False
    supports_partial_writes = False
    supports_listing = True

    def __init__(self, store, root: str, opened: OpenedObjects | None = None) -> None:
        # store: a dali_mesh.storage.byte_store.ByteStore (not imported: the base imports this module)
        super().__init__(read_only=True)
        #: the objects an open read at one version (answered from here, not read again)
        self.opened = opened
        self.store = store
        self.supports_listing = store.supports_listing  # zarr-python asks before it lists a group
        self.root = None  # not a local folder (the Zarr reader's FIFO check looks for a root path)
        self.prefix = root.rstrip("/")

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if key else self.prefix

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ByteZarrStore) and other.store == self.store and other.prefix == self.prefix

    def __repr__(self) -> str:
        return f"ByteZarrStore({self.store.name_of(self.prefix)!r})"

    def _get(self, key: str, byte_range: ByteRequest | None) -> bytes | None:
        full = self._key(key)
        opened = self.opened
        if opened is not None and full in opened.objects:
            found = opened.objects[full]
            return None if found is None else _cut(found[0], byte_range)
        if opened is not None and opened.covers(full):
            version = opened.listing.get(full)
            if version is None:
                return None  # not in the complete listing sent with the open: missing
            with self.store.open_version(full, version) as obj:  # at the listed version (If-Match)
                return _cut(obj.read_exactly(version.size, 0), byte_range)
        if byte_range is None or isinstance(byte_range, RangeByteRequest):
            start, n = (0, ONE_READ) if byte_range is None else (byte_range.start, byte_range.end - byte_range.start)
            try:
                data = self.store.read_range(full, start, n)
            except MissingFileError:
                return None
            if byte_range is not None or len(data) < n:
                return data
            # larger: read at one version (its ETag), whatever the number of requests
        version = self.store.stat(full)
        if version is None:
            return None
        start, stop = _bounds(byte_range, version.size)
        if stop <= start:
            return b""
        open_version = getattr(self.store, "open_version", None)
        obj = open_version(full, version) if open_version else self.store.open(full)
        with obj:
            return obj.read_exactly(stop - start, start)

    async def get(self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None) -> Buffer | None:
        opened, full = self.opened, self._key(key)
        if opened is not None and full in opened.objects:  # in memory: no hop to a thread
            found = opened.objects[full]
            return None if found is None else prototype.buffer.from_bytes(_cut(found[0], byte_range))
        data = await asyncio.to_thread(self._get, key, byte_range)
        return None if data is None else prototype.buffer.from_bytes(data)

    async def get_partial_values(self, prototype: BufferPrototype,
                                 key_ranges: Iterable[tuple[str, ByteRequest | None]]) -> list[Buffer | None]:
        return list(await asyncio.gather(*(self.get(k, prototype, r) for k, r in key_ranges)))

    async def exists(self, key: str) -> bool:
        full, opened = self._key(key), self.opened
        if opened is not None and full in opened.objects:
            return opened.objects[full] is not None
        if opened is not None and opened.covers(full):
            return full in opened.listing
        return await asyncio.to_thread(self.store.stat, full) is not None

    async def set(self, key: str, value: Buffer) -> None:
        raise PermissionError(f"{self!r} is read-only")

    async def delete(self, key: str) -> None:
        raise PermissionError(f"{self!r} is read-only")

    async def list(self) -> AsyncIterator[str]:
        async for key in self.list_prefix(""):
            yield key

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        base = self.prefix + "/"
        listed = self._listed(base + prefix)
        objects = listed if listed is not None else (await asyncio.to_thread(self.store.list, base + prefix, False))[0]
        for key, _version in objects:
            yield key[len(base):]

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        base = self._key(prefix.rstrip("/")) + "/"
        listed = self._listed(base)
        if listed is not None:  # one level down of the open's complete listing
            names = {key[len(base):].split("/", 1)[0] for key, _ in listed}
            for name in sorted(names):
                yield name
            return
        objects, prefixes = await asyncio.to_thread(self.store.list, base, True)
        for key, _version in objects:
            yield key[len(base):]
        for p in prefixes:
            yield p[len(base):].rstrip("/")

    def _listed(self, prefix: str) -> list | None:
        """The objects under ``prefix`` from the open's complete listing, or None where it does not cover it."""
        opened = self.opened
        if opened is None or not opened.covers(prefix):
            return None
        return [(k, v) for k, v in opened.listing.items() if k.startswith(prefix)]


def _bounds(byte_range: ByteRequest | None, size: int) -> tuple[int, int]:
    """``(start, stop)`` of ``byte_range`` (zarr's three kinds, or ``None``: all) in an object of ``size`` bytes."""
    if byte_range is None:
        return 0, size
    if isinstance(byte_range, RangeByteRequest):
        return byte_range.start, min(byte_range.end, size)
    if isinstance(byte_range, OffsetByteRequest):
        return byte_range.offset, size
    if isinstance(byte_range, SuffixByteRequest):
        return max(0, size - byte_range.suffix), size
    raise TypeError(f"unknown byte range {byte_range!r}")  # pragma: no cover - zarr's three kinds


def _cut(data: bytes, byte_range: ByteRequest | None) -> bytes:
    """The bytes of ``byte_range`` of a whole object's ``data``."""
    start, stop = _bounds(byte_range, len(data))
    return data[start:stop]
