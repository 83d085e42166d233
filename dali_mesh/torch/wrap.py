"""Local windows as torch DTensors or PhysicsNeMo ShardTensors, and the device mesh checked
against the layout's mesh."""
from __future__ import annotations

from typing import Sequence

import torch

from dali_mesh.mesh import MeshError, MeshInfo
from dali_mesh.partition import Layout, LayoutError


def _contiguous_stride(shape: Sequence[int]) -> tuple[int, ...]:
    stride, acc = [], 1
    for s in reversed(shape):
        stride.append(acc)
        acc *= s
    return tuple(reversed(stride))


def _owned_part(local: torch.Tensor, layout: Layout, sample_shape: Sequence[int], lead_axes: int):
    """This rank's batched window ``(batch, *lead, *window)`` with the halo stripped."""
    region = layout.region(sample_shape)
    shape = tuple(local.shape[1 + lead_axes:])
    if shape == region.window_shape:
        return local[(slice(None),) * (1 + lead_axes) + region.owned_in_window], region
    if shape != region.shape:
        raise LayoutError(f"local batch of shape {tuple(local.shape)} holds neither the window {region.window_shape} "
                          f"nor the owned region {region.shape} of rank {layout.mesh.rank} after {lead_axes} "
                          "leading axes")
    return local, region


def to_dtensor(local: torch.Tensor, layout: Layout, sample_shape: Sequence[int], device_mesh, *, lead_axes: int = 0):
    """Wrap this rank's batched window ``(batch, *lead, *window)`` (halo included or not) as a DTensor of
    the global batch.

    The halo is stripped first; placements come from the layout (``Shard(0)`` for batch dims,
    ``Shard(1 + lead_axes + axis)`` for shard dims, ``Replicate()`` otherwise). ``lead_axes`` counts
    unsplit axes after the batch (a forecast's steps). Only ``split="chunk"`` (or explicit sizes
    equal to chunk's for ``sample_shape``): the global shape and stride are given explicitly, which
    DTensor gets right only for torch.chunk shard sizes.
    """
    from torch.distributed.tensor import DTensor  # noqa: PLC0415

    ndim = len(sample_shape)
    placements = layout.dtensor_placements(ndim, halo_stripped=True, lead_axes=lead_axes,
                                           global_shape=tuple(sample_shape))
    local, region = _owned_part(local, layout, sample_shape, lead_axes)
    global_shape = (local.shape[0] * layout.num_batch_groups,) + tuple(local.shape[1:1 + lead_axes]) + region.domain_shape
    return DTensor.from_local(local.contiguous(), device_mesh, placements, run_check=False,
                              shape=torch.Size(global_shape), stride=_contiguous_stride(global_shape))


def to_shard_tensor(local: torch.Tensor, layout: Layout, sample_shape: Sequence[int], device_mesh, *,
                    lead_axes: int = 0):
    """Wrap this rank's batched window (halo stripped) as a PhysicsNeMo ``ShardTensor`` with explicit
    ``sharding_shapes`` (mesh dim -> the local shapes along it), correct for every split rule."""
    try:
        from physicsnemo.domain_parallel import ShardTensor  # noqa: PLC0415
    except ImportError:
        try:
            from physicsnemo.distributed.shard_tensor import ShardTensor  # noqa: PLC0415 (older releases)
        except ImportError as e:
            raise ImportError("output='shard_tensor' needs PhysicsNeMo (pip install nvidia-physicsnemo)") from e
    placements = layout.dtensor_placements(len(sample_shape), halo_stripped=True, lead_axes=lead_axes,
                                           any_split=True)
    local, _ = _owned_part(local, layout, sample_shape, lead_axes)
    lead = tuple(local.shape[1:1 + lead_axes])
    by_dim = layout.sharding_shapes(sample_shape)
    shapes = {}
    for d, placement in enumerate(placements):
        if placement.is_shard():  # batch dims: every sample group holds a whole local batch
            along = [(local.shape[0],) + lead + s for s in by_dim[d]] if d in by_dim else \
                [tuple(local.shape)] * layout.mesh.shape[d]
            shapes[d] = [torch.Size(s) for s in along]
    return ShardTensor.from_local(local.contiguous(), device_mesh, placements, sharding_shapes=shapes)


# ---- checks of what the caller passed against what the layout says -------------------------------------
def device_mesh_info(device_mesh, layout: Layout) -> MeshInfo:
    """The device mesh as a ``MeshInfo``, refused unless it is the layout's mesh (shape, names where the
    device mesh has any, and this rank's coordinate): a DTensor over another mesh would claim a global
    shape its shards do not hold."""
    try:
        from torch.distributed.device_mesh import DeviceMesh  # noqa: PLC0415
    except ImportError:  # torch without distributed
        DeviceMesh = None  # noqa: N806
    if DeviceMesh is not None and not isinstance(device_mesh, DeviceMesh):
        raise TypeError(f"device_mesh must be a torch DeviceMesh (init_device_mesh(...)), "
                        f"got {type(device_mesh).__name__}")
    try:
        info = MeshInfo.from_device_mesh(device_mesh)
    except MeshError as e:
        raise LayoutError(f"device_mesh: {e}") from None
    mesh = layout.mesh
    named = bool(getattr(device_mesh, "mesh_dim_names", None))
    if info.shape != mesh.shape or (named and info.names != mesh.names) or info.coordinate != mesh.coordinate:
        raise LayoutError(
            f"device_mesh disagrees with layout.mesh: the device mesh has shape {info.shape}, names "
            f"{info.names if named else '(none)'}, this rank at {info.coordinate}; the layout's mesh has shape "
            f"{mesh.shape}, names {mesh.names}, this rank at {mesh.coordinate}. Build the layout from the "
            "same mesh: Layout(MeshInfo.from_device_mesh(device_mesh), ...)")
    return info

