"""Bounded fuzz of crafted HDF5 files (object headers, chunk indexes) and Zarr metadata: every mutated
file is either refused with an error or read by the native reader exactly as h5py / zarr-python read
that same file (partitioned_source's readers are h5py and zarr-python: they must not crash). Never a
crash, a hang or silent wrong data.

Each batch of cases runs in a fresh interpreter, so that a crash fails the test instead of killing
the run; the seed is in every message (DALI_MESH_TEST_SEED replays it)."""
from __future__ import annotations

import pytest

from tests.helpers import SEED, run_python

pytest.importorskip("nvidia.dali")

_CASES = r"""
import json, os, shutil, sys, warnings
import numpy as np
from dali_mesh import HDF5Source, Layout, MeshInfo, ZarrSource
from dali_mesh.partition import take_window
from dali_mesh.pipeline import native
from tests.helpers import native_pipeline
warnings.simplefilter("ignore")
kind, folder, seed, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rng = np.random.default_rng(seed)
layout = Layout(MeshInfo((1, 2), ("dp", "mp"), (0, 1)), shard={"mp": 1}, halo={1: 1}, boundary={1: "periodic"})
data = np.arange(4 * 6 * 5, dtype=np.float32).reshape(4, 6, 5)
outcomes = {"refused": 0, "native": 0, "fallback": 0}

def oracle(path, t):
    # step t as h5py / zarr-python read it from the same file, or None where they cannot
    try:
        if kind == "zarr":
            import zarr
            return np.asarray(zarr.open_array(path, mode="r")[t])
        import h5py
        with h5py.File(path, "r") as f:
            return f["fields"][t]
    except Exception:
        return None

def same(got, t, path, case):
    want = oracle(path, t)
    if want is None:  # the oracle cannot read that step (a window may avoid what is broken)
        return
    assert want.shape == tuple(src_shape[0]), (case, want.shape, src_shape[0])
    np.testing.assert_array_equal(got, take_window(want, src_region[0]), err_msg=case)

src_shape, src_region = [None], [None]

def check(path, case):
    try:
        src = (ZarrSource([path], None, layout, batch_size=2, shuffle=False) if kind == "zarr" else
               HDF5Source([path], "fields", layout, batch_size=2, shuffle=False))
    except Exception:
        outcomes["refused"] += 1
        return
    try:
        native.plan_windows(src)
        natively = True
    except Exception:
        natively = False
    src_shape[0], src_region[0] = src.sample_shape, src.region
    for i in range(min(src.num_samples, 4)):
        try:
            (got,) = src.read_sample(i)  # partitioned_source's reader
        except Exception:
            outcomes["refused"] += 1
            return
        # (the Python readers are h5py and zarr-python themselves, reading hyperslabs: a corrupt chunk
        # index can make HDF5 answer a hyperslab and a whole step differently, so only their shape is held)
        assert got.shape == src.region.window_shape, (case, got.shape)
    if natively:
        try:
            p = native_pipeline(src)
            w, ids, _ = p.run()
        except Exception:
            outcomes["refused"] += 1
            return
        for k in range(len(ids)):
            same(np.array(w[k]), src.step_of(int(np.array(ids[k]))), path, f"{case} native")
        outcomes["native"] += 1
    else:
        outcomes["fallback"] += 1

if kind == "zarr":
    import zarr
    base = os.path.join(folder, "base.zarr")
    z = zarr.create_array(base, shape=data.shape, chunks=(1, 3, 5), dtype="f4", compressors=None,
                          zarr_format=2, fill_value=0.0)
    z[...] = data
    meta = json.load(open(os.path.join(base, ".zarray")))
    keys = ["shape", "chunks", "dtype", "order", "fill_value", "zarr_format", "dimension_separator"]
    values = [[4, 6, 5], [4, 6, 6], [1, 6, 5], [0, 6, 5], [4, 3, 5], [2, 3, 5], [1, 3, 5], [2**31, 6, 5],
              [1, 1, 1], [-1, 6, 5], "<f4", ">f4", "<i4", "|u1", "<f8", "C", "F", 0.0, "NaN", 7, 2, 3, ".", "/",
              None, [], "x"]
    for c in range(n):
        m = dict(meta)
        for _ in range(int(rng.integers(1, 3))):
            m[keys[int(rng.integers(len(keys)))]] = values[int(rng.integers(len(values)))]
        path = os.path.join(folder, f"c{c}.zarr")
        shutil.copytree(base, path)
        with open(os.path.join(path, ".zarray"), "w") as f:
            json.dump(m, f)
        check(path, f"seed {seed} case {c}: {m}")
        shutil.rmtree(path)
else:
    import h5py
    base = os.path.join(folder, "base.h5")
    with h5py.File(base, "w") as f:
        f.create_dataset("fields", data=data, chunks=(1, 3, 5) if kind == "hdf5_chunked" else None)
    raw = bytearray(open(base, "rb").read())
    with h5py.File(base, "r") as f:
        ds = f["fields"]
        data_at = ds.id.get_offset() if ds.chunks is None else min(ds.id.get_chunk_info(i).byte_offset
                                                                   for i in range(ds.id.get_num_chunks()))
    for c in range(n):
        b = bytearray(raw)
        for _ in range(int(rng.integers(1, 4))):  # metadata bytes: headers, B-tree, chunk index
            pos = int(rng.integers(0, data_at))
            b[pos] = int(rng.integers(0, 256))
        path = os.path.join(folder, f"c{c}.h5")
        open(path, "wb").write(bytes(b))
        check(path, f"seed {seed} case {c}")
        os.unlink(path)
print("outcomes", outcomes)
"""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["hdf5_contiguous", "hdf5_chunked", "zarr"])
def test_crafted_files_are_refused_or_read_exactly(tmp_path, kind):
    if kind == "zarr":
        pytest.importorskip("zarr")
    else:
        pytest.importorskip("h5py")
    proc = run_python(_CASES, kind, str(tmp_path), str(SEED), "60", timeout=280)
    assert proc.returncode == 0, f"seed {SEED}: exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    assert "outcomes" in proc.stdout, proc.stdout
