"""Explicit shard sizes: ``split={mesh dim: [sizes...]}``. Regions tile the domain, equal the
prefix sums of the sizes, nest as combined shards on the innermost mesh dim, and bad sizes are
refused naming the mesh dim and the sizes."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dali_mesh import Layout, MeshInfo
from dali_mesh.partition import LayoutError, take_window

from tests.helpers import np_pad_window


def random_sizes(draw, total, count):
    cuts = sorted(draw(st.lists(st.integers(0, total), min_size=count - 1, max_size=count - 1)))
    return [b - a for a, b in zip([0] + cuts, cuts + [total])]


@settings(max_examples=120, deadline=None)
@given(st.data())
def test_explicit_regions_tile_the_domain_and_follow_prefix_sums(data):
    draw = data.draw
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.integers(1, 9)) for _ in range(ndim))
    crop = draw(st.booleans())
    d0 = tuple(draw(st.integers(0, s - 1)) if crop else 0 for s in shape)
    d1 = tuple(draw(st.integers(a + 1, s)) if crop else s for a, s in zip(d0, shape))
    # mesh: a batch dim, and one or two sharded axes; the last may be split by two nested mesh dims
    axes = draw(st.lists(st.integers(0, ndim - 1), min_size=1, max_size=2, unique=True))
    nested = draw(st.booleans())
    names, mesh_shape, shard = ["dp"], [draw(st.integers(1, 2))], {}
    for i, axis in enumerate(axes):
        for j in range(2 if nested and i == len(axes) - 1 else 1):
            names.append(f"m{i}{j}")
            mesh_shape.append(draw(st.integers(1, 4)))
            shard[names[-1]] = axis
    mesh = MeshInfo(tuple(mesh_shape), tuple(names))
    split, combined = {}, {}
    for axis in axes:
        dims = [n for n in names if shard.get(n) == axis]
        count = int(np.prod([mesh_shape[names.index(n)] for n in dims]))
        sizes = random_sizes(draw, d1[axis] - d0[axis], count)
        split[dims[-1]] = sizes
        combined[axis] = (dims, sizes)
    layout = Layout(mesh, shard=shard, batch="dp", split=split, halo=1, boundary="periodic",
                    crop=list(zip(d0, d1)) if crop else None)
    count = np.zeros(shape, dtype=int)
    seen = set()
    for coordinate in mesh.coordinates():
        region = layout.region(shape, coordinate)
        # by hand: shard c of an axis (row-major over its mesh dims) starts at sum(sizes[:c])
        for axis, (dims, sizes) in combined.items():
            c = 0
            for n in dims:
                c = c * mesh_shape[names.index(n)] + coordinate[names.index(n)]
            assert region.stop[axis] - region.start[axis] == sizes[c]
            if sizes[c] and all(s for s in region.shape):
                assert region.start[axis] == d0[axis] + sum(sizes[:c])
        if coordinate[0] == 0:  # one sample group; the other holds the same regions
            key = coordinate[1:]
            assert key not in seen
            seen.add(key)
            count[tuple(slice(a, b) for a, b in zip(region.start, region.stop))] += 1
        else:
            assert region == layout.region(shape, (0,) + coordinate[1:])
    expected = np.zeros(shape, dtype=int)
    expected[tuple(slice(a, b) for a, b in zip(d0, d1))] = 1
    np.testing.assert_array_equal(count, expected)


def test_regions_by_hand():
    mesh = MeshInfo((2, 4), ("dp", "mp"))
    layout = Layout(mesh, shard={"mp": 1}, split={"mp": [100, 200, 300, 121]}, halo={1: 2},
                    boundary={1: "periodic"})
    regions = layout.regions((8, 721))[:4]
    assert [(r.start[1], r.stop[1]) for r in regions] == [(0, 100), (100, 300), (300, 600), (600, 721)]
    assert [(r.window_start[1], r.window_stop[1]) for r in regions] == [(-2, 102), (98, 302), (298, 602), (598, 723)]
    sample = np.arange(8 * 721).reshape(8, 721)
    for r in regions:
        np.testing.assert_array_equal(take_window(sample, r), np_pad_window(sample, r))
    # with a crop the sizes tile the crop, in sample coordinates
    cropped = Layout(mesh, shard={"mp": 1}, split={"mp": [0, 360, 0, 360]}, crop=[None, (1, 721)])
    # empty shards at the running sum of the sizes before them, as PhysicsNeMo's ShardTensor.offsets()
    # (tests/torch/test_physicsnemo_real.py checks that against the real package)
    assert [(r.start[1], r.stop[1]) for r in cropped.regions((8, 721))[:4]] == [(1, 1), (1, 361), (361, 361), (361, 721)]
    assert cropped.split == "explicit" and cropped.split_sizes == {"mp": (0, 360, 0, 360)}
    assert cropped.sharding_shapes((8, 721), batch_size=2) == {1: ((2, 8, 0), (2, 8, 360), (2, 8, 0), (2, 8, 360))}


def test_nested_mesh_dims_take_combined_sizes_on_the_innermost():
    mesh = MeshInfo((2, 3), ("outer", "inner"))
    sizes = [1, 2, 3, 4, 0, 5]  # shard i * 3 + j for outer i, inner j
    layout = Layout(mesh, shard={"outer": 0, "inner": 0}, split={"inner": sizes})
    got = {c: (r.start[0], r.stop[0]) for c, r in zip(mesh.coordinates(), layout.regions((15,)))}
    assert got == {(0, 0): (0, 1), (0, 1): (1, 3), (0, 2): (3, 6), (1, 0): (6, 10), (1, 1): (10, 10), (1, 2): (10, 15)}


def test_explicit_split_has_a_dtensor_only_where_it_is_chunk():
    layout = Layout(MeshInfo((4,), ("mp",)), shard={"mp": 0}, split={"mp": [3, 3, 3, 3]})
    with pytest.raises(LayoutError, match="no DTensor for explicit split sizes .*pass global_shape="):
        layout.placement_spec(1)
    assert layout.placement_spec(1, global_shape=(12,)) == (("shard", 1),)  # torch.chunk(12, 4): 3 each
    uneven = Layout(MeshInfo((4,), ("mp",)), shard={"mp": 0}, split={"mp": [4, 3, 3, 2]})
    with pytest.raises(LayoutError, match=r"torch.chunk, which gives \{'mp': \[3, 3, 3, 3\]\}"):
        uneven.placement_spec(1, global_shape=(12,))
    assert uneven.placement_spec(2, any_split=True) == (("shard", 1),)


MESH = MeshInfo((2, 4), ("dp", "mp"))


@pytest.mark.parametrize("shard,split,match", [
    ({"mp": 1}, {"mp": [1, 2, 3]}, r"split: 3 sizes \[1, 2, 3\] given but mesh dim 'mp' has 4 ranks"),
    ({"mp": 1}, {"mp": [1, 2, 3, -1]}, "split: size -1 of mesh dim 'mp' is negative"),
    ({"mp": 1}, {"mp": [1, 2, 3, 1.5]}, "split: size 1.5 of mesh dim 'mp' is not an integer"),
    ({"mp": 1}, {"mp": [1, 2, 3, True]}, "split: size True of mesh dim 'mp' is not an integer"),
    ({"mp": 1}, {"mp": "1,2,3,4"}, "split: sizes of mesh dim 'mp' must be a list of integers"),
    ({"mp": 1}, {"mp": 4}, "split: sizes of mesh dim 'mp' must be a list of integers, got 4"),
    ({"mp": 1}, {"dp": [1, 1]}, r"split: mesh dim 'dp' shards no axis"),
    ({"mp": 1}, {"tp": [1, 1]}, "split: unknown mesh dim 'tp'"),
    ({"mp": 1, "dp": 0}, {"mp": [1, 1, 1, 1]}, r"split: no sizes for mesh dim 'dp' \(it shards axis 0\)"),
    ({"mp": 1, "dp": 1}, {"dp": [1, 1]}, r"mesh dims \['dp', 'mp'\] shard axis 1 together; give the sizes of all 8 "
                                         r"combined shards on the innermost, 'mp'"),
    ({"mp": 1, "dp": 1}, {"mp": [1, 1, 1, 1]}, r"4 sizes .* given but mesh dims \['dp', 'mp'\] make 8 combined shards"),
    ({"mp": 1}, ["mp", [1, 2]], "split must be a rule"),
    ({"mp": 1}, None, "split must be a rule"),
])
def test_bad_sizes_are_refused(shard, split, match):
    with pytest.raises(LayoutError, match=match):
        Layout(MESH, shard=shard, batch=[] if len(shard) == 2 else None, split=split)


def test_sizes_must_tile_the_axis_or_crop():
    layout = Layout(MESH, shard={"mp": 1}, split={"mp": [2, 2, 2, 2]})
    assert layout.region((3, 8)).shape == (3, 2)
    with pytest.raises(LayoutError, match=r"split sizes \[2, 2, 2, 2\] of mesh dim 'mp' sum to 8 but axis 1 has 9 "
                                          "cells: the sizes must tile the axis"):
        layout.region((3, 9))
    cropped = Layout(MESH, shard={"mp": 1}, split={"mp": [2, 2, 2, 2]}, crop=[None, (1, 8)])
    with pytest.raises(LayoutError, match=r"sum to 8 but axis 1 has 7 cells \(its crop\)"):
        cropped.region((3, 8))
    # negative axes resolve per sample: two mesh dims on axis 1 and -1 nest on a 2-d sample
    nested = Layout(MESH, shard={"dp": 1, "mp": -1}, batch=[], split={"mp": [1] * 4, "dp": [1, 1]})
    with pytest.raises(LayoutError, match=r"mesh dims \['dp', 'mp'\] shard axis 1 together"):
        nested.region((3, 8))
    assert nested.region((3, 2, 4)).shape == (3, 1, 1)


def test_numpy_sizes_are_integers():
    layout = Layout(MESH, shard={"mp": 1}, split={"mp": np.array([4, 0, 3, 1])})
    assert layout.split_sizes == {"mp": (4, 0, 3, 1)}
    assert layout == Layout(MESH, shard={"mp": 1}, split={1: [4, 0, 3, 1]})
    assert all(type(s) is int for s in layout.split_sizes["mp"])


def test_split_sizes_flat_for_the_plugin():
    mesh = MeshInfo((2, 2, 3), ("dp", "a", "b"))
    layout = Layout(mesh, shard={"a": 0, "b": 1}, split={"b": [1, 1, 1], "a": [2, 0]})
    assert layout.split_sizes_flat() == ((0, 2, 3), (2, 0, 1, 1, 1))
    assert Layout(mesh, shard={"a": 0, "b": 1}).split_sizes_flat() == ((), ())


# ---- issue 19: nested mesh dims written with axes of both signs ------------------------------------
def test_explicit_sizes_for_two_mesh_dims_on_one_axis_written_minus_one_and_zero():
    """shard={"a": -1, "b": 0} on 1-d samples is one axis sharded by a then b: its explicit sizes are
    given on b, as for {"a": 0, "b": 0} (refused before: "no sizes for mesh dim 'a'", since -1 and 0
    looked like two axes while the sample's ndim was unknown)."""
    for coordinate in itertools.product(range(2), range(2)):
        mesh = MeshInfo((2, 2), ("a", "b"), coordinate)
        mixed = Layout(mesh, shard={"a": -1, "b": 0}, split={"b": [3, 2, 2, 1]})
        plain = Layout(mesh, shard={"a": 0, "b": 0}, split={"b": [3, 2, 2, 1]})
        assert mixed.region((8,)) == plain.region((8,)), coordinate
    # on 2-d samples the same layout shards two axes: then sizes are missing for 'a', said at region()
    layout = Layout(MeshInfo((2, 2), ("a", "b"), (0, 0)), shard={"a": -1, "b": 0}, split={"b": [1, 1]})
    with pytest.raises(LayoutError, match="no sizes for mesh dim 'a'"):
        layout.region((2, 4))
