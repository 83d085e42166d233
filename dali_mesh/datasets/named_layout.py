"""A layout whose axes are a dataset's dim names (``"latitude"``), resolved against a source's dims."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from dali_mesh._checks import is_int as _is_int
from dali_mesh.mesh import MeshInfo
from dali_mesh.partition import Layout, LayoutError

__all__ = ["NamedLayout"]


@dataclass(frozen=True)
class NamedLayout:
    """A :class:`~dali_mesh.Layout` whose axes are dim names (``"latitude"``) or ``"channel"``; the
    source resolves them against its output dims. Arguments as ``Layout``'s, keyed by dim name."""

    mesh: MeshInfo
    shard: Mapping[str, str] | None = None
    batch: Any = None
    crop: Mapping[str, Any] | None = None
    halo: Any = 0
    boundary: Any = "constant"
    fill_value: float = 0
    split: Any = "chunk"

    def resolve(self, dims: Sequence[str]) -> Layout:
        dims = tuple(dims)

        def axis(name, what):
            if _is_int(name):
                return int(name)
            if name not in dims:
                raise LayoutError(f"{what}: no dim {name!r}; the samples' dims are {dims}")
            return dims.index(name)

        def keyed(value, what):
            return {axis(k, what): v for k, v in value.items()} if isinstance(value, Mapping) else value

        crop = None
        if self.crop is not None:
            crop = [None] * len(dims)
            for k, v in self.crop.items():
                crop[axis(k, "crop")] = v
        return Layout(self.mesh, shard={m: axis(a, "shard") for m, a in (self.shard or {}).items()}, batch=self.batch,
                      crop=crop, halo=keyed(self.halo, "halo"), boundary=keyed(self.boundary, "boundary"),
                      fill_value=self.fill_value, split=self.split)
