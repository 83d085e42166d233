"""The model-input checks (``like=``): what a model expects of its input, from a DTensor, a
PhysicsNeMo ShardTensor or their specs, and the check of a yielded tensor against it."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from dali_mesh.partition import LayoutError
from dali_mesh.partition.placements import is_shard_tensor


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



def like_specs(like, window_outputs: Sequence[str]) -> dict[str, dict]:
    """``{window output name: like_spec}`` of a loader's ``like=``: a dict names its outputs (window
    outputs only); anything else describes the first window output."""
    if isinstance(like, Mapping):
        unknown = [n for n in like if n not in window_outputs]
        if unknown:
            raise ValueError(f"like names outputs {unknown} that are not window outputs {list(window_outputs)}")
        return {n: like_spec(v) for n, v in like.items()}
    if not window_outputs:
        raise ValueError("like= needs a window output to describe; output_map has none")
    return {window_outputs[0]: like_spec(like)}


def check_like_layout(likes: Mapping[str, dict], layout, sample_shape: tuple[int, ...], device_mesh) -> None:
    """What can be checked before any data: the layout's placements, domain and (ShardTensor) shard
    shapes against the model's inputs (``likes``, from :func:`like_specs`); ``LayoutError`` names both."""
    region = layout.region(sample_shape)
    for name, want in likes.items():
        lead = len(want["shape"]) - 1 - len(sample_shape)
        got_sample = region.domain_shape
        if lead < 0 or tuple(want["shape"][1 + lead:]) != got_sample:
            raise LayoutError(f"the model's input {name!r} has shape {want['shape']} but the loader's samples "
                              f"have domain shape {got_sample} (sample_shape {sample_shape}, crop applied)")
        shard_tensor = want.get("kind") == "shard_tensor"
        placements = tuple(layout.dtensor_placements(
            len(sample_shape), halo_stripped=True, lead_axes=lead,
            **({"any_split": True} if shard_tensor else {"global_shape": sample_shape})))
        if placements != tuple(want["placements"]):
            raise LayoutError(f"the layout gives {name!r} placements {plain(placements)} but the model's input "
                              f"has {plain(want['placements'])} (layout {layout})")
        if want["mesh"] != device_mesh:
            raise LayoutError(f"the model's input {name!r} lives on {mesh_str(want['mesh'])}, the loader on "
                              f"{mesh_str(device_mesh)}")
        if shard_tensor:  # every rank's shard of the sample, along each mesh dim that shards it
            ours = layout.sharding_shapes(sample_shape)
            for d, shapes in ours.items():
                theirs = tuple(tuple(s[1 + lead:]) for s in want["sharding_shapes"].get(d, ()))
                if tuple(map(tuple, shapes)) != theirs:
                    raise LayoutError(
                        f"the layout splits {name!r} along mesh dim {layout.mesh.names[d]!r} into "
                        f"{[tuple(s) for s in shapes]} but the model's ShardTensor into {list(theirs)} "
                        f"(layout {layout}; split {layout.split!r})")
