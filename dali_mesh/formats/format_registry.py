"""The registry of formats: the built-in ones register themselves (each folder's ``<x>_format.py`` ends
with :func:`register_format`), and a format of another package is named by an entry point of the
``dali_mesh.formats`` group, as xarray finds its backends (``backends/plugins.py``)::

    [project.entry-points."dali_mesh.formats"]
    grib = "my_package.grib:GribFormat"       # an ArrayFormat subclass, or an instance of one

The entry points are loaded once, on the first lookup (so a process that never asks pays nothing),
and a broken one is a :class:`FormatPluginError` naming it, at every lookup until it is fixed.
"""
from __future__ import annotations

from importlib import metadata
from typing import Iterator, Mapping

from dali_mesh.formats.array_format import ArrayFormat

__all__ = ["ENTRY_POINT_GROUP", "FORMATS", "FormatPluginError", "format_named", "format_of", "register_format",
           "written_suffixes"]

#: the entry-point group other packages name their formats in
ENTRY_POINT_GROUP = "dali_mesh.formats"


class FormatPluginError(RuntimeError):
    """A format named in the ``dali_mesh.formats`` entry-point group cannot be used (it fails to
    import, is no format, or takes a name already registered)."""


def _plugin_format(ep) -> ArrayFormat:
    """The format an entry point names (a subclass of :class:`ArrayFormat` is instantiated)."""
    what = f"entry point {ep.name!r} = {ep.value!r} of group {ENTRY_POINT_GROUP!r}"
    try:
        obj = ep.load()
        fmt = obj() if isinstance(obj, type) and issubclass(obj, ArrayFormat) else obj
    except Exception as e:  # noqa: BLE001 - whatever a third-party module raises, named with its entry point
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
    those of the entry-point group, loaded on the first lookup."""

    def __init__(self) -> None:
        self._formats: dict[str, ArrayFormat] = {}
        self._plugins_loaded = False

    def register(self, fmt: ArrayFormat) -> None:
        self._formats[fmt.name] = fmt

    def _loaded(self) -> dict[str, ArrayFormat]:
        if not self._plugins_loaded:
            found = [_plugin_format(ep) for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)]
            for fmt in found:  # all or none: a broken one leaves the registry as it was
                taken = self._formats.get(fmt.name)
                if taken is not None and type(taken) is not type(fmt):
                    raise FormatPluginError(f"entry point {fmt.name!r} of group {ENTRY_POINT_GROUP!r} names "
                                            f"{type(fmt).__qualname__}, but format {fmt.name!r} is already "
                                            f"{type(taken).__qualname__}: give one of them another name")
            for fmt in found:
                self._formats.setdefault(fmt.name, fmt)
            self._plugins_loaded = True
        return self._formats

    def __getitem__(self, name: str) -> ArrayFormat:
        return self._loaded()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._loaded()))

    def __len__(self) -> int:
        return len(self._loaded())

    def __repr__(self) -> str:
        return f"FORMATS({', '.join(self._formats)}{'' if self._plugins_loaded else ', entry points not loaded yet'})"


#: the registered formats by name, in the order a folder is searched (a read-only mapping)
FORMATS: Mapping[str, ArrayFormat] = _Registry()


def register_format(fmt: ArrayFormat) -> ArrayFormat:
    """Registers ``fmt`` under its name (the sources, the CLI and pickling find it there) and returns it."""
    if not isinstance(fmt, ArrayFormat):
        raise TypeError(f"register_format takes an ArrayFormat, got {fmt!r}")
    FORMATS.register(fmt)
    return fmt


def format_named(name: str) -> ArrayFormat:
    """The registered format called ``name``; ``ValueError`` listing the formats when there is none."""
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
