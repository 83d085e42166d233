"""Image tiles: each rank decodes only its tile of every image (plus halo).

``fn.decoders.image_slice`` decodes a region of interest but cannot pad, so the tile is decoded
clipped to the image (and widened where a reflection needs more rows or columns than the tile has),
and ``fn.dali_mesh.strided_slice`` adds the halo cells beyond the image edge by the layout's
boundary rule. Images of different sizes in one batch are fine: the window comes per sample from
``fn.dali_mesh.mesh_roi(fn.peek_image_shape(jpegs), ...)``.

Example (a 2 x 2 mesh of tiles, 8 pixels of halo, mirrored at the image edges)::

    layout = Layout(mesh, shard={"h": 0, "w": 1}, halo={0: 8, 1: 8}, boundary={0: "reflect", 1: "reflect"})

    @pipeline_def(batch_size=4, num_threads=2, device_id=0)
    def pipe():
        jpegs, labels = fn.readers.file(file_root=root)
        return decode_tile(jpegs, layout, device="mixed"), labels
"""
from __future__ import annotations

import nvidia.dali.math as dmath
from nvidia.dali import fn, types

from dali_mesh.pipeline.ops import mesh_roi, mesh_roi_args, slice_boundaries, strided_slice
from dali_mesh.partition import LayoutError

__all__ = ["decode_tile", "IMAGE_BOUNDARIES"]

#: Boundary rules an image tile supports (periodic would need the far side of the image decoded).
IMAGE_BOUNDARIES = ("constant", "edge", "reflect", "symmetric", "trim")


def decode_tile(jpegs, layout, *, device: str = "cpu", output_type=types.RGB, dtype=None, **decoder_kwargs):
    """Decode this rank's tile (window: owned pixels plus halo) of every encoded image.

    Args:
        jpegs: DataNode of encoded images (CPU), e.g. from ``fn.readers.file``.
        layout: a :class:`dali_mesh.Layout` over HWC images: it may shard axes 0 (H) and 1 (W).
        device: ``"cpu"``, or ``"mixed"`` to decode on the GPU (nvJPEG).
        output_type: the decoder's colour space (``types.RGB``, ``types.GRAY``...).
        dtype: optional cast of the tile (``strided_slice``'s ``dtype``).
        decoder_kwargs: passed to ``fn.decoders.image_slice``.

    Returns:
        DataNode of HWC tiles, on the GPU with ``device="mixed"``. Each equals
        ``take_window(full_decode, layout.region(full_decode.shape))``.
    """
    if device not in ("cpu", "mixed"):
        raise ValueError(f"device must be 'cpu' or 'mixed', got {device!r}")
    ndim = 3
    boundary = layout.boundaries(ndim)
    for axis in (0, 1):
        if boundary[axis] not in IMAGE_BOUNDARIES:
            raise LayoutError(f"boundary {boundary[axis]!r} on image axis {axis} is not supported for image tiles; "
                              f"use one of {', '.join(IMAGE_BOUNDARIES)}")
    if 2 in layout.shard_axes(ndim):
        raise LayoutError("image tiles split H (axis 0) and W (axis 1); the channel axis 2 cannot be sharded")
    if any(h != (0, 0) for h in layout.halo_pairs(ndim)[2:]):
        raise LayoutError("image tiles take no halo on the channel axis 2")

    args = mesh_roi_args(layout, ndim)
    if "crop_start" in args:
        raise LayoutError("image tiles do not take a crop: crop the images in the pipeline first")
    shape = fn.peek_image_shape(jpegs, dtype=types.INT64)  # H, W, C
    window_start, window_shape = mesh_roi(shape, **args)
    window_stop = window_start + window_shape
    # The decoded box [lo, hi): the window clipped to the image, widened so that a reflection of
    # halo cells beyond one edge finds its source rows inside the box; where the window crosses an
    # edge, the box reaches that edge, so strided_slice's boundary on the box is the image's.
    lo = dmath.max(0, dmath.min(dmath.max(window_start, 0), 2 * shape - 1 - window_stop))
    hi = dmath.min(shape, dmath.max(dmath.min(window_stop, shape), 1 - window_start))
    tile = fn.decoders.image_slice(jpegs, lo[0:2], (hi - lo)[0:2], axes=[0, 1], device=device,
                                   output_type=output_type, **decoder_kwargs)
    return strided_slice(tile, (window_start - lo)[0:2], window_shape[0:2], axes=[0, 1],
                         boundary=slice_boundaries(boundary[:2]),
                         fill_value=layout.fill_value, dtype=dtype)
