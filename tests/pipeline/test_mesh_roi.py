"""Explicit shard sizes in the plugin: ``mesh_roi`` with ``split="explicit"`` (the C API through
ctypes, and the DALI operator in a CPU pipeline) equals :meth:`dali_mesh.Layout.region` for random
explicit layouts (nested mesh dims on one axis, crops, halos, every boundary rule, empty shards),
bad sizes are refused naming the values, and ``mesh_slice`` with an explicit layout equals
``take_window``. Random layouts by hypothesis (modest example counts: 2 shared cores)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dali_mesh import Layout, MeshInfo, partition
from dali_mesh import _kernels as K

I64_MAX = (1 << 63) - 1

needs_kernels = pytest.mark.skipif(not K.library_path().exists(),
                                   reason="libdali_mesh_kernels.so not built (pip install --no-build-isolation -e .)")


def _dali():
    """dali_mesh.fn with the plugin, or skip (DALI or the plugin missing)."""
    pytest.importorskip("nvidia.dali")
    import dali_mesh.fn as dfn

    if not dfn.PLUGIN_PATH.exists():
        pytest.skip("libdali_mesh.so not built (pip install --no-build-isolation -e .)")
    return dfn


def _random_sizes(draw, total, count):
    """`count` sizes >= 0 summing to `total` (zeros, hence empty shards, included)."""
    cuts = sorted(draw(st.lists(st.integers(0, total), min_size=count - 1, max_size=count - 1)))
    return [b - a for a, b in zip([0] + cuts, cuts + [total])]


@st.composite
def explicit_layouts(draw, max_ndim=4):
    """(layout, shape, fixed axes): a random explicit layout and a sample shape it fits. `fixed`:
    the axes whose length the sizes pin (sharded axes without a closed crop)."""
    ndim = draw(st.integers(1, max_ndim))
    shape = tuple(draw(st.integers(1, 12)) for _ in range(ndim))
    crop = None
    if draw(st.booleans()):
        crop = []
        for n in shape:
            kind = draw(st.sampled_from(["none", "closed", "open"]))
            if kind == "none":
                crop.append(None)
            else:
                s = draw(st.integers(0, n - 1))
                crop.append((s, None) if kind == "open" else (s, draw(st.integers(s + 1, n))))
    # mesh dims: each shards an axis (maybe one another dim shards too: nested) or is batch/replica
    mesh_ndim = draw(st.integers(1, 4))
    mesh_shape = tuple(draw(st.integers(1, 4)) for _ in range(mesh_ndim))
    names = tuple(f"m{i}" for i in range(mesh_ndim))
    negative = [draw(st.booleans()) for _ in range(ndim)]  # one spelling per axis (Layout groups by it)
    shard = {}
    for n in names:
        if draw(st.integers(0, 9)) < 7:
            shard[n] = draw(st.integers(0, ndim - 1))
    if not shard:
        shard[names[0]] = 0
    shard = {n: a - ndim if negative[a] else a for n, a in shard.items()}
    coordinate = tuple(draw(st.integers(0, k - 1)) for k in mesh_shape)
    mesh = MeshInfo(mesh_shape, names, coordinate)
    free = [n for n in names if n not in shard]
    # the domain length of each sharded axis; the combined shards of it are listed on its innermost dim
    d0, d1 = Layout(mesh, shard=shard, batch=free[:1] or None, crop=crop).domain(shape)
    groups: dict[int, list[str]] = {}
    for n, a in shard.items():
        groups.setdefault(a % ndim, []).append(n)
    split = {}
    for axis, dims in groups.items():
        count = math.prod(mesh_shape[names.index(n)] for n in dims)
        split[dims[-1]] = _random_sizes(draw, d1[axis] - d0[axis], count)
    halo = {a: (draw(st.integers(0, 3)), draw(st.integers(0, 8))) for a in range(ndim) if draw(st.booleans())}
    boundary = {a: draw(st.sampled_from(partition.BOUNDARIES)) for a in range(ndim)}
    layout = Layout(mesh, shard=shard, batch=free[:1] or None, split=split, crop=crop, halo=halo,
                    boundary=boundary, fill_value=draw(st.integers(-3, 3)))
    assert layout.split == "explicit"
    fixed = {a for a in groups if crop is None or crop[a] is None or crop[a][1] is None}
    return layout, shape, fixed


def _c_api(layout, shape, coordinate):
    ndim = len(shape)
    halo = layout.halo_pairs(ndim)
    start, stop = layout.domain(shape)
    counts, sizes = layout.split_sizes_flat()
    return K.mesh_roi(shape, mesh_shape=layout.mesh.shape, coordinate=coordinate,
                      shard_axes=layout.shard_axes(ndim), halo_lo=[h[0] for h in halo],
                      halo_hi=[h[1] for h in halo], boundary=layout.boundaries(ndim), split="explicit",
                      split_size_counts=counts, split_sizes=sizes, crop_start=list(start),
                      crop_stop=list(stop))


# ---- the C API -----------------------------------------------------------------------------------
@needs_kernels
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(explicit_layouts())
def test_c_api_equals_layout_region_for_every_rank(case):
    layout, shape, _ = case
    for c in layout.mesh.coordinates():
        region = layout.region(shape, c)
        ws, wsh = _c_api(layout, shape, c)
        assert (ws, wsh) == (region.window_start, region.window_shape), (
            f"{layout!r} shape {shape} coordinate {c}: C++ {ws} {wsh}, python {region.window_start} "
            f"{region.window_shape}")


@needs_kernels
def test_c_api_nested_dims_and_empty_shards_by_hand():
    # mesh (2, 3): both dims shard axis 0 (outer m0, inner m1): 6 combined shards, row-major
    mesh = MeshInfo((2, 3), ("m0", "m1"))
    sizes = [3, 0, 2, 4, 0, 1]
    layout = Layout(mesh, shard={"m0": 0, "m1": 0}, split={"m1": sizes}, halo=1)
    assert layout.split_sizes_flat() == ((0, 6), tuple(sizes))
    prefix = np.concatenate([[0], np.cumsum(sizes)])
    for c in mesh.coordinates():
        k = c[0] * 3 + c[1]
        ws, wsh = _c_api(layout, (10, 2), c)
        if sizes[k]:
            assert ws == (prefix[k] - 1, -1) and wsh == (sizes[k] + 2, 4), (c, ws, wsh)
        else:  # an empty shard (explicit sizes) sits at the running sum, as ShardTensor's, with no halo
            assert ws == (prefix[k], 0) and wsh == (0, 2), (c, ws, wsh)
        assert (ws, wsh) == (layout.region((10, 2), c).window_start, layout.region((10, 2), c).window_shape)


@needs_kernels
def test_c_api_sizes_near_int64_max():
    # an axis of 2**63 - 1 cells in two shards: offsets formed without overflow
    n = I64_MAX
    kw = dict(mesh_shape=[2], shard_axes=[0], halo_lo=[0], halo_hi=[0], boundary=["constant"],
              split="explicit", split_size_counts=[2], split_sizes=[n - 5, 5])
    assert K.mesh_roi((n, 3), coordinate=[0], **kw) == ((0, 0), (n - 5, 3))
    assert K.mesh_roi((n, 3), coordinate=[1], **kw) == ((n - 5, 0), (5, 3))
    # sizes whose sum passes 2**64 are refused by their true sum, not a wrapped one
    big = dict(kw, mesh_shape=[3], split_size_counts=[3], split_sizes=[n, n, 3])
    with pytest.raises(K.KernelsError, match=rf"sum to {2 * n + 3} but axis 0 has {n} cells"):
        K.mesh_roi((n, 3), coordinate=[0], **big)


_GOOD = dict(mesh_shape=[2, 4], coordinate=[1, 2], shard_axes=[-1, 1], halo_lo=[1], halo_hi=[1],
             boundary=["constant"], split="explicit", split_size_counts=[0, 4],
             split_sizes=[181, 181, 181, 178])
_BAD = [
    (dict(split_size_counts=[0, 3], split_sizes=[181, 181, 359]),
     r"gives 3 sizes \[181, 181, 359\] for mesh dim 1 but mesh dim 1 has 4 ranks: give one size per shard"),
    (dict(split_sizes=[181, 181, 181, 177]),
     r"split_sizes \[181, 181, 181, 177\] of mesh dim 1 sum to 720 but axis 1 has 721 cells"),
    (dict(split_sizes=[181, 181, -1, 360]),
     r"split_sizes \[181, 181, -1, 360\] of mesh dim 1 has the negative size -1"),
    (dict(split_size_counts=[4, 0]), r"mesh dim 0 shards no axis .* gives it 4 sizes"),
    (dict(split_size_counts=[0, 5]), r"split_size_counts \[0, 5\] does not match the 4 entries of split_sizes"),
    (dict(split_size_counts=[0, 2]), r"split_size_counts \[0, 2\] adds up to 2 but split_sizes has 4 entries"),
    (dict(split_size_counts=[-1, 5]), r"split_size_counts \[-1, 5\] does not match"),
    (dict(split="chunk"), r"given with a named split rule: explicit sizes need split \"explicit\""),
    (dict(split_size_counts=None, split_sizes=None),
     r"split \"explicit\" needs split_size_counts \(one per mesh dim\)"),
    # nested: m0 and m1 both shard axis 1; the sizes belong on the innermost, m1
    (dict(shard_axes=[1, 1], split_size_counts=[4, 0]), r"mesh dim 0 is an outer mesh dim of the nest sharding axis 1"),
    (dict(shard_axes=[1, 1]), r"mesh dims \[0, 1\] make 8 combined shards of axis 1: give one size per shard"),
]


@needs_kernels
@pytest.mark.parametrize("change, match", _BAD)
def test_c_api_refuses_bad_sizes(change, match):
    assert K.mesh_roi((3, 721, 10), **_GOOD) == ((-1, 361, -1), (5, 183, 12))
    with pytest.raises(K.KernelsError, match=match):
        K.mesh_roi((3, 721, 10), **{**_GOOD, **change})


@needs_kernels
def test_c_api_crop_sum_is_checked_against_the_crop():
    kw = dict(_GOOD, crop_start=[0, 10, 0], crop_stop=[-1, 731, -1])
    assert K.mesh_roi((3, 800, 10), **kw) == ((-1, 371, -1), (5, 183, 12))
    with pytest.raises(K.KernelsError, match=r"sum to 721 but axis 1 has 790 cells \(its crop\)"):
        K.mesh_roi((3, 800, 10), **dict(kw, crop_stop=[-1, -1, -1]))


# ---- the DALI operator -----------------------------------------------------------------------------
def _run(graph, batch):
    from nvidia.dali import fn, pipeline_def

    @pipeline_def(batch_size=len(batch), num_threads=1, device_id=None, exec_dynamic=True)
    def pipe():
        out = graph(fn.external_source(source=lambda: batch, batch=True))
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)

    p = pipe()
    p.build()
    outs = p.run()
    return [[np.array(o[i]) for i in range(len(batch))] for o in outs]


def _batch_shapes(rng, layout, shape, fixed):
    """Sample shapes for one batch: axes the sizes pin keep their length, the others may grow."""
    return [tuple(n if a in fixed else n + int(rng.integers(0, 3)) for a, n in enumerate(shape))
            for _ in range(3)]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(explicit_layouts(), st.integers(0, 2**32 - 1))
def test_operator_equals_layout_region_for_every_rank(case, seed):
    dfn = _dali()
    layout, shape, fixed = case
    ndim = len(shape)
    shapes = _batch_shapes(np.random.default_rng(seed), layout, shape, fixed)
    coords = list(layout.mesh.coordinates())[:8]
    graph = lambda s: [o for c in coords for o in dfn.mesh_roi(s, **dfn.mesh_roi_args(layout, ndim, c))]  # noqa: E731
    outs = _run(graph, [np.array(s, np.int64) for s in shapes])
    for k, c in enumerate(coords):
        for i, s in enumerate(shapes):
            region = layout.region(s, c)
            msg = f"{layout!r} shape {s} coordinate {c}"
            assert tuple(outs[2 * k][i]) == region.window_start, msg
            assert tuple(outs[2 * k + 1][i]) == region.window_shape, msg


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(explicit_layouts(max_ndim=3), st.integers(0, 2**32 - 1))
def test_mesh_slice_equals_take_window(case, seed):
    dfn = _dali()
    layout, shape, fixed = case
    ndim = len(shape)
    rng = np.random.default_rng(seed)
    xs = [rng.integers(-100, 100, s).astype(np.int32) for s in _batch_shapes(rng, layout, shape, fixed)]
    coords = list(layout.mesh.coordinates())[:6]
    outs = _run(lambda x: [dfn.mesh_slice(x, layout, ndim=ndim, coordinate=c) for c in coords], xs)
    for k, c in enumerate(coords):
        for i, x in enumerate(xs):
            ref = partition.take_window(x, layout.region(x.shape, c))
            np.testing.assert_array_equal(outs[k][i], ref, err_msg=f"{layout!r} coordinate {c} shape {x.shape}")


def test_mesh_roi_args_carry_the_sizes():
    dfn = _dali()
    mesh = MeshInfo((2, 2, 3), ("dp", "a", "b"), (1, 1, 2))
    layout = Layout(mesh, shard={"a": 0, "b": 0}, batch="dp", split={"b": [1, 2, 3, 0, 4, 5]})
    args = dfn.mesh_roi_args(layout, 2)
    assert args["split"] == "explicit"
    assert args["split_size_counts"] == [0, 0, 6] and args["split_sizes"] == [1, 2, 3, 0, 4, 5]
    # rank (a=1, b=2): combined shard 5, cells 10:15
    out = _run(lambda s: dfn.mesh_roi(s, **args), [np.array([15, 4], np.int64)])
    assert tuple(out[0][0]) == (10, 0) and tuple(out[1][0]) == (5, 4)


@pytest.mark.parametrize("change, match", [
    (dict(split_size_counts=[0, 3], split_sizes=[181, 181, 359]), "mesh dim 1 has 4 ranks"),
    (dict(split_sizes=[181, 181, -1, 361]), "negative size -1"),
    (dict(split_size_counts=[4, 0]), "mesh dim 0 shards no axis"),
    (dict(split="chunk"), "explicit sizes need split"),
    ({"split_size_counts": None, "split_sizes": None}, r"split \"explicit\" needs split_size_counts"),
])
def test_operator_refuses_bad_sizes_at_build(change, match):
    dfn = _dali()
    kw = {k: v for k, v in {**_GOOD, **change}.items()}
    kw["boundary"] = kw["boundary"][0]
    with pytest.raises(RuntimeError, match=match):
        _run(lambda s: dfn.mesh_roi(s, **kw), [np.array([3, 721, 10], np.int64)])


def test_operator_takes_int64_sizes():
    # the sizes travel as an int64 vector argument: an axis of 2**63 - 1 cells splits exactly
    dfn = _dali()
    kw = dict(mesh_shape=[2], shard_axes=[0], split="explicit", split_size_counts=[2],
              split_sizes=[I64_MAX - 5, 5])
    shape = [np.array([I64_MAX, 3], np.int64)]
    for c, want in ((0, ((0, 0), (I64_MAX - 5, 3))), (1, ((I64_MAX - 5, 0), (5, 3)))):
        out = _run(lambda s: dfn.mesh_roi(s, coordinate=[c], **kw), shape)
        assert (tuple(out[0][0]), tuple(out[1][0])) == want


def test_operator_refuses_a_sample_the_sizes_do_not_tile():
    dfn = _dali()
    kw = dict(_GOOD, boundary="constant")
    out = _run(lambda s: dfn.mesh_roi(s, **kw), [np.array([3, 721, 10], np.int64)])
    assert tuple(out[0][0]) == (-1, 361, -1) and tuple(out[1][0]) == (5, 183, 12)
    with pytest.raises(RuntimeError, match=r"sample 1: split_sizes \[181, 181, 181, 178\] of mesh dim 1 "
                                           r"sum to 721 but axis 1 has 720 cells"):
        _run(lambda s: dfn.mesh_roi(s, **kw), [np.array([3, 721, 10], np.int64), np.array([3, 720, 10], np.int64)])


def test_python_refuses_half_given_sizes_and_non_integers():
    dfn = _dali()
    kw = dict(_GOOD, boundary="constant")
    with pytest.raises(ValueError, match="both split_size_counts and split_sizes"):
        dfn.mesh_roi(None, **{k: v for k, v in kw.items() if k != "split_sizes"})
    with pytest.raises(TypeError, match="split_sizes entry must be an integer"):
        dfn.mesh_roi(None, **dict(kw, split_sizes=[181.0, 181, 181, 178]))
    with pytest.raises(ValueError, match="split_sizes value 9223372036854775808 is beyond the int64 range"):
        dfn.mesh_roi(None, **dict(kw, split_sizes=[1 << 63, 181, 181, 178]))
