"""The byte store: the one seam between the formats and where their bytes live. Formats and the plan never
touch a file descriptor: they ``open`` a key, read byte ranges of that version, and check at the end that it
is unchanged. The C++ reader has the same seam (``csrc/storage/byte_store.h``); how to add a store:
docs/extending.md.
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
    (``"kind;name=value;..."``, in order; booleans as ``1``/``0``): the one writer of specs, whose one reader
    is C++ (``StoreOf``, ``StoreSettings``). Raises ValueError for a ``;``, a control character or (in a
    name) ``=``."""
    items = [kind]
    for name, value in settings.items():
        text = str(int(value)) if isinstance(value, bool) else str(value)
        if any(c == ";" or ord(c) < 0x20 or ord(c) == 0x7F for c in name + text) or "=" in name:
            raise ValueError(f"a {kind} store's setting {name}={text!r} holds ';', a control character or (in its "
                             "name) '=': it cannot be written into the store's spec (give it without)")
        items.append(f"{name}={text}")
    return ";".join(items)


class StoredObject(abc.ABC):
    """One object opened for reading (``ByteStore.open``) at a version fixed at the open: every read reads
    that version or fails (``check_unchanged`` after the reads finds a rewrite). A context manager."""

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
        """Reads the bytes from ``offset`` on into ``buffers`` (writable, in order) as one request; returns
        how many (fewer at the end of the object, or for a read callers continue: :func:`read_exactly`)."""

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
        """Raises :class:`~dali_mesh.storage.errors.FileChangedError` if the object is no longer the version opened."""

    def close(self) -> None:
        """Releases the object (idempotent)."""

    def __enter__(self) -> "StoredObject":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ByteStore(abc.ABC):
    """A key space of objects read by byte ranges. ``spec`` names the store in a plan (never a credential);
    its capabilities are asked, never its kind (docs/extending.md, "A store"). A ``native`` store gives the
    C++ store of its spec (one per process) what it reads with once, when made or, in a worker, when it
    takes its credentials."""

    spec: str = ""
    #: whether the native reader (csrc/storage/) has this store too: plans name only those
    native: bool = False
    #: whether :meth:`list` answers (S3 and GCS prefixes; not a plain HTTP(S) server, not local paths):
    #: callers ask this, never probe for the method
    supports_listing: bool = False
    #: whether the store keeps its keys in ranges of other stores' files (a Kerchunk reference set):
    #: :meth:`locate` answers, and the native reader reads those files instead of the store's own objects
    locates: bool = False
    #: whether the store is one version of many (an Icechunk snapshot): its names pin that version (the CLI's
    #: ``--data`` is pinned so once for every rank)
    versioned: bool = False

    @abc.abstractmethod
    def open(self, key: str, what: str = "file", *, direct: bool = False) -> StoredObject:
        """The object ``key`` opened for reading. Raises :class:`~dali_mesh.storage.errors.MissingFileError`,
        :class:`~dali_mesh.storage.errors.NotRegularFileError` (a folder, a FIFO) or another
        :class:`~dali_mesh.storage.errors.DataFileError`, naming the object as a ``what``."""

    @abc.abstractmethod
    def stat(self, key: str) -> Version | None:
        """The version of ``key``, or ``None`` when it does not exist."""

    def pins(self, version: Version | None) -> bool:
        """Whether the store checks every read at ``version`` to be of those bytes (an S3 ETag sent as
        If-Match): what was planned at it then needs no second look. Local files: no."""
        return False

    def child_key(self, key: str, steps: list[str]) -> str:
        """The key of ``steps`` (relative names, checked by :meth:`StoredLocation.child`) below ``key``."""
        return "/".join([key.rstrip("/"), *steps]) if key else "/".join(steps)

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
        """Announces that the chunks of ``arrays`` (Zarr array paths) are about to be looked up one array
        after another, so a store whose first look-up per array costs a round trip may make them together
        (a hint; errors are left to the look-ups)."""

    def open_file(self, key: str, what: str = "file") -> "StoredFile":
        """``key`` as a read-only binary file object (for h5py and other libraries that take one)."""
        return StoredFile(self.open(key, what))

    def list(self, prefix: str, delimiter: bool = True) -> tuple[list[tuple[str, Version]], list[str]]:
        """The objects under ``prefix`` (keys and versions) and, with ``delimiter``, the prefixes one level
        down; only where :attr:`supports_listing`, else a :class:`~dali_mesh.storage.errors.DataFileError`."""
        from dali_mesh.storage.errors import DataFileError  # noqa: PLC0415

        raise DataFileError(self.name_of(prefix), f"its store ({self.spec!r}) cannot list a folder")

    def locate(self, key: str) -> tuple | None:
        """``(store, key, offset, length)``: the range of another store's file that holds ``key``, or
        ``None`` for bytes the store holds itself; only where :attr:`locates`."""
        from dali_mesh.storage.errors import DataFileError  # noqa: PLC0415

        raise DataFileError(self.name_of(key), f"its store ({self.spec!r}) keeps its keys itself: nothing to locate")

    def located_version(self, store: "ByteStore", key: str) -> Version | None:
        """The version of the file ``key`` of ``store`` that :meth:`locate` named, as this store saw it
        (default: ``store.stat(key)``)."""
        return store.stat(key)

    def local_path(self, key: str) -> str | None:
        """The path of this machine's file that holds ``key``'s bytes (for ``mmap``, ``O_DIRECT``, h5py by
        name), or ``None``: callers ask this, never whether a store "is local"."""
        return None

    @property
    def round_trip(self) -> tuple[float, float]:
        """What a request costs now: ``(latency s, bytes/s)`` (bytes/s 0: not measured), as C++'s ``Cost()``.
        Local files: latency 0; else what the native reader measured in this process, and before any 20 ms
        (an object store in the reader's region, as benchmarks/remote_bench.py models). Policies ask this."""
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
        """``(spec, credentials)`` for its source to carry into its workers in memory (a store's pickle
        holds none), or ``None`` without credentials."""
        return None

    def take_credentials(self, credentials) -> None:
        """Makes this store read with ``credentials`` (:meth:`credentials_state`'s second)."""

    def zarr_store(self, key: str):
        """A read-only zarr-python store rooted at ``key`` (default: a
        :class:`~dali_mesh.storage.zarr_store.ByteZarrStore` over this store's reads)."""
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
    """:meth:`StoredObject.readv` of a ``size``-byte object through ``read(dst, n, offset) -> got``: straight
    into a single writable buffer, else staged and scattered over ``buffers``."""
    views = [memoryview(b).cast("B") for b in buffers]
    n = min(sum(len(v) for v in views), size - offset)
    if n <= 0:
        return 0
    if len(views) == 1 and not views[0].readonly:
        return read(views[0], n, offset)
    staged = bytearray(n)
    return scatter(memoryview(staged)[:read(staged, n, offset)], views)


def split_listing(keys, prefix: str, delimiter: bool, version_of: Callable) -> tuple[list, list]:
    """:meth:`ByteStore.list` over all of a store's sorted ``keys`` (``version_of(key)`` gives versions); a
    ``prefix`` with a leading '/' (a ByteZarrStore at the root) is answered so."""
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
    """Fills ``bufs`` (``lens``: their sizes) from ``offset`` on, at most :data:`IOV_MAX` per request, looping
    over short reads; ``stats`` (an ``IOStats``) counts them. Raises
    :class:`~dali_mesh.storage.errors.TruncatedFileError` if the object shrank."""
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
