"""``MeshInfo``: the shape, dim names and coordinate of this rank in a device mesh.

A plain frozen value. It is built from a torch ``DeviceMesh``, from PhysicsNeMo's
``DistributedManager``, from the environment (``RANK``, ``WORLD_SIZE``) plus a mesh shape, or given
directly. Ranks are numbered row-major over the mesh shape, as ``init_device_mesh`` lays them out.
Nothing here needs a process group, torch or DALI.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Iterator, Mapping, Sequence

from dali_mesh._checks import is_int as _is_int

__all__ = ["MeshInfo", "MeshError", "parse_mesh_shape"]


class MeshError(ValueError):
    """A mesh, a coordinate or the environment describing them is invalid."""


def _default_names(ndim: int) -> tuple[str, ...]:
    return tuple(f"dim{i}" for i in range(ndim))


@dataclass(frozen=True)
class MeshInfo:
    """Where this rank sits in a device mesh.

    Args:
        shape: ranks along each mesh dim, e.g. ``(2, 4)``.
        names: one name per mesh dim, e.g. ``("data_parallel", "model_parallel")``; unnamed meshes get
            ``("dim0", "dim1", ...)``.
        coordinate: this rank's index along each mesh dim.

    Example (a 2 x 4 mesh, rank 5)::

        >>> MeshInfo((2, 4), ("data_parallel", "model_parallel"), (1, 1)).rank
        5
    """

    shape: tuple[int, ...]
    names: tuple[str, ...] = ()
    coordinate: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for what in ("shape", "coordinate"):
            if isinstance(getattr(self, what), (str, bytes)):
                raise MeshError(f"mesh {what} {getattr(self, what)!r} is a string: expected integers")
            for v in getattr(self, what):
                if not _is_int(v):
                    raise MeshError(f"mesh {what} {tuple(getattr(self, what))} holds {v!r}: expected integers")
        shape = tuple(int(s) for s in self.shape)
        if not shape:
            raise MeshError("mesh shape is empty: a mesh has at least one dim")
        for s in shape:
            if s <= 0:
                raise MeshError(f"mesh shape {shape} has a size {s}: every mesh dim needs at least one rank")
        if isinstance(self.names, str):
            raise MeshError(f"mesh names {self.names!r} is one string: give one name per dim, e.g. ({self.names!r},)")
        names = tuple(self.names) if self.names else _default_names(len(shape))
        if len(names) != len(shape):
            raise MeshError(f"mesh names {names} do not match mesh shape {shape} (one name per dim)")
        for n in names:
            if not isinstance(n, str) or not n:
                raise MeshError(f"mesh dim names must be non-empty strings, got {n!r} in {names}")
        if len(set(names)) != len(names):
            raise MeshError(f"mesh dim names {names} repeat a name")
        coordinate = tuple(int(c) for c in self.coordinate) if self.coordinate else (0,) * len(shape)
        if len(coordinate) != len(shape):
            raise MeshError(f"coordinate {coordinate} has {len(coordinate)} entries, mesh shape {shape} has {len(shape)} dims")
        for c, s, n in zip(coordinate, shape, names):
            if not 0 <= c < s:
                raise MeshError(f"coordinate {coordinate} is out of range on mesh dim {n!r} of size {s}")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "names", names)
        object.__setattr__(self, "coordinate", coordinate)

    # ---- plain queries -------------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        """Number of ranks in the mesh."""
        return math.prod(self.shape)

    @property
    def rank(self) -> int:
        """This rank's row-major index over the mesh shape."""
        return self.rank_of(self.coordinate)

    def rank_of(self, coordinate: Sequence[int]) -> int:
        coordinate = tuple(coordinate)
        if len(coordinate) != self.ndim or any(
            not _is_int(c) or not 0 <= c < s for c, s in zip(coordinate, self.shape)
        ):
            raise MeshError(f"coordinate {coordinate} is out of range for mesh shape {self.shape}")
        r = 0
        for c, s in zip(coordinate, self.shape):
            r = r * s + c
        return r

    def coordinate_of(self, rank: int) -> tuple[int, ...]:
        if not _is_int(rank):
            raise MeshError(f"rank {rank!r} is not an integer")
        rank = int(rank)
        if not 0 <= rank < self.size:
            raise MeshError(f"rank {rank} is out of range for a mesh of {self.size} ranks {self.shape}")
        out = []
        for s in reversed(self.shape):
            rank, c = divmod(rank, s)
            out.append(c)
        return tuple(reversed(out))

    def coordinates(self) -> Iterator[tuple[int, ...]]:
        """Every coordinate of the mesh, in rank order."""
        for r in range(self.size):
            yield self.coordinate_of(r)

    def with_coordinate(self, coordinate: Sequence[int]) -> "MeshInfo":
        return MeshInfo(self.shape, self.names, tuple(coordinate))

    def with_rank(self, rank: int) -> "MeshInfo":
        return MeshInfo(self.shape, self.names, self.coordinate_of(rank))

    def dim_index(self, name: str | int) -> int:
        """The index of a mesh dim given by name (or by index)."""
        if _is_int(name):
            if not -self.ndim <= name < self.ndim:
                raise MeshError(f"mesh dim {name} is out of range for a mesh of {self.ndim} dims {self.names}")
            return int(name) % self.ndim
        if not isinstance(name, str):
            raise MeshError(f"mesh dim {name!r} is neither a name nor an index; this mesh has {list(self.names)}")
        try:
            return self.names.index(name)
        except ValueError:
            raise MeshError(f"unknown mesh dim {name!r}; this mesh has {list(self.names)}") from None

    def __str__(self) -> str:
        dims = ", ".join(f"{n}={c}/{s}" for n, s, c in zip(self.names, self.shape, self.coordinate))
        return f"MeshInfo(rank {self.rank} of {self.size}: {dims})"

    # ---- constructors ----------------------------------------------------------------------------
    @classmethod
    def from_device_mesh(cls, device_mesh) -> "MeshInfo":
        """From a torch ``DeviceMesh`` of any number of dims, named or not.

        Raises ``MeshError`` on a rank that is not part of the mesh (it has no coordinate).
        """
        shape = tuple(int(s) for s in device_mesh.shape)
        names = tuple(device_mesh.mesh_dim_names) if device_mesh.mesh_dim_names else ()
        coordinate = device_mesh.get_coordinate()
        if coordinate is None:
            raise MeshError(f"this rank is not part of the device mesh {device_mesh}: it has no coordinate")
        return cls(shape, names, tuple(int(c) for c in coordinate))

    @classmethod
    def from_physicsnemo(cls, manager=None, mesh_dim_names: Sequence[str] | None = None) -> "MeshInfo":
        """From PhysicsNeMo's ``DistributedManager`` (imported only when called).

        Uses the mesh made by ``DistributedManager.initialize_mesh``; a manager without one is refused
        with :class:`MeshError`. The manager is only read: PhysicsNeMo's ``global_mesh`` property
        would make a 1-D ``("world",)`` mesh when none exists, a mesh the user never asked for (and a
        change to the manager), so the manager's own state is read instead where it has one.
        """
        if manager is None:
            try:
                from physicsnemo.distributed import DistributedManager  # noqa: PLC0415
            except ImportError as e:
                raise ImportError(
                    "MeshInfo.from_physicsnemo needs PhysicsNeMo (pip install nvidia-physicsnemo); "
                    "or build the mesh with MeshInfo.from_device_mesh(mesh)"
                ) from e
            manager = DistributedManager()
        # PhysicsNeMo keeps the mesh in _global_mesh (None until initialize_mesh); other objects
        # (older releases, a manager-like object) are asked for global_mesh
        mesh = manager._global_mesh if hasattr(manager, "_global_mesh") else getattr(manager, "global_mesh", None)
        if mesh is None:
            raise MeshError(
                "PhysicsNeMo's DistributedManager has no mesh yet: call "
                "DistributedManager.initialize_mesh(mesh_shape, mesh_dim_names) first"
            )
        info = cls.from_device_mesh(mesh)
        if mesh_dim_names is not None:
            info = cls(info.shape, tuple(mesh_dim_names), info.coordinate)
        return info

    @classmethod
    def from_env(
        cls,
        shape: Sequence[int],
        names: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> "MeshInfo":
        """From ``RANK`` and ``WORLD_SIZE`` plus a mesh shape; one dim may be ``-1`` (inferred),
        as PhysicsNeMo's ``initialize_mesh`` allows."""
        env = os.environ if env is None else env
        try:
            rank = int(env["RANK"])
            world_size = int(env["WORLD_SIZE"])
        except KeyError as e:
            raise MeshError(f"environment variable {e.args[0]} is not set (torchrun sets RANK and WORLD_SIZE)") from None
        except ValueError as e:
            raise MeshError(f"RANK and WORLD_SIZE must be integers: {e}") from None
        if world_size <= 0:
            raise MeshError(f"WORLD_SIZE={world_size} must be positive")
        shape = resolve_mesh_shape(shape, world_size)
        if not 0 <= rank < world_size:
            raise MeshError(f"RANK={rank} is out of range for WORLD_SIZE={world_size}")
        info = cls(shape, tuple(names) if names else ())
        return info.with_rank(rank)


def resolve_mesh_shape(shape: Sequence[int], world_size: int) -> tuple[int, ...]:
    """Replace one ``-1`` in ``shape`` so that the product equals ``world_size``, and check it."""
    if isinstance(shape, (str, bytes)):
        raise MeshError(f"mesh shape {shape!r} is a string: expected integers (or parse it with parse_mesh_shape)")
    shape = tuple(shape)
    for s in shape:
        if not _is_int(s):
            raise MeshError(f"mesh shape {shape} holds {s!r}: expected integers (one may be -1)")
    shape = tuple(int(s) for s in shape)
    unknown = [i for i, s in enumerate(shape) if s == -1]
    if len(unknown) > 1:
        raise MeshError(f"mesh shape {shape} has more than one -1: at most one dim can be inferred")
    for s in shape:
        if s == 0 or s < -1:
            raise MeshError(f"mesh shape {shape} has a size {s}: sizes must be positive (or one -1)")
    known = math.prod(s for s in shape if s != -1)
    if unknown:
        if world_size % known:
            raise MeshError(f"mesh shape {shape} does not divide WORLD_SIZE={world_size}")
        shape = tuple(world_size // known if s == -1 else s for s in shape)
    if math.prod(shape) != world_size:
        raise MeshError(f"mesh shape {shape} has {math.prod(shape)} ranks but WORLD_SIZE={world_size}")
    return shape


def parse_mesh_shape(text: str) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """Parse ``"data_parallel=2,model_parallel=4"`` or ``"2,4"`` into (shape, names)."""
    if not text or not text.strip():
        raise MeshError("empty mesh: expected e.g. data_parallel=2,model_parallel=4")
    shape, names = [], []
    for part in text.split(","):
        part = part.strip()
        if "=" in part:
            name, _, size = part.partition("=")
            name = name.strip()
            if not name:
                raise MeshError(f"malformed mesh {text!r}: {part!r} has no name before '='")
            names.append(name)
        else:
            size = part
        try:
            shape.append(int(size))
        except ValueError:
            raise MeshError(f"malformed mesh {text!r}: {size.strip()!r} is not an integer size") from None
    if names and len(names) != len(shape):
        raise MeshError(f"malformed mesh {text!r}: name every dim or none")
    return tuple(shape), tuple(names)
