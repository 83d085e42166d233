"""``MeshLoader``: a DALI pipeline of this rank's windows iterated as torch tensors (local, DTensor or
ShardTensor), with the watchdog, the first-batch model-input check and checkpoints. Its parts by job:
the model-input checks in :mod:`.like`, fingerprints and the checkpoint check in :mod:`.fingerprint`,
a read group's steps in :mod:`.group_steps` (over :mod:`.group_exchange`), the wrapping in :mod:`.wrap`."""
from __future__ import annotations

import logging
from typing import Any, Callable, Mapping, Sequence

import torch

from dali_mesh.partition import Layout, LayoutError
from dali_mesh.partition.placements import is_shard_tensor
from dali_mesh.pipeline.registry import sources_of
from dali_mesh.pipeline.watchdog import DEFAULT_TIMEOUT_S, Watchdog, prefetch_batches
from dali_mesh.torch.fingerprint import checkpoint_of, loader_fingerprint
from dali_mesh.torch.group_steps import GroupSteps
from dali_mesh.torch.like import check_like, check_like_layout, like_specs
from dali_mesh.torch.wrap import device_mesh_info, to_dtensor, to_shard_tensor

log = logging.getLogger(__name__)

OUTPUTS = ("local", "dtensor", "shard_tensor")


def _output_names(names, what: str) -> tuple[str, ...]:
    """``names`` (``output_map`` or ``window_outputs``) as a tuple of distinct non-empty strings."""
    if isinstance(names, (str, bytes)):
        raise TypeError(f"{what} must be a sequence of output names, got one string {names!r}: pass [{names!r}]")
    names = tuple(names)
    bad = [n for n in names if not isinstance(n, str) or not n]
    if bad:
        raise TypeError(f"{what} must hold non-empty strings, got {bad[0]!r} in {list(names)}")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"{what} names {dup} more than once: {list(names)}")
    return names


def _finished(batch: dict[str, Any], output_map: Sequence[str], drop_padded: bool) -> dict[str, Any]:
    """``batch`` with ``sample_id`` (int64) and ``is_pad`` (bool) checked and flat, padded samples
    dropped with ``drop_padded``."""
    for name, want in (("sample_id", torch.int64), ("is_pad", torch.bool)):
        value = batch.get(name)
        if value is not None and getattr(value, "dtype", want) != want:
            raise ValueError(f"output {name!r} has dtype {value.dtype}, expected {want}: output_map "
                             f"{list(output_map)} does not follow the pipeline's outputs (partitioned_source "
                             "returns window(s), sample_id, is_pad: use source.output_names)")
    for name in ("is_pad", "sample_id"):
        if name in batch:
            batch[name] = batch[name].reshape(-1)
    if drop_padded and "is_pad" in batch:
        idx = torch.nonzero(~batch["is_pad"].cpu()).reshape(-1)
        for name, value in batch.items():
            batch[name] = [value[i] for i in idx.tolist()] if isinstance(value, list) else value[idx.to(value.device)]
    return batch


class MeshLoader:
    """Iterate a DALI pipeline of this rank's windows as torch tensors.

    Args:
        pipeline: a DALI ``Pipeline``, or a callable ``make_pipeline(checkpoint=None) -> Pipeline``
            (needed for ``load_state_dict``: a restored pipeline is built from a checkpoint).
        layout: the ``Layout`` the pipeline's source reads with. With ``like`` it may be omitted: it is
            then ``Layout.from_dtensor(like)`` (no halo), and the source must read with that layout.
        like: the model's input, a DTensor or a PhysicsNeMo ShardTensor (or its spec; a dict
            ``{output name: ...}`` for several window outputs; otherwise it describes the first window
            output). Implies ``output="dtensor"`` (``"shard_tensor"`` for a ShardTensor),
            ``device_mesh=like.device_mesh`` and ``sample_shape=like.shape[1:]`` unless given (give
            ``sample_shape`` when the output has a steps axis, as a forecast's). At construction the
            layout's placements, sample shape and (ShardTensor) shard sizes are checked against it;
            on the first batch the tensor yielded must have exactly its mesh, placements, global
            shape, stride and local shape (and a ShardTensor's every rank's local shape), or
            ``LayoutError`` names both sides.
        output_map: names of the pipeline outputs, in order (default: ``window, sample_id, is_pad``);
            one name per pipeline output, checked when the pipeline is built.
        window_outputs: which outputs are windows (default: those not named ``sample_id``/``is_pad``).
        output: ``"local"`` (windows as they are, halo kept; ``loader.region`` says where they lie),
            ``"dtensor"`` (halo stripped, ``split="chunk"`` only, or explicit sizes equal to chunk's
            for the sample shape) or ``"shard_tensor"`` (PhysicsNeMo).
            Default: ``"dtensor"`` with ``like``, else ``"local"``.
        device_mesh: the torch ``DeviceMesh`` (for ``dtensor``/``shard_tensor``); it must be the
            layout's mesh (shape, names, this rank's coordinate), checked at construction.
        sample_shape: the sample (domain) shape, for the region and the global DTensor shape.
        drop_padded: drop padded samples from each batch (``output="local"`` only; batches may then
            be shorter than the batch size). By default they are kept and flagged in ``is_pad``.
        per_sample_shapes: samples differ in shape: windows come as lists of per-sample tensors
            (DALI's ``DALIRaggedIterator``); no DTensor.
        timeout: seconds one batch may take before :class:`WorkerError` is raised (default
            ``DEFAULT_TIMEOUT_S`` = 120). The first batch of an epoch may take
            ``(prefetch_queue_depth + 1) * timeout`` (DALI fills its prefetch queue before returning
            it: 3 batch times by default); building the pipeline (spawning its workers) has no
            deadline. So a healthy pipeline whose batches take ``t`` seconds needs ``timeout > t``.
            ``None`` or ``0`` turns the watchdog off. With the watchdog on, a DALI worker process that dies or is
            stopped raises ``WorkerError`` within about a second, naming its pid and the file it was
            reading; the pipeline is unusable afterwards (its workers are killed): build a new
            loader or call ``load_state_dict``.

    Every rank takes the same number of steps per epoch (the sources pad to whole batches).
    ``sample_id`` must come out as int64 and ``is_pad`` as bool (as ``partitioned_source`` makes them);
    anything else (an ``output_map`` naming them in the wrong order, say) is refused.
    """

    def __init__(
        self,
        pipeline,
        layout: Layout | None = None,
        *,
        like=None,
        output_map: Sequence[str] = ("window", "sample_id", "is_pad"),
        window_outputs: Sequence[str] | None = None,
        output: str | None = None,
        device_mesh=None,
        sample_shape: Sequence[int] | None = None,
        drop_padded: bool = False,
        per_sample_shapes: bool = False,
        timeout: float | None = DEFAULT_TIMEOUT_S,
    ) -> None:
        from dali_mesh.source import check_sample_shape  # noqa: PLC0415

        like_kind = None
        if like is not None:
            first_like = next(iter(like.values()), None) if isinstance(like, Mapping) else like
            like_kind = "shard_tensor" if is_shard_tensor(first_like) else "dtensor"
        if output is None:
            output = like_kind or "local"
        if output not in OUTPUTS:
            raise ValueError(f"unknown output {output!r}; expected one of {', '.join(OUTPUTS)}")
        self.output_map = _output_names(output_map, "output_map")
        if window_outputs is not None:
            window_outputs = _output_names(window_outputs, "window_outputs")
            unknown = [n for n in window_outputs if n not in self.output_map]
            if unknown:
                raise ValueError(f"window_outputs names {unknown} which output_map {list(self.output_map)} "
                                 "does not have")
            self.window_outputs = window_outputs
        else:
            self.window_outputs = tuple(n for n in self.output_map if n not in ("sample_id", "is_pad"))
        for special in ("sample_id", "is_pad"):
            if special in self.window_outputs:
                raise ValueError(f"window_outputs names {special!r}, which is the sample id / pad flag, not a window")

        self._like = like_specs(like, self.window_outputs) if like is not None else None
        if like is not None:
            if output != like_kind:
                what = "a ShardTensor" if like_kind == "shard_tensor" else "a DTensor"
                raise ValueError(f"like= describes {what} input: use output={like_kind!r}, not {output!r}")
            if len({v.get("kind") for v in self._like.values()}) > 1:
                raise ValueError("like= mixes DTensors and ShardTensors: the loader yields one kind")
            first = next(iter(self._like.values()))
            if device_mesh is None:
                device_mesh = first["mesh"]
            if sample_shape is None:
                sample_shape = first["shape"][1:]
            if layout is None:  # the model's split, no halo; give layout= for halos (checked against like)
                sample_ndim = len(check_sample_shape(sample_shape))
                layout = Layout.from_dtensor(like if not isinstance(like, Mapping) else next(iter(like.values())),
                                             lead_axes=len(first["shape"]) - 1 - sample_ndim)
        if not isinstance(layout, Layout):
            raise TypeError(f"layout must be a dali_mesh.Layout (or give like=), got {type(layout).__name__}")
        if sample_shape is not None:
            sample_shape = check_sample_shape(sample_shape)
        if output != "local":
            if device_mesh is None:
                raise ValueError(f"output={output!r} needs device_mesh=")
            if sample_shape is None:
                raise ValueError(f"output={output!r} needs sample_shape= (the domain shape of a sample)")
            if per_sample_shapes:
                raise ValueError(f"output={output!r} is not possible with per-sample shapes: use output='local'")
            if drop_padded:
                raise ValueError("drop_padded would make ranks' batches differ in size: use it with output='local'")
            if output == "dtensor":  # fail now, not at the first batch
                layout.placement_spec(len(sample_shape), halo_stripped=True, global_shape=sample_shape)
        if device_mesh is not None:
            device_mesh_info(device_mesh, layout)
        self.layout = layout
        self.output = output
        self.device_mesh = device_mesh
        self.sample_shape = sample_shape
        if self._like is not None:
            check_like_layout(self._like, layout, sample_shape, device_mesh)
        self.drop_padded = bool(drop_padded)
        self.per_sample_shapes = bool(per_sample_shapes)
        self.timeout = timeout
        self._factory: Callable[..., Any] | None = pipeline if callable(pipeline) and not hasattr(pipeline, "build") else None
        self._group: GroupSteps | None = None  # read once per group (a source built with share=)
        self._start(self._factory() if self._factory else pipeline)
        self.steps_taken = 0

    def _start(self, pipe) -> None:
        """Build ``pipe`` and its iterator under a fresh watchdog (the build starts the workers and the
        iterator runs the first batch), after checking ``output_map`` against the pipeline's outputs."""
        self._pipeline = pipe
        # the watchdog sees the pipeline through a box, not through self: no reference cycle, so a
        # dropped loader frees its pipeline (and DALI stops its workers) without waiting for gc
        box = [pipe]
        self._watched = box
        self._watchdog = Watchdog(lambda: box, self.timeout)
        self._first_batches, self._after_start = 3, True  # set from the pipeline once it is built
        self._stream = None
        if getattr(pipe, "device_id", None) is not None and torch.cuda.is_available():
            # the helper thread copies into torch tensors: use the caller's stream, not its own default
            self._stream = torch.cuda.current_stream(pipe.device_id)
        try:
            self._start_checked(pipe)
        except BaseException:
            self.close()  # a loader that failed to start leaves no worker processes behind
            raise

    def _start_checked(self, pipe) -> None:
        # what the pipeline object says before it is built (pipeline_def has run the graph already):
        # checked first, so that a refusal starts no worker process
        for src in sources_of(pipe):
            self._check_source(src)
        if self._like is not None:
            groups = self.layout.num_batch_groups
            for name, want in self._like.items():
                if want["shape"][0] != pipe.max_batch_size * groups:
                    raise LayoutError(
                        f"the model's input {name!r} has a global batch of {want['shape'][0]} but the loader "
                        f"yields {pipe.max_batch_size * groups} (batch_size {pipe.max_batch_size} x {groups} "
                        "sample groups)")
        # no deadline on the build: it spawns and imports the worker processes (seconds on a loaded
        # machine, unrelated to the per-batch timeout); dead workers are still reported
        self._call(pipe.build, what="the pipeline to build and start its workers", batches=None)
        num_outputs = pipe.num_outputs
        if num_outputs != len(self.output_map):
            raise ValueError(f"output_map {list(self.output_map)} names {len(self.output_map)} outputs but the pipeline "
                             f"has {num_outputs}: one name per output, in order")
        # DALI 2.4 reports no dtype for external source outputs before they run: the dtypes of
        # sample_id and is_pad are checked on every batch instead (__next__)
        for src in sources_of(pipe):  # a graph defined at build time
            self._check_source(src)
        shared = [src for src in sources_of(pipe) if getattr(src, "share_dims", ())]
        if shared and self._group is None:
            if len({tuple(src.share_dims) for src in sources_of(pipe)}) != 1:
                raise ValueError("share=: every source of the pipeline must be built with the same share")
            # the exchange cuts every output as the first source's windows are cut: sources with rows= must
            # hold the same rows (or the same table of the members' rows)
            rows = {(getattr(src, "rows", None) is not None and src.rows.digest(),
                     src.fingerprint().get("rows_table") if getattr(src, "group_rows", None) else None)
                    for src in shared}
            if len(rows) != 1:
                raise ValueError("share=: the pipeline's sources read different rows= (or tables of them): the "
                                 "group's windows are cut one way for every output; give every source the same rows")
            if self.per_sample_shapes or self.drop_padded:
                raise ValueError("share= yields whole batches of one shape: not with per_sample_shapes or drop_padded")
            from dali_mesh.torch.group_exchange import GroupExchange  # noqa: PLC0415

            self._group = GroupSteps(GroupExchange(shared[0], self.layout, self.device_mesh, self.window_outputs,
                                                   timeout=self.timeout))
        # the iterator's first batch waits for DALI's prefetch queue: prefetch_queue_depth + 1 batch times
        self._first_batches = prefetch_batches(pipe)
        if self._group is not None:
            self._group.deferred = None
        try:
            self._iterator = self._call(self._make_iterator, pipe, what="the first batch",
                                        batches=self._first_batches)
        except Exception as e:  # noqa: BLE001
            if self._group is None:
                raise
            # DALI's iterator reads the first batch here: in a read group its error is told to every
            # member at the first group step (raising here would leave the others in the exchange)
            self._iterator, self._group.deferred = None, e
        self._after_start = True
        self._checked_like = False

    def _check_source(self, src) -> None:
        """A source registered on the pipeline by ``partitioned_source`` must read with this loader's
        layout and sample shape: otherwise the windows are wrapped as parts of another tensor."""
        what = f"{type(src).__name__} over {src.files[0]!r}" if getattr(src, "files", None) else type(src).__name__
        if getattr(src, "rows", None) is not None and self.output != "local":
            # a DTensor or ShardTensor would call the rows' axis replicated (or a box shard): each rank
            # holds its own rows, in its partition's order, which neither describes
            raise LayoutError(f"the pipeline's source ({what}) reads rows= (an index-set window): its tensors are "
                              f"local, one per rank, not a {self.output}: use output='local'")
        src_layout = getattr(src, "layout", None)
        if src_layout is not None and src_layout is not self.layout and repr(src_layout) != repr(self.layout):
            raise LayoutError(f"the pipeline's source ({what}) reads with layout {src_layout!r}, the loader was given "
                              f"{self.layout!r}: pass the source's layout")
        shape = getattr(src, "sample_shape", None)
        if shape is None:
            return
        if self.sample_shape is None:
            self.sample_shape = tuple(shape)
        elif tuple(shape) != self.sample_shape:
            given = "like.shape[1:]" if self._like is not None else "sample_shape"
            raise LayoutError(f"the loader's sample shape {self.sample_shape} (from {given}) differs from the "
                              f"shape {tuple(shape)} of the samples of the pipeline's source ({what})")

    def _call(self, fn, *args, what: str = "the next batch", batches: float | None = 1):
        if self._stream is None:
            return self._watchdog.call(fn, *args, what=what, batches=batches)

        def on_stream():
            with torch.cuda.stream(self._stream):
                return fn(*args)

        return self._watchdog.call(on_stream, what=what, batches=batches)

    @property
    def timeout(self) -> float | None:
        """Seconds to wait for a batch (``None``: no watchdog); may be changed between batches."""
        return self._timeout

    @timeout.setter
    def timeout(self, value: float | None) -> None:
        Watchdog(lambda: [], value)  # checks the value
        self._timeout = value
        watchdog = getattr(self, "_watchdog", None)
        if watchdog is not None:
            watchdog.timeout = float(value) if value else None

    @property
    def region(self):
        """This rank's region of a sample (needs ``sample_shape``)."""
        if self.sample_shape is None:
            raise ValueError("the loader was built without sample_shape=")
        return self.layout.region(self.sample_shape)

    def _make_iterator(self, pipe):
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, DALIRaggedIterator  # noqa: PLC0415

        if self.per_sample_shapes:
            tags = [DALIRaggedIterator.SPARSE_LIST_TAG if n in self.window_outputs else DALIRaggedIterator.DENSE_TAG
                    for n in self.output_map]
            return DALIRaggedIterator([pipe], list(self.output_map), size=-1, output_types=tags)
        return DALIGenericIterator([pipe], list(self.output_map), size=-1)

    def __iter__(self):
        return self

    def _next_batch(self) -> dict[str, Any]:
        # the first batch of an epoch may wait for the refilled prefetch queue, later ones one batch time
        batches = self._first_batches if self._after_start else 1
        batch = self._call(next, self._iterator, batches=batches)[0]
        self._after_start = False
        return batch

    def _checkpoint(self):
        """The pipeline's checkpoint now, or ``None`` without checkpointing."""
        if not getattr(self._pipeline, "_enable_checkpointing", False):
            return None
        return self._call(self._iterator.checkpoints, what="the checkpoint")

    @property
    def _exchange(self):
        """The read group's ``GroupExchange`` (its ``stats``, ``size``), or ``None``."""
        return None if self._group is None else self._group.exchange

    def __next__(self) -> dict[str, Any]:
        if self._group is None:
            batch = self._next_batch()
        else:  # this member's read, then the status and data exchange (dali_mesh.torch.group_steps)
            batch = self._group.next(lambda: self._next_batch(), self._checkpoint,
                                     lambda: self.fingerprint(coordinate=False), self._iterator is not None)
        self.steps_taken += 1
        batch = _finished(batch, self.output_map, self.drop_padded)
        if self.output != "local":
            wrap = to_dtensor if self.output == "dtensor" else to_shard_tensor
            for name in self.window_outputs:
                batch[name] = wrap(batch[name], self.layout, self.sample_shape, self.device_mesh,
                                   lead_axes=self._lead_axes(batch[name], name))
        if self._like is not None and not self._checked_like:
            for name, want in self._like.items():
                check_like(batch[name], want, name)
            self._checked_like = True
        return batch

    def _lead_axes(self, value, name) -> int:
        """Unsplit axes between the batch and the sample: a forecast's steps axis, or none."""
        lead = value.ndim - 1 - len(self.sample_shape)
        if lead < 0:
            raise LayoutError(f"output {name!r} has {value.ndim - 1} sample dims, fewer than sample_shape "
                              f"{self.sample_shape}")
        return lead

    def reset(self) -> None:
        """Start the next epoch (after ``StopIteration``)."""
        self._call(self._iterator.reset, what="the next epoch to start", batches=self._first_batches)
        self._after_start = True
        self.steps_taken = 0
        if self._group is not None:
            self._group.reset()

    def __len__(self) -> int:
        raise TypeError("MeshLoader has no length: the source ends the epoch (size=-1)")

    def close(self) -> None:
        """Stop the pipeline's worker processes and the watchdog's helper thread; the loader is unusable
        afterwards (``load_state_dict`` starts a new pipeline)."""
        pool = getattr(self._pipeline, "_py_pool", None)
        if pool is not None and self._watchdog.broken is None:
            try:
                pool.close()  # DALI's own finalizer does the same when the pipeline is collected
            except Exception as e:  # noqa: BLE001 - closing is best effort
                log.debug("closing the DALI worker pool: %s", e)
        self._watchdog.close()
        self._watched.clear()

    # ---- checkpoints --------------------------------------------------------------------------------
    def fingerprint(self, *, coordinate: bool = True) -> dict[str, Any]:
        """What a checkpoint of this loader is only valid for: the layout, the batch size, the output
        names and the sources registered on the pipeline by ``partitioned_source`` (class, files,
        dataset, sample count and shape, seed, shuffle, drop_last, ...). ``coordinate=False``: the
        layouts by their rules, without this rank's coordinate, as every member of a read group must
        have them (members differ along the shared dims)."""
        return loader_fingerprint(self.layout, self._pipeline.max_batch_size, self.output_map,
                                  sources_of(self._pipeline), coordinate=coordinate)

    def state_dict(self) -> dict[str, Any]:
        """DALI's checkpoint of the pipeline (build it with ``enable_checkpointing=True``), the steps
        taken this epoch and the loader's :meth:`fingerprint`."""
        if self._group is not None:
            # a read group resumes at the start of a group step (every member the same step), then
            # drops the batches of it already taken
            ckpt, step, skip = self._group.state(self._checkpoint)
            if ckpt is None:
                raise ValueError("Cannot access checkpoints with checkpointing disabled")
            return {"dali_checkpoints": ckpt, "steps_taken": self.steps_taken, "fingerprint": self.fingerprint(),
                    "group_step": step, "group_skip": skip}
        return {"dali_checkpoints": self._call(self._iterator.checkpoints, what="the checkpoint"),
                "steps_taken": self.steps_taken, "fingerprint": self.fingerprint()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Rebuild the pipeline from a checkpoint: the next batch is the one after the checkpoint.

        Refused (``ValueError`` naming what differs) when the checkpoint was taken by a loader with
        another source, layout, batch size or output names: it would resume at another position.
        Also the way back after a :class:`WorkerError`, from a state saved before it.
        """
        if self._factory is None:
            raise ValueError("load_state_dict needs the loader to be built from make_pipeline(checkpoint=None), "
                             "not from a built pipeline")
        checkpoint = checkpoint_of(state, self.fingerprint)
        self.close()
        self._iterator = self._pipeline = None  # let the old pipeline and its workers go first
        self._start(self._factory(checkpoint=checkpoint))
        self.steps_taken = int(state.get("steps_taken", 0))
        if self._group is not None:
            if "group_step" not in state:
                raise ValueError("load_state_dict(state): the loader reads with share= but the checkpoint was "
                                 "taken without it")
            self._group.resume(state["group_step"], state["group_skip"])
