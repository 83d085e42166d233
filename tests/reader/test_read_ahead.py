"""Reading the next batch ahead (``BatchReader::ReadAhead``, csrc/reader/batch_reader.cc) is a fast path:
a batch read on threads of its own into buffers of its own, then copied when that batch is read. Held
to numpy, zarr-python and h5py (``take_window`` of the arrays they read) over every class of its
inputs: every format the reader reads (.npy C and Fortran order, HDF5 gzip chunks, Zarr v2 Blosc chunks
read in parts, Zarr v3 sharded Zstd, a forecast's two outputs), and every order of hints and reads (the
hinted batch read next, read later, never read, hinted twice, three hints in a row, ids out of range,
repeated ids, batches of other sizes). Files changed after the hint give the error of that batch, at
that batch's read, never at an earlier one. DALI is not imported (the reader is driven through
:class:`dali_mesh._kernels.PlanReader`); the pipeline's next-batch input is tested in
tests/storage/test_remote_read_ahead.py and tests/pipeline."""
from __future__ import annotations

import numpy as np
import pytest

from dali_mesh import Layout
from dali_mesh.partition import take_window
from dali_mesh.source import ForecastSpec, HDF5Source, NumpySource, ZarrSource
from tests.helpers import SEED, mesh_of, random_array

zarr = pytest.importorskip("zarr")
numcodecs = pytest.importorskip("numcodecs")
h5py = pytest.importorskip("h5py")

from dali_mesh import _kernels  # noqa: E402
from dali_mesh.plan import PlanSet  # noqa: E402
from dali_mesh.pipeline import native  # noqa: E402

STEPS = 6


def _layout(**kw):
    return Layout(mesh_of((1, 2, 2), (0, 1, 0)), shard={"m0": 1, "m1": 2}, halo={1: 2, 2: 3},
                  boundary={1: "reflect", 2: "periodic"}, **kw)


def _reader(src, tmp_path, **kw):
    plans = native.plan_windows(src)
    path = (plans[0] if len(plans) == 1 else PlanSet.joined(plans)).write(str(tmp_path))
    return _kernels.PlanReader(path, plans[0].dtype, outputs=len(plans), **kw), len(plans), plans[0].num_items


def _sources(kind, tmp_path):
    """``(source, want(output, sample_id) -> window)`` of one format, STEPS samples of (3, 21, 17)."""
    rng = np.random.default_rng(SEED)
    arr = random_array(rng, (STEPS, 3, 21, 17), np.float32)
    layout = _layout()
    if kind in ("npy_c", "npy_f"):
        files = []
        for t in range(STEPS):
            files.append(str(tmp_path / f"s{t}.npy"))
            np.save(files[-1], np.asfortranarray(arr[t]) if kind == "npy_f" else arr[t])
        src = NumpySource(files, layout, batch_size=2, shuffle=False)
        return src, lambda k, i: take_window(arr[i], src.region)
    if kind == "hdf5_gzip":
        p = str(tmp_path / "x.h5")
        with h5py.File(p, "w") as f:
            f.create_dataset("x", data=arr, chunks=(1, 3, 8, 8), compression="gzip", shuffle=True)
        src = HDF5Source([p], "x", layout, batch_size=2, shuffle=False)
        return src, lambda k, i: take_window(h5py.File(p, "r")["x"][src.step_of(i)], src.region)
    if kind == "zarr_blosc_parts":  # whole-field chunks of many Blosc blocks: read in parts
        p = str(tmp_path / "b.zarr")
        z = zarr.create_array(p, shape=arr.shape, chunks=(1, 3, 21, 17), dtype="f4", zarr_format=2,
                              compressors=[numcodecs.Blosc("lz4", 5, numcodecs.Blosc.SHUFFLE, blocksize=256)])
        z[:] = arr
        full = zarr.open_array(p, mode="r")[:]
        src = ZarrSource([p], None, layout, batch_size=2, shuffle=False)
        return src, lambda k, i: take_window(full[src.step_of(i)], src.region)
    if kind == "zarr_sharded":
        p = str(tmp_path / "s.zarr")
        z = zarr.create_array(p, shape=arr.shape, chunks=(1, 3, 7, 17), shards=(2, 3, 21, 17), dtype="f4",
                              compressors=[zarr.codecs.ZstdCodec(level=3)])
        z[:] = arr
        full = zarr.open_array(p, mode="r")[:]
        src = ZarrSource([p], None, layout, batch_size=2, shuffle=False)
        return src, lambda k, i: take_window(full[src.step_of(i)], src.region)
    if kind == "forecast":  # two outputs sharing time chunks
        p = str(tmp_path / "f.zarr")
        z = zarr.create_array(p, shape=arr.shape, chunks=(2, 3, 21, 17), dtype="f4", zarr_format=2,
                              compressors=[numcodecs.Blosc("zstd", 3, numcodecs.Blosc.SHUFFLE)])
        z[:] = arr
        full = zarr.open_array(p, mode="r")[:]
        src = ZarrSource([p], None, layout, batch_size=2, shuffle=False, forecast=ForecastSpec(history=1, lead=2))

        def want(k, i):  # input: steps t-1, t; target: t+1, t+2
            t = src.step_of(i)
            return np.stack([take_window(full[t + d], src.region) for d in ((-1, 0), (1, 2))[k]])
        return src, want
    raise AssertionError(kind)


KINDS = ["npy_c", "npy_f", "hdf5_gzip", "zarr_blosc_parts", "zarr_sharded", "forecast"]


def _check(reader, outputs, want, ids, threads=2):
    got = reader.read(ids, threads=threads)
    for k in range(outputs):
        for i, w in zip(ids, got[k]):
            np.testing.assert_array_equal(w, want(k, i), err_msg=f"output {k}, id {i}")


@pytest.mark.parametrize("kind", KINDS)
def test_a_batch_read_ahead_is_the_batch_read(kind, tmp_path):
    """The ordered cases, each with its counts: the hinted batch read next (used), a hint never read
    (dropped when a third comes, or when a later hinted batch is read), a hint repeated (one batch read
    ahead), ids out of range or off (not started)."""
    src, want = _sources(kind, tmp_path)
    reader, outputs, n = _reader(src, tmp_path, read_ahead=2)
    with reader:
        assert reader.read_ahead([1, 0]) and reader.read_ahead([1, 0])  # the same batch: once
        _check(reader, outputs, want, [1, 0])
        assert reader.ahead_counts() == (1, 0, 0)
        _check(reader, outputs, want, [1, 0])  # read again: nothing read ahead for it any more
        assert reader.ahead_counts() == (1, 0, 0)
        # three hints: the first is dropped; reading the third drops the second
        for batch in ([0], [2, 2], [n - 1, 1]):
            assert reader.read_ahead(batch, threads=2)
        assert reader.ahead_counts() == (1, 1, 0)
        _check(reader, outputs, want, [n - 1, 1])
        assert reader.ahead_counts() == (2, 2, 0)
        # a hint then another batch read: the hint stays for when its batch comes
        assert reader.read_ahead([2, n - 1])
        _check(reader, outputs, want, [0])
        _check(reader, outputs, want, [2, n - 1])
        assert reader.ahead_counts() == (3, 2, 0)
        # ids out of range are not read ahead (that batch's read refuses them)
        assert not reader.read_ahead([0, n]) and not reader.read_ahead([-1])
        with pytest.raises(_kernels.KernelsError, match="out of range"):
            reader.read([0, n])
    for mode in (0, 1):  # never; only for object stores (these are local files)
        reader, outputs, _ = _reader(src, tmp_path, read_ahead=mode)
        with reader:
            assert not reader.read_ahead([0])
            _check(reader, outputs, want, [0])
            assert reader.ahead_counts() == (0, 0, 0)


@pytest.mark.parametrize("kind", KINDS)
def test_random_orders_of_hints_and_reads_agree_with_the_oracle(kind, tmp_path):
    """A differential fuzz: 40 random steps of hints (batches of 1 to 3 ids, repeats, out of range) and
    reads (the last hint's batch, an earlier hint's, or another), every read against the oracle and
    against the count of batches that could have been served."""
    src, want = _sources(kind, tmp_path)
    rng = np.random.default_rng(SEED + KINDS.index(kind))
    reader, outputs, n = _reader(src, tmp_path, read_ahead=2)
    hints, reads_hinted = [], 0
    with reader:
        for _ in range(40):
            batch = [int(i) for i in rng.integers(0, n, rng.integers(1, 4))]
            r = rng.random()
            if r < 0.45:
                if rng.random() < 0.1:
                    batch[0] = n + int(rng.integers(0, 3))  # out of range: not started
                    assert not reader.read_ahead(batch)
                else:
                    assert reader.read_ahead(batch, threads=int(rng.integers(1, 4)))
                    hints.append(batch)
            else:
                if hints and r < 0.85:
                    batch = hints[-1] if rng.random() < 0.7 else hints[int(rng.integers(0, len(hints)))]
                reads_hinted += batch in hints[-2:]
                _check(reader, outputs, want, batch, threads=int(rng.integers(1, 4)))
        used, dropped, failed = reader.ahead_counts()
        assert failed == 0
        assert 0 < used <= reads_hinted and used + dropped <= len(hints)


def test_an_error_of_a_batch_read_ahead_comes_at_its_read(tmp_path):
    """A file replaced after the plan: the batch read ahead that reads it fails when that batch is read,
    with the message a read of it without reading ahead gives (said to be met ahead where it was); the batch read before it is not
    affected, nor one read ahead before the file changed (read and checked then)."""
    src, want = _sources("npy_c", tmp_path)
    path = native.plan_windows(src)[0].write(str(tmp_path))
    with _kernels.PlanReader(path, "f4", read_ahead=2) as ahead, _kernels.PlanReader(path, "f4", read_ahead=0) as plain:
        assert ahead.read_ahead([0, 1])
        _check(ahead, 1, want, [0, 1])
        assert ahead.read_ahead([4, 5])
        ahead.read([2])  # the batch of [4, 5] was read ahead meanwhile (waited for below)
        np.save(str(tmp_path / "s3.npy"), np.zeros((3, 21, 18), np.float32))  # another shape: another size
        _check(ahead, 1, want, [4, 5])  # read ahead before the change
        assert ahead.read_ahead([2, 3])
        _check(ahead, 1, want, [0, 5])  # not the batch read ahead: fine
        with pytest.raises(_kernels.KernelsError) as got:
            ahead.read([2, 3])
        with pytest.raises(_kernels.KernelsError) as direct:
            plain.read([2, 3])
        assert "s3.npy" in str(direct.value)
        # the job ahead ended before the read wanted it (read again: the same message) or, on a busy
        # machine, while the read waited for it (its own error, saying so); the message is the same
        said = str(got.value)
        assert said == str(direct.value) or (
            said.startswith(str(direct.value) + " (met while this batch was read ahead, ")
            and said.endswith(" s after it was wanted; the batch was not read a second time)")
        ), said
        assert ahead.ahead_counts() == (2, 0, 1)  # [2, 3] failed ahead, counted once either way
        _check(ahead, 1, want, [0, 1, 2])  # the reader goes on
