"""The steps of a forecast sample."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["ForecastSpec"]


@dataclass(frozen=True)
class ForecastSpec:
    """Input steps ``t - history*stride, .., t - stride, t`` and target steps ``t + stride, ..,
    t + lead*stride`` of a sample at step ``t``: ``stride`` stored steps between the forecast's steps
    (PhysicsNeMo's ERA5 ``stride``: 6-hourly steps from hourly data is ``stride=6``). Samples still
    start at every stored step."""

    history: int = 0
    lead: int = 1
    stride: int = 1

    def __post_init__(self) -> None:
        for name in ("history", "lead", "stride"):
            v = getattr(self, name)
            low = 1 if name == "stride" else 0
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
                raise ValueError(f"ForecastSpec.{name} must be an integer >= {low}, got {v!r}")

    @property
    def span(self) -> int:
        """Stored steps from a sample's first input step to its last step: ``(history + lead) * stride``."""
        return (self.history + self.lead) * self.stride

    def input_offsets(self) -> range:
        """The input steps relative to ``t``: ``-history*stride .. 0`` in steps of ``stride``."""
        return range(-self.history * self.stride, 1, self.stride)

    def target_offsets(self) -> range:
        """The target steps relative to ``t``: ``stride .. lead*stride`` in steps of ``stride``."""
        return range(self.stride, self.lead * self.stride + 1, self.stride)
