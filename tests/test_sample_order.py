"""Sample order: identical within a sample group, same whole number of batches everywhere, padding
flagged, every sample each epoch without drop_last."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dali_mesh import Layout, MeshInfo, sample_order
from dali_mesh.partition import LayoutError


@settings(max_examples=500, deadline=None)
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
