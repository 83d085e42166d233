"""dali_mesh: each rank of a torch DeviceMesh reads only its part of every sample.

Importing this package imports neither torch nor DALI: DALI's worker processes re-import it.
"""
from dali_mesh.mesh import MeshInfo
from dali_mesh.partition import Layout, Region, Rows, SampleOrder, sample_order
from dali_mesh.pipeline.watchdog import WorkerError, watched_run
from dali_mesh.source import ForecastSpec, HDF5Source, NumpySource, ZarrSource
from dali_mesh.weather import NamedLayout, NetCDFDatasetSource, ZarrDatasetSource

__version__ = "0.1.0"
__all__ = ["MeshInfo", "Layout", "Region", "Rows", "SampleOrder", "sample_order", "NumpySource", "HDF5Source", "ZarrSource",
           "ForecastSpec", "ZarrDatasetSource", "NetCDFDatasetSource", "NamedLayout", "WorkerError", "watched_run",
           "__version__"]
