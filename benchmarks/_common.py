"""What several benchmark scripts share: their sample files, an epoch of a one-output DALI pipeline, their
results printed (and written) as JSON."""
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


def pipeline_epoch(pipe, keep: bool = False) -> list:
    """Runs one epoch of ``pipe`` (a built DALI pipeline whose first output is the window; reset at its
    end); with ``keep``, a copy of each batch's first sample (for the check: a timed epoch hands the
    batch on as DALI gives it)."""
    out = []
    while True:
        try:
            w = pipe.run()[0]
        except StopIteration:
            pipe.reset()
            return out
        if keep:
            out.append(np.array(w[0]))


def print_results(results: dict, json_path: str | None) -> None:
    """``results`` as indented JSON on stdout, and into the file ``json_path`` too when one is given."""
    import json

    print(json.dumps(results, indent=2))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(results, f, indent=2)
