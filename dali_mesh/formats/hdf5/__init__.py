"""The HDF5 format: samples along axis 0 of a dataset of an HDF5 file (NetCDF4 files are HDF5),
read by hyperslabs through h5py (:mod:`.hdf5_reader`), planned natively (:mod:`.hdf5_planner`: contiguous or
chunked, filters decoded), written chunked (:mod:`.hdf5_writer`)."""
from dali_mesh.formats.hdf5.hdf5_planner import hdf5_filter_names, plan_hdf5_steps
from dali_mesh.formats.hdf5.hdf5_reader import hdf5_sample_info, only_dataset_name, open_hdf5_dataset, read_hdf5_window
from dali_mesh.formats.hdf5.hdf5_writer import create_hdf5_dataset

__all__ = ["create_hdf5_dataset", "hdf5_filter_names", "hdf5_sample_info", "only_dataset_name", "open_hdf5_dataset",
           "plan_hdf5_steps", "read_hdf5_window"]
