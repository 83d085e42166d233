"""One registry of named plugins, loaded from an entry-point group on the first lookup, as xarray finds
its backends (``backends/plugins.py``): the formats (``dali_mesh.formats``, by name) and the byte stores
(``dali_mesh.stores``, by URL scheme) are each one :class:`PluginRegistry`.

A name is one plugin everywhere (the parent and DALI's worker processes find a format or a store by its
name, and must read with the same one):
- a name is never taken twice: :meth:`PluginRegistry.register` of a name another plugin holds raises
  the registry's error naming both; an entry point naming a built-in's name is not used (a warning names
  its package), and a name two packages declare is used by neither: its lookups raise the error naming
  both packages;
- a broken entry point (it fails to import, or names something the registry does not take) is skipped
  with a warning naming it and its package: the others, the built-in ones first, work; a lookup of the
  broken one's own name is the error that says why;
- what a broken plugin's module registered before it failed is taken back, and a plugin that raises
  ``SystemExit`` while it loads is a broken plugin, not the end of the process.
"""
from __future__ import annotations

import threading
import warnings
from importlib import metadata
from typing import Callable, Generic, Iterator, Mapping, TypeVar

__all__ = ["PluginRegistry", "package_of"]

T = TypeVar("T")


def package_of(ep) -> str:
    """The distribution that declares the entry point ``ep`` (its module where none is known)."""
    dist = getattr(ep, "dist", None)
    name = getattr(dist, "name", None) if dist is not None else None
    return f"package {name!r}" if name else f"module {ep.value.split(':', 1)[0]!r}"


def _short(plugin) -> str:
    """A plugin's short name: a function's or a class's own, an instance's class's."""
    return getattr(plugin, "__qualname__", None) or type(plugin).__qualname__


class PluginRegistry(Mapping, Generic[T]):
    """The plugins of one kind by name, in registration order: the built-in ones, then those of the
    entry-point ``group``, loaded on the first lookup. ``kind``: what a plugin is called in messages
    ("format", "store"); ``error``: the exception of a plugin that cannot be used; ``take(ep, obj)``: the
    plugin an entry point's loaded object names (raising ``error`` when it names none of this kind);
    ``owner(plugin)``: who registered it, for messages; ``same(a, b)``: whether two registrations are one
    plugin (registering it again keeps the first). ``_refused``: the names no plugin answers to and why."""

    def __init__(self, group: str, kind: str, error: type[Exception], take: Callable, owner: Callable[[T], str],
                 same: Callable[[T, T], bool]) -> None:
        self.group, self.kind, self.error = group, kind, error
        self._take_entry, self._owner, self._same = take, owner, same
        self._entries: dict[str, T] = {}
        self._refused: dict[str, str] = {}
        self._plugins_loaded = False
        self._loading = False
        # one thread loads the entry points; another's first lookup waits for all of them (a lookup from a
        # plugin's own import, on the loading thread, sees the plugins loaded so far)
        self._lock = threading.RLock()

    def register(self, name: str, plugin: T) -> T:
        taken = self._entries.get(name)
        if taken is not None and not self._same(taken, plugin):
            raise self.error(f"{self.kind} {name!r} is already {self._owner(taken)}: {self._owner(plugin)} may not "
                             f"take its name (the {self.kind} is found by its name, in DALI's worker processes too, "
                             "and two would read one source two ways); give it another name")
        return self._entries.setdefault(name, plugin)

    def _loaded(self) -> dict[str, T]:
        if self._plugins_loaded:
            return self._entries
        with self._lock:
            if self._plugins_loaded or self._loading:
                return self._entries
            self._loading = True
            try:
                declared: dict[str, list] = {}
                for ep in metadata.entry_points(group=self.group):
                    if ep not in declared.setdefault(ep.name, []):
                        declared[ep.name].append(ep)
                for name, eps in declared.items():
                    self._take(name, eps)
                self._plugins_loaded = True  # not when interrupted: the next lookup loads them again
            finally:
                self._loading = False
        return self._entries

    def _load(self, ep) -> T:
        what = f"entry point {ep.name!r} = {ep.value!r} of group {self.group!r} ({package_of(ep)})"
        try:
            obj = ep.load()
        except (Exception, SystemExit) as e:  # noqa: BLE001 - whatever a third-party module raises, named with it
            raise self.error(f"{what} cannot be loaded ({type(e).__name__}: {e}); fix or uninstall the package "
                             "that declares it") from e
        return self._take_entry(what, ep, obj)

    def _take(self, name: str, eps: list) -> None:
        """Registers the plugin the entry points ``eps`` declare as ``name``: refused when two packages
        declare it, skipped when it is broken or a built-in holds the name."""
        if len(eps) > 1:
            both = " and ".join(f"{package_of(ep)} ({ep.value})" for ep in eps)
            self._refuse(name, f"{self.kind} {name!r} is declared by {both} (entry-point group {self.group!r}): "
                               "neither is used, so that no process reads with one and another with the other; "
                               "uninstall one of the packages")
            return
        before = dict(self._entries)
        try:
            plugin = self._load(eps[0])
        except self.error as e:
            # what its module registered before it failed goes too: a skipped plugin leaves nothing behind
            # (a worker whose import of it failed otherwise would not have it)
            self._entries.clear()
            self._entries.update(before)
            self._refuse(name, str(e))
            return
        taken = self._entries.get(name)
        if taken is None:
            self._entries[name] = plugin
        elif not self._same(taken, plugin):
            warnings.warn(f"entry point {name!r} of group {self.group!r} of {package_of(eps[0])} "
                          f"({_short(plugin)}) is not used: {self.kind} {name!r} is {self._owner(taken)}, which "
                          f"keeps it; give the plugin's {self.kind} another name", RuntimeWarning, stacklevel=4)

    def _refuse(self, name: str, why: str) -> None:
        if name not in self._refused:
            warnings.warn(f"{why} (skipped: the other {self.kind}s are used)", RuntimeWarning, stacklevel=5)
        self._refused[name] = why

    def __getitem__(self, name: str) -> T:
        entries = self._loaded()
        if name not in entries and name in self._refused:
            raise self.error(self._refused[name])
        return entries[name]

    def __contains__(self, name) -> bool:
        return name in self._loaded()

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._loaded()))

    def __len__(self) -> int:
        return len(self._loaded())

    def __repr__(self) -> str:
        more = "" if self._plugins_loaded else ", entry points not loaded yet"
        return f"{type(self).__name__}({self.group}: {', '.join(self._entries)}{more})"
