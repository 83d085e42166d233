"""numpy oracles and random test data shared by the tests."""
import os
import random

import numpy as np

from dali_mesh.partition import Region

NP_MODE = {"constant": "constant", "periodic": "wrap", "reflect": "reflect", "symmetric": "symmetric", "edge": "edge"}


def np_pad_window(domain_array, region):
    """The oracle: np.pad the domain, one axis at a time with that axis's numpy mode, then slice."""
    padded = domain_array
    pads = region.pads
    for a, mode in enumerate(region.boundary):
        if mode == "trim":
            assert pads[a] == (0, 0)
            continue
        width = [(0, 0)] * padded.ndim
        width[a] = pads[a]
        kwargs = {"constant_values": region.fill_value} if mode == "constant" else {}
        padded = np.pad(padded, width, mode=NP_MODE[mode], **kwargs)
    index = []
    for a in range(region.ndim):
        lo = region.window_start[a] - region.domain_start[a] + pads[a][0]
        index.append(slice(lo, lo + region.window_shape[a]))
    return padded[tuple(index)]


def np_pad_sample(sample, region):
    """The window of a whole sample by np.pad of its domain (the crop box)."""
    domain = sample[tuple(slice(a, b) for a, b in zip(region.domain_start, region.domain_stop))]
    return np_pad_window(domain, region)


# ---- random test data of the kernel and operator tests ------------------------------------------
#: Random data each run; the seed is in every failure message (set DALI_MESH_TEST_SEED to replay).
SEED = int(os.environ.get("DALI_MESH_TEST_SEED", random.SystemRandom().randrange(2**31)))
MODES = ("constant", "periodic", "reflect", "symmetric", "edge")
DTYPES = [np.uint8, np.uint16, np.uint32, np.uint64, np.int8, np.int16, np.int32, np.int64,
          np.float16, np.float32, np.float64, np.bool_]


def random_array(rng: np.random.Generator, shape, dtype, *, beyond_int: bool = True) -> np.ndarray:
    """Random values of ``dtype``: integers over the dtype's whole range, floats normal (wider for
    float16, some beyond its range: inf); ``beyond_int``: a few float values beyond every integer
    range (to test saturating casts)."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    scale = 3e4 if dtype == np.float16 else 1e3
    x = rng.normal(0, scale, shape)
    if beyond_int and x.size and dtype != np.float16:
        flat = x.reshape(-1)
        flat[rng.integers(0, flat.size, max(1, flat.size // 16))] *= 1e17
    with np.errstate(over="ignore"):  # values beyond float16: inf, on purpose
        return x.astype(dtype)


def random_region(rng: np.random.Generator, shape, mode: str, max_halo: int = 6, dtype=None,
                  fill_value=None) -> Region:
    """A random domain (crop) of ``shape`` and a random window around it reaching up to ``max_halo``
    cells beyond it (inside it for ``trim``); ``fill_value`` by default one that ``dtype`` holds."""
    ds, de, ws, we = [], [], [], []
    for n in shape:
        a = int(rng.integers(0, n))
        b = int(rng.integers(a + 1, n + 1))
        if mode == "trim":
            u = int(rng.integers(a, b))
            v = int(rng.integers(u, b + 1))
        else:
            u = int(rng.integers(a - max_halo, b))
            v = int(rng.integers(u + 1, b + max_halo + 1))
        ds.append(a), de.append(b), ws.append(u), we.append(v)
    if fill_value is None:
        kind = np.dtype(dtype).kind if dtype is not None else "f"
        fill_value = {"b": 1, "u": 7}.get(kind, -7)
    return Region(ds, de, ds, de, ws, we, mode, fill_value=fill_value)
