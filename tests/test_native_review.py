"""Regression tests for the C++ review of the native reader (issue 11): one open file per thread,
not per part of a batch; plans refused where a checksum-valid file would make the reader index
outside its arrays; Zarr metadata compared in canonical form (attributes may change); the header
check retried after short reads and EINTR; large contiguous groups split across threads; the
sample-id source O(1) per index. Subprocess tests are bounded by a timeout.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from dali_mesh import Layout, MeshInfo, _kernels
from dali_mesh.partition import take_window
from dali_mesh.source import NumpySource

dali = pytest.importorskip("nvidia.dali")
from nvidia.dali import fn, pipeline_def, types  # noqa: E402

from dali_mesh.io.read_plan import CHECK_JSON, AxisProgram, PlanFile, PlanSet, ReadPlan  # noqa: E402
from dali_mesh.pipeline import native  # noqa: E402
from tests.oracles import SEED, random_array  # noqa: E402
from tests.native_helpers import mesh_of, needs_read_windows  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.timeout(180)


@pytest.fixture(autouse=True)
def _plugin():
    needs_read_windows()


def _run_batches(src, n_batches, *, threads=2, **kw):
    @pipeline_def(batch_size=src.batch_size, num_threads=threads, device_id=None, prefetch_queue_depth=1)
    def pipe():
        return native.read_windows(src, fallback=False, **kw)

    p = pipe()
    p.build()
    out = []
    for _ in range(n_batches):
        w, ids, _ = p.run()
        out += [(int(np.array(ids[i])), np.array(w[i])) for i in range(len(w))]
    return out


def _subprocess(script: str, env=None, timeout=150):
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=ROOT, capture_output=True,
                       text=True, timeout=timeout, env={**os.environ, **(env or {})})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


# ---- 1: a bounded number of open files -----------------------------------------------------------
def test_many_chunk_zarr_batch_reads_under_a_low_open_file_limit(tmp_path):
    """(4, 8, 32, 64) in (1, 1, 8, 8) chunks, rank 1 of 2 over axis 1: 128 chunk files + the metadata
    per sample, 516 per batch of 4; with RLIMIT_NOFILE 256 a reader holding every file of the batch
    open fails ("Too many open files")."""
    pytest.importorskip("zarr")
    out = _subprocess(f"""
        import os, resource, sys
        import numpy as np, zarr
        from nvidia.dali import pipeline_def
        from dali_mesh import Layout, MeshInfo
        from dali_mesh.pipeline import native
        from dali_mesh.source import ZarrSource
        from dali_mesh.partition import take_window
        arr = np.random.default_rng({SEED}).standard_normal((4, 8, 32, 64)).astype(np.float32)
        p = os.path.join({str(tmp_path)!r}, "z.zarr")
        z = zarr.create_array(p, shape=arr.shape, chunks=(1, 1, 8, 8), dtype="f4", compressors=None,
                              zarr_format=2)
        z[:] = arr
        layout = Layout(MeshInfo((1, 2), ("data_parallel", "m0"), (0, 1)), shard={{"m0": 1}})
        src = ZarrSource([p], None, layout, batch_size=4, shuffle=False)
        parts = [len(parts) for _, parts in native.plan_source(src).items]
        assert parts == [129] * 4, parts
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

        @pipeline_def(batch_size=4, num_threads=2, device_id=None, prefetch_queue_depth=1)
        def pipe():
            return native.read_windows(src, fallback=False)

        pp = pipe()
        pp.build()
        w, ids, _ = pp.run()
        got = sorted(int(np.array(ids[i])) for i in range(4))
        assert got == [0, 1, 2, 3], got
        for i in range(4):
            t = int(np.array(ids[i]))
            np.testing.assert_array_equal(np.array(w[i]), take_window(arr[t], src.region))
        print("ok")
    """)
    assert out.strip().endswith("ok")


# ---- 2: checksum-valid plans that index outside their arrays are refused --------------------------
def _plan(ndim, itemsize, swap, fortran, shape, fo, do, ub, gb, ge, check=b"", check_off=0, fill=b"", axes=None):
    """A plan as given, checked by nothing here (``ndim`` is ``len(shape)``)."""
    assert ndim == len(shape)
    ints = [np.asarray(v, np.int64) for v in (fo, do, ub, gb, ge)]
    programs = tuple(AxisProgram(*(np.asarray(v, np.int64) for v in a)) for a in (axes or [([], [], [])] * ndim))
    return ReadPlan(itemsize, swap, fortran, tuple(shape), *ints, check_off, check, fill, programs)


def _plan_file(path, plans, files, items):
    """A plan file of exactly these plans, files and items (the typed objects' own encoding)."""
    plan_set = PlanSet(np.dtype(np.float32), 1, plans=list(plans), files=[PlanFile(p, s) for p, s in files])
    plan_set.items = items
    with open(path, "wb") as f:
        f.write(plan_set.to_bytes())
    return str(path)


def _build_direct(plan_path, dtype=types.FLOAT):
    from dali_mesh.fn import load_plugin

    ops = load_plugin()

    @pipeline_def(batch_size=1, num_threads=1, device_id=None)
    def pipe():
        ids = fn.external_source(source=lambda: [np.array(0, np.int64)], batch=True, dtype=types.INT64)
        return ops.read_windows(ids, plan_file=plan_path, dtype=dtype)

    p = pipe()
    p.build()
    return p.run()


@pytest.mark.parametrize("case", ["ndim0_fortran", "ndim1_fortran", "fortran_flag_2", "fill_size"])
def test_checksum_valid_plans_out_of_their_arrays_are_refused(tmp_path, case):
    data = tmp_path / "data.bin"
    data.write_bytes(bytes(range(256)) * 64)
    if case == "ndim0_fortran":  # the transpose would read shape[-1]
        plan = _plan(0, 4, 0, 1, [], [0], [0], [4], [0], [1])
        why = "Fortran order with 0 axes"
    elif case == "ndim1_fortran":
        plan = _plan(1, 4, 0, 1, [4], [0], [0], [16], [0], [1])
        why = "Fortran order with 1 axes"
    elif case == "fortran_flag_2":
        plan = _plan(2, 4, 0, 2, [2, 2], [0], [0], [16], [0], [1])
        why = "Fortran flag 2"
    else:  # a 1-byte fill value for 4-byte items: the device fill reads 4 bytes of it
        plan = _plan(1, 4, 0, 0, [4], [0], [0], [16], [0], [1], fill=b"\x01")
        why = "fill value size"
    path = _plan_file(tmp_path / "p.plan", [plan], [(str(data), -1)], [(0, [(0, 0, 0, 0)])])
    with pytest.raises(RuntimeError, match=f"the plan file is corrupt \\({why}"):
        _build_direct(path)


def test_a_crafted_plan_that_is_valid_reads_exactly(tmp_path):
    """The crafted-plan writer above against a plan that is right: the refusals are not everything."""
    data = tmp_path / "data.bin"
    raw = np.arange(64, dtype=np.float32)
    data.write_bytes(raw.tobytes())
    # a 2 x 3 window stored in Fortran order at bytes 16.. of the file
    plan = _plan(2, 4, 0, 1, [2, 3], [16], [0], [24], [0], [1])
    path = _plan_file(tmp_path / "p.plan", [plan], [(str(data), raw.nbytes)], [(0, [(0, 0, 0, 0)])])
    (w,) = _build_direct(path)
    np.testing.assert_array_equal(np.array(w[0]), raw[4:10].reshape(3, 2).T)


# ---- 4: Zarr metadata in canonical form ---------------------------------------------------------------
def test_canonical_json():
    c = _kernels.canonical_json
    assert c(b'{ "b" : [1, 2],\n "a": {"x": "s p"}, "attributes": {"u": 1}}') == b'{"a":{"x":"s p"},"b":[1,2]}'
    assert c(b'{"a":{"x":"s p"},"b":[1,2]}') == c(b'{"b":[1,2],"a":{"x":"s p"}}')
    assert c(b'{"k": "a \\" , }"}') == b'{"k":"a \\" , }"}'  # an escaped quote and brackets in a string
    assert c(b'{"shape": [4, 8]}') != c(b'{"shape": [4, 9]}')
    assert c(b'{"dimension_names": ["t", "c"], "zarr_format": 3}') == b'{"zarr_format":3}'
    assert c(b"{}") == b"{}"
    for bad in (b"", b"[1]", b'{"a": 1,}', b'{"a" 1}', b'{"a": [1}', b'{"a": "x}', b"{1: 2}", b'{"a":}'):
        assert c(bad) is None, bad


@pytest.mark.parametrize("fmt", [2, 3])
def test_zarr_attributes_added_after_build_are_read(tmp_path, fmt):
    zarr = pytest.importorskip("zarr")
    from dali_mesh.source import ZarrSource

    data = random_array(np.random.default_rng(SEED), (4, 3, 12, 8), np.float32)
    store = str(tmp_path / "z.zarr")
    z = zarr.create_array(store, shape=data.shape, chunks=(1, 3, 4, 8), dtype="f4", compressors=None,
                          zarr_format=fmt)
    z[:] = data
    layout = Layout(mesh_of((1, 3), (0, 1)), shard={"m0": 1}, halo={1: 2}, boundary={1: "reflect"})
    src = ZarrSource([store], None, layout, batch_size=2, shuffle=False)

    @pipeline_def(batch_size=2, num_threads=2, device_id=None, prefetch_queue_depth=1)
    def pipe():
        return native.read_windows(src, fallback=False)

    p = pipe()
    p.build()
    meta = os.path.join(store, "zarr.json" if fmt == 3 else ".zattrs")
    z.attrs["units"] = "K"
    z.attrs["long_name"] = "a temperature " * 8
    assert "units" in open(meta).read()
    w, ids, _ = p.run()  # the first of two batches
    for i in range(2):
        np.testing.assert_array_equal(np.array(w[i]), take_window(data[int(np.array(ids[i]))], src.region))
    # another dtype (same chunk files' sizes) is still refused, naming the metadata file
    shutil.rmtree(store)
    z = zarr.create_array(store, shape=data.shape, chunks=(1, 3, 4, 8), dtype="i4", compressors=None,
                          zarr_format=fmt)
    z[:] = data.view(np.int32)
    name = "zarr.json" if fmt == 3 else ".zarray"
    with pytest.raises(RuntimeError, match=f"{name}: its metadata .* differs from the one planned for"):
        p.run()


# ---- 5: the header check retried after short reads and EINTR -----------------------------------------
SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <sys/uio.h>
#include <unistd.h>
/* once DALI_MESH_SHIM is set: every 4th call fails with EINTR, the others read at most 1..7 bytes */
static unsigned long long st = 88172645463325252ull;
static unsigned r(void) { st ^= st << 13; st ^= st >> 7; st ^= st << 17; return (unsigned)st; }
static int on(void) { return getenv("DALI_MESH_SHIM") != NULL; }
ssize_t pread(int fd, void *buf, size_t n, off_t off) {
  static ssize_t (*real)(int, void *, size_t, off_t);
  if (!real) real = dlsym(RTLD_NEXT, "pread");
  if (!on()) return real(fd, buf, n, off);
  if (r() % 4 == 0) { errno = EINTR; return -1; }
  size_t lim = 1 + r() % 7;
  return real(fd, buf, n < lim ? n : lim, off);
}
ssize_t pread64(int fd, void *buf, size_t n, off_t off) { return pread(fd, buf, n, off); }
ssize_t preadv(int fd, const struct iovec *iov, int cnt, off_t off) {
  static ssize_t (*real)(int, const struct iovec *, int, off_t);
  if (!real) real = dlsym(RTLD_NEXT, "preadv");
  if (!on()) return real(fd, iov, cnt, off);
  if (r() % 4 == 0) { errno = EINTR; return -1; }
  struct iovec v[1024]; size_t lim = 1 + r() % 7, tot = 0; int k = 0;
  for (int i = 0; i < cnt && i < 1024 && tot < lim; i++) {
    v[k] = iov[i]; if (v[k].iov_len > lim - tot) v[k].iov_len = lim - tot; tot += v[k].iov_len; k++;
  }
  return real(fd, v, k, off);
}
ssize_t preadv64(int fd, const struct iovec *iov, int cnt, off_t off) { return preadv(fd, iov, cnt, off); }
"""


def test_short_reads_and_eintr_in_the_header_check_and_the_reads(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler for the pread shim")
    (tmp_path / "shim.c").write_text(SHIM)
    shim = tmp_path / "shim.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(shim), str(tmp_path / "shim.c"), "-ldl"],
                   check=True, timeout=60)
    out = _subprocess(f"""
        import os
        import numpy as np
        from nvidia.dali import pipeline_def
        from dali_mesh import Layout, MeshInfo
        from dali_mesh.pipeline import native
        from dali_mesh.source import NumpySource
        from dali_mesh.partition import take_window
        rng = np.random.default_rng({SEED})
        files, data = [], []
        for k in range(4):
            a = rng.standard_normal((3, 12, 8)).astype(">f4")  # swapped after each read
            f = os.path.join({str(tmp_path)!r}, f"s{{k}}.npy")
            np.save(f, a)
            files.append(f)
            data.append(a)
        layout = Layout(MeshInfo((1, 3), ("data_parallel", "m0"), (0, 1)), shard={{"m0": 1}}, halo={{1: 2}},
                        boundary={{1: "periodic"}})
        src = NumpySource(files, layout, batch_size=2, shuffle=False)

        @pipeline_def(batch_size=2, num_threads=2, device_id=None, prefetch_queue_depth=1)
        def pipe():
            return native.read_windows(src, fallback=False)

        p = pipe()
        p.build()
        os.environ["DALI_MESH_SHIM"] = "1"  # from here on: EINTR and short reads
        for _ in range(2):
            w, ids, _ = p.run()
            for i in range(2):
                t = int(np.array(ids[i]))
                np.testing.assert_array_equal(np.array(w[i]), take_window(data[t], src.region))
        print("ok")
    """, env={"LD_PRELOAD": str(shim)})
    assert out.strip().endswith("ok")


# ---- 7: a large contiguous group read by several tasks -----------------------------------------------
def _plan_tasks(plan_path, task_bytes):
    from dali_mesh import _kernels

    if not _kernels.library_path().exists():
        pytest.skip(f"{_kernels.library_path()} not built (pip install --no-build-isolation -e .)")
    return _kernels.plan_tasks(plan_path, task_bytes)  # a refused plan raises KernelsError


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("dtype", ["<f4", ">f8", "<i2"])
def test_one_large_window_is_split_into_tasks_and_reads_the_same(tmp_path, order, dtype):
    rng = np.random.default_rng(SEED)
    files, data = [], []
    for k in range(2):
        a = random_array(rng, (8, 64, 40), np.dtype(dtype))
        a = np.asfortranarray(a) if order == "F" else a
        files.append(str(tmp_path / f"s{k}.npy"))
        np.save(files[-1], a)
        data.append(a)
    # rank 0 of 2 over axis 0: one contiguous range of half the file (C order)
    layout = Layout(mesh_of((1, 2), (0, 0)), shard={"m0": 0}, halo={1: 3}, boundary={1: "symmetric"})
    src = NumpySource(files, layout, batch_size=1, shuffle=False)
    (plan,) = native.plan_windows(src)
    path = plan.write(str(tmp_path))
    whole_tasks, whole_most = _plan_tasks(path, 1 << 30)
    task_bytes = 4096
    n, most = _plan_tasks(path, task_bytes)
    window_bytes = 4 * 64 * 40 * np.dtype(dtype).itemsize
    if order == "C":
        assert whole_tasks == 1 and whole_most == window_bytes
        # every task at most task_bytes, together the whole window
        assert most <= task_bytes and n >= window_bytes // task_bytes
    else:
        assert n > whole_tasks and most <= max(task_bytes, whole_most // 4)
    for tb in (task_bytes, 4 << 20):
        got = _run_batches(src, 2, task_bytes=tb)
        assert sorted(t for t, _ in got) == [0, 1]
        for t, w in got:
            np.testing.assert_array_equal(w, take_window(data[t].astype(data[t].dtype.newbyteorder("=")),
                                                         src.region))


# ---- the sample-id source: O(1) per index --------------------------------------------------------------
def test_sample_ids_of_a_huge_claimed_sample_count_cost_one_batch():
    """A source claiming 2**40 samples: one call gives one batch from the stateless order (building
    the epoch's arrays would need terabytes)."""
    from dali_mesh.partition import SampleOrder

    layout = Layout(MeshInfo((2,), ("data_parallel",), (1,)), shard={})
    src = NumpySource.__new__(NumpySource)  # only what _SampleIds and sample_order read
    src.layout, src.num_samples, src.seed, src.shuffle = layout, 1 << 40, 7, True
    src.batch_size, src.drop_last, src._memo = 3, False, {}

    class Info:
        epoch_idx, iteration = 2, 1234567

    ids, pads = native._SampleIds(src)(Info)
    order = src.sample_order(2)
    assert isinstance(order, SampleOrder) and len(order) >= (1 << 39)
    want = [order[3 * 1234567 + k] for k in range(3)]
    assert [int(i) for i in ids] == [s for s, _ in want]
    assert [bool(p) for p in pads] == [p for _, p in want]
    assert all(0 <= int(i) < (1 << 40) for i in ids)


JSONS = [
    b'{"zarr_format": 3, "shape": [4, 8], "fill_value": "NaN", "attributes": {"a": [1, {"b": "}"}]}}',
    b'{"k": "a \\" , ] } \\\\", "n": -1.5e+3, "u": "\xc3\xa9\\u00e9", "o": {"x": [ ], "y": { }}}',
    b'{ }',
    b'{"dimension_names": ["t", null], "t": true, "f": false, "z": null}',
]


@pytest.mark.parametrize("text", JSONS)
def test_canonical_json_agrees_with_the_reader(tmp_path, text):
    """The plan's canonical form (the kernels library's, as the planner takes it) against the reader's, through the operator: the same
    text with other whitespace, member order and attributes is read; another value is refused."""
    data = tmp_path / "data.bin"
    raw = np.arange(4, dtype=np.float32)
    data.write_bytes(raw.tobytes())
    meta = tmp_path / "meta.json"
    canon = _kernels.canonical_json(text)
    assert canon is not None
    read = _plan(1, 4, 0, 0, [4], [0], [0], [16], [0], [1])
    check = _plan(1, 4, 0, 0, [4], [], [], [], [], [], check=canon, check_off=CHECK_JSON)
    path = _plan_file(tmp_path / "p.plan", [read, check], [(str(data), 16), (str(meta), -1)],
                      [(0, [(0, 0, 0, 0), (1, 1, 0, 0)])])
    import json

    obj = json.loads(text)
    same = [text, b"\n " + text.replace(b', "', b',\n\t "') + b"\r\n"]  # (no ', "' inside their strings)
    other = json.dumps(dict(reversed(list({**obj, "attributes": {"units": "K"}}.items()))), indent=3).encode()
    if _kernels.canonical_json(other) == canon:  # json.dumps writes the values as they were written
        same.append(other)
    for t in same:
        meta.write_bytes(t)
        (w,) = _build_direct(path)
        np.testing.assert_array_equal(np.array(w[0]), raw)
    meta.write_bytes(json.dumps({**obj, "shape": [4, 9]}).encode())
    with pytest.raises(RuntimeError, match="meta.json: its metadata .* differs"):
        _build_direct(path)
    meta.write_bytes(text[:-1])  # not one JSON object
    with pytest.raises(RuntimeError, match="meta.json: its metadata .* differs"):
        _build_direct(path)


def test_hdf5_external_link_is_never_read_natively(tmp_path):
    """allow_external=True through an external link: the dataset's offsets are in the linked file, so
    the native path must refuse it (never read those offsets from the linking file); the default
    read_windows falls back and delivers the linked data."""
    h5py = pytest.importorskip("h5py")
    from dali_mesh.source import HDF5Source

    x = np.arange(4 * 6 * 8, dtype=np.float32).reshape(4, 6, 8)
    with h5py.File(tmp_path / "other.h5", "w") as f:
        f.create_dataset("pad", data=np.full(1000, 7, np.float32))
        f.create_dataset("x", data=x)
    with h5py.File(tmp_path / "main.h5", "w") as f:
        f.create_dataset("decoy", data=-np.ones((4, 6, 8), np.float32))
        f["x"] = h5py.ExternalLink(str(tmp_path / "other.h5"), "/x")
    layout = Layout(MeshInfo((2,), ("mp",), (1,)), shard={"mp": 0}, halo={1: 1}, boundary={1: "periodic"})
    src = HDF5Source([str(tmp_path / "main.h5")], "x", layout, batch_size=2, shuffle=False, allow_external=True)
    with pytest.raises(native.NotNativeError, match="external link"):
        native.plan_source(src)

    @pipeline_def(batch_size=2, num_threads=1, device_id=None, py_num_workers=1, py_start_method="spawn")
    def pipe():
        return native.read_windows(src)

    p = pipe()
    p.build()
    for _ in range(2):
        w, ids, _ = p.run()
        for i in range(2):
            sid = int(np.array(ids[i]))
            np.testing.assert_array_equal(np.array(w[i]), take_window(x[sid], src.region))
