"""DTensor / PhysicsNeMo ShardTensor placements of a layout, and the way back: a layout from a
model's input spec (``from_placements``, ``from_dtensor``, ``from_shard_tensor``,
``from_sharding_shapes``). Imports torch only in :meth:`PlacementsMixin.dtensor_placements`."""
from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Sequence

from dali_mesh._checks import is_int as _is_int
from dali_mesh.mesh import MeshInfo
from dali_mesh.partition.checks import LayoutError, _check_bool, _check_int, _check_shape, _mesh_dim
from dali_mesh.partition.rules import SPLITS, _axis_groups, _nested_sizes, split_sizes

if TYPE_CHECKING:  # the class this is mixed into
    from dali_mesh.partition.layout import Layout


class PlacementsMixin:
    """The torch / PhysicsNeMo side of :class:`~dali_mesh.partition.Layout` (mixed into it)."""

    def placement_spec(self, ndim: int, *, halo_stripped: bool = False, lead_axes: int = 0,
                       any_split: bool = False, global_shape: Sequence[int] | None = None
                       ) -> tuple[tuple[str, int | None], ...]:
        """Placements of the batched tensor ``(batch, *lead, *sample)`` per mesh dim, as plain data:
        ``("shard", 0)`` for batch dims, ``("shard", 1 + lead_axes + axis)`` for shard dims,
        ``("replicate", None)`` otherwise.

        DTensor describes the batch only for ``split="chunk"`` and windows without halo (or with the
        halo stripped: ``halo_stripped=True``); anything else raises. ``lead_axes`` counts unsplit
        axes between the batch and the sample (the steps of a forecast). ``any_split=True`` skips the
        split check, for PhysicsNeMo ``ShardTensor``, which carries explicit shard shapes.
        ``global_shape``: the sample shape; explicit sizes are accepted when they equal torch.chunk's
        for it (:meth:`explicit_matches`), as they are for the axis length they were made for.
        """
        if global_shape is not None and len(_check_shape(global_shape)) != ndim:
            raise LayoutError(f"global_shape {tuple(global_shape)} has {len(global_shape)} axes, ndim is {ndim}")
        if self.split != "chunk" and not any_split:
            if self.split == "explicit" and global_shape is not None and self.explicit_matches(global_shape):
                pass  # the sizes are exactly chunk's for this shape: the DTensor tells the truth
            elif self.split == "explicit":
                chunk = {self.mesh.names[dims[-1]]: _nested_sizes(
                    self.domain(global_shape)[1][a] - self.domain(global_shape)[0][a],
                    [self.mesh.shape[d] for d in dims], "chunk")
                    for a, dims in _axis_groups(self._shard, ndim).items()} if global_shape is not None else None
                raise LayoutError(
                    f"no DTensor for explicit split sizes {self.split_sizes}: DTensor's Shard sizes follow "
                    + (f"torch.chunk, which gives {chunk} for sample shape {tuple(global_shape)}; "
                       if chunk is not None else
                       "torch.chunk, and explicit sizes are accepted only when they equal chunk's for the "
                       "sample shape (pass global_shape=, as to_dtensor and MeshLoader do); ")
                    + "use the local tensor and its region, or a PhysicsNeMo ShardTensor with sharding_shapes")
            else:
                raise LayoutError(
                    f"no DTensor for split={self.split!r}: DTensor's Shard sizes follow torch.chunk; use the "
                    "local tensor and its region, or a PhysicsNeMo ShardTensor with sharding_shapes"
                )
        if not halo_stripped and any(lo or hi for lo, hi in self.halo_pairs(ndim)):
            raise LayoutError(
                "no DTensor for a window with halo: strip the halo first (region.owned_in_window) "
                "or use the local tensor and its region"
            )
        axes = self.shard_axes(ndim)
        out = []
        for d in range(self.mesh.ndim):
            if d in self._batch_dims:
                out.append(("shard", 0))
            elif axes[d] >= 0:
                out.append(("shard", 1 + lead_axes + axes[d]))
            else:
                out.append(("replicate", None))
        return tuple(out)

    def dtensor_placements(self, ndim: int, **kwargs):
        """torch DTensor placements of the batched tensor (imports torch); arguments as
        :meth:`placement_spec`."""
        from torch.distributed.tensor import Replicate, Shard  # noqa: PLC0415

        return [Shard(d) if kind == "shard" else Replicate() for kind, d in self.placement_spec(ndim, **kwargs)]

    def sharding_shapes(self, global_shape: Sequence[int], batch_size: int | None = None
                        ) -> dict[int, tuple[tuple[int, ...], ...]]:
        """For ``ShardTensor.from_local(..., sharding_shapes=...)``: per mesh dim that shards an axis,
        the owned shapes of the ranks along that mesh dim (this rank's coordinate elsewhere). With
        ``batch_size`` the shapes are of the batched tensor ``(batch_size, *shape)``."""
        axes = self.shard_axes(len(_check_shape(global_shape)))
        out = {}
        for d, axis in enumerate(axes):
            if axis < 0:
                continue
            shapes = []
            for i in range(self.mesh.shape[d]):
                c = list(self.mesh.coordinate)
                c[d] = i
                s = self.region(global_shape, c).shape
                shapes.append(((batch_size,) + s) if batch_size is not None else s)
            out[d] = tuple(shapes)
        return out

    # ---- the way back: a layout from the model's input spec -------------------------------------------
    @classmethod
    def from_placements(cls, mesh, placements: Sequence, *, batched: bool = True, ndim: int | None = None,
                        lead_axes: int = 0, batch: str | Sequence[str] | None = None, crop=None,
                        halo=0, boundary="constant", fill_value: float = 0,
                        split: str | Mapping = "chunk") -> "Layout":
        """The layout whose :meth:`dtensor_placements` are ``placements``: the inverse of that method,
        with axes counted from 0: ``Layout.from_placements(mesh, layout.dtensor_placements(n)) ==
        layout.normalized(n)`` (a layout given ``shard={"mp": -1}`` comes back as ``{"mp": n - 1}``).

        Args:
            mesh: a ``MeshInfo`` or a torch ``DeviceMesh`` (this rank's coordinate is read from it).
            placements: one per mesh dim: torch ``Shard(d)`` / ``Replicate()``, or the plain data
                of :meth:`placement_spec` (``("shard", d)`` / ``("replicate", None)``).
            batched: the tensor is a batch ``(batch, *lead, *sample)``: ``Shard(0)`` marks a batch
                dim and ``Shard(1 + lead_axes + a)`` shards sample axis ``a``. Unbatched:
                ``Shard(a)`` shards sample axis ``a``, and ``batch`` names the batch dims among the
                replicated ones (by default as ``Layout``: the one mesh dim that shards nothing).
            ndim: the tensor's number of dims; needed only to resolve negative ``Shard`` dims.
            lead_axes: unsplit axes between batch and sample (the steps of a forecast).
            batch: batched: the mesh dims expected on the batch axis (checked against the
                ``Shard(0)`` dims); unbatched: the batch dims.
            crop, halo, boundary, fill_value, split: as for ``Layout`` (they are not in placements).

        Several mesh dims sharding one tensor dim nest in mesh-dim order, as DTensor does and as
        ``Layout`` does. ``Partial`` (a pending reduction, not data) and ``_StridedShard`` (an
        interleaved order no reader can serve) are refused, naming the mesh dim and placement.
        """
        if not isinstance(mesh, MeshInfo):
            if not hasattr(mesh, "get_coordinate"):
                raise LayoutError(f"mesh must be a MeshInfo or a torch DeviceMesh, got {type(mesh).__name__}")
            mesh = MeshInfo.from_device_mesh(mesh)
        batched = _check_bool("batched", batched)
        lead_axes = _check_int("lead_axes", lead_axes, 0)
        if ndim is not None:
            ndim = _check_int("ndim", ndim, 1)
        placements = list(placements)
        if len(placements) != mesh.ndim:
            raise LayoutError(f"{len(placements)} placements {placements} for a mesh of {mesh.ndim} dims "
                              f"{list(mesh.names)}: give one placement per mesh dim")
        offset = 1 + lead_axes if batched else 0
        shard, on_batch_axis = {}, []
        for d, p in enumerate(placements):
            kind, tensor_dim = _placement_kind(p, mesh.names[d])
            if kind == "replicate":
                continue
            if tensor_dim < 0:
                if ndim is None:
                    raise LayoutError(f"placement {p!r} of mesh dim {mesh.names[d]!r} counts from the end: "
                                      "pass ndim (the tensor's number of dims) to resolve it")
                tensor_dim += ndim
            if ndim is not None and not 0 <= tensor_dim < ndim:
                raise LayoutError(f"placement {p!r} of mesh dim {mesh.names[d]!r} is out of range for a "
                                  f"tensor of {ndim} dims")
            if batched and tensor_dim == 0:
                on_batch_axis.append(mesh.names[d])
            elif batched and tensor_dim < offset:
                raise LayoutError(f"placement {p!r} of mesh dim {mesh.names[d]!r} shards lead axis "
                                  f"{tensor_dim - 1} (one of the {lead_axes} unsplit axes between batch "
                                  "and sample): a loader cannot split those")
            else:
                shard[mesh.names[d]] = tensor_dim - offset
        if batched:
            if batch is not None:
                expected = [batch] if isinstance(batch, str) else list(batch)
                for name in on_batch_axis:
                    if name not in expected:
                        raise LayoutError(
                            f"placement Shard(0) of mesh dim {name!r} shards the batch axis, but {name!r} is "
                            f"not a batch dim (batch={expected}): a model-parallel dim cannot split the "
                            "batch; give it Replicate() or Shard(1 + axis)")
                for name in expected:
                    if name not in on_batch_axis:
                        raise LayoutError(f"batch dim {name!r} has no Shard(0) placement in {placements}: "
                                          "a batch dim splits the batch axis (Shard(0))")
            batch = on_batch_axis
        return cls(mesh, shard=shard, batch=batch, crop=crop, halo=halo, boundary=boundary,
                   fill_value=fill_value, split=split)

    @classmethod
    def from_dtensor(cls, tensor_or_spec, **kwargs) -> "Layout":
        """The layout of a DTensor (e.g. a model's example input) or of its ``DTensorSpec``
        (``tensor._spec``): mesh and placements from it, ``split="chunk"`` (DTensor's ``Shard``);
        other arguments as :meth:`from_placements`. A PhysicsNeMo ``ShardTensor`` goes to
        :meth:`from_shard_tensor`."""
        if "split" in kwargs:
            raise LayoutError("from_dtensor: a DTensor is split by torch.chunk; for other sizes use "
                              "from_shard_tensor or from_placements(..., split=...)")
        spec = getattr(tensor_or_spec, "_spec", tensor_or_spec)
        if hasattr(spec, "sharding_shapes"):
            return cls.from_shard_tensor(tensor_or_spec, **kwargs)
        mesh = getattr(tensor_or_spec, "device_mesh", None)
        if mesh is None:
            mesh = getattr(spec, "mesh", None)
        placements = getattr(tensor_or_spec, "placements", None)
        if mesh is None or placements is None:
            raise LayoutError(f"from_dtensor needs a DTensor or DTensorSpec, got {type(tensor_or_spec).__name__}")
        if "ndim" not in kwargs:
            meta = getattr(spec, "tensor_meta", None)
            ndim = getattr(tensor_or_spec, "ndim", None)
            if ndim is None and meta is not None and getattr(meta, "shape", None) is not None:
                ndim = len(meta.shape)
            kwargs["ndim"] = ndim
        return cls.from_placements(mesh, placements, **kwargs)

    @classmethod
    def from_shard_tensor(cls, tensor, **kwargs) -> "Layout":
        """The layout of a PhysicsNeMo ``ShardTensor`` (or its ``ShardTensorSpec``): mesh,
        placements and ``sharding_shapes()`` (its documented API; gathering them may communicate
        once) become explicit sizes, or the rule they equal; see :meth:`from_sharding_shapes`."""
        spec = getattr(tensor, "_spec", tensor)
        if not hasattr(spec, "sharding_shapes"):
            raise LayoutError(f"from_shard_tensor needs a PhysicsNeMo ShardTensor or ShardTensorSpec, "
                              f"got {type(tensor).__name__}")
        shapes = spec.sharding_shapes()
        meta = getattr(spec, "tensor_meta", None)
        if "ndim" not in kwargs and getattr(meta, "shape", None) is not None:
            kwargs["ndim"] = len(meta.shape)  # resolves negative Shard dims
        return cls.from_sharding_shapes(spec.mesh, spec.placements, shapes, **kwargs)

    @classmethod
    def from_sharding_shapes(cls, mesh, placements: Sequence, sharding_shapes: Mapping[int, Sequence[Sequence[int]]],
                             *, batched: bool = True, **kwargs) -> "Layout":
        """A layout from PhysicsNeMo ``ShardTensor`` sharding shapes: ``{mesh dim index: (shape of
        each rank's shard along that mesh dim, ...)}``, as ``ShardTensorSpec.sharding_shapes()``
        gives them (a local shape per rank along the mesh dim, this rank's coordinate elsewhere).

        The sizes of each sharded tensor dim become explicit shard sizes; when the sizes of every
        sharded axis equal one named rule (``chunk`` first, then ``physicsnemo``, ``even``), the
        layout uses that rule, so that ``chunk`` keeps DTensor output. A batch dim (``Shard(0)``)
        must give every rank the same batch size. ``ShardTensor`` records one mesh dim per tensor
        dim: two mesh dims sharding one axis are refused here (give ``split`` sizes by hand).
        Other arguments as :meth:`from_placements`; ``split`` comes from the shapes.
        """
        if "split" in kwargs:
            raise LayoutError("from_sharding_shapes: the split comes from sharding_shapes; do not pass split")
        layout = cls.from_placements(mesh, placements, batched=batched, **kwargs)
        mesh = layout.mesh
        if not isinstance(sharding_shapes, Mapping):
            raise LayoutError(f"sharding_shapes must be a mapping {{mesh dim: shapes}}, got {sharding_shapes!r}")
        shapes_by_dim = {}
        for key, shapes in sharding_shapes.items():
            d = _mesh_dim(mesh, key, "sharding_shapes")
            shapes = [tuple(s) for s in shapes]
            if len(shapes) != mesh.shape[d]:
                raise LayoutError(f"sharding_shapes of mesh dim {mesh.names[d]!r} hold {len(shapes)} shapes "
                                  f"for {mesh.shape[d]} ranks")
            shapes_by_dim[d] = shapes
        offset = (1 + kwargs.get("lead_axes", 0)) if batched else 0
        # the batch axis: every sample group holds the same number of samples
        for d in layout._batch_dims:
            if d in shapes_by_dim:
                sizes = {s[0] for s in shapes_by_dim[d]}
                if len(sizes) > 1:
                    raise LayoutError(f"sharding_shapes of batch dim {mesh.names[d]!r} give the ranks batch "
                                      f"sizes {sorted(sizes)}: a loader gives every sample group the same")
        groups = _axis_groups(layout._shard, None)
        sizes_by_dim = {}
        for axis, dims in groups.items():
            if len(dims) > 1:
                raise LayoutError(
                    f"mesh dims {[mesh.names[d] for d in dims]} shard axis {axis} together: ShardTensor's "
                    "sharding_shapes describe one mesh dim per tensor dim; build the Layout with split= sizes "
                    "of the combined shards instead")
            (d,) = dims
            if d not in shapes_by_dim:
                raise LayoutError(f"sharding_shapes have no entry for mesh dim {mesh.names[d]!r}, which shards "
                                  f"axis {axis} ({placements[d]!r})")
            tensor_dim = axis + offset
            for s in shapes_by_dim[d]:
                if not -len(s) <= tensor_dim < len(s):
                    raise LayoutError(f"sharding shape {s} of mesh dim {mesh.names[d]!r} has no dim {tensor_dim}")
            sizes_by_dim[d] = tuple(s[tensor_dim] for s in shapes_by_dim[d])
        for d, sizes in sizes_by_dim.items():
            for s in sizes:
                if not _is_int(s) or s < 0:
                    raise LayoutError(f"sharding_shapes of mesh dim {mesh.names[d]!r}: size {s!r} is not a "
                                      "non-negative integer")
        split = {mesh.names[d]: [int(s) for s in sizes] for d, sizes in sizes_by_dim.items()}
        for rule in SPLITS:
            if all(tuple(split_sizes(sum(sizes), mesh.shape[d], rule)) == tuple(sizes)
                   for d, sizes in sizes_by_dim.items()):
                split = rule
                break
        return cls(mesh, shard=layout.shard_dims, batch=layout.batch_dims, crop=layout._crop, halo=layout._halo,
                   boundary=layout._boundary, fill_value=layout.fill_value, split=split if sizes_by_dim else "chunk")


def _placement_kind(p, mesh_dim_name: str) -> tuple[str, int | None]:
    """``("shard", tensor dim)`` or ``("replicate", None)`` of a torch placement or of the plain data
    of ``Layout.placement_spec``; anything a loader cannot honour is refused, named."""
    if isinstance(p, tuple) and len(p) == 2 and p[0] in ("shard", "replicate"):
        kind, tensor_dim = p
        if kind == "replicate":
            return "replicate", None
        if not _is_int(tensor_dim):
            raise LayoutError(f"placement {p!r} of mesh dim {mesh_dim_name!r}: the tensor dim is not an integer")
        return "shard", int(tensor_dim)
    name = type(p).__name__
    if name == "_StridedShard" or hasattr(p, "split_factor"):
        raise LayoutError(f"placement {p!r} of mesh dim {mesh_dim_name!r} is a _StridedShard (an interleaved "
                          "shard order, as FSDP with tensor parallel makes): a loader cannot read it; use Shard(d)")
    if "Partial" in name or (hasattr(p, "is_partial") and p.is_partial()):
        raise LayoutError(f"placement {p!r} of mesh dim {mesh_dim_name!r} is Partial (a pending reduction, "
                          "not data): a loader yields data; use Shard(d) or Replicate()")
    if hasattr(p, "is_shard") and p.is_shard():
        return "shard", int(p.dim)
    if hasattr(p, "is_replicate") and p.is_replicate():
        return "replicate", None
    raise LayoutError(f"placement {p!r} of mesh dim {mesh_dim_name!r} is not Shard(d) or Replicate()")

