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

from typing import Mapping

from dali_mesh.formats.array_format import ArrayFormat
from dali_mesh.plugin_registry import PluginRegistry

__all__ = ["ENTRY_POINT_GROUP", "FORMATS", "FormatPluginError", "format_named", "format_of", "register_format",
           "written_suffixes"]

#: the entry-point group other packages name their formats in
ENTRY_POINT_GROUP = "dali_mesh.formats"


class FormatPluginError(RuntimeError):
    """A format named in the ``dali_mesh.formats`` entry-point group cannot be used (it fails to
    import, is no format, takes another format's name, or two packages declare its name), or
    :func:`register_format` was given a name another format holds."""


def _owner(fmt: ArrayFormat) -> str:
    """Who registered ``fmt``: dali_mesh's built-in formats, or the class's module."""
    cls = type(fmt)
    if cls.__module__.startswith("dali_mesh."):
        return f"dali_mesh's built-in {cls.__qualname__}"
    return f"{cls.__module__}.{cls.__qualname__}"


def _plugin_format(what: str, ep, obj) -> ArrayFormat:
    """The format an entry point names (a subclass of :class:`ArrayFormat` is instantiated)."""
    try:
        fmt = obj() if isinstance(obj, type) and issubclass(obj, ArrayFormat) else obj
    except (Exception, SystemExit) as e:  # noqa: BLE001 - whatever a third-party class raises, named with it
        raise FormatPluginError(f"{what} cannot be loaded ({type(e).__name__}: {e}); fix or uninstall the package "
                                "that declares it") from e
    if not isinstance(fmt, ArrayFormat):
        raise FormatPluginError(f"{what} names {obj!r}, which is neither an ArrayFormat nor a subclass of one "
                                "(dali_mesh.formats.ArrayFormat)")
    if fmt.name != ep.name:
        raise FormatPluginError(f"{what} names a format called {fmt.name!r}: the entry point's name must be the "
                                "format's name (its name in messages, pickles and format_named)")
    return fmt


#: the registered formats by name, in the order a folder is searched (a read-only mapping)
FORMATS: Mapping[str, ArrayFormat] = PluginRegistry(ENTRY_POINT_GROUP, "format", FormatPluginError, _plugin_format,
                                                    _owner, lambda a, b: type(a) is type(b))


def register_format(fmt: ArrayFormat) -> ArrayFormat:
    """Registers ``fmt`` under its name (the sources, the CLI and pickling find it there) and returns it.
    Registering again a format of the same class keeps the first; a name another class holds is a
    :class:`FormatPluginError` naming both."""
    if not isinstance(fmt, ArrayFormat):
        raise TypeError(f"register_format takes an ArrayFormat, got {fmt!r}")
    FORMATS.register(fmt.name, fmt)
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
