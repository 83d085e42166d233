"""Image tiles: each rank decodes only its tile (:func:`decode_tile`, also ``dali_mesh.fn.decode_tile``).
The code lives in :mod:`dali_mesh.pipeline.image_tiles`; this module keeps the import path of the README."""
from dali_mesh.pipeline.image_tiles import IMAGE_BOUNDARIES, decode_tile

__all__ = ["IMAGE_BOUNDARIES", "decode_tile"]
