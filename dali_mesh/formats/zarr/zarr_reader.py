"""Read a window of one sample of a Zarr array (format v2 or v3, zarr-python >= 3).

Each box of the read plan is one region selection ``array[prefix, box]``: zarr fetches and decodes
only the chunks the box touches. The store is wrapped in a counter, so ``bytes_read`` and
``read_calls`` are the bytes and ``get`` calls the store really served. zarr is imported on first use.

Every key the store serves must be a regular file (a FIFO in place of a chunk or of the metadata
would block zarr for ever); a missing chunk reads as the array's fill value, as zarr defines it.

:mod:`.zarr_planner` plans the native reads of an array, :mod:`.zarr_writer` writes one (what
``dali-mesh convert`` writes).
"""
from __future__ import annotations

import json
import os
import stat

import numpy as np

from dali_mesh.io._common import (DataFileError, HeaderError, IOStats, MissingArrayError, NotRegularFileError,
                                  check_dtype, native_dtype)
from dali_mesh.formats.box_reads import ArrayBoxes, read_array_window
from dali_mesh.partition import Region
from dali_mesh.io.containers import check_store_dir
from dali_mesh.storage import store_of

__all__ = ["METADATA_KEYS", "open_zarr_array", "read_zarr_window"]

_counting_store_cls = None
#: the keys of an array's metadata (v3, v2), in a store's root or an array's folder
METADATA_KEYS = ("zarr.json", ".zarray")


def _check_key(store, key: str) -> None:
    """Refuse a key whose file exists but is not a regular file (zarr would block on a FIFO)."""
    root = getattr(store, "root", None)
    if root is None:  # not a local store: nothing on this file system to check
        return
    full = os.path.join(str(root), key)
    try:
        mode = os.stat(full).st_mode
    except OSError:
        return  # missing: zarr's own answer (None, a fill-value chunk)
    if not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "not a regular file"
        raise NotRegularFileError(full, f"Zarr key {key!r} is {kind}; a store holds regular files only")


def _counting_store(store):
    """Wrap a zarr store so that every ``get`` is counted (bytes and calls)."""
    global _counting_store_cls
    if _counting_store_cls is None:
        from zarr.storage import WrapperStore

        class CountingStore(WrapperStore):
            def __init__(self, store, counter=None, metadata=None):
                super().__init__(store)
                self.counter = counter if counter is not None else IOStats()
                #: key -> the bytes of each array metadata object zarr-python read whole (.zarray,
                #: zarr.json): what the array it opened was made from
                self.metadata = metadata if metadata is not None else {}

            def _with_store(self, store):
                return type(self)(store, self.counter, self.metadata)

            async def get(self, key, prototype, byte_range=None):
                _check_key(self._store, key)
                buf = await self._store.get(key, prototype, byte_range)
                self.counter.read_calls += 1
                if buf is not None:
                    self.counter.bytes_read += len(buf)
                    if byte_range is None and key.rsplit("/", 1)[-1] in (".zarray", "zarr.json"):
                        self.metadata[key] = buf.to_bytes()
                return buf

            async def get_partial_values(self, prototype, key_ranges):
                key_ranges = list(key_ranges)
                for key, _ in key_ranges:
                    _check_key(self._store, key)
                bufs = await self._store.get_partial_values(prototype, key_ranges)
                self.counter.read_calls += len(key_ranges)
                self.counter.bytes_read += sum(len(b) for b in bufs if b is not None)
                return bufs

        _counting_store_cls = CountingStore
    return _counting_store_cls(store)


def open_zarr_array(path: str | os.PathLike, name: str | None = None, *, reuse: bool = False):
    """Open a Zarr array read-only, its store wrapped in a byte counter; errors name the path.

    ``path`` is a directory store (v2 or v3); ``name`` the array's path inside it (``None``: the
    store is the array, or its root is a group holding exactly one array, as ``dali-mesh convert``
    writes: that one; with several, an error lists them). In an object store the open is one round
    trip (:func:`~dali_mesh.storage.zarr_store.open_array_objects`); ``reuse``: the plan's open, which
    takes what the source's open read (at the versions read then) instead of reading it again.
    """
    import zarr

    from dali_mesh.storage.zarr_store import ByteZarrStore, open_array_objects  # noqa: PLC0415 - imports zarr

    path = str(path)
    bytes_store, key = store_of(path)
    local = bytes_store.local_path(key)
    if local is not None:
        check_store_dir(local, "; check the path and the file list")
    zstore = bytes_store.zarr_store(key)
    opened = None
    if isinstance(zstore, ByteZarrStore):
        opened = zstore.opened = open_array_objects(bytes_store, key, name, reuse=reuse)
        if reuse and opened is not None and opened.array is not None:
            return opened.array  # made by the source's open from these objects, at these versions, and checked
    store = _counting_store(zstore)
    what = f"array {name!r}" if name else "the array at the store's root"
    if not name and not _root_is_array(opened):
        only = _only_array(store, path)
        if only is not None:
            name, what = only, f"array {only!r} (the only one in the store)"
    try:
        arr = zarr.open_array(store=store, path=name or "", mode="r")
    except DataFileError:
        raise
    except Exception as e:  # zarr raises several kinds, for a missing node and for corrupt metadata
        node = os.path.join(path, *(name or "").split("/"))
        meta = [os.path.join(node, k) for k in METADATA_KEYS if os.path.isfile(os.path.join(node, k))]
        if meta:  # the metadata is there, so it is corrupt, not missing
            raise HeaderError(path, f"metadata of {what} ({', '.join(meta)}) cannot be read "
                              f"({type(e).__name__}: {_short(e)}); the store is corrupt") from None
        if not isinstance(e, (zarr.errors.NodeNotFoundError, FileNotFoundError, KeyError)):
            # not "no such array": an object store's or a reference set's error (a refused option, a server's
            # answer), or metadata zarr-python cannot parse, named as it is
            raise HeaderError(path, f"{what} cannot be opened ({type(e).__name__}: {_short(e)})") from None
        names = []
        try:
            grp = zarr.open_group(store=store, mode="r")
            names = sorted(k for k, _ in grp.arrays())
        except Exception:
            pass
        missing = what if name else "array at the store's root"  # not "has no the array ..."
        raise MissingArrayError(path, f"has no {missing} ({type(e).__name__}); arrays in the store: {names}") from None
    check_dtype(path, arr.dtype, label=f"{what}: ")
    try:
        chunks = tuple(arr.chunks)
    except Exception:  # sharded arrays describe their chunks otherwise; zarr checked those
        chunks = ()
    if any(not isinstance(c, int) or c < 1 for c in chunks):
        raise HeaderError(path, f"{what} has chunk shape {chunks}; every chunk side must be at least 1: "
                          "the metadata is corrupt")
    if opened is not None:
        opened.array = arr
    return arr


def _root_is_array(opened) -> bool:
    """Whether the metadata objects an open read (``OpenedObjects``, or None) show that the store's root
    is an array: its ``zarr.json`` names node type ``array`` (zarr-python then opens it as v3 whatever
    else is there), or there is no ``zarr.json`` nor ``.zgroup`` and there is a ``.zarray``. Then it is no
    group, and :func:`_only_array`'s open of it as one (~1 ms of zarr-python) would only fail. False
    where they do not show it: zarr-python decides."""
    if opened is None:
        return False
    root = opened.prefix
    v3 = opened.objects.get(f"{root}/zarr.json")
    if v3 is not None:
        try:
            return json.loads(v3[0]).get("node_type") == "array"
        except (ValueError, AttributeError):  # not a JSON object: zarr-python's error says so
            return False
    return opened.missing(f"{root}/zarr.json") and opened.missing(f"{root}/.zgroup") and \
        opened.objects.get(f"{root}/.zarray") is not None


def _only_array(store, path: str) -> str | None:
    """The name of the only array in a store whose root is a group; ``None`` when the root is not a
    readable group (then it is opened as an array, and errors come from there); a
    :class:`MissingArrayError` listing them when the group holds none or several."""
    import zarr

    try:
        grp = zarr.open_group(store=store, mode="r")
        names = sorted(k for k, _ in grp.arrays())
    except Exception:  # noqa: BLE001 - not a group (an array, or corrupt metadata: reported by open_array)
        return None
    if len(names) == 1:
        return names[0]
    if not names:
        raise MissingArrayError(path, "is a Zarr group with no array at its top level; name the array "
                                "(--dataset / the array argument) with its path inside the store")
    raise MissingArrayError(path, f"is a Zarr group holding {len(names)} arrays {names}: name the one to read "
                            "(--dataset / the array argument)")


def _short(value, limit: int = 200) -> str:
    text = str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def read_zarr_window(array, region: Region, out: np.ndarray | None = None, **window) -> np.ndarray:
    """Fill ``out`` with the window of sample ``array[prefix]`` (a ``zarr.Array`` from
    :func:`open_zarr_array`), one region selection per box: :func:`~dali_mesh.formats.box_reads.read_array_window`
    (``window``: its ``prefix``, ``index_maps``, ``expected_shape``, ``expected_dtype`` and ``stats``); the
    bytes and calls counted are those the store served."""
    store = array.store
    inner = getattr(store, "_store", store)
    # the name a store gives itself (an Icechunk session's: its repository at its snapshot), else a local
    # store's folder, else the location of an object store's (or a reference set's) prefix
    named, root = getattr(inner, "name", None), getattr(inner, "root", None)
    path = named if isinstance(named, str) else str(root) if root is not None else (
        inner.store.name_of(inner.prefix) if hasattr(inner, "prefix") and hasattr(inner, "store") else repr(inner))
    counter = getattr(store, "counter", None)
    before = counter.copy() if counter is not None else None

    def read_box(buf, dst, src, local):
        try:
            buf[dst] = array[src]
        except (DataFileError, MemoryError):
            raise
        except Exception as e:  # noqa: BLE001 - a codec's own errors (zlib.error, numcodecs', blosc's) are any class
            raise DataFileError(path, f"reading array {array.path or '/'} failed ({type(e).__name__}: {e}); "
                                "a chunk is corrupt or unreadable") from None

    def counted(local, plan, prefix):
        if counter is not None:
            local.bytes_read += counter.bytes_read - before.bytes_read
            local.read_calls += counter.read_calls - before.read_calls

    full = tuple(array.shape)
    return read_array_window(ArrayBoxes(path, full, native_dtype(array.dtype), f"array shape {full}", read_box,
                                        counted, unit="store"), region, out, **window)
