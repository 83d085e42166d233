"""What dali_mesh knows of a DALI pipeline it feeds: the sources defined in it (``MeshLoader``
checks them and fingerprints checkpoints with them), the prefetch depth of its parallel sources (the
watchdog's first-batch allowance) and its watchdog. Kept beside the pipeline, weakly keyed by it, never
as attributes on DALI's object: a pipeline dropped by its user is freed as before."""
from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

__all__ = ["PipelineInfo", "info_of", "sources_of"]


@dataclass
class PipelineInfo:
    sources: list = field(default_factory=list)  # dali_mesh sources, in definition order
    source_prefetch: int = 0  # the largest prefetch_queue_depth of its parallel sources
    watchdog: Any = None  # the Watchdog of watched_run


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
