"""The Zarr format object: samples along axis 0 of a Zarr array (v2 or v3, sharded or not), read by
region selections (:mod:`.zarr_reader`), planned natively (:mod:`.zarr_planner`), written chunked
(:mod:`.zarr_writer`), its layout advice (:mod:`.zarr_advice`). Registers itself."""
from __future__ import annotations

from typing import Mapping

import numpy as np

from dali_mesh.formats.array_format import ArrayFormat, ArrayInfo, ArrayWriter
from dali_mesh.formats.format_registry import register_format
from dali_mesh.formats.zarr.zarr_planner import plan_zarr_steps, zarr_codec_names
from dali_mesh.formats.zarr.zarr_reader import open_zarr_array, read_zarr_window
from dali_mesh.formats.zarr.zarr_writer import create_zarr_array, is_zarr_store
from dali_mesh.io._common import native_dtype

__all__ = ["ZARR", "ZarrFormat"]


class ZarrFormat(ArrayFormat):
    name, label, container, array_word, suffixes = "zarr", "Zarr array", "store", "array", (".zarr",)
    write_suffixes = (".zarr",)
    fills_window = True  # every element: FormatTests checks it

    def info(self, location, name=None, **options) -> ArrayInfo:
        arr = self.open(location, name)
        try:
            chunks = tuple(int(c) for c in arr.chunks)
        except Exception:  # noqa: BLE001 - sharded arrays describe their chunks otherwise
            chunks = None
        return ArrayInfo(tuple(arr.shape), native_dtype(arr.dtype), chunks, zarr_codec_names(arr))

    def open(self, location, name=None, **options):
        return open_zarr_array(location, name)

    def read_window(self, handle, region, out, *, prefix=(), index_maps=None, expected_shape=None,
                    expected_dtype=None) -> None:
        read_zarr_window(handle, region, out, prefix=prefix, index_maps=index_maps, expected_shape=expected_shape,
                         expected_dtype=expected_dtype)

    def read_whole(self, handle, index=None) -> np.ndarray:
        return np.asarray(handle[...] if index is None else handle[index])

    def create(self, location, name, shape, dtype, chunks, zarr_format: int = 3, **options) -> ArrayWriter:
        return create_zarr_array(location, name, shape, dtype, chunks, zarr_format=zarr_format, **options)

    def is_store(self, location) -> bool:
        return is_zarr_store(location)

    def advice_target(self, location, name=None, **options):
        from dali_mesh.formats.zarr.zarr_advice import ZarrColdReads  # noqa: PLC0415

        return ZarrColdReads(self, location, name)

    def plan_steps(self, location, name, steps, region, *, plans, max_parts, options: Mapping | None = None,
                   index_maps=None, merge_gap: int = 0):
        return plan_zarr_steps(location, name, steps, region, plans=plans, max_parts=max_parts, index_maps=index_maps,
                               merge_gap=merge_gap)


ZARR = register_format(ZarrFormat())
