"""The HDF5 format: samples along axis 0 of a dataset of an HDF5 file (NetCDF4 files are HDF5),
read by hyperslabs through h5py or planned natively (contiguous or chunked, filters decoded)."""
from dali_mesh.formats.hdf5.hdf5_reader import (create_hdf5_dataset, hdf5_filter_names, hdf5_sample_info,
                                                only_dataset_name, open_hdf5_dataset, plan_hdf5_steps,
                                                read_hdf5_window)

__all__ = ["create_hdf5_dataset", "hdf5_filter_names", "hdf5_sample_info", "only_dataset_name", "open_hdf5_dataset",
           "plan_hdf5_steps", "read_hdf5_window"]
