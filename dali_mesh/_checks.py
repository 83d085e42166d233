"""The one definition of "an integer" for arguments (sizes, axes, coordinates, counts): a Python or
numpy integer, never a bool (``True`` is not a size). Imports nothing, so every module can use it."""
from __future__ import annotations

import numbers


def is_int(v) -> bool:
    """A Python or numpy integer (``numbers.Integral``), not a ``bool`` or ``numpy.bool_``."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)
