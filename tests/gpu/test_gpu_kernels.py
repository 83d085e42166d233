"""The CUDA strided slice (the code the DALI GPU operator launches), through the DALI-free library
on torch/cupy device memory, against numpy and against its own host emulation. Skipped without a
GPU. Random data each run; the seed is in failure messages (DALI_MESH_TEST_SEED replays)."""
from __future__ import annotations

import numpy as np
import pytest

from dali_mesh import _kernels as K
from tests.helpers import DTYPES, MODES, SEED, random_array

pytestmark = pytest.mark.gpu


def run_cuda(device, samples, start, shape, step, boundary, *, dtype=None, in_offset=0,
             out_offset=0, launcher=None, **kw):
    """Copies samples to the device, runs the kernel, returns host outputs (and the emulation's)."""
    n = len(samples)
    out_dtype = np.dtype(dtype) if dtype is not None else (
        np.dtype(np.float32) if kw.get("mean") is not None else samples[0].dtype)
    starts = start if np.ndim(start) == 2 else [start] * n
    shapes = shape if np.ndim(shape) == 2 else [shape] * n
    steps = step if np.ndim(step) == 2 else [[step] * samples[0].ndim if np.ndim(step) == 0 else step] * n
    bounds = boundary if isinstance(boundary, list) and boundary and isinstance(boundary[0], list) else (
        [[boundary] * samples[0].ndim] * n if isinstance(boundary, str) else [boundary] * n)
    ins = [device.to_device(x, in_offset) for x in samples]
    outs = [device.empty(int(np.prod(sh)) * out_dtype.itemsize + out_offset) for sh in shapes]
    K.strided_slice_device([device.ptr(b, in_offset) for b in ins], [device.ptr(o, out_offset) for o in outs],
                           [x.shape for x in samples], starts, shapes, steps, bounds,
                           in_dtype=samples[0].dtype, out_dtype=out_dtype, stream=device.stream(),
                           launcher=launcher, **kw)
    device.sync()
    got = [device.to_host(o, out_offset, tuple(sh), out_dtype) for o, sh in zip(outs, shapes)]
    emu = K.strided_slice_host(samples, starts, shapes, steps, bounds, dtype=out_dtype,
                               backend="emulate", **kw)
    return got, emu, starts, shapes, steps, bounds, out_dtype


def check(samples, got, emu, starts, shapes, steps, bounds, out_dtype, msg, **kw):
    for i, x in enumerate(samples):
        ref = K.reference_strided_slice(x, starts[i], shapes[i], steps[i], bounds[i], dtype=out_dtype, **kw)
        np.testing.assert_array_equal(got[i], ref, err_msg=f"{msg} sample {i} (vs numpy)")
        np.testing.assert_array_equal(got[i], emu[i], err_msg=f"{msg} sample {i} (vs host emulation)")


def test_random_windows_every_mode_and_dtype(device):
    rng = np.random.default_rng(SEED)
    with K.CudaLauncher() as launcher:  # reused across batches of growing size
        for case in range(200):
            ndim = int(rng.integers(1, 6))
            in_dt = DTYPES[rng.integers(len(DTYPES))]
            out_dt = in_dt if rng.random() < 0.5 else DTYPES[rng.integers(len(DTYPES))]
            modes = [MODES[rng.integers(5)] for _ in range(ndim)]
            samples, starts, shapes, steps, bounds = [], [], [], [], []
            for _ in range(int(rng.integers(1, 5))):
                sh = [int(rng.integers(1, 9)) for _ in range(ndim)]
                samples.append(random_array(rng, sh, in_dt))
                starts.append([int(rng.integers(-3 * n - 3, 3 * n + 3)) for n in sh])
                shapes.append([int(rng.integers(0 if rng.random() < 0.05 else 1, 12)) for _ in sh])
                steps.append([int(rng.integers(1, 4)) for _ in sh])
                bounds.append(modes)
            fill = 1.0 if np.dtype(out_dt) == np.bool_ else float(rng.integers(-5, 100))
            if np.dtype(out_dt).kind == "u":
                fill = abs(fill)
            got, emu, *rest = run_cuda(device, samples, starts, shapes, steps, bounds, dtype=out_dt,
                                       fill_value=fill, launcher=launcher)
            check(samples, got, emu, *rest,
                  f"seed {SEED} case {case} {np.dtype(in_dt)}->{np.dtype(out_dt)} {starts} {shapes} {steps} {modes}",
                  fill_value=fill)


@pytest.mark.parametrize("in_offset,out_offset", [(0, 0), (4, 0), (0, 8), (2, 6)])
def test_vector_paths_and_alignment(device, in_offset, out_offset):
    """16-byte moves where extent and alignment allow, narrower where they do not."""
    rng = np.random.default_rng(SEED)
    cases = [
        (np.float32, (6, 40, 96), [1, 3, 8], [4, 30, 80], "constant"),
        (np.float32, (6, 40, 96), [-2, -3, 8], [10, 46, 80], ["periodic", "reflect", "constant"]),
        (np.uint8, (5, 33, 64), [0, 0, 16], [5, 33, 32], "constant"),
        (np.float64, (3, 20, 30), [0, 2, 2], [3, 16, 26], "edge"),
        (np.int16, (7, 50), [-9, -13], [25, 77], ["symmetric", "periodic"]),
    ]
    for dtype, shape, start, wshape, bnd in cases:
        samples = [random_array(rng, shape, dtype) for _ in range(3)]
        if in_offset % np.dtype(dtype).itemsize or out_offset % np.dtype(dtype).itemsize:
            continue  # elements themselves must stay aligned
        got, emu, *rest = run_cuda(device, samples, start, wshape, 1, bnd if isinstance(bnd, str) else [bnd] * 3,
                                   in_offset=in_offset, out_offset=out_offset, fill_value=2)
        check(samples, got, emu, *rest, f"seed {SEED} {np.dtype(dtype)} {shape} {start} {wshape}",
              fill_value=2)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.uint8, np.int32])
def test_normalise_and_cast(device, dtype):
    rng = np.random.default_rng(SEED)
    x = random_array(rng, (3, 17, 40), dtype)
    if np.dtype(dtype).kind == "f":
        x = np.clip(x, -6e4, 6e4).astype(dtype)
    mean, std = [1.5, -2.0, 100.0], [2.0, 0.5, 30.0]
    for out_dt in (np.float32, np.float16, np.uint8, np.int16):
        got, emu, *rest = run_cuda(device, [x], [0, -2, -5], [3, 21, 50], 1,
                                   ["constant", "constant", "periodic"], dtype=out_dt,
                                   fill_value=7, channel_axis=0, mean=mean, std=std)
        check([x], got, emu, *rest, f"seed {SEED} {np.dtype(dtype)}->{np.dtype(out_dt)}",
              fill_value=7, channel_axis=0, mean=mean, std=std)
    # channel axis innermost (HWC) with a reflected window
    y = random_array(rng, (9, 11, 3), dtype)
    got, emu, *rest = run_cuda(device, [y], [-2, -3, -2], [13, 17, 7], [1, 2, 1], "reflect",
                               channel_axis=-1, mean=mean, std=std, fill_value=0)
    check([y], got, emu, *rest, f"seed {SEED} HWC", channel_axis=-1, mean=mean, std=std, fill_value=0)


def test_large_batch_many_blocks(device):
    rng = np.random.default_rng(SEED)
    samples = [rng.normal(size=(8, 361, 720)).astype(np.float32) for _ in range(3)]
    for start, wshape, bnd in (([0, 90, 0], [8, 93, 720], "constant"),
                               ([0, 89, -2], [8, 95, 724], ["constant", "constant", "periodic"]),
                               ([-1, -300, -800], [10, 961, 2300], ["reflect", "symmetric", "periodic"])):
        got, emu, *rest = run_cuda(device, samples, start, wshape, 1, bnd if isinstance(bnd, str) else bnd,
                                   fill_value=-1)
        check(samples, got, emu, *rest, f"seed {SEED} {start} {wshape}", fill_value=-1)


def test_domain_box(device):
    rng = np.random.default_rng(SEED)
    x = random_array(rng, (6, 9, 10), np.int32)
    got, emu, *rest = run_cuda(device, [x], [0, -1, -3], [6, 9, 14], 1, ["edge", "periodic", "reflect"],
                               domain_start=[1, 1, 2], domain_shape=[4, 7, 6], fill_value=0)
    check([x], got, emu, *rest, f"seed {SEED} domain", domain_start=[1, 1, 2], domain_shape=[4, 7, 6],
          fill_value=0)


def test_launcher_ring_many_batches_without_a_sync(device):
    """One launcher, more batches than its ring of staging slots, growing descriptor blobs, no sync
    between launches: every output is right (a slot is reused only after its kernel ran)."""
    rng = np.random.default_rng(SEED)
    batches = []
    with K.CudaLauncher() as launcher:
        for b in range(11):
            n = 1 + b % 4 + b // 3  # the blob grows: more samples, more blocks
            samples = [random_array(rng, (3, 20 + 7 * b, 33), np.float32) for _ in range(n)]
            start, wshape, bnd = [-1, -2, -3], [5, 24 + 7 * b, 40], ["reflect", "constant", "periodic"]
            ins = [device.to_device(x) for x in samples]
            outs = [device.empty(int(np.prod(wshape)) * 4) for _ in samples]
            K.strided_slice_device([device.ptr(i) for i in ins], [device.ptr(o) for o in outs],
                                   [x.shape for x in samples], start, wshape, 1, bnd,
                                   in_dtype=np.float32, fill_value=-1, stream=device.stream(),
                                   launcher=launcher)
            batches.append((samples, ins, outs, start, wshape, bnd))
        device.sync()
    for b, (samples, _ins, outs, start, wshape, bnd) in enumerate(batches):
        for i, x in enumerate(samples):
            got = device.to_host(outs[i], 0, tuple(wshape), np.float32)
            ref = K.reference_strided_slice(x, start, wshape, 1, bnd, fill_value=-1)
            np.testing.assert_array_equal(got, ref, err_msg=f"seed {SEED} batch {b} sample {i}")


def test_mixed_vector_widths_in_one_batch(device):
    """An aligned sample (16-byte moves) and an odd-sized, misaligned one (1-byte moves) together."""
    rng = np.random.default_rng(SEED)
    a = rng.integers(0, 255, (8, 64)).astype(np.uint8)
    b = rng.integers(0, 255, (7, 33)).astype(np.uint8)
    ins = [device.to_device(a), device.to_device(b, 1)]
    shapes = [[6, 32], [5, 29]]
    outs = [device.empty(6 * 32), device.empty(5 * 29)]
    K.strided_slice_device([device.ptr(ins[0]), device.ptr(ins[1], 1)], [device.ptr(o) for o in outs],
                           [a.shape, b.shape], [[1, 16], [1, 3]], shapes, 1, "constant",
                           in_dtype=np.uint8, stream=device.stream())
    device.sync()
    np.testing.assert_array_equal(device.to_host(outs[0], 0, (6, 32), np.uint8), a[1:7, 16:48])
    np.testing.assert_array_equal(device.to_host(outs[1], 0, (5, 29), np.uint8), b[1:6, 3:32])


@pytest.mark.parametrize("in_dt, out_dt, norm", [
    (np.float32, np.float16, False), (np.float32, np.float16, True), (np.float32, np.float32, True),
    (np.uint8, np.float32, False), (np.uint8, np.float32, True), (np.float16, np.float32, False),
    (np.float16, np.float32, True),
])
def test_typed_conversion_kernels_bit_exact(device, in_dt, out_dt, norm):
    """The typed cast/normalise kernels equal the host emulation bit for bit and numpy."""
    rng = np.random.default_rng(SEED)
    x = random_array(rng, (3, 40, 70), in_dt, beyond_int=False)
    kw = dict(mean=[1.5, -2.0, 100.0], std=[2.0, 0.5, 30.0], channel_axis=0) if norm else {}
    got, emu, *rest = run_cuda(device, [x], [0, -2, -5], [3, 45, 80], 1,
                               ["constant", "reflect", "periodic"], dtype=out_dt, fill_value=7, **kw)
    assert got[0].tobytes() == emu[0].tobytes(), f"seed {SEED} {np.dtype(in_dt)}->{np.dtype(out_dt)}"
    with np.errstate(over="ignore", invalid="ignore"):
        check([x], got, emu, *rest, f"seed {SEED} {np.dtype(in_dt)}->{np.dtype(out_dt)}",
              fill_value=7, **kw)


@pytest.mark.parametrize("mode", MODES)
def test_halo_windows_in_pieces(device, mode):
    """Windows with a halo run as pieces (the in-bounds box with vector moves, the halo strips with
    the boundary rule): whole rows plus a halo row (uint8, 16-byte box), an ERA5-like row band with a
    longitude halo of 2 cells (8-byte box) and of 4 cells (16-byte box), rows and columns padded at
    once, and one batch mixing them with a misaligned sample."""
    rng = np.random.default_rng(SEED)
    rows = random_array(rng, (5, 4096), np.uint8)
    got, emu, *rest = run_cuda(device, [rows, rows], [[-1, 0], [3, 0]], [[4, 4096], [4, 4096]], 1,
                               [[mode, mode]] * 2, fill_value=7)
    check([rows, rows], got, emu, *rest, f"seed {SEED} {mode} whole rows", fill_value=7)
    era = random_array(rng, (4, 37, 144), np.float32)
    for halo in (2, 4):
        for start, wshape in (([0, 9, -halo], [4, 11, 144 + 2 * halo]),
                              ([0, -1, -halo], [4, 39, 144 + 2 * halo])):
            bnd = ["constant", mode, mode]
            got, emu, *rest = run_cuda(device, [era, era], start, wshape, 1, [bnd, bnd], fill_value=-1)
            check([era, era], got, emu, *rest, f"seed {SEED} {mode} halo {halo} {start}", fill_value=-1)
            got, emu, *rest = run_cuda(device, [era], start, wshape, 1, [bnd], fill_value=-1,
                                       in_offset=4, out_offset=8)
            check([era], got, emu, *rest, f"seed {SEED} {mode} halo {halo} {start} misaligned",
                  fill_value=-1)


@pytest.mark.parametrize("in_dt, out_dt", [(np.float32, np.float16), (np.float32, np.float32),
                                           (np.uint8, np.float32), (np.float16, np.float32)])
def test_typed_conversions_with_vector_moves(device, in_dt, out_dt):
    """Typed cast/normalise kernels moving 4 or 2 elements at once in the in-bounds box (inside, a
    4-cell and a 2-cell halo, an output one element off), bit for bit with the host emulation."""
    rng = np.random.default_rng(SEED)
    x = random_array(rng, (3, 40, 64), in_dt, beyond_int=False)
    if np.dtype(in_dt).kind == "f":
        x = np.clip(x, -6e4, 6e4).astype(in_dt)
    osz = np.dtype(out_dt).itemsize
    for norm in (False, True):
        kw = dict(mean=[1.5, -2.0, 100.0], std=[2.0, 0.5, 30.0], channel_axis=0) if norm else {}
        for start, wshape, out_offset in (([0, 1, 8], [3, 30, 48], 0), ([0, -1, -4], [3, 42, 72], 0),
                                          ([0, -1, -2], [3, 42, 68], 0), ([0, 1, 8], [3, 30, 48], osz)):
            bnd = ["constant", "reflect", "periodic"]
            got, emu, *rest = run_cuda(device, [x], start, wshape, 1, bnd, dtype=out_dt, fill_value=7,
                                       out_offset=out_offset, **kw)
            msg = f"seed {SEED} {np.dtype(in_dt)}->{np.dtype(out_dt)} norm={norm} {start} {wshape}"
            assert got[0].tobytes() == emu[0].tobytes(), msg
            with np.errstate(over="ignore", invalid="ignore"):
                check([x], got, emu, *rest, msg, fill_value=7, **kw)
