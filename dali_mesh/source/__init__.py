"""Stateless, picklable external sources: each call returns this rank's window of one sample.

A source is called by DALI's ``fn.external_source(source, batch=False, parallel=True)`` with a
``SampleInfo``; ``(epoch_idx, idx_in_epoch)`` goes through the sample order
(:func:`dali_mesh.sample_order`, with the layout's ``batch_index`` and ``num_batch_groups``) to a
sample id, and the source returns ``(window[s]..., sample_id, is_pad)``. The answer is a pure function
of the source's settings and those two numbers, so DALI's worker processes and DALI checkpointing
need nothing else. ``StopIteration`` is raised at ``idx_in_epoch == len(source)``: the end of the last
whole batch (every rank of every sample group gets the same number of batches).

The package is cut by job: ``base`` (the DALI protocol, the sample order, regions, the checkpoint
fingerprint from declared fields), ``buffers`` (recycled outputs), ``status`` (what a worker reads,
for the watchdog), ``file_source`` and ``arrays`` (the sources), ``forecast``, ``args``.

This package imports numpy and dali_mesh only: DALI's ``spawn`` workers import nothing heavy (h5py
or zarr only when an HDF5 or Zarr source reads).

Sources::

    NumpySource(files, layout)                 one sample per ``.npy`` file
    FileSource(files, layout, format=)         one sample per file, in a registered format
    ArraySource(files, name, layout, format=)  samples along axis 0 of an array, across files, in a
                                               registered format (dali_mesh.formats)
    HDF5Source(files, dataset, layout)         ArraySource of HDF5 datasets
    ZarrSource(stores, array, layout)          ArraySource of Zarr arrays (v2 or v3)

HDF5Source and ZarrSource take ``forecast=ForecastSpec(history=k, lead=m, stride=s)``: the sample at
step t is the input steps ``t-k*s, .., t-s, t`` and the target steps ``t+s, .., t+m*s`` (crossing files
where needed), both windows of the same region; and ``channels=[...]`` (a subset of ``channel_axis`` of each step).
"""
from dali_mesh.source.arguments import check_sample_shape
from dali_mesh.source.arrays import ArraySource, HDF5Source, ZarrSource, array_source, pipeline_reader
from dali_mesh.source.base import SEED_LIMIT, WindowSource
from dali_mesh.plan.forecast_spec import ForecastSpec
from dali_mesh.source.file_source import FileSource, NumpySource, file_source

__all__ = ["ArraySource", "FileSource", "ForecastSpec", "HDF5Source", "NumpySource", "WindowSource", "ZarrSource",
           "array_source", "file_source", "check_sample_shape", "pipeline_reader", "SEED_LIMIT"]
