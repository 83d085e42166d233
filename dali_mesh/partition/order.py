"""The sample order: one keyed permutation per ``(seed, epoch)``, the same on every rank, computed per
index in O(1) time and memory, and each sample group's share of it."""
from __future__ import annotations

import numpy as np

from dali_mesh.partition.checks import LayoutError, _check_bool, _check_int

_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_FEISTEL_ROUNDS = 10  # even, so the two halves end at their starting widths; 6 left small domains skewed


def _mix64(z: int) -> int:
    """splitmix64's finaliser: a bijection of 64-bit integers that mixes every bit into every bit."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _mix64_array(z: np.ndarray) -> np.ndarray:
    """:func:`_mix64` on a uint64 array (numpy's uint64 arithmetic wraps modulo 2**64)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


class SampleOrder:
    """The sample ids one sample group takes in one epoch, and which of them are padding, computed
    per index in O(1) time and memory (2**40 samples need no table).

    The permutation of ``range(num_samples)`` is a keyed bijection evaluated per position: a
    10-round Feistel network on the ``bits`` = max(2, ceil(log2(num_samples))) bit integers (two
    halves of ``bits // 2`` and ``bits - bits // 2`` bits, round function splitmix64 of the half plus
    a round key derived from ``(seed, epoch)``), with cycle walking: a value ``>= num_samples`` is
    encrypted again until it falls inside (fewer than 2 steps on average, as the power of two is
    less than twice ``num_samples``). The same on every rank and in every process; the identity
    without ``shuffle``.

    Group ``b`` of ``B`` (``batch_index``, ``num_batch_groups``) takes positions ``b, b + B, b + 2B, ...``
    of the permutation. Without ``drop_last`` the positions wrap around past the end so that every
    group gets the same whole number of batches; wrapped entries are flagged as padding and every
    sample appears each epoch. With ``drop_last`` each group keeps the whole batches of
    ``floor(N / B)`` samples. Every group has the same length, a multiple of ``batch_size``, so no
    rank takes fewer steps than another.

    ``order[i]`` is ``(sample_id, is_pad)``; :meth:`arrays` gives all of them as numpy arrays.
    (Before this class the permutation came from ``numpy.random.default_rng([seed, epoch])``:
    the properties are the same, the permutation values are not.)
    """

    __slots__ = ("num_samples", "epoch", "seed", "shuffle", "batch_size", "drop_last", "batch_index",
                 "num_batch_groups", "_length", "_bits", "_keys")

    def __init__(self, num_samples: int, epoch: int, *, seed: int = 0, shuffle: bool = True,
                 batch_size: int = 1, drop_last: bool = False, batch_index: int = 0,
                 num_batch_groups: int = 1) -> None:
        self.num_samples = _check_int("num_samples", num_samples, 1, 1 << 63)
        self.epoch = _check_int("epoch", epoch, 0, 1 << 64)
        self.seed = _check_int("seed", seed, 0, 1 << 64)
        self.shuffle = _check_bool("shuffle", shuffle)
        self.batch_size = _check_int("batch_size", batch_size, 1)
        self.drop_last = _check_bool("drop_last", drop_last)
        self.num_batch_groups = _check_int("num_batch_groups", num_batch_groups, 1)
        self.batch_index = _check_int("batch_index", batch_index, 0)
        if self.batch_index >= self.num_batch_groups:
            raise LayoutError(f"batch_index {self.batch_index} is out of range for "
                              f"{self.num_batch_groups} sample groups")
        n, k, bs = self.num_samples, self.num_batch_groups, self.batch_size
        if self.drop_last:
            self._length = (n // k) // bs * bs
        else:
            self._length = -(-(-(-n // k)) // bs) * bs
        self._bits = max(2, (n - 1).bit_length())
        base = _mix64(_mix64(self.seed ^ _GOLDEN) ^ _mix64((self.epoch + _GOLDEN) & _M64))
        self._keys = tuple(_mix64((base + r * _GOLDEN) & _M64) for r in range(_FEISTEL_ROUNDS))

    def __len__(self) -> int:
        return self._length

    def __repr__(self) -> str:
        return (f"SampleOrder(num_samples={self.num_samples}, epoch={self.epoch}, seed={self.seed}, "
                f"shuffle={self.shuffle}, batch_size={self.batch_size}, drop_last={self.drop_last}, "
                f"batch_index={self.batch_index}, num_batch_groups={self.num_batch_groups})")

    # ---- the permutation ------------------------------------------------------------------------
    def _encrypt(self, x: int) -> int:
        wr = self._bits // 2
        wl = self._bits - wr
        for key in self._keys:
            left, right = x >> wr, x & ((1 << wr) - 1)
            x = (right << wl) | (left ^ (_mix64((right + key) & _M64) & ((1 << wl) - 1)))
            wl, wr = wr, wl
        return x

    def _encrypt_array(self, x: np.ndarray) -> np.ndarray:
        wr = self._bits // 2
        wl = self._bits - wr
        for key in self._keys:
            left, right = x >> np.uint64(wr), x & np.uint64((1 << wr) - 1)
            f = _mix64_array(right + np.uint64(key)) & np.uint64((1 << wl) - 1)
            x = (right << np.uint64(wl)) | (left ^ f)
            wl, wr = wr, wl
        return x

    def permutation(self, position: int) -> int:
        """``perm[position]`` for ``0 <= position < num_samples``."""
        if isinstance(position, (bool, np.bool_)) or not isinstance(position, (int, np.integer)):
            raise TypeError(f"permutation position must be an integer, got {position!r}")
        position = int(position)
        if not 0 <= position < self.num_samples:
            # outside the domain the Feistel walk would never come back into range
            raise IndexError(f"permutation position {position} is out of range for {self.num_samples} samples")
        if not self.shuffle:
            return position
        x = self._encrypt(position)
        while x >= self.num_samples:  # cycle walking: stays in range(num_samples), still a bijection
            x = self._encrypt(x)
        return x

    def _permutation_array(self, positions: np.ndarray) -> np.ndarray:
        if not self.shuffle:
            return positions.astype(np.int64)
        x = self._encrypt_array(positions.astype(np.uint64))
        outside = np.flatnonzero(x >= np.uint64(self.num_samples))
        while outside.size:
            x[outside] = self._encrypt_array(x[outside])
            outside = outside[x[outside] >= np.uint64(self.num_samples)]
        return x.astype(np.int64)

    # ---- this group's share -------------------------------------------------------------------------
    def __getitem__(self, i: int) -> tuple[int, bool]:
        """``(sample_id, is_pad)`` of entry ``i`` (negative ``i`` counts from the end), in O(1)."""
        if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"SampleOrder index must be an integer, got {i!r} ({type(i).__name__})")
        i = int(i)
        if not -self._length <= i < self._length:
            raise IndexError(f"SampleOrder index {i} is out of range for {self._length} entries")
        if i < 0:
            i += self._length
        position = self.batch_index + self.num_batch_groups * i  # in the wrapped permutation
        return self.permutation(position % self.num_samples), position >= self.num_samples

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """All entries: ``(sample_ids, is_pad)``, int64 and bool arrays of ``len(self)`` entries."""
        positions = self.batch_index + self.num_batch_groups * np.arange(self._length, dtype=np.int64)
        ids = np.empty(self._length, dtype=np.int64)
        wrapped = positions % self.num_samples
        step = 1 << 16  # blocks that stay in cache: ~4x faster than one pass over a large epoch
        for i in range(0, self._length, step):
            ids[i:i + step] = self._permutation_array(wrapped[i:i + step])
        return ids, positions >= self.num_samples


def sample_order(
    num_samples: int,
    epoch: int,
    *,
    seed: int = 0,
    shuffle: bool = True,
    batch_size: int = 1,
    drop_last: bool = False,
    batch_index: int = 0,
    num_batch_groups: int = 1,
) -> tuple[np.ndarray, np.ndarray]:
    """The sample ids one sample group takes in one epoch, and which of them are padding:
    ``SampleOrder(...).arrays()`` (see :class:`SampleOrder` for the rules).

    Returns ``(sample_ids, is_pad)``: int64 and bool arrays of equal length, a multiple of
    ``batch_size``.
    """
    return SampleOrder(num_samples, epoch, seed=seed, shuffle=shuffle, batch_size=batch_size,
                       drop_last=drop_last, batch_index=batch_index,
                       num_batch_groups=num_batch_groups).arrays()


class GroupOrder:
    """The batches of one member of a read group (:mod:`dali_mesh.partition.read_groups`): batches
    ``index, index + size, index + 2 size, ...`` of ``order`` (a :class:`SampleOrder`), entry by entry,
    in O(1) per index as the order itself."""

    __slots__ = ("order", "batch_size", "size", "index", "_length")

    def __init__(self, order: SampleOrder, batch_size: int, size: int, index: int) -> None:
        self.order, self.batch_size, self.size, self.index = order, int(batch_size), int(size), int(index)
        n_batches = len(order) // self.batch_size
        self._length = max(0, -(-(n_batches - self.index) // self.size)) * self.batch_size

    @property
    def epoch(self) -> int:
        return self.order.epoch

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, i: int) -> tuple[int, bool]:
        i = int(i)
        if not 0 <= i < self._length:
            raise IndexError(f"GroupOrder index {i} is out of range for {self._length} entries")
        b = (i // self.batch_size) * self.size + self.index
        return self.order[b * self.batch_size + i % self.batch_size]

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        ids, pads = self.order.arrays()
        bs = self.batch_size
        n = len(ids) // bs
        keep = np.arange(self.index, n, self.size)
        sel = (keep[:, None] * bs + np.arange(bs)).reshape(-1)
        return ids[sel], pads[sel]
