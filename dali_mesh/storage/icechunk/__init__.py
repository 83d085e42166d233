"""The Icechunk store: one snapshot of an Icechunk repository as a byte store, ``icechunk://<repository>``
(a local folder, or ``s3://bucket/prefix`` with the source's ``storage_options``), read through the
``icechunk`` library only, never a manifest parsed here. The version (``branch``, ``tag`` or ``snapshot``,
or ``@<snapshot id>`` in the location) is resolved once to a snapshot id, which is in the store's spec and in
every name of its keys. Every call of the library is bounded by ``timeout``
(:mod:`~dali_mesh.storage.icechunk.deadline`); the native reader's reads are answered here through ctypes
callbacks (:mod:`~dali_mesh.storage.icechunk.callbacks`); a forked process refuses to read
(:mod:`~dali_mesh.storage.icechunk.forks`). The full story (versions, time, virtual chunks, worker
processes): docs/remote-storage.md, "Icechunk repositories".
"""
from __future__ import annotations

import asyncio
import logging
import threading
from typing import Sequence

from dali_mesh._kernels.library import KernelsError
from dali_mesh.storage.byte_store import ByteStore, StoredObject, Version, read_into, scatter, split_listing, write_spec
from dali_mesh.storage.errors import DataFileError, MissingFileError
from dali_mesh.storage.icechunk.callbacks import EXIT_WAIT_S, bind_native_reads, unbind_native_reads
from dali_mesh.storage.icechunk.deadline import (DEFAULT_TIMEOUT_S, IcechunkExitError, IcechunkTimeoutError,
                                                 bounded, call, timeout_of)
from dali_mesh.storage.icechunk.forks import ForkedProcessError, check_process
from dali_mesh.storage.icechunk.repository import (SECRETS, VERSION_OPTIONS, check_options, normal_repository,
                                                   open_repository, readonly_session, short, spec_fields,
                                                   split_location, why_of)
from dali_mesh.storage.icechunk.virtual import VIRTUAL_OPTION, check_local_virtual_files

__all__ = ["DEFAULT_TIMEOUT_S", "EXIT_WAIT_S", "ForkedProcessError", "IcechunkExitError", "IcechunkStore",
           "IcechunkTimeoutError", "bind_native_reads", "open_repository", "resolve_icechunk", "unbind_native_reads"]

log = logging.getLogger(__name__)


async def _collect(names) -> list:
    """The items of an async iterator (the session store's listings)."""
    return [name async for name in names]


class IcechunkObject(StoredObject):
    """A key of the snapshot: its bytes never change (a commit makes another snapshot)."""

    def __init__(self, store: "IcechunkStore", key: str, size: int) -> None:
        self.store, self.key, self._size = store, key, size

    @property
    def version(self) -> Version:
        return Version(self._size, -1, self.store.tag)

    def readv(self, buffers: Sequence, offset: int) -> int:
        return read_into(buffers, offset, self._size,
                         lambda dst, n, at: scatter(self.store.read(self.key, at, n), [dst]))

    def check_unchanged(self) -> None:
        """A snapshot's keys are immutable: a read of a collected snapshot fails itself, naming it."""


class IcechunkStore(ByteStore):
    """The keys of ``repository`` (a local folder or ``s3://bucket/prefix``) at the snapshot ``snapshot``,
    read with ``options`` (an s3:// repository's storage_options, the bounds of the library's calls)."""

    native = True  # the native reader's reads are answered here (bind_native_reads: csrc/storage/callback_store.cc)
    supports_listing = True
    versioned = True  # the names of its keys pin its snapshot
    #: whether a forked process can read it: not the library (:mod:`~dali_mesh.storage.icechunk.forks`)
    fork_safe = False

    def __init__(self, repository: str, snapshot: str, options: dict | None = None, spec: str | None = None) -> None:
        self.repository, self.snapshot = normal_repository(repository), snapshot
        self._options = {k: v for k, v in (options or {}).items() if k not in VERSION_OPTIONS}
        # checked before its spec is made: no endpoint's user info kept there (plan files, cache entries)
        check_options(self.repository, self._options, self.name_of(""))
        #: the most seconds one call of the library may take (storage_options ``timeout``)
        self.timeout = timeout_of(self._options, self.name_of(""))
        self._why = why_of(self._options)  # what a call that timed out says of its cause
        # what reads it, not only what it is (a mirror has the same snapshot ids); a pickled store keeps its
        # spec (the signer is a hash under this process's salt)
        self.spec = spec or write_spec("icechunk", spec_fields(self.repository, snapshot, self._options))
        self.tag = f"icechunk:{snapshot}"
        self._lock = threading.Lock()
        self._session = None  # the readonly session, at the first read in this process
        #: what the native reader asked of this store in this process: calls, ranges and bytes
        self.native_reads = {"calls": 0, "ranges": 0, "bytes": 0}
        self._counting = threading.Lock()
        # the native reader's reads of this spec go through this store from now on (also one unpickled in a
        # worker); a build without the kernels library reads in Python only
        try:
            bind_native_reads(self)
        except KernelsError as e:
            log.debug("%s: no native reads (%s)", self.name_of(""), e)

    # ---- the repository -----------------------------------------------------------------------------
    def session(self):
        """The read-only session of the store's snapshot, opened once per process;
        :class:`ForkedProcessError` in a process forked from one that used the library."""
        check_process(self.name_of(""))
        if self._session is None:
            with self._lock:
                if self._session is None:
                    repo = open_repository(self.repository, self._options)
                    session = readonly_session(repo, self.repository, self.timeout, why=self._why,
                                               snapshot_id=self.snapshot)
                    _check_virtual_files(repo, session, self._options, self.name_of(""), self.timeout)
                    self._session = session
        return self._session

    def _call(self, make, what: str, key: str = ""):
        """``make()`` (a call of the session store's async API) under the store's timeout, cancelled at exit."""
        return call(make, self.name_of(key), what, self.timeout, why=self._why)

    def read(self, key: str, offset: int, size: int) -> bytes:
        """``size`` bytes of ``key`` at ``offset`` (fewer at its end), for the Python readers (uncounted)."""
        return self._ranges(key, [(offset, size)])[0].tobytes()

    def read_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list:
        """The bytes of each ``(offset, size)`` range of ``key`` as numpy ``uint8`` arrays, in one
        ``get_partial_values`` call: the native reader's reads, counted in :attr:`native_reads`. Raises
        :class:`MissingFileError` for a key the snapshot lacks."""
        arrays = self._ranges(key, ranges)
        with self._counting:
            self.native_reads["calls"] += 1
            self.native_reads["ranges"] += len(ranges)
            self.native_reads["bytes"] += sum(size for _, size in ranges)
        return arrays

    def _ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list:
        """:meth:`read_ranges`' reads, uncounted."""
        from zarr.abc.store import RangeByteRequest  # noqa: PLC0415
        from zarr.core.buffer import default_buffer_prototype  # noqa: PLC0415

        store = self.session().store
        asked = [(key, RangeByteRequest(offset, offset + size)) for offset, size in ranges]
        what = f"a read of {len(asked)} range{'s' if len(asked) > 1 else ''}"
        try:
            bufs = self._call(lambda: store.get_partial_values(default_buffer_prototype(), asked), what, key)
        except DataFileError:  # out of time, or the process exits: nothing more is asked
            raise
        except Exception as e:  # noqa: BLE001 - icechunk raises IcechunkError, KeyError, ValueError
            # 1.1.21 fails any range it cannot read (a missing key, a virtual file refused or cut short) with
            # a TypeError of its own (None where bytes were expected): the cause is asked of a plain get
            bufs = [None] if self.stat(key) is None else None
            if bufs is None:
                try:
                    self._call(lambda: store.get(key, default_buffer_prototype(), asked[0][1]), what, key)
                except DataFileError:
                    raise
                except Exception as cause:  # noqa: BLE001 - IcechunkError: what the library says
                    e = cause
                raise self.read_failed(key, e) from None
        if any(buf is None for buf in bufs):
            raise MissingFileError(self.name_of(key), f"no such key in snapshot {self.snapshot} of the repository "
                                                      "(the plan that reads it was made from another snapshot?)")
        return [buf.as_numpy_array() for buf in bufs]

    def name_of(self, key: str) -> str:
        key = key.removeprefix("/")
        return f"icechunk://{self.repository}@{self.snapshot}" + (f"/{key}" if key else "")

    # ---- reads ------------------------------------------------------------------------------------------
    def open(self, key: str, what: str = "file", *, direct: bool = False) -> StoredObject:
        key = key.removeprefix("/")
        version = self.stat(key)
        if version is None:
            raise MissingFileError(self.name_of(key), f"no such {what}: snapshot {self.snapshot} of the repository "
                                                      f"has no key {key!r}")
        return IcechunkObject(self, key, version.size)

    def open_version(self, key: str, version: Version) -> StoredObject:
        """``key`` at a version known already (a listing's, as the Zarr planner opens what it listed): a
        snapshot's keys never change, so nothing is asked."""
        return IcechunkObject(self, key.removeprefix("/"), version.size)

    def stat(self, key: str) -> Version | None:
        key = key.removeprefix("/")
        store = self.session().store
        try:
            if not self._call(lambda: store.exists(key), "a look-up", key):
                return None
            size = self._call(lambda: store.getsize(key), "a look-up", key)
        except DataFileError:
            raise
        except Exception as e:  # noqa: BLE001 - KeyError, IcechunkError (one class for every failure)
            # under no node ("node not found"), or a folder's name ("invalid zarr key format"): no object.
            # Not any "not found": a manifest object missing from the repository's storage ("object store
            # error Object at location .../manifests/... not found") is a snapshot that cannot be read, and
            # its chunks must not read as fill values
            text = str(e)
            if "object store error" not in text and (isinstance(e, KeyError) or "node not found" in text or
                                                     "invalid zarr key" in text):
                return None
            raise DataFileError(self.name_of(key), f"cannot be looked at ({short(e)})") from None
        return Version(int(size), -1, self.tag)

    def warm(self, arrays: Sequence[str]) -> None:
        """Looks up each array's first chunk together, so their manifests load side by side (the library
        loads one at an array's first look-up: 4 variables planned in turn, 4 round trips). Errors are left
        to the plan's own look-ups."""
        from zarr.api.asynchronous import open_array  # noqa: PLC0415 - zarr only when a repository is read

        store = self.session().store
        keys = []
        for path in dict.fromkeys(a.strip("/") for a in arrays):
            try:
                arr = self._call(lambda: open_array(store=store, path=path, mode="r"), "reading an array's metadata",
                                 path)
                keys.append(f"{path}/{arr.metadata.encode_chunk_key((0,) * arr.ndim)}" if path else
                            arr.metadata.encode_chunk_key((0,) * arr.ndim))
            except DataFileError:
                raise
            except Exception:  # noqa: BLE001, S112 - not an array (the plan says so itself)
                continue

        async def look_up():
            await asyncio.gather(*(store.exists(k) for k in keys), return_exceptions=True)

        if len(keys) > 1:
            self._call(look_up, "loading the arrays' manifests")

    def pins(self, version: Version | None) -> bool:
        """Every read is of the store's snapshot, whose keys never change."""
        return version is not None and version.tag == self.tag

    def list(self, prefix: str, delimiter: bool = True) -> tuple[list[tuple[str, Version]], list[str]]:
        """:meth:`ByteStore.list`; with ``delimiter`` a folder's children only (the root of a repository of
        millions of chunks lists its arrays, not their chunks)."""
        lead = "/" if prefix.startswith("/") else ""
        prefix = prefix.removeprefix("/")
        store = self.session().store

        def size_of(key: str) -> Version:
            return Version(int(self._call(lambda: store.getsize(key), "a look-up", key)), -1, self.tag)

        if delimiter and (prefix == "" or prefix.endswith("/")):
            objects, prefixes = [], []
            for name in sorted(self._call(lambda: _collect(store.list_dir(prefix)), "a listing", prefix)):
                version = self.stat(prefix + name)  # the library names children, objects and folders alike
                if version is None:
                    prefixes.append(lead + prefix + name + "/")
                else:
                    objects.append((lead + prefix + name, version))
            return objects, prefixes
        # the library lists the prefixes of groups and arrays only ("t/", not "t/c/"): the nearest one above
        under = prefix
        while True:
            try:
                found = sorted(self._call(lambda: _collect(store.list_prefix(under)), "a listing", under))
                break
            except DataFileError:
                raise
            except Exception as e:  # noqa: BLE001 - IcechunkError: "bad key prefix"
                if not under:
                    raise DataFileError(self.name_of(prefix), f"cannot be listed ({short(e)})") from None
                under = under.rstrip("/").rpartition("/")[0]
                under = under + "/" if under else ""
        return split_listing(found, lead + prefix, delimiter, size_of)

    def zarr_store(self, key: str):
        """At the root, the session's own zarr-python store (:func:`_named_errors`); below it the base
        class's store over this one's reads."""
        return _named_errors(self) if not key.strip("/") else super().zarr_store(key)

    def read_failed(self, key: str, e: BaseException) -> DataFileError:
        """The error of a failed read of ``key``: what the library says, and what to do about it."""
        if isinstance(e, DataFileError):
            return e
        text = short(e)
        if "authorize the virtual chunk container" in text:
            hint = ("; its bytes are in a virtual chunk container not authorised: give storage_options "
                    "authorize_virtual=[the container's URL prefix] (or True: every container the repository "
                    "declares) to read those files")
        elif "virtual" in text.lower():
            hint = ("; a virtual chunk: its file changed, moved or was cut short since the reference was "
                    "written, or its container refused the read (an object store's container is read "
                    "anonymously unless authorize_virtual says {prefix: 'env'})")
        elif "not found" in text and ("chunks/" in text or "manifests/" in text or "snapshots/" in text):
            hint = f"; was snapshot {self.snapshot} expired and garbage-collected while it was read?"
        else:
            hint = ""
        return DataFileError(self.name_of(key), f"cannot be read ({text}){hint}")

    # ---- processes and credentials ------------------------------------------------------------------------
    def credentials_state(self) -> tuple | None:
        """An s3:// repository's key, secret and token, carried beside the store (its pickle holds none)."""
        secrets = {k: self._options[k] for k in SECRETS if self._options.get(k)}
        return (self.spec, secrets) if secrets else None

    def take_credentials(self, credentials) -> None:
        self._options.update(credentials)
        self._session = None  # opened again with them

    def __reduce__(self):
        public = {k: v for k, v in self._options.items() if k not in SECRETS}
        return (IcechunkStore, (self.repository, self.snapshot, public, self.spec))

    def __repr__(self) -> str:
        return f"IcechunkStore({self.repository!r}, {self.snapshot!r})"


def _check_virtual_files(repo, session, options: dict, name: str, timeout: float) -> None:
    """:func:`~dali_mesh.storage.icechunk.virtual.check_local_virtual_files`, listed under ``timeout``."""
    check_local_virtual_files(repo, lambda: call(session.all_virtual_chunk_locations_async, name,
                                                 "listing the snapshot's virtual chunk files", timeout),
                              options.get(VIRTUAL_OPTION), name)


def _named_errors(store: IcechunkStore):
    """The session's zarr-python store, each call bounded by the store's timeout, failed reads raising
    :meth:`IcechunkStore.read_failed` instead of the library's Rust trace."""
    from zarr.storage import WrapperStore  # noqa: PLC0415 - zarr only when a repository is read

    name, timeout = store.name_of(""), store.timeout

    def bound(make, what: str, key: str):
        return bounded(make, store.name_of(key), what, timeout, why=store._why)

    async def listed(names, prefix: str):
        # each step of the library's listing under the timeout
        step = names.__aiter__()
        while True:
            try:
                item = await bound(step.__anext__, "a listing", prefix)
            except StopAsyncIteration:
                return
            yield item

    class NamedErrors(WrapperStore):
        # arrays opened in a parent keep this store: a forked child reads through them without asking the
        # IcechunkStore for its session, so each call checks here too
        #: the repository's location at its snapshot: what a reader's errors name (zarr_reader), not a repr
        name = store.name_of("")

        def _with_store(self, inner):
            return type(self)(inner)

        async def exists(self, key):
            check_process(name)
            return await bound(lambda: self._store.exists(key), "a look-up", key)

        async def is_empty(self, prefix):
            check_process(name)
            return await bound(lambda: self._store.is_empty(prefix), "a look-up", prefix)

        def list(self):
            check_process(name)
            return listed(self._store.list(), "")

        def list_prefix(self, prefix):
            check_process(name)
            return listed(self._store.list_prefix(prefix), prefix)

        def list_dir(self, prefix):
            check_process(name)
            return listed(self._store.list_dir(prefix), prefix)

        async def get(self, key, prototype, byte_range=None):
            check_process(name)
            try:
                return await bound(lambda: self._store.get(key, prototype, byte_range), "a read", key)
            except Exception as e:  # noqa: BLE001 - IcechunkError
                raise store.read_failed(key, e) from None

        async def get_partial_values(self, prototype, key_ranges):
            check_process(name)
            key_ranges = list(key_ranges)
            keys = ", ".join(k for k, _ in key_ranges[:3])
            try:
                return await bound(lambda: self._store.get_partial_values(prototype, key_ranges), "a read", keys)
            except Exception as e:  # noqa: BLE001 - IcechunkError
                raise store.read_failed(keys, e) from None

    return NamedErrors(store.session().store)


def resolve_icechunk(location: str, options: dict) -> tuple[IcechunkStore, str]:
    """The store of ``icechunk://<repository>[@<snapshot id>][/<key>]`` at the version ``options`` choose
    (default: the branch ``main``), resolved here once to a snapshot id, and the key (``""``: the root)."""
    from dali_mesh.storage.names import shown  # noqa: PLC0415

    repository, pinned, key = split_location(location)
    if not repository:
        raise DataFileError(shown(location), "names no repository: give icechunk://<path or s3://bucket/prefix>")
    chosen = {k: options[k] for k in VERSION_OPTIONS if options.get(k) is not None}
    if len(chosen) + bool(pinned) > 1:
        given = [f"{k}={v!r}" for k, v in chosen.items()] + ([f"@{pinned}"] if pinned else [])
        raise ValueError(f"{shown(location)}: choose one version of the repository (a branch, a tag or a snapshot), "
                         f"got {', '.join(given)}")
    if pinned:
        chosen = {"snapshot": pinned}
    kind, value = next(iter(chosen.items())) if chosen else ("branch", "main")
    repo = open_repository(repository, options)
    session = readonly_session(repo, repository, timeout_of(options, shown(location)), why=why_of(options),
                               **{"snapshot_id" if kind == "snapshot" else kind: str(value)})
    store = IcechunkStore(repository, session.snapshot_id, options)
    _check_virtual_files(repo, session, options, store.name_of(""), store.timeout)
    store._session = session  # the session the snapshot was resolved with: no second open
    return store, key
