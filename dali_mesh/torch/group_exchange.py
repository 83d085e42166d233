"""Read once per group, the exchange: ``MeshLoader`` over a source built with ``share=``.

Each member of a read group (:mod:`dali_mesh.partition.read_groups`) runs a pipeline over its own batches
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

Before the first step (and the first after a resume) the members exchange what they will read
(:meth:`GroupExchange.agree`: the loader's fingerprint with the layout's rules but not the rank's
coordinate, and the group step): any difference raises on every member, naming the rank and the
field, before any data moves.

The loader then yields the step's batches one by one. A member that dies or stops leaves the
others in a collective until the process group's timeout: each group's process group gets the
default group's (``init_process_group(timeout=...)``; else ``MeshLoader(timeout=)``; torch's default
is 30 minutes for gloo and 10 for NCCL); they then raise the backend's error.
"""
from __future__ import annotations

import logging
import math
import mmap
import os
import time
from typing import Any

import numpy as np
import torch

from dali_mesh.partition.read_groups import group_coordinates, group_cut, group_region
from dali_mesh.torch.fingerprint import diff_fields

log = logging.getLogger(__name__)

__all__ = ["GroupReadError", "GroupExchange"]

_GROUPS: dict[tuple, Any] = {}  # (global ranks of every group, in order) -> this rank's process group


class GroupReadError(RuntimeError):
    """A member of a read group failed to read its batch: raised on every member of the group."""


def default_timeout(fallback: float | None = None):
    """The default process group's timeout (a ``timedelta``, as ``init_process_group(timeout=)`` set
    it), else ``fallback`` seconds, else ``None`` (torch's default). ``new_group`` does not inherit
    it: a group made without it waits torch's 30 minutes for a stopped peer."""
    import datetime

    import torch.distributed as dist  # noqa: PLC0415

    try:
        pg = dist.distributed_c10d._get_default_group()
        for device in (torch.device("cpu"), torch.device("cuda")):
            try:
                backend = pg._get_backend(device)
            except (RuntimeError, ValueError):
                continue
            timeout = getattr(getattr(backend, "options", None), "_timeout", None)
            if timeout is not None:
                return timeout
    except (AttributeError, RuntimeError, ValueError):  # another torch: its private names differ
        pass
    return None if fallback is None else datetime.timedelta(seconds=float(fallback))


def _process_group(device_mesh, layout, dims, timeout=None):
    """This rank's group's process group: ``new_group`` for every group of the mesh, in one order on
    every rank (``new_group`` is collective over the world), made once per set of groups, with
    ``timeout`` (:func:`default_timeout`)."""
    import torch.distributed as dist  # noqa: PLC0415

    ranks = device_mesh.mesh
    idx = [layout.mesh.names.index(d) for d in dims]
    rest = [d for d in range(ranks.ndim) if d not in idx]
    # every group: the ranks along the share dims for one coordinate of the others
    perm = ranks.permute(*(rest + idx)).reshape(-1, math.prod(ranks.shape[d] for d in idx))
    groups = tuple(tuple(int(r) for r in row) for row in perm.tolist())
    me = dist.get_rank()
    members = next(g for g in groups if me in g)
    if groups not in _GROUPS:
        kw = {} if timeout is None else {"timeout": timeout}
        made = [dist.new_group(list(g), **kw) for g in groups]  # every rank makes every group, in one order
        _GROUPS[groups] = made[groups.index(members)]
    return _GROUPS[groups], members


class GroupExchange:
    """The group steps of one loader (see the module's docstring)."""

    def __init__(self, source, layout, device_mesh, window_outputs, timeout: float | None = None) -> None:
        import torch.distributed as dist  # noqa: PLC0415

        if device_mesh is None:
            raise ValueError("a source with share= needs MeshLoader(device_mesh=...): the group's windows are "
                             "exchanged over torch.distributed")
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("a source with share= needs torch.distributed initialised (init_process_group)")
        self.dims = source.share_dims
        self.size, self.index = source.group
        self.pg, self.ranks = _process_group(device_mesh, layout, self.dims, default_timeout(timeout))
        shape = source.sample_shape
        group_shape, axis, positions = shape, None, None
        if getattr(source, "group_rows", None) is not None:
            # rows= with every member's rows: the group window holds their union (the group reader's rows,
            # in id order), and a member's cut takes its rows by position, in its own order
            reader = source.group_reader()
            axis, union, group_shape = reader.rows.axis, reader.rows.ids, reader.sample_shape
            positions = {c: torch.from_numpy(np.searchsorted(union, r.ids)) for c, r in source.group_rows.items()}
        self.group_region = group_region(layout, group_shape, self.dims)
        self.cuts = []
        for c in group_coordinates(layout, self.dims):
            cut = group_cut(self.group_region, layout.region(group_shape, c))
            if positions is not None and cut is not None:
                cut = cut[:axis] + (positions[c],) + cut[axis + 1:]
            self.cuts.append(cut)
        self.window_shape = layout.region(shape).window_shape
        self.window_outputs = tuple(window_outputs)
        fc = getattr(source, "forecast", None)
        lead = {"window": (), "input": () if fc is None else (fc.history + 1,),
                "target": () if fc is None else (fc.lead,)}
        self.lead = {n: lead.get(n, ()) for n in self.window_outputs}
        self.dtype = _torch_dtype(source.dtype)
        self.batch_size = source.batch_size
        # a member's batch of group windows in its shared-memory slot: per output (offset, shape), in elements
        self.slot_layout, at = {}, 0
        for n in self.window_outputs:
            shape = (self.batch_size,) + self.lead[n] + tuple(self.group_region.window_shape)
            self.slot_layout[n] = (at, shape)
            at += math.prod(shape)
        self.slot_elems = at
        self.num_batches = len(source) // source.batch_size
        if self.num_batches < self.size:
            raise ValueError(f"share: an epoch of {self.num_batches} batches for a read group of {self.size} ranks "
                             "leaves members without a batch to read: lower batch_size, or share fewer dims")
        self.step = 0  # the next group step
        self.agreed = False  # the members' fingerprints compared (agree), once per start or resume
        self.device = None  # the windows' device, from the first batch read here
        self.transport = None  # "shm" or "collective", chosen together at the first exchange
        self._shm = None
        # this member's writes into its shared-memory slots, which take turns: a slot is written again
        # only two writes later, after an exchange's status collective that every member enters once it
        # has copied what the slot held (the group step cannot choose the slot: it starts again at 0 at
        # each epoch and at a resume, so two exchanges in a row could share one slot, and a member still
        # copying the last epoch's windows would get the next epoch's)
        self._writes = 0
        # what the exchange cost this rank: group steps, seconds in the collectives, window bytes sent
        # to the other members and received from them (its own cut is copied, not counted)
        # (status_seconds: the status exchange, which waits for the slowest member's read; data_seconds:
        # cutting and moving the windows)
        self.stats = {"steps": 0, "seconds": 0.0, "status_seconds": 0.0, "data_seconds": 0.0, "bytes_sent": 0,
                      "bytes_received": 0}

    def agree(self, fingerprint: dict) -> None:
        """Every member must read the same: ``fingerprint`` (plain data: the loader's fingerprint
        with the layout's rules, sources, batch size, seed, shuffle, ...) and the group step it
        starts at are gathered from every member and compared with the first's; any difference
        raises :class:`GroupReadError` on every member, naming the ranks and the fields, before any
        data moves (mixing another store, order or shape of windows would be silent)."""
        import torch.distributed as dist  # noqa: PLC0415

        mine = dict(fingerprint, group_step=self.step, group=[self.size, list(self.dims)])
        gathered: list = [None] * self.size
        dist.all_gather_object(gathered, mine, group=self.pg)
        problems = []
        for s, theirs in enumerate(gathered[1:], 1):
            diffs: list[str] = []
            diff_fields(gathered[0], theirs, "", diffs, (f"rank {self.ranks[0]}", f"rank {self.ranks[s]}"))
            if diffs:
                problems.append(f"rank {self.ranks[s]} differs from rank {self.ranks[0]} in "
                                + "; ".join(diffs[:4]) + ("; ..." if len(diffs) > 4 else ""))
        if problems:
            raise GroupReadError(f"the members of the read group {list(self.ranks)} would read different things: "
                                 + " | ".join(problems) + ". Build the source, layout and loader alike on every "
                                 "rank (and resume every rank from the same checkpoint)")
        self.agreed = True

    def mine(self, step: int) -> bool:
        """Whether this member reads a batch at group step ``step``."""
        return step * self.size + self.index < self.num_batches

    def batches_of(self, step: int) -> int:
        return min(self.size, self.num_batches - step * self.size)

    def exchange(self, batch: dict | None, error: BaseException | None) -> list[dict]:
        """One group step: this member's batch (its group windows, ``None`` when it has none this
        step) or its read error; returns the step's batches (this rank's windows), in loader order."""
        import torch.distributed as dist  # noqa: PLC0415

        t0 = time.perf_counter()
        step = self.step
        if not self.agreed:
            raise RuntimeError("GroupExchange.exchange before agree(): the members' fingerprints were not compared")
        if batch is not None and error is None:
            error = self._check(batch)
        if batch is not None and self.device is None:
            self.device = batch[self.window_outputs[0]].device
        if self.transport is None:
            self._choose_transport()
        slot = -1  # the slot this member's windows are in: read by the members after the status exchange
        if self.transport == "shm" and batch is not None and error is None:
            slot = self._writes % 2
            self._shm.write(slot, batch, self.slot_layout, self.dtype)
            self._writes += 1
        status = None
        if error is not None:
            status = ("error", f"{type(error).__name__}: {error}")
        elif batch is not None:
            status = ("ok", batch["sample_id"].reshape(-1).tolist(), batch["is_pad"].reshape(-1).tolist(), step, slot)
        gathered: list = [None] * self.size
        dist.all_gather_object(gathered, status, group=self.pg)
        t1 = time.perf_counter()
        self.stats["status_seconds"] += t1 - t0
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
        strays = [(self.ranks[s], g[3]) for s, g in enumerate(gathered) if g is not None and g[3] != step]
        if strays:
            raise GroupReadError(f"members {[r for r, _ in strays]} of the read group are at group steps "
                                 f"{[st for _, st in strays]}, this member at {step}: resume every member from the "
                                 "same checkpoint")
        if self.transport == "shm":
            outs = self._read_shm([gathered[s][4] for s in range(n)], n, batch is not None)
        else:
            outs = self._all_to_all(n, batch)
        for s in range(n):
            _, ids, pads, _, _ = gathered[s]
            outs[s]["sample_id"] = torch.tensor(ids, dtype=torch.int64)
            outs[s]["is_pad"] = torch.tensor(pads, dtype=torch.bool)
        self.step += 1
        self.stats["steps"] += 1
        t2 = time.perf_counter()
        self.stats["seconds"] += t2 - t0
        self.stats["data_seconds"] += t2 - t1
        return outs

    def _check(self, batch) -> BaseException | None:
        for name in self.window_outputs:
            want = self.slot_layout[name][1]
            got = batch[name]
            if tuple(got.shape) != want or got.dtype != self.dtype:
                return GroupReadError(f"share: output {name!r} is {tuple(got.shape)} {got.dtype}, the group window "
                                      f"batch is {want} {self.dtype}: read the source with read_windows / "
                                      "partitioned_source / read_dataset as given to the loader")
        return None

    def _piece_elems(self, t: int, name: str) -> int:
        cut = self.cuts[t]
        return 0 if cut is None else self.batch_size * math.prod(self.lead[name]) * math.prod(
            len(c) if isinstance(c, torch.Tensor) else c.stop - c.start for c in cut)

    def _all_to_all(self, n: int, batch: dict | None) -> list[dict]:
        """The windows moved by ``all_to_all_single`` (NCCL for CUDA tensors, gloo for CPU ones)."""
        import torch.distributed as dist  # noqa: PLC0415

        device = self.device if self.device is not None else torch.device("cpu")
        bs = self.batch_size
        outs: list[dict] = [{} for _ in range(n)]
        for name in self.window_outputs:
            lead = self.lead[name]
            mine_shape = lead + tuple(self.window_shape)
            mine_vol = math.prod(mine_shape)
            send_splits = [self._piece_elems(t, name) if batch is not None else 0 for t in range(self.size)]
            send = torch.empty(sum(send_splits), dtype=self.dtype, device=device)
            at = 0
            for t, cut in enumerate(self.cuts):  # each member's cut, copied once into its place
                if send_splits[t]:
                    win = batch[name][(slice(None),) * (1 + len(lead)) + cut]
                    host_copy(send[at:at + send_splits[t]].view(win.shape), win)
                    at += send_splits[t]
            recv_splits = [bs * mine_vol] * n + [0] * (self.size - n)
            recv = torch.empty(sum(recv_splits), dtype=self.dtype, device=device)
            if device.type != "cpu" and dist.get_backend(self.pg) == "gloo":
                # gloo moves CPU tensors only (ranks sharing one GPU cannot use NCCL): staged through the host
                host = torch.empty(recv.shape, dtype=self.dtype)
                dist.all_to_all_single(host, send.cpu(), recv_splits, send_splits, group=self.pg)
                recv.copy_(host)
            else:
                dist.all_to_all_single(recv, send, recv_splits, send_splits, group=self.pg)
            item = recv.element_size()
            self.stats["bytes_sent"] += (sum(send_splits) - send_splits[self.index]) * item
            self.stats["bytes_received"] += (sum(recv_splits) - recv_splits[self.index]) * item
            for s in range(n):
                outs[s][name] = recv[s * bs * mine_vol:(s + 1) * bs * mine_vol].reshape((bs,) + mine_shape)
        return outs

    # ---- one host: shared memory -------------------------------------------------------------------
    def _choose_transport(self) -> None:
        """``"shm"`` when every member runs on this host with CPU windows (each member's group windows
        go to a shared-memory buffer once, each member copies its cuts out: no socket in between),
        else ``"collective"``. Decided together, at the first exchange."""
        import socket  # noqa: PLC0415

        import torch.distributed as dist  # noqa: PLC0415

        me = (socket.gethostname(), _boot_id(), None if self.device is None else self.device.type,
              os.urandom(8).hex(), os.path.isdir("/dev/shm"))
        seen: list = [None] * self.size
        dist.all_gather_object(seen, me, group=self.pg)
        same_host = len({(h, b) for h, b, _, _, _ in seen}) == 1
        cpu = all(d in (None, "cpu") for _, _, d, _, _ in seen)
        self.transport = "collective"
        if same_host and cpu and all(ok for *_, ok in seen) and os.environ.get("DALI_MESH_SHARE_SHM", "1") != "0":
            token = seen[0][3]
            slot = self.slot_elems * torch.empty(0, dtype=self.dtype).element_size()
            shm = None
            try:
                error = None
                try:
                    shm = _SharedSlots(token, self.index, self.size, slot)
                except OSError as e:
                    error = f"{type(e).__name__}: {e}"
                flags: list = [None] * self.size
                dist.all_gather_object(flags, error, group=self.pg)
                if all(f is None for f in flags):
                    try:
                        shm.attach()
                    except OSError as e:
                        error = f"{type(e).__name__}: {e}"
                    dist.all_gather_object(flags, error, group=self.pg)  # everyone has mapped every buffer
                    if all(f is None for f in flags):
                        self.transport, self._shm = "shm", shm
            finally:
                # every member's buffer name, whatever happened (a member that died after making its
                # buffer cannot unlink it; the mappings stay): nothing is left in /dev/shm
                _SharedSlots.unlink_all(token, self.size)
        self.stats["transport"] = self.transport

    def _read_shm(self, slots: list[int], n: int, mine: bool) -> list[dict]:
        """The step's batches (this rank's cut of each) copied out of member ``s``'s slot ``slots[s]``."""
        outs: list[dict] = [{} for _ in range(n)]
        item = torch.empty(0, dtype=self.dtype).element_size()
        cut = self.cuts[self.index]
        for name in self.window_outputs:
            lead = self.lead[name]
            for s in range(n):
                if cut is None:
                    piece = torch.empty((self.batch_size,) + lead + tuple(self.window_shape), dtype=self.dtype)
                else:
                    src = self._shm.view(s, slots[s], *self.slot_layout[name], self.dtype)
                    view = src[(slice(None),) * (1 + len(lead)) + cut]
                    piece = host_copy(torch.empty(view.shape, dtype=self.dtype), view)  # never a view of the buffer
                outs[s][name] = piece
                if s != self.index:
                    self.stats["bytes_received"] += piece.numel() * item
            if mine:
                self.stats["bytes_sent"] += sum(self._piece_elems(t, name) for t in range(self.size)
                                                if t != self.index) * item
        return outs


class _SharedSlots:
    """Each member's two slots of group windows in shared memory (``/dev/shm``, this user's, mode
    0600, unlinked once every member has mapped them)."""

    def __init__(self, token: str, index: int, size: int, slot_bytes: int) -> None:
        self.token, self.index, self.size, self.slot_bytes = token, index, size, int(slot_bytes)
        self.paths = [self.path(token, m) for m in range(size)]
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC
        fd = os.open(self.paths[index], flags, 0o600)
        try:
            # the pages are taken now (ENOSPC here when /dev/shm is too small, as in a container's
            # default 64 MiB, rather than SIGBUS at the first write into a page it cannot hold)
            os.posix_fallocate(fd, 0, max(1, 2 * self.slot_bytes))
            self.maps = {index: mmap.mmap(fd, max(1, 2 * self.slot_bytes))}
        except BaseException:
            os.close(fd)
            os.unlink(self.paths[index])
            raise
        os.close(fd)

    def attach(self) -> None:
        for m, path in enumerate(self.paths):
            if m in self.maps:
                continue
            fd = os.open(path, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC)
            try:
                st = os.fstat(fd)
                if st.st_uid != os.getuid() or st.st_mode & 0o077 or st.st_size != max(1, 2 * self.slot_bytes):
                    raise PermissionError(f"{path} is not this user's group buffer")
                self.maps[m] = mmap.mmap(fd, st.st_size)  # read only here (writable: torch.frombuffer asks)
            finally:
                os.close(fd)

    @staticmethod
    def path(token: str, member: int) -> str:
        return f"/dev/shm/dali_mesh_share_{os.getuid()}_{token}_{member}"

    @staticmethod
    def unlink_all(token: str, size: int) -> None:
        """Unlink every member's buffer of the group ``token`` (those already gone, or never made, are
        skipped). Never raises: it runs in a ``finally`` whatever happened, and a ``/dev/shm`` that is
        read-only (EROFS: no buffer could be made there) or not ours to change must leave the members
        on the collectives, not fail their first step. A buffer that exists and cannot be unlinked is
        logged."""
        for m in range(size):
            path = _SharedSlots.path(token, m)
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError as e:
                if os.path.lexists(path):
                    log.warning("the read group's shared-memory buffer %s could not be removed (%s)", path, e)

    def _array(self, m: int, slot: int, dtype) -> torch.Tensor:
        buf = memoryview(self.maps[m])[slot * self.slot_bytes:(slot + 1) * self.slot_bytes]
        return torch.frombuffer(buf, dtype=dtype) if self.slot_bytes else torch.empty(0, dtype=dtype)

    def write(self, slot: int, batch: dict, layout: dict, dtype) -> None:
        """This member's group windows into its slot ``slot``: output ``name`` of ``batch`` at
        ``layout[name] = (offset, shape)`` (elements)."""
        for name, (at, shape) in layout.items():
            host_copy(self.view(self.index, slot, at, shape, dtype), batch[name])

    def view(self, m: int, slot: int, at: int, shape, dtype) -> torch.Tensor:
        """Member ``m``'s slot ``slot``: the array of ``shape`` at element ``at``."""
        return self._array(m, slot, dtype)[at:at + math.prod(shape)].view(shape)


def host_copy(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """``dst.copy_(src)``; for CPU tensors of a numpy dtype, numpy's copy on this thread instead of
    torch's intra-op thread pool: the members of a read group on one host would otherwise each run a
    pool of OpenMP threads over the same cores, which spin while they wait (measured: the exchange's
    copies ran at a fraction of memory speed with 4 members on 2 cores)."""
    if dst.device.type == "cpu" and src.device.type == "cpu" and dst.dtype == src.dtype and dst.dtype in _NUMPY_DTYPES:
        np.copyto(dst.numpy(), src.numpy())
    else:
        dst.copy_(src)
    return dst


_NUMPY_DTYPES = {torch.float16, torch.float32, torch.float64, torch.int8, torch.int16, torch.int32, torch.int64,
                 torch.uint8, torch.bool}


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _torch_dtype(dtype) -> torch.dtype:
    return torch.from_numpy(np.zeros(0, np.dtype(dtype).newbyteorder("="))).dtype
