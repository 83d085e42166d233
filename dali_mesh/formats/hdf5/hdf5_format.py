"""The HDF5 format object: samples along axis 0 of a dataset (NetCDF4 files are HDF5), read by
hyperslabs (:mod:`.hdf5_reader`), planned natively (:mod:`.hdf5_planner`), written chunked
(:mod:`.hdf5_writer`), its layout advice (:mod:`.hdf5_advice`). Registers itself."""
from __future__ import annotations

from typing import Mapping

import numpy as np

from dali_mesh.formats.array_format import ArrayFormat, ArrayInfo, ArrayWriter
from dali_mesh.formats.format_registry import register_format
from dali_mesh.formats.hdf5.hdf5_planner import hdf5_filter_names, plan_hdf5_steps
from dali_mesh.formats.hdf5.hdf5_reader import only_dataset_name, open_hdf5_dataset, read_hdf5_window
from dali_mesh.formats.hdf5.hdf5_writer import create_hdf5_dataset
from dali_mesh.io._common import native_dtype

__all__ = ["HDF5", "HDF5Format"]


class HDF5Format(ArrayFormat):
    name, label, container, array_word = "hdf5", "HDF5 dataset", "file", "dataset"
    suffixes = (".h5", ".hdf5", ".hdf", ".nc")
    write_suffixes = (".h5", ".hdf5")
    reads_in_parallel = False
    fills_window = True  # every element: FormatTests checks it

    def probe(self, location) -> bool:
        # NetCDF4 files are HDF5, but a folder of .nc files is a weather dataset: found by suffix only
        # where the CLI asks for arrays (see dali_mesh.cli.options.find_data)
        return str(location).rstrip("/").lower().endswith(self.probe_names())

    def probe_names(self) -> tuple[str, ...]:
        return self.suffixes[:3]

    def default_name(self, location) -> str:
        return only_dataset_name(location)

    def trust_options(self, allow_external: bool = False) -> dict:
        return {"h5_kwargs": {"allow_external": bool(allow_external)}}

    def info(self, location, name=None, h5_kwargs: Mapping | None = None, **options) -> ArrayInfo:
        f, ds = self.open(location, name, h5_kwargs=h5_kwargs)
        with f:
            return ArrayInfo(tuple(ds.shape), native_dtype(ds.dtype), None if ds.chunks is None else tuple(ds.chunks),
                             hdf5_filter_names(ds))

    def open(self, location, name=None, h5_kwargs: Mapping | None = None, **options):
        return open_hdf5_dataset(location, name or self.default_name(location), **dict(h5_kwargs or {}))

    def close(self, handle) -> None:
        handle[0].close()

    def read_window(self, handle, region, out, *, prefix=(), index_maps=None, expected_shape=None,
                    expected_dtype=None) -> None:
        read_hdf5_window(handle[1], region, out, prefix=prefix, index_maps=index_maps, expected_shape=expected_shape,
                         expected_dtype=expected_dtype, path=handle[0].filename)

    def read_whole(self, handle, index=None) -> np.ndarray:
        return handle[1][()] if index is None else handle[1][index]

    def create(self, location, name, shape, dtype, chunks, **options) -> ArrayWriter:
        return create_hdf5_dataset(location, name, shape, dtype, chunks, **options)

    def advice_target(self, location, name=None, h5_kwargs: Mapping | None = None, **options):
        from dali_mesh.formats.hdf5.hdf5_advice import HDF5ColdReads  # noqa: PLC0415

        return HDF5ColdReads(self, location, name or self.default_name(location),
                             bool(dict(h5_kwargs or {}).get("allow_external", False)))

    def plan_steps(self, location, name, steps, region, *, plans, max_parts, options: Mapping | None = None,
                   index_maps=None, merge_gap: int = 0):
        return plan_hdf5_steps(location, name, steps, region, plans=plans, max_parts=max_parts, index_maps=index_maps,
                               merge_gap=merge_gap, h5_kwargs=dict((options or {}).get("h5_kwargs") or {}))


HDF5 = register_format(HDF5Format())
