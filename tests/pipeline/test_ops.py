"""The DALI operators fn.dali_mesh.strided_slice / mesh_roi and dali_mesh.fn.mesh_slice, CPU only
(``device_id=None``), against numpy. Random data each run; the seed is in every failure message
(set DALI_MESH_TEST_SEED to replay)."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("nvidia.dali")

from nvidia.dali import fn, pipeline_def, types  # noqa: E402

import dali_mesh.fn as dfn  # noqa: E402
from tests.helpers import run_pipeline  # noqa: E402
from dali_mesh import Layout, MeshInfo, partition  # noqa: E402
from dali_mesh._kernels import reference_strided_slice  # noqa: E402
from tests.helpers import DTYPES, MODES, SEED, random_array  # noqa: E402

if not dfn.PLUGIN_PATH.exists():
    pytest.skip("libdali_mesh.so not built (pip install --no-build-isolation -e .)", allow_module_level=True)


# ---- strided_slice ----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_per_sample_shapes_and_argument_inputs(dtype):
    """Samples of different shapes, start/shape/step as per-sample argument inputs, mixed modes."""
    rng = np.random.default_rng(SEED)
    ndim = 1 + DTYPES.index(dtype) % 5
    modes = [MODES[(DTYPES.index(dtype) + a) % 5] for a in range(ndim)]
    xs, starts, shapes, steps = [], [], [], []
    for _ in range(5):
        sh = [int(rng.integers(1, 7)) for _ in range(ndim)]
        xs.append(random_array(rng, sh, dtype, beyond_int=False))
        starts.append(np.array([rng.integers(-2 * n - 3, 2 * n + 3) for n in sh], np.int64))
        shapes.append(np.array([rng.integers(0 if rng.random() < 0.1 else 1, 9) for _ in sh], np.int32))
        steps.append(np.array([rng.integers(1, 4) for _ in sh], np.int64))
    out_dtype = DTYPES[(DTYPES.index(dtype) + 3) % len(DTYPES)]
    fill = 1.0
    outs = run_pipeline(
        lambda x, s, sh, st: (dfn.strided_slice(x, s, sh, st, boundary=modes, fill_value=fill),
                              dfn.strided_slice(x, s, sh, st, boundary=modes, fill_value=fill,
                                                dtype=out_dtype)),
        [xs, starts, shapes, steps])
    for i, x in enumerate(xs):
        msg = f"seed {SEED} sample {i} {x.shape} start={starts[i]} shape={shapes[i]} step={steps[i]}"
        ref = reference_strided_slice(x, starts[i], shapes[i], steps[i], modes, fill_value=fill)
        assert outs[0][i].dtype == ref.dtype, msg
        np.testing.assert_array_equal(outs[0][i], ref, err_msg=msg)
        ref = reference_strided_slice(x, starts[i], shapes[i], steps[i], modes, fill_value=fill,
                                      dtype=out_dtype)
        assert outs[1][i].dtype == np.dtype(out_dtype), msg
        np.testing.assert_array_equal(outs[1][i], ref, err_msg=msg)


def test_axes_subset_constant_args_and_layout():
    rng = np.random.default_rng(SEED)
    xs = [rng.normal(size=(4, 5 + i, 3)).astype(np.float32) for i in range(3)]

    @pipeline_def(batch_size=3, num_threads=1, device_id=None)
    def pipe():
        x = fn.external_source(source=lambda: xs, batch=True, layout="HWC")
        return dfn.strided_slice(x, [-2, -1], [9, 4], 2, axes=[1, -3], boundary=["periodic", "symmetric"])

    p = pipe()
    p.build()
    (out,) = p.run()
    assert out.layout() == "HWC"
    for i, x in enumerate(xs):
        ref = reference_strided_slice(x, [-1, -2, 0], [4, 9, 3], [2, 2, 1], ["symmetric", "periodic", "constant"])
        np.testing.assert_array_equal(np.array(out[i]), ref, err_msg=f"seed {SEED} sample {i}")


@pytest.mark.parametrize("layout_kind", ["CHW", "HWC"])
def test_fused_era5_case_normalise_and_cast(layout_kind):
    """Periodic longitude, constant latitude, per-channel normalisation, cast: one operator."""
    rng = np.random.default_rng(SEED)
    c_axis = 0 if layout_kind == "CHW" else 2
    shape = (3, 13, 24) if layout_kind == "CHW" else (13, 24, 3)
    xs = [rng.normal(280, 20, shape).astype(np.float64) for _ in range(2)]
    mean, std = [280.0, 275.5, 290.0], [20.0, 15.0, 7.5]
    lat, lon = (1, 2) if layout_kind == "CHW" else (0, 1)
    outs = run_pipeline(
        lambda x: dfn.strided_slice(x, [-2, -3], [17, 30], axes=[lat, lon],
                                    boundary=["constant", "periodic"], dtype=types.FLOAT16,
                                    channel_axis=c_axis, mean=mean, std=std, fill_value=-1),
        [xs])
    for i, x in enumerate(xs):
        start = [0, 0, 0]
        wshape = list(shape)
        bnd = ["constant"] * 3
        start[lat], start[lon], wshape[lat], wshape[lon] = -2, -3, 17, 30
        bnd[lon] = "periodic"
        ref = reference_strided_slice(x, start, wshape, 1, bnd, dtype=np.float16, fill_value=-1,
                                      channel_axis=c_axis, mean=mean, std=std)
        np.testing.assert_array_equal(outs[0][i], ref, err_msg=f"seed {SEED}")


def test_large_sample_split_over_threads():
    rng = np.random.default_rng(SEED)
    x = rng.normal(size=(6, 300, 520)).astype(np.float32)  # 3.7 MiB: several tasks per sample
    outs = run_pipeline(lambda x: dfn.strided_slice(x, [-1, -7, -5], [8, 310, 530],
                                                    boundary=["reflect", "edge", "periodic"]),
                        [[x, np.ascontiguousarray(x[:, :100])]], num_threads=2)
    ref = reference_strided_slice(x, [-1, -7, -5], [8, 310, 530], 1, ["reflect", "edge", "periodic"])
    np.testing.assert_array_equal(outs[0][0], ref)
    ref = reference_strided_slice(x[:, :100], [-1, -7, -5], [8, 310, 530], 1, ["reflect", "edge", "periodic"])
    np.testing.assert_array_equal(outs[0][1], ref)


def _expect_error(graph, batch, match):
    # the operator raises RuntimeError; dali_mesh.fn refuses some values itself (ValueError)
    with pytest.raises((RuntimeError, ValueError), match=match):
        run_pipeline(graph, batch)


@pytest.mark.parametrize("kwargs, match", [
    (dict(start=[0, 0], shape=[2, 2], step=[0]), "step"),
    (dict(start=[0, 0], shape=[-1, 2]), "negative"),
    (dict(start=[0], shape=[2], axes=[2]), "out of range"),
    (dict(start=[0, 0], shape=[2, 2], axes=[1, -1]), "twice"),
    (dict(start=[0, 0], shape=[2, 2], boundary="wrap"), "wrap"),
    (dict(start=[0, 0], shape=[2, 2], boundary="trim"), "trim"),
    (dict(start=[0, 0, 0], shape=[2, 2, 2]), "start"),
    (dict(start=[0], shape=[2], axes=[0, 1]), "start"),
    (dict(start=[0, 0], shape=[2]), "shape"),
    (dict(start=[0, 0], shape=[2, 2], step=[1, 1, 1]), "step"),
    (dict(start=[0, 0], shape=[2, 2], boundary=["edge", "edge", "edge"]), "boundary"),
    (dict(start=[0, 0], shape=[2, 2], fill_value=300), "fill_value"),
    (dict(start=[0, 0], shape=[2, 2], fill_value=0.5), "fill_value"),
    (dict(start=[0, 0], shape=[2, 2], channel_axis=0, mean=[1, 2, 3], std=[1, 1, 1]), "channels"),
    (dict(start=[0, 0], shape=[2, 2], mean=[1], std=[0]), "std"),
])
def test_bad_arguments_give_clear_errors(kwargs, match):
    x = np.zeros((2, 4), np.uint8)
    _expect_error(lambda x: dfn.strided_slice(x, **kwargs), [[x]], match)


def test_plugin_load_errors(monkeypatch, tmp_path):
    from dali_mesh import _build_info
    from dali_mesh.pipeline import plugin

    monkeypatch.setattr(plugin, "_ops_module", None)
    monkeypatch.setattr(plugin, "PLUGIN_PATH", tmp_path / "libdali_mesh.so")
    with pytest.raises(ImportError, match="missing.*pip install --no-build-isolation -e"):
        dfn.load_plugin()
    monkeypatch.undo()
    monkeypatch.setattr(plugin, "_ops_module", None)
    monkeypatch.setattr(_build_info, "DALI_VERSION", "0.0.1")
    with pytest.raises(ImportError, match="built against DALI 0.0.1"):
        dfn.load_plugin()


def test_partitioned_source_is_reexported():
    assert callable(dfn.partitioned_source)


# ---- mesh_roi and mesh_slice --------------------------------------------------------------------------
def _random_layout(rng, ndim, with_crop_shape=None):
    mesh_ndim = int(rng.integers(1, 4))
    mesh_shape = tuple(int(rng.integers(1, 5)) for _ in range(mesh_ndim))
    names = tuple(f"m{i}" for i in range(mesh_ndim))
    mesh = MeshInfo(mesh_shape, names, tuple(int(rng.integers(s)) for s in mesh_shape))
    shard = {n: int(rng.integers(-ndim, ndim)) for n in names if rng.random() < 0.7}
    free = [n for n in names if n not in shard]
    halo = {a: (int(rng.integers(0, 4)), int(rng.integers(0, 7))) for a in range(ndim) if rng.random() < 0.7}
    boundary = {a: partition.BOUNDARIES[rng.integers(6)] for a in range(ndim) if rng.random() < 0.8}
    crop = None
    if with_crop_shape is not None and rng.random() < 0.5:
        crop = []
        for n in with_crop_shape:
            if rng.random() < 0.3:
                crop.append(None)
            else:
                s = int(rng.integers(0, max(1, n // 2)))
                crop.append((s, int(rng.integers(s + 1, n + 1))))
    return Layout(mesh, shard=shard, batch=free[:1] or None, crop=crop, halo=halo,
                  boundary=boundary, fill_value=float(rng.integers(-3, 4)),
                  split=partition.SPLITS[rng.integers(3)])


def test_mesh_roi_operator_matches_layout_on_a_batch_of_shapes():
    rng = np.random.default_rng(SEED)
    for case in range(12):
        ndim = int(rng.integers(1, 5))
        layout = _random_layout(rng, ndim)
        shapes = [np.array([rng.integers(1, 12) for _ in range(ndim)], np.int64) for _ in range(8)]
        args = dfn.mesh_roi_args(layout, ndim)
        outs = run_pipeline(lambda s: dfn.mesh_roi(s, **args), [shapes])
        for i, sh in enumerate(shapes):
            region = layout.region(tuple(sh))
            msg = f"seed {SEED} case {case} {layout!r} shape {tuple(sh)}"
            assert tuple(outs[0][i]) == region.window_start, msg
            assert tuple(outs[1][i]) == region.window_shape, msg


def test_mesh_slice_every_rank_equals_take_window():
    """mesh_slice of data in the pipeline = take_window(sample, layout.region(shape)), for every
    mesh coordinate: halos, crops (with open ends), trim, empty shards."""
    rng = np.random.default_rng(SEED)
    for case in range(15):
        ndim = int(rng.integers(1, 4))
        shapes = [tuple(int(rng.integers(2, 9)) for _ in range(ndim)) for _ in range(3)]
        layout = _random_layout(rng, ndim, with_crop_shape=tuple(min(s) for s in zip(*shapes)))
        xs = [rng.integers(-100, 100, s).astype(np.int32) for s in shapes]
        coords = list(layout.mesh.coordinates())
        graph = lambda x: tuple(dfn.mesh_slice(x, layout, ndim=ndim, coordinate=c) for c in coords)  # noqa: E731
        outs = run_pipeline(graph, [xs])
        for k, c in enumerate(coords):
            for i, x in enumerate(xs):
                region = layout.region(x.shape, c)
                ref = partition.take_window(x, region)
                np.testing.assert_array_equal(outs[k][i], ref,
                                              err_msg=f"seed {SEED} case {case} {layout!r} coordinate {c} shape {x.shape}")


def test_mesh_slice_needs_ndim():
    layout = Layout(MeshInfo((2,), ("mp",), (0,)), shard={"mp": 0})
    with pytest.raises(ValueError, match="ndim"):
        dfn.mesh_roi_args(layout, 0)


def test_constant_arguments_beyond_int32_are_refused():
    @pipeline_def(batch_size=1, num_threads=1, device_id=None)
    def pipe():
        return dfn.strided_slice(fn.constant(idata=[1.0, 2.0, 3.0], dtype=types.FLOAT), [2**31], [2],
                                 boundary="periodic")

    with pytest.raises(ValueError, match="start value 2147483648 does not fit a 32-bit constant argument"):
        pipe()
