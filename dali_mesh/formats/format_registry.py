"""The registry of formats: the built-in ones register themselves (each folder's ``<x>_format.py`` ends
with :func:`register_format`), and a format of another package is named by an entry point of the
``dali_mesh.formats`` group, as xarray finds its backends (``backends/plugins.py``)::

    [project.entry-points."dali_mesh.formats"]
    grib = "my_package.grib:GribFormat"       # an ArrayFormat subclass, or an instance of one

The entry points are loaded once, on the first lookup (so a process that never asks pays nothing).
A format's name is one reader everywhere (the parent and DALI's worker processes find a format by its name):
- a name is never taken twice: :func:`register_format` of a name another class holds is a
  :class:`FormatPluginError` naming both (a module that registers ``"npy"`` would otherwise read in the
  parent with one reader and in the workers with another); an entry point naming a built-in format's
  name is not used (a warning names its package), and a name two packages declare is used by neither:
  its lookups are a :class:`FormatPluginError` naming both packages;
- a broken entry point (it fails to import, names no format, or a format of another name) is skipped
  with a warning naming it and its package, as xarray skips a broken backend: the other formats,
  the built-in ones first, work; a lookup of the broken one's own name is the error that says why.
"""
from __future__ import annotations

import threading
import warnings
from importlib import metadata
from typing import Iterator, Mapping

from dali_mesh.formats.array_format import ArrayFormat

__all__ = ["ENTRY_POINT_GROUP", "FORMATS", "FormatPluginError", "format_named", "format_of", "register_format",
           "written_suffixes"]

#: the entry-point group other packages name their formats in
ENTRY_POINT_GROUP = "dali_mesh.formats"


class FormatPluginError(RuntimeError):
    """A format named in the ``dali_mesh.formats`` entry-point group cannot be used (it fails to
    import, is no format, takes another format's name, or two packages declare its name), or
    :func:`register_format` was given a name another format holds."""


def _package(ep) -> str:
    """The distribution that declares the entry point ``ep`` (its module where none is known)."""
    dist = getattr(ep, "dist", None)
    name = getattr(dist, "name", None) if dist is not None else None
    return f"package {name!r}" if name else f"module {ep.value.split(':', 1)[0]!r}"


def _owner(fmt: ArrayFormat) -> str:
    """Who registered ``fmt``: dali_mesh's built-in formats, or the class's module."""
    cls = type(fmt)
    if cls.__module__.startswith("dali_mesh."):
        return f"dali_mesh's built-in {cls.__qualname__}"
    return f"{cls.__module__}.{cls.__qualname__}"


def _plugin_format(ep) -> ArrayFormat:
    """The format an entry point names (a subclass of :class:`ArrayFormat` is instantiated)."""
    what = f"entry point {ep.name!r} = {ep.value!r} of group {ENTRY_POINT_GROUP!r} ({_package(ep)})"
    try:
        obj = ep.load()
        fmt = obj() if isinstance(obj, type) and issubclass(obj, ArrayFormat) else obj
    except (Exception, SystemExit) as e:  # noqa: BLE001 - whatever a third-party module raises, named with it
        raise FormatPluginError(f"{what} cannot be loaded ({type(e).__name__}: {e}); fix or uninstall the package "
                                "that declares it") from e
    if not isinstance(fmt, ArrayFormat):
        raise FormatPluginError(f"{what} names {obj!r}, which is neither an ArrayFormat nor a subclass of one "
                                "(dali_mesh.formats.ArrayFormat)")
    if fmt.name != ep.name:
        raise FormatPluginError(f"{what} names a format called {fmt.name!r}: the entry point's name must be the "
                                "format's name (its name in messages, pickles and format_named)")
    return fmt


class _Registry(Mapping):
    """The registered formats by name, in the order a folder is searched: the built-in ones, then
    those of the entry-point group, loaded on the first lookup. ``_refused``: the names no format
    answers to and why (a broken entry point's, a name two packages declare)."""

    def __init__(self) -> None:
        self._formats: dict[str, ArrayFormat] = {}
        self._refused: dict[str, str] = {}
        self._plugins_loaded = False
        self._loading = False
        # one thread loads the entry points; another's first lookup waits for all of them (a lookup from a
        # plugin's own import, on the loading thread, sees the formats loaded so far)
        self._lock = threading.RLock()

    def register(self, fmt: ArrayFormat) -> None:
        taken = self._formats.get(fmt.name)
        if taken is not None and type(taken) is not type(fmt):
            raise FormatPluginError(f"format {fmt.name!r} is already {_owner(taken)}: {_owner(fmt)} may not take "
                                    "its name (sources find a format by its name, in DALI's worker processes too, "
                                    "and would read with two readers); give it another name")
        self._formats.setdefault(fmt.name, fmt)

    def _loaded(self) -> dict[str, ArrayFormat]:
        if self._plugins_loaded:
            return self._formats
        with self._lock:
            if self._plugins_loaded or self._loading:
                return self._formats
            self._loading = True
            try:
                declared: dict[str, list] = {}
                for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
                    if ep not in declared.setdefault(ep.name, []):
                        declared[ep.name].append(ep)
                for name, eps in declared.items():
                    self._take(name, eps)
                self._plugins_loaded = True  # not when interrupted: the next lookup loads them again
            finally:
                self._loading = False
        return self._formats

    def _take(self, name: str, eps: list) -> None:
        """Registers the format the entry points ``eps`` declare as ``name``: refused when two packages
        declare it, skipped when it is broken or a built-in holds the name."""
        if len(eps) > 1:
            both = " and ".join(f"{_package(ep)} ({ep.value})" for ep in eps)
            self._refuse(name, f"format {name!r} is declared by {both} (entry-point group {ENTRY_POINT_GROUP!r}): "
                               "neither is used, so that no process reads with one and another with the other; "
                               "uninstall one of the packages")
            return
        before = dict(self._formats)
        try:
            fmt = _plugin_format(eps[0])
        except FormatPluginError as e:
            # what its module registered before it failed goes too: a skipped plugin leaves no format behind
            # (a worker whose import of it failed otherwise would not have them)
            self._formats.clear()
            self._formats.update(before)
            self._refuse(name, str(e))
            return
        taken = self._formats.get(name)
        if taken is None:
            self._formats[name] = fmt
        elif type(taken) is not type(fmt):
            warnings.warn(f"entry point {name!r} of group {ENTRY_POINT_GROUP!r} of {_package(eps[0])} "
                          f"({type(fmt).__qualname__}) is not used: format {name!r} is {_owner(taken)}, which keeps "
                          "it; give the plugin's format another name", RuntimeWarning, stacklevel=4)

    def _refuse(self, name: str, why: str) -> None:
        if name not in self._refused:
            warnings.warn(f"{why} (skipped: the other formats are used)", RuntimeWarning, stacklevel=5)
        self._refused[name] = why

    def __getitem__(self, name: str) -> ArrayFormat:
        formats = self._loaded()
        if name not in formats and name in self._refused:
            raise FormatPluginError(self._refused[name])
        return formats[name]

    def __contains__(self, name) -> bool:
        return name in self._loaded()

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._loaded()))

    def __len__(self) -> int:
        return len(self._loaded())

    def __repr__(self) -> str:
        return f"FORMATS({', '.join(self._formats)}{'' if self._plugins_loaded else ', entry points not loaded yet'})"


#: the registered formats by name, in the order a folder is searched (a read-only mapping)
FORMATS: Mapping[str, ArrayFormat] = _Registry()


def register_format(fmt: ArrayFormat) -> ArrayFormat:
    """Registers ``fmt`` under its name (the sources, the CLI and pickling find it there) and returns it.
    Registering again a format of the same class keeps the first; a name another class holds is a
    :class:`FormatPluginError` naming both."""
    if not isinstance(fmt, ArrayFormat):
        raise TypeError(f"register_format takes an ArrayFormat, got {fmt!r}")
    FORMATS.register(fmt)
    return fmt


def format_named(name: str) -> ArrayFormat:
    """The registered format called ``name``; ``ValueError`` listing the formats when there is none,
    :class:`FormatPluginError` saying why when a plugin of that name was not used."""
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"no format named {name!r} (formats: {', '.join(FORMATS)})") from None


def written_suffixes() -> tuple[str, ...]:
    """The names of the copies the registered formats write (``.h5``, ``.hdf5``, ``.zarr``), in the
    registry's order."""
    return tuple(s for fmt in FORMATS.values() for s in fmt.write_suffixes)


def format_of(location) -> ArrayFormat | None:
    """The format that says it reads ``location`` (by its name), or ``None``."""
    for fmt in FORMATS.values():
        if fmt.probe(location):
            return fmt
    return None
