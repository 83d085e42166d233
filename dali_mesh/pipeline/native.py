"""The native reader: plan in Python, read in C++ (``fn.dali_mesh.read_windows``).

:func:`read_windows` puts a dali_mesh source's windows into the pipeline without Python on the hot
path: the format-specific work (parse a header, find a dataset's offset) turns each distinct file
layout and this rank's :class:`~dali_mesh.Region` into a byte-range plan once, in the format's own
module (:func:`dali_mesh.formats.npy.plan_npy_files`, :func:`dali_mesh.formats.hdf5.plan_hdf5_steps`,
:func:`dali_mesh.formats.zarr.plan_zarr_steps`, assembled by :func:`dali_mesh.plan.chunks.plan_time_series`;
each source's ``native_plans`` says which); the plans (:mod:`dali_mesh.plan`), the file table
and one item per sample id go to the operator in a plan file written once. Per batch, a cheap batch-mode ``fn.external_source`` gives the sample ids and pad
flags from the stateless sample order (so checkpoint and resume behave as with
``partitioned_source``), and the operator ``preadv``-s the ranges on DALI's threads straight into
its output (CPU), or into pinned staging copied to the GPU (``device="gpu"``), then does the byte
swap (as the ranges land), the Fortran-order transpose and the boundary cells (copies and constant
fills). On the GPU the boundary cells are filled on the device by the strided-slice kernel wherever
a plan's copies and fills are one strided slice of the cells read (constant, reflect, symmetric,
edge; periodic halos are read from the far side as ranges of their own); other plans (halos wider
than the axis that chain copies) are finished in pinned memory (``DALI_MESH_DEVICE_FILL=0``: all).

Which sources take the native path:

======================================  ===================================================
source                                  path
======================================  ===================================================
``NumpySource`` (C or Fortran order,    native; one plan per distinct header (shape, dtype,
either byte order, channel subsets,     byte order, C/Fortran order), so files that differ in
per-sample shapes)                      byte order or order mix freely; every header is read
                                        once when the plan is made (one small read per file),
                                        and each file's header bytes and size are checked when
                                        read
``HDF5Source``, contiguous dataset      native; one plan per file layout, a base offset per step
``HDF5Source``, chunked without         native; the chunk offsets from one pass over the chunk
filters (uncompressed), every chunk     index; steps whose chunks lie alike relative to each
touched written                         other share one plan (one part per step, reads merged),
                                        up to ``MAX_MERGED_LAYOUTS`` (:mod:`dali_mesh.plan.chunks`) per file; beyond, a part
                                        per chunk piece, its plan shared by all steps
``ZarrSource`` v2/v3, uncompressed,     native; one part per chunk file touched (plans shared
local store, every chunk touched        by all steps, as above), then one finishing plan
written                                 (boundary cells)
``ZarrSource`` v2 compressed (Blosc,    native; each chunk the batch needs is read whole and
Zstd, LZ4, Zlib, GZip; order C, F), v3 decoded once on DALI's threads (c-blosc2, libzstd,
``bytes`` + blosc/zstd/gzip, then       liblz4, libdeflate or zlib; crc32c verified by
optionally crc32c; chunks never         libcrc32c), every part copies its units out of the
written read as the fill value          decoded chunk (byte swap as above)
``HDF5Source`` (and NetCDF4) chunked    native, the same way; chunk byte ranges from one pass
with deflate, LZF, szip, shuffle,       over the chunk index; Fletcher-32 verified; a chunk
Fletcher-32                             whose optional filters were skipped decoded by the rest
``ZarrSource`` v3 sharded               native; each shard's index read once (crc32c checked),
                                        the inner chunks touched read by their byte range
forecasts of the above                  native; one operator for both outputs (input, target),
                                        each step a part at its place in its stacked window; a
                                        chunk both need is read and decoded once per batch
everything else (``direct=True``,       ``partitioned_source`` (a one-line log says why,
other filters and codecs (Zarr          naming the filter, codec or missing library)
filters, other v3 transpositions,
forecasts of order F; HDF5 scale-offset,
n-bit, plugin filters), HDF5
chunks never written, forecasts with
per-sample shapes, more than
``MAX_NATIVE_SAMPLES`` samples or
``MAX_NATIVE_PARTS`` chunk reads)
======================================  ===================================================

Planning costs one small read per ``.npy`` file, and per HDF5 file or Zarr store one pass over
its chunk index (or one ``stat`` per chunk file touched); the plans are as many as the distinct
layouts (headers; chunk pieces of one window), never one per step. The items (one per sample id:
its parts) are numpy arithmetic; above ``MAX_NATIVE_SAMPLES`` (2**20) samples the plan file would
be large, so such sources (a file claiming 2**31 steps, say) are read by ``partitioned_source``,
whose sample order and reads cost nothing per step until a step is read.

Every read checks that the file is still what was planned for: a regular file of the planned size,
holding the planned bytes where its layout is described (a ``.npy`` header; an HDF5 dataset's
object header: shape, dtype, data address, chunking; a Zarr array's metadata file, compared in a
canonical form that leaves out its attributes, so that adding one does not stop the reads). A file
truncated, grown, or rewritten with another layout after the plan was made is an error naming it,
never garbage; a ``.npy`` file or Zarr chunk rewritten with the same layout is read anew. An HDF5
file must also keep its modification time: one rewritten in place with the same header may hold
another dataset at the planned address (or its chunks at other offsets), so any rewrite is refused.
Each read task opens, checks, reads and closes its file, so a batch of many-chunk Zarr samples holds
one descriptor per thread. The plan file ends with a checksum: a corrupt one is refused.

Importing this module imports neither DALI nor the plugin (:func:`read_windows` does, when called).
"""
from __future__ import annotations

import logging

import numpy as np

from dali_mesh.plan.ranges import DEFAULT_MERGE_GAP
from dali_mesh.plan import NotNativeError, PlanSet
from dali_mesh.pipeline.registry import Defined, register
from dali_mesh.source import pipeline_reader

__all__ = ["NotNativeError", "define_native", "plan_source", "plan_windows", "read_windows"]

log = logging.getLogger(__name__)

#: the most batches the operator reads ahead (kMaxAheadBatches in csrc/reader/batch_reader.h)
MAX_AHEAD_BATCHES = 8


def plan_source(source, *, merge_gap: int = DEFAULT_MERGE_GAP) -> PlanSet:
    """The native plan of ``source``'s first window for this rank (see :func:`plan_windows`)."""
    return plan_windows(source, merge_gap=merge_gap)[0]


def plan_windows(source, *, merge_gap: int = DEFAULT_MERGE_GAP) -> tuple[PlanSet, ...]:
    """The native plans of ``source`` for this rank, one per window output (``source.window_names``:
    the window, or a forecast's input and target), or :class:`NotNativeError` saying why not: the
    source's own ``native_plans``, which call its format's planner."""
    native_plans = getattr(source, "native_plans", None)
    if native_plans is None:
        raise NotNativeError(f"{type(source).__name__} is not read natively (NumpySource, HDF5Source and "
                             "ZarrSource are)")
    return tuple(native_plans(merge_gap))


# ---- the pipeline side ---------------------------------------------------------------------------
class _SampleIds:
    """Batch-mode external source: this rank's sample ids and pad flags of one batch, and per sample its
    ids in the next ``ahead`` batches (a 1-D tensor, batch t+1 first; the reader reads those batches
    ahead; -1 past the epoch's last batch: a batch of the next epoch is not fetched before it is asked
    for), from the source's stateless sample order (``BatchInfo``: iteration and epoch), so DALI's
    checkpoints resume it exactly. ``StopIteration`` after the last whole batch."""

    def __init__(self, source, ahead: int = 1) -> None:
        self.source = source
        self.ahead = ahead

    def __call__(self, info):
        batch = batch_entries(self.source, info)
        ids, pads = [np.array(int(s), np.int64) for s, _ in batch], [np.array(bool(p)) for _, p in batch]
        if not self.ahead:
            return ids, pads
        nxt = np.full((len(batch), self.ahead), -1, np.int64)
        for b in range(self.ahead):
            try:
                after = batch_entries(self.source, _Later(info, b + 1))
            except StopIteration:
                break
            if len(after) != len(batch):  # a short last batch is read when it is asked for
                break
            nxt[:, b] = [int(s) for s, _ in after]
        return ids, pads, list(nxt)


class _Later:
    """The ``BatchInfo`` of the batch ``k`` after ``info``'s, in the same epoch."""

    def __init__(self, info, k: int) -> None:
        self.iteration = int(info.iteration) + k
        self.epoch_idx = int(info.epoch_idx)


#: the attribute of a sample-id node that holds its next-batch-id node (the same external source's)
_NEXT_IDS = "_dali_mesh_next_ids"


def batch_entries(source, info) -> list[tuple[int, bool]]:
    """The ``(sample_id, is_pad)`` entries of the batch a batch-mode external source is asked for
    (``BatchInfo``: iteration and epoch), from ``source``'s stateless sample order; ``StopIteration``
    after the last whole batch. O(1) per index (SampleOrder), not the epoch's arrays: a source claiming
    2**40 samples costs one batch's worth per call."""
    order = source.sample_order(int(info.epoch_idx))
    bs = source.batch_size
    i0 = int(info.iteration) * bs
    if i0 >= len(order):
        raise StopIteration
    return [order[i] for i in range(i0, min(i0 + bs, len(order)))]


def read_windows(source, device: str = "cpu", *, name: str | None = None, layout: str | None = None,
                 fallback: bool = True, task_bytes: int = 4 << 20, prefetch: bool = True,
                 merge_gap: int = DEFAULT_MERGE_GAP, plan_dir: str | None = None, sample_ids=None, plans=None,
                 normalize=None, read_ahead: bool | None = None, read_ahead_batches: int | None = None,
                 read_ahead_bytes: int = 1 << 30, **kwargs):
    """This rank's windows of ``source``, read by the native operator (``fn.dali_mesh.read_windows``).

    Outputs as :func:`dali_mesh.fn.partitioned_source`: ``(window, sample_id, is_pad)``, or with a
    forecast ``(input, target, sample_id, is_pad)`` (steps stacked on a leading axis); the sample
    order, padding and checkpointing are the same. Needs no Python worker processes
    (``py_num_workers`` is unused); reads run on the pipeline's ``num_threads``.

    Args:
        source: a :class:`~dali_mesh.NumpySource`, :class:`~dali_mesh.HDF5Source` or
            :class:`~dali_mesh.ZarrSource` (see the table above for what is read natively).
        device: ``"cpu"``, or ``"gpu"``: the window lands in GPU memory (pinned staging, one
            asynchronous copy, halo cells filled on the device; the sample id and pad flag stay on
            the CPU).
        name: the sample-id external source's name.
        layout: DALI layout string of the window (e.g. ``"CHW"``).
        fallback: when the source cannot be read natively, log one line why and return
            ``partitioned_source(source, device, ...)`` (``False``: raise :class:`NotNativeError`).
        task_bytes: bytes per thread-pool task (a large window is read by every thread).
        prefetch: announce every range of a batch to the kernel (``POSIX_FADV_WILLNEED``) when its
            files are opened: cold, all of them are read at once (exactly the ranges, no more).
        merge_gap: byte ranges at most this far apart are read in one call (as the Python reader).
        plan_dir: a folder for the plan file (default: none, the plan is a sealed memfd of this
            process; a folder must be this user's own and writable by no one else).
        sample_ids: ``(sample_id, is_pad)`` nodes of another ``read_windows`` whose source has this
            source's sample order (``read_dataset`` reads several variables with one), instead of a
            sample-id source of its own.
        plans: ``source``'s native plans, already made by :func:`plan_windows` (``read_dataset``
            plans each variable once, to choose its reader), instead of planning again.
        normalize: ``(channel_axis, mean, std)``: each float32 window becomes ``(x - mean[c]) / std[c]``
            in place as the operator finishes it (every cell, halo cells too; ``c`` the index on
            ``channel_axis``). CPU only: on the GPU ``strided_slice(..., channel_axis, mean, std)``
            after the read is one pass on the device.
        read_ahead: read the next batches on threads of the operator's own while this one is read
            (their windows in buffers of the operator's own), so that the round trips of several
            batches overlap: ``None`` (default) when the source is in an object store (``s3://``,
            ``gs://``, ``https://``), ``True`` also for local files, ``False`` never. The sample order
            gives the next batches, within the epoch (the first batch of an epoch is read when it is
            asked for); the data, the checks and the errors are those of reading that batch when it
            comes. A batch read ahead that is not asked for next (a restored checkpoint) is dropped.
        read_ahead_batches: the most batches read ahead, 1 to 8 (``None``: 8; on a 20-50 ms link
            eight took 0.7-0.8x the epoch of four, its first batch 10 ms later:
            benchmarks/remote_results.md; ``read_ahead_bytes`` bounds their memory). With
            ``sample_ids`` of another ``read_windows``, at most as many as that one's.
        read_ahead_bytes: what the batches read ahead hold together, at most: their windows (twice
            for a Fortran-order file's, read through a copy), and the compressed chunks they fetched
            with the buffers they decode them in (each fetch holds its bytes from before its request
            until its decode ends: the decoded chunk, and a second one where a filter follows the
            compressor, as Zarr v2's shuffle and HDF5's shuffle do). A batch is read ahead only when
            its windows, with those of the batches before it, leave room for the largest single fetch
            of any of them (fewer batches are read ahead; none when one does not fit: with 2 MiB, no
            batch of 4 MiB chunks, whose fetch and decode hold the 4 MiB and the stored bytes); the
            batches started together then share what their windows leave, and a request that fetches
            several chunks of one file at once is cut to it. Its windows and fetches wait for room,
            the next batch's first, and never pass the bound. The batch being read is not counted:
            when a read waits for a batch read ahead, that batch's fetches wait no more, as a read of
            its own would not.
        kwargs: passed to the ``partitioned_source`` fallback.
    """
    from dali_mesh.pipeline.external import current_pipeline_for

    pipe = current_pipeline_for(source)
    # as partitioned_source does: MeshLoader checks the source and fingerprints checkpoints with it
    return register(pipe, define_native(
        source, device, name=name, layout=layout, fallback=fallback, task_bytes=task_bytes, prefetch=prefetch,
        merge_gap=merge_gap, plan_dir=plan_dir, sample_ids=sample_ids, plans=plans, normalize=normalize,
        read_ahead=read_ahead, read_ahead_batches=read_ahead_batches, read_ahead_bytes=read_ahead_bytes, **kwargs))


def define_native(source, device: str, *, name: str | None = None, layout: str | None = None,
                  fallback: bool = True, task_bytes: int = 4 << 20, prefetch: bool = True,
                  merge_gap: int = DEFAULT_MERGE_GAP, plan_dir: str | None = None, sample_ids=None, plans=None,
                  normalize=None, read_ahead: bool | None = None, read_ahead_batches: int | None = None,
                  read_ahead_bytes: int = 1 << 30, **kwargs) -> Defined:
    """:func:`read_windows`'s operators (or its ``partitioned_source`` fallback), defined in the
    current pipeline and registered nowhere: the entry point that called it registers what it returns
    (``read_dataset``: the dataset, not its variables). Arguments as :func:`read_windows`'s."""
    from nvidia.dali import fn, types

    if device not in ("cpu", "gpu"):
        raise ValueError(f"device must be 'cpu' or 'gpu', got {device!r}")
    if not (read_ahead is None or isinstance(read_ahead, bool)):
        raise ValueError(f"read_ahead must be None (object stores), True or False, got {read_ahead!r}")
    batches = MAX_AHEAD_BATCHES if read_ahead_batches is None else read_ahead_batches
    if isinstance(batches, bool) or not isinstance(batches, int) or not 1 <= batches <= MAX_AHEAD_BATCHES:
        raise ValueError(f"read_ahead_batches must be None ({MAX_AHEAD_BATCHES}) or an int from 1 to "
                         f"{MAX_AHEAD_BATCHES}, got {read_ahead_batches!r}")
    if isinstance(read_ahead_bytes, bool) or not isinstance(read_ahead_bytes, int) or read_ahead_bytes < 0:
        raise ValueError(f"read_ahead_bytes must be an int >= 0, got {read_ahead_bytes!r}")
    norm = {}
    if normalize is not None:
        if device != "cpu":
            raise ValueError("read_windows(normalize=...) runs on the CPU operator; on the GPU use strided_slice "
                             "after the read")
        axis, mean, std = normalize
        norm = {"channel_axis": int(axis), "mean": [float(v) for v in mean], "stddev": [float(v) for v in std]}
    reader = pipeline_reader(source)  # share=: the group window of this member's batches
    if plans is None:
        try:
            plans = plan_windows(reader, merge_gap=merge_gap)
        except NotNativeError as e:
            if not fallback or normalize is not None:  # partitioned_source does not normalise
                raise
            from dali_mesh.pipeline.external import define_partitioned

            log.info("read_windows: %s; using partitioned_source", e)
            return define_partitioned(source, device, name=name, layout=layout, **kwargs)
    from dali_mesh.pipeline.plugin import load_plugin

    ops = load_plugin()
    # several outputs (a forecast's input and target) are one operator's, so that the chunks they
    # share are read and decoded once per batch
    path = (plans[0] if len(plans) == 1 else PlanSet.joined(plans)).write(plan_dir)
    # read ahead: by default when a file is an object store's (local reads are announced to the kernel)
    remote = any(f.store != "file" for p in plans for f in p.files)
    ahead = 2 if read_ahead is True else 0 if read_ahead is False else 1 if remote else 0
    if sample_ids is not None:
        ids, pads = sample_ids[:2]
        nxt = sample_ids[2] if len(sample_ids) > 2 else getattr(ids, _NEXT_IDS, None)
    elif ahead:
        ids, pads, nxt = fn.external_source(source=_SampleIds(reader, batches), num_outputs=3, batch=True,
                                            batch_info=True, dtype=[types.INT64, types.BOOL, types.INT64],
                                            ndim=[0, 0, 1], name=name)
        setattr(ids, _NEXT_IDS, nxt)  # for read_windows(sample_ids=(ids, pads)) of other sources
    else:
        ids, pads = fn.external_source(source=_SampleIds(reader, ahead=0), num_outputs=2, batch=True,
                                       batch_info=True, dtype=[types.INT64, types.BOOL], ndim=[0, 0], name=name)
        nxt = None
    inputs = (ids,) if nxt is None or ahead == 0 else (ids, nxt)
    wins = ops.read_windows(*inputs, plan_file=path, dtype=types.to_dali_type(plans[0].dtype), outputs=len(plans),
                            task_bytes=int(task_bytes), prefetch=bool(prefetch), read_ahead=ahead,
                            read_ahead_batches=batches, read_ahead_bytes=read_ahead_bytes,
                            device="mixed" if device == "gpu" else "cpu", **norm)
    wins = [wins] if len(plans) == 1 else list(wins)
    if layout is not None:
        wins = [fn.reshape(win, layout=layout) for win in wins]
    return Defined((*wins, ids, pads), (source,))
