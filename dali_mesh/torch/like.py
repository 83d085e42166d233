"""The model-input checks (``like=``): what a model expects of its input, from a DTensor, a
PhysicsNeMo ShardTensor or their specs, and the check of a yielded tensor against it."""
from __future__ import annotations

from typing import Any

from dali_mesh.partition import LayoutError


def is_shard_tensor(like) -> bool:
    """A PhysicsNeMo ``ShardTensor`` or ``ShardTensorSpec`` (in PhysicsNeMo 2.2.2 a ShardTensor is not
    a DTensor: it is told by its spec's ``sharding_shapes``)."""
    return hasattr(getattr(like, "_spec", like), "sharding_shapes")


def _sharding_shapes(spec) -> dict[int, tuple[tuple[int, ...], ...]]:
    return {int(d): tuple(tuple(int(v) for v in s) for s in shapes) for d, shapes in spec.sharding_shapes().items()}


def like_spec(like) -> dict[str, Any]:
    """What a model expects of its input, from a DTensor (``model_input``) or a ``DTensorSpec``:
    ``{"mesh", "placements", "shape", "stride", "local_shape"}``; from a PhysicsNeMo ``ShardTensor``
    (or ``ShardTensorSpec``) also ``"sharding_shapes"`` (mesh dim -> every rank's local shape along it)
    and ``"kind": "shard_tensor"``."""
    from torch.distributed.tensor import DTensor  # noqa: PLC0415

    if is_shard_tensor(like):
        spec = getattr(like, "_spec", like)
        meta = spec.tensor_meta
        return {"kind": "shard_tensor", "mesh": spec.mesh, "placements": tuple(spec.placements),
                "shape": tuple(meta.shape), "stride": tuple(meta.stride), "local_shape": tuple(spec.local_shape),
                "sharding_shapes": _sharding_shapes(spec)}
    if isinstance(like, DTensor):
        return {"mesh": like.device_mesh, "placements": tuple(like.placements), "shape": tuple(like.shape),
                "stride": tuple(like.stride()), "local_shape": tuple(like.to_local().shape)}
    mesh = getattr(like, "mesh", None)
    placements = getattr(like, "placements", None)
    meta = getattr(like, "tensor_meta", None)
    if mesh is None or placements is None:
        raise TypeError(f"like must be a DTensor or PhysicsNeMo ShardTensor (the model's input) or its spec, "
                        f"got {type(like).__name__}")
    if meta is None:
        raise ValueError("like: the DTensorSpec has no tensor_meta (shape and stride); pass the DTensor itself")
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset  # noqa: PLC0415

    local, _ = compute_local_shape_and_global_offset(meta.shape, mesh, placements)
    return {"mesh": mesh, "placements": tuple(placements), "shape": tuple(meta.shape),
            "stride": tuple(meta.stride), "local_shape": tuple(local)}


def mesh_str(mesh) -> str:
    names = getattr(mesh, "mesh_dim_names", None)
    return f"DeviceMesh(shape {tuple(mesh.shape)}, names {tuple(names) if names else None}, " \
           f"ranks {mesh.mesh.flatten().tolist()})"


def check_like(dtensor, like, name: str = "window") -> None:
    """Raise ``LayoutError`` unless ``dtensor`` has the mesh, placements, global shape, stride and local
    shape the model expects (``like``: a DTensor, a ShardTensor or their spec), and for a ShardTensor
    the same sharding shapes (every rank's local shape); the message names both sides."""
    want = like if isinstance(like, dict) else like_spec(like)
    got = like_spec(dtensor)
    diffs = []
    if got.get("kind") != want.get("kind"):
        kinds = [type(dtensor).__name__, "ShardTensor" if want.get("kind") else "DTensor"]
        diffs.append(f"type {kinds[0]} vs {kinds[1]}")
    if got["mesh"] != want["mesh"]:
        diffs.append(f"mesh {mesh_str(got['mesh'])} vs {mesh_str(want['mesh'])}")
    for key in ("placements", "shape", "stride", "local_shape"):
        if tuple(got[key]) != tuple(want[key]):
            diffs.append(f"{key} {plain(got[key])} vs {plain(want[key])}")
    if "sharding_shapes" in want and got.get("sharding_shapes") != want["sharding_shapes"]:
        diffs.append(f"sharding_shapes {got.get('sharding_shapes')} vs {want['sharding_shapes']}")
    if diffs:
        raise LayoutError(f"the loader's {name!r} does not match the model's input (loader vs model): "
                          + "; ".join(diffs))


def plain(value) -> str:
    return "(" + ", ".join(repr(v) for v in value) + ")" if isinstance(value, (tuple, list)) else repr(value)

