"""The plugin's kernels through the DALI-free library (ctypes), against numpy.

Two backends of ``libdali_mesh_kernels.so``: ``cpu`` (the kernel the DALI CPU operator runs) and
``emulate`` (the CUDA kernel body and its host plan, run on the host thread by thread: descriptors,
axis collapsing, 16-byte vectorisation, block splitting and index math as they ship to the GPU).
Random data each run; the seed is in every failure message (set DALI_MESH_TEST_SEED to replay).
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from dali_mesh import partition
from dali_mesh import _kernels as K
from tests.helpers import DTYPES, MODES, SEED, random_array

pytestmark = pytest.mark.skipif(not K.library_path().exists(),
                                reason="libdali_mesh_kernels.so not built (pip install --no-build-isolation -e .)")


def random_fill(rng, dtype) -> float:
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return float(rng.integers(0, 2))
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return float(rng.integers(max(info.min, -1000), min(info.max, 1000)))
    return float(rng.choice([0.0, -1.5, 7.25, np.inf]))


def random_case(rng, ndim=None, nsamples=None):
    ndim = ndim or int(rng.integers(1, 6))
    nsamples = nsamples or int(rng.integers(1, 4))
    in_dtype = DTYPES[rng.integers(len(DTYPES))]
    out_dtype = in_dtype if rng.random() < 0.5 else DTYPES[rng.integers(len(DTYPES))]
    samples, starts, shapes, steps, bounds = [], [], [], [], []
    boundary_one = [MODES[rng.integers(5)] for _ in range(ndim)]
    for _ in range(nsamples):
        shape = [int(rng.integers(0 if rng.random() < 0.1 else 1, 7)) for _ in range(ndim)]
        b = [m if n > 0 else "constant" for m, n in zip(boundary_one, shape)]
        samples.append(random_array(rng, shape, in_dtype))
        starts.append([int(rng.integers(-3 * n - 4, 3 * n + 4)) for n in shape])
        shapes.append([int(rng.integers(0 if rng.random() < 0.05 else 1, 10)) for _ in shape])
        steps.append([int(rng.integers(1, 4)) for _ in shape])
        bounds.append(b)
    return samples, starts, shapes, steps, bounds, in_dtype, out_dtype


def check(samples, outs, starts, shapes, steps, bounds, msg, **kw):
    for i, (x, o) in enumerate(zip(samples, outs)):
        ref = K.reference_strided_slice(x, starts[i], shapes[i], steps[i], bounds[i], **kw)
        assert o.dtype == ref.dtype and o.shape == ref.shape, f"{msg} sample {i}"
        np.testing.assert_array_equal(o, ref, err_msg=f"{msg} sample {i} x={x!r}")


# ---- index math --------------------------------------------------------------------------------------
def test_boundary_index_matches_python():
    for mode in MODES:
        for n in range(1, 8):
            r = np.arange(-40, 41)
            want = partition.boundary_index(r, n, mode)
            got = [K.boundary_index(v, n, mode) for v in r]
            np.testing.assert_array_equal(got, want, err_msg=f"{mode} n={n}")


def test_fast_div_is_exact():
    rng = np.random.default_rng(SEED)
    divisors = [1, 2, 3, 5, 7, 641, 2**31 - 1, 2**32 - 1, 2**32, 2**32 + 1, 2**63 - 1, 2**63,
                2**63 + 5, 2**64 - 1] + [int(v) for v in rng.integers(1, 2**63, 40, dtype=np.int64)]
    numerators = [0, 1, 2**32, 2**63, 2**64 - 1] + [int(v) for v in rng.integers(0, 2**63, 40, dtype=np.int64)]
    for d, n in itertools.product(divisors, numerators):
        assert K.fast_div(d, n) == n // d, f"seed {SEED}: {n} // {d}"


def test_float_to_half_rounds_like_numpy():
    rng = np.random.default_rng(SEED)
    bits = rng.integers(0, 2**32, 2_000_000, dtype=np.uint64).astype(np.uint32)
    edges = np.array([0.0, -0.0, 65504.0, 65519.99, 65520.0, -65520.0, 2.0**-24, 2.0**-25,
                      1.5 * 2.0**-25, 2.0**-14, 2.0**-14 - 2.0**-25, np.inf, -np.inf, 1e-40],
                     np.float32)
    x = np.concatenate([bits.view(np.float32), edges])
    got = K.floats_to_half(x)
    want = x.astype(np.float16)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan, err_msg=f"seed {SEED}")
    np.testing.assert_array_equal(got[~nan].view(np.uint16), want[~nan].view(np.uint16),
                                  err_msg=f"seed {SEED}")


# ---- strided slice ----------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["cpu", "emulate"])
def test_random_windows_every_mode_and_dtype(backend):
    rng = np.random.default_rng(SEED)
    for case in range(250):
        samples, starts, shapes, steps, bounds, in_dt, out_dt = random_case(rng)
        fill = random_fill(rng, out_dt)
        outs = K.strided_slice_host(samples, starts, shapes, steps, bounds, dtype=out_dt,
                                    fill_value=fill, backend=backend)
        check(samples, outs, starts, shapes, steps, bounds,
              f"seed {SEED} case {case} {backend} {np.dtype(in_dt)}->{np.dtype(out_dt)} "
              f"starts={starts} shapes={shapes} steps={steps} bounds={bounds}",
              dtype=out_dt, fill_value=fill)


@pytest.mark.parametrize("backend", ["cpu", "emulate"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_normalise_per_channel(backend, dtype):
    rng = np.random.default_rng(SEED)
    for case in range(12):
        ndim = int(rng.integers(2, 5))
        shape = [int(rng.integers(1, 6)) for _ in range(ndim)]
        c = int(rng.integers(ndim))
        x = random_array(rng, shape, dtype)
        if np.dtype(dtype).kind == "f":
            x = np.clip(x, -6e4, 6e4).astype(dtype)
        mean = [float(v) for v in rng.normal(0, 10, shape[c])]
        std = [float(v) for v in rng.uniform(0.5, 20, shape[c])]
        out_dt = [np.float32, np.float16, np.int16, np.uint8, np.float64][case % 5]
        start = [int(rng.integers(-4, n + 2)) for n in shape]
        wshape = [int(rng.integers(1, 8)) for _ in shape]
        bounds = [MODES[rng.integers(5)] for _ in shape]
        steps = [int(rng.integers(1, 3)) for _ in shape]
        out = K.strided_slice_host([x], start, wshape, steps, bounds, dtype=out_dt, fill_value=3,
                                   channel_axis=c, mean=mean, std=std, backend=backend)[0]
        check([x], [out], [start], [wshape], [steps], [bounds],
              f"seed {SEED} case {case} channel_axis={c} {start} {wshape} {bounds}",
              dtype=out_dt, fill_value=3, channel_axis=c, mean=mean, std=std)


@pytest.mark.parametrize("backend", ["cpu", "emulate"])
def test_normalise_scalar_default_dtype_is_float32(backend):
    x = np.arange(12, dtype=np.int32).reshape(3, 4)
    out = K.strided_slice_host([x], [-1, 0], [5, 4], 1, "edge", mean=[2.0], std=[4.0],
                               backend=backend)[0]
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, (np.pad(x, ((1, 1), (0, 0)), "edge") - 2.0) / 4.0)


@pytest.mark.parametrize("backend", ["cpu", "emulate"])
def test_domain_box_is_where_the_boundary_applies(backend):
    rng = np.random.default_rng(SEED)
    for case in range(40):
        shape = [int(rng.integers(1, 9)) for _ in range(3)]
        x = random_array(rng, shape, np.int32)
        d0 = [int(rng.integers(0, n)) for n in shape]
        dn = [int(rng.integers(1, n - a + 1)) for a, n in zip(d0, shape)]
        start = [int(rng.integers(a - 5, a + n + 3)) for a, n in zip(d0, dn)]
        wshape = [int(rng.integers(1, 9)) for _ in shape]
        bounds = [MODES[rng.integers(5)] for _ in shape]
        out = K.strided_slice_host([x], start, wshape, 1, bounds, domain_start=d0,
                                   domain_shape=dn, fill_value=-7, backend=backend)[0]
        ref = K.reference_strided_slice(x, start, wshape, 1, bounds, fill_value=-7,
                                        domain_start=d0, domain_shape=dn)
        np.testing.assert_array_equal(out, ref, err_msg=f"seed {SEED} case {case} {d0} {dn} {start} {bounds}")


@pytest.mark.parametrize("backend", ["cpu", "emulate"])
def test_halo_bigger_than_axis_and_windows_wholly_outside(backend):
    x = np.arange(3 * 2, dtype=np.float32).reshape(3, 2)
    for mode in MODES:
        for start, shape in (([-20, -9], [45, 23]), ([50, 7], [4, 3]), ([-9, -9], [2, 2])):
            out = K.strided_slice_host([x], start, shape, 1, mode, fill_value=-1, backend=backend)[0]
            ref = K.reference_strided_slice(x, start, shape, 1, mode, fill_value=-1)
            np.testing.assert_array_equal(out, ref, err_msg=f"{mode} {start} {shape}")
    # reflect on an axis of extent 1 repeats the value, as numpy does
    one = np.array([[5.0]], np.float32)
    out = K.strided_slice_host([one], [-3, -2], [7, 5], 1, "reflect", backend=backend)[0]
    np.testing.assert_array_equal(out, np.pad(one, ((3, 3), (2, 2)), "reflect"))


@pytest.mark.parametrize("backend", ["cpu", "emulate"])
def test_empty_windows_and_empty_axes(backend):
    x = np.ones((4, 0, 3), np.int16)
    out = K.strided_slice_host([x], [0, -2, 0], [4, 5, 3], 1, "constant", fill_value=9,
                               backend=backend)[0]
    np.testing.assert_array_equal(out, np.full((4, 5, 3), 9, np.int16))
    y = np.ones((4, 5), np.int16)
    out = K.strided_slice_host([y], [1, 2], [0, 3], 1, "periodic", backend=backend)[0]
    assert out.shape == (0, 3)
    with pytest.raises(K.KernelsError, match="empty"):
        K.strided_slice_host([x], [0, -2, 0], [4, 5, 3], 1, "periodic", backend=backend)


def test_gpu_plan_vectorises_inside_windows_and_pads_at_compile_time():
    x = np.zeros((6, 64), np.float32)
    info = K.gpu_plan_info([x], [1, 8], [4, 32])
    assert info["elem_size"] == 16 and not info["need_pad"] and not info["convert"]
    # outer axis padded, inner inside: still 16-byte moves, padding kernel
    info = K.gpu_plan_info([x], [-2, 4], [10, 8], boundary=["periodic", "constant"])
    assert info["elem_size"] == 16 and info["need_pad"]
    # inner axis padded: the in-bounds box and two halo strips; the box moves what its alignment
    # against the output allows (1 cell of halo: the output is 4 bytes off the input)
    info = K.gpu_plan_info([x], [0, -1], [6, 66], boundary="periodic")
    assert info["sample_elem_sizes"] == [4] and info["need_pad"] and info["num_pieces"] == 3
    info = K.gpu_plan_info([x], [0, -4], [6, 72], boundary="periodic")  # 16 bytes of halo
    assert info["sample_elem_sizes"] == [16] and info["need_pad"] and info["num_pieces"] == 3
    # whole rows plus a halo row: the box is one contiguous 16-byte copy, the halo row a strip
    info = K.gpu_plan_info([x], [-1, 0], [7, 64], boundary="constant")
    assert info["sample_elem_sizes"] == [16] and info["num_pieces"] == 2
    # misaligned start: 8-byte moves at most
    info = K.gpu_plan_info([x], [0, 2], [6, 32])
    assert info["elem_size"] == 8
    # step on the inner axis: no vectors
    assert K.gpu_plan_info([x], [0, 0], [6, 16], step=[1, 2])["elem_size"] == 4
    assert K.gpu_plan_info([x], [0, 0], [6, 64], dtype=np.float16)["convert"]


@pytest.mark.parametrize("backend", ["cpu", "emulate"])
def test_large_samples_many_blocks_and_vector_paths(backend):
    rng = np.random.default_rng(SEED)
    # shapes chosen so the GPU plan uses 16-, 8- and 4-byte elements and many blocks per sample
    cases = [
        (np.float32, (5, 40, 96), [0, 3, 8], [5, 30, 80], [1, 1, 1], "constant"),
        (np.float32, (5, 40, 96), [-3, -2, 4], [11, 44, 88], [1, 1, 1], ["periodic", "reflect", "edge"]),
        (np.uint8, (7, 33, 50), [1, -4, -9], [6, 41, 70], [1, 1, 1], ["symmetric", "constant", "periodic"]),
        (np.float64, (4, 30, 30), [0, 0, 2], [4, 30, 26], [1, 1, 1], "constant"),
        (np.int16, (9, 300), [-100, -700], [30, 1500], [2, 3], ["reflect", "periodic"]),
        (np.float16, (2, 3, 4, 5, 6), [-1, 0, -2, 1, -3], [4, 3, 8, 3, 12], [1, 1, 1, 2, 1],
         ["edge", "constant", "symmetric", "reflect", "periodic"]),
    ]
    for dtype, shape, start, wshape, step, bounds in cases:
        samples = [random_array(rng, shape, dtype) for _ in range(2)]
        outs = K.strided_slice_host(samples, start, wshape, step, bounds, fill_value=1,
                                    backend=backend)
        b = [bounds] * 2 if not isinstance(bounds, str) else [[bounds] * len(shape)] * 2
        check(samples, outs, [start] * 2, [wshape] * 2, [step] * 2, b,
              f"seed {SEED} {np.dtype(dtype)} {shape} {start} {wshape}", fill_value=1)


@pytest.mark.parametrize("backend", ["cpu", "emulate"])
def test_bad_arguments(backend):
    x = np.zeros((3, 4), np.uint8)
    bad = [
        (dict(start=[0, 0], shape=[2, 2], step=[0, 1]), "step"),
        (dict(start=[0, 0], shape=[-1, 2]), "negative"),
        (dict(start=[0, 0], shape=[2, 2], fill_value=300), "fill_value"),
        (dict(start=[0, 0], shape=[2, 2], fill_value=0.5), "fill_value"),
        (dict(start=[0, 0], shape=[2, 2], dtype=np.int8, fill_value=-129), "fill_value"),
        (dict(start=[0, 0], shape=[2, 2], mean=[1.0, 2.0], std=[1.0, 1.0], channel_axis=0), "channel"),
        (dict(start=[0, 0], shape=[2, 2], mean=[1.0], std=[0.0]), "std"),
    ]
    for kw, match in bad:
        with pytest.raises(K.KernelsError, match=match):
            K.strided_slice_host([x], backend=backend, **kw)


# ---- mesh_roi ---------------------------------------------------------------------------------------
def random_layout(rng, ndim):
    from dali_mesh import Layout, MeshInfo

    mesh_ndim = int(rng.integers(1, 4))
    mesh_shape = tuple(int(rng.integers(1, 5)) for _ in range(mesh_ndim))
    names = tuple(f"m{i}" for i in range(mesh_ndim))
    coordinate = tuple(int(rng.integers(s)) for s in mesh_shape)
    mesh = MeshInfo(mesh_shape, names, coordinate)
    shard = {}
    for i, n in enumerate(names):
        if rng.random() < 0.7:
            shard[n] = int(rng.integers(-ndim, ndim))  # two mesh dims may shard one axis
    free = [n for n in names if n not in shard]
    batch = free[:1] if free else None
    halo = {a: (int(rng.integers(0, 4)), int(rng.integers(0, 9))) for a in range(ndim) if rng.random() < 0.7}
    boundary = {a: partition.BOUNDARIES[rng.integers(6)] for a in range(ndim) if rng.random() < 0.8}
    return Layout(mesh, shard=shard, batch=batch, halo=halo, boundary=boundary,
                  split=partition.SPLITS[rng.integers(3)]), mesh


def random_crop(rng, shape):
    crop = []
    for n in shape:
        if rng.random() < 0.4:
            crop.append(None)
        else:
            s = int(rng.integers(0, n))
            crop.append((s, int(rng.integers(s + 1, n + 1))))
    return crop


def test_mesh_roi_agrees_with_layout_region():
    from dali_mesh import Layout

    rng = np.random.default_rng(SEED)
    empties = 0
    for case in range(1500):
        ndim = int(rng.integers(1, 5))
        layout, mesh = random_layout(rng, ndim)
        shape = tuple(int(rng.integers(1, 12)) for _ in range(ndim))
        if rng.random() < 0.4:
            layout = Layout(mesh, shard=layout.shard_dims, batch=layout.batch_dims or None,
                            crop=random_crop(rng, shape), halo=layout.halo_pairs(ndim),
                            boundary=layout.boundaries(ndim), split=layout.split)
        region = layout.region(shape)
        start, stop = layout.domain(shape)  # the whole sample without a crop: the same window
        crop = {"crop_start": list(start), "crop_stop": list(stop)} if rng.random() < 0.8 else {}
        if layout.domain(shape) != ((0,) * ndim, shape):
            crop = {"crop_start": list(start), "crop_stop": list(stop)}
        halo = layout.halo_pairs(ndim)
        ws, wsh = K.mesh_roi(shape, mesh_shape=mesh.shape, coordinate=mesh.coordinate,
                             shard_axes=layout.shard_axes(ndim), halo_lo=[h[0] for h in halo],
                             halo_hi=[h[1] for h in halo], boundary=layout.boundaries(ndim),
                             split=layout.split, **crop)
        assert ws == region.window_start and wsh == region.window_shape, (
            f"seed {SEED} case {case}: {layout!r} shape {shape}: C++ {ws} {wsh}, "
            f"python {region.window_start} {region.window_shape}")
        empties += any(s == 0 for s in region.shape)
    assert empties > 10  # the random cases include empty shards


def test_mesh_roi_bad_arguments():
    kw = dict(mesh_shape=[2], coordinate=[0], shard_axes=[0], halo_lo=[1], halo_hi=[1],
              boundary=["constant"])
    with pytest.raises(K.KernelsError, match="out of range"):
        K.mesh_roi((4, 5), **{**kw, "shard_axes": [2]})
    with pytest.raises(K.KernelsError, match="coordinate"):
        K.mesh_roi((4, 5), **{**kw, "coordinate": [2]})
    with pytest.raises(K.KernelsError, match="crop"):
        K.mesh_roi((4, 5), **kw, crop_start=[0, 3], crop_stop=[4, 3])
    with pytest.raises(K.KernelsError, match="negative"):
        K.mesh_roi((4, 5), **{**kw, "halo_lo": [-1]})
    with pytest.raises(K.KernelsError, match="split 'rows' is not known"):
        K.mesh_roi((4, 5), **kw, split="rows")
    with pytest.raises(K.KernelsError, match="both split_size_counts and split_sizes"):
        K.mesh_roi((4, 5), **kw, split="explicit", split_sizes=[2, 2])
    with pytest.raises(K.KernelsError, match=r"split_size_counts \[2, 0\] needs one entry per mesh dim"):
        K.mesh_roi((4, 5), **kw, split="explicit", split_size_counts=[2, 0], split_sizes=[2, 2])


def _explicit_twin(layout, mesh, shape):
    """The layout with its named rule written out as explicit sizes: for each sharded axis, the
    owned length of every combined shard (row-major over its mesh dims), read from the regions."""
    from dali_mesh import Layout

    ndim = len(shape)
    groups: dict[int, list[int]] = {}
    for d, a in enumerate(layout.shard_axes(ndim)):
        if a >= 0:
            groups.setdefault(a, []).append(d)
    split = {}
    for axis, dims in groups.items():
        sizes = []
        for combined in itertools.product(*(range(mesh.shape[d]) for d in dims)):
            c = [0] * mesh.ndim
            for d, i in zip(dims, combined):
                c[d] = i
            r = layout.region(shape, c)
            sizes.append(r.stop[axis] - r.start[axis])
        split[mesh.names[dims[-1]]] = sizes
    crop = [(s, e) for s, e in zip(*layout.domain(shape))]
    return Layout(mesh, shard={mesh.names[d]: a for d, a in enumerate(layout.shard_axes(ndim)) if a >= 0},
                  batch=layout.batch_dims or None, crop=crop, halo=layout.halo_pairs(ndim),
                  boundary=layout.boundaries(ndim), split=split)


def test_mesh_roi_explicit_sizes_of_a_named_rule_give_its_windows():
    """Explicit sizes equal to a named rule's shards (nested mesh dims included) give the rule's
    windows in C++, at every rank: the two split paths of ComputeMeshRoi agree."""
    from dali_mesh import Layout

    rng = np.random.default_rng(SEED)
    cases = 0
    for case in range(300):
        ndim = int(rng.integers(1, 4))
        layout, mesh = random_layout(rng, ndim)
        if not any(a >= 0 for a in layout.shard_axes(ndim)):
            continue
        shape = tuple(int(rng.integers(1, 12)) for _ in range(ndim))
        if rng.random() < 0.4:
            layout = Layout(mesh, shard=layout.shard_dims, batch=layout.batch_dims or None,
                            crop=random_crop(rng, shape), halo=layout.halo_pairs(ndim),
                            boundary=layout.boundaries(ndim), split=layout.split)
        twin = _explicit_twin(layout, mesh, shape)
        counts, sizes = twin.split_sizes_flat()
        start, stop = twin.domain(shape)
        halo = twin.halo_pairs(ndim)
        for c in list(mesh.coordinates())[:12]:
            region = layout.region(shape, c)
            got = K.mesh_roi(shape, mesh_shape=mesh.shape, coordinate=c, shard_axes=twin.shard_axes(ndim),
                             halo_lo=[h[0] for h in halo], halo_hi=[h[1] for h in halo],
                             boundary=twin.boundaries(ndim), split="explicit", split_size_counts=counts,
                             split_sizes=sizes, crop_start=list(start), crop_stop=list(stop))
            msg = (f"seed {SEED} case {case}: {layout!r} as {twin!r} shape {shape} coordinate {c}: C++ {got}, "
                   f"python {region.window_start} {region.window_shape}")
            if 0 in region.shape:
                # an empty shard: no cells either way, but it sits where each convention puts it (chunk:
                # the domain end, as DTensor; explicit sizes: the running sum, as ShardTensor); the
                # twin's own region says where, and C++ must agree with that
                twin_region = twin.region(shape, c)
                assert got == (twin_region.window_start, twin_region.window_shape) and \
                    twin_region.window_shape == region.window_shape, msg
            else:
                assert got == (region.window_start, region.window_shape), msg
        cases += 1
    assert cases > 100
