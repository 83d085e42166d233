"""A read-only zarr-python store over a byte store (``ByteStore.zarr_store`` of the remote stores; the
local store uses zarr-python's own): zarr-python reads metadata and chunks through the same client, credentials,
retries and version checks as the rest of dali_mesh. Listing (groups without consolidated metadata)
uses the store's ``list`` where it ``supports_listing`` (S3 ListObjectsV2)."""
from __future__ import annotations

import asyncio
from typing import AsyncIterator, Iterable

from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, Store, SuffixByteRequest
from zarr.core.buffer import Buffer, BufferPrototype

from dali_mesh.storage.errors import MissingFileError

__all__ = ["ByteZarrStore"]


class ByteZarrStore(Store):
    """The objects of ``store`` under ``root`` (a key prefix) as a read-only zarr store."""

    supports_writes = False
    supports_deletes = False
    supports_partial_writes = False
    supports_listing = True

    def __init__(self, store, root: str) -> None:
        # store: a dali_mesh.storage.byte_store.ByteStore (not imported: the base imports this module)
        super().__init__(read_only=True)
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

    #: a whole object up to this size is read in one request (no HEAD first: metadata, small chunks)
    ONE_READ = 1 << 20

    def _get(self, key: str, byte_range: ByteRequest | None) -> bytes | None:
        full = self._key(key)
        if byte_range is None or isinstance(byte_range, RangeByteRequest):
            start, n = (0, self.ONE_READ) if byte_range is None else (byte_range.start, byte_range.end - byte_range.start)
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
        size = version.size
        if byte_range is None:
            start, stop = 0, size
        elif isinstance(byte_range, RangeByteRequest):
            start, stop = byte_range.start, min(byte_range.end, size)
        elif isinstance(byte_range, OffsetByteRequest):
            start, stop = byte_range.offset, size
        elif isinstance(byte_range, SuffixByteRequest):
            start, stop = max(0, size - byte_range.suffix), size
        else:  # pragma: no cover - zarr's three kinds
            raise TypeError(f"unknown byte range {byte_range!r}")
        if stop <= start:
            return b""
        open_version = getattr(self.store, "open_version", None)
        obj = open_version(full, version) if open_version else self.store.open(full)
        with obj:
            return obj.read_exactly(stop - start, start)

    async def get(self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None) -> Buffer | None:
        data = await asyncio.to_thread(self._get, key, byte_range)
        return None if data is None else prototype.buffer.from_bytes(data)

    async def get_partial_values(self, prototype: BufferPrototype,
                                 key_ranges: Iterable[tuple[str, ByteRequest | None]]) -> list[Buffer | None]:
        return [await self.get(k, prototype, r) for k, r in key_ranges]

    async def exists(self, key: str) -> bool:
        return await asyncio.to_thread(self.store.stat, self._key(key)) is not None

    async def set(self, key: str, value: Buffer) -> None:
        raise PermissionError(f"{self!r} is read-only")

    async def delete(self, key: str) -> None:
        raise PermissionError(f"{self!r} is read-only")

    async def list(self) -> AsyncIterator[str]:
        async for key in self.list_prefix(""):
            yield key

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        base = self.prefix + "/"
        objects, _ = await asyncio.to_thread(self.store.list, base + prefix, False)
        for key, _version in objects:
            yield key[len(base):]

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        base = self._key(prefix.rstrip("/")) + "/"
        objects, prefixes = await asyncio.to_thread(self.store.list, base, True)
        for key, _version in objects:
            yield key[len(base):]
        for p in prefixes:
            yield p[len(base):].rstrip("/")
