"""The GPU plan on the host (issue 8 performance items): each sample chooses its own vector width,
the common cast/normalise pairs take typed kernels, and the kernel body (run on the host by the
emulation, with a grid smaller than the block count: the grid-stride loop) equals numpy and the CPU
kernel. No GPU and no DALI needed."""
from __future__ import annotations

import numpy as np
import pytest

from dali_mesh import _kernels as K
from tests.helpers import MODES, SEED, random_array

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
    """Typed kernels dereference typed pointers: the plan gives a misaligned output the generic
    kernel; the C API refuses to run element-misaligned buffers at all."""
    rng = np.random.default_rng(SEED)
    x = rng.normal(size=(4, 10)).astype(np.float32)
    raw = np.zeros(4 * 12 * 2 + 65, np.uint8)
    base = (-raw.ctypes.data) % 64 + 1
    out = raw[base:base + 4 * 12 * 2].view(np.float16).reshape(4, 12)
    assert out.ctypes.data % 2 == 1
    info = K.gpu_plan_info([x], [0, -1], [4, 12], 1, "periodic", dtype=np.float16, outs=[out])
    assert info["conv"] == "generic"
    # the C API refuses to run it (element-misaligned buffers): the plan's fallback serves the
    # operators, whose buffers DALI aligns
    with pytest.raises(K.KernelsError, match="aligned to their element sizes"):
        K.strided_slice_host([x], [0, -1], [4, 12], 1, "periodic", dtype=np.float16, backend="emulate", out=[out])


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


# ---- windows with a halo: the in-bounds box moves like an unpadded copy, the strips pad ------------
def _emulate_equals_numpy_and_cpu(xs, starts, shapes, steps, bounds, outs, msg, fill=3, **kw):
    """The emulation into `outs` (their alignment matters) equals numpy and the CPU kernel, and the
    plan's pieces partition the outputs (every element written once: no overlap, no gap)."""
    if not kw:  # gpu_plan_info plans copies and normalisation over axis 0 only
        info = K.gpu_plan_info(xs, starts, shapes, steps, bounds, outs=outs)
        assert info["piece_elements"] == sum(int(np.prod(s)) for s in shapes), (msg, info)
    got = K.strided_slice_host(xs, starts, shapes, steps, bounds, fill_value=fill, backend="emulate",
                               out=outs, **kw)
    cpu = K.strided_slice_host(xs, starts, shapes, steps, bounds, fill_value=fill, backend="cpu", **kw)
    for i, x in enumerate(xs):
        ref = K.reference_strided_slice(x, starts[i], shapes[i], steps[i], bounds[i], fill_value=fill,
                                        **{"dtype": got[i].dtype, **kw})
        np.testing.assert_array_equal(got[i], ref, err_msg=f"{msg} sample {i} (emulation vs numpy)")
        assert got[i].tobytes() == cpu[i].tobytes(), f"{msg} sample {i} (emulation vs CPU kernel)"


@pytest.mark.parametrize("mode", MODES)
def test_whole_rows_plus_a_halo_row_move_16_bytes(mode):
    """Rows of 65536 uint8 with a halo row above (rank 0 of a row split): once merged into one
    padded axis (1-byte moves); now the in-bounds rows are one contiguous 16-byte copy and the halo
    row a strip of its own (whole rows: 16-byte moves too, the padding chosen per row)."""
    rng = np.random.default_rng(SEED)
    x = _aligned((3, 65536), np.uint8)
    x[...] = rng.integers(0, 256, x.shape)
    out = _aligned((3, 65536), np.uint8)
    info = K.gpu_plan_info([x], [-1, 0], [3, 65536], 1, mode, outs=[out])
    assert info["sample_elem_sizes"] == [16] and info["elem_size"] == 16, info
    assert info["num_pieces"] == 2 and info["need_pad"], info  # the box and the halo row
    _emulate_equals_numpy_and_cpu([x], [[-1, 0]], [[3, 65536]], [[1, 1]], [[mode] * 2], [out],
                                  f"seed {SEED} {mode}", fill=7)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("halo, dtype, box_width", [
    (4, np.float32, 16),  # 16 bytes of halo: input and output rows stay 16-byte aligned together
    (16, np.uint8, 16),
    (2, np.float32, 8),   # ERA5's 2 cells: output = input + 8 bytes (mod 16) on every cell: 8-byte moves
    (1, np.float64, 8),
    (3, np.uint16, 2),    # 6 bytes: only element moves line up
])
def test_halo_on_the_innermost_axis_keeps_vector_moves_in_the_box(mode, halo, dtype, box_width):
    """An ERA5-like row band of one rank with a periodic longitude halo: the in-bounds box moves the
    widest vectors its alignment against the output allows (once: element moves everywhere)."""
    rng = np.random.default_rng(SEED)
    shape = (3, 13, 64)
    x = _aligned(shape, dtype)
    x[...] = random_array(rng, shape, dtype)
    start, wshape = [0, 3, -halo], [3, 5, 64 + 2 * halo]
    bounds = ["constant", "constant", mode]
    out = _aligned(wshape, dtype)
    info = K.gpu_plan_info([x], start, wshape, 1, bounds, outs=[out])
    assert info["sample_elem_sizes"] == [box_width] and info["num_pieces"] == 3, info
    _emulate_equals_numpy_and_cpu([x], [start], [wshape], [[1] * 3], [bounds], [out],
                                  f"seed {SEED} {mode} halo {halo} {np.dtype(dtype)}")
    # with a halo row above and below too (rank 0 and 3 at once): a box and four strips
    start, wshape = [0, -1, -halo], [3, 15, 64 + 2 * halo]
    bounds = ["constant", mode, mode]
    out = _aligned(wshape, dtype)
    info = K.gpu_plan_info([x], start, wshape, 1, bounds, outs=[out])
    assert info["sample_elem_sizes"] == [box_width] and info["num_pieces"] == 5, info
    _emulate_equals_numpy_and_cpu([x], [start], [wshape], [[1] * 3], [bounds], [out],
                                  f"seed {SEED} {mode} halo {halo} {np.dtype(dtype)} rows")


def test_halo_with_normalise_and_cast_in_pieces():
    """The typed conversion kernels run the pieces too (channel taken from the source index)."""
    rng = np.random.default_rng(SEED)
    x = rng.normal(0, 50, (3, 21, 40)).astype(np.float32)
    kw = dict(mean=[1.5, -2.0, 100.0], std=[2.0, 0.5, 30.0], channel_axis=0)
    for start, wshape, bounds in (([0, 4, -2], [3, 7, 44], ["constant", "constant", "periodic"]),
                                  ([-1, -1, -3], [5, 23, 46], ["reflect", "edge", "symmetric"])):
        info = K.gpu_plan_info([x], start, wshape, 1, bounds, dtype=np.float16, normalize_channels=3)
        assert info["conv"] == "float32->float16" and info["num_pieces"] > 1, info
        _emulate_equals_numpy_and_cpu([x], [start], [wshape], [[1] * 3], [bounds],
                                      [_aligned(wshape, np.float16)], f"seed {SEED} {start} {wshape}",
                                      fill=7, dtype=np.float16, **kw)


def test_random_halo_windows_vector_paths_every_mode():
    """Random windows with halos on 1-5 axes, dtypes of 1/2/4/8 bytes, every boundary rule, steps,
    pointers off vector alignment, several samples per batch: the pieces' emulation equals numpy and
    the CPU kernel. Inner extents are multiples of 16 bytes often enough for every vector width."""
    rng = np.random.default_rng(SEED)
    dtypes = [np.uint8, np.int16, np.float16, np.float32, np.int32, np.float64, np.uint64]
    for case in range(300):
        ndim = int(rng.integers(1, 6))
        dtype = np.dtype(dtypes[rng.integers(len(dtypes))])
        modes = [MODES[rng.integers(5)] for _ in range(ndim)]
        xs, outs, starts, shapes, steps = [], [], [], [], []
        for _ in range(int(rng.integers(1, 4))):
            v = 16 // dtype.itemsize  # elements per 16 bytes
            # half the samples keep the inner axis on 16-byte boundaries (the vector paths), the
            # others take any offset, halo and step
            friendly = rng.random() < 0.5
            sh = [int(rng.integers(1, 5)) for _ in range(ndim - 1)]
            sh.append(int(rng.choice([1, 2, 3, 4])) * v + (0 if friendly else int(rng.integers(0, 2))))
            off = 0 if friendly else int(rng.choice([0, 1, 2, 3, 5])) * dtype.itemsize
            x = _aligned(sh, dtype, off)
            x[...] = random_array(rng, sh, dtype)
            st, ws, sp = [], [], []
            for a, n in enumerate(sh):
                inner_ok = friendly and a == ndim - 1
                h = int(rng.choice([0, 1, 2, 4, 8, 16])) if rng.random() < 0.7 else 0
                if inner_ok:
                    h = v * int(rng.integers(0, 2))
                if rng.random() < 0.1 and not inner_ok:  # far: wholly outside, periods away
                    st.append(int(rng.integers(-3 * n, 3 * n)))
                    ws.append(int(rng.integers(1, 2 * n + 1)))
                elif inner_ok:
                    lo = v * int(rng.integers(0, n // v))
                    hi = v * int(rng.integers(lo // v + 1, n // v + 1))
                    st.append(lo - h)
                    ws.append(hi - lo + 2 * h)
                else:
                    lo = int(rng.integers(0, n))
                    hi = int(rng.integers(lo + 1, n + 1))
                    st.append(lo - h)
                    ws.append(hi - lo + 2 * h)
                sp.append(1 if inner_ok or rng.random() < 0.8 else int(rng.integers(2, 4)))
            ws = [-(-w // s) for w, s in zip(ws, sp)]  # the same reach with a step
            xs.append(x)
            starts.append(st)
            shapes.append(ws)
            steps.append(sp)
            outs.append(_aligned(ws, dtype, 0 if friendly else int(rng.choice([0, 1, 2])) * dtype.itemsize))
        bounds = [modes] * len(xs)
        _emulate_equals_numpy_and_cpu(xs, starts, shapes, steps, bounds, outs,
                                      f"seed {SEED} case {case} {dtype} {starts} {shapes} {steps} {modes}",
                                      fill=1)


@pytest.mark.parametrize("in_dt, out_dt", [(np.float32, np.float16), (np.float32, np.float32),
                                           (np.uint8, np.float32), (np.float16, np.float32)])
@pytest.mark.parametrize("norm", [False, True])
def test_typed_conversions_move_several_elements_in_the_box(in_dt, out_dt, norm):
    """The typed cast/normalise kernels read and write 4 or 2 elements at once in the in-bounds box
    where both sides line up (halo strips: one element at a time), bit for bit as the CPU kernel."""
    rng = np.random.default_rng(SEED)
    isz = np.dtype(in_dt).itemsize
    x = _aligned((3, 9, 64), in_dt)
    x[...] = random_array(rng, x.shape, in_dt, beyond_int=False)
    if np.dtype(in_dt).kind == "f":
        x[...] = np.clip(x, -6e4, 6e4)
    kw = dict(mean=[1.5, -2.0, 100.0], std=[2.0, 0.5, 30.0], channel_axis=0) if norm else {}
    bounds = ["constant", "constant", "periodic"]
    for start, wshape, out_off, vec in (([0, 1, 8], [3, 6, 48], 0, 4),   # inside
                                        ([0, 1, -4], [3, 6, 72], 0, 4),  # halo of 4: box 4-aligned
                                        ([0, -1, -2], [3, 11, 68], 0, 2),  # halo of 2
                                        ([0, 1, 8], [3, 6, 48], 1, 1)):  # output one element off
        out = _aligned(wshape, out_dt, out_off * np.dtype(out_dt).itemsize)
        info = K.gpu_plan_info([x], start, wshape, 1, bounds, out_dt, normalize_channels=3 if norm else 0,
                               outs=[out])
        assert info["conv"] != "generic" and info["sample_elem_sizes"] == [vec * isz], (start, info)
        with np.errstate(over="ignore", invalid="ignore"):
            _emulate_equals_numpy_and_cpu([x], [start], [wshape], [[1] * 3], [bounds], [out],
                                          f"seed {SEED} {np.dtype(in_dt)}->{np.dtype(out_dt)} {start}",
                                          fill=7, dtype=out_dt, **kw)
