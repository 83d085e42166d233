"""DTensor / PhysicsNeMo ShardTensor placements as plain data, and the way back, as pure functions of
plain data (mesh, mesh dim indices, sample axes); :class:`~dali_mesh.partition.Layout`'s
``placement_spec``, ``dtensor_placements``, ``from_placements``, ``from_dtensor``,
``from_shard_tensor`` and ``from_sharding_shapes`` are thin wrappers over them. This module knows
nothing of ``Layout`` (it returns what a ``Layout`` is built from) and imports torch only in
:func:`torch_placements`.

A placement is ``("shard", tensor dim)`` or ``("replicate", None)`` per mesh dim, of the batched
tensor ``(batch, *lead, *sample)``. Example: mesh ``(dp=2, mp=4)``, ``mp`` sharding sample axis 1 of
``(C, H, W)`` samples, no lead axes::

    >>> placement_spec(2, batch_dims=(0,), shard_axes=(-1, 1))
    (('shard', 0), ('shard', 2))
    >>> shard_and_batch(MeshInfo((2, 4), ("dp", "mp"), (0, 0)), [("shard", 0), ("shard", 2)])
    ({'mp': 1}, ['dp'])
"""
from __future__ import annotations

from typing import Mapping, Sequence

from dali_mesh._checks import is_int as _is_int
from dali_mesh.mesh import MeshInfo
from dali_mesh.partition.checks import LayoutError, _check_bool, _check_int, _mesh_dim
from dali_mesh.partition.rules import SPLITS, _axis_groups, split_sizes

__all__ = ["placement_spec", "check_dtensor_split", "torch_placements", "shard_and_batch", "split_of_sharding_shapes",
           "dtensor_parts", "is_shard_tensor", "shard_tensor_parts"]

Placement = tuple[str, int | None]


def placement_spec(mesh_ndim: int, batch_dims: Sequence[int], shard_axes: Sequence[int],
                   lead_axes: int = 0) -> tuple[Placement, ...]:
    """Per mesh dim: ``("shard", 0)`` for a batch dim (indices in ``batch_dims``), ``("shard", 1 +
    lead_axes + axis)`` for a dim sharding sample ``axis`` (``shard_axes[d] >= 0``), else
    ``("replicate", None)``: the batch is tensor dim 0, sample axis ``a`` tensor dim ``1 + lead_axes + a``."""
    out = []
    for d in range(mesh_ndim):
        if d in batch_dims:
            out.append(("shard", 0))
        elif shard_axes[d] >= 0:
            out.append(("shard", 1 + lead_axes + shard_axes[d]))
        else:
            out.append(("replicate", None))
    return tuple(out)


def check_dtensor_split(split: str, split_sizes: Mapping[str, Sequence[int]] | None,
                        global_shape: Sequence[int] | None, chunk_sizes: Mapping[str, Sequence[int]] | None) -> None:
    """Refuse (``LayoutError``) a split a DTensor cannot describe: DTensor's ``Shard`` sizes are
    torch.chunk's, so ``split="chunk"``, or explicit ``split_sizes`` ({mesh dim name: sizes}) equal to
    ``chunk_sizes``, torch.chunk's sizes for the sample shape ``global_shape`` (keyed alike; ``None``
    when the shape is not known: explicit sizes are then refused)."""
    if split == "chunk":
        return
    if split != "explicit":
        raise LayoutError(
            f"no DTensor for split={split!r}: DTensor's Shard sizes follow torch.chunk; use the "
            "local tensor and its region, or a PhysicsNeMo ShardTensor with sharding_shapes")
    if chunk_sizes is not None and all(tuple(sizes) == tuple(split_sizes[name]) for name, sizes in chunk_sizes.items()):
        return  # the sizes are exactly chunk's for this shape: the DTensor tells the truth
    raise LayoutError(
        f"no DTensor for explicit split sizes {split_sizes}: DTensor's Shard sizes follow "
        + (f"torch.chunk, which gives {dict(chunk_sizes)} for sample shape {tuple(global_shape)}; "
           if chunk_sizes is not None else
           "torch.chunk, and explicit sizes are accepted only when they equal chunk's for the "
           "sample shape (pass global_shape=, as to_dtensor and MeshLoader do); ")
        + "use the local tensor and its region, or a PhysicsNeMo ShardTensor with sharding_shapes")


def torch_placements(spec: Sequence[Placement]) -> list:
    """torch ``Shard(d)`` / ``Replicate()`` of the plain data of :func:`placement_spec` (imports torch)."""
    from torch.distributed.tensor import Replicate, Shard  # noqa: PLC0415

    return [Shard(d) if kind == "shard" else Replicate() for kind, d in spec]


def _placement_kind(p, mesh_dim_name: str) -> Placement:
    """``("shard", tensor dim)`` or ``("replicate", None)`` of a torch placement or of the plain data
    of :func:`placement_spec`; anything a loader cannot honour is refused, named."""
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


def mesh_info(mesh) -> MeshInfo:
    """``mesh`` as a ``MeshInfo`` (a torch ``DeviceMesh``: this rank's coordinate read from it)."""
    if isinstance(mesh, MeshInfo):
        return mesh
    if not hasattr(mesh, "get_coordinate"):
        raise LayoutError(f"mesh must be a MeshInfo or a torch DeviceMesh, got {type(mesh).__name__}")
    return MeshInfo.from_device_mesh(mesh)


def shard_and_batch(mesh: MeshInfo, placements: Sequence, *, batched: bool = True, ndim: int | None = None,
                    lead_axes: int = 0, batch: str | Sequence[str] | None = None
                    ) -> tuple[dict[str, int], str | Sequence[str] | None]:
    """``(shard, batch)`` of the layout whose placements are ``placements`` (one per mesh dim of
    ``mesh``, torch's or :func:`placement_spec`'s), sample axes counted from 0; arguments as
    ``Layout.from_placements``. Batched, ``batch`` comes back as the ``Shard(0)`` mesh dims (checked
    against the given one); unbatched, as given."""
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
    if not batched:
        return shard, batch
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
    return shard, on_batch_axis


def split_of_sharding_shapes(mesh: MeshInfo, placements: Sequence, sharding_shapes: Mapping,
                             shard: Sequence[tuple[int, int]], batch_dims: Sequence[int], offset: int
                             ) -> str | dict[str, list[int]]:
    """The split of PhysicsNeMo ``sharding_shapes`` (``{mesh dim: (each rank's shard shape along it,
    ...)}``) for a layout sharding ``shard`` (``(mesh dim, sample axis)`` pairs) with batch dims
    ``batch_dims`` (indices), sample axis ``a`` being tensor dim ``offset + a``: the first rule of
    :data:`SPLITS` whose sizes they equal, else explicit sizes ``{mesh dim name: [sizes...]}``
    (``"chunk"`` when nothing is sharded). Every sample group must hold the same batch size."""
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
    for d in batch_dims:  # the batch axis: every sample group holds the same number of samples
        if d in shapes_by_dim:
            sizes = {s[0] for s in shapes_by_dim[d]}
            if len(sizes) > 1:
                raise LayoutError(f"sharding_shapes of batch dim {mesh.names[d]!r} give the ranks batch "
                                  f"sizes {sorted(sizes)}: a loader gives every sample group the same")
    sizes_by_dim = {}
    for axis, dims in _axis_groups(shard, None).items():
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
    if not sizes_by_dim:
        return "chunk"
    for rule in SPLITS:
        if all(tuple(split_sizes(sum(sizes), mesh.shape[d], rule)) == tuple(sizes)
               for d, sizes in sizes_by_dim.items()):
            return rule
    return {mesh.names[d]: [int(s) for s in sizes] for d, sizes in sizes_by_dim.items()}


def dtensor_parts(tensor_or_spec) -> tuple:
    """``(mesh, placements, ndim or None)`` of a DTensor or its ``DTensorSpec`` (``tensor._spec``)."""
    spec = getattr(tensor_or_spec, "_spec", tensor_or_spec)
    mesh = getattr(tensor_or_spec, "device_mesh", None)
    if mesh is None:
        mesh = getattr(spec, "mesh", None)
    placements = getattr(tensor_or_spec, "placements", None)
    if mesh is None or placements is None:
        raise LayoutError(f"from_dtensor needs a DTensor or DTensorSpec, got {type(tensor_or_spec).__name__}")
    meta = getattr(spec, "tensor_meta", None)
    ndim = getattr(tensor_or_spec, "ndim", None)
    if ndim is None and meta is not None and getattr(meta, "shape", None) is not None:
        ndim = len(meta.shape)
    return mesh, placements, ndim


def is_shard_tensor(tensor_or_spec) -> bool:
    """Whether this is a PhysicsNeMo ``ShardTensor`` or ``ShardTensorSpec`` (in PhysicsNeMo 2.2.2 a
    ShardTensor is not a DTensor: it is told by its spec's ``sharding_shapes``)."""
    return hasattr(getattr(tensor_or_spec, "_spec", tensor_or_spec), "sharding_shapes")


def shard_tensor_parts(tensor) -> tuple:
    """``(mesh, placements, sharding shapes, ndim or None)`` of a PhysicsNeMo ``ShardTensor`` or its
    ``ShardTensorSpec``: ``sharding_shapes()`` is its documented API (gathering them may communicate once)."""
    if not is_shard_tensor(tensor):
        raise LayoutError(f"from_shard_tensor needs a PhysicsNeMo ShardTensor or ShardTensorSpec, "
                          f"got {type(tensor).__name__}")
    spec = getattr(tensor, "_spec", tensor)
    meta = getattr(spec, "tensor_meta", None)
    ndim = len(meta.shape) if getattr(meta, "shape", None) is not None else None
    return spec.mesh, spec.placements, spec.sharding_shapes(), ndim
