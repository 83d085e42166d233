"""The byte store: the one seam between the formats and where their bytes live.

A store is a key space of immutable-while-read objects (files today; HTTP, S3 and GCS objects next).
Formats (``.npy``, HDF5, Zarr) and the plan never touch a file descriptor: they ask a store to
``open`` a key, read byte ranges of the opened object into their own buffers, and check at the end
that the object is still the version they opened (a window is never a mix of two versions).

The model is zarr-python 3's ``abc/store.py`` (``Store.get(key, prototype, byte_range)``),
tensorstore's ``kvstore`` (``ByteRange``) and DALI's ``util/file.h`` (``FileStream`` with local,
O_DIRECT and S3 siblings). The C++ reader has the same seam (``csrc/storage/byte_store.h``).
"""
from __future__ import annotations

import abc
import io
from typing import Callable, NamedTuple, Sequence

__all__ = ["IOV_MAX", "ByteStore", "StoredFile", "StoredObject", "Version", "is_etag", "read_exactly",
           "read_into", "readv_all", "scatter", "split_listing", "write_spec"]


class Version(NamedTuple):
    """What identifies one version of an object: its size, and for a file its modification time in
    ns (``-1``: not known); an object store's ETag or generation goes in ``tag``. A plan records the
    version it was made from, and every read checks it."""

    size: int
    mtime_ns: int = -1
    tag: str = ""


def is_etag(tag: str) -> bool:
    """Whether a version's ``tag`` is an ETag (sent as If-Match), not a generation (``gen:...``) or a
    modification date (``lm:...``), which are checked after the answer (as http_store.cc's IsEtag)."""
    return bool(tag) and not tag.startswith(("gen:", "lm:"))


def write_spec(kind: str, settings: dict) -> str:
    """The spec that names a store of ``kind`` with ``settings`` in a plan and in the C API
    (``"kind;name=value;..."``, in the order given; ``True``/``False`` as ``1``/``0``): the one writer
    of specs. C++ is their one reader (csrc/storage/: ``StoreOf`` makes the store, ``StoreSettings``
    gives its settings back, :func:`~dali_mesh.storage.native_store.store_settings`); no Python code splits
    one. A name or value holding ``;``, ``=`` (names) or a control character cannot be written."""
    items = [kind]
    for name, value in settings.items():
        text = str(int(value)) if isinstance(value, bool) else str(value)
        if any(c == ";" or ord(c) < 0x20 or ord(c) == 0x7F for c in name + text) or "=" in name:
            raise ValueError(f"a {kind} store's setting {name}={text!r} holds ';', a control character or (in its "
                             "name) '=': it cannot be written into the store's spec (give it without)")
        items.append(f"{name}={text}")
    return ";".join(items)


class StoredObject(abc.ABC):
    """One object opened for reading (``ByteStore.open``): its version is fixed at the open, and every
    read reads that version or fails (``check_unchanged`` after the reads finds a rewrite). Closes on
    ``close()`` or at the end of a ``with`` block."""

    #: the store it belongs to and its key in it
    store: "ByteStore"
    key: str

    @property
    def name(self) -> str:
        """The object as errors name it (a path, a URL without credentials)."""
        return self.store.name_of(self.key)

    @property
    @abc.abstractmethod
    def version(self) -> Version:
        """The version opened."""

    @property
    def size(self) -> int:
        return self.version.size

    @abc.abstractmethod
    def readv(self, buffers: Sequence, offset: int) -> int:
        """Reads into ``buffers`` (writable buffers, in order) the bytes from ``offset`` on, as one
        request; returns how many bytes it read (fewer than asked only at the end of the object, or
        for a read that may be continued: callers loop, see :func:`read_exactly`)."""

    def read_exactly(self, n: int, offset: int, *, allow_short: bool = False) -> bytes:
        """:func:`read_exactly` of this object."""
        return read_exactly(self, n, offset, allow_short=allow_short)

    def pread(self, n: int, offset: int) -> bytes:
        """Up to ``n`` bytes at ``offset`` (fewer at the end of the object)."""
        buf = bytearray(max(0, n))
        got = self.readv([buf], offset) if n > 0 else 0
        return bytes(buf[:got])

    @abc.abstractmethod
    def check_unchanged(self) -> None:
        """:class:`~dali_mesh.storage.errors.FileChangedError` naming the object if it is no longer the
        version opened (rewritten in place while it was read)."""

    def close(self) -> None:
        """Releases the object (idempotent)."""

    def __enter__(self) -> "StoredObject":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ByteStore(abc.ABC):
    """A key space of objects read by byte ranges.

    ``spec`` names the store in a plan (no credential ever goes into it); :meth:`local_path` gives the
    file of this machine that holds a key, if any (the local fast paths: ``mmap``, ``O_DIRECT``, h5py by
    path); ``native`` that the C++ reader has a store of that spec (``StoreOf`` in
    csrc/storage/byte_store.cc): one per process, in the kernels library, which Python's reads and the
    DALI plugin (which links that library) share. A store gives its native store what it reads with (a
    remote store its credentials, an Icechunk store its callbacks) once, when it is made or, in a worker
    process, when it takes its credentials; the memory store's objects are there already."""

    spec: str = ""
    #: whether the native reader (csrc/storage/) has this store too: plans name only those
    native: bool = False
    #: whether :meth:`list` answers (S3 and GCS prefixes; not a plain HTTP(S) server, not local paths):
    #: callers ask this, never probe for the method
    supports_listing: bool = False
    #: whether the store keeps its keys in ranges of other stores' files (a Kerchunk reference set):
    #: :meth:`locate` answers, and the native reader reads those files instead of the store's own objects
    locates: bool = False
    #: whether the store is one version of many (an Icechunk repository's snapshot, chosen by the storage_options
    #: branch, tag or snapshot): its names pin that version (the CLI's ``--data`` is pinned so once for every rank)
    versioned: bool = False

    @abc.abstractmethod
    def open(self, key: str, what: str = "file", *, direct: bool = False) -> StoredObject:
        """The object ``key`` opened for reading; :class:`~dali_mesh.storage.errors.MissingFileError`
        when it does not exist, :class:`~dali_mesh.storage.errors.NotRegularFileError` when it is no
        object (a folder, a FIFO), a :class:`~dali_mesh.storage.errors.DataFileError` for any other
        failure. ``what`` names the object's kind in those messages."""

    @abc.abstractmethod
    def stat(self, key: str) -> Version | None:
        """The version of ``key``, or ``None`` when it does not exist."""

    def pins(self, version: Version | None) -> bool:
        """Whether every read of an object at ``version`` is checked by the store to be of those bytes and
        no others (an S3 ETag sent as If-Match, :meth:`RemoteStore.pins`): what the plan read at that
        version then needs no second look at read time. Local files: no (a file is rewritten in place)."""
        return False

    def name_of(self, key: str) -> str:
        """``key`` as errors name it."""
        return key

    def read_range(self, key: str, offset: int, size: int) -> bytes:
        """``size`` bytes of ``key`` at ``offset`` (fewer at its end): for plan-time checks."""
        with self.open(key) as obj:
            # at most what the object holds (a caller may ask for "all of it" with a large size)
            return read_exactly(obj, max(0, min(size, obj.size - offset)), offset, allow_short=True)

    def prefetch(self, key: str, ranges: Sequence[tuple[int, int]]) -> None:
        """Announces reads of ``(offset, size)`` ranges of ``key`` that will come soon (a hint; errors
        are left to the reads)."""

    def warm(self, arrays: Sequence[str]) -> None:
        """Announces that the chunks of ``arrays`` (array paths of a Zarr store in this store) are about to
        be looked up one array after another (a dataset's variables, planned in turn): a store whose first
        look-up in each array costs a round trip of its own may make them together (a hint; errors are
        left to the look-ups)."""

    def open_file(self, key: str, what: str = "file") -> "StoredFile":
        """``key`` as a read-only binary file object (for h5py and other libraries that take one)."""
        return StoredFile(self.open(key, what))

    def list(self, prefix: str, delimiter: bool = True) -> tuple[list[tuple[str, Version]], list[str]]:
        """The objects under ``prefix`` (keys and versions) and, with ``delimiter``, the prefixes one
        level down; only where :attr:`supports_listing`, else a
        :class:`~dali_mesh.storage.errors.DataFileError` saying so."""
        from dali_mesh.storage.errors import DataFileError  # noqa: PLC0415

        raise DataFileError(self.name_of(prefix), f"its store ({self.spec!r}) cannot list a folder")

    def locate(self, key: str) -> tuple | None:
        """``(store, key, offset, length)``: the range of another store's file that holds ``key``, or
        ``None`` for bytes the store holds itself; only where :attr:`locates`."""
        from dali_mesh.storage.errors import DataFileError  # noqa: PLC0415

        raise DataFileError(self.name_of(key), f"its store ({self.spec!r}) keeps its keys itself: nothing to locate")

    def located_version(self, store: "ByteStore", key: str) -> Version | None:
        """The version of the file ``key`` of ``store`` that :meth:`locate` named, as this store saw it (a
        store that looks at its files once answers from that look); by default ``store.stat(key)``."""
        return store.stat(key)

    def local_path(self, key: str) -> str | None:
        """The path of this machine's file that holds ``key``'s bytes, for the readers that take a path
        (``mmap``, ``O_DIRECT``, h5py by name), or ``None`` when ``key`` is no file of this machine (an
        object store's object): callers ask this, never whether a store "is local"."""
        return None

    @property
    def round_trip(self) -> tuple[float, float]:
        """What a request to this store costs now: ``(latency s, bytes/s)``, as the native fetch plan weighs a
        gap against a request (csrc/storage/byte_store.h ``Cost()``; bytes/s 0: not measured). A store whose
        keys are this machine's files costs no round trip (latency 0); another what the native reader measured
        of its requests in this process (``_kernels.store_round_trip``), and before any (or without the
        native library) 20 ms, an object store in the reader's region (the latency benchmarks/remote_bench.py
        models). Policies (how many requests go out together, whether a look-up is worth a thread) ask
        this; only a reader that needs a path asks :meth:`local_path`."""
        if self.local_path("") is not None:  # its keys are paths: a read is a system call, not a request
            return 0.0, 0.0
        latency = rate = 0.0
        if self.native:
            try:
                from dali_mesh._kernels import store_round_trip  # noqa: PLC0415 - the native library when asked

                latency, rate = store_round_trip(self.spec)
            except Exception:  # noqa: BLE001 - no library, or none of this store in it: nothing measured
                pass
        return (latency if latency > 0 else 0.02), rate

    def credentials_state(self) -> tuple | None:
        """``(spec, credentials)`` for the source that holds this store to carry into its worker
        processes in memory (:func:`~dali_mesh.storage.carry_credentials`; a store's own pickle holds
        none), or ``None``: a store without credentials (local files, the memory store)."""
        return None

    def take_credentials(self, credentials) -> None:
        """Makes this store read with ``credentials`` (the second of :meth:`credentials_state`'s pair,
        carried from the process that resolved it). A store without credentials takes none."""

    def zarr_store(self, key: str):
        """A read-only zarr-python store whose root is ``key`` (metadata and chunks of an array read
        by zarr-python itself): by default one over this store's own reads
        (:class:`~dali_mesh.storage.zarr_store.ByteZarrStore`), listing where :attr:`supports_listing`."""
        from dali_mesh.storage.zarr_store import ByteZarrStore  # noqa: PLC0415 - zarr only when asked

        return ByteZarrStore(self, key)

    def __eq__(self, other) -> bool:
        """Stores of one class and one spec are one store, as the native reader has one store per spec."""
        return type(other) is type(self) and other.spec == self.spec

    def __hash__(self) -> int:
        return hash(self.spec)


def scatter(data, buffers: Sequence) -> int:
    """Copies ``data`` into ``buffers`` in order, as far as it goes; returns the bytes copied."""
    done = 0
    for buf in buffers:
        view = memoryview(buf).cast("B")
        take = min(len(view), len(data) - done)
        view[:take] = data[done:done + take]
        done += take
        if done >= len(data):
            break
    return done


def read_into(buffers: Sequence, offset: int, size: int, read: Callable) -> int:
    """:meth:`StoredObject.readv` of an object of ``size`` bytes through ``read(dst, n, offset)``, which reads
    ``n`` bytes (fewer at the end) into the writable buffer ``dst`` and returns how many: straight into a single
    writable buffer, else into one staged and scattered over ``buffers``."""
    views = [memoryview(b).cast("B") for b in buffers]
    n = min(sum(len(v) for v in views), size - offset)
    if n <= 0:
        return 0
    if len(views) == 1 and not views[0].readonly:
        return read(views[0], n, offset)
    staged = bytearray(n)
    return scatter(memoryview(staged)[:read(staged, n, offset)], views)


def split_listing(keys, prefix: str, delimiter: bool, version_of: Callable) -> tuple[list, list]:
    """:meth:`ByteStore.list` of a store that knows all its ``keys`` (sorted): those under ``prefix`` with their
    versions (``version_of(key)``) and, with ``delimiter``, the prefixes one level down. A ``prefix`` asked with a
    leading '/' (a :class:`~dali_mesh.storage.zarr_store.ByteZarrStore` at the store's root) is answered so."""
    lead = "/" if prefix.startswith("/") else ""
    prefix = prefix.removeprefix("/")
    objects, prefixes = [], set()
    for key in keys:
        if not key.startswith(prefix):
            continue
        rest = key[len(prefix):]
        if delimiter and "/" in rest:
            prefixes.add(lead + prefix + rest.split("/", 1)[0] + "/")
            continue
        objects.append((lead + key, version_of(key)))
    return objects, sorted(prefixes)


def read_exactly(obj: StoredObject, n: int, offset: int, *, allow_short: bool = False) -> bytes:
    """``n`` bytes of ``obj`` at ``offset``, looping over short reads; fewer only at the end of the
    object when ``allow_short``, else :class:`~dali_mesh.storage.errors.TruncatedFileError`."""
    from dali_mesh.storage.errors import TruncatedFileError

    buf = bytearray(max(0, n))
    view = memoryview(buf)
    done = 0
    while done < n:
        got = obj.readv([view[done:]], offset + done)
        if got <= 0:
            if allow_short:
                break
            raise TruncatedFileError(obj.name, f"read at byte {offset + done} returned nothing: the file was "
                                               "truncated while reading")
        done += got
    view.release()
    return bytes(buf[:done]) if done < n else bytes(buf)


#: the most buffers one request takes (the kernel's IOV_MAX for files)
IOV_MAX = 1024


def readv_all(obj: StoredObject, bufs: list, lens: list, offset: int, stats=None) -> None:
    """Reads every buffer of ``bufs`` (``lens``: their sizes) from ``offset`` on, in requests of at
    most :data:`IOV_MAX` buffers, looping over short reads; a read that ends early means the object
    shrank: :class:`~dali_mesh.storage.errors.TruncatedFileError` naming it. ``stats`` (an ``IOStats``)
    counts the requests and bytes."""
    from dali_mesh.storage.errors import TruncatedFileError

    i = 0
    while i < len(bufs):
        j = min(i + IOV_MAX, len(bufs))
        want = sum(lens[i:j])
        got = obj.readv(bufs[i:j], offset)
        if stats is not None:
            stats.read_calls += 1
            stats.bytes_read += got
        offset += got
        if got == want:
            i = j
            continue
        if got == 0:
            raise TruncatedFileError(obj.name, f"read at byte {offset} returned nothing: the file was truncated while "
                                               "reading")
        # drop the buffers filled, trim the partly filled one, and go on
        while got >= lens[i]:
            got -= lens[i]
            i += 1
        if got:
            bufs = bufs[:i] + [bufs[i][got:]] + bufs[i + 1:]
            lens = lens[:i] + [lens[i] - got] + lens[i + 1:]


class StoredFile(io.RawIOBase):
    """A read-only binary file over one opened object (for libraries that read a file object: h5py);
    every read is a ranged read of the version opened."""

    def __init__(self, obj: StoredObject) -> None:
        super().__init__()
        self.obj = obj
        self._pos = 0

    @property
    def name(self) -> str:
        return self.obj.name

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.obj.size}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self._pos = base + offset
        return self._pos

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        n = min(len(view), max(0, self.obj.size - self._pos))
        done = 0
        while done < n:
            got = self.obj.readv([view[done:n]], self._pos + done)
            if got <= 0:
                break
            done += got
        self._pos += done
        return done

    def close(self) -> None:
        if not self.closed:
            self.obj.close()
        super().close()
