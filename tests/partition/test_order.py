"""Sample order: identical within a sample group, same whole number of batches everywhere, padding
flagged, every sample each epoch without drop_last."""
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dali_mesh import Layout, MeshInfo, sample_order
from dali_mesh.partition import LayoutError


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 60), groups=st.integers(1, 9), batch=st.integers(1, 7), epoch=st.integers(0, 3),
    seed=st.integers(0, 2**40), shuffle=st.booleans(), drop_last=st.booleans(),
)
def test_sample_order_properties(n, groups, batch, epoch, seed, shuffle, drop_last):
    orders = [sample_order(n, epoch, seed=seed, shuffle=shuffle, batch_size=batch, drop_last=drop_last,
                           batch_index=b, num_batch_groups=groups) for b in range(groups)]
    lengths = {len(ids) for ids, _ in orders}
    assert len(lengths) == 1  # every group takes the same number of steps
    length = lengths.pop()
    assert length % batch == 0
    for ids, pad in orders:
        assert ids.dtype == np.int64 and pad.dtype == bool and len(pad) == len(ids)
        assert ((0 <= ids) & (ids < n)).all()
    real = np.concatenate([ids[~pad] for ids, pad in orders])
    assert len(np.unique(real)) == len(real)  # no sample twice among real entries
    if drop_last:
        assert not any(pad.any() for _, pad in orders)
        assert length == (n // groups) // batch * batch
    else:
        assert sorted(real.tolist()) == list(range(n))  # every sample, each epoch
        assert length == -(-(-(-n // groups)) // batch) * batch
        # padded entries come only at the end of a group's list
        for _, pad in orders:
            if pad.any():
                assert pad[np.argmax(pad):].all()
    if not shuffle:
        ids, pad = orders[0]
        assert ids[~pad].tolist() == list(range(0, n, groups))[: (~pad).sum()]


def test_identical_within_a_sample_group_and_seeded():
    mesh = MeshInfo((2, 2, 2), ("dp", "tp", "mp"))
    results = {}
    for coordinate in mesh.coordinates():
        layout = Layout(mesh.with_coordinate(coordinate), shard={"mp": 1}, batch="dp")
        ids, pad = layout.sample_order(13, epoch=2, seed=7, batch_size=2)
        results.setdefault(coordinate[0], []).append((ids.tolist(), pad.tolist()))
    for group in results.values():
        assert all(g == group[0] for g in group)
    assert results[0][0] != results[1][0]
    a = sample_order(100, 0, seed=1)[0]
    assert (a == sample_order(100, 0, seed=1)[0]).all()
    assert (a != sample_order(100, 1, seed=1)[0]).any()
    assert (a != sample_order(100, 0, seed=2)[0]).any()


@pytest.mark.parametrize("kwargs,match", [
    ({"num_samples": 0}, "num_samples must be a positive integer"),
    ({"batch_size": 0}, "batch_size must be a positive integer"),
    ({"num_batch_groups": 2, "batch_index": 2}, "batch_index 2 is out of range"),
    ({"epoch": -1}, "epoch must be >= 0"),
])
def test_sample_order_bad_input(kwargs, match):
    args = {"num_samples": 10, "epoch": 0, **kwargs}
    with pytest.raises(LayoutError, match=match):
        sample_order(args.pop("num_samples"), args.pop("epoch"), **args)


# ---- SampleOrder: O(1) per index -------------------------------------------------------------------
from dali_mesh.partition import SampleOrder  # noqa: E402

SIZES = [1, 2, 3, 4, 5, 7, 8, 13, 16, 17, 31, 32, 33, 97, 128, 257, 1000, 1024, 4099, 65536, 65537]


@pytest.mark.parametrize("n", SIZES)
def test_shuffle_is_a_permutation_and_items_equal_arrays(n):
    for seed, epoch in ((0, 0), (7, 3), (2**64 - 1, 11)):
        order = SampleOrder(n, epoch, seed=seed)
        ids, pad = order.arrays()
        assert np.array_equal(np.sort(ids), np.arange(n))
        assert not pad.any() and len(order) == n
        picks = range(n) if n <= 300 else np.linspace(0, n - 1, 300).astype(int)
        assert [order[int(i)] for i in picks] == [(int(ids[i]), False) for i in picks]
        assert order[-1] == order[n - 1]


def test_shuffle_changes_with_seed_and_epoch_and_is_not_the_identity():
    base = SampleOrder(1000, 0, seed=1).arrays()[0]
    assert (base != np.arange(1000)).mean() > 0.9
    assert (base != SampleOrder(1000, 1, seed=1).arrays()[0]).mean() > 0.9
    assert (base != SampleOrder(1000, 0, seed=2).arrays()[0]).mean() > 0.9
    assert np.array_equal(SampleOrder(1000, 0, seed=1, shuffle=False).arrays()[0], np.arange(1000))


def test_first_sample_is_spread_over_seeds():
    # a weak uniformity check: which of 10 samples comes first, over 2000 seeds (200 expected each)
    counts = np.bincount([SampleOrder(10, 0, seed=s)[0][0] for s in range(2000)], minlength=10)
    assert counts.min() > 140 and counts.max() < 260, counts


def test_every_ordering_of_4_samples_is_about_equally_likely():
    # 3000 seeds over 24 orderings: 125 expected each, standard deviation about 11
    counts = Counter(tuple(SampleOrder(4, 0, seed=s).arrays()[0].tolist()) for s in range(3000))
    assert len(counts) == 24 and 85 < min(counts.values()) and max(counts.values()) < 165, counts


def test_2_to_the_40_samples_need_no_memory():
    n = 2**40
    order = SampleOrder(n, 5, seed=9, batch_size=4, num_batch_groups=8, batch_index=5)
    assert len(order) == n // 8
    picks = [0, 1, 2, 12345, len(order) - 1]
    items = [order[i] for i in picks]
    ids = [sample for sample, _ in items]
    assert all(0 <= s < n for s in ids) and len(set(ids)) == len(ids)
    assert not any(pad for _, pad in items)
    # entry i of group b is perm[b + B*i]; the other groups' entries are the neighbouring positions
    others = [SampleOrder(n, 5, seed=9, batch_size=4, num_batch_groups=8, batch_index=b)[3][0] for b in range(8)]
    assert len(set(others)) == 8 and others[5] == order[3][0]
    assert order.permutation(5 + 8 * 3) == order[3][0]


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 80), groups=st.integers(1, 9), batch=st.integers(1, 7), epoch=st.integers(0, 3),
       seed=st.integers(0, 2**64 - 1), drop_last=st.booleans())
def test_groups_same_length_disjoint_and_items_equal_arrays(n, groups, batch, epoch, seed, drop_last):
    orders = [SampleOrder(n, epoch, seed=seed, batch_size=batch, drop_last=drop_last, batch_index=b,
                          num_batch_groups=groups) for b in range(groups)]
    assert len({len(o) for o in orders}) == 1
    real = []
    for o in orders:
        ids, pad = o.arrays()
        assert [o[i] for i in range(len(o))] == list(zip(ids.tolist(), pad.tolist()))
        # padded entries wrap to the start of the permutation: position b + B*i - n
        for i in np.flatnonzero(pad):
            assert ids[i] == o.permutation((o.batch_index + groups * int(i)) % n)
        real += ids[~pad].tolist()
    assert len(set(real)) == len(real)
    if not drop_last:
        assert sorted(real) == list(range(n))


def test_layout_order_is_the_sample_group_share():
    mesh = MeshInfo((3, 2), ("dp", "mp"), (2, 1))
    layout = Layout(mesh, shard={"mp": 0})
    order = layout.order(10, 1, seed=4, batch_size=2)
    assert (order.batch_index, order.num_batch_groups) == (2, 3)
    ids, pad = layout.sample_order(10, 1, seed=4, batch_size=2)
    assert np.array_equal(ids, order.arrays()[0]) and np.array_equal(pad, order.arrays()[1])
    assert pad.tolist() == [False, False, False, True]  # positions 2, 5, 8, 11 (11 wraps)


@pytest.mark.parametrize("kwargs,match", [
    ({"seed": 2**64}, "seed must be < 18446744073709551616, got 18446744073709551616"),
    ({"seed": -1}, "seed must be >= 0, got -1"),
    ({"seed": 1.9}, r"seed must be an integer, got 1.9 \(float\)"),
    ({"seed": "3"}, "seed must be an integer, got '3'"),
    ({"seed": True}, "seed must be an integer, got True"),
    ({"epoch": 1.0}, "epoch must be an integer, got 1.0"),
    ({"num_samples": 2.5}, "num_samples must be an integer, got 2.5"),
    ({"num_samples": np.int32(0)}, "num_samples must be a positive integer, got 0"),
    ({"batch_size": True}, "batch_size must be an integer, got True"),
    ({"batch_index": 0.0}, "batch_index must be an integer"),
    ({"shuffle": 1}, "shuffle must be True or False, got 1"),
    ({"drop_last": "yes"}, "drop_last must be True or False, got 'yes'"),
])
def test_sample_order_refuses_non_integers(kwargs, match):
    args = {"num_samples": 10, "epoch": 0, **kwargs}
    with pytest.raises(LayoutError, match=match):
        SampleOrder(args.pop("num_samples"), args.pop("epoch"), **args)


def test_numpy_integers_are_integers():
    a = SampleOrder(np.int64(10), np.uint8(2), seed=np.uint64(2**64 - 1), batch_size=np.int16(3),
                    shuffle=np.bool_(True)).arrays()
    b = SampleOrder(10, 2, seed=2**64 - 1, batch_size=3).arrays()
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


def test_index_errors():
    order = SampleOrder(5, 0)
    with pytest.raises(IndexError, match="index 5 is out of range for 5 entries"):
        order[5]
    with pytest.raises(TypeError, match="index must be an integer, got 1.5"):
        order[1.5]
    with pytest.raises(IndexError, match="position 5 is out of range for 5 samples"):
        order.permutation(5)
    assert list(order) == [order[i] for i in range(5)]
