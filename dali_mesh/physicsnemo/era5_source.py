"""The samples of PhysicsNeMo's ERA5 HDF5 files and the order its ``ERA5HDF5Datapipe`` takes them in
(numpy only: DALI's worker processes unpickle this source).

PhysicsNeMo's rules (``physicsnemo.datapipes.climate.era5_hdf5``, release 2.2.2):

- one file per year, ``????.h5`` sorted by name, dataset ``fields`` of shape ``(step, channel, lat,
  lon)``; a sample never crosses a year file;
- each year gives the same number of samples: from the first file, ``(steps - (num_steps +
  num_history) * stride) // world_size * world_size``, or ``num_samples_per_year`` (the first ones);
- PhysicsNeMo's sample ``idx`` is step ``idx % per_year`` of year ``idx // per_year``, the sample's
  first input step;
- data-parallel rank ``r`` of ``world_size`` takes the contiguous block
  ``numpy.array_split(range(total), world_size)[r]``, shuffled in place at every epoch ``e`` by
  ``numpy.random.default_rng(seed=e).shuffle`` (so epoch ``e`` is the shuffles of epochs ``0..e``
  applied in turn), and ends the epoch at its last whole batch.
"""
from __future__ import annotations

import numpy as np

from dali_mesh.io._common import DataFileError
from dali_mesh.partition import SampleOrder
from dali_mesh.source import ForecastSpec, HDF5Source

ORDERS = ("physicsnemo", "dali_mesh")


class _MappedOrder:
    """An epoch's ``(sample_id, is_pad)`` entries: positions into PhysicsNeMo's sample list, mapped to
    the source's sample ids (the :class:`~dali_mesh.partition.SampleOrder` protocol)."""

    __slots__ = ("epoch", "_ids", "_positions", "_order")

    def __init__(self, epoch: int, ids: np.ndarray, positions: np.ndarray | None = None,
                 order: SampleOrder | None = None) -> None:
        self.epoch, self._ids, self._positions, self._order = epoch, ids, positions, order

    def __len__(self) -> int:
        return len(self._positions) if self._order is None else len(self._order)

    def __getitem__(self, i: int) -> tuple[int, bool]:
        if self._order is None:
            return int(self._ids[self._positions[i]]), False
        position, pad = self._order[i]
        return int(self._ids[position]), bool(pad)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        if self._order is None:
            return self._ids[self._positions].astype(np.int64), np.zeros(len(self._positions), bool)
        positions, pads = self._order.arrays()
        return self._ids[positions].astype(np.int64), pads


def physicsnemo_block(total: int, epoch: int, *, shuffle: bool, process_rank: int, world_size: int,
                      start: tuple[int, np.ndarray] | None = None) -> np.ndarray:
    """PhysicsNeMo ERA5's sample indices of data-parallel rank ``process_rank`` in ``epoch``, whole
    batches only: its block of ``range(total)``, shuffled by the seeds ``0..epoch`` in turn
    (``start``: ``(e, block of epoch e)`` to continue from, ``e <= epoch``)."""
    if start is not None and start[0] <= epoch:
        e0, block = start[0] + 1, start[1].copy()
    else:
        e0, block = 0, np.array_split(np.arange(total, dtype=np.int64), world_size)[process_rank]
    if shuffle:
        for e in range(e0, epoch + 1):
            np.random.default_rng(seed=e).shuffle(block)
    return block


class ERA5Source(HDF5Source):
    """PhysicsNeMo ERA5 year files (``fields``) as a dali_mesh source: samples within one year file,
    in PhysicsNeMo's order (``order="physicsnemo"``) or dali_mesh's keyed permutation of the same
    samples (``order="dali_mesh"``, with ``seed``; each sample group takes every ``world_size``-th).

    The sample id is the sample's first input step counted across the files (the step of
    ``sample_id`` is ``step_of(sample_id)``, its first input step ``sample_id`` itself), so
    ``locate(sample_id)`` is ``(year index, PhysicsNeMo's in-year index)``. ``process_rank`` and
    ``world_size`` are the data-parallel rank and size; the layout's batch dims, where it has any, must
    be them.
    """

    def __init__(self, files, layout, *, forecast: ForecastSpec, samples_per_year: int | None = None,
                 process_rank: int = 0, world_size: int = 1, order: str = "physicsnemo", **kw) -> None:
        if order not in ORDERS:
            raise ValueError(f"order must be one of {', '.join(map(repr, ORDERS))}, got {order!r}")
        if not isinstance(forecast, ForecastSpec):
            raise TypeError(f"forecast must be a ForecastSpec, got {type(forecast).__name__}")
        self.era5_order = order
        self.process_rank, self.world_size = int(process_rank), int(world_size)
        if not 0 <= self.process_rank < self.world_size:
            raise ValueError(f"process_rank {process_rank} is out of range for world_size {world_size}")
        groups = layout.num_batch_groups
        if groups > 1 and (self.process_rank, self.world_size) != (layout.batch_index, groups):
            raise ValueError(f"process_rank {process_rank} / world_size {world_size} disagree with the layout's "
                             f"batch dims ({groups} sample groups, this rank in group {layout.batch_index}): "
                             "the data-parallel rank is the layout's; leave process_rank and world_size out")
        kw.setdefault("drop_last", True)
        if kw.get("share") is not None:
            # its sample order is PhysicsNeMo's (sample_order below), which read groups do not split
            raise ValueError("ERA5Source does not take share= (PhysicsNeMo's sample order is not split into read "
                             "groups); use an HDF5Source with share=, or leave share out")
        super().__init__(files, "fields", layout, forecast=forecast, **kw)
        lengths = np.diff(self._offsets)
        span = forecast.span
        available = (int(lengths[0]) - span) // self.world_size * self.world_size
        if available < 1:
            raise ValueError(f"Not enough number of samples per year ({available}): {self.files[0]} holds "
                             f"{int(lengths[0])} steps, a sample spans {span + 1}")
        per_year = available if samples_per_year is None else int(samples_per_year)
        if not 1 <= per_year <= available:
            raise ValueError(f"num_samples_per_year ({samples_per_year}) > number of samples available "
                             f"({available})!" if per_year > available else
                             f"num_samples_per_year must be >= 1, got {samples_per_year!r}")
        short = [(f, int(n)) for f, n in zip(self.files, lengths) if n < per_year + span]
        if short:
            raise DataFileError(short[0][0], f"holds {short[0][1]} steps, fewer than the {per_year + span} the "
                                f"first file's {per_year} samples per year need (PhysicsNeMo sizes every year "
                                f"from the first, {self.files[0]})")
        self.samples_per_year = per_year
        # PhysicsNeMo's sample idx -> this source's sample id (its first input step, across the files)
        self.era5_ids = (self._offsets[:-1, None] + np.arange(per_year, dtype=np.int64)).reshape(-1)
        self._check_batches()

    def sample_order(self, epoch: int):
        ids = getattr(self, "era5_ids", None)
        if ids is None:  # during HDF5Source.__init__: its own checks
            return super().sample_order(epoch)
        memo = self._memo.get("era5_order")
        if memo is not None and memo.epoch == epoch:
            return memo
        if self.era5_order == "dali_mesh":
            res = _MappedOrder(epoch, ids, order=SampleOrder(
                len(ids), epoch, seed=self.seed, shuffle=self.shuffle, batch_size=self.batch_size,
                drop_last=self.drop_last, batch_index=self.process_rank, num_batch_groups=self.world_size))
        else:
            block = physicsnemo_block(len(ids), epoch, shuffle=self.shuffle, process_rank=self.process_rank,
                                      world_size=self.world_size, start=self._memo.get("era5_block"))
            self._memo["era5_block"] = (epoch, block)
            whole = len(block) // self.batch_size * self.batch_size
            res = _MappedOrder(epoch, ids, positions=block[:whole])
        self._memo["era5_order"] = res
        return res

    def fingerprint(self) -> dict:
        fp = super().fingerprint()
        fp["era5"] = {"order": self.era5_order, "samples_per_year": self.samples_per_year,
                      "process_rank": self.process_rank, "world_size": self.world_size}
        return fp
