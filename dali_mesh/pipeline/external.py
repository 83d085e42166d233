"""``partitioned_source``: a dali_mesh source as a DALI parallel external source (Python readers in
DALI's worker processes), re-exported as ``dali_mesh.fn.partitioned_source``.

Needs DALI (imported when called), not the compiled plugin.
"""
from __future__ import annotations

from dali_mesh.pipeline.registry import Defined, register
from dali_mesh.pipeline.watchdog import status_dir
from dali_mesh.source import pipeline_reader
from dali_mesh.source.status import StatusReader

__all__ = ["current_pipeline_for", "define_partitioned", "partitioned_source", "refuse_forked_workers"]


def current_pipeline_for(source):
    """The pipeline being defined (or None); its batch size must be the source's, whose sample
    order pads each rank's share to whole batches of that size."""
    from nvidia.dali.pipeline import Pipeline

    pipe = Pipeline.current()
    if pipe is not None and pipe.max_batch_size != source.batch_size:
        raise ValueError(
            f"the pipeline's batch_size is {pipe.max_batch_size} but the source was built with "
            f"batch_size={source.batch_size}: pass the same value to both (the sample order pads "
            "each rank's share to whole batches)")
    return pipe


def partitioned_source(source, device: str = "cpu", *, name: str | None = None,
                       layout: str | None = None, prefetch_queue_depth: int = 2, **kwargs):
    """Feed ``source`` (a :class:`dali_mesh.source.WindowSource`) into the current pipeline.

    Wraps ``fn.external_source(source, batch=False, parallel=True, num_outputs=...)`` with each
    output's dtype and ndim declared. The pipeline needs ``py_num_workers >= 1`` (use
    ``py_start_method="spawn"`` when CUDA is initialised, and for a source over an Icechunk repository: with
    ``"fork"`` such a pipeline is refused here) and ``batch_size == source.batch_size``.

    The source is registered on the pipeline (``MeshLoader`` reads it for its checkpoint fingerprint)
    and writes a per-worker status (``reading <file>``) that the watchdog of ``MeshLoader`` and
    :func:`watched_run` name when a worker dies or hangs.

    Args:
        device: ``"cpu"``, or ``"gpu"``: workers still return CPU arrays (parallel external sources
            run on the CPU) and only the windows are copied to the GPU; the sample id and pad flag
            stay on the CPU.
        name: the external source's name (DALI's ``name``).
        layout: DALI layout string of the window(s), e.g. ``"CHW"`` (with a forecast, the leading
            step axis counts too, e.g. ``"FCHW"``).
        prefetch_queue_depth: batches each worker prepares ahead.
        kwargs: passed to ``fn.external_source``.

    Returns:
        ``(window, sample_id, is_pad)`` or, with a forecast, ``(input, target, sample_id, is_pad)``
        (see ``source.output_names``).
    """
    if device not in ("cpu", "gpu"):
        raise ValueError(f"device must be 'cpu' or 'gpu', got {device!r}")
    for attr in ("num_outputs", "output_dtypes", "output_ndims", "batch_size"):
        if not hasattr(source, attr):
            raise TypeError(f"partitioned_source needs a dali_mesh source (NumpySource, HDF5Source, "
                            f"ZarrSource); {type(source).__name__} has no {attr!r}")
    pipe = current_pipeline_for(source)
    # the source itself is registered (MeshLoader exchanges a group's windows), once, here
    return register(pipe, define_partitioned(source, device, name=name, layout=layout,
                                             prefetch_queue_depth=prefetch_queue_depth, **kwargs))


def refuse_forked_workers(pipe, source) -> None:
    """A ValueError when ``pipe`` (the pipeline being defined, or None) forks its Python workers
    (``py_start_method="fork"``, DALI's default) and ``source`` reads a store that a forked process cannot
    read (``fork_safe`` False: an Icechunk repository, whose library waits for ever in a process forked
    after it ran). Said here, when the pipeline is defined, instead of by each worker at its first read."""
    if pipe is None or pipe.py_start_method != "fork" or not pipe.py_num_workers:
        return
    unsafe = [store for store in source.stores() if not getattr(store, "fork_safe", True)]
    if unsafe:
        raise ValueError(
            f"{unsafe[0].name_of('')} ({type(unsafe[0]).__name__}) cannot be read by forked workers (the pipeline's "
            f"py_start_method is 'fork', DALI's default): the library that reads it waits for ever in a process "
            f"forked after it ran. Build the pipeline with py_start_method=\"spawn\" (pipeline_def or Pipeline; "
            f"the source is picklable)")


def define_partitioned(source, device: str, *, name: str | None = None, layout: str | None = None,
                       prefetch_queue_depth: int = 2, **kwargs) -> Defined:
    """:func:`partitioned_source`'s external source, defined in the current pipeline and registered
    nowhere: the entry point that called it registers what it returns (``read_windows`` falling
    back, ``read_dataset`` for a variable it cannot read natively: the dataset, not the variable)."""
    from nvidia.dali import fn, types
    from nvidia.dali.pipeline import Pipeline

    refuse_forked_workers(Pipeline.current(), source)
    # share=: the group window of this member's batches; the workers say what they read in the
    # pipeline's status folder
    reader = StatusReader(pipeline_reader(source), status_dir=status_dir())
    nwin = source.num_outputs - 2
    layouts = [layout] * nwin + [None, None] if layout is not None else None
    outs = fn.external_source(
        source=reader,
        num_outputs=source.num_outputs,
        batch=False,
        parallel=True,
        prefetch_queue_depth=prefetch_queue_depth,
        dtype=[types.to_dali_type(dt) for dt in source.output_dtypes],
        ndim=list(source.output_ndims),
        layout=layouts,
        name=name,
        **kwargs,
    )
    outs = list(outs)
    if device == "gpu":
        outs[:nwin] = [o.gpu() for o in outs[:nwin]]
    return Defined(tuple(outs), (source,), int(prefetch_queue_depth))
