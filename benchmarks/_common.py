"""What several benchmark scripts share: their sample files."""
from __future__ import annotations

import os

import numpy as np


def make_npy_samples(folder: str, n: int, shape) -> list[str]:
    """``n`` random float32 ``.npy`` samples of ``shape`` in ``folder`` (kept when already there),
    each fsync'ed so that a later eviction leaves it cold."""
    os.makedirs(folder, exist_ok=True)
    files = [os.path.join(folder, f"s{i:03d}.npy") for i in range(n)]
    for i, f in enumerate(files):
        if not os.path.exists(f) or np.load(f, mmap_mode="r").shape != tuple(shape):
            np.save(f, np.random.default_rng(i).standard_normal(shape, dtype=np.float32))
        fd = os.open(f, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    return files
