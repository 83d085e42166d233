"""The DALI plugin at the edges (issue 8 "fix now", issue 9 item 15): checkpointing through
strided_slice / mesh_roi / mesh_slice, int64 extremes as per-sample argument inputs (refused
clearly, never a crash or a wrong window), exact fill values, and the Python wrapper's refusals.
CPU only (``device_id=None``)."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("nvidia.dali")

from nvidia.dali import fn, pipeline_def, types  # noqa: E402

import dali_mesh._kernels as K  # noqa: E402
import dali_mesh.fn as dfn  # noqa: E402
from tests.helpers import run_pipeline  # noqa: E402
from dali_mesh import Layout, MeshInfo, partition  # noqa: E402

if not dfn.PLUGIN_PATH.exists():
    pytest.skip("libdali_mesh.so not built (pip install --no-build-isolation -e .)", allow_module_level=True)

I64_MIN, I64_MAX = -(2**63), 2**63 - 1
BIG = 2**62  # kMaxPosition: window positions must lie within +-2**62 of the domain start


# ---- checkpointing ---------------------------------------------------------------------------------
N_SAMPLES, BATCH = 12, 3


def _sample(idx: int) -> np.ndarray:
    """Sample idx of the epoch: an arange offset by the index (self-checking), shape varying."""
    h, w = 5 + idx % 3, 7
    return (np.arange(h * w, dtype=np.int32).reshape(h, w) + 1000 * idx)


class _Source:
    """A SampleInfo source (picklable): DALI checkpoints its position in the epoch."""

    def __call__(self, info):
        if info.idx_in_epoch >= N_SAMPLES:
            raise StopIteration
        return _sample(info.idx_in_epoch)


LAYOUT = Layout(MeshInfo((2,), ("mp",), (1,)), shard={"mp": 0}, halo={0: 1, 1: 2},
                boundary={0: "reflect", 1: "periodic"}, fill_value=-5)


@pipeline_def(batch_size=BATCH, num_threads=1, device_id=None, enable_checkpointing=True)
def _checkpointed_pipe():
    x = fn.external_source(source=_Source(), batch=False, dtype=types.INT32)
    a = dfn.strided_slice(x, [-2, -3], [9, 12], [1, 2], boundary=["reflect", "periodic"])
    roi = dfn.mesh_roi(x.shape(), mesh_shape=[2], coordinate=[0], shard_axes=[1], halo_lo=1,
                       halo_hi=1, boundary="periodic")
    b = dfn.strided_slice(x, roi[0], roi[1], boundary="periodic")
    c = dfn.mesh_slice(x, LAYOUT, ndim=2)
    return x, a, roi[0], b, c


def _expected(idx):
    x = _sample(idx)
    a = K.reference_strided_slice(x, [-2, -3], [9, 12], [1, 2], ["reflect", "periodic"])
    region = partition.Layout(MeshInfo((2,), ("mp",), (0,)), shard={"mp": 1}, halo={0: 1, 1: 1},
                              boundary="periodic").region(x.shape)
    c = partition.take_window(x, LAYOUT.region(x.shape))
    return x, a, np.array(region.window_start), partition.take_window(x, region), c


def _run_batches(p, n):
    out = []
    for _ in range(n):
        res = p.run()
        out.append([[np.array(o[i]) for i in range(BATCH)] for o in res])
    return out


def test_checkpoint_mid_epoch_restores_identical_batches():
    """strided_slice, mesh_roi and mesh_slice are stateless: a checkpointed pipeline builds, and a
    pipeline restored from a mid-epoch checkpoint continues with the very same batches."""
    p = _checkpointed_pipe()
    p.build()  # failed with "Checkpointing is not implemented for this operator"
    first = _run_batches(p, 2)
    ck = p.checkpoint()
    rest = _run_batches(p, 2)
    for b, batch in enumerate(first + rest):
        for i in range(BATCH):
            idx = b * BATCH + i
            for k, want in enumerate(_expected(idx)):
                np.testing.assert_array_equal(batch[k][i], want, err_msg=f"batch {b} sample {i} output {k}")
    q = _checkpointed_pipe(checkpoint=ck)
    q.build()
    again = _run_batches(q, 2)
    for b in range(2):
        for k in range(5):
            for i in range(BATCH):
                np.testing.assert_array_equal(again[b][k][i], rest[b][k][i],
                                              err_msg=f"restored batch {b} output {k} sample {i}")


# ---- 2./3. int64 extremes as per-sample argument inputs ----------------------------------------------
def _slice_op(x, s, sh, st, boundary, **kw):
    return dfn.strided_slice(x, s, sh, st, boundary=boundary, **kw)


def _run_args(x, start, shape, step, boundary, dom=None):
    """The CPU operator with start/shape/step (and domain) as per-sample int64 argument inputs."""
    arrs = [np.asarray(v, np.int64) for v in (start, shape, step)]
    if dom is None:
        return run_pipeline(lambda x, s, sh, st: _slice_op(x, s, sh, st, boundary),
                            [[x], [arrs[0]], [arrs[1]], [arrs[2]]])[0][0]
    d0, dn = (np.asarray(v, np.int64) for v in dom)
    return run_pipeline(
        lambda x, s, sh, st, a, b: _slice_op(x, s, sh, st, boundary, domain_start=a, domain_shape=b),
        [[x], [arrs[0]], [arrs[1]], [arrs[2]], [d0], [dn]])[0][0]


# (start, shape, step, boundary, domain or None, what the error names)
REFUSED = [
    # INT64_MIN (a NaN cast to int64) on the innermost axis: segfaulted with edge / constant
    ([0, I64_MIN], [2, 3], [1, 1], "edge", None, "start"),
    ([0, I64_MIN], [2, 3], [1, 1], "constant", None, "start"),
    # INT64_MIN / INT64_MAX on an outer axis with reflect: returned fill instead of data
    ([I64_MIN, 0], [2, 3], [1, 1], "reflect", None, "start"),
    ([I64_MAX, 0], [2, 3], [1, 1], "reflect", None, "start"),
    ([I64_MAX, 0], [1, 3], [1, 1], "symmetric", None, "start"),
    # start + (shape - 1) * step overflows int64
    ([0, 1], [2, 3], [2**62, 1], "periodic", None, "step"),
    ([0, 2**61], [2, 3], [1, 2**61], "periodic", None, "step"),
    ([5, 0], [2, 3], [I64_MAX, 1], "constant", None, "step"),
    # positions beyond +-2**62 without overflow
    ([-BIG, 0], [2, 3], [1, 1], "periodic", None, "2\\*\\*62"),
    ([BIG - 2, 0], [3, 3], [1, 1], "periodic", None, "2\\*\\*62"),
    # d0 + dn > extent overflowing
    ([0, 0], [2, 3], [1, 1], "constant", ([1, 0], [I64_MAX, 3]), "domain"),
    ([0, 0], [2, 3], [1, 1], "constant", ([I64_MAX, 0], [1, 3]), "domain"),
    # start - domain_start overflows
    ([I64_MIN, 0], [2, 3], [1, 1], "constant", ([1, 0], [1, 3]), "start"),
    # output volume overflowing int64
    ([0, 0], [2**40, 2**40], [1, 1], "constant", None, "shape"),
]


@pytest.mark.parametrize("start, shape, step, boundary, dom, match", REFUSED)
def test_int64_extremes_are_refused_by_the_cpu_operator(start, shape, step, boundary, dom, match):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    with pytest.raises(RuntimeError, match=match):
        _run_args(x, start, shape, step, boundary, dom)


@pytest.mark.parametrize("backend", ["cpu", "emulate"])
@pytest.mark.parametrize("start, shape, step, boundary, dom, match", REFUSED)
def test_int64_extremes_are_refused_by_the_kernels_library(backend, start, shape, step, boundary,
                                                           dom, match):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    if np.prod(np.asarray(shape, dtype=object)) > 2**30:
        # strided_slice_host would allocate the output first: the GPU plan (same checks) takes
        # any output pointers
        with pytest.raises(K.KernelsError, match=match):
            K.gpu_plan_info([x], start, shape, step, boundary, outs=[np.empty(1, np.float32)])
        return
    kw = {} if dom is None else {"domain_start": dom[0], "domain_shape": dom[1]}
    with pytest.raises(K.KernelsError, match=match):
        K.strided_slice_host([x], start, shape, step, boundary, backend=backend, **kw)


@pytest.mark.parametrize("backend", ["cpu", "emulate"])
def test_empty_sample_with_huge_extents(backend):
    """An empty sample may claim any extents: strides that do not fit int64 are refused, an empty
    sample whose strides fit gives a constant window."""
    # numpy refuses such arrays: call the library with the shapes (the data is never read)
    dummy = np.zeros(16, np.uint8)
    out = np.zeros((2, 1, 3, 4), np.uint8)
    bid = {"cpu": 0, "emulate": 1}[backend]
    K._call_slice(bid, None, [dummy.ctypes.data], [out.ctypes.data], [[2**30, 2**30, 0, 4]],
                  [-1, 5, 0, 0], [2, 1, 3, 4], 1, "constant", None, None, np.uint8, np.uint8, 9,
                  None, None, None, None)
    np.testing.assert_array_equal(out, np.full((2, 1, 3, 4), 9, np.uint8))
    with pytest.raises(K.KernelsError, match="strides do not fit"):  # 2**80 elements per index
        K._call_slice(bid, None, [dummy.ctypes.data], [out.ctypes.data], [[0, 2**40, 2**40, 2**40]],
                      [0, 0, 0, 0], [1, 1, 1, 1], 1, "constant", None, None, np.uint8, np.uint8, 0,
                      None, None, None, None)


@pytest.mark.parametrize("boundary", ["constant", "periodic", "reflect", "symmetric", "edge"])
def test_far_windows_just_inside_the_bound_are_exact(boundary):
    """Positions near +-2**62 (the largest allowed) and steps near 2**62 compute the right cells."""
    rng = np.random.default_rng(5)
    x = rng.integers(-100, 100, (3, 7)).astype(np.int16)
    cases = [
        ([-(BIG - 1), 2], [2, 4], [1, 1]),
        ([1, BIG - 5], [2, 5], [1, 1]),
        ([0, -(BIG - 1)], [3, 2], [1, BIG - 1]),  # one step lands near +2**62
        ([BIG - 1, 0], [1, 7], [BIG, 1]),  # one position on the axis: any step
        ([-(BIG - 1), -3], [1, 3], [3, BIG // 3]),
    ]
    for start, shape, step in cases:
        ref = K.reference_strided_slice(x, start, shape, step, boundary, fill_value=9)
        for backend in ("cpu", "emulate"):
            got = K.strided_slice_host([x], start, shape, step, boundary, fill_value=9, backend=backend)[0]
            np.testing.assert_array_equal(got, ref, err_msg=f"{backend} {start} {shape} {step}")
        got = _run_args(x, start, shape, step, boundary) if boundary != "constant" else None
        if got is not None:
            np.testing.assert_array_equal(got, ref, err_msg=f"operator {start} {shape} {step}")


def test_uint64_argument_input_beyond_int64_is_refused():
    """A uint64 2**64 - 1 was read as -1."""
    x = np.arange(8, dtype=np.int32)
    with pytest.raises(RuntimeError, match="start.*uint64 value 18446744073709551615"):
        run_pipeline(lambda x, s: dfn.strided_slice(x, s, [2], boundary="periodic"),
                     [[x], [np.array([2**64 - 1], np.uint64)]])
    out = run_pipeline(lambda x, s: dfn.strided_slice(x, s, [3], boundary="periodic"),
                       [[x], [np.array([2**62 - 3], np.uint64)]])[0][0]
    np.testing.assert_array_equal(out, x[[(2**62 - 3 + k) % 8 for k in range(3)]])


# ---- mesh_roi at 2**63 - 1 cells ------------------------------------------------------------------------
@pytest.mark.parametrize("split", ["chunk", "physicsnemo", "even"])
@pytest.mark.parametrize("n", [I64_MAX, I64_MAX - 1, 2**62 + 3])
def test_mesh_roi_of_huge_axes_is_exact(split, n):
    """chunk / physicsnemo gave a negative window for 2**63 - 1 cells (ceil(n / k) overflowed)."""
    for k in (2, 3, 7):
        for i in range(k):
            off, size = partition.shard_extent(n, k, i, split)
            ws, wsh = K.mesh_roi((n, 4), mesh_shape=[k], coordinate=[i], shard_axes=[0],
                                 halo_lo=[0], halo_hi=[0], boundary="constant", split=split)
            assert (ws, wsh) == ((off, 0), (size, 4)), (split, n, k, i)
    shapes = [np.array([n, 4], np.int64)]
    outs = run_pipeline(lambda s: dfn.mesh_roi(s, mesh_shape=[3], coordinate=[2], shard_axes=[0],
                                               split=split), [shapes])
    off, size = partition.shard_extent(n, 3, 2, split)
    assert tuple(outs[0][0]) == (off, 0) and tuple(outs[1][0]) == (size, 4)


def test_mesh_roi_halo_beyond_int64_is_refused():
    with pytest.raises(K.KernelsError, match="halo.*int64"):
        K.mesh_roi((I64_MAX, 4), mesh_shape=[2], coordinate=[1], shard_axes=[0], halo_lo=[0],
                   halo_hi=[1], boundary="constant")
    with pytest.raises(RuntimeError, match="halo.*int64"):
        run_pipeline(lambda s: dfn.mesh_roi(s, mesh_shape=[2], coordinate=[1], shard_axes=[0], halo_hi=1),
                     [[np.array([I64_MAX, 4], np.int64)]])
    with pytest.raises(RuntimeError, match="uint64"):
        run_pipeline(lambda s: dfn.mesh_roi(s, mesh_shape=[2], coordinate=[1], shard_axes=[0]),
                     [[np.array([2**64 - 1, 4], np.uint64)]])


# ---- exact fill values ----------------------------------------------------------------------------------
FILL_OK = [
    (16777217, np.int32),  # float32 rounded it to 16777216
    (-(2**31), np.int32),
    (2**53 + 1, np.int64),
    (I64_MIN, np.int64),
    (I64_MAX, np.int64),
    (2**64 - 1, np.uint64),
    (255, np.uint8),
    (1, np.bool_),
    (0.1, np.float64),  # exactly 0.1 in float64, not float32's 0.1
    (3.4028234663852886e38, np.float32),  # float32 max
    (float("inf"), np.float32),
    (-65504.0, np.float16),
    (2**60, np.float32),
]
FILL_REFUSED = [
    (1e39, np.float32),  # became inf
    (65520.0, np.float16),  # rounds to inf in float16
    (2**31, np.int32),
    (-1, np.uint64),
    (2**64 - 1, np.int64),
    (0.5, np.int16),
    (2, np.bool_),
    (float("nan"), np.int32),
    (2**64, np.uint64),
]


def _fill_oracle(value, dtype, shape):
    out = np.empty(shape, dtype)
    out[...] = np.array(value, dtype=object).astype(dtype) if np.dtype(dtype).kind in "iub" else value
    return out


@pytest.mark.parametrize("value, dtype", FILL_OK, ids=lambda v: repr(v))
def test_fill_value_is_carried_exactly(value, dtype):
    x = np.zeros((2, 3), dtype)
    ref = _fill_oracle(value, dtype, (4, 5))
    ref[1:3, 2:5] = x  # the window [-1, -2] of shape (4, 5): row 0/3 and columns 0/1 are fill
    outs = run_pipeline(lambda x: dfn.strided_slice(x, [-1, -2], [4, 5], fill_value=value), [[x]])
    np.testing.assert_array_equal(outs[0][0], ref)
    assert outs[0][0].dtype == np.dtype(dtype)
    for backend in ("cpu", "emulate"):
        got = K.strided_slice_host([x], [-1, -2], [4, 5], 1, "constant", fill_value=value,
                                   backend=backend)[0]
        np.testing.assert_array_equal(got, ref, err_msg=backend)


@pytest.mark.parametrize("value, dtype", FILL_REFUSED, ids=lambda v: repr(v))
def test_fill_value_the_output_cannot_hold_is_refused(value, dtype):
    x = np.zeros((2, 3), dtype)
    with pytest.raises(RuntimeError, match="fill_value"):
        run_pipeline(lambda x: dfn.strided_slice(x, [-1, -2], [4, 5], fill_value=value), [[x]])
    for backend in ("cpu", "emulate"):
        with pytest.raises(K.KernelsError, match="fill_value"):
            K.strided_slice_host([x], [-1, -2], [4, 5], 1, "constant", fill_value=value, backend=backend)
    if value != 2**64:  # (check_fill_value raises TypeError on integers beyond uint64)
        with pytest.raises(partition.LayoutError, match="fill_value"), np.errstate(over="ignore"):
            partition.check_fill_value(value, dtype)  # the readers agree


def test_fill_value_with_a_cast_is_held_by_the_output_type():
    """The fill value is checked against (and written in) the output type, not the input's."""
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    outs = run_pipeline(lambda x: dfn.strided_slice(x, [0, -1], [2, 4], fill_value=16777217,
                                                    dtype=types.INT32), [[x]])
    ref = np.full((2, 4), 16777217, np.int32)
    ref[:, 1:] = x
    np.testing.assert_array_equal(outs[0][0], ref)


# ---- the Python wrapper refuses silent coercions (issue 9 item 15) ----------------------------------
@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(start=[1.7, 0]), TypeError, "start entry must be an integer.*1.7"),
    (dict(start=1.0), TypeError, "start must be an integer"),
    (dict(start="0"), TypeError, "start must be an int"),
    (dict(step=True), TypeError, "step must be an integer.*True"),
    (dict(step=[1, np.True_]), TypeError, "step entry must be an integer"),
    (dict(shape=[2, 2.0]), TypeError, "shape entry"),
    (dict(start=[np.uint64(2**64 - 1), 0]), ValueError, "start value 18446744073709551615"),
    (dict(std=[float("inf")], mean=[0.0]), ValueError, "std\\[0\\] is inf"),
    (dict(std=[0.0], mean=[0.0]), ValueError, "std\\[0\\] is 0"),
    (dict(mean=[float("nan")]), ValueError, "mean\\[0\\] is nan"),
    (dict(mean=[1e39]), ValueError, "mean\\[0\\].*overflows float32"),
    (dict(mean=["a"]), TypeError, "mean\\[0\\] must be a number"),
    (dict(channel_axis=0), ValueError, "channel_axis=0 is given without mean or std"),
    (dict(channel_axis=0.0, mean=[1.0]), TypeError, "channel_axis must be an integer"),
    (dict(axes=[0, 1.5]), TypeError, "axes entry"),
    (dict(fill_value="abc"), TypeError, "fill_value must be an int or a float"),
    (dict(fill_value=None), TypeError, "fill_value must be an int or a float"),
    (dict(fill_value=True), TypeError, "fill_value must be an int or a float"),
    (dict(boundary=None), TypeError, "boundary must be a name or a sequence of names"),
    (dict(boundary=["edge", 3]), TypeError, "boundary must be a name"),
    (dict(mean=[10**400]), ValueError, "mean\\[0\\].*overflows float32"),
])
def test_strided_slice_wrapper_refuses_coercions(kwargs, exc, match):
    args = dict(start=[0, 0], shape=[2, 2])
    args.update(kwargs)

    @pipeline_def(batch_size=1, num_threads=1, device_id=None)
    def pipe():
        x = fn.constant(fdata=[1.0, 2.0, 3.0, 4.0], shape=[2, 2], dtype=types.FLOAT)
        return dfn.strided_slice(x, **args)

    with pytest.raises(exc, match=match):
        pipe()


def test_strided_slice_wrapper_accepts_numpy_integers_and_floats():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    outs = run_pipeline(lambda x: dfn.strided_slice(
        x, [np.int64(-1), np.int32(1)], (np.uint8(4), 2), np.int16(2), axes=[np.int64(0), 1],
        boundary="periodic", channel_axis=np.int8(0), mean=np.array([1.0, 2, 3], np.float32),
        std=[np.float64(2.0), 1, 4]), [[x]])
    ref = K.reference_strided_slice(x, [-1, 1], [4, 2], [2, 2], "periodic", channel_axis=0,
                                    mean=[1.0, 2, 3], std=[2.0, 1, 4])
    np.testing.assert_array_equal(outs[0][0], ref)


@pytest.mark.parametrize("backend", ["cpu", "emulate"])
@pytest.mark.parametrize("side", ["in", "out"])
def test_kernels_refuse_misaligned_elements(backend, side):
    """Typed loads and stores need elements at their natural alignment (on a GPU a misaligned access
    loses the CUDA context; on the CPU it was undefined behaviour): a float32 view at an odd byte
    offset is refused by every backend of the C API, naming the sizes."""
    raw = np.zeros(4 * 12 * 4 + 64, np.uint8)
    base = (-raw.ctypes.data) % 64 + 1
    odd = raw[base:base + 4 * 12 * 4].view(np.float32)
    assert odd.ctypes.data % 4 == 1
    x = np.arange(40, dtype=np.float32).reshape(4, 10)
    kw = {}
    if side == "in":
        x = odd[:40].reshape(4, 10)
        x[...] = np.arange(40, dtype=np.float32).reshape(4, 10)
    else:
        kw["out"] = [odd.reshape(4, 12)]
    with pytest.raises(K.KernelsError, match="aligned to their element sizes"):
        K.strided_slice_host([x], [0, -1], [4, 12], 1, "periodic", backend=backend, **kw)
    got = K.strided_slice_host([np.array(x)], [0, -1], [4, 12], 1, "periodic", backend=backend)[0]
    np.testing.assert_array_equal(got, np.pad(np.array(x), ((0, 0), (1, 1)), mode="wrap"))
