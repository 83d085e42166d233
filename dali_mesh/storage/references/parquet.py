"""Parquet reference sets: the folder (``refs.parq/``: a ``.zmetadata`` and ``<array>/refs.<n>.parq`` records)
that fsspec's ``LazyReferenceMapper``, kerchunk's ``refs_to_dataframe`` and VirtualiZarr's
``to_kerchunk(format="parquet")`` write, read by fsspec's own ``LazyReferenceMapper`` (pandas and
fastparquet; no Parquet read here) into the version 1 document a JSON set is, once, when the store is
first used. The folder's files are read through the set location's byte store (local, ``s3://``... with
the source's ``storage_options``), as a JSON set's file is.

Every key is taken into memory (as a JSON set's are): the native planner looks up every chunk of a window,
and a worker gets the set in the store's pickle, never a folder rewritten since. A set of millions of
chunks then costs its references' size in memory at planning, as it does in a JSON set."""
from __future__ import annotations

import base64

from dali_mesh.storage.byte_store import read_exactly
from dali_mesh.storage.errors import DataFileError, MissingFileError, needed

__all__ = ["parquet_document"]

#: where a Parquet set keeps its metadata and record size, in its folder
ZMETADATA = ".zmetadata"


class _StoreFiles:
    """What ``LazyReferenceMapper`` asks of an fsspec filesystem (``cat_file``, ``unstrip_protocol``),
    answered by a byte store: the set's files are read as the store reads any file (its credentials,
    its errors)."""

    def __init__(self, store) -> None:
        self.store = store

    def cat_file(self, path: str, start=None, end=None) -> bytes:
        with self.store.open(path, "Parquet reference file") as obj:
            data = read_exactly(obj, obj.size, 0)
            obj.check_unchanged()
        return data[start:end]

    def unstrip_protocol(self, path: str) -> str:
        return path


def _lazy_mapper():
    """fsspec's ``LazyReferenceMapper`` with its Parquet reader, or an error naming what to install."""
    def load():
        import fastparquet  # noqa: F401, PLC0415 - the engine LazyReferenceMapper reads with
        import pandas  # noqa: F401, PLC0415
        from fsspec.implementations.reference import LazyReferenceMapper  # noqa: PLC0415

        return LazyReferenceMapper

    return needed("reading Parquet reference sets needs fsspec, pandas and fastparquet", load)


def _value(ref):
    """A reference as a version 1 document holds it: bytes as text (``base64:`` where they are not UTF-8
    text or could be read as base64), a range as ``[url, offset, length]`` of Python ints."""
    if isinstance(ref, (bytes, bytearray, memoryview)):
        data = bytes(ref)
        try:
            text = data.decode()
        except UnicodeDecodeError:
            text = None
        if text is None or text.startswith("base64:"):
            return "base64:" + base64.b64encode(data).decode()
        return text
    return [ref[0]] + [int(v) for v in ref[1:]]


def parquet_document(store, key: str, location) -> dict | None:
    """The Parquet reference set in the folder ``key`` of ``store`` as a version 1 document (``{"version":
    1, "refs": {...}}``), ``None`` when that folder holds no ``.zmetadata`` (it is no Parquet set);
    ``location`` names the set in errors."""
    root = key.rstrip("/")
    if store.stat(f"{root}/{ZMETADATA}") is None:
        return None
    mapper = _lazy_mapper()(root, fs=_StoreFiles(store))
    refs = {}
    try:
        for name in mapper:  # the keys that exist (metadata, then each array's chunks)
            refs[name] = _value(mapper[name])
    except MissingFileError as e:
        raise DataFileError(location, f"is a Parquet reference set missing one of its files ({e})") from None
    except (ValueError, KeyError, TypeError, OSError) as e:
        raise DataFileError(location, f"cannot be read as a Parquet reference set ({type(e).__name__}: {e})") from None
    return {"version": 1, "refs": refs}
