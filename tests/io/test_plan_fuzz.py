"""Bounded fuzz of the plan loader and executor (csrc/plan/, csrc/reader/) under AddressSanitizer
and UndefinedBehaviorSanitizer (issue 19: "treat a plan file as untrusted input"; item 12: units
repeated at a stride).

Plan files of real sources (``.npy`` files C and Fortran order and byte-swapped, a window of many
rows planned as repeated units, halos whose boxes interleave, Blosc Zarr chunks, gzip and contiguous
HDF5) get crafted words a few thousand times with a fixed seed: words set to 0, -1, +-1, doubled,
int64 extremes, a flipped bit, their checksum made right again so that the loader's own checks are
what stands. A harness (tests/io/plan_fuzz_main.cc) built with ``-fsanitize=address,undefined``
loads each and reads every item as ``fn.dali_mesh.read_windows`` does, into heap buffers of exactly
the window's bytes. Every file must end in windows or a reason, never a sanitizer report, a crash or
a hang; the unaltered plans must give numpy's windows (``take_window``), byte for byte.
"""
from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest

from dali_mesh import Layout
from dali_mesh.partition import take_window
from tests.helpers import mesh_of
from tests.io.test_codec_fuzz import PLAN_HARNESS, build_sanitized

pytest.importorskip("nvidia.dali")
h5py = pytest.importorskip("h5py")
zarr = pytest.importorskip("zarr")
numcodecs = pytest.importorskip("numcodecs")

from dali_mesh import _kernels  # noqa: E402
from dali_mesh.plan import PLAN_MAGIC  # noqa: E402
from dali_mesh.pipeline import native  # noqa: E402
from dali_mesh.source import HDF5Source, NumpySource, ZarrSource  # noqa: E402

SEED = 20261202
MUTANTS = 2400
EXTREMES = [0, 1, -1, 2, 7, 1 << 31, (1 << 62), (1 << 63) - 1, -(1 << 63), 1 << 40]


def _fnv(h: int, data: bytes) -> int:
    for b in data:
        h = ((h ^ b) * 1099511628211) % 2**64
    return h


def _sources(tmp_path):
    """``(source, windows of its items in id order)`` of a few real layouts."""
    rng = np.random.default_rng(SEED)
    out = []
    lay = lambda rank, **kw: Layout(mesh_of((1, 4), (0, rank)), shard={"m0": 1}, **kw)  # noqa: E731
    # .npy: C order with a periodic halo on the split last axis (rank 0: boxes at both ends of every
    # row), Fortran order byte-swapped with a reflect halo; many rows split on the last axis
    data = rng.standard_normal((3, 10, 12)).astype("f4")
    files = [str(tmp_path / f"c{i}.npy") for i in range(3)]
    for f, d in zip(files, data):
        np.save(f, d)
    out.append((NumpySource(files, lay(0, halo={1: 2}, boundary="periodic"), batch_size=1, shuffle=False), data))
    out.append((NumpySource(files, lay(2, halo={1: 1}, boundary="periodic"), batch_size=1, shuffle=False), data))
    big = data.astype(">f8")
    ffiles = [str(tmp_path / f"f{i}.npy") for i in range(3)]
    for f, d in zip(ffiles, big):
        np.save(f, np.asfortranarray(d))
    out.append((NumpySource(ffiles, lay(1, halo={0: 1, 1: 1}, boundary="reflect"), batch_size=1, shuffle=False),
                big.astype("f8")))
    rows = rng.standard_normal((2, 300, 4)).astype("f4")
    rfiles = [str(tmp_path / f"r{i}.npy") for i in range(2)]
    for f, d in zip(rfiles, rows):
        np.save(f, d)
    out.append((NumpySource(rfiles, lay(3), batch_size=1, shuffle=False), rows))
    # Zarr v2, Blosc(lz4) chunks that cut the shards; HDF5 gzip chunks and a contiguous dataset
    z = zarr.create_array(str(tmp_path / "z.zarr"), shape=data.shape, chunks=(1, 4, 5), dtype="f4", zarr_format=2,
                          compressors=[numcodecs.Blosc("lz4", 5, numcodecs.Blosc.SHUFFLE)])
    z[:] = data
    out.append((ZarrSource([str(tmp_path / "z.zarr")], None, lay(1, halo={1: 1}, boundary="edge"), batch_size=1,
                           shuffle=False), data))
    with h5py.File(tmp_path / "h.h5", "w") as f:
        f.create_dataset("g", data=data, chunks=(1, 5, 4), compression="gzip", shuffle=True)
        f["c"] = data
    for name, rank in (("g", 2), ("c", 0)):
        out.append((HDF5Source([str(tmp_path / "h.h5")], name, lay(rank, halo={1: 1}, boundary="symmetric"),
                               batch_size=1, shuffle=False), data))
    return [(src, [take_window(d, src.region) for d in arrays]) for src, arrays in out]


def _mutant(rng, words: np.ndarray) -> np.ndarray:
    w = words.copy()
    for _ in range(int(rng.integers(1, 4))):
        i = int(rng.integers(0, w.size))
        v = int(w[i])
        kind = int(rng.integers(0, 5))
        if kind == 0:
            w[i] = int(rng.choice(EXTREMES))
        elif kind == 1:
            w[i] = (v + int(rng.choice([-1, 1, 8, -8, 4096])) + 2**63) % 2**64 - 2**63  # wrapped as int64
        elif kind == 2:
            w[i] = (v * 2) % (1 << 63)
        elif kind == 3:
            w[i] = np.int64(v ^ (1 << int(rng.integers(0, 63))))
        else:
            w[i] = int(rng.integers(0, 1 << 12))
    return w


def _write(path, words: np.ndarray) -> str:
    body = words.astype("<i8").tobytes()
    with open(path, "wb") as f:
        f.write(PLAN_MAGIC + body + _kernels.plan_checksum(body))
    return str(path)


def test_crafted_plan_words_never_crash_under_sanitizers(tmp_path):
    exe, _ = build_sanitized(tmp_path, *PLAN_HARNESS)
    rng = np.random.default_rng(SEED)
    plans, expect = [], []
    for k, (src, windows) in enumerate(_sources(tmp_path)):
        (plan,) = native.plan_windows(src)
        data = plan.to_bytes()
        assert data[:8] == PLAN_MAGIC
        words = np.frombuffer(data[8:-8], "<i8")
        h = 1469598103934665603
        for w in windows:
            h = _fnv(h, np.ascontiguousarray(w).tobytes())
        plans.append(_write(tmp_path / f"p{k}.plan", words))
        expect.append(f"ok {h:016x}")
        for m in range(MUTANTS // 7):
            plans.append(_write(tmp_path / f"p{k}_{m}.plan", _mutant(rng, words)))
            expect.append(None)
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:exitcode=99:allocator_may_return_null=1",
               UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:exitcode=98")
    lines = []
    for task_bytes in (64, 1 << 20):  # groups split into many tasks (repeated units cut by their runs), or few
        proc = subprocess.run([exe, str(task_bytes), *plans], capture_output=True, text=True, timeout=600, env=env)
        assert proc.returncode == 0, proc.stderr[-4000:]
        assert "runtime error" not in proc.stderr and "AddressSanitizer" not in proc.stderr, proc.stderr[-4000:]
        got = proc.stdout.splitlines()
        assert len(got) == len(plans)
        for line, want in zip(got, expect):
            if want is not None:  # an unaltered plan: numpy's windows, exactly
                assert line == want, line
        lines += got
    errors = sum(line.startswith("err ") for line in lines)
    assert errors > len(lines) // 4, lines[:20]  # the crafted words are mostly refused, with a reason
