"""Byte stores: where the bytes of the formats live, behind one seam (:mod:`.byte_store`), found by URL scheme.

A source resolves each of its locations once, with its own ``storage_options``, into a
:class:`StoredLocation` (:func:`resolve_locations`), which everything below it reads through: no table of
options keyed by location exists. Local paths: :class:`~dali_mesh.storage.local.LocalStore`; ``s3://``,
``gs://``, ``http(s)://``: :class:`~dali_mesh.storage.remote.RemoteStore`; ``memory://``:
:class:`~dali_mesh.storage.memory.MemoryStore`; ``reference://``:
:class:`~dali_mesh.storage.references.ReferenceStore`; ``icechunk://``:
:class:`~dali_mesh.storage.icechunk.IcechunkStore`. Another backend: :func:`register_scheme` and
docs/extending.md.
"""
from __future__ import annotations

import importlib
import os
import re
import threading
import weakref
from typing import Callable

from dali_mesh.storage.byte_store import ByteStore, StoredFile, StoredObject, Version, read_exactly, readv_all
from dali_mesh.storage.errors import (DataFileError, FileChangedError, MissingFileError, NotRegularFileError,
                                      TruncatedFileError)
from dali_mesh.storage.local import LOCAL, LocalStore
from dali_mesh.plugin_registry import PluginRegistry

__all__ = ["ENTRY_POINT_GROUP", "SCHEMES", "StorePluginError", "ByteStore", "DataFileError", "FileChangedError", "LOCAL", "LocalStore", "MissingFileError",
           "NotRegularFileError", "StoredFile", "StoredLocation", "StoredObject", "TruncatedFileError",
           "UnsupportedLocationError", "Version", "attach_credentials", "carry_credentials", "read_exactly",
           "readv_all", "local_path_of", "register_scheme", "resolve_locations", "store_of", "stores_of"]

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")  # RFC 3986's scheme
#: the entry-point group other packages name their stores in, by URL scheme:
#: ``[project.entry-points."dali_mesh.stores"] myfs = "my_package.store:resolve"``
ENTRY_POINT_GROUP = "dali_mesh.stores"


class UnsupportedLocationError(DataFileError):
    """A location whose URL scheme no store of this build reads."""


class StorePluginError(RuntimeError):
    """A store named in the ``dali_mesh.stores`` entry-point group cannot be used (it fails to import,
    names no resolver, or two packages declare its scheme), or :func:`register_scheme` was given a scheme
    another resolver holds."""


def _resolver(what: str, ep, obj):
    if not _SCHEME.fullmatch(ep.name) or ep.name != ep.name.lower():  # lookups are by the lower-case scheme
        raise StorePluginError(f"{what}: its name must be a URL scheme in lower case (a letter, then letters, digits, "
                               "'+', '-' or '.'), as locations are looked up")
    if not callable(obj):
        raise StorePluginError(f"{what} names {obj!r}, which is not a resolver: a callable (location, options) -> "
                               "(ByteStore, key)")
    return obj


def _resolver_owner(resolve) -> str:
    module = getattr(resolve, "__module__", "") or ""
    name = getattr(resolve, "__qualname__", type(resolve).__qualname__)
    return f"dali_mesh's built-in {name}" if module.startswith("dali_mesh.") else f"{module}.{name}"


def _same_resolver(a, b) -> bool:
    return a is b or (getattr(a, "__module__", None), getattr(a, "__qualname__", None)) == (
        getattr(b, "__module__", None), getattr(b, "__qualname__", None))


#: the resolvers by URL scheme (lower case): the built-in stores, then the entry points of ``dali_mesh.stores``,
#: with the formats' rules (plugin_registry: a scheme is never taken twice, a broken plugin is skipped)
SCHEMES: PluginRegistry[Callable[[str, dict], tuple[ByteStore, str]]] = PluginRegistry(
    ENTRY_POINT_GROUP, "store", StorePluginError, _resolver, _resolver_owner, _same_resolver)


def register_scheme(scheme: str, resolve: Callable[[str, dict], tuple[ByteStore, str]]) -> None:
    """Makes ``scheme://...`` locations read by the store ``resolve(location, options)`` returns
    (with the key in it). A scheme another resolver holds is a :class:`StorePluginError` naming both."""
    if not _SCHEME.fullmatch(scheme):
        raise ValueError(f"{scheme!r} is not a URL scheme (a letter, then letters, digits, '+', '-' or '.')")
    SCHEMES.register(scheme.lower(), resolve)


class StoredLocation(str):
    """A location resolved once into its ``store`` and ``key``: a ``str`` naming it as errors, fingerprints
    and checkpoints show it (:meth:`~ByteStore.name_of`), read through :func:`store_of` without resolving it
    again. It pickles with its store (credentials travel apart: :func:`carry_credentials`).

    ``loc / "t2m"`` (:meth:`child`) is a key below it in the same store. A plain string made from it
    otherwise (``f"{loc}/t2m"``) that would resolve with the environment's defaults to another store is
    refused by :func:`store_of` (docs/remote-storage.md, "Locations and options")."""

    store: ByteStore
    key: str

    def __new__(cls, store: ByteStore, key: str) -> "StoredLocation":
        loc = super().__new__(cls, store.name_of(key))
        loc.store, loc.key = store, key
        root = _root(loc)
        if root:
            with _resolved_lock:
                _resolved.setdefault(root, weakref.WeakSet()).add(loc)
        return loc

    def child(self, *parts: str) -> "StoredLocation":
        """The location of ``parts`` (joined by '/') below this one, in its store: ``loc.child("t2m",
        ".zarray")`` or ``loc / "t2m" / ".zarray"``. A part is a relative key: not empty, not starting
        with '/', without '.' or '..' steps (a child stays below its parent) or control characters."""
        steps = []
        for part in parts:
            if not isinstance(part, str):
                raise TypeError(f"a child of a location is named by str, not {type(part).__name__}")
            for step in part.split("/"):
                if step in ("", ".", "..") or any(ord(c) < 0x20 or ord(c) == 0x7F for c in step):
                    raise ValueError(f"{part!r} is not a child of {str.__str__(self)!r}: its steps must be non-empty, "
                                     "not '.' or '..', without a leading or doubled '/' or control characters")
                steps.append(step)
        if not steps:
            raise ValueError("child() needs at least one part")
        return StoredLocation(self.store, self.store.child_key(self.key, steps))

    def __truediv__(self, part: str) -> "StoredLocation":
        return self.child(part)

    def __str__(self) -> str:
        # str(loc) keeps the store (readers take str(path) of what they are given); an operation that
        # makes a new string (slicing, +, rstrip) gives a plain location
        return self

    def __reduce__(self):
        return (StoredLocation, (self.store, self.key))

    def __repr__(self) -> str:
        return f"StoredLocation({str.__repr__(self)})"


def stores_of(locations) -> list:
    """The distinct store objects (by identity, as one source's locations share one, pickled too) of the
    :class:`StoredLocation` among ``locations``, in order."""
    found: dict[int, ByteStore] = {}
    for location in locations:
        if isinstance(location, StoredLocation):
            found.setdefault(id(location.store), location.store)
    return list(found.values())


def carry_credentials(stores) -> dict:
    """``{spec: credentials}`` of ``stores`` (:meth:`ByteStore.credentials_state`), for a source to carry
    into DALI's worker processes in memory, as it carries its ``storage_options``."""
    carried = {}
    for store in stores:
        state = store.credentials_state()
        if state is not None:
            carried[state[0]] = state[1]
    return carried


def attach_credentials(stores, carried: dict) -> None:
    """Gives each of ``stores`` (unpickled in a worker) the credentials ``carried``
    (:func:`carry_credentials`) for its spec."""
    for store in stores:
        credentials = carried.get(store.spec)
        if credentials is not None:
            store.take_credentials(credentials)


def resolve_locations(locations, options: dict | None) -> list:
    """``locations`` with each non-local one resolved once with ``options`` into a :class:`StoredLocation`;
    locations of equal stores share one store object."""
    out = []
    shared: dict[ByteStore, ByteStore] = {}
    for location in locations:
        if isinstance(location, StoredLocation):
            out.append(location)
            continue
        location = os.fspath(location)
        store, key = store_of(location, options)
        if store.local_path(key) is not None:
            out.append(location)
            continue
        out.append(StoredLocation(shared.setdefault(store, store), key))
    return out


def store_of(location, options: dict | None = None) -> tuple[ByteStore, str]:
    """The store and key of ``location``: a :class:`StoredLocation`'s own (resolved once by its
    source); a local path (or ``file://`` URL) is a key of the local store; ``scheme://...`` goes to the
    store registered for its scheme, with ``options`` (default: the environment's, as boto3 reads it)."""
    if isinstance(location, StoredLocation):
        return location.store, location.key
    location = os.fspath(location)
    scheme, sep, rest = location.partition("://")
    if not sep or not _SCHEME.fullmatch(scheme):
        return LOCAL, location
    scheme = scheme.lower()
    if scheme == "file":
        return LOCAL, _file_url_path(location, rest)
    resolve = SCHEMES.get(scheme)  # a plugin's scheme that was refused: StorePluginError saying why
    if resolve is None:
        known = ", ".join(sorted(SCHEMES)) or "none"
        raise UnsupportedLocationError(location, f"no store of this build reads {scheme}:// locations (local paths "
                                                 f"and file:// are read; other schemes registered: {known})")
    store, key = resolve(location, dict(options or {}))
    if options is None:
        _refuse_lost_store(location, store)
    return store, key


#: the StoredLocations alive in this process, by the root of their names (``s3://bucket``,
#: ``https://host``): while one lives, a plain location made from its name that resolves with the
#: environment's defaults to another store than its own is refused (:func:`_refuse_lost_store`)
_resolved: dict[str, weakref.WeakSet] = {}
_resolved_lock = threading.Lock()


def _root(name: str) -> str:
    """``scheme://authority`` of an object store's location (``s3://bucket``, ``https://host:port``); ``""``
    for a local one (``memory://``, ``icechunk:///path``) and for nested ones (``reference://s3://...``,
    ``icechunk://s3://...``: their sets resolve their own locations with the options they were given)."""
    scheme, sep, rest = name.partition("://")
    authority = rest.split("/", 1)[0]
    if not sep or "://" in rest or not authority or scheme.lower() in ("memory", "file"):
        return ""
    return f"{scheme.lower()}://{authority}"


def _derived(plain: str, name: str) -> bool:
    """Whether ``plain`` could be made from the location named ``name``: the same, below it (``f"{loc}/t2m"``,
    ``os.path.join``) or above it (``loc.rstrip("/")``, ``os.path.dirname``), at a '/'."""
    a, b = plain.rstrip("/"), name.rstrip("/")
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")


def _refuse_lost_store(location: str, store: ByteStore) -> None:
    """Refuses ``location`` (a plain string resolved without options to ``store``) where the live
    StoredLocations it could be derived from (:func:`_derived`) all have other stores: it would silently
    read another endpoint with the environment's keys."""
    root = _root(location)
    with _resolved_lock:  # locations made on other threads meanwhile (a set may not change while it is read)
        known = list(_resolved.get(root) or ()) if root else []
    alive = [loc for loc in known if _derived(location, str.__str__(loc))]
    if not alive or any(loc.store == store for loc in alive):
        return
    from dali_mesh.storage.names import shown  # noqa: PLC0415

    raise DataFileError(shown(location), "is a plain string under a location this process resolved with storage "
                                         "options (another endpoint or other credentials); resolved again with "
                                         "the environment's defaults it would read another store. Derive it from "
                                         "the resolved location (loc / 'name' or loc.child('name')), or give its "
                                         "storage_options (storage_options={} for the environment's defaults)")


def local_path_of(location) -> str | None:
    """The path of this machine's file that holds ``location`` (:meth:`ByteStore.local_path` of its
    store and key), or ``None`` for an object of another store."""
    store, key = store_of(location)
    return store.local_path(key)


def _file_url_path(location: str, rest: str) -> str:
    """The path of a ``file://`` URL (RFC 8089); one naming another host (``file://data/x.npy`` meant as a
    relative path too) is refused."""
    host, _, path = rest.partition("/")
    if host == "" or host.lower() == "localhost":
        return "/" + path
    raise UnsupportedLocationError(location, f"names the host {host!r}: file:// URLs are read on this host only "
                                             "(file:///abs/path or file://localhost/abs/path; a relative path "
                                             "is given without file://)")


def _built_in(module: str, name: str):
    """The resolver ``name`` of ``dali_mesh.storage.<module>``, imported at its first location."""
    def resolve(location: str, options: dict):
        return getattr(importlib.import_module(f"dali_mesh.storage.{module}"), name)(location, options)

    resolve.__module__, resolve.__qualname__ = f"dali_mesh.storage.{module}", name
    return resolve


for _scheme, _module, _name in (("s3", "remote", "resolve_s3"), ("gs", "remote", "resolve_gs"),
                                ("http", "remote", "resolve_http"), ("https", "remote", "resolve_http"),
                                ("memory", "memory", "resolve_memory"),
                                ("reference", "references", "resolve_reference"),
                                ("icechunk", "icechunk", "resolve_icechunk")):
    register_scheme(_scheme, _built_in(_module, _name))
# its check at every fork (not the library: that is imported when a repository is read): a process that used
# the icechunk library itself, then forks a loader's workers that resolve a repository, must see them refused
from dali_mesh.storage import icechunk as _icechunk_forks  # noqa: E402, F401
