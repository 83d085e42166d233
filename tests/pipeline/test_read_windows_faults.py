"""Hostile inputs against the native reader (dali_mesh.pipeline.native.read_windows, fn.dali_mesh.read_windows).

Files changed AFTER the plan was made (between pipe.build() and pipe.run()): truncated, grown,
rewritten with another shape or dtype, replaced by a FIFO, a folder or nothing; HDF5 and Zarr
rewritten with another layout. Each gives an error naming the file, and every batch delivered before
it equals the window of the original contents (never garbage). Then int64 extremes of the per-sample
input (the sample id) and of task_bytes, plan files deleted or corrupted (every word of one, and a
subprocess that must not crash on checksum-valid nonsense), two pipelines with different sources in
one process, and checkpoint resume across an epoch boundary. Every test is bounded by a timeout.
"""
from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

from dali_mesh import Layout, MeshInfo
from dali_mesh.partition import take_window
from dali_mesh.source import HDF5Source, NumpySource
from dali_mesh.storage import DataFileError

dali = pytest.importorskip("nvidia.dali")
from nvidia.dali import fn, pipeline_def, types  # noqa: E402

from dali_mesh.plan import PLAN_MAGIC  # noqa: E402
from dali_mesh.pipeline import native  # noqa: E402
from tests.helpers import (SEED, assert_windows, crafted_plan, crafted_plan_file, mesh_of,  # noqa: E402
                           native_pipeline, needs_read_windows, random_array, run_plan_file, run_python,
                           run_python_bounded)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def _plugin():
    needs_read_windows()


def _layout():
    return Layout(mesh_of((1, 3), (0, 1)), shard={"m0": 1}, halo={1: 2, 2: 1},
                  boundary={1: "reflect", 2: "periodic"})


def _npy_files(tmp_path, n=4, shape=(3, 12, 8), dtype=np.float32):
    rng = np.random.default_rng(SEED)
    files = []
    for i in range(n):
        files.append(str(tmp_path / f"s{i}.npy"))
        np.save(files[-1], random_array(rng, shape, dtype))
    return files


def _error_naming_a_file_no_garbage(p, n_batches, windows_of, pattern):
    """Run one epoch: an error matching ``pattern`` must come, and every batch delivered before it
    must hold the original windows (``windows_of(sample_id)``)."""
    with pytest.raises(Exception, match=pattern):
        for _ in range(n_batches):
            w, ids, _ = p.run()
            for k in range(len(ids)):
                np.testing.assert_array_equal(np.array(w[k]), windows_of(int(np.array(ids[k]))))
        pytest.fail("the epoch ended without an error")


# ---- files changed between pipe.build() and pipe.run() --------------------------------------------
def _truncate(f):
    with open(f, "r+b") as fh:
        fh.truncate(os.path.getsize(f) - 4)


def _grow(f):
    with open(f, "ab") as fh:
        fh.write(b"\0" * 16)


def _transpose(f):  # same bytes, another shape: only the header says so
    np.save(f, np.load(f).reshape(12, 3, 8))


def _retype(f):  # same size, int32 instead of float32
    np.save(f, np.load(f).view(np.int32))


def _other_shape(f):
    np.save(f, np.zeros((3, 13, 8), np.float32))


def _fifo(f):
    os.unlink(f)
    os.mkfifo(f)


def _folder(f):
    os.unlink(f)
    os.mkdir(f)


CHANGES = {
    "truncated": (_truncate, "the file is truncated: \\d+ bytes, but its layout"),
    "grown": (_grow, "the file is \\d+ bytes, but the plan .* expects \\d+"),
    "transposed": (_transpose, "its header differs from the one planned for"),
    "retyped": (_retype, "its header differs from the one planned for"),
    "other_shape": (_other_shape, "the file is \\d+ bytes, but the plan"),
    "fifo": (_fifo, "not a regular file"),
    "folder": (_folder, "not a regular file"),
    "deleted": (os.unlink, "no such file"),
}


@pytest.mark.parametrize("per_sample", [False, True])
@pytest.mark.parametrize("change", sorted(CHANGES))
def test_npy_changed_after_build(tmp_path, change, per_sample):
    files = _npy_files(tmp_path)
    src = NumpySource(files, _layout(), batch_size=2, shuffle=True, seed=1, per_sample_shapes=per_sample)
    expect = [take_window(np.load(f), src.layout.region(np.load(f).shape)) for f in files]
    p = native_pipeline(src)
    do, message = CHANGES[change]
    for f in files:
        do(f)
    name = re.escape(str(tmp_path)) + r"/s\d\.npy: "
    _error_naming_a_file_no_garbage(p, len(src) // 2, expect.__getitem__, name + message)


def test_npy_rewritten_with_the_same_layout_is_read_anew(tmp_path):
    # the header check refuses other layouts, not new contents: the same layout reads the new values
    files = _npy_files(tmp_path)
    src = NumpySource(files, _layout(), batch_size=2, shuffle=False)
    p = native_pipeline(src)
    for f in files:
        np.save(f, np.load(f) * 2 + 1)
    w, ids, _ = p.run()
    for k in range(2):
        sid = int(np.array(ids[k]))
        np.testing.assert_array_equal(np.array(w[k]), take_window(np.load(files[sid]), src.region))


def _h5(path, data, chunks=None):
    import h5py

    with h5py.File(path, "w") as f:
        f.create_dataset("fields", data=data, chunks=chunks)


def _h5_planned(tmp_path, chunks):
    """y.h5 of 4 random float32 steps (3, 12, 8) in ``chunks``, and a native pipeline built for it:
    ``(values, path, source, pipeline)``."""
    pytest.importorskip("h5py")
    rng = np.random.default_rng(SEED)
    data = random_array(rng, (4, 3, 12, 8), np.float32)
    path = str(tmp_path / "y.h5")
    _h5(path, data, chunks)
    src = HDF5Source([path], "fields", _layout(), batch_size=2, shuffle=False)
    return data, path, src, native_pipeline(src)


@pytest.mark.parametrize("chunks", [None, (1, 3, 4, 8)])
@pytest.mark.parametrize("change", ["transposed", "retyped", "truncated"])
def test_hdf5_changed_after_build(tmp_path, chunks, change):
    data, path, src, p = _h5_planned(tmp_path, chunks)
    size = os.path.getsize(path)
    if change == "transposed":  # same file size, frames (12, 3, 8): the dataset's header differs
        _h5(path, data.reshape(4, 12, 3, 8), None if chunks is None else (1, 4, 3, 8))
        assert os.path.getsize(path) == size
        message = "its header differs from the one planned for"
    elif change == "retyped":
        _h5(path, data.view(np.int32), chunks)
        assert os.path.getsize(path) == size
        message = "its header differs from the one planned for"
    else:
        _truncate(path)
        message = "the file is truncated"
    _error_naming_a_file_no_garbage(p, len(src) // 2, lambda t: take_window(data[t], src.region),
                                    re.escape(path) + ": " + message)


@pytest.mark.parametrize("change", ["retyped", "rechunked"])
def test_zarr_changed_after_build(tmp_path, change):
    zarr = pytest.importorskip("zarr")
    from dali_mesh.source import ZarrSource

    rng = np.random.default_rng(SEED)
    data = random_array(rng, (4, 3, 12, 8), np.float32)
    store = str(tmp_path / "z.zarr")
    z = zarr.create_array(store, shape=data.shape, chunks=(1, 3, 4, 8), dtype="f4", compressors=None, zarr_format=2)
    z[:] = data
    src = ZarrSource([store], None, _layout(), batch_size=2, shuffle=False)
    p = native_pipeline(src)
    shutil.rmtree(store)
    if change == "retyped":
        # int32: every chunk file keeps its name and size; only the metadata file tells
        z = zarr.create_array(store, shape=data.shape, chunks=(1, 3, 4, 8), dtype="i4", compressors=None,
                              zarr_format=2)
        z[:] = data.view(np.int32)
        message = re.escape(os.path.join(store, ".zarray")) + ": its metadata .* differs"
    else:
        # chunks of the same byte count, (1, 3, 8, 4): some chunk files keep their names and sizes,
        # others are gone; whichever file is opened first is named
        z = zarr.create_array(store, shape=data.shape, chunks=(1, 3, 8, 4), dtype="f4", compressors=None,
                              zarr_format=2)
        z[:] = data
        message = re.escape(store) + r"/([.\d]+: no such file|\.zarray: its metadata .* differs)"
    _error_naming_a_file_no_garbage(p, len(src) // 2, lambda t: take_window(data[t], src.region), message)


def test_zarr_shard_rewritten_at_its_size_and_time_is_refused(tmp_path):
    """Issue 29 item 7: a shard whose inner chunks were rewritten in another order (the same bytes
    and size; zarr-python reads the same values) with its modification time put back (cp -p, a
    restore from backup): the plan's index of it is stale, so every read of it is refused."""
    zarr = pytest.importorskip("zarr")
    from dali_mesh.source import ZarrSource

    rng = np.random.default_rng(SEED)
    data = random_array(rng, (2, 8, 6), np.float32)
    store = str(tmp_path / "s.zarr")
    z = zarr.create_array(store, shape=data.shape, chunks=(1, 4, 6), shards=(1, 8, 6), dtype="f4",
                          compressors=None, zarr_format=3)
    z[:] = data
    src = ZarrSource([store], None, Layout(mesh_of((1, 2), (0, 1)), shard={"m0": 0}), batch_size=1, shuffle=False)
    p = native_pipeline(src)
    shard = os.path.join(store, "c", "1", "0", "0")
    st = os.stat(shard)
    raw = bytearray(open(shard, "rb").read())
    chunk = 4 * 6 * 4
    index = np.frombuffer(bytes(raw[-(16 * 2 + 4):-4]), "<u8").reshape(2, 2).copy()
    assert index[:, 0].tolist() == [0, chunk]
    raw[:2 * chunk] = raw[chunk:2 * chunk] + raw[:chunk]  # the two inner chunks swapped ...
    index[:, 0] = [chunk, 0]  # ... and the index says so
    import google_crc32c

    body = index.astype("<u8").tobytes()
    raw[-(16 * 2 + 4):] = body + google_crc32c.value(body).to_bytes(4, "little")
    with open(shard, "r+b") as f:
        f.write(raw)
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(shard).st_size == st.st_size and os.stat(shard).st_mtime_ns == st.st_mtime_ns
    np.testing.assert_array_equal(zarr.open_array(store, mode="r")[:], data)  # a valid shard of the same values
    _error_naming_a_file_no_garbage(p, len(src), lambda t: take_window(data[t], src.region),
                                    re.escape(shard) + r": its index \(36 bytes at byte \d+\) differs from the one "
                                    "read when the plan was made")


# ---- the per-sample input and task_bytes: int64 extremes ------------------------------------------
def _direct(plan_path, ids, dtype=types.FLOAT, **kw):
    """The operator alone, fed ``ids`` (one list per batch) by an external source."""
    from dali_mesh.fn import load_plugin

    batches = iter(ids)

    @pipeline_def(batch_size=len(ids[0]), num_threads=1, device_id=None, prefetch_queue_depth=1)
    def pipe():
        x = fn.external_source(source=lambda: next(batches), batch=True)
        return load_plugin().read_windows(x, plan_file=plan_path, dtype=dtype, **kw)

    p = pipe()
    p.build()
    return p


@pytest.mark.parametrize("bad", [2**63 - 1, -2**63, -1, 4, 2**31 - 1, -2**31])
@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_sample_ids_out_of_range(tmp_path, bad, dtype):
    if np.iinfo(dtype).min > bad or bad > np.iinfo(dtype).max:
        pytest.skip("not representable")
    files = _npy_files(tmp_path)
    src = NumpySource(files, _layout(), batch_size=2, shuffle=False)
    path = native.plan_source(src).write(str(tmp_path / "plans"))
    p = _direct(path, [[np.array(1, dtype), np.array(bad, dtype)]])
    with pytest.raises(RuntimeError, match=f"sample id {bad} is out of range for the 4 samples of {re.escape(path)}"):
        p.run()


def test_sample_ids_of_other_types_and_shapes(tmp_path):
    files = _npy_files(tmp_path)
    src = NumpySource(files, _layout(), batch_size=1, shuffle=False)
    path = native.plan_source(src).write(str(tmp_path / "plans"))
    with pytest.raises(RuntimeError, match="sample ids have type .*; expected int32 or int64"):
        _direct(path, [[np.array(1.0, np.float32)]]).run()
    with pytest.raises(RuntimeError, match="one sample id per sample, got shape"):
        _direct(path, [[np.array([0, 1], np.int64)]]).run()
    with pytest.raises(RuntimeError, match="one sample id per sample, got shape"):
        _direct(path, [[np.zeros(0, np.int64)]]).run()
    # int32 and int64 ids, valid: the windows of those samples
    for dt in (np.int32, np.int64, np.uint8):
        if dt == np.uint8:
            with pytest.raises(RuntimeError, match="expected int32 or int64"):
                _direct(path, [[np.array(3, dt)]]).run()
            continue
        (w,) = _direct(path, [[np.array(3, dt)]]).run()
        np.testing.assert_array_equal(np.array(w[0]), take_window(np.load(files[3]), src.region))


@pytest.mark.parametrize("task_bytes", [2**63 - 1, -2**63, 0, 1])
def test_task_bytes_extremes_read_the_same_windows(tmp_path, task_bytes):
    files = _npy_files(tmp_path, shape=(3, 40, 24))
    src = NumpySource(files, _layout(), batch_size=2, shuffle=False)
    p = native_pipeline(src, task_bytes=task_bytes)
    for _ in range(len(src) // 2):
        w, ids, _ = p.run()
        for k in range(2):
            sid = int(np.array(ids[k]))
            np.testing.assert_array_equal(np.array(w[k]), take_window(np.load(files[sid]), src.region))


# ---- plan files -----------------------------------------------------------------------------------
def test_plan_file_deleted_before_and_after_build(tmp_path):
    files = _npy_files(tmp_path)
    src = NumpySource(files, _layout(), batch_size=2, shuffle=False)
    plan_dir = str(tmp_path / "plans")

    @pipeline_def(batch_size=2, num_threads=1, device_id=None)
    def pipe():
        return native.read_windows(src, fallback=False, plan_dir=plan_dir)

    p = pipe()
    (name,) = os.listdir(plan_dir)  # written when the graph was defined
    os.unlink(os.path.join(plan_dir, name))
    with pytest.raises(RuntimeError, match=f"{re.escape(os.path.join(plan_dir, name))}: cannot open the plan file"):
        p.build()
    q = pipe()
    q.build()  # the operator loaded its plan: the file is no longer needed
    for n in os.listdir(plan_dir):
        os.unlink(os.path.join(plan_dir, n))
    w, ids, _ = q.run()
    np.testing.assert_array_equal(np.array(w[0]), take_window(np.load(files[int(np.array(ids[0]))]), src.region))


def _plan_bytes(tmp_path):
    files = _npy_files(tmp_path, n=2, shape=(2, 6, 5))
    src = NumpySource(files, _layout(), batch_size=1, shuffle=False)
    return native.plan_source(src).to_bytes(), files, src


def test_every_corrupted_word_of_a_plan_file_is_refused(tmp_path):
    data, files, src = _plan_bytes(tmp_path)
    good = tmp_path / "good.dmplan"
    good.write_bytes(data)
    (w,) = _direct(str(good), [[np.array(1, np.int64)]]).run()
    np.testing.assert_array_equal(np.array(w[0]), take_window(np.load(files[1]), src.region))
    bad = tmp_path / "bad.dmplan"
    words = len(data) // 8
    for i in range(1, words):  # every word after the magic, the checksum included
        b = bytearray(data)
        b[8 * i] ^= 0x01
        bad.write_bytes(bytes(b))
        with pytest.raises(RuntimeError, match=f"{re.escape(str(bad))}: the plan file is corrupt"):
            _direct(str(bad), [[np.array(0, np.int64)]])
    for cut in (0, 7, 8, 9, 16, len(data) - 8, len(data) - 1):
        bad.write_bytes(data[:cut])
        with pytest.raises(RuntimeError, match=re.escape(str(bad)) + ": (the plan file is corrupt|not a dali_mesh plan)"):
            _direct(str(bad), [[np.array(0, np.int64)]])
    bad.write_bytes(b"DMPLAN01" + data[8:])  # the format before the checksum
    with pytest.raises(RuntimeError, match="not a dali_mesh plan file of this version"):
        _direct(str(bad), [[np.array(0, np.int64)]])


_FUZZ = r"""
import sys, numpy as np
from nvidia.dali import fn, pipeline_def, types
from dali_mesh import _kernels
from dali_mesh.fn import load_plugin
data, bad = open(sys.argv[1], "rb").read(), sys.argv[2]
body = data[8:-8]
outcomes = {"refused": 0, "error": 0, "ran": 0}
for i in range(len(body) // 8):
    for v in (-1, 2**63 - 1, -2**63, 1 << 40):
        b = bytearray(body)
        b[8 * i:8 * i + 8] = np.int64(v).astype("<i8").tobytes()
        open(bad, "wb").write(data[:8] + bytes(b) + _kernels.plan_checksum(bytes(b)))

        @pipeline_def(batch_size=2, num_threads=2, device_id=None, prefetch_queue_depth=1)
        def pipe():
            ids = fn.external_source(source=lambda: [np.array(0, np.int64), np.array(1, np.int64)], batch=True)
            return load_plugin().read_windows(ids, plan_file=bad, dtype=types.FLOAT)

        try:
            p = pipe()
            p.build()
        except RuntimeError as e:
            assert bad in str(e) and ("corrupt" in str(e) or "dtype" in str(e) or "axes" in str(e)), str(e)
            outcomes["refused"] += 1
            continue
        try:
            p.run()
            outcomes["ran"] += 1
        except RuntimeError as e:
            assert "read_windows" in str(e), str(e)
            outcomes["error"] += 1
print(outcomes)
"""


def test_checksum_valid_nonsense_never_crashes(tmp_path):
    """Every word of a plan file set to -1, 2**63-1, -2**63 and 2**40, with a valid checksum: the
    operator refuses the plan, raises an error, or reads (a file offset or fill value that is
    valid, if wrong) -- in a subprocess, so that a crash fails the test instead of killing it."""
    data, _, _ = _plan_bytes(tmp_path)
    plan = tmp_path / "p.dmplan"
    plan.write_bytes(data)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", _FUZZ, str(plan), str(tmp_path / "bad.dmplan")],
                          capture_output=True, text=True, timeout=100, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    outcomes = eval(proc.stdout.strip().splitlines()[-1])  # noqa: S307 - our own subprocess's dict
    assert outcomes["refused"] > 0 and sum(outcomes.values()) == 4 * (len(data) // 8 - 2)


# ---- two pipelines, two sources, one process ------------------------------------------------------
def test_two_pipelines_with_different_sources_in_one_process(tmp_path):
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a_dir.mkdir()
    b_dir.mkdir()
    fa = _npy_files(a_dir, n=5, shape=(3, 12, 8), dtype=np.float32)
    fb = _npy_files(b_dir, n=3, shape=(20, 7), dtype=np.int16)
    sa = NumpySource(fa, _layout(), batch_size=2, shuffle=True, seed=3)
    sb = NumpySource(fb, Layout(mesh_of((1, 2), (0, 1)), shard={"m0": 0}, halo={0: 3}, boundary="constant",
                                fill_value=-9), batch_size=1, shuffle=True, seed=4)
    pa, pb = native_pipeline(sa), native_pipeline(sb)

    @pipeline_def(batch_size=1, num_threads=2, device_id=None)
    def both():  # one pipeline, two native readers of different sources
        return native.read_windows(sb, fallback=False) + native.read_windows(
            NumpySource(fa, _layout(), batch_size=1, shuffle=False), fallback=False)

    pab = both()
    pab.build()
    ea = [take_window(np.load(f), sa.region) for f in fa]
    eb = [take_window(np.load(f), sb.region) for f in fb]
    for epoch in range(2):
        for step in range(max(len(sa) // 2, len(sb))):  # interleaved runs
            if step < len(sa) // 2:
                w, ids, _ = pa.run()
                got = [int(np.array(ids[k])) for k in range(2)]
                assert got == list(sa.order(epoch)[0][2 * step:2 * step + 2])
                for k, sid in enumerate(got):
                    np.testing.assert_array_equal(np.array(w[k]), ea[sid])
            if step < len(sb):
                w, ids, _ = pb.run()
                assert int(np.array(ids[0])) == sb.order(epoch)[0][step]
                np.testing.assert_array_equal(np.array(w[0]), eb[int(np.array(ids[0]))])
                wb, idb, _, wa, ida, _ = pab.run()
                np.testing.assert_array_equal(np.array(wb[0]), eb[int(np.array(idb[0]))])
                np.testing.assert_array_equal(np.array(wa[0]), ea[int(np.array(ida[0]))])
        for p in (pa, pb):
            with pytest.raises(StopIteration):
                p.run()
            p.reset()
        pab = both()  # the combined pipeline's sources have different lengths: start it afresh
        pab.build()


# ---- checkpoints across an epoch boundary ---------------------------------------------------------
def _continue(p, n):
    """The next ``n`` events: a batch's ids (tuple) and windows, or "end" (then the pipeline is reset)."""
    out = []
    while len(out) < n:
        try:
            w, ids, pads = p.run()
        except StopIteration:
            p.reset()
            out.append(("end", None))
            continue
        out.append((tuple(int(np.array(ids[k])) for k in range(len(ids))), [np.array(w[k]) for k in range(len(ids))]))
    return out


@pytest.mark.parametrize("where", ["last_batch", "after_reset", "first_batch_of_epoch_1"])
def test_checkpoint_resume_across_the_epoch_boundary(tmp_path, where):
    files = _npy_files(tmp_path, n=7)
    mesh = MeshInfo((2, 3), ("data_parallel", "model_parallel"), (1, 2))
    layout = Layout(mesh, shard={"model_parallel": 1}, halo={1: 1}, boundary="periodic")
    src = NumpySource(files, layout, batch_size=2, shuffle=True, seed=11)  # 4 of 7 per rank, one padded
    steps = len(src) // 2
    p = native_pipeline(src)
    for _ in range(steps):
        p.run()
    if where != "last_batch":
        with pytest.raises(StopIteration):
            p.run()
        p.reset()
    if where == "first_batch_of_epoch_1":
        p.run()
    ck = p.checkpoint()
    want = _continue(p, 2 * steps + 2)
    q = native_pipeline(src, checkpoint=ck)
    got = _continue(q, 2 * steps + 2)
    assert [ids for ids, _ in got] == [ids for ids, _ in want]
    for (_, a), (_, b) in zip(got, want):
        for x, y in zip(a or [], b or []):
            np.testing.assert_array_equal(x, y)
    # and the batches are the sample order's: epoch 1 (and 2) as SampleOrder says
    order = {e: [tuple(int(i) for i in src.order(e)[0][2 * s:2 * s + 2]) for s in range(steps)] for e in (1, 2)}
    batches = [ids for ids, _ in got]
    if where == "last_batch":
        assert batches[0] == "end" and batches[1:steps + 1] == order[1]
    elif where == "after_reset":
        assert batches[:steps] == order[1] and batches[steps] == "end"
    else:
        assert batches[:steps - 1] == order[1][1:] and batches[steps - 1] == "end"
    for ids, wins in got:
        if ids != "end":
            for sid, w in zip(ids, wins):
                np.testing.assert_array_equal(w, take_window(np.load(files[sid]), src.region))


@pytest.mark.parametrize("chunks", [None, (1, 3, 4, 8)])
def test_hdf5_rewritten_with_the_same_layout_is_refused_then_read_anew(tmp_path, chunks):
    """h5py writes the same object header for the same layout, so the header check cannot tell a
    rewrite from the file planned for (and with several datasets the header at the planned address
    may be another dataset's): any rewrite is refused, naming the file, never read as planned; a
    pipeline defined again reads the new values. (Before issue 19 the new values were read.)"""
    data, path, src, p = _h5_planned(tmp_path, chunks)
    time.sleep(0.01)  # a later modification time, also on coarse clocks
    _h5(path, data * 2 + 1, chunks)
    _error_naming_a_file_no_garbage(p, len(src) // 2, lambda t: take_window(data[t], src.region),
                                    re.escape(path) + ": the file was modified since the plan was made")
    p = native_pipeline(HDF5Source([path], "fields", _layout(), batch_size=2, shuffle=False))
    for _ in range(len(src) // 2):
        w, ids, _ = p.run()
        for k in range(2):
            t = src.step_of(int(np.array(ids[k])))
            np.testing.assert_array_equal(np.array(w[k]), take_window(data[t] * 2 + 1, src.region))


# ---- a bounded number of open files -----------------------------------------------------------
@pytest.mark.timeout(180)
def test_many_chunk_zarr_batch_reads_under_a_low_open_file_limit(tmp_path):
    """(4, 8, 32, 64) in (1, 1, 8, 8) chunks, rank 1 of 2 over axis 1: 128 chunk files + the metadata
    per sample, 516 per batch of 4; with RLIMIT_NOFILE 256 a reader holding every file of the batch
    open fails ("Too many open files")."""
    pytest.importorskip("zarr")
    out = run_python(f"""
        import os, resource, sys
        import numpy as np, zarr
        from dali_mesh import Layout, MeshInfo
        from dali_mesh.pipeline import native
        from dali_mesh.source import ZarrSource
        from tests.helpers import assert_windows, native_pipeline
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
        pp = native_pipeline(src, checkpointing=False)
        w, ids, _ = pp.run()
        got = sorted(int(np.array(ids[i])) for i in range(4))
        assert got == [0, 1, 2, 3], got
        assert_windows(w, ids, arr, src.region)
        print("ok")
    """, check=True).stdout
    assert out.strip().endswith("ok")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("case", ["ndim0_fortran", "ndim1_fortran", "fortran_flag_2", "fill_size", "count_zero",
                                  "step_below_run", "runs_past_window", "steps_overflow", "spans_interleave"])
def test_checksum_valid_plans_out_of_their_arrays_are_refused(tmp_path, case):
    data = tmp_path / "data.bin"
    data.write_bytes(bytes(range(256)) * 64)
    if case == "ndim0_fortran":  # the transpose would read shape[-1]
        plan = crafted_plan(0, 4, 0, 1, [], [0], [0], [4], [0], [1])
        why = "Fortran order with 0 axes"
    elif case == "ndim1_fortran":
        plan = crafted_plan(1, 4, 0, 1, [4], [0], [0], [16], [0], [1])
        why = "Fortran order with 1 axes"
    elif case == "fortran_flag_2":
        plan = crafted_plan(2, 4, 0, 2, [2, 2], [0], [0], [16], [0], [1])
        why = "Fortran flag 2"
    elif case == "fill_size":  # a 1-byte fill value for 4-byte items: the device fill reads 4 bytes of it
        plan = crafted_plan(1, 4, 0, 0, [4], [0], [0], [16], [0], [1], fill=b"\x01")
        why = "fill value size"
    else:  # repeated units (count, file step, window step) whose runs leave the window or overlap
        why = "unit 0 lies outside the window"
        fo, do, ub, rep = [0], [0], [4], {"count_zero": ([0], [16], [4]), "step_below_run": ([2], [2], [4]),
                                          "runs_past_window": ([5], [16], [4]),
                                          "steps_overflow": ([1 << 40], [1 << 40], [4])}.get(case)
        if case == "spans_interleave":  # unit 0's runs at 0 and 16, unit 1 at 8: not sorted and disjoint
            fo, do, ub, rep, why = [0, 8], [0, 8], [4, 4], ([2, 1], [16, 0], [4, 0]), "units are not sorted"
        plan = crafted_plan(1, 4, 0, 0, [4], fo, do, ub, [0], [len(fo)], repeat=rep)
    path = crafted_plan_file(tmp_path / "p.plan", [plan], [(str(data), -1)], [(0, [(0, 0, 0, 0)])])
    with pytest.raises(RuntimeError, match=f"the plan file is corrupt \\({why}"):
        run_plan_file(path)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("repeat", [False, True])
def test_a_crafted_gap_of_a_terabyte_is_read_through_a_small_scratch(tmp_path, repeat):
    """Two units 2**40 bytes apart in one read (or one unit of two runs that far apart): the gap's
    scratch was allocated at its size (a crafted plan asked for 1 TiB; a 16 GiB gap took 19 s of page
    faults in the fuzz, although the operator splits such a read at its task size and never reads the
    gap). Gaps now take several buffers of a 1 MiB scratch: the read past the file's end is an error
    naming it."""
    data = tmp_path / "data.bin"
    data.write_bytes(bytes(64))
    if repeat:
        plan = crafted_plan(1, 4, 0, 0, [2], [0], [0], [4], [0], [1], repeat=([2], [1 << 40], [4]))
    else:
        plan = crafted_plan(1, 4, 0, 0, [2], [0, 1 << 40], [0, 4], [4, 4], [0], [2])
    path = crafted_plan_file(tmp_path / "p.plan", [plan], [(str(data), 64)], [(0, [(0, 0, 0, 0)])])
    with pytest.raises(RuntimeError, match=r"data.bin: read at byte \d+ returned nothing"):
        run_plan_file(path)


@pytest.mark.timeout(180)
def test_a_crafted_plan_that_is_valid_reads_exactly(tmp_path):
    """The crafted-plan writer above against a plan that is right: the refusals are not everything."""
    data = tmp_path / "data.bin"
    raw = np.arange(64, dtype=np.float32)
    data.write_bytes(raw.tobytes())
    # a 2 x 3 window stored in Fortran order at bytes 16.. of the file
    plan = crafted_plan(2, 4, 0, 1, [2, 3], [16], [0], [24], [0], [1])
    path = crafted_plan_file(tmp_path / "p.plan", [plan], [(str(data), raw.nbytes)], [(0, [(0, 0, 0, 0)])])
    (w,) = run_plan_file(path)
    np.testing.assert_array_equal(np.array(w[0]), raw[4:10].reshape(3, 2).T)
    # a column of a (16, 4) array: one unit of 5 runs of 4 bytes, 16 bytes apart in the file, landing
    # at every other cell of a (12,) window; then, 12 bytes past the unit's last run, a run of 2 cells
    # into cells 10 and 11 (one read: the gaps land in the scratch)
    plan = crafted_plan(1, 4, 0, 0, [12], [4, 84], [0, 40], [4, 8], [0], [2], repeat=([5, 1], [16, 0], [8, 0]))
    path = crafted_plan_file(tmp_path / "q.plan", [plan], [(str(data), raw.nbytes)], [(0, [(0, 0, 0, 0)])])
    (w,) = run_plan_file(path)
    got = np.array(w[0])
    np.testing.assert_array_equal(got[[0, 2, 4, 6, 8]], raw[1:18:4])
    np.testing.assert_array_equal(got[10:12], raw[21:23])


def _preload_shim(tmp_path, name, source, what):
    """``source`` (C) built into ``tmp_path/<name>.so``, for LD_PRELOAD; the calling test is skipped
    without a C compiler (``what``: the shim's name, for the message)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip(f"no C compiler for the {what} shim")
    (tmp_path / f"{name}.c").write_text(source)
    shim = tmp_path / f"{name}.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(shim), str(tmp_path / f"{name}.c"), "-ldl"],
                   check=True, timeout=60)
    return shim


@pytest.mark.timeout(180)
def test_short_reads_and_eintr_in_the_header_check_and_the_reads(tmp_path):
    shim = _preload_shim(tmp_path, "shim", SHIM, "pread")
    out = run_python(f"""
        import os
        import numpy as np
        from dali_mesh import Layout, MeshInfo
        from dali_mesh.source import NumpySource
        from tests.helpers import assert_windows, native_pipeline
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
        p = native_pipeline(src, checkpointing=False)
        os.environ["DALI_MESH_SHIM"] = "1"  # from here on: EINTR and short reads
        for _ in range(2):
            w, ids, _ = p.run()
            assert_windows(w, ids, data, src.region)
        print("ok")
    """, env={"LD_PRELOAD": str(shim)}, check=True).stdout
    assert out.strip().endswith("ok")


@pytest.mark.timeout(180)
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
        assert_windows(w, ids, x, src.region)


# ---- the header check retried after short reads and EINTR -----------------------------------------
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


# ---- issue 19: a plan checks exactly the header it was made from -----------------------------------------
def test_npy_plan_checks_exactly_the_header_it_was_planned_from(tmp_path, monkeypatch):
    """A file replaced between the parse of its header and the plan: the plan's check must be the
    header it was planned from (it was the replacement's, read a second time: a plan for shape A
    checking header B read B's bytes as A's). The planner reads the first file's header twice (the
    source's shape, then the plan's header at the version the plan records): it refuses the file as
    changed, or plans it from one header and the reader refuses the replacement."""
    from dali_mesh.formats.npy import npy_reader as npy

    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    files = [str(tmp_path / "s0.npy"), str(tmp_path / "s1.npy")]
    for f in files:
        np.save(f, a)
    other = str(tmp_path / "other.npy")
    np.save(other, a.reshape(6, 4))  # same size, same header length, another shape
    assert os.path.getsize(other) == os.path.getsize(files[0])
    src = NumpySource(files, Layout(mesh_of((1, 2), (0, 1)), shard={"m0": 0}), batch_size=1, shuffle=False)
    real = npy._parse_header
    swapped = []

    def parse_then_replace(path, head, size):
        header = real(path, head, size)
        if not swapped:  # the first file is replaced right after its header is parsed
            swapped.append(path)
            shutil.copy(other, path + ".new")
            os.replace(path + ".new", path)
        return header

    monkeypatch.setattr(npy, "_parse_header", parse_then_replace)
    try:
        plan = native.plan_source(src)
    except DataFileError as e:
        assert "changed while the plan was made" in str(e) and "s0.npy" in str(e)
        assert swapped == [files[0]]
        return
    finally:
        monkeypatch.undo()
    assert swapped == [files[0]]
    for i, item in enumerate(plan.items):
        p = plan.plans[item.parts[0].plan]
        checked = real(files[i], p.check, plan.files[i].size)
        assert checked.shape == (4, 6) and p.shape == (2, 6), (i, checked.shape, p.shape)
    # and the reader refuses the replaced file instead of reading its bytes as the planned shape
    with pytest.raises(RuntimeError, match="s0.npy"):
        run_plan_file(plan.write(str(tmp_path / "plans")))


# ---- issue 19: where plans live ------------------------------------------------------------------------
def _plan_of(tmp_path):
    files = _npy_files(tmp_path, n=2)
    return native.plan_source(NumpySource(files, _layout(), batch_size=2, shuffle=False))


def test_default_plans_are_sealed_in_memory_and_leave_no_file(tmp_path):
    """The default plan is a sealed memfd of this process: no file in the temp folder (a folder
    another user made first received the plans; SIGKILL and os._exit left plan files behind), and
    nothing can change it once written."""
    folder = os.path.join(tempfile.gettempdir(), f"dali_mesh_plans_{os.getuid()}")
    before = set(os.listdir(folder)) if os.path.isdir(folder) else set()
    plan = _plan_of(tmp_path)
    path = plan.write()
    assert path.startswith("/proc/self/fd/"), path
    after = set(os.listdir(folder)) if os.path.isdir(folder) else set()
    assert after == before
    with open(path, "rb") as f:
        assert f.read() == plan.to_bytes()
    fd = os.open(path, os.O_RDWR)
    try:
        with pytest.raises(PermissionError):
            os.write(fd, PLAN_MAGIC)  # sealed: F_SEAL_WRITE
    finally:
        os.close(fd)
    assert plan.write() == path  # one memfd per distinct plan
    w, _, _ = native_pipeline(NumpySource(_npy_files(tmp_path, n=2), _layout(), batch_size=2, shuffle=False)).run()
    assert len(w) == 2


def test_a_process_that_dies_leaves_no_plan_behind(tmp_path):
    """os._exit (fork-started workers exit that way) after a native pipeline ran: no plan file
    remains in the temp folder (56 orphans of dead processes were found on one machine)."""
    folder = os.path.join(tempfile.gettempdir(), f"dali_mesh_plans_{os.getuid()}")
    out = run_python(f"""
        import os
        import numpy as np
        from dali_mesh import Layout, MeshInfo
        from dali_mesh.source import NumpySource
        from tests.helpers import native_pipeline
        files = []
        for i in range(2):
            files.append(os.path.join({str(tmp_path)!r}, f"d{{i}}.npy"))
            np.save(files[-1], np.full((3, 12, 8), i, np.float32))
        layout = Layout(MeshInfo((1, 3), ("data_parallel", "m0"), (0, 1)), shard={{"m0": 1}})
        native_pipeline(NumpySource(files, layout, batch_size=2, shuffle=False)).run()
        print(os.getpid(), flush=True)
        os._exit(0)
    """, check=True).stdout
    pid = out.split()[-1]
    left = [n for n in (os.listdir(folder) if os.path.isdir(folder) else []) if f".{pid}." in n]
    assert left == []


@pytest.mark.parametrize("case", ["other_owner", "world_writable", "symlink"])
def test_a_plan_folder_another_user_can_write_is_refused(tmp_path, case):
    """A plan folder someone else owns or can write into is refused, naming it (plans there could
    be swapped for a forged one that reads any file this user can read)."""
    from dali_mesh.plan import PlanFolderError

    plan = _plan_of(tmp_path)
    folder = tmp_path / "plans"
    if case == "symlink":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        folder.symlink_to(tmp_path / "elsewhere")
        words = "not a folder"
    else:
        folder.mkdir(mode=0o700)
        if case == "other_owner":
            if os.getuid() != 0:
                pytest.skip("giving a folder to another user needs root")
            os.chown(folder, 12345, 12345)
            words = "belongs to uid 12345"
        else:
            os.chmod(folder, 0o777)
            words = "writable by others"
    with pytest.raises(PlanFolderError, match=f"{re.escape(str(folder))}: .*{words}"):
        plan.write(str(folder))
    assert not [n for n in os.listdir(folder) if n.endswith(".dmplan")]
    # a folder of this user's own is used
    own = tmp_path / "own"
    path = plan.write(str(own))
    assert os.path.dirname(path) == str(own) and stat.S_IMODE(os.stat(own).st_mode) == 0o700


def test_hdf5_rewritten_with_its_datasets_in_another_order_is_refused(tmp_path):
    """Two datasets of one layout; the file rewritten with them in the other order, same size: the
    header at the planned address is the other dataset's, byte for byte (it returned the other
    dataset's data). Any rewrite of an HDF5 file since the plan is refused, naming it."""
    h5py = pytest.importorskip("h5py")
    a = np.arange(8 * 6 * 5, dtype=np.float32).reshape(8, 6, 5)
    b = -a
    path = str(tmp_path / "two.h5")
    with h5py.File(path, "w") as f:
        f["a"], f["b"] = a, b
    layout = Layout(mesh_of((1, 2), (0, 1)), shard={"m0": 1})
    src = HDF5Source([path], "a", layout, batch_size=2, shuffle=False)
    p = native_pipeline(src)
    w, ids, _ = p.run()
    np.testing.assert_array_equal(np.array(w[0]), take_window(a[int(np.array(ids[0]))], src.region))
    size = os.path.getsize(path)
    time.sleep(0.01)  # a later modification time, also on coarse clocks
    with h5py.File(path, "w") as f:  # the same file, its datasets written in the other order
        f["b"] = b
        f["a"] = a
    assert os.path.getsize(path) == size
    with h5py.File(path, "r") as f:
        assert h5py.h5o.get_info(f["b"].id).addr < h5py.h5o.get_info(f["a"].id).addr  # they swapped places
    with pytest.raises(RuntimeError, match=re.escape(path) + ": the file was modified since the plan was made"):
        for _ in range(3):  # (a batch read before the rewrite may be waiting in the prefetch queue)
            p.run()


# ---- issue 19: what a file that cannot be read natively is called --------------------------------
def test_compact_hdf5_and_chunks_past_the_end_are_named_for_what_they_are(tmp_path):
    """A compact dataset was logged as "never written"; a chunk address past the end of the file
    was a read-time "truncated" error (and near 2**63 a hang): both are named at plan time."""
    h5py = pytest.importorskip("h5py")
    data = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    compact = str(tmp_path / "compact.h5")
    with h5py.File(compact, "w") as f:
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_layout(h5py.h5d.COMPACT)
        ds = h5py.Dataset(h5py.h5d.create(f.id, b"fields", h5py.h5t.py_create(data.dtype),
                                          h5py.h5s.create_simple(data.shape), dcpl=dcpl))
        ds[...] = data
    layout = Layout(mesh_of((1, 1), (0, 0)), shard={"m0": 1})
    with pytest.raises(native.NotNativeError, match="is stored compact"):
        native.plan_windows(HDF5Source([compact], "fields", layout, batch_size=1))
    chunked = str(tmp_path / "chunked.h5")
    with h5py.File(chunked, "w") as f:
        f.create_dataset("fields", data=data, chunks=(1, 3, 4))
    with h5py.File(chunked, "r") as f:
        offset = f["fields"].id.get_chunk_info(1).byte_offset
    # the file cut inside the second chunk (its index still says where the chunk was), the
    # superblock's end-of-file address (version 0: bytes 40..48) cut with it so that HDF5 opens it
    with open(chunked, "r+b") as fh:
        assert fh.read(9)[8] == 0, "expected a version-0 superblock"
        fh.truncate(offset + 8)
        fh.seek(40)
        fh.write((offset + 8).to_bytes(8, "little"))
    with pytest.raises(native.NotNativeError, match=r"chunk \(1, 0, 0\) .* past the end of the file"):
        native.plan_windows(HDF5Source([chunked], "fields", layout, batch_size=1))


@pytest.mark.timeout(120)
def test_a_group_near_2_63_is_refused_not_prefetched_for_ever(tmp_path):
    """A crafted plan whose units lie near 2**63 (as a crafted chunk index makes them): the
    prefetch announced pieces past the file with an offset that overflowed and looped for ever;
    now the read fails naming the file, and the process exits."""
    data = tmp_path / "data.bin"
    data.write_bytes(b"\0" * 4096)
    plan = crafted_plan(1, 4, 0, 0, [4], [(1 << 63) - 4096], [0], [16], [0], [1])
    path = crafted_plan_file(tmp_path / "p.dmplan", [plan], [(str(data), -1)], [(0, [(0, 0, 0, 0)])])
    proc = run_python(f"""
        from tests.helpers import run_plan_file
        try:
            run_plan_file({path!r})
        except RuntimeError as e:
            print("refused:", "data.bin" in str(e), "cannot be read" in str(e) or "truncated" in str(e))
    """, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "refused: True True" in proc.stdout, proc.stdout


# ---- issue 19: a native read stuck on slow storage ----------------------------------------------------
STALL = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
/* once DALI_MESH_STALL is set: preadv of a data file sleeps an hour (slow storage), and a signal
   ends the sleep as it ends a read blocked in the kernel: EINTR */
ssize_t preadv(int fd, const struct iovec *iov, int cnt, off_t off) {
  static ssize_t (*real)(int, const struct iovec *, int, off_t);
  if (!real) real = dlsym(RTLD_NEXT, "preadv");
  if (getenv("DALI_MESH_STALL")) {
    struct timespec t = {3600, 0};
    if (nanosleep(&t, NULL) != 0) { errno = EINTR; return -1; }
  }
  return real(fd, iov, cnt, off);
}
ssize_t preadv64(int fd, const struct iovec *iov, int cnt, off_t off) { return preadv(fd, iov, cnt, off); }
"""


@pytest.mark.timeout(120)
def test_a_stuck_native_read_is_named_and_the_process_exits(tmp_path):
    """A native read stuck on slow storage: the timeout named no file ("workers: none started") and
    the process stayed 59 s after the error. Now the error names the file and byte range of the
    stuck read, and the read is interrupted so that the process exits within 10 s of the error."""
    shim = _preload_shim(tmp_path, "stall", STALL, "preadv")
    script = f"""
        import os, time
        import numpy as np
        from nvidia.dali import pipeline_def
        from dali_mesh import Layout, MeshInfo, WorkerError, watched_run
        from dali_mesh.pipeline import native
        from dali_mesh.source import NumpySource
        files = []
        for k in range(4):
            files.append(os.path.join({str(tmp_path)!r}, f"slow{{k}}.npy"))
            np.save(files[-1], np.zeros((3, 12, 8), np.float32))
        layout = Layout(MeshInfo((1, 3), ("data_parallel", "m0"), (0, 1)), shard={{"m0": 1}})
        src = NumpySource(files, layout, batch_size=2, shuffle=False)

        @pipeline_def(batch_size=2, num_threads=2, device_id=None, prefetch_queue_depth=1)
        def pipe():
            return native.read_windows(src, fallback=False)

        p = pipe()
        p.build()
        os.environ["DALI_MESH_STALL"] = "1"
        try:
            watched_run(p, timeout=2)
        except WorkerError as e:
            print("ERROR", str(e).replace(chr(10), " "), flush=True)
            del os.environ["DALI_MESH_STALL"]
            again = pipe()  # a pipeline built after the failure reads as usual
            again.build()
            w, _, _ = again.run()
            print("again", len(w), flush=True)
            print("at", time.time(), flush=True)
    """
    out, err = run_python_bounded(script, env={"LD_PRELOAD": str(shim)}, timeout=90)
    ended = time.time()
    assert "ERROR" in out, (out, err[-3000:])
    message = out.split("ERROR", 1)[1]
    assert re.search(r"native reads in flight: \S*slow\d\.npy bytes \d+\.\.\d+ for [\d.]+ s", message), message
    assert "again 2" in out, out
    assert ended - float(out.split("\nat ")[1].split()[0]) < 10, out


@pytest.mark.timeout(90)
def test_npy_saved_over_while_read_natively_is_one_version_or_an_error(tmp_path):
    """Issue 29 item 8, the native reader: a file saved over (np.save) again and again while
    read_windows reads it (a window in several tasks: 64 KiB each) gives the window of one version,
    or an error naming the file; never a window of two versions (see tests/io/test_npy_rewrite.py)."""
    from tests.io.test_npy_rewrite import race_with_saves

    shape = (32, 256, 128)
    versions = [np.full(shape, v, np.float32) for v in (1.0, 2.0)]
    path = str(tmp_path / "x.npy")
    np.save(path, versions[0])
    src = NumpySource([path], Layout(mesh_of((1, 4), (0, 1)), shard={"m0": 2}, halo={2: 3}), batch_size=1,
                      shuffle=False)
    pipes = []

    def read():
        try:
            if not pipes:
                pipes.append(native_pipeline(src, threads=2, prefetch=False, task_bytes=64 << 10))
            return np.array(pipes[0].run()[0][0])
        except StopIteration:  # an epoch of one sample
            pipes[0].reset()
            return None
        except (RuntimeError, ValueError):  # at pipe.run(), or planning a half-written file: a new pipeline
            pipes.clear()
            raise

    good, refused = race_with_saves(path, versions, read, [take_window(v, src.region) for v in versions], 3.0,
                                    (RuntimeError, ValueError))
    assert good > 0 and refused > 0, (good, refused)
