"""Argument checks shared by the partition modules: one place for "an integer", "a bool", "a sample
shape", "an axis", "a mesh dim", each raising :class:`LayoutError` with the value in the message."""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from dali_mesh._checks import is_int as _is_int
from dali_mesh.mesh import MeshError, MeshInfo


class LayoutError(ValueError):
    """A layout, or a layout applied to a sample shape, is invalid."""



def _normalize_axis(axis: int, ndim: int, what: str) -> int:
    if not _is_int(axis):
        raise LayoutError(f"{what}: axis {axis!r} is not an integer")
    if not -ndim <= axis < ndim:
        raise LayoutError(f"{what}: axis {axis} is out of range for a sample of {ndim} dims")
    return int(axis) % ndim



def _mesh_dim(mesh: MeshInfo, name, what: str) -> int:
    try:
        return mesh.dim_index(name)
    except MeshError as e:
        raise LayoutError(f"{what}: {e}") from None



def _check_shape(global_shape: Sequence[int]) -> tuple[int, ...]:
    if isinstance(global_shape, (str, bytes)) or not isinstance(global_shape, Iterable):
        raise LayoutError(f"sample shape {global_shape!r} is not a sequence of integers")
    global_shape = tuple(global_shape)
    for s in global_shape:
        if not _is_int(s):
            raise LayoutError(f"sample shape {global_shape!r} holds {s!r} ({type(s).__name__}): "
                              "sizes must be integers")
    shape = tuple(int(s) for s in global_shape)
    if not shape:
        raise LayoutError("sample shape is empty: a sample has at least one axis")
    if any(s <= 0 for s in shape):
        raise LayoutError(f"sample shape {shape} has a size <= 0: every axis needs at least one cell")
    return shape



def _check_int(name: str, value, minimum: int | None = None, maximum: int | None = None) -> int:
    """``value`` as an int if it is a Python or numpy integer (not a bool) in ``[minimum, maximum)``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise LayoutError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    value = int(value)
    if minimum == 1 and value < 1:
        raise LayoutError(f"{name} must be a positive integer, got {value}")
    if minimum is not None and value < minimum:
        raise LayoutError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value >= maximum:
        raise LayoutError(f"{name} must be < {maximum}, got {value}")
    return value


def _check_bool(name: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise LayoutError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")
    return bool(value)

