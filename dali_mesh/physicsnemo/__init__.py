"""PhysicsNeMo's own data pipes, reading only each rank's band.

``dali_mesh.physicsnemo.ERA5HDF5Datapipe``: a drop-in for
``physicsnemo.datapipes.climate.ERA5HDF5Datapipe`` (same arguments, files and outputs; each rank
holds its band of every field, as local tensors or ShardTensors). Importing this package imports
neither torch nor DALI (DALI's worker processes unpickle :class:`ERA5Source` from it).
"""
from __future__ import annotations

__all__ = ["ERA5HDF5Datapipe", "ERA5Source"]


def __getattr__(name):
    if name == "ERA5HDF5Datapipe":
        from dali_mesh.physicsnemo.era5 import ERA5HDF5Datapipe

        return ERA5HDF5Datapipe
    if name == "ERA5Source":
        from dali_mesh.physicsnemo.era5_source import ERA5Source

        return ERA5Source
    raise AttributeError(f"module 'dali_mesh.physicsnemo' has no attribute {name!r}")
