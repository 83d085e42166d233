"""Stress cases of the CUDA strided slice that the random tests do not reach, through the DALI-free
library on torch/cupy device memory (``dali_mesh._kernels``):

* back-to-back launches on two streams (one launcher each) and many launches on one stream, with
  no host sync between them: the launcher's staging buffers must not be overwritten in flight;
* a batch with one misaligned sample among aligned ones: every sample right, whatever vector width
  each one gets;
* one sample of more than 2**32 one-byte elements, on the 16-byte path and on the 1-byte path:
  64-bit offsets everywhere. The 4 GiB outputs are checked on the device against the same formula
  computed there (no 4 GiB copy to the host) and at chosen positions against numpy.

Oracle: ``dali_mesh._kernels.reference_strided_slice`` (numpy) and the byte pattern's formula.
Skipped without a GPU (tests/gpu/conftest.py); the check that the large cases take the paths they
claim runs on the host.
"""
from __future__ import annotations

import numpy as np
import pytest

from dali_mesh import _kernels as K
from dali_mesh.partition import boundary_index
from tests.helpers import MODES, SEED, random_array

# ---- device helpers (torch or cupy, as tests/gpu/conftest.py's Device) -------------------------------


def _new_stream(device) -> tuple[object, int]:
    if device.name == "torch":
        s = device.mod.cuda.Stream()
        return s, s.cuda_stream
    s = device.mod.cuda.Stream(non_blocking=True)
    return s, s.ptr


def _run_batch(device, samples, starts, shapes, steps, bounds, *, offsets, out_dtype=None, stream=None,
               launcher=None, fill_value=0, **kw):
    """Launches one batch with a per-sample byte offset of the input pointer; returns
    ``(launch, collect)`` so that callers can launch several batches before syncing."""
    out_dtype = np.dtype(out_dtype or samples[0].dtype)
    ins = [device.to_device(x, off) for x, off in zip(samples, offsets)]
    outs = [device.empty(int(np.prod(sh)) * out_dtype.itemsize) for sh in shapes]
    device.sync()  # inputs are written on the default stream; launches may use others

    def launch():
        K.strided_slice_device([device.ptr(b, off) for b, off in zip(ins, offsets)],
                               [device.ptr(o) for o in outs], [x.shape for x in samples], starts, shapes,
                               steps, bounds, in_dtype=samples[0].dtype, out_dtype=out_dtype,
                               fill_value=fill_value, stream=device.stream() if stream is None else stream,
                               launcher=launcher, **kw)

    def collect():
        return [device.to_host(o, 0, tuple(sh), out_dtype) for o, sh in zip(outs, shapes)]

    return launch, collect


def _check(samples, got, starts, shapes, steps, bounds, out_dtype, msg, **kw):
    for i, x in enumerate(samples):
        ref = K.reference_strided_slice(x, starts[i], shapes[i], steps[i], bounds[i], dtype=out_dtype, **kw)
        np.testing.assert_array_equal(got[i], ref, err_msg=f"{msg} sample {i}")


def _random_batch(rng, nsamples, dtype, shape_hi=(6, 40, 70)):
    samples, starts, shapes, steps, bounds = [], [], [], [], []
    for _ in range(nsamples):
        sh = [int(rng.integers(1, hi + 1)) for hi in shape_hi]
        samples.append(random_array(rng, sh, dtype))
        starts.append([int(rng.integers(-2 * n, 2 * n)) for n in sh])
        shapes.append([int(rng.integers(1, 2 * n + 3)) for n in sh])
        steps.append([int(rng.integers(1, 3)) for _ in sh])
        bounds.append([MODES[rng.integers(len(MODES))] for _ in sh])
    return samples, starts, shapes, steps, bounds


# ---- launches without a sync between them -------------------------------------------------------------


@pytest.mark.gpu
def test_back_to_back_launches_on_two_streams(device):
    """Two launchers, one per stream, launches interleaved between the streams with different
    descriptors each time and no sync until the end: every output is its own batch's result."""
    rng = np.random.default_rng(SEED)
    handles = [_new_stream(device) for _ in range(2)]
    launchers = [K.CudaLauncher(), K.CudaLauncher()]
    try:
        batches = []
        for k in range(24):
            dtype = (np.float32, np.uint8, np.int16)[k % 3]
            b = _random_batch(rng, int(rng.integers(1, 5)), dtype)
            launch, collect = _run_batch(device, *b, offsets=[0] * len(b[0]), stream=handles[k % 2][1],
                                         launcher=launchers[k % 2], fill_value=3)
            batches.append((b, collect, launch))
        for _, _, launch in batches:  # all launches back to back
            launch()
        device.sync()
        for k, (b, collect, _) in enumerate(batches):
            _check(*b[:1], collect(), *b[1:], np.dtype(b[0][0].dtype), f"seed {SEED} launch {k}", fill_value=3)
    finally:
        for launcher in launchers:
            launcher.close()


@pytest.mark.gpu
def test_many_launches_on_one_stream_reuse_staging_safely(device):
    """One launcher, 64 batches of growing and shrinking size on one stream, no sync in between: a
    staging buffer reused (or grown) before its copy ran would show as a wrong window."""
    rng = np.random.default_rng(SEED + 1)
    with K.CudaLauncher() as launcher:
        batches = []
        for k in range(64):
            n = 1 + (k * 7) % 9  # descriptor count goes up and down
            b = _random_batch(rng, n, np.float32, shape_hi=(4, 30, 50))
            launch, collect = _run_batch(device, *b, offsets=[0] * n, launcher=launcher, fill_value=-1)
            batches.append((b, collect, launch))
        for _, _, launch in batches:
            launch()
        device.sync()
        for k, (b, collect, _) in enumerate(batches):
            _check(*b[:1], collect(), *b[1:], np.dtype(np.float32), f"seed {SEED + 1} launch {k}", fill_value=-1)


# ---- one misaligned sample among aligned ones ---------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,bad_offset", [(np.float32, 1), (np.float32, 2), (np.float16, 1), (np.float64, 4)])
def test_a_sample_misaligned_within_its_element_is_refused_before_launch(device, dtype, bad_offset):
    """A pointer that is not a multiple of the element size would make the kernel's typed loads fault
    (a sticky error that loses the CUDA context): refused before anything is launched, and the
    device still works afterwards."""
    rng = np.random.default_rng(SEED)
    samples = [random_array(rng, (3, 20, 40), dtype) for _ in range(2)]
    starts, shapes = [[0, -1, -2]] * 2, [[3, 22, 44]] * 2
    steps, bounds = [[1, 1, 1]] * 2, [["constant", "constant", "periodic"]] * 2
    launch, _ = _run_batch(device, samples, starts, shapes, steps, bounds, offsets=[0, bad_offset])
    with pytest.raises(K.KernelsError, match="aligned to their element sizes"):
        launch()
    launch, collect = _run_batch(device, samples, starts, shapes, steps, bounds, offsets=[0, 0])
    launch()
    device.sync()
    _check(samples, collect(), starts, shapes, steps, bounds, np.dtype(dtype), f"seed {SEED}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,bad_offset", [(np.float32, 4), (np.uint8, 1), (np.uint8, 3), (np.float16, 2)])
def test_one_misaligned_sample_among_aligned_ones(device, dtype, bad_offset):
    """Five samples whose rows allow 16-byte moves and one whose input pointer is only element
    aligned (offset ``bad_offset`` bytes), in one launch; windows inside and with halos."""
    rng = np.random.default_rng(SEED)
    shape = (6, 181, 1440)  # rows of 1440 elements: 16-byte multiples for every dtype here
    samples = [random_array(rng, shape, dtype) for _ in range(6)]
    starts = [[0, 20, 0], [0, -1, -2], [1, 30, 16], [0, 0, 0], [-1, 170, 1432], [0, 5, 32]]
    shapes = [[6, 100, 1440], [6, 183, 1444], [4, 50, 1024], [6, 181, 1440], [8, 20, 32], [6, 7, 1376]]
    bounds = [["constant", "constant", "periodic"]] * 6
    steps = [[1, 1, 1]] * 6
    for bad in (0, 3, 5):
        offsets = [bad_offset if i == bad else 0 for i in range(6)]
        launch, collect = _run_batch(device, samples, starts, shapes, steps, bounds, offsets=offsets, fill_value=1)
        launch()
        device.sync()
        _check(samples, collect(), starts, shapes, steps, bounds, np.dtype(dtype),
               f"seed {SEED} {np.dtype(dtype)} sample {bad} misaligned by {bad_offset} bytes", fill_value=1)


# ---- more than 2**32 one-byte elements in one sample ---------------------------------------------------
# Byte ``i`` of the input holds (7 i + 3) mod 251: a 32-bit wrap of an offset (2**32 * 7 mod 251 = 108)
# reads another value, and no pattern byte equals the fill value or the sentinel.
FILL, SENTINEL = 252, 255
CHUNK = 1 << 26


def _pattern(i):
    return (i * 7 + 3) % 251


def _arange(device, lo, hi):
    if device.name == "torch":
        return device.mod.arange(lo, hi, dtype=device.mod.int64, device="cuda")
    return device.mod.arange(lo, hi, dtype=device.mod.int64)


def _to_u8(device, x):
    return x.to(device.mod.uint8) if device.name == "torch" else x.astype(device.mod.uint8)


def _count(device, mask) -> int:
    return int(mask.sum().item()) if device.name == "torch" else int(mask.sum())


def _gather(device, buf, positions) -> np.ndarray:
    if device.name == "torch":
        return buf[device.mod.as_tensor(positions, device="cuda")].cpu().numpy()
    return device.mod.asnumpy(buf[device.mod.asarray(positions)])


def _index(device, r, n, mode):
    """boundary_index on the device (periodic and constant: the modes these cases use)."""
    if mode == "periodic":
        return r % n  # floor modulo in torch and cupy, as np.mod
    valid = (r >= 0) & (r < n)
    return r * valid + (valid.logical_not() if device.name == "torch" else ~valid) * (-1)


def _expected_chunk(device, lo, hi, in_shape, start, out_shape, bounds):
    k = _arange(device, lo, hi)
    i, j = k // out_shape[1], k % out_shape[1]
    row = _index(device, start[0] + i, in_shape[0], bounds[0])
    col = _index(device, start[1] + j, in_shape[1], bounds[1])
    inside = (row >= 0) & (col >= 0)
    flat = row * in_shape[1] + col
    return _pattern(flat) * inside + FILL * (inside.logical_not() if device.name == "torch" else ~inside)


def _expected_numpy(k, in_shape, start, out_shape, bounds):
    k = np.asarray(k, np.int64)
    i, j = k // out_shape[1], k % out_shape[1]
    row = boundary_index(start[0] + i, in_shape[0], bounds[0])
    col = boundary_index(start[1] + j, in_shape[1], bounds[1])
    return np.where((row >= 0) & (col >= 0), _pattern(row * in_shape[1] + col), FILL).astype(np.uint8)


# (name, input shape, input byte offset, window start, window shape, boundary per axis)
HUGE_CASES = [
    # rows of 65536 bytes, 16-byte aligned, a window 16 bytes in from each side: the 16-byte path
    # (whole rows plus a padded row: the in-bounds box and the halo row are separate pieces, both 16-byte)
    ("16-byte", (65600, 65536), 0, [1, 16], [65599, 65504], ["constant", "constant"]),
    # odd rows and a pointer one byte off 16-byte alignment: the 1-byte path; periodic columns
    ("1-byte", (65536, 65537), 1, [1, -1], [65535, 65538], ["constant", "periodic"]),
]


def _host_proxy(in_shape, offset, start, out_shape):
    """A small host sample with the huge case's row length and pointer alignment (for the plan)."""
    rows = 4
    raw = np.empty(rows * in_shape[1] + offset + 64, np.uint8)
    base = (-raw.ctypes.data) % 64  # a 64-byte aligned start, then the case's offset
    x = raw[base + offset:base + offset + rows * in_shape[1]].reshape(rows, in_shape[1])
    return x, [min(start[0], 1), start[1]], [rows - 1, out_shape[1]]


@pytest.mark.parametrize("case", HUGE_CASES, ids=lambda c: c[0])
def test_huge_cases_take_the_path_they_claim(case):
    """Host-side: the kernel plan of the huge cases' row length and alignment (runs without a GPU)."""
    name, in_shape, offset, start, out_shape, bounds = case
    if not K.library_path().exists():
        pytest.skip(f"{K.library_path()} is not built")
    x, pstart, pshape = _host_proxy(in_shape, offset, start, out_shape)
    plan = K.gpu_plan_info([x], pstart, pshape, 1, bounds)
    assert plan["elem_size"] == (16 if name == "16-byte" else 1), (name, plan)
    assert (in_shape[0] * in_shape[1] > 2**32) and (out_shape[0] * out_shape[1] > 2**32)


@pytest.mark.gpu
@pytest.mark.parametrize("case", HUGE_CASES, ids=lambda c: c[0])
def test_sample_of_more_than_2_32_bytes(device, case):
    name, in_shape, offset, start, out_shape, bounds = case
    n_in, n_out = in_shape[0] * in_shape[1], out_shape[0] * out_shape[1]
    src = device.empty(n_in + offset)
    for lo in range(0, n_in, CHUNK):
        hi = min(n_in, lo + CHUNK)
        src[offset + lo:offset + hi] = _to_u8(device, _pattern(_arange(device, lo, hi)))
    out = device.empty(n_out)
    if device.name == "torch":
        out.fill_(SENTINEL)
    else:
        out.fill(SENTINEL)
    device.sync()
    with K.CudaLauncher() as launcher:
        K.strided_slice_device([device.ptr(src, offset)], [device.ptr(out)], [in_shape], [start], [out_shape],
                               1, [bounds], in_dtype=np.uint8, fill_value=FILL, stream=device.stream(),
                               launcher=launcher)
        device.sync()
    # a few positions against numpy: the ends, around 2**32 in the output, and cells whose input
    # offset lies around 2**32
    rng = np.random.default_rng(SEED)
    k = [0, 1, 15, 16, n_out - 1, n_out - 17, 2**32 - 1, 2**32, 2**32 + 1, 2**32 + 15, 2**32 + 16]
    in_row = 2**32 // in_shape[1] - start[0]
    k += [in_row * out_shape[1] + c for c in (0, 1, out_shape[1] // 2, out_shape[1] - 1)]
    k += rng.integers(0, n_out, 500).tolist()
    k = np.array(sorted(v for v in set(k) if 0 <= v < n_out), np.int64)
    got = _gather(device, out, k)
    want = _expected_numpy(k, in_shape, start, out_shape, bounds)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, (f"{name}: {bad.size} of {k.size} positions wrong, first at flat output index "
                           f"{k[bad[0]] if bad.size else None}: got {got[bad[:5]]}, want {want[bad[:5]]}")
    # every byte, on the device
    wrong = unwritten = 0
    for lo in range(0, n_out, CHUNK):
        hi = min(n_out, lo + CHUNK)
        chunk = out[lo:hi]
        wrong += _count(device, chunk != _to_u8(device, _expected_chunk(device, lo, hi, in_shape, start,
                                                                        out_shape, bounds)))
        unwritten += _count(device, chunk == SENTINEL)
    assert (wrong, unwritten) == (0, 0), f"{name}: {wrong} wrong bytes ({unwritten} never written) of {n_out}"
    del src, out
    if device.name == "torch":
        device.mod.cuda.empty_cache()
    else:
        device.mod.get_default_memory_pool().free_all_blocks()
