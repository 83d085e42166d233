"""The Zarr format: samples along axis 0 of a Zarr array (v2 or v3, sharded or not), read by region
selections through zarr-python (:mod:`.zarr_reader`), planned natively (:mod:`.zarr_planner`: its chunks, or
the inner chunks of its shards), written chunked (:mod:`.zarr_writer`)."""
from dali_mesh.formats.zarr.zarr_planner import plan_zarr_steps, zarr_codec_names
from dali_mesh.formats.zarr.zarr_reader import open_zarr_array, read_zarr_window
from dali_mesh.formats.zarr.zarr_writer import create_zarr_array, is_zarr_store

__all__ = ["create_zarr_array", "is_zarr_store", "open_zarr_array", "plan_zarr_steps", "read_zarr_window",
           "zarr_codec_names"]
