"""Pipeline helpers: the dali_mesh DALI plugin's operators, and the partitioned source.

Importing this module imports DALI (``dali_mesh`` itself does not import this module). The compiled
plugin ``libdali_mesh.so`` (built by ``pip install --no-build-isolation -e .`` or ``make``, installed
inside this package) is loaded on the first use of one of its operators:

* :func:`strided_slice` -- ``fn.dali_mesh.strided_slice``: a strided window of each sample with a
  boundary rule per axis, an optional cast and per-channel normalisation, in one pass (CPU or GPU).
* :func:`mesh_roi` -- ``fn.dali_mesh.mesh_roi``: this rank's window for each sample's shape, by the
  rules of :meth:`dali_mesh.Layout.region` (CPU).
* :func:`mesh_slice` -- the two together: crops this rank's window (halo and boundaries included) of
  data already in the pipeline.
* :func:`read_dataset` -- the channels of a ``ZarrDatasetSource`` (variables and levels of an xarray-written
  Zarr group or NetCDF4 files): one native operator for variables of one dtype, else one per variable.
* :func:`read_windows` -- ``fn.dali_mesh.read_windows``: this rank's windows of a dali_mesh source read
  by the native operator (byte-range plans, ``preadv`` on DALI's threads, CPU or GPU output), with
  the same outputs, sample order and checkpointing as :func:`partitioned_source`. The recommended
  way in; sources it cannot serve (see :mod:`dali_mesh.pipeline.native`) fall back to :func:`partitioned_source`
  with a one-line log saying why.
* :func:`partitioned_source` -- a dali_mesh source as a DALI parallel external source (Python readers
  in DALI's worker processes).

Example (ERA5-like ``(C, 721, 1440)`` samples, latitude split over 4 ranks, periodic longitude)::

    layout = Layout(mesh, shard={"model_parallel": 1}, halo={1: 1, 2: 1},
                    boundary={1: "constant", 2: "periodic"})
    window = dali_mesh.fn.mesh_slice(x, layout, ndim=3, dtype=types.FLOAT,
                                     channel_axis=0, mean=means, std=stds)
"""
from __future__ import annotations

from dali_mesh.pipeline.external import partitioned_source
from dali_mesh.pipeline.image_tiles import decode_tile
from dali_mesh.pipeline.dataset_reader import read_dataset
from dali_mesh.pipeline.native import read_windows
from dali_mesh.pipeline.ops import mesh_roi, mesh_roi_args, mesh_slice, slice_boundaries, strided_slice
from dali_mesh.pipeline.plugin import PLUGIN_PATH, load_plugin
from dali_mesh.pipeline.watchdog import WorkerError, watched_run

__all__ = [
    "PLUGIN_PATH",
    "load_plugin",
    "strided_slice",
    "mesh_roi",
    "mesh_slice",
    "mesh_roi_args",
    "slice_boundaries",
    "partitioned_source",
    "read_windows",
    "read_dataset",
    "decode_tile",
    "WorkerError",
    "watched_run",
]
