"""Partition math against its oracles: torch's DTensor shard math, PhysicsNeMo's and numpy's split
rules, np.pad for every boundary mode, and tiling of the domain by the owned regions."""
import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dali_mesh import Layout, MeshInfo, Region
from dali_mesh.partition import (
    BOUNDARIES,
    SPLITS,
    LayoutError,
    boundary_index,
    shard_extent,
    split_sizes,
    take_window,
)

from tests.helpers import NP_MODE, np_pad_window


# ---- reference split rules, written from their sources ------------------------------------------
def physicsnemo_compute_split_shapes(size: int, num_chunks: int) -> list[int]:
    """PhysicsNeMo's ``compute_split_shapes`` (physicsnemo/distributed/utils.py)."""
    if num_chunks == 1:
        return [size]
    chunk_size = (size + num_chunks - 1) // num_chunks
    last_chunk_size = max(0, size - chunk_size * (num_chunks - 1))
    if last_chunk_size == 0:
        chunk_size = size // num_chunks
        last_chunk_size = size - chunk_size * (num_chunks - 1)
    return [chunk_size] * (num_chunks - 1) + [last_chunk_size]


def torch_chunk_sizes(n: int, k: int) -> list[int]:
    torch = pytest.importorskip("torch")
    sizes = [len(c) for c in torch.chunk(torch.arange(n), k)]
    return sizes + [0] * (k - len(sizes))


def reference_sizes(n, k, rule):
    if rule == "chunk":
        return torch_chunk_sizes(n, k)
    if rule == "physicsnemo":
        return physicsnemo_compute_split_shapes(n, k)
    return [len(a) for a in np.array_split(np.arange(n), k)]


@pytest.mark.parametrize("rule", SPLITS)
def test_split_sizes_match_references(rule):
    for n in range(0, 40):
        for k in range(1, 9):
            assert list(split_sizes(n, k, rule)) == reference_sizes(n, k, rule), (n, k, rule)
    # DESIGN.md's table
    table = {"chunk": [(2, 2, 1, 0), (2, 2, 2, 0), (181, 181, 181, 178)],
             "physicsnemo": [(1, 1, 1, 2), (1, 1, 1, 3), (181, 181, 181, 178)],
             "even": [(2, 1, 1, 1), (2, 2, 1, 1), (181, 180, 180, 180)]}
    assert [split_sizes(n, 4, rule) for n in (5, 6, 721)] == table[rule]


@pytest.mark.parametrize("rule", SPLITS)
def test_shard_extent_offsets_are_cumulative(rule):
    for n, k in [(0, 3), (7, 3), (721, 4), (1, 8), (10**9 + 7, 1 << 20)]:
        if k > 64:  # spot check large k without walking every shard
            for i in (0, 1, k // 2, k - 2, k - 1):
                off, size = shard_extent(n, k, i, rule)
                assert 0 <= off <= n and size >= 0 and off + size <= n
            continue
        offset = 0
        for i in range(k):
            off, size = shard_extent(n, k, i, rule)
            if size:
                assert off == offset
            offset += size
        assert offset == n


# ---- DTensor agreement (split="chunk") ------------------------------------------------------------
@st.composite
def dtensor_cases(draw):
    ndim = draw(st.integers(1, 3))
    global_shape = tuple(draw(st.lists(st.integers(1, 13), min_size=ndim, max_size=ndim)))
    mesh_ndim = draw(st.integers(1, 3))
    mesh_shape = tuple(draw(st.lists(st.integers(1, 5), min_size=mesh_ndim, max_size=mesh_ndim)))
    # each mesh dim shards an axis (possibly the same one as another mesh dim) or nothing
    axes = tuple(draw(st.lists(st.integers(-1, ndim - 1), min_size=mesh_ndim, max_size=mesh_ndim)))
    coordinate = tuple(draw(st.integers(0, s - 1)) for s in mesh_shape)
    return global_shape, mesh_shape, axes, coordinate


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dtensor_cases())
def test_chunk_matches_torch_dtensor(case):
    pytest.importorskip("torch")
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

    global_shape, mesh_shape, axes, coordinate = case
    placements = [Shard(a) if a >= 0 else Replicate() for a in axes]
    local_shape, offset = _compute_local_shape_and_global_offset(global_shape, mesh_shape, list(coordinate), placements)
    names = tuple(f"m{i}" for i in range(len(mesh_shape)))
    mesh = MeshInfo(mesh_shape, names, coordinate)
    shard = {n: a for n, a in zip(names, axes) if a >= 0}
    free = [n for n, a in zip(names, axes) if a < 0]
    layout = Layout(mesh, shard=shard, batch=free, split="chunk")
    region = layout.region(global_shape)
    assert region.shape == tuple(local_shape)
    assert region.start == tuple(offset)
    assert region.window_start == region.start and region.window_stop == region.stop


def test_empty_chunk_shard_sits_at_the_end():
    mesh = MeshInfo((4,), ("mp",), (3,))
    region = Layout(mesh, shard={"mp": 0}, halo=2, boundary="periodic").region((5,))
    assert region.start == region.stop == (5,)
    assert region.window_start == region.window_stop == (5,)  # no halo on an empty shard
    assert take_window(np.arange(5), region).shape == (0,)


# ---- nested splits for the other rules -----------------------------------------------------------
def nested_reference(n, counts, coords, rule):
    offset = 0
    for k, c in zip(counts, coords):
        sizes = reference_sizes(n, k, rule)
        offset += sum(sizes[:c])
        n = sizes[c]
    return offset, n


@pytest.mark.parametrize("rule", ["physicsnemo", "even"])
def test_two_mesh_dims_on_one_axis_nest_outer_first(rule):
    for n in range(1, 30):
        for counts in [(2, 3), (3, 2), (4, 4), (1, 5)]:
            mesh = MeshInfo(counts, ("outer", "inner"))
            layout = Layout(mesh, shard={"inner": 0, "outer": 0}, split=rule)
            for coords in itertools.product(*(range(k) for k in counts)):
                region = layout.region((n,), coords)
                offset, size = nested_reference(n, counts, coords, rule)
                assert region.shape == (size,)
                if size or rule != "chunk":  # physicsnemo/even: an empty shard at the running sum
                    assert region.start == (offset,)
                else:  # chunk: at the axis end, as torch's DTensor offsets
                    assert region.start == (n,)


# ---- tiling ----------------------------------------------------------------------------------------
TILING_CASES = [
    ((4,), ("mp",), {"mp": 0}, (10,)),
    ((3,), ("mp",), {"mp": -1}, (2, 7)),
    ((2, 3), ("dp", "mp"), {"mp": 1}, (3, 11, 5)),
    ((2, 3), ("h", "w"), {"h": 0, "w": 1}, (7, 8)),
    ((2, 2), ("a", "b"), {"a": 1, "b": 1}, (2, 9)),
    ((2, 2, 3), ("dp", "h", "w"), {"h": 1, "w": 2}, (4, 5, 13)),
    ((3, 2, 2), ("h", "w", "d"), {"h": 0, "w": 1, "d": 2}, (2, 3, 4)),
    ((5, 3), ("h", "w"), {"h": 0, "w": 0}, (11,)),
]


@pytest.mark.parametrize("rule", SPLITS)
@pytest.mark.parametrize("mesh_shape,names,shard,shape", TILING_CASES)
@pytest.mark.parametrize("crop", [False, True])
def test_owned_regions_tile_the_domain(rule, mesh_shape, names, shard, shape, crop):
    mesh = MeshInfo(mesh_shape, names)
    free = [n for n in names if n not in shard]
    crop_box = tuple((min(1, s - 1), s) for s in shape) if crop else None
    layout = Layout(mesh, shard=shard, batch=free[:1], crop=crop_box, halo=1, boundary="periodic", split=rule)
    count = np.zeros(shape, dtype=int)
    groups = {}
    for coordinate, region in zip(mesh.coordinates(), layout.regions(shape)):
        # replicas and other sample groups have the same regions: count one copy of each
        key = tuple(c for c, n in zip(coordinate, names) if n in shard)
        if key in groups:
            assert groups[key] == region
            continue
        groups[key] = region
        count[tuple(slice(a, b) for a, b in zip(region.start, region.stop))] += 1
    domain = tuple(slice(a, b) for a, b in zip(*layout.domain(shape)))
    expected = np.zeros(shape, dtype=int)
    expected[domain] = 1
    np.testing.assert_array_equal(count, expected)


# ---- windows against np.pad -------------------------------------------------------------------------
@pytest.mark.parametrize("mode", BOUNDARIES)
def test_boundary_index_matches_np_pad(mode):
    if mode == "trim":
        assert boundary_index(np.arange(-2, 6), 4, mode).tolist() == [-1, -1, 0, 1, 2, 3, -1, -1]
        return
    for n in range(1, 7):
        for pad in (0, 1, n - 1, n, 3 * n + 2):
            x = np.arange(n)
            kwargs = {"constant_values": -1} if mode == "constant" else {}
            expected = np.pad(x, (pad, pad), mode=NP_MODE[mode], **kwargs)
            got = boundary_index(np.arange(-pad, n + pad), n, mode)
            np.testing.assert_array_equal(got, expected, err_msg=f"{mode} n={n} pad={pad}")
    assert isinstance(boundary_index(-1, 3, mode), int)


@st.composite
def window_cases(draw):
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=ndim, max_size=ndim)))
    k = draw(st.integers(1, 4))
    axis = draw(st.integers(0, ndim - 1))
    coordinate = draw(st.integers(0, k - 1))
    halo = {a: (draw(st.integers(0, 12)), draw(st.integers(0, 12))) for a in range(ndim)}
    boundary = {a: draw(st.sampled_from(BOUNDARIES)) for a in range(ndim)}
    crop = None
    if draw(st.booleans()):
        crop = []
        for s in shape:
            lo = draw(st.integers(0, s - 1))
            crop.append((lo, draw(st.integers(lo + 1, s))))
    split = draw(st.sampled_from(SPLITS))
    fill = draw(st.sampled_from([0, -7, 3.5]))
    return shape, k, axis, coordinate, halo, boundary, crop, split, fill


@settings(max_examples=1500, deadline=None)
@given(window_cases())
def test_window_equals_np_pad(case):
    shape, k, axis, coordinate, halo, boundary, crop, split, fill = case
    mesh = MeshInfo((k,), ("mp",), (coordinate,))
    layout = Layout(mesh, shard={"mp": axis}, crop=crop, halo=halo, boundary=boundary, fill_value=fill, split=split)
    region = layout.region(shape)
    sample = np.arange(math.prod(shape), dtype=np.float64).reshape(shape) + 100
    got = take_window(sample, region)
    assert got.shape == region.window_shape
    if 0 in region.shape:  # empty owned region: no halo, window is the owned region
        assert region.window_start == region.start and region.window_stop == region.stop
        return
    for a in range(len(shape)):
        lo, hi = halo[a]
        if boundary[a] == "trim":
            assert region.window_start[a] == max(region.start[a] - lo, region.domain_start[a])
            assert region.window_stop[a] == min(region.stop[a] + hi, region.domain_stop[a])
        else:
            assert region.window_start[a] == region.start[a] - lo
            assert region.window_stop[a] == region.stop[a] + hi
    domain = sample[tuple(slice(a, b) for a, b in zip(region.domain_start, region.domain_stop))]
    np.testing.assert_array_equal(got, np_pad_window(domain, region))
    # the owned cells sit where owned_in_window says
    owned = sample[tuple(slice(a, b) for a, b in zip(region.start, region.stop))]
    np.testing.assert_array_equal(got[region.owned_in_window], owned)


def test_periodic_halo_wraps_several_times():
    mesh = MeshInfo((2,), ("mp",), (1,))
    region = Layout(mesh, shard={"mp": 0}, halo=7, boundary="periodic").region((3,))
    assert (region.start, region.stop) == ((2,), (3,))
    np.testing.assert_array_equal(take_window(np.array([10, 11, 12]), region),
                                  np.pad(np.array([10, 11, 12]), 9, mode="wrap")[9 + 2 - 7: 9 + 3 + 7])


def test_halo_and_boundary_per_axis_forms():
    mesh = MeshInfo((2,), ("mp",), (0,))
    a = Layout(mesh, shard={"mp": 1}, halo=[0, 2, (1, 3)], boundary=["edge", "periodic", "reflect"])
    b = Layout(mesh, shard={"mp": -2}, halo={1: 2, -1: (1, 3)}, boundary={0: "edge", 1: "periodic", 2: "reflect"})
    assert a.region((4, 6, 8)) == b.region((4, 6, 8))
    r = a.region((4, 6, 8))
    assert r.window_start == (0, -2, -1) and r.window_stop == (4, 5, 11)
    assert r.halo == ((0, 0), (2, 2), (1, 3))


# ---- DTensor placements and ShardTensor shapes ------------------------------------------------------
def test_placement_spec():
    mesh = MeshInfo((2, 2, 3), ("dp", "tp", "mp"))
    layout = Layout(mesh, shard={"mp": -1}, batch="dp")
    assert layout.replica_dims == ("tp",)
    assert layout.placement_spec(3) == (("shard", 0), ("replicate", None), ("shard", 3))
    torch = pytest.importorskip("torch")
    from torch.distributed.tensor import Replicate, Shard

    assert layout.dtensor_placements(3) == [Shard(0), Replicate(), Shard(3)]
    del torch


@pytest.mark.parametrize("kwargs,match", [
    ({"split": "even"}, "no DTensor for split='even'"),
    ({"halo": {1: 1}}, "no DTensor for a window with halo"),
])
def test_no_dtensor_that_lies(kwargs, match):
    layout = Layout(MeshInfo((2, 2), ("dp", "mp")), shard={"mp": 1}, **kwargs)
    with pytest.raises(LayoutError, match=match):
        layout.placement_spec(3)


def test_sharding_shapes():
    mesh = MeshInfo((2, 4), ("h", "w"), (1, 2))
    layout = Layout(mesh, shard={"h": 0, "w": 1}, split="physicsnemo")
    shapes = layout.sharding_shapes((5, 6))
    # 5 over 2 (physicsnemo): 3, 2; 6 over 4: 1, 1, 1, 3; this rank is (1, 2)
    assert shapes == {0: ((3, 1), (2, 1)), 1: ((2, 1), (2, 1), (2, 1), (2, 3))}
    assert layout.sharding_shapes((5, 6), batch_size=2)[0] == ((2, 3, 1), (2, 2, 1))


# ---- sample groups --------------------------------------------------------------------------------
def test_batch_dims_default_and_index():
    mesh = MeshInfo((2, 3, 2), ("dp", "mp", "pp"), (1, 2, 1))
    layout = Layout(mesh, shard={"mp": 1}, batch=["pp", "dp"])
    assert layout.batch_dims == ("dp", "pp")  # mesh order
    assert layout.num_batch_groups == 4 and layout.batch_index == 3
    assert Layout(MeshInfo((2, 4), ("dp", "mp"), (1, 0)), shard={"mp": 0}).batch_index == 1
    only_shards = Layout(MeshInfo((4,), ("mp",)), shard={"mp": 0})
    assert only_shards.batch_dims == () and only_shards.num_batch_groups == 1


def test_region_is_a_value():
    r = Region((0,), (4,), (1,), (3,), (0,), (4,), "periodic", 0)
    assert r.boundary == ("periodic",) and r.window_shape == (4,) and r.pads == ((0, 0),)
    assert hash(r) == hash(Region((0,), (4,), (1,), (3,), (0,), (4,), ("periodic",), 0))


def test_without_axis_keeps_the_regions_of_the_other_axes():
    """A 2-D variable beside (level, lat, lon) variables: the layout without axis 0 gives every rank
    the same (lat, lon) region, for random meshes, splits, crops, halos and boundaries."""
    import itertools

    from dali_mesh.partition import LayoutError
    from dali_mesh.partition.rules import BOUNDARIES, SPLITS

    rng = np.random.default_rng(16)
    checked = 0
    for _ in range(200):
        shape = (int(rng.integers(1, 5)), int(rng.integers(1, 30)), int(rng.integers(1, 30)))
        mesh_shape = (int(rng.integers(1, 3)), int(rng.integers(1, 5)), int(rng.integers(1, 4)))
        names = ("dp", "lat", "lon")
        halo = {1: int(rng.integers(0, 3)), 2: (int(rng.integers(0, 2)), int(rng.integers(0, 3)))}
        boundary = {1: str(rng.choice(BOUNDARIES)), 2: str(rng.choice(BOUNDARIES))}
        crop = [None, (0, shape[1] - int(rng.integers(0, shape[1]))), None] if rng.random() < 0.3 else None
        split = str(rng.choice(SPLITS))
        for coord in itertools.product(*(range(s) for s in mesh_shape)):
            mesh = MeshInfo(mesh_shape, names, coord)
            layout = Layout(mesh, shard={"lat": 1, "lon": -1}, batch="dp", crop=crop, halo=halo,
                            boundary=boundary, split=split)
            flat = layout.without_axis(0, 3)
            r3, r2 = layout.region(shape), flat.region(shape[1:])
            for field in ("domain_start", "domain_stop", "start", "stop", "window_start", "window_stop"):
                assert getattr(r2, field) == getattr(r3, field)[1:], (field, layout, coord)
            assert r2.boundary == r3.boundary[1:] and flat.batch_index == layout.batch_index
            checked += 1
    assert checked > 1000
    mesh = MeshInfo((2,), ("mp",), (0,))
    with pytest.raises(LayoutError, match="axis 0 is sharded by mesh dim 'mp'"):
        Layout(mesh, shard={"mp": 0}).without_axis(0, 3)
    with pytest.raises(LayoutError, match=r"axis 0 has a halo \(1, 1\)"):
        Layout(mesh, shard={"mp": 1}, halo=1).without_axis(0, 3)
    with pytest.raises(LayoutError, match="axis 0 is cropped"):
        Layout(mesh, shard={"mp": 1}, crop=[(0, 1), None, None]).without_axis(0, 3)
