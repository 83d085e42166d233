"""The Zarr format: samples along axis 0 of a Zarr array (v2 or v3, sharded or not), read by region
selections through zarr-python or planned natively (its chunks, or the inner chunks of its shards)."""
from dali_mesh.formats.zarr.zarr_reader import (create_zarr_array, is_zarr_store, open_zarr_array, plan_zarr_steps,
                                                read_zarr_window, zarr_codec_names)

__all__ = ["create_zarr_array", "is_zarr_store", "open_zarr_array", "plan_zarr_steps", "read_zarr_window",
           "zarr_codec_names"]
