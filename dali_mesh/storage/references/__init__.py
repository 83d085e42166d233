"""The reference store: a Kerchunk reference set (JSON or a Parquet folder, :mod:`.parquet`) as a byte store,
``reference://<location of refs.json>``. Each key is inline bytes or a byte range of another location, read
through that location's own store; the set is read once by fsspec's own reader (never a parser written
here). It is a scheme, not a ``.json`` suffix, because locations are resolved by scheme only (a ``.json``
file may be a Zarr v3 ``zarr.json``). Which files a set may name and which options sign them:
:mod:`.targets`. The full story: docs/remote-storage.md, "Kerchunk reference sets".
"""
from __future__ import annotations

import importlib
import json
import numbers
import threading
from typing import Sequence

from dali_mesh.storage.byte_store import (ByteStore, StoredObject, Version, read_exactly, scatter, split_listing,
                                          write_spec)
from dali_mesh.storage.errors import (DataFileError, FileChangedError, MissingFileError, NotRegularFileError,
                                     TruncatedFileError, needed)
from dali_mesh.storage.names import shown
from dali_mesh.storage.references.parquet import parquet_document
from dali_mesh.storage.references.targets import check_urls, resolve_targets, take_options

__all__ = ["ReferenceStore", "resolve_reference"]

class InlineObject(StoredObject):
    """A key whose bytes the reference set holds itself: fixed for the store's life."""

    def __init__(self, store: "ReferenceStore", key: str, data: bytes) -> None:
        self.store, self.key, self._data = store, key, data

    @property
    def version(self) -> Version:
        return Version(len(self._data), -1, "inline")

    def readv(self, buffers: Sequence, offset: int) -> int:
        return scatter(memoryview(self._data)[max(0, offset):], buffers)

    def check_unchanged(self) -> None:
        """Inline bytes are the reference set's, read once: they never change."""


class RangeObject(StoredObject):
    """A key that is ``length`` bytes at ``start`` of a referenced file, opened at that file's version."""

    def __init__(self, store: "ReferenceStore", key: str, target: StoredObject, start: int, length: int) -> None:
        self.store, self.key = store, key
        self.target, self.start, self.length = target, start, length

    @property
    def version(self) -> Version:
        return _range_version(self.target.version, self.length)

    def readv(self, buffers: Sequence, offset: int) -> int:
        left = self.length - offset
        if left <= 0:
            return 0
        # the buffers cut at the range's end: a read never reaches the file's bytes past the key's
        views = []
        for buf in buffers:
            view = memoryview(buf).cast("B")[:left]
            if len(view):
                views.append(view)
            left -= len(view)
            if left <= 0:
                break
        return self.target.readv(views, self.start + offset)

    def check_unchanged(self) -> None:
        try:
            self.target.check_unchanged()
        except FileChangedError as e:
            raise FileChangedError(self.name, f"changed while it was read: its referenced file {e}") from None

    def close(self) -> None:
        self.target.close()


def _range_version(target: Version, length: int) -> Version:
    """The version of a ``length``-byte range of a file at version ``target`` (the file's size goes into the
    tag: a file rewritten to another size is another version)."""
    return Version(length, target.mtime_ns, f"{target.size}:{target.tag}")


class ReferenceStore(ByteStore):
    """The keys of the Kerchunk reference set at ``location``, read with ``options`` (the source's
    ``storage_options``, for the set's file and the files it refers to)."""

    native = False
    supports_listing = True  # the keys are the set's
    locates = True  # a key is a range of another store's file (locate)

    def __init__(self, location, options: dict | None = None) -> None:
        from dali_mesh.storage import resolve_locations  # noqa: PLC0415 - the package imports this module

        # the set's own options (allow_private_references, reference_options) are no store's
        self._options, self._allow_private, self._per_family = take_options(options)
        (self.location,) = resolve_locations([location], self._options)
        self.spec = write_spec("reference", {"refs": str(self.location)})
        self._lock = threading.Lock()
        self._fs = None  # fsspec's ReferenceFileSystem, at the first use
        self._raw = b""
        self._targets: dict[str, str] = {}  # a referenced URL -> its resolved location
        self._versions: dict | None = None  # a referenced URL -> its file's version (None: missing), once
        self._urls_of_files: dict = {}  # (a referenced file's store spec, key) -> its URL

    # ---- the reference set --------------------------------------------------------------------------
    def _load(self):
        """The set, read and resolved at the first use (once, under a lock)."""
        if self._fs is None:
            with self._lock:
                if self._fs is None:
                    self._take(self._read_set(), None)
        return self._fs

    def _read_set(self) -> bytes:
        from dali_mesh.storage import store_of  # noqa: PLC0415

        store, key = store_of(self.location)
        try:
            with store.open(key, "reference file") as obj:
                raw = read_exactly(obj, obj.size, 0)
                obj.check_unchanged()
        except (MissingFileError, NotRegularFileError) as e:
            # no file: a folder of Parquet references (an object store has no folders: its keys under
            # the name), read as the version 1 document it is, or no set at all
            document = parquet_document(store, key, self.location)
            if document is None:
                # not a MissingFileError: a zarr reader takes that for a missing key, and the array for none
                raise DataFileError(e.path, "no such reference file, nor a folder of Parquet references (with "
                                            "a .zmetadata); check the location after reference://") from None
            raw = json.dumps(document).encode()
        return raw

    def _take(self, raw: bytes, targets: dict | None) -> None:
        """Parses ``raw`` with fsspec and resolves every referenced file (``targets``: those already resolved)."""
        try:
            document = json.loads(raw)
        except ValueError as e:
            raise DataFileError(self.location, f"is not a JSON reference set ({e})") from None
        if not isinstance(document, dict):
            raise DataFileError(self.location, "is not a JSON reference set (the document is not one object)")
        # fsspec only when a set is read
        cls = needed("reading Kerchunk reference sets (reference:// locations) needs fsspec and kerchunk",
                     lambda: importlib.import_module("fsspec.implementations.reference").ReferenceFileSystem)
        try:
            # fs={}: no filesystem of fsspec's made for the referenced files (this store reads them);
            # simple_templates=False where there are generated keys: fsspec renders those with jinja2 only
            fs = cls(fo=document, fs={}, simple_templates="gen" not in document, skip_instance_cache=True)
        except (ValueError, KeyError, TypeError, ImportError) as e:
            raise DataFileError(self.location, f"cannot be read as a Kerchunk reference set ({type(e).__name__}: "
                                               f"{e})") from None
        if targets is None:
            urls = check_urls(fs.references, self.location, self.name_of)
            targets = resolve_targets(urls, self._options, self.location, allow_private=self._allow_private,
                                      per_family=self._per_family)
        self._raw, self._targets, self._fs = raw, targets, fs

    def _part(self, key: str):
        """``(bytes, None, None)`` for inline bytes, ``(url, start, stop)`` for a range (``None``s: the whole
        file), or ``None`` when the set has no ``key``; resolved by fsspec's ``_cat_common``."""
        fs = self._load()
        try:
            url, start, stop = fs._cat_common(key)
        except FileNotFoundError:
            return None
        except (TypeError, ValueError) as e:  # [url, "12", 4]: fsspec adds what it was given
            raise DataFileError(self.name_of(key), f"has a reference that is not [url], [url, offset, length] "
                                                   f"({type(e).__name__}: {e}); the reference set is corrupt") from None
        if isinstance(url, bytes) or (start is None and stop is None):
            return url, start, stop
        # a crafted or corrupt set: an offset or a length that is no whole number, a negative offset, an
        # empty range (read as a plan error, an OSError or a reshape's complaint, or truncated to an int)
        if not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in (start, stop)) or \
                start < 0 or stop <= start:
            raise DataFileError(self.name_of(key), f"refers to bytes {start!r}..{stop!r} of {shown(url)}: an offset "
                                                   "must be a whole number >= 0 and a length one > 0; the reference "
                                                   "set is corrupt")
        return url, int(start), int(stop)

    def name_of(self, key: str) -> str:
        key = key.removeprefix("/")
        return f"reference://{self.location}" + (f"#{key}" if key else "")

    # ---- reads ------------------------------------------------------------------------------------------
    def open(self, key: str, what: str = "file", *, direct: bool = False) -> StoredObject:
        # a ByteZarrStore rooted at the store's root ("") asks for "/name": the set's "name"
        key = key.removeprefix("/")
        part = self._part(key)
        if part is None:
            raise MissingFileError(self.name_of(key), f"no such {what}: the reference set has no key {key!r}")
        url, start, stop = part
        if stop is None and start is None and isinstance(url, bytes):
            return InlineObject(self, key, url)
        store, target_key = self._target(key, url)
        try:
            obj = store.open(target_key, "referenced file")
        except MissingFileError as e:
            raise DataFileError(self.name_of(key), f"refers to {shown(url)}, which does not exist ({e}); the "
                                                   "reference set names a file moved or deleted since it was "
                                                   "made") from None
        start = start or 0
        stop = obj.size if stop is None else stop
        if stop > obj.size:
            obj.close()
            raise TruncatedFileError(self.name_of(key), f"refers to bytes {start}..{stop} of {shown(url)}, which holds "
                                                        f"{obj.size} bytes: the file is shorter than the reference "
                                                        "set says (truncated or replaced since it was referenced)")
        return RangeObject(self, key, obj, start, stop - start)

    def locate(self, key: str) -> tuple[ByteStore, str, int, int] | None:
        """``(store, key, offset, length)`` of the file range that holds ``key``, ``None`` for inline bytes;
        :class:`~dali_mesh.storage.errors.MissingFileError` for a key the set lacks. Reads nothing but a
        whole-file reference's size."""
        key = key.removeprefix("/")
        part = self._part(key)
        if part is None:
            raise MissingFileError(self.name_of(key), f"no such key in the reference set: {key!r}")
        url, start, stop = part
        if isinstance(url, bytes) and start is None:
            return None
        store, target_key = self._target(key, url)
        if stop is None:  # a whole file: its size is its length
            version = self.file_version(url)
            if version is None:
                raise DataFileError(self.name_of(key), f"refers to {shown(url)}, which does not exist")
            start, stop = 0, version.size
        return store, target_key, start, stop - start

    def located_version(self, store: ByteStore, key: str) -> Version | None:
        """That file's version as :meth:`file_version` saw it."""
        self._look_at_files()
        url = self._urls_of_files.get((store.spec, key))
        return store.stat(key) if url is None else self._versions[url]

    def file_version(self, url: str) -> Version | None:
        """The version of the referenced file ``url`` (``None``: missing). All files are looked at once,
        together, at the first ask, and kept (N files: N requests sent together, not N per variable);
        every read checks its file again."""
        self._look_at_files()
        return self._versions.get(url)

    def _look_at_files(self) -> None:
        if self._versions is not None:
            return
        from dali_mesh.storage import store_of  # noqa: PLC0415
        from dali_mesh.storage.zarr_store import fetch_pool  # noqa: PLC0415

        self._load()
        with self._lock:
            if self._versions is None:
                files = {url: store_of(location) for url, location in self._targets.items()}
                looks = {url: fetch_pool().submit(store.stat, key) for url, (store, key) in files.items()}
                self._urls_of_files = {(store.spec, key): url for url, (store, key) in files.items()}
                self._versions = {url: look.result() for url, look in looks.items()}

    def _target(self, key: str, url):
        from dali_mesh.storage import store_of  # noqa: PLC0415

        if url not in self._targets:  # a reference without a URL (fsspec's "target", never set here)
            raise DataFileError(self.name_of(key), f"refers to no file ({url!r}); the reference set is incomplete")
        return store_of(self._targets[url])

    def stat(self, key: str) -> Version | None:
        key = key.removeprefix("/")
        if self._part(key) is None:
            return None
        with self.open(key) as obj:
            return obj.version

    def list(self, prefix: str, delimiter: bool = True) -> tuple[list[tuple[str, Version]], list[str]]:
        """:meth:`ByteStore.list` of the set's keys (each referenced file looked at once)."""
        return split_listing(sorted(self._load().references), prefix, delimiter, self._listed_version)

    def _listed_version(self, key: str) -> Version:
        url, start, stop = self._part(key)
        if isinstance(url, bytes) and start is None:
            return Version(len(url), -1, "inline")
        self._target(key, url)  # a reference without a URL is named
        version = self.file_version(url)
        if version is None:
            raise DataFileError(self.name_of(key), f"refers to {shown(url)}, which does not exist; the reference set "
                                                   "names a file moved or deleted since it was made")
        start = start or 0
        return _range_version(version, (version.size if stop is None else stop) - start)

    # ---- processes and credentials ------------------------------------------------------------------------
    def _stores(self) -> list:
        from dali_mesh.storage import stores_of  # noqa: PLC0415

        self._load()  # the files' stores are known once the set is read
        return stores_of([self.location, *self._targets.values()])

    def credentials_state(self) -> tuple | None:
        """The credentials of the stores of the set's file and of the files it refers to, by their specs."""
        from dali_mesh.storage import carry_credentials  # noqa: PLC0415

        carried = carry_credentials(self._stores())
        return (self.spec, carried) if carried else None

    def take_credentials(self, credentials) -> None:
        from dali_mesh.storage import attach_credentials  # noqa: PLC0415

        attach_credentials(self._stores(), credentials)

    def __reduce__(self):
        # the set as read here (a worker reads these bytes, never a set rewritten since) and its files'
        # stores, which pickle without their credentials (credentials_state carries those)
        self._load()
        return (_unpickle, (self.location, self._raw, self._targets))

    def __repr__(self) -> str:
        return f"ReferenceStore({str(self.location)!r})"


def _unpickle(location, raw: bytes, targets: dict) -> ReferenceStore:
    store = ReferenceStore(location)
    store._take(raw, targets)
    return store


def resolve_reference(location: str, options: dict) -> tuple[ReferenceStore, str]:
    """The store of ``reference://<location of a reference set>`` and its root key (``""``)."""
    refs = location.split("://", 1)[1]
    if not refs:
        raise DataFileError(location, "names no reference set: give reference://<path or URL of refs.json>")
    return ReferenceStore(refs, options), ""
