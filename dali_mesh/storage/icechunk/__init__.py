"""The Icechunk store: one snapshot of an Icechunk repository as a byte store, ``icechunk://<repository>``
(a local folder, or ``s3://bucket/prefix`` with the source's ``storage_options``), read through the
``icechunk`` library only (``Repository.open``, ``readonly_session``, its session's zarr store: ``get`` with
byte ranges, ``list_prefix``), never a manifest parsed here. ``ZarrSource(["icechunk:///data/era5"], "t2m",
layout, storage_options={"tag": "v1"})`` reads the array ``t2m`` of the repository at the tag ``v1``.

Which version: ``storage_options`` ``branch``, ``tag`` or ``snapshot`` (a snapshot id), at most one
(default: the branch ``main``), not a query in the location (``?`` is a character of a local path), or a
snapshot id in the location itself: ``icechunk://<repository>@<snapshot id>``. A branch or a tag is
resolved ONCE, when the location is resolved (the source's construction), to a snapshot id, and that id
is the store's version: it is in the store's spec and in every name of its keys (``icechunk:///data/era5@
YJXNR2Q6WMH5PC80YF9G``), so a plan, a fingerprint and a checkpoint record it, a pickled store (DALI's
worker processes) reads that snapshot, and a commit to the branch while the source reads never mixes two
versions into one window. A name of a key is a location again: a checkpoint's recorded files read the
recorded snapshot, whatever the branch holds since. An unknown snapshot id (never there, or expired by
``Repository.expire_snapshots`` and collected by ``garbage_collect``) is an error naming it; a snapshot
collected while it is read fails its next read of a deleted object, naming the snapshot.

Reads: the native reader's, answered by the library. The library (1.1.21) names neither a native chunk's
object (each one object ``chunks/<id>`` of the repository's storage) nor a virtual chunk's byte range
(``Session.all_virtual_chunk_locations`` gives the files only), but its store reads ranges of any key,
several at once (``get_partial_values``). So the store is native (``native = True``): the native reader's
store of this spec (csrc/storage/callback_store.cc) asks Python for the ranges it reads, through two ctypes
callbacks :meth:`IcechunkStore.give_to` binds in each library (the kernels library, the DALI plugin), and
reads a Blosc chunk in parts (its header and index, then the blocks a window needs) as from any object
store. The callbacks run on the reader's threads and take the GIL: whoever waits for the reader must have
released it (ctypes calls and DALI's ``pipe.run()`` do). At exit every library's store is unbound first
(an ``atexit`` hook that waits for the reads in flight), so that no read enters an interpreter being torn
down. The Python path (:meth:`IcechunkStore.read`, :class:`IcechunkObject`) stays: it serves the planner,
``partitioned_source`` and DALI's worker processes. zarr-python reads the repository's arrays through the
session's own store (:meth:`IcechunkStore.zarr_store`). Virtual chunks (byte ranges of NetCDF/HDF5 files
that VirtualiZarr wrote into the repository) are read only from the containers the source authorises
(``storage_options`` ``authorize_virtual``: their URL prefixes, or ``True`` for every one the repository
declares): a repository's references may name any file. An object store's container is read anonymously
unless the source says ``{prefix: "env"}`` (the repository's config names its endpoint: the environment's
keys would go wherever a repository points them).

Processes: the library cannot run in a process forked from one that used it (icechunk 1.1.21: once a
storage object is made, its Rust runtime's threads run the calls; a forked child has none of them, so its
first call of the library, through an inherited session or a freshly opened repository alike, waits for
ever). A store in such a child (DALI's workers with ``py_start_method="fork"``, torch's DataLoader with the
``"fork"`` context) refuses at its first read, before calling the library, with :class:`ForkedProcessError`
naming the repository and the start methods that work (``"spawn"``, ``"forkserver"``), and
``partitioned_source`` refuses such a pipeline when it is defined. A store unpickled in a spawned process
opens the repository there.
"""
from __future__ import annotations

import asyncio
import atexit
import ctypes
import hashlib
import logging
import os
import re
import sys
import threading
from typing import Sequence

from dali_mesh.storage.byte_store import ByteStore, StoredObject, Version, write_spec
from dali_mesh.storage.errors import DataFileError, MissingFileError
from dali_mesh.storage.icechunk.virtual import VIRTUAL_OPTION, check_local_virtual_files, virtual_access

__all__ = ["ForkedProcessError", "IcechunkStore", "resolve_icechunk"]

log = logging.getLogger(__name__)

#: what a user installs to read Icechunk repositories (setup.py's extras_require)
EXTRA = "dali_mesh[virtual]"
#: the storage_options that choose the version (the rest configure an s3:// repository's storage)
VERSION_OPTIONS = ("branch", "tag", "snapshot")
#: the storage_options of an s3:// repository, named as s3fs names them (as the s3:// store takes them)
S3_OPTIONS = ("endpoint_url", "region", "anon", "key", "secret", "token")
_SECRETS = ("key", "secret", "token")
#: ``<repository>@<snapshot id>[/<key>]``: a snapshot id is 20 characters of Crockford base32
_PINNED = re.compile(r"(?P<repo>.+)@(?P<snapshot>[0-9A-Za-z]{20})(?:/(?P<key>.*))?")


#: the id of the process whose icechunk library started its runtime (this module's first call of the library
#: there, or threads of the runtime found when the process forked), else None. A forked child inherits the
#: parent's id: there the library's calls would wait for ever, and :func:`_check_process` refuses them.
_library_pid: int | None = None

#: the advice of every refusal in a forked process
_ADVICE = ('start the processes that read by spawning: py_start_method="spawn" in DALI\'s pipeline '
           '(pipeline_def / Pipeline), multiprocessing_context="spawn" (or "forkserver") in torch\'s DataLoader')


class ForkedProcessError(DataFileError):
    """An Icechunk repository read in a process forked from one that used the icechunk library: refused, as
    the library would wait for ever there. ``path`` names the repository."""


def _check_process(name: str) -> None:
    """Refuses (:class:`ForkedProcessError` naming ``name``) to call the library in a process forked from
    one that used it; else notes that this process uses it (from here on its forked children are refused)."""
    global _library_pid
    pid = os.getpid()
    if _library_pid is None:
        _library_pid = pid
    elif _library_pid != pid:
        raise ForkedProcessError(name, f"cannot be read in this process (pid {pid}): it was forked from a process "
                                       f"(pid {_library_pid}) that had used the icechunk library, whose runtime "
                                       f"threads a forked process lacks, so the library's first call here would "
                                       f"wait for ever; {_ADVICE}")


def _runtime_threads() -> bool:
    """Whether the icechunk library's runtime (tokio: threads named ``tokio-runtime-worker``, 15 characters
    of it in ``comm``) runs in this process. Linux only (``/proc``); elsewhere False."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return False
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm", "rb") as f:
                if f.read().startswith(b"tokio-runtime"):
                    return True
        except OSError:  # the thread ended meanwhile
            continue
    return False


def _before_fork() -> None:
    """Notes, in a process about to fork, that the library runs here when it was used without this module
    (the user's own ``icechunk`` calls: a repository written before the loader's workers fork), so that the
    child refuses rather than waits. Only an imported library can have started its runtime."""
    global _library_pid
    if _library_pid is None and "icechunk" in sys.modules and _runtime_threads():
        _library_pid = os.getpid()


os.register_at_fork(before=_before_fork)


def _icechunk():
    """The ``icechunk`` module, or an error naming the extra that installs it."""
    try:
        import icechunk  # noqa: PLC0415 - only when a repository is read
    except ImportError as e:
        raise ImportError(f"reading Icechunk repositories (icechunk:// locations) needs the icechunk library: "
                          f"pip install '{EXTRA}' ({e})") from None
    # a local repository warns "not safe for concurrent commits" at every open: this store never commits
    icechunk.set_logs_filter("error")
    return icechunk


def _sync(coro):
    """Runs one of the session store's coroutines on zarr-python's event loop and waits for it."""
    from zarr.core.sync import sync  # noqa: PLC0415 - zarr only when a repository is read

    return sync(coro)


async def _collect(names) -> list:
    """The items of an async iterator (the session store's listings)."""
    return [name async for name in names]


def _short(e: BaseException) -> str:
    """An icechunk error's message on one line, without the Rust span trace after it (``context:``)."""
    words = []
    for line in str(e).strip().splitlines():
        line = line.strip().lstrip("x|").strip()
        if line.startswith("context:"):
            break
        words.extend(line.split())
    return (" ".join(words) or type(e).__name__)[:400]


class IcechunkObject(StoredObject):
    """A key of the snapshot: its bytes never change (a commit makes another snapshot)."""

    def __init__(self, store: "IcechunkStore", key: str, size: int) -> None:
        self.store, self.key, self._size = store, key, size

    @property
    def version(self) -> Version:
        return Version(self._size, -1, self.store.tag)

    def readv(self, buffers: Sequence, offset: int) -> int:
        views = [memoryview(b).cast("B") for b in buffers]
        want = min(sum(len(v) for v in views), self._size - offset)
        if want <= 0:
            return 0
        data = self.store.read(self.key, offset, want)
        done = 0
        for view in views:
            take = min(len(view), len(data) - done)
            view[:take] = data[done:done + take]
            done += take
            if done >= len(data):
                break
        return done

    def check_unchanged(self) -> None:
        """A snapshot's keys are immutable: a read of a collected snapshot fails itself, naming it."""


class IcechunkStore(ByteStore):
    """The keys of ``repository`` (a local folder or ``s3://bucket/prefix``) at the snapshot ``snapshot``,
    read with ``options`` (an s3:// repository's storage_options)."""

    native = True  # the native reader's reads are answered here (give_to: csrc/storage/callback_store.cc)
    supports_listing = True
    versioned = True  # the names of its keys pin its snapshot
    #: whether a process forked from one that read this store can read it: not the library (see the module's
    #: docstring); ``partitioned_source`` refuses DALI's forked workers over it when the pipeline is defined
    fork_safe = False

    def __init__(self, repository: str, snapshot: str, options: dict | None = None, spec: str | None = None) -> None:
        self.repository, self.snapshot = repository, snapshot
        self._options = {k: v for k, v in (options or {}).items() if k not in VERSION_OPTIONS}
        # what reads it, not only what it is: two sources of one repository location on two services (a
        # mirror: the same snapshot ids), with other keys or other virtual containers authorised, are two
        # stores (each library's native store of a spec reads through one of them). A pickled store keeps
        # its spec (the signer is a hash under this process's salt)
        self.spec = spec or write_spec("icechunk", {"repo": repository, "snapshot": snapshot,
                                                    **_reader_fields(self._options)})
        self.tag = f"icechunk:{snapshot}"
        self._lock = threading.Lock()
        self._session = None  # the readonly session, at the first read in this process
        #: what the native reader asked of this store in this process (the library's bound to it,
        #: give_to): calls, ranges and bytes
        self.native_reads = {"calls": 0, "ranges": 0, "bytes": 0}
        self._counting = threading.Lock()

    # ---- the repository -----------------------------------------------------------------------------
    def session(self):
        """The read-only session of the store's snapshot, opened once per process. In a process forked from
        one that used the library (which may hold that process's session) :class:`ForkedProcessError`
        instead: the library would wait for ever there."""
        _check_process(self.name_of(""))
        if self._session is None:
            with self._lock:
                if self._session is None:
                    repo = open_repository(self.repository, self._options)
                    session = _readonly_session(repo, self.repository, snapshot_id=self.snapshot)
                    check_local_virtual_files(repo, session, self._options.get(VIRTUAL_OPTION),
                                               self.name_of(""))
                    self._session = session
        return self._session

    def read(self, key: str, offset: int, size: int) -> bytes:
        """``size`` bytes of ``key`` at ``offset`` (fewer at its end): one ranged read of the session's store
        (the Python readers'; not counted in :attr:`native_reads`)."""
        return self._ranges(key, [(offset, size)])[0].tobytes()

    def read_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list:
        """The bytes of each ``(offset, size)`` range of ``key`` (fewer at its end), read by one call of the
        session's store (``get_partial_values``: the library sends the requests together), as numpy
        ``uint8`` arrays: the native reader's reads (csrc/storage/callback_store.cc), counted in
        :attr:`native_reads`; a key the snapshot lacks is a :class:`MissingFileError` naming it."""
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
        try:
            bufs = _sync(store.get_partial_values(default_buffer_prototype(), asked))
        except Exception as e:  # noqa: BLE001 - icechunk raises IcechunkError, KeyError, ValueError
            # 1.1.21 fails any range it cannot read (a missing key, a virtual file refused or cut short) with
            # a TypeError of its own (None where bytes were expected): the cause is asked of a plain get
            bufs = [None] if self.stat(key) is None else None
            if bufs is None:
                try:
                    _sync(store.get(key, default_buffer_prototype(), asked[0][1]))
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
            if not _sync(store.exists(key)):
                return None
            size = _sync(store.getsize(key))
        except Exception as e:  # noqa: BLE001 - KeyError, IcechunkError (one class for every failure)
            # under no node ("node not found"), or a folder's name ("invalid zarr key format"): no object.
            # Not any "not found": a manifest object missing from the repository's storage ("object store
            # error Object at location .../manifests/... not found") is a snapshot that cannot be read, and
            # its chunks must not read as fill values
            text = str(e)
            if "object store error" not in text and (isinstance(e, KeyError) or "node not found" in text or
                                                     "invalid zarr key" in text):
                return None
            raise DataFileError(self.name_of(key), f"cannot be looked at ({_short(e)})") from None
        return Version(int(size), -1, self.tag)

    def warm(self, arrays: Sequence[str]) -> None:
        """Loads the chunk manifests of ``arrays`` side by side: the library loads an array's manifest at the
        first look-up of one of its chunks, so a dataset's variables planned in turn would wait a round trip
        each (at 20 ms, 4 variables: 4 waves of one request). Looks up each array's first chunk together
        (errors are left to the plan's own look-ups)."""
        import zarr  # noqa: PLC0415 - zarr only when a repository is read

        store = self.session().store
        keys = []
        for path in dict.fromkeys(a.strip("/") for a in arrays):
            try:
                arr = zarr.open_array(store=store, path=path, mode="r")
                keys.append(f"{path}/{arr.metadata.encode_chunk_key((0,) * arr.ndim)}" if path else
                            arr.metadata.encode_chunk_key((0,) * arr.ndim))
            except Exception:  # noqa: BLE001, S112 - not an array (the plan says so itself)
                continue

        async def look_up():
            await asyncio.gather(*(store.exists(k) for k in keys), return_exceptions=True)

        if len(keys) > 1:
            _sync(look_up())

    def pins(self, version: Version | None) -> bool:
        """Every read is of the store's snapshot, whose keys never change."""
        return version is not None and version.tag == self.tag

    def list(self, prefix: str, delimiter: bool = True) -> tuple[list[tuple[str, Version]], list[str]]:
        """The keys of the snapshot under ``prefix`` with their versions, and with ``delimiter`` the
        prefixes one level down (a folder's children only: the root of a repository of millions of chunks
        lists its arrays, not their chunks)."""
        lead = "/" if prefix.startswith("/") else ""
        prefix = prefix.removeprefix("/")
        store = self.session().store
        if delimiter and (prefix == "" or prefix.endswith("/")):
            objects, prefixes = [], []
            for name in sorted(_sync(_collect(store.list_dir(prefix)))):
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
                found = sorted(k for k in _sync(_collect(store.list_prefix(under))) if k.startswith(prefix))
                break
            except Exception as e:  # noqa: BLE001 - IcechunkError: "bad key prefix"
                if not under:
                    raise DataFileError(self.name_of(prefix), f"cannot be listed ({_short(e)})") from None
                under = under.rstrip("/").rpartition("/")[0]
                under = under + "/" if under else ""
        objects, prefixes = [], set()
        for key in found:
            rest = key[len(prefix):]
            if delimiter and "/" in rest:
                prefixes.add(lead + prefix + rest.split("/", 1)[0] + "/")
                continue
            objects.append((lead + key, Version(int(_sync(store.getsize(key))), -1, self.tag)))
        return objects, sorted(prefixes)

    def zarr_store(self, key: str):
        """The session's own zarr-python store at the root (zarr-python reads the arrays through the
        library, native and virtual chunks alike), its errors naming the key; the base class's store over
        this one's reads below it."""
        return _named_errors(self) if not key.strip("/") else super().zarr_store(key)

    def read_failed(self, key: str, e: BaseException) -> DataFileError:
        """The error of a failed read of ``key``: what the library says, and what to do about it."""
        text = _short(e)
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

    # ---- the native reader ----------------------------------------------------------------------------------
    def give_to(self, lib) -> None:
        """Binds ``lib``'s store of this spec (the kernels library's, or the DALI plugin's) to this store's
        reads (:func:`bind_native_reads`): the native reader's reads of this snapshot call back into it."""
        bind_native_reads(lib, self)

    # ---- processes and credentials ------------------------------------------------------------------------
    def credentials_state(self) -> tuple | None:
        """An s3:// repository's key, secret and token, carried beside the store (its pickle holds none)."""
        secrets = {k: self._options[k] for k in _SECRETS if self._options.get(k)}
        return (self.spec, secrets) if secrets else None

    def take_credentials(self, credentials) -> None:
        self._options.update(credentials)
        self._session = None  # opened again with them

    def __reduce__(self):
        public = {k: v for k, v in self._options.items() if k not in _SECRETS}
        return (IcechunkStore, (self.repository, self.snapshot, public, self.spec))

    def __repr__(self) -> str:
        return f"IcechunkStore({self.repository!r}, {self.snapshot!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, IcechunkStore) and other.spec == self.spec

    def __hash__(self) -> int:
        return hash(self.spec)


# ---- the native reader's reads, answered here (csrc/storage/callback_store.h) ----------------------------
#: int64 head(key, int64 *size, char *tag, int64 tag_cap, char *err, int64 err_cap)
_HEAD = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int64), ctypes.c_void_p,
                         ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64)
#: int64 read(key, int64 n, const int64 *offsets, const int64 *sizes, char *const *dsts, int64 *got, char *err,
#: int64 err_cap)
_READ = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_char_p, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64),
                         ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_void_p),
                         ctypes.POINTER(ctypes.c_int64), ctypes.c_void_p, ctypes.c_int64)
#: how long the exit waits for the native reader's reads in flight (each a request of the library)
EXIT_WAIT_S = 30.0
#: (library handle, spec) -> the store that answers that library's reads of that spec now (the latest given)
_answering: dict[tuple[int, str], IcechunkStore] = {}
#: (library handle, spec) -> its callbacks, never freed: a reader's thread may call one at any time until
#: the library is unbound (at exit)
_callbacks: dict[tuple[int, str], tuple] = {}
#: library handle -> the library, for the unbinding at exit
_libraries: dict[int, object] = {}
_binding = threading.Lock()


def _say(err, cap: int, text: str) -> None:
    data = text.encode("utf-8", "replace")[: max(0, cap - 1)]
    ctypes.memmove(err, data + b"\0", len(data) + 1)


def _failure(store: IcechunkStore | None, key: str, e: BaseException) -> str:
    """The message of a failed answer, naming the key (a DataFileError of the store names it already)."""
    if isinstance(e, DataFileError):
        return str(e)
    name = store.name_of(key) if store is not None else key
    return f"{name}: cannot be read ({type(e).__name__}: {_short(e)})"


def _answers(slot: tuple[int, str]) -> tuple:
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


def bind_native_reads(lib, store: IcechunkStore) -> None:
    """Makes ``lib``'s store of ``store.spec`` (csrc/storage/callback_store.cc) read through ``store``: its
    callbacks are made once per library and spec and kept for the life of the process; a later store of
    the spec takes over their answers (its :attr:`~IcechunkStore.native_reads` then counts them). The
    first binding registers the unbinding at exit, and each moves it to run first among the exit hooks
    (before DALI's, which shuts its pipelines down: their reads then fail at once instead of waiting for
    a GIL held by that shutdown)."""
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
        atexit.unregister(_unbind_at_exit)
        atexit.register(_unbind_at_exit)


def unbind_native_reads(lib, store: IcechunkStore) -> None:
    """Unbinds ``lib``'s store of ``store.spec``: its reads then fail naming the store, until it is given
    again (:meth:`IcechunkStore.give_to`)."""
    _declare(lib)
    err = ctypes.create_string_buffer(4096)
    if lib.dali_mesh_store_bind_reader(store.spec.encode(), b"", None, None, err, len(err)) < 0:
        raise DataFileError(store.name_of(""), err.value.decode(errors="replace"))


def _unbind_at_exit() -> None:
    """Unbinds every library's callback stores for good and waits (without the GIL: a ctypes call) for the
    reads in flight, so that no reader thread enters the interpreter while it is torn down."""
    for lib in list(_libraries.values()):
        left = lib.dali_mesh_store_unbind_readers(EXIT_WAIT_S)
        if left:
            log.warning("%d reads of Icechunk stores by the native reader were still in flight %.0f s after the "
                        "process began to exit", left, EXIT_WAIT_S)


def _named_errors(store: IcechunkStore):
    """The session's zarr-python store, whose failed reads raise :meth:`IcechunkStore.read_failed` (the key
    and what to do) instead of the library's Rust trace."""
    from zarr.storage import WrapperStore  # noqa: PLC0415 - zarr only when a repository is read

    name = store.name_of("")

    class NamedErrors(WrapperStore):
        # zarr-python's arrays opened in a parent keep this store (a source's open handles): a forked child
        # reads through them without asking the IcechunkStore for its session, so each call checks here too
        def _with_store(self, inner):
            return type(self)(inner)

        async def exists(self, key):
            _check_process(name)
            return await self._store.exists(key)

        async def is_empty(self, prefix):
            _check_process(name)
            return await self._store.is_empty(prefix)

        def list(self):
            _check_process(name)
            return self._store.list()

        def list_prefix(self, prefix):
            _check_process(name)
            return self._store.list_prefix(prefix)

        def list_dir(self, prefix):
            _check_process(name)
            return self._store.list_dir(prefix)

        async def get(self, key, prototype, byte_range=None):
            _check_process(name)
            try:
                return await self._store.get(key, prototype, byte_range)
            except Exception as e:  # noqa: BLE001 - IcechunkError
                raise store.read_failed(key, e) from None

        async def get_partial_values(self, prototype, key_ranges):
            _check_process(name)
            key_ranges = list(key_ranges)
            try:
                return await self._store.get_partial_values(prototype, key_ranges)
            except Exception as e:  # noqa: BLE001 - IcechunkError
                raise store.read_failed(", ".join(k for k, _ in key_ranges[:3]), e) from None

    return NamedErrors(store.session().store)


def open_repository(repository: str, options: dict):
    """``icechunk.Repository.open`` of a local folder or an ``s3://bucket/prefix`` with ``options``."""
    icechunk = _icechunk()
    name = f"icechunk://{repository}"
    if repository.startswith("s3://"):
        known = S3_OPTIONS + VERSION_OPTIONS + (VIRTUAL_OPTION,)
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise ValueError(f"{name}: storage_options {unknown} are not options of an s3:// Icechunk repository "
                             f"(known: {', '.join(known)})")
        bucket, _, prefix = repository[len("s3://"):].partition("/")
        endpoint = options.get("endpoint_url")
        _check_process(name)  # a storage object starts the library's runtime
        storage = icechunk.s3_storage(
            bucket=bucket, prefix=prefix or None, region=options.get("region"), endpoint_url=endpoint,
            allow_http=bool(endpoint and endpoint.startswith("http://")), force_path_style=bool(endpoint),
            access_key_id=options.get("key"), secret_access_key=options.get("secret"),
            session_token=options.get("token"), anonymous=bool(options.get("anon")) or None,
            from_env=None if options.get("key") or options.get("anon") else True)
    elif "://" in repository:
        raise DataFileError(name, "names a repository neither local nor s3://: give icechunk:///path/to/repo or "
                                  "icechunk://s3://bucket/prefix")
    else:
        known = VERSION_OPTIONS + (VIRTUAL_OPTION,)
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise ValueError(f"{name}: storage_options {unknown} are not options of a local Icechunk repository "
                             f"(known: {', '.join(known)})")
        # the library's open makes the folders of a path that is not there: a mistyped path must not
        # leave a tree of empty folders behind
        if not os.path.isdir(repository):
            raise DataFileError(name, "cannot be opened as an Icechunk repository (the repository doesn't exist), "
                                      "no such folder; check the location after icechunk://")
        _check_process(name)  # a storage object starts the library's runtime
        storage = icechunk.local_filesystem_storage(repository)
    try:
        return icechunk.Repository.open(storage, authorize_virtual_chunk_access=virtual_access(
            icechunk, storage, name, options.get(VIRTUAL_OPTION)))
    except DataFileError:
        raise
    except Exception as e:  # noqa: BLE001 - IcechunkError
        raise DataFileError(name, f"cannot be opened as an Icechunk repository ({_short(e)}); check the location "
                                  "after icechunk://") from None


def _reader_fields(options: dict) -> dict:
    """The spec's fields of what reads a repository besides its location and snapshot: an s3:// repository's
    endpoint, region, anonymity and keys (a hash of them: remote.py's signer), and the virtual chunk
    containers authorised (and how)."""
    from dali_mesh.storage.remote import _Credentials, _signer  # noqa: PLC0415

    fields: dict = {}
    for k in ("endpoint_url", "region"):
        if options.get(k):
            fields[k] = str(options[k])
    if options.get("anon"):
        fields["anon"] = True
    if any(options.get(k) for k in _SECRETS):
        fields["signer"] = _signer(_Credentials(options.get("key") or "", options.get("secret") or "",
                                                options.get("token") or ""))
    given = options.get(VIRTUAL_OPTION)
    if given:
        # a hash: a container's prefix may hold what a spec may not (";"), and the options are checked later
        what = ("all" if given is True else repr(sorted((str(k), str(v)) for k, v in given.items()))
                if isinstance(given, dict) else repr(sorted(map(str, given))))
        fields["virtual"] = hashlib.sha256(what.encode()).hexdigest()[:16]
    return fields


def _readonly_session(repo, repository: str, **version):
    """``repo.readonly_session(**version)``, or an error naming the branch, tag or snapshot not found."""
    try:
        return repo.readonly_session(**version)
    except Exception as e:  # noqa: BLE001 - IcechunkError
        (kind, value), = version.items()
        what = {"snapshot_id": "snapshot"}.get(kind, kind)
        hint = (": a snapshot id never in the repository, or one expired (Repository.expire_snapshots) and "
                "garbage-collected since it was recorded; such a snapshot cannot be read again"
                if what == "snapshot" else "")
        raise DataFileError(f"icechunk://{repository}", f"has no {what} {value!r} ({_short(e)}){hint}") from None


def resolve_icechunk(location: str, options: dict) -> tuple[IcechunkStore, str]:
    """The store of ``icechunk://<repository>[@<snapshot id>][/<key>]`` at the version ``options`` choose
    (``branch``, ``tag`` or ``snapshot``; default: the branch ``main``), resolved here, once, to a snapshot
    id, and the key (``""``: the repository's root)."""
    rest = location.split("://", 1)[1]
    pinned = _PINNED.fullmatch(rest)
    repository, key = (pinned["repo"], pinned["key"] or "") if pinned else (rest.rstrip("/"), "")
    if not repository:
        raise DataFileError(location, "names no repository: give icechunk://<path or s3://bucket/prefix>")
    chosen = {k: options[k] for k in VERSION_OPTIONS if options.get(k) is not None}
    if len(chosen) + bool(pinned) > 1:
        given = [f"{k}={v!r}" for k, v in chosen.items()] + ([f"@{pinned['snapshot']}"] if pinned else [])
        raise ValueError(f"{location}: choose one version of the repository (a branch, a tag or a snapshot), "
                         f"got {', '.join(given)}")
    if pinned:
        chosen = {"snapshot": pinned["snapshot"]}
    kind, value = next(iter(chosen.items())) if chosen else ("branch", "main")
    repo = open_repository(repository, options)
    session = _readonly_session(repo, repository, **{"snapshot_id" if kind == "snapshot" else kind: str(value)})
    store = IcechunkStore(repository, session.snapshot_id, options)
    check_local_virtual_files(repo, session, options.get(VIRTUAL_OPTION), store.name_of(""))
    store._session = session  # the session the snapshot was resolved with: no second open
    return store, key
