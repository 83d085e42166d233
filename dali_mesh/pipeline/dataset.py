"""``read_dataset``: the channels of a :class:`~dali_mesh.dataset.ZarrDatasetSource` in a DALI pipeline,
each variable read by its own native reader (``read_windows``: chunks decoded on DALI's threads), cast
to the output dtype, stacked on the channel axis and normalised on DALI's threads (or the GPU)."""
from __future__ import annotations

import logging

from dali_mesh.io.read_plan import NotNativeError
from dali_mesh.pipeline.external import current_pipeline_for, partitioned_source
from dali_mesh.pipeline.native import plan_windows, read_windows
from dali_mesh.pipeline.registry import info_of

log = logging.getLogger(__name__)


def _plans_or_reason(source) -> list:
    """Per part of ``source``: its native plans, or the reason (a string) it falls back."""
    out = []
    for sub, _ in source.parts:
        try:
            out.append(plan_windows(sub))
        except NotNativeError as e:
            out.append(f"partitioned_source ({e})")
    return out


def dataset_readers(source) -> list[str]:
    """Per part of ``source`` (a run of channels of one variable): ``"native"`` or the reason it falls
    back to ``partitioned_source``, as ``read_dataset`` would read it (no data read)."""
    return [p if isinstance(p, str) else "native" for p in _plans_or_reason(source)]


def read_dataset(source, device: str = "cpu", *, fallback: bool = True, **kwargs):
    """This rank's windows of ``source`` (a ``ZarrDatasetSource``): ``(window, sample_id, is_pad)`` or,
    with a forecast, ``(input, target, sample_id, is_pad)``, as ``read_windows`` gives them.

    Each variable (each run of channels of one variable) is planned once and read natively over its
    own ``ZarrSource`` / ``HDF5Source``; one that cannot be read natively falls back to
    ``partitioned_source`` with a one-line log naming the variable (``fallback=False``:
    :class:`NotNativeError`). The parts share the sample order (the same ids, pads and padding), are
    cast to ``source.dtype``, concatenated on the channel axis and normalised with ``fn.normalize``
    when the source has ``mean``/``std``. ``kwargs`` (``task_bytes``, ``prefetch``, ``plan_dir``) go to
    the native reads.
    """
    from nvidia.dali import fn, types

    if device not in ("cpu", "gpu"):
        raise ValueError(f"device must be 'cpu' or 'gpu', got {device!r}")
    pipe = current_pipeline_for(source)
    info = info_of(pipe) if pipe is not None else None
    known = len(info.sources) if info is not None else 0
    axis = 0 if source.forecast is None else 1
    nwin = len(source.window_names)
    blocks = [[] for _ in range(nwin)]
    ids = pads = fallback_ids = None
    for (sub, has_level), plans in zip(source.parts, _plans_or_reason(source)):
        if isinstance(plans, str):  # planned once: the reason it falls back
            if not fallback:
                raise NotNativeError(f"variable {sub.name!r}: {plans}")
            log.info("read_dataset: variable %r of %s: %s", sub.name, source.store, plans)
            outs = partitioned_source(sub, device)
            if fallback_ids is None:
                fallback_ids = outs[-2:]
        else:
            # the parts share one sample order: the first native part's ids feed the other native parts
            outs = read_windows(sub, device, plans=plans, sample_ids=None if ids is None else (ids, pads), **kwargs)
            if ids is None:
                ids, pads = outs[-2], outs[-1]
        for w in range(nwin):
            win = outs[w]
            if not has_level:
                win = fn.expand_dims(win, axes=[axis])
            if sub.dtype != source.dtype:
                win = fn.cast(win, dtype=types.to_dali_type(source.dtype))
            blocks[w].append(win)
    if ids is None:  # no part is native: the first fallback's ids
        ids, pads = fallback_ids
    if info is not None:  # the loader checks and fingerprints the dataset, not its parts
        del info.sources[known:]
        info.sources.append(source)
    wins = []
    for w in range(nwin):
        win = blocks[w][0] if len(blocks[w]) == 1 else fn.cat(*blocks[w], axis=axis)
        if source.mean is not None:
            shape = [1] * (source.sample_ndim + (axis > 0))
            shape[axis] = len(source.channels)
            win = fn.normalize(win, mean=source.mean.reshape(shape).astype("float32"),
                               stddev=source.std.reshape(shape).astype("float32"), dtype=types.to_dali_type(source.dtype))
        wins.append(win)
    return (*wins, ids, pads)
