"""What dali_mesh knows of a DALI pipeline it feeds: the sources defined in it (``MeshLoader``
checks them and fingerprints checkpoints with them), the prefetch depth of its parallel sources (the
watchdog's first-batch allowance) and its watchdog. Kept beside the pipeline, weakly keyed by it, never
as attributes on DALI's object: a pipeline dropped by its user is freed as before.

Only the entry points (``dali_mesh.fn``: ``partitioned_source``, ``read_windows``, ``read_dataset``)
register: the readers below them return what they defined (:class:`Defined`) and the entry point the
user called registers it once (:func:`register`), so a reader built of other readers (a dataset of
one reader per variable) registers what the user asked for, not its parts."""
from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Defined", "PipelineInfo", "info_of", "register", "sources_of"]


@dataclass
class PipelineInfo:
    sources: list = field(default_factory=list)  # dali_mesh sources, in definition order
    source_prefetch: int = 0  # the largest prefetch_queue_depth of its parallel sources
    watchdog: Any = None  # the Watchdog of watched_run


@dataclass(frozen=True)
class Defined:
    """What a reader defined in the pipeline being built: its ``outputs`` (DALI nodes), the dali_mesh
    ``sources`` they read (what ``MeshLoader`` checks and fingerprints) and the deepest
    ``prefetch_queue_depth`` of its parallel external sources (0: none; the watchdog's first-batch
    allowance)."""

    outputs: tuple
    sources: tuple
    prefetch: int = 0


_INFO: "weakref.WeakKeyDictionary[Any, PipelineInfo]" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def info_of(pipe) -> PipelineInfo:
    """The record of ``pipe`` (made empty the first time)."""
    with _LOCK:
        info = _INFO.get(pipe)
        if info is None:
            info = _INFO[pipe] = PipelineInfo()
        return info


def sources_of(pipe) -> list:
    """The dali_mesh sources defined in ``pipe`` (none: ``[]``)."""
    with _LOCK:
        info = _INFO.get(pipe)
        return list(info.sources) if info is not None else []


def register(pipe, defined: Defined) -> tuple:
    """Records ``defined``'s sources and prefetch depth on ``pipe`` (``None``: no pipeline is being
    defined, nothing to record) and returns its outputs: called once per entry point."""
    if pipe is not None:
        info = info_of(pipe)
        with _LOCK:
            info.sources.extend(defined.sources)
            info.source_prefetch = max(info.source_prefetch, int(defined.prefetch))
    return defined.outputs
