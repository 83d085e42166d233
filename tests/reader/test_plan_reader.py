"""The reader core (csrc/reader/) driven without DALI: a plan file made by the Python planners
(:func:`dali_mesh.pipeline.native.plan_windows`), its windows read for a list of sample ids through
the kernels library (:class:`dali_mesh._kernels.PlanReader`: the batch reader that
``fn.dali_mesh.read_windows`` runs on DALI's threads, here on threads of the library's own), held to
numpy, zarr-python and h5py (``take_window`` of the array they read): ``.npy`` files (C and Fortran
order, byte-swapped), HDF5 (contiguous, raw chunks, gzip + shuffle chunks), Zarr (v2 Blosc, v3 zstd,
v3 sharded), forecasts (two outputs sharing chunks), with halos of every boundary rule. DALI is never
imported: ``test_the_reader_runs_without_dali`` runs a read of each format in a fresh interpreter
that checks it."""
from __future__ import annotations

import sys

import numpy as np
import pytest

from dali_mesh import Layout
from dali_mesh.partition import take_window
from dali_mesh.source import ForecastSpec, HDF5Source, NumpySource, ZarrSource
from tests.helpers import SEED, mesh_of, random_array, run_python

zarr = pytest.importorskip("zarr")
numcodecs = pytest.importorskip("numcodecs")
h5py = pytest.importorskip("h5py")

from dali_mesh import _kernels  # noqa: E402
from dali_mesh.plan import PlanSet  # noqa: E402
from dali_mesh.pipeline import native  # noqa: E402


def _need(name: str) -> None:
    from dali_mesh.plan import CODEC_LIBRARIES, CODECS

    if not _kernels.codec_available(CODECS[name]):
        pytest.skip(f"this build of the reader has no {CODEC_LIBRARIES[name]}")


def _layout(boundary=("edge", "periodic"), coord=(0, 1, 1), **kw):
    """Axes 1 and 2 of a 3-axis sample split over a 2 x 2 mesh, halos of 2 and 3 cells."""
    return Layout(mesh_of((1, 2, 2), coord), shard={"m0": 1, "m1": 2}, halo={1: 2, 2: 3},
                  boundary={1: boundary[0], 2: boundary[1]}, **kw)


def _read(src, tmp_path, ids=None, *, threads=2, task_bytes=4 << 20, **kw):
    """The windows of ``ids`` (default: every sample id) as the reader core reads them:
    ``[output][i]``."""
    plans = native.plan_windows(src)
    path = (plans[0] if len(plans) == 1 else PlanSet.joined(plans)).write(str(tmp_path))
    with _kernels.PlanReader(path, plans[0].dtype, outputs=len(plans), task_bytes=task_bytes, **kw) as reader:
        ids = list(range(plans[0].num_items)) if ids is None else ids
        return ids, reader.read(ids, threads=threads)


def _check_series(src, full, tmp_path, channels=None, **kw):
    """Every sample id's window equals take_window of the oracle's step."""
    for threads in (1, 3):
        ids, (wins,) = _read(src, tmp_path, threads=threads, **kw)
        assert wins
        for i, w in zip(ids, wins):
            sample = full[src.step_of(i)]
            if channels is not None:
                sample = sample[channels]
            np.testing.assert_array_equal(w, take_window(sample, src.region), err_msg=f"id {i}, {threads} threads")


# ---- .npy ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("dtype", ["<f4", ">i2", "<f8"])
@pytest.mark.parametrize("boundary", [("reflect", "periodic"), ("constant", "symmetric")])
def test_npy_windows(tmp_path, order, dtype, boundary):
    rng = np.random.default_rng(SEED)
    data = [random_array(rng, (2, 9, 11), np.dtype(dtype).newbyteorder("=")) for _ in range(3)]
    files = []
    for k, d in enumerate(data):
        files.append(str(tmp_path / f"s{k}.npy"))
        stored = d.astype(dtype)  # the file's byte order: the reader swaps it as it lands
        np.save(files[-1], np.asfortranarray(stored) if order == "F" else stored)
    src = NumpySource(files, _layout(boundary, fill_value=-4), batch_size=1, shuffle=False)
    # a small task size: the window's groups are split over tasks (several threads per window)
    for task_bytes in (4096, 4 << 20):
        ids, (wins,) = _read(src, tmp_path, [2, 0, 2], threads=3, task_bytes=task_bytes)
        for i, w in zip(ids, wins):
            np.testing.assert_array_equal(w, take_window(data[i], src.region))


# ---- HDF5 -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("storage", [{}, {"chunks": (2, 2, 4, 3)},
                                     {"chunks": (2, 2, 4, 3), "compression": "gzip", "shuffle": True}],
                         ids=["contiguous", "raw_chunks", "gzip_chunks"])
def test_hdf5_windows(tmp_path, storage):
    if storage.get("compression"):
        _need("zlib")
    rng = np.random.default_rng(SEED)
    arr = random_array(rng, (5, 3, 9, 11), ">f4")
    p = str(tmp_path / "x.h5")
    with h5py.File(p, "w") as f:
        f.create_dataset("fields", data=arr, **storage)
    with h5py.File(p, "r") as f:
        full = f["fields"][:]
    src = HDF5Source([p], "fields", _layout(("symmetric", "edge")), batch_size=2, shuffle=False, channels=[2, 0])
    _check_series(src, full, tmp_path, channels=[2, 0])


# ---- Zarr -------------------------------------------------------------------------------------------
def _zarr(path, arr, chunks, **kw):
    z = zarr.create_array(str(path), shape=arr.shape, chunks=chunks, dtype=arr.dtype, **kw)
    z[:] = arr
    return str(path), zarr.open_array(str(path), mode="r")[:]


@pytest.mark.parametrize("shuffle", [numcodecs.Blosc.SHUFFLE, numcodecs.Blosc.BITSHUFFLE])
def test_zarr_v2_blosc_windows(tmp_path, shuffle):
    _need("blosc")
    rng = np.random.default_rng(SEED)
    arr = random_array(rng, (5, 3, 11, 13), "f4")
    store, full = _zarr(tmp_path / "b.zarr", arr, (2, 2, 4, 5), zarr_format=2,
                        compressors=numcodecs.Blosc("lz4", 5, shuffle))
    src = ZarrSource([store], None, _layout(), batch_size=2, shuffle=False, channels=[2, 0])
    _check_series(src, full, tmp_path, channels=[2, 0])


@pytest.mark.parametrize("endian", ["little", "big"])
def test_zarr_v3_zstd_windows(tmp_path, endian):
    _need("zstd")
    rng = np.random.default_rng(SEED)
    arr = random_array(rng, (4, 2, 10, 9), "i4")
    store, full = _zarr(tmp_path / "z.zarr", arr, (2, 2, 3, 4), zarr_format=3,
                        compressors=zarr.codecs.ZstdCodec(level=2, checksum=True),
                        serializer=zarr.codecs.BytesCodec(endian=endian))
    src = ZarrSource([store], None, _layout(("constant", "periodic"), fill_value=7), batch_size=2, shuffle=False)
    _check_series(src, full, tmp_path)


@pytest.mark.parametrize("index_location", ["end", "start"])
def test_zarr_v3_sharded_windows(tmp_path, index_location):
    _need("zstd")
    _need("crc32c")
    rng = np.random.default_rng(SEED)
    arr = random_array(rng, (5, 2, 13, 11), "f4")  # partial shards and inner chunks at the edges
    sharding = zarr.codecs.ShardingCodec(
        chunk_shape=(1, 1, 4, 3), codecs=[zarr.codecs.BytesCodec(), zarr.codecs.ZstdCodec(level=3)],
        index_codecs=[zarr.codecs.BytesCodec(), zarr.codecs.Crc32cCodec()], index_location=index_location)
    p = str(tmp_path / "s.zarr")
    z = zarr.create_array(p, shape=arr.shape, chunks=(2, 2, 8, 6), dtype="f4", zarr_format=3, serializer=sharding,
                          compressors=None, fill_value=-3)
    z[:] = arr
    z[4] = -3  # the last step's inner chunks are never written: the fill value
    full = zarr.open_array(p, mode="r")[:]
    src = ZarrSource([p], None, _layout(("reflect", "edge")), batch_size=2, shuffle=False, channels=[1, 0])
    _check_series(src, full, tmp_path, channels=[1, 0])


def test_forecast_outputs_share_chunks(tmp_path):
    """A forecast's input and target: two outputs of one reader, chunks they share read once."""
    _need("blosc")
    rng = np.random.default_rng(SEED)
    arr = random_array(rng, (6, 2, 9, 8), "f4")
    store, full = _zarr(tmp_path / "f.zarr", arr, (3, 2, 5, 4), zarr_format=2, compressors=numcodecs.Blosc("zstd", 1))
    src = ZarrSource([store], None, _layout(), batch_size=2, shuffle=False, forecast=ForecastSpec(history=1, lead=2))
    ids, (inputs, targets) = _read(src, tmp_path, threads=2)
    assert len(ids) == len(inputs) == len(targets) > 1
    for i, inp, tgt in zip(ids, inputs, targets):
        t = src.step_of(i)
        np.testing.assert_array_equal(inp, np.stack([take_window(full[t + k], src.region) for k in (-1, 0)]))
        np.testing.assert_array_equal(tgt, np.stack([take_window(full[t + k], src.region) for k in (1, 2)]))


# ---- normalisation and errors -------------------------------------------------------------------------
def test_normalised_windows(tmp_path):
    rng = np.random.default_rng(SEED)
    data = [random_array(rng, (2, 9, 11), "f4") for _ in range(2)]
    files = [str(tmp_path / f"n{k}.npy") for k in range(2)]
    for f, d in zip(files, data):
        np.save(f, d)
    src = NumpySource(files, _layout(("constant", "reflect"), fill_value=1.5), batch_size=1, shuffle=False)
    mean, std = [0.5, -2.0], [2.0, 0.25]
    ids, (wins,) = _read(src, tmp_path, [1, 0], normalize=(0, mean, std))
    for i, w in zip(ids, wins):
        want = take_window(data[i], src.region)
        want = (want - np.float32(mean).reshape(2, 1, 1)) / np.float32(std).reshape(2, 1, 1)
        np.testing.assert_array_equal(w, want.astype(np.float32))
    with pytest.raises(_kernels.KernelsError, match="the windows have 2 channels on axis 0, mean and stddev 3"):
        _read(src, tmp_path, [0], normalize=(0, [0, 0, 0], [1, 1, 1]))


def test_errors_are_the_readers(tmp_path):
    rng = np.random.default_rng(SEED)
    files = [str(tmp_path / f"e{k}.npy") for k in range(2)]
    for f in files:
        np.save(f, random_array(rng, (2, 9, 11), "f4"))
    src = NumpySource(files, _layout(), batch_size=1, shuffle=False)
    path = native.plan_windows(src)[0].write(str(tmp_path))
    with _kernels.PlanReader(path, "f4") as reader:
        with pytest.raises(_kernels.KernelsError, match="sample id 2 is out of range for the 2 samples of"):
            reader.read([0, 2])
        with open(files[1], "r+b") as f:  # truncated since the plan was made
            f.truncate(100)
        reader.read([0])
        with pytest.raises(_kernels.KernelsError, match="e1.npy: the file is truncated"):
            reader.read([1])
    with pytest.raises(_kernels.KernelsError, match="plan 0 has items of 4 bytes but dtype int16 has 2"):
        _kernels.PlanReader(path, "i2")
    with pytest.raises(_kernels.KernelsError, match="2 items are not 3 outputs' items per sample id"):
        _kernels.PlanReader(path, "f4", outputs=3)


# ---- without DALI -----------------------------------------------------------------------------------
def test_the_reader_runs_without_dali(tmp_path):
    """A read of each format through the reader core, in a fresh interpreter: DALI is never imported."""
    proc = run_python(f"""
        import sys
        import numpy as np
        from dali_mesh.partition import take_window
        from tests.reader import test_plan_reader as t
        import pathlib

        tmp = pathlib.Path({str(tmp_path)!r})
        rng = np.random.default_rng(1)
        arr = rng.standard_normal((3, 2, 9, 11)).astype("f4")
        np.save(tmp / "a.npy", arr[0])
        import h5py, zarr, numcodecs
        with h5py.File(tmp / "a.h5", "w") as f:
            f.create_dataset("x", data=arr, chunks=(1, 2, 4, 3), compression="gzip")
        z = zarr.create_array(str(tmp / "a.zarr"), shape=arr.shape, chunks=(1, 2, 4, 3), dtype="f4", zarr_format=2,
                              compressors=numcodecs.Blosc("lz4"))
        z[:] = arr
        from dali_mesh.source import HDF5Source, NumpySource, ZarrSource
        lay = t._layout()
        for src, want in ((NumpySource([str(tmp / "a.npy")], lay, batch_size=1, shuffle=False), arr[:1]),
                          (HDF5Source([str(tmp / "a.h5")], "x", lay, batch_size=1, shuffle=False), arr),
                          (ZarrSource([str(tmp / "a.zarr")], None, lay, batch_size=1, shuffle=False), arr)):
            ids, (wins,) = t._read(src, tmp)
            for i, w in zip(ids, wins):
                step = src.step_of(i) if hasattr(src, "step_of") else i
                np.testing.assert_array_equal(w, take_window(want[step], src.region))
        assert "nvidia.dali" not in sys.modules, sorted(m for m in sys.modules if m.startswith("nvidia"))
        print("read without DALI")
        """, check=True)
    assert "read without DALI" in proc.stdout
