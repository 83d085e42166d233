"""Layouts from the model's input spec: DTensor placements (the exact inverse of
``dtensor_placements``), real DTensors and their specs, and PhysicsNeMo ShardTensor sharding shapes."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dali_mesh import Layout, MeshInfo
from dali_mesh.partition import BOUNDARIES, SPLITS, split_sizes
from dali_mesh.partition import LayoutError


# ---- random valid layouts ----------------------------------------------------------------------------
@st.composite
def layouts(draw, split=None):
    """A layout on a 1-3 dim mesh: every mesh dim shards a sample axis (two may nest on one), is a
    batch dim or a replica; random halo, boundary, crop and fill value ride along."""
    mesh_ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.integers(1, 4)) for _ in range(mesh_ndim))
    names = tuple(draw(st.permutations(["dp", "mp", "tp", "sp"]))[:mesh_ndim])
    coordinate = tuple(draw(st.integers(0, s - 1)) for s in shape)
    mesh = MeshInfo(shape, names, coordinate)
    ndim = draw(st.integers(1, 3))
    roles = [draw(st.sampled_from(["shard", "batch", "replica"])) for _ in range(mesh_ndim)]
    shard = {names[d]: draw(st.integers(0, ndim - 1)) for d in range(mesh_ndim) if roles[d] == "shard"}
    batch = [names[d] for d in range(mesh_ndim) if roles[d] == "batch"]
    halo = draw(st.one_of(st.integers(0, 2), st.dictionaries(st.integers(0, ndim - 1), st.integers(0, 2))))
    boundary = draw(st.one_of(st.sampled_from(BOUNDARIES),
                              st.dictionaries(st.integers(0, ndim - 1), st.sampled_from(BOUNDARIES))))
    fill_value = draw(st.sampled_from([0, -1, 2.5]))
    crop = draw(st.one_of(st.none(), st.lists(st.one_of(st.none(), st.tuples(st.integers(0, 1), st.integers(2, 5))),
                                              min_size=ndim, max_size=ndim)))
    kwargs = dict(shard=shard, batch=batch, halo=halo, boundary=boundary, fill_value=fill_value, crop=crop)
    return Layout(mesh, **kwargs), ndim, kwargs


@settings(max_examples=150, deadline=None)
@given(layouts())
def test_round_trip_through_plain_placements(case):
    layout, ndim, kwargs = case
    spec = layout.placement_spec(ndim, halo_stripped=True)
    back = Layout.from_placements(layout.mesh, spec, halo=kwargs["halo"], boundary=kwargs["boundary"],
                                  fill_value=kwargs["fill_value"], crop=kwargs["crop"])
    assert back == layout and hash(back) == hash(layout)
    assert back.batch_dims == layout.batch_dims and back.replica_dims == layout.replica_dims
    sample = tuple(range(5, 5 + ndim))
    assert back.regions(sample) == layout.regions(sample)


@settings(max_examples=60, deadline=None)
@given(layouts())
def test_round_trip_through_torch_placements(case):
    pytest.importorskip("torch")
    layout, ndim, kwargs = case
    placements = layout.dtensor_placements(ndim, halo_stripped=True)
    back = Layout.from_placements(layout.mesh, placements, halo=kwargs["halo"], boundary=kwargs["boundary"],
                                  fill_value=kwargs["fill_value"], crop=kwargs["crop"])
    assert back == layout
    assert back.dtensor_placements(ndim, halo_stripped=True) == placements


def test_nested_dims_keep_dtensor_order_and_lead_axes():
    mesh = MeshInfo((2, 2, 3), ("dp", "a", "b"), (1, 0, 2))
    spec = (("shard", 0), ("shard", 3), ("shard", 3))  # batch, steps, then sample axes 0..
    layout = Layout.from_placements(mesh, spec, lead_axes=1)
    assert layout == Layout(mesh, shard={"a": 1, "b": 1}, batch="dp")
    assert layout.placement_spec(2, lead_axes=1) == spec
    # outer a (2) splits 11 into 6, 5; inner b (3) splits 6 into 2, 2, 2: coordinate (0, 2) owns 4:6
    assert layout.region((4, 11)).start == (0, 4) and layout.region((4, 11)).stop == (4, 6)


def test_unbatched_tensors_and_the_batch_argument():
    mesh = MeshInfo((2, 4), ("dp", "mp"), (1, 3))
    assert Layout.from_placements(mesh, [("replicate", None), ("shard", 1)], batched=False) == \
        Layout(mesh, shard={"mp": 1}, batch="dp")
    mesh3 = MeshInfo((2, 2, 2), ("dp", "tp", "mp"))
    spec = [("replicate", None), ("replicate", None), ("shard", 0)]
    with pytest.raises(LayoutError, match="batch is required"):
        Layout.from_placements(mesh3, spec, batched=False)
    assert Layout.from_placements(mesh3, spec, batched=False, batch="dp").replica_dims == ("tp",)
    # batched: replicated dims are replicas, the Shard(0) dims are the batch dims
    back = Layout.from_placements(mesh3, [("shard", 0), ("replicate", None), ("shard", 2)], batch="dp")
    assert back.batch_dims == ("dp",) and back.replica_dims == ("tp",) and back.shard_dims == {"mp": 1}


def test_negative_shard_dims_need_ndim():
    mesh = MeshInfo((2, 4), ("dp", "mp"))
    spec = [("shard", 0), ("shard", -1)]
    with pytest.raises(LayoutError, match=r"placement \('shard', -1\) of mesh dim 'mp' counts from the end: pass ndim"):
        Layout.from_placements(mesh, spec)
    assert Layout.from_placements(mesh, spec, ndim=3).shard_dims == {"mp": 1}
    with pytest.raises(LayoutError, match="out of range for a tensor of 3 dims"):
        Layout.from_placements(mesh, [("shard", 0), ("shard", 3)], ndim=3)


def test_refused_placements_are_named():
    torch = pytest.importorskip("torch")
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    del torch
    mesh = MeshInfo((2, 4), ("dp", "mp"))
    with pytest.raises(LayoutError, match=r"placement Partial\(sum\) of mesh dim 'mp' is Partial"):
        Layout.from_placements(mesh, [Shard(0), Partial()])
    with pytest.raises(LayoutError, match=r"placement _StridedShard\(dim=1, sf=2\) of mesh dim 'dp' is a _StridedShard"):
        Layout.from_placements(mesh, [_StridedShard(1, split_factor=2), Shard(2)])
    with pytest.raises(LayoutError, match=r"Shard\(0\) of mesh dim 'mp' shards the batch axis, but 'mp' is not "
                                          r"a batch dim \(batch=\['dp'\]\): a model-parallel dim"):
        Layout.from_placements(mesh, [Shard(0), Shard(0)], batch="dp")
    with pytest.raises(LayoutError, match=r"batch dim 'dp' has no Shard\(0\) placement"):
        Layout.from_placements(mesh, [Replicate(), Shard(1)], batch="dp")
    with pytest.raises(LayoutError, match="shards lead axis 0"):
        Layout.from_placements(mesh, [Shard(0), Shard(1)], lead_axes=1)
    with pytest.raises(LayoutError, match=r"1 placements \[Shard\(dim=0\)\] for a mesh of 2 dims"):
        Layout.from_placements(mesh, [Shard(0)])
    with pytest.raises(LayoutError, match="of mesh dim 'dp' is not Shard"):
        Layout.from_placements(mesh, ["S(0)", Shard(1)])
    with pytest.raises(LayoutError, match="mesh must be a MeshInfo or a torch DeviceMesh"):
        Layout.from_placements((2, 4), [Shard(0), Shard(1)])


def test_from_a_real_dtensor_and_its_spec():
    """A DTensor on a 2 x 4 mesh, built in one process with torch's fake process group (no
    communication): its layout's regions are its local shards, by torch's own shard math."""
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=6, world_size=8)
    try:
        device_mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "mp"))
        global_shape = (4, 3, 721)
        # Shard(-1): resolved with the tensor's ndim
        for placements in ([Shard(0), Shard(2)], [Replicate(), Shard(1)], [Shard(0), Shard(-1)]):
            local_shape, offset = _compute_local_shape_and_global_offset(global_shape, (2, 4), [1, 2], placements)
            t = DTensor.from_local(torch.zeros(local_shape), device_mesh, placements, run_check=False,
                                   shape=global_shape, stride=(3 * 721, 721, 1))
            for source in (t, t._spec):
                layout = Layout.from_dtensor(source)
                assert layout.mesh == MeshInfo((2, 4), ("dp", "mp"), (1, 2)) and layout.split == "chunk"
                region = layout.region(global_shape[1:])
                assert region.shape == tuple(local_shape[1:]) and region.start == tuple(offset[1:])
                if placements[0] == Shard(0):
                    assert layout.batch_dims == ("dp",)
                assert layout.dtensor_placements(2) == [Shard(p.dim % 3) if isinstance(p, Shard) else p
                                                        for p in placements]
        with pytest.raises(LayoutError, match="a DTensor is split by torch.chunk"):
            Layout.from_dtensor(t, split="even")
    finally:
        dist.destroy_process_group()
    with pytest.raises(LayoutError, match="from_dtensor needs a DTensor or DTensorSpec, got Tensor"):
        Layout.from_dtensor(torch.zeros(3))


# ---- equality --------------------------------------------------------------------------------------
def test_equality_compares_normalised_fields():
    mesh = MeshInfo((2, 4), ("dp", "mp"))
    base = Layout(mesh, shard={"mp": 1})
    same = [Layout(mesh, shard={"mp": 1}, batch="dp", halo={1: 0}, boundary={0: "constant"}, fill_value=0.0),
            Layout(mesh, shard={1: np.int64(1)}, batch=["dp"], halo={}, boundary={})]
    for other in same:
        assert other == base and hash(other) == hash(base)
    assert Layout(mesh, shard={"mp": 1}, crop=[None, slice(None, 5)]) == Layout(mesh, shard={"mp": 1}, crop=[(0, None), (0, 5)])
    different = [Layout(mesh, shard={"mp": 0}), Layout(mesh, shard={"mp": 1}, halo=1),
                 Layout(mesh, shard={"mp": 1}, boundary="edge"), Layout(mesh, shard={"mp": 1}, fill_value=1),
                 Layout(mesh, shard={"mp": 1}, split="even"), Layout(mesh.with_coordinate((1, 0)), shard={"mp": 1}),
                 Layout(mesh, shard={"mp": 1}, batch=[]), Layout(mesh, shard={"mp": 1}, split={"mp": [1, 1, 1, 1]}),
                 Layout(mesh, shard={"mp": 1}, crop=[None, (0, 4)])]
    for other in different:
        assert other != base
    assert len(set(different)) == len(different)
    assert Layout(mesh, shard={"mp": 1}, fill_value=float("nan")) == Layout(mesh, shard={"mp": 1}, fill_value=float("nan"))


# ---- PhysicsNeMo ShardTensor sharding shapes ---------------------------------------------------------
def physicsnemo_sharding_shapes(layout, global_shape, batch_size):
    """What ShardTensorSpec.sharding_shapes() holds: per sharded mesh dim, the local shapes of the ranks
    along it (this rank's coordinate elsewhere); the batch dims too (each rank's batch)."""
    out = dict(layout.sharding_shapes(global_shape, batch_size=batch_size))
    for name in layout.batch_dims:
        d = layout.mesh.dim_index(name)
        own = (batch_size,) + layout.region(global_shape).shape
        out[d] = tuple(own for _ in range(layout.mesh.shape[d]))
    return out


@pytest.mark.parametrize("rule", SPLITS)
@pytest.mark.parametrize("n", [5, 6, 8, 721])
def test_sharding_shapes_equal_to_a_rule_give_the_rule(rule, n):
    mesh = MeshInfo((2, 4), ("dp", "mp"), (1, 2))
    layout = Layout(mesh, shard={"mp": 1}, split=rule)
    shapes = physicsnemo_sharding_shapes(layout, (3, n), batch_size=2)
    back = Layout.from_sharding_shapes(mesh, layout.placement_spec(2, any_split=True), shapes)
    first = next(r for r in SPLITS if split_sizes(n, 4, r) == split_sizes(n, 4, rule))
    assert back.split == first  # chunk wins a tie, so DTensor output stays possible
    assert back.regions((3, n)) == layout.regions((3, n))


def test_sharding_shapes_of_no_rule_give_explicit_sizes():
    mesh = MeshInfo((2, 4), ("dp", "mp"), (0, 3))
    shapes = {0: [(2, 3, 7)] * 2, 1: [(2, 3, 1), (2, 3, 3), (2, 3, 0), (2, 3, 3)]}
    back = Layout.from_sharding_shapes(mesh, [("shard", 0), ("shard", 2)], shapes, halo={1: 1})
    assert back.split == "explicit" and back.split_sizes == {"mp": (1, 3, 0, 3)}
    assert back == Layout(mesh, shard={"mp": 1}, split={"mp": [1, 3, 0, 3]}, halo={1: 1})
    # the empty shard at the running sum, as ShardTensor.offsets() (tests/torch/test_physicsnemo_real.py)
    assert [(r.start[1], r.stop[1]) for r in back.regions((3, 7))[:4]] == [(0, 1), (1, 4), (4, 4), (4, 7)]


def test_from_shard_tensor_reads_the_spec():
    class Spec:  # the three things of a ShardTensorSpec that are read
        mesh = MeshInfo((4,), ("mp",), (2,))
        placements = (("shard", 1),)

        def sharding_shapes(self):
            return {0: ((2, 2, 5), (2, 2, 5), (2, 4, 5), (2, 2, 5))}

    class FakeShardTensor:
        _spec = Spec()

    layout = Layout.from_shard_tensor(FakeShardTensor())
    assert layout.split_sizes == {"mp": (2, 2, 4, 2)} and layout.region((10, 5)).start == (4, 0)
    assert Layout.from_dtensor(FakeShardTensor()) == layout
    with pytest.raises(LayoutError, match="needs a PhysicsNeMo ShardTensor"):
        Layout.from_shard_tensor(object())


def test_sharding_shapes_errors():
    mesh = MeshInfo((2, 2, 2), ("dp", "a", "b"))
    with pytest.raises(LayoutError, match=r"mesh dims \['a', 'b'\] shard axis 0 together: ShardTensor"):
        Layout.from_sharding_shapes(mesh, [("shard", 0), ("shard", 1), ("shard", 1)],
                                    {1: [(1, 3), (1, 3)], 2: [(1, 3), (1, 3)]})
    mesh = MeshInfo((2, 2), ("dp", "mp"))
    spec = [("shard", 0), ("shard", 1)]
    with pytest.raises(LayoutError, match=r"batch dim 'dp' give the ranks batch sizes \[1, 2\]"):
        Layout.from_sharding_shapes(mesh, spec, {0: [(1, 3), (2, 3)], 1: [(1, 3), (1, 3)]})
    with pytest.raises(LayoutError, match="no entry for mesh dim 'mp'"):
        Layout.from_sharding_shapes(mesh, spec, {})
    with pytest.raises(LayoutError, match="hold 3 shapes for 2 ranks"):
        Layout.from_sharding_shapes(mesh, spec, {1: [(1, 3)] * 3})
    with pytest.raises(LayoutError, match="the split comes from sharding_shapes"):
        Layout.from_sharding_shapes(mesh, spec, {1: [(1, 3)] * 2}, split="even")


def test_round_trip_with_explicit_sizes_and_sharding_shapes():
    mesh = MeshInfo((2, 3), ("dp", "mp"), (1, 1))
    layout = Layout(mesh, shard={"mp": 0}, split={"mp": [4, 1, 2]}, halo=1, boundary="edge")
    spec = layout.placement_spec(2, any_split=True, halo_stripped=True)
    assert Layout.from_placements(mesh, spec, split={"mp": [4, 1, 2]}, halo=1, boundary="edge") == layout
    shapes = physicsnemo_sharding_shapes(layout, (7, 3), batch_size=5)
    assert shapes[1] == ((5, 4, 3), (5, 1, 3), (5, 2, 3))
    assert Layout.from_sharding_shapes(mesh, spec, shapes, halo=1, boundary="edge") == layout


# ---- explicit sizes equal to chunk's give DTensor placements; negative axes round trip -------------------
def test_explicit_sizes_equal_to_chunk_allow_dtensor():
    mesh = MeshInfo((4,), ("mp",), (1,))
    layout = Layout(mesh, shard={"mp": 1}, split={"mp": [181, 181, 181, 178]})
    assert layout.explicit_matches((3, 721)) and not layout.explicit_matches((3, 721), "even")
    assert layout.placement_spec(2, global_shape=(3, 721)) == (("shard", 2),)
    with pytest.raises(LayoutError, match=r"torch.chunk, which gives \{'mp': \[181, 181, 181, 179\]\} for sample shape \(3, 722\)"):
        layout.placement_spec(2, global_shape=(3, 722))
    with pytest.raises(LayoutError, match="pass global_shape="):
        layout.placement_spec(2)
    other = Layout(mesh, shard={"mp": 1}, split={"mp": [180, 181, 181, 179]})
    with pytest.raises(LayoutError, match="no DTensor for explicit split sizes"):
        other.placement_spec(2, global_shape=(3, 721))
    # nested mesh dims on one axis: chunk of 7 over 2 then 2 is 2,2 | 2,1; a crop is the domain
    nested = Layout(MeshInfo((2, 2), ("a", "b"), (0, 1)), shard={"a": 0, "b": 0}, split={"b": [2, 2, 2, 1]},
                    crop=[(1, None)])
    assert nested.explicit_matches((8,)) and not nested.explicit_matches((9,))
    chunk = Layout(MeshInfo((2, 2), ("a", "b"), (0, 1)), shard={"a": 0, "b": 0}, crop=[(1, None)])
    assert [r.shape for r in nested.regions((8,))] == [r.shape for r in chunk.regions((8,))]


@pytest.mark.parametrize("ndim", [2, 3])
def test_from_placements_round_trip_negative_axes(ndim):
    mesh = MeshInfo((2, 2), ("dp", "mp"), (1, 0))
    layout = Layout(mesh, shard={"mp": -1}, batch="dp", halo={-1: 1}, boundary={-1: "periodic"})
    back = Layout.from_placements(mesh, layout.dtensor_placements(ndim, halo_stripped=True),
                                  halo={ndim - 1: 1}, boundary={ndim - 1: "periodic"})
    assert back == layout.normalized(ndim) and back.same_as(layout, ndim)
    assert back != layout  # equal only for a known ndim: -1 is another axis for another ndim
    assert not back.same_as(layout, ndim + 1)
    shape = (6,) * ndim
    assert back.regions(shape) == layout.regions(shape)
    with pytest.raises(LayoutError, match="out of range"):
        Layout(mesh, shard={"mp": -4}, batch="dp").normalized(3)
