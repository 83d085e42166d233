"""The GPU plan on the host (issue 8 performance items): each sample chooses its own vector width,
the common cast/normalise pairs take typed kernels, and the kernel body (run on the host by the
emulation, with a grid smaller than the block count: the grid-stride loop) equals numpy and the CPU
kernel. No GPU and no DALI needed."""
from __future__ import annotations

import numpy as np
import pytest

from dali_mesh import _kernels as K
from oracles import SEED

if not K.library_path().exists():
    pytest.skip(f"{K.library_path()} is not built", allow_module_level=True)


def _aligned(shape, dtype, offset_bytes=0):
    """An array whose first element is `offset_bytes` past a 64-byte boundary."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape)) * dtype.itemsize
    raw = np.zeros(n + offset_bytes + 64, np.uint8)
    base = (-raw.ctypes.data) % 64 + offset_bytes
    return raw[base:base + n].view(dtype).reshape(shape)


def test_vector_width_is_chosen_per_sample():
    """One odd-sized uint8 tile no longer drops the whole batch to 1-byte moves."""
    rng = np.random.default_rng(SEED)
    a = _aligned((8, 64), np.uint8)
    a[...] = rng.integers(0, 255, a.shape)
    b = _aligned((7, 33), np.uint8, 1)  # odd row length, misaligned pointer
    b[...] = rng.integers(0, 255, b.shape)
    starts, shapes = [[1, 16], [1, 3]], [[6, 32], [5, 29]]
    outs = [_aligned(s, np.uint8) for s in shapes]
    info = K.gpu_plan_info([a, b], starts, shapes, outs=outs)
    assert info["sample_elem_sizes"] == [16, 1] and info["elem_size"] == 16, info
    assert info["conv"] == "copy" and not info["need_pad"]
    got = K.strided_slice_host([a, b], starts, shapes, backend="emulate", out=outs)
    for x, s, sh, g in zip([a, b], starts, shapes, got):
        np.testing.assert_array_equal(g, x[s[0]:s[0] + sh[0], s[1]:s[1] + sh[1]], err_msg=f"seed {SEED}")


def test_mixed_widths_with_padding_in_one_batch():
    rng = np.random.default_rng(SEED)
    xs = [_aligned((6, 64), np.float32), _aligned((5, 30), np.float32, 4), _aligned((9, 16), np.float32)]
    for x in xs:
        x[...] = rng.normal(size=x.shape)
    starts = [[-2, 4], [0, -1], [1, 2]]
    shapes = [[10, 8], [5, 33], [7, 12]]
    bounds = [["periodic", "constant"], ["constant", "periodic"], ["constant", "constant"]]
    outs = [_aligned(s, np.float32) for s in shapes]
    info = K.gpu_plan_info(xs, starts, shapes, 1, bounds, outs=outs)
    assert info["sample_elem_sizes"] == [16, 4, 8] and info["need_pad"], info
    got = K.strided_slice_host(xs, starts, shapes, 1, bounds, fill_value=-3, backend="emulate", out=outs)
    for i, x in enumerate(xs):
        ref = K.reference_strided_slice(x, starts[i], shapes[i], 1, bounds[i], fill_value=-3)
        np.testing.assert_array_equal(got[i], ref, err_msg=f"seed {SEED} sample {i}")


@pytest.mark.parametrize("in_dt, out_dt, nch, conv", [
    (np.float32, np.float16, 0, "float32->float16"),
    (np.float32, np.float16, 3, "float32->float16"),
    (np.float32, np.float32, 3, "float32->float32"),
    (np.uint8, np.float32, 0, "uint8->float32"),
    (np.uint8, np.float32, 3, "uint8->float32"),
    (np.float16, np.float32, 0, "float16->float32"),
    (np.float16, np.float32, 1, "float16->float32"),
    (np.int16, np.float32, 0, "generic"),
    (np.float32, np.float64, 3, "generic"),
    (np.float64, np.float16, 0, "generic"),
])
def test_typed_conversion_kernels_equal_numpy_and_cpu(in_dt, out_dt, nch, conv):
    rng = np.random.default_rng(SEED)
    shape = (3, 13, 21)
    if np.dtype(in_dt).kind in "iu":
        info = np.iinfo(in_dt)
        x = rng.integers(info.min, info.max, shape, endpoint=True).astype(in_dt)
    else:
        with np.errstate(over="ignore"):  # values beyond float16: inf, on purpose
            x = (rng.normal(0, 300, shape) * np.exp(rng.normal(0, 6, shape))).astype(in_dt)
            flat = x.reshape(-1)
            specials = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-8, 6e-5, 65519.9, 65520.0, 3e38]
            flat[:len(specials)] = np.asarray(specials).astype(in_dt)
    mean = std = None
    kw = {}
    if nch:
        mean = [1.5, -2.0, 100.0][:nch]
        std = [2.0, 0.5, 30.0][:nch]
        kw = dict(mean=mean, std=std, channel_axis=0 if nch > 1 else None)
    start, wshape = [0, -2, -5], [3, 17, 30]
    bounds = ["constant", "reflect", "periodic"]
    info = K.gpu_plan_info([x], start, wshape, 1, bounds, dtype=out_dt, normalize_channels=nch)
    assert info["conv"] == conv and info["convert"], info
    with np.errstate(over="ignore", invalid="ignore"):
        ref = K.reference_strided_slice(x, start, wshape, 1, bounds, dtype=out_dt, fill_value=7, **kw)
    emu = K.strided_slice_host([x], start, wshape, 1, bounds, dtype=out_dt, fill_value=7,
                               backend="emulate", **kw)[0]
    cpu = K.strided_slice_host([x], start, wshape, 1, bounds, dtype=out_dt, fill_value=7,
                               backend="cpu", **kw)[0]
    msg = f"seed {SEED} {np.dtype(in_dt)}->{np.dtype(out_dt)} nch={nch}"
    np.testing.assert_array_equal(emu, ref, err_msg=msg + " (emulation vs numpy)")
    # bit for bit with the CPU kernel (NaN payloads included)
    assert emu.tobytes() == cpu.tobytes(), msg + " (emulation vs CPU kernel)"


def test_misaligned_typed_conversion_falls_back_to_the_generic_kernel():
    """Typed kernels dereference typed pointers: a misaligned output (possible through the C API)
    takes the generic kernel, with the same result."""
    rng = np.random.default_rng(SEED)
    x = rng.normal(size=(4, 10)).astype(np.float32)
    raw = np.zeros(4 * 12 * 2 + 65, np.uint8)
    base = (-raw.ctypes.data) % 64 + 1
    out = raw[base:base + 4 * 12 * 2].view(np.float16).reshape(4, 12)
    assert out.ctypes.data % 2 == 1
    info = K.gpu_plan_info([x], [0, -1], [4, 12], 1, "periodic", dtype=np.float16, outs=[out])
    assert info["conv"] == "generic"
    got = K.strided_slice_host([x], [0, -1], [4, 12], 1, "periodic", dtype=np.float16,
                               backend="emulate", out=[out])[0]
    np.testing.assert_array_equal(got, K.reference_strided_slice(x, [0, -1], [4, 12], 1, "periodic",
                                                                 dtype=np.float16))


def test_many_blocks_through_a_small_grid():
    """Thousands of block descriptors run by the emulation's grid of 3 blocks (the kernel's
    grid-stride loop) cover every output element exactly once."""
    rng = np.random.default_rng(SEED)
    xs = [rng.integers(-1000, 1000, (3, 70, 90)).astype(np.int32) for _ in range(3)]
    starts, shapes = [-1, -5, -7], [5, 80, 104]
    bounds = ["symmetric", "edge", "periodic"]
    info = K.gpu_plan_info(xs, starts, shapes, 1, bounds)
    assert info["num_blocks"] > 3 * 10
    got = K.strided_slice_host(xs, starts, shapes, 1, bounds, backend="emulate")
    for i, x in enumerate(xs):
        np.testing.assert_array_equal(got[i], K.reference_strided_slice(x, starts, shapes, 1, bounds),
                                      err_msg=f"seed {SEED} sample {i}")
