"""Byte stores: where the bytes of the formats live, behind one seam (see :mod:`.base`).

``store_of(location)`` gives the store and key of a location. Local paths are read by the
:class:`~dali_mesh.storage.local.LocalStore` (POSIX: ``preadv``, ``fadvise``, ``O_DIRECT``, ``mmap``);
``s3://``, ``gs://`` and ``http(s)://`` locations by the
:class:`~dali_mesh.storage.remote.RemoteStore` (ranged GETs through libcurl). Another backend
registers its URL scheme with :func:`register_scheme` and passes the shared store tests
(``tests/storage/store_tests.py``).
"""
from __future__ import annotations

import os
import re
from typing import Callable

from dali_mesh.storage.base import ByteStore, StoredFile, StoredObject, Version, read_exactly, readv_all
from dali_mesh.storage.errors import (DataFileError, FileChangedError, MissingFileError, NotRegularFileError,
                                      TruncatedFileError)
from dali_mesh.storage.local import LOCAL, LocalStore

__all__ = ["ByteStore", "DataFileError", "FileChangedError", "LOCAL", "LocalStore", "MissingFileError",
           "NotRegularFileError", "StoredFile", "StoredObject", "TruncatedFileError", "UnsupportedLocationError", "Version",
           "read_exactly", "readv_all", "register_options", "register_scheme", "store_of"]

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")  # RFC 3986's scheme
_SCHEMES: dict[str, Callable[[str, dict], tuple[ByteStore, str]]] = {}
#: storage options given for locations (and what lies under them), in this process
_OPTIONS: dict[str, dict] = {}


class UnsupportedLocationError(DataFileError):
    """A location whose URL scheme no store of this build reads."""


def register_scheme(scheme: str, resolve: Callable[[str, dict], tuple[ByteStore, str]]) -> None:
    """Makes ``scheme://...`` locations read by the store ``resolve(location, options)`` returns
    (with the key in it)."""
    _SCHEMES[scheme.lower()] = resolve


def _location_key(location: str) -> str:
    scheme, _, rest = location.partition("://")
    return f"{scheme.lower()}://{rest.rstrip('/')}"


def register_options(locations, options: dict | None) -> None:
    """Makes :func:`store_of` read ``locations`` and everything under them (a Zarr store's keys) with
    ``options`` (``storage_options``, named as fsspec's s3fs names them) when it is given none: a
    source registers its ``storage_options`` for its own locations, so that every reader below it, in
    this process and in its worker processes, finds them (another source's locations in the same bucket
    are not affected). ``None`` forgets them. Local paths take none."""
    if isinstance(locations, (str, os.PathLike)):
        locations = [locations]
    for location in locations:
        location = os.fspath(location)
        if "://" in location and not location.lower().startswith("file://"):
            if options is None:
                _OPTIONS.pop(_location_key(location), None)
            else:
                _OPTIONS[_location_key(location)] = dict(options)


def _registered_options(location: str) -> dict | None:
    """The options registered for ``location`` or the nearest location above it."""
    if not _OPTIONS:
        return None
    key = _location_key(location)
    while True:
        hit = _OPTIONS.get(key)
        if hit is not None:
            return hit
        cut = key.rfind("/")
        if cut <= key.find("://") + 2:
            return None
        key = key[:cut]


def store_of(location, options: dict | None = None) -> tuple[ByteStore, str]:
    """The store and key of ``location``: a local path (or ``file://`` URL) is a key of the local
    store; ``scheme://...`` goes to the store registered for its scheme, with ``options`` (default:
    those registered for its bucket by :func:`register_options`, else the environment's)."""
    location = os.fspath(location)
    scheme, sep, rest = location.partition("://")
    if not sep or not _SCHEME.fullmatch(scheme):
        return LOCAL, location
    scheme = scheme.lower()
    if scheme == "file":
        return LOCAL, rest
    resolve = _SCHEMES.get(scheme)
    if resolve is None:
        known = ", ".join(sorted(_SCHEMES)) or "none"
        raise UnsupportedLocationError(location, f"no store of this build reads {scheme}:// locations (local paths "
                                                 f"and file:// are read; other schemes registered: {known})")
    if options is None:
        options = _registered_options(location)
    return resolve(location, dict(options or {}))


def _remote(name: str):
    def resolve(location: str, options: dict):
        from dali_mesh.storage import remote  # noqa: PLC0415 - ctypes and the kernels library on first use

        return getattr(remote, name)(location, options)

    return resolve


for _scheme, _name in (("s3", "resolve_s3"), ("gs", "resolve_gs"), ("http", "resolve_http"), ("https", "resolve_http")):
    register_scheme(_scheme, _remote(_name))
