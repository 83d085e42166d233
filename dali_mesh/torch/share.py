"""Read once per group, the exchange: ``MeshLoader`` over a source built with ``share=``.

Each member of a read group (:mod:`dali_mesh.partition.share`) runs a pipeline over its own batches
(``b = index, index + G, ...``: the group reader) whose windows are group windows. One *group step*
covers the loader batches ``i G .. i G + G - 1``: member ``s`` holds batch ``i G + s``. Per step:

1. a status exchange (``all_gather_object`` on the group's process group): every member says whether
   its read succeeded (else its error, naming the file) and which sample ids and pad flags it read.
   A failure anywhere raises :class:`GroupReadError` on every member, naming the rank, before any
   data moves: no member is left waiting in a collective that another one never joins;
2. the data exchange, one ``all_to_all_single`` per window output: member ``s`` sends member ``t``
   member ``t``'s window cut from each of its group windows (halo and boundary cells included: the
   cut is exact); NCCL for CUDA tensors, gloo for CPU tensors, on the process group of the group's
   ranks (``torch.distributed.new_group``, made once per group on every rank).

The loader then yields the step's batches one by one. A member that dies leaves the others in a
collective until the process group's timeout (``init_process_group(timeout=...)``; torch's default
is 30 minutes for gloo and 10 for NCCL): they then raise the backend's error.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from dali_mesh.partition.share import group_coordinates, group_cut, group_region

__all__ = ["GroupReadError", "GroupExchange"]

_GROUPS: dict[tuple, Any] = {}  # (global ranks of every group, in order) -> this rank's process group


class GroupReadError(RuntimeError):
    """A member of a read group failed to read its batch: raised on every member of the group."""


def _process_group(device_mesh, layout, dims):
    """This rank's group's process group: ``new_group`` for every group of the mesh, in one order on
    every rank (``new_group`` is collective over the world), made once per set of groups."""
    import torch.distributed as dist  # noqa: PLC0415

    ranks = device_mesh.mesh
    idx = [layout.mesh.names.index(d) for d in dims]
    rest = [d for d in range(ranks.ndim) if d not in idx]
    # every group: the ranks along the share dims for one coordinate of the others
    perm = ranks.permute(*(rest + idx)).reshape(-1, math.prod(ranks.shape[d] for d in idx))
    groups = tuple(tuple(int(r) for r in row) for row in perm.tolist())
    key = groups
    if key not in _GROUPS:
        mine = None
        me = dist.get_rank()
        for g in groups:
            pg = dist.new_group(list(g))
            if me in g:
                mine = pg
        _GROUPS[key] = mine
    me = dist.get_rank()
    members = next(g for g in groups if me in g)
    return _GROUPS[key], members


class GroupExchange:
    """The group steps of one loader (see the module's docstring)."""

    def __init__(self, source, layout, device_mesh, window_outputs) -> None:
        import torch.distributed as dist  # noqa: PLC0415

        if device_mesh is None:
            raise ValueError("a source with share= needs MeshLoader(device_mesh=...): the group's windows are "
                             "exchanged over torch.distributed")
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("a source with share= needs torch.distributed initialised (init_process_group)")
        self.source = source
        self.dims = source.share_dims
        self.size, self.index = source.group
        self.pg, self.ranks = _process_group(device_mesh, layout, self.dims)
        shape = source.sample_shape
        self.group_region = group_region(layout, shape, self.dims)
        self.cuts = [group_cut(self.group_region, layout.region(shape, c))
                     for c in group_coordinates(layout, self.dims)]
        self.window_shape = layout.region(shape).window_shape
        self.window_outputs = tuple(window_outputs)
        fc = getattr(source, "forecast", None)
        lead = {"window": (), "input": () if fc is None else (fc.history + 1,),
                "target": () if fc is None else (fc.lead,)}
        self.lead = {n: lead.get(n, ()) for n in self.window_outputs}
        self.dtype = _torch_dtype(source.dtype)
        self.batch_size = source.batch_size
        self.num_batches = len(source) // source.batch_size
        if self.num_batches < self.size:
            raise ValueError(f"share: an epoch of {self.num_batches} batches for a read group of {self.size} ranks "
                             "leaves members without a batch to read: lower batch_size, or share fewer dims")
        self.step = 0  # the next group step
        self.device = None  # the windows' device, from the first batch read here

    def mine(self, step: int) -> bool:
        """Whether this member reads a batch at group step ``step``."""
        return step * self.size + self.index < self.num_batches

    def batches_of(self, step: int) -> int:
        return min(self.size, self.num_batches - step * self.size)

    def exchange(self, batch: dict | None, error: BaseException | None) -> list[dict]:
        """One group step: this member's batch (its group windows, ``None`` when it has none this
        step) or its read error; returns the step's batches (this rank's windows), in loader order."""
        import torch.distributed as dist  # noqa: PLC0415

        step = self.step
        status = None
        if error is not None:
            status = ("error", f"{type(error).__name__}: {error}")
        elif batch is not None:
            status = ("ok", batch["sample_id"].reshape(-1).tolist(), batch["is_pad"].reshape(-1).tolist())
        gathered: list = [None] * self.size
        dist.all_gather_object(gathered, status, group=self.pg)
        failed = [(s, g[1]) for s, g in enumerate(gathered) if g is not None and g[0] == "error"]
        if failed:
            s, message = failed[0]
            raise GroupReadError(f"rank {self.ranks[s]} of the read group {list(self.ranks)} failed to read batch "
                                 f"{step * self.size + s} of the epoch: {message}") from error
        n = self.batches_of(step)
        missing = [s for s in range(n) if gathered[s] is None]
        if missing:
            raise GroupReadError(f"ranks {[self.ranks[s] for s in missing]} of the read group had no batch at group "
                                 f"step {step}: the members' epochs disagree (sources built alike on every rank?)")
        if batch is not None and self.device is None:
            self.device = batch[self.window_outputs[0]].device
        device = self.device if self.device is not None else torch.device("cpu")
        bs = self.batch_size
        outs: list[dict] = [{} for _ in range(n)]
        for name in self.window_outputs:
            lead = self.lead[name]
            mine_shape = lead + tuple(self.window_shape)
            mine_vol = math.prod(mine_shape)
            send_splits, pieces = [], []
            if batch is not None:
                want = (bs,) + lead + tuple(self.group_region.window_shape)
                got = batch[name]
                if tuple(got.shape) != want or got.dtype != self.dtype:
                    raise GroupReadError(f"share: output {name!r} is {tuple(got.shape)} {got.dtype}, the group window "
                                         f"batch is {want} {self.dtype}: read the source with read_windows / "
                                         "partitioned_source / read_dataset as given to the loader")
            for t, cut in enumerate(self.cuts):
                if batch is None or cut is None:
                    send_splits.append(0)
                    continue
                win = batch[name]
                piece = win[(slice(None),) * (1 + len(lead)) + cut].reshape(-1)
                pieces.append(piece)
                send_splits.append(piece.numel())
            send = torch.cat(pieces) if pieces else torch.empty(0, dtype=self.dtype, device=device)
            recv_splits = [bs * mine_vol] * n + [0] * (self.size - n)
            recv = torch.empty(sum(recv_splits), dtype=send.dtype if pieces else self.dtype, device=device)
            dist.all_to_all_single(recv, send, recv_splits, send_splits, group=self.pg)
            for s in range(n):
                outs[s][name] = recv[s * bs * mine_vol:(s + 1) * bs * mine_vol].reshape((bs,) + mine_shape)
        for s in range(n):
            _, ids, pads = gathered[s]
            outs[s]["sample_id"] = torch.tensor(ids, dtype=torch.int64)
            outs[s]["is_pad"] = torch.tensor(pads, dtype=torch.bool)
        self.step += 1
        return outs


def _torch_dtype(dtype) -> torch.dtype:
    return torch.from_numpy(np.zeros(0, np.dtype(dtype).newbyteorder("="))).dtype
