"""``read_dataset``: the channels of a :class:`~dali_mesh.ZarrDatasetSource` in a DALI pipeline:
every variable's chunks decoded on DALI's threads by one native reader into their place in the
stacked window and normalised as it is finished (or, for variables of other dtypes or one that is
not native, one reader per variable, cast, concatenated and normalised by ``strided_slice`` on
DALI's threads or the GPU)."""
from __future__ import annotations

import logging

import numpy as np

from dali_mesh.plan import NotNativeError, stack_channels
from dali_mesh.pipeline.external import current_pipeline_for, define_partitioned
from dali_mesh.pipeline.native import define_native, plan_windows
from dali_mesh.pipeline.ops import strided_slice
from dali_mesh.pipeline.registry import Defined, register
from dali_mesh.source import pipeline_reader

log = logging.getLogger(__name__)


def _plans_or_reason(source) -> list:
    """Per part of ``source``: its native plans, or the reason (a string) it falls back."""
    _warm(source)
    out = []
    for sub, _ in source.parts:
        try:
            out.append(plan_windows(sub))
        except NotNativeError as e:
            out.append(f"partitioned_source ({e})")
    return out


def _warm(source) -> None:
    """Tells each store the arrays of ``source``'s parts before they are planned one after another
    (``ByteStore.warm``: an Icechunk repository then loads their manifests together)."""
    from dali_mesh.storage import store_of  # noqa: PLC0415

    arrays: dict[int, tuple] = {}
    for sub, _ in source.parts:
        name = getattr(sub, "name", None)
        if not isinstance(name, str):
            continue
        for location in getattr(sub, "files", ()):
            # the array's key in its store: below the location's own key (icechunk://repo@SNAP/g: "g/t2m")
            store, key = store_of(location)
            path = f"{key.strip('/')}/{name}" if key.strip("/") else name
            arrays.setdefault(id(store), (store, []))[1].append(path)
    for store, paths in arrays.values():
        store.warm(list(dict.fromkeys(paths)))


def _stacked_or_reason(source, plans) -> tuple | str:
    """Per window output of ``source``: one plan set stacking every variable's windows on the channel
    axis (``stack_channels``), or the reason the variables are read by one reader each."""
    if any(isinstance(p, str) for p in plans):
        return "a variable is not read natively"
    axis = 0 if source.forecast is None else 1
    try:
        return tuple(stack_channels([p[w] for p in plans], axis, [has for _, has in source.parts])
                     for w in range(len(source.window_names)))
    except NotNativeError as e:
        return str(e)


def plan_dataset(source, stack: bool = True) -> tuple[list, tuple | str]:
    """``source``'s native plans, as ``read_dataset`` makes them (no data read): per part (a run of
    channels of one variable) its plans or the reason (a string) it falls back; and the stacked plans
    of one operator for all parts, or the reason each part has its own reader (``stack=False``: not
    stacked, ``"stack=False"``)."""
    plans = _plans_or_reason(source)
    return plans, _stacked_or_reason(source, plans) if stack else "stack=False"


def dataset_readers(source) -> list[str]:
    """Per part of ``source`` (a run of channels of one variable): ``"native"`` or the reason it falls
    back to ``partitioned_source``, as ``read_dataset`` would read it (no data read)."""
    return [p if isinstance(p, str) else "native" for p in _plans_or_reason(source)]


def reader_of(stacked) -> str:
    """``"one native reader"`` for stacked plans (:func:`plan_dataset`), else ``"one reader per variable (why)"``."""
    return f"one reader per variable ({stacked})" if isinstance(stacked, str) else "one native reader"


def dataset_reader(source) -> str:
    """How ``read_dataset`` reads ``source``: ``"one native reader"`` (every variable's parts in one
    operator, stacked in place) or ``"one reader per variable (why)"`` (no data read)."""
    return reader_of(plan_dataset(source)[1])


def read_dataset(source, device: str = "cpu", *, fallback: bool = True, stack: bool = True, **kwargs):
    """This rank's windows of ``source`` (a ``ZarrDatasetSource`` / ``NetCDFDatasetSource``):
    ``(window, sample_id, is_pad)`` or, with a forecast, ``(input, target, sample_id, is_pad)``, as
    ``read_windows`` gives them.

    Each variable (each run of channels of one variable) is planned once. When every variable is read
    natively with one dtype (as WeatherBench2 and ARCO-ERA5 store them), one operator reads them all:
    each variable's chunks land in their place in the stacked window, which is finished (halo cells)
    once and, with ``mean``/``std`` on the CPU, normalised in place as it is finished (float32; on the
    GPU, or for other dtypes, one pass of ``strided_slice`` on the device or DALI's threads; a float64
    output is normalised in float64, by DALI's arithmetic). Otherwise each variable has its own reader: one
    that cannot be read natively falls back to ``partitioned_source`` with a one-line log naming the
    variable (``fallback=False``: :class:`NotNativeError`); the parts share the sample order (the same
    ids, pads and padding), are cast to ``source.dtype``, concatenated on the channel axis and
    normalised by ``strided_slice`` (``stack=False``: so in any case). ``kwargs`` (``task_bytes``,
    ``prefetch``, ``plan_dir``) go to the native reads.

    The dataset itself is registered on the pipeline, once (the loader checks and fingerprints the
    dataset, not its variables' readers).
    """
    if device not in ("cpu", "gpu"):
        raise ValueError(f"device must be 'cpu' or 'gpu', got {device!r}")
    pipe = current_pipeline_for(source)
    return register(pipe, define_dataset(source, device, fallback=fallback, stack=stack, **kwargs))


def define_dataset(source, device: str, *, fallback: bool = True, stack: bool = True, **kwargs) -> Defined:
    """:func:`read_dataset`'s readers, defined in the current pipeline: its outputs, the dataset as
    the one source to register, and the prefetch depth of any variable read by ``partitioned_source``
    (its variables' readers are not registered: the entry point registers the dataset)."""
    from nvidia.dali import fn, types

    axis = 0 if source.forecast is None else 1
    nwin = len(source.window_names)
    registered, source = source, pipeline_reader(source)  # share=: the group window of this member's batches
    plans, stacked = plan_dataset(source, stack)
    out_type = types.to_dali_type(source.dtype)
    fused = False
    depth = 0  # the deepest prefetch queue of a variable read by partitioned_source
    if not isinstance(stacked, str):
        fused = (device == "cpu" and source.mean is not None and source.dtype == np.float32
                 and stacked[0].dtype == np.float32)
        outs = define_native(source, device, plans=stacked,
                             normalize=(axis, source.mean, source.std) if fused else None, **kwargs).outputs
        wins, (ids, pads) = list(outs[:nwin]), outs[-2:]
        if stacked[0].dtype != source.dtype:
            wins = [fn.cast(w, dtype=out_type) for w in wins]
    else:
        log.info("read_dataset: %s: one reader per variable: %s", source.store, stacked)
        blocks = [[] for _ in range(nwin)]
        ids = pads = fallback_ids = None
        for (sub, has_level), part_plans in zip(source.parts, plans):
            if isinstance(part_plans, str):  # planned once: the reason it falls back
                if not fallback:
                    raise NotNativeError(f"variable {sub.name!r}: {part_plans}")
                log.info("read_dataset: variable %r of %s: %s", sub.name, source.store, part_plans)
                parallel = define_partitioned(sub, device)
                outs, depth = parallel.outputs, max(depth, parallel.prefetch)
                if fallback_ids is None:
                    fallback_ids = outs[-2:]
            else:
                # the parts share one sample order: the first native part's ids feed the other native parts
                outs = define_native(sub, device, plans=part_plans, sample_ids=None if ids is None else (ids, pads),
                                     **kwargs).outputs
                if ids is None:
                    ids, pads = outs[-2], outs[-1]
            for w in range(nwin):
                win = outs[w]
                if not has_level:
                    win = fn.expand_dims(win, axes=[axis])
                if sub.dtype != source.dtype:
                    win = fn.cast(win, dtype=out_type)
                blocks[w].append(win)
        if ids is None:  # no part is native: the first fallback's ids
            ids, pads = fallback_ids
        wins = [b[0] if len(b) == 1 else fn.cat(*b, axis=axis) for b in blocks]
        window = tuple(source.region.window_shape)
        if 0 in window:  # fn.cat of empty windows keeps the first one's shape: an empty slice of the stacked one
            fc = source.forecast
            steps = [None] if fc is None else [fc.history + 1] + ([fc.lead] if fc.lead else [])
            shapes = [list(window if n is None else (n,) + window) for n in steps]
            wins = [strided_slice(w, [0] * len(sh), sh, device=device) for w, sh in zip(wins, shapes)]
    if source.mean is not None and not fused and source.dtype == np.float64:
        wins = [_normalized_f64(w, source, axis, device) for w in wins]
    elif source.mean is not None and not fused:  # one pass of the strided slice (empty windows too)
        nc = len(source.channels)
        wins = [strided_slice(w, [0], [nc], axes=[axis], channel_axis=axis, mean=source.mean, std=source.std,
                              dtype=out_type, device=device) for w in wins]
    return Defined((*wins, ids, pads), (registered,), depth)


class _Constant:
    """A batch of one float64 array, for ``fn.external_source(batch_info=True)``: stateless, so a
    checkpointed pipeline restores it as it is."""

    def __init__(self, value: np.ndarray, batch_size: int) -> None:
        self.value, self.batch_size = value, batch_size

    def __call__(self, info) -> list:
        return [self.value] * self.batch_size


def _normalized_f64(win, source, axis: int, device: str):
    """``(x - mean) / std`` in float64 (strided_slice normalises in float32, which would round a
    float64 output's statistics: -56.6 is not a float32): DALI's arithmetic on float64 constants,
    given per batch by external sources (DALI's constants take no float64 arrays)."""
    from nvidia.dali import fn
    from nvidia.dali.pipeline import Pipeline

    ndim = source.sample_ndim + (source.forecast is not None)
    shape = [1] * ndim
    shape[axis] = len(source.channels)
    batch = Pipeline.current().max_batch_size
    mean, std = (fn.external_source(source=_Constant(np.ascontiguousarray(v.reshape(shape), np.float64), batch),
                                    batch=True, batch_info=True, device=device) for v in (source.mean, source.std))
    return (win - mean) / std
