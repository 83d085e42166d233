"""Compressed chunks read natively by ``read_windows`` (issue 15): Zarr v2 compressors, Zarr v3 codecs,
HDF5 / NetCDF4 filter pipelines. Every window equals what zarr-python or h5py return for the same
region (``take_window`` of the array they read), through the CPU operator with 1 and 2 threads; bad
chunks are errors naming the file and reason, at ``pipe.run()``."""
from __future__ import annotations

import logging
import os

import numpy as np
import pytest

from dali_mesh import Layout
from dali_mesh.partition import take_window
from dali_mesh.source import ForecastSpec, HDF5Source, ZarrSource

pytest.importorskip("nvidia.dali")
zarr = pytest.importorskip("zarr")
numcodecs = pytest.importorskip("numcodecs")
h5py = pytest.importorskip("h5py")

from dali_mesh.pipeline import native  # noqa: E402
from tests.helpers import SEED, mesh_of, native_pipeline, random_array  # noqa: E402

pytestmark = pytest.mark.usefixtures("_plugin")


@pytest.fixture
def _plugin():
    from dali_mesh.pipeline.plugin import load_plugin

    load_plugin()


def _need(*names):
    """Skip unless this build decodes every codec named (each library is optional at build time;
    .ci/run installs them all, so CI runs every test here)."""
    from dali_mesh import _kernels
    from dali_mesh.plan import CODEC_LIBRARIES, CODECS

    for n in names:
        n = {"gzip": "zlib"}.get(n, n)
        if n in CODECS and not _kernels.codec_available(CODECS[n]):
            pytest.skip(f"this build of the reader has no {CODEC_LIBRARIES[n]} (not found when it was built)")


def _windows(p, src, n_batches):
    """``(step, window)`` of ``n_batches`` batches."""
    out = []
    for _ in range(n_batches):
        w, ids, _ = p.run()
        out += [(src.step_of(int(np.array(ids[i]))), np.array(w[i])) for i in range(len(w))]
    return out


def _layout(boundary=("edge", "periodic"), coord=(0, 1, 1)):
    return Layout(mesh_of((1, 2, 2), coord), shard={"m0": 1, "m1": 2}, halo={1: 2, 2: 3},
                  boundary={1: boundary[0], 2: boundary[1]})


def _check(src, full, channels=None, threads=(1, 2), batches=None):
    """Every window of the first epoch equals take_window of the oracle's array, for each thread count."""
    n_batches = batches or len(src) // src.batch_size
    for t in threads:
        p = native_pipeline(src, threads=t)
        got = _windows(p, src, n_batches)
        assert got
        for step, w in got:
            sample = full[step] if channels is None else full[step][channels]
            np.testing.assert_array_equal(w, take_window(sample, src.region), err_msg=f"step {step}, {t} threads")


def _zarr_store(path, arr, chunks, *, fmt=2, **kw):
    z = zarr.create_array(str(path), shape=arr.shape, chunks=chunks, dtype=arr.dtype, zarr_format=fmt, **kw)
    z[:] = arr
    return str(path), zarr.open_array(str(path), mode="r")[:]


_BLOSC = [(cname, shuffle) for cname in ("lz4", "lz4hc", "blosclz", "zstd", "zlib")
          for shuffle in (numcodecs.Blosc.NOSHUFFLE, numcodecs.Blosc.SHUFFLE, numcodecs.Blosc.BITSHUFFLE)]


@pytest.mark.parametrize("cname,shuffle", _BLOSC)
def test_zarr_v2_blosc(tmp_path, cname, shuffle):
    _need("blosc")
    rng = np.random.default_rng(SEED)
    dtype = ["f4", "i2", "f8", "u1", "i8"][len(cname) % 5]
    arr = random_array(rng, (5, 3, 11, 13), dtype)
    comp = numcodecs.Blosc(cname=cname, clevel=5, shuffle=shuffle, blocksize=256 if shuffle == 1 else 0)
    store, full = _zarr_store(tmp_path / "b.zarr", arr, (2, 2, 4, 5), compressors=comp)
    src = ZarrSource([store], None, _layout(), batch_size=2, shuffle=False, channels=[2, 0])
    _check(src, full, channels=[2, 0])


@pytest.mark.parametrize("comp", [numcodecs.Zstd(level=3), numcodecs.Zstd(level=-1), numcodecs.LZ4(acceleration=2),
                                  numcodecs.Zlib(level=6), numcodecs.GZip(level=1)], ids=lambda c: c.codec_id)
@pytest.mark.parametrize("separator", [".", "/"])
def test_zarr_v2_compressors_and_separators(tmp_path, comp, separator):
    _need(comp.codec_id)
    rng = np.random.default_rng(SEED)
    arr = random_array(rng, (4, 2, 9, 10), ">f4")  # big-endian chunks: swapped as they are copied out
    store, full = _zarr_store(tmp_path / "c.zarr", arr, (3, 1, 4, 4), compressors=comp,
                              chunk_key_encoding={"name": "v2", "separator": separator})
    if separator == "/":
        assert os.path.isdir(os.path.join(store, "0"))
    src = ZarrSource([store], None, _layout(("reflect", "symmetric")), batch_size=2, shuffle=False)
    _check(src, full)


@pytest.mark.parametrize("fill", [None, -7.5])
def test_zarr_missing_chunks_read_as_the_fill_value(tmp_path, fill):
    _need("zstd")
    arr = np.full((4, 2, 8, 9), -7.5 if fill is not None else 0, np.float32)
    arr[1, :, :4, :3] = np.arange(24, dtype=np.float32).reshape(2, 4, 3)
    arr[3, 1] = 5
    store, full = _zarr_store(tmp_path / "m.zarr", arr, (1, 1, 4, 3), compressors=numcodecs.Zstd(), fill_value=fill)
    written = [n for n in os.listdir(store) if not n.startswith(".")]
    assert 0 < len(written) < 4 * 2 * 2 * 3  # chunks equal to the fill value are not stored
    src = ZarrSource([store], None, _layout(), batch_size=2, shuffle=False)
    _check(src, full)
    np.testing.assert_array_equal(full, arr)


@pytest.mark.parametrize("codec", ["blosc", "zstd", "gzip", "none"])
@pytest.mark.parametrize("endian", ["little", "big"])
def test_zarr_v3_codecs(tmp_path, codec, endian):
    _need(codec)
    rng = np.random.default_rng(SEED)
    arr = random_array(rng, (5, 2, 10, 9), "i4")
    comp = {"blosc": zarr.codecs.BloscCodec(cname="lz4", shuffle="shuffle"), "zstd": zarr.codecs.ZstdCodec(level=2,
            checksum=True), "gzip": zarr.codecs.GzipCodec(level=5), "none": None}[codec]
    store, full = _zarr_store(tmp_path / "v3.zarr", arr, (2, 2, 3, 4), fmt=3, compressors=comp,
                              serializer=zarr.codecs.BytesCodec(endian=endian))
    src = ZarrSource([store], None, _layout(("constant", "periodic")), batch_size=2, shuffle=False, channels=[1])
    _check(src, full, channels=[1])


def test_zarr_v3_v2_chunk_key_encoding(tmp_path):
    _need("zstd")
    rng = np.random.default_rng(SEED)
    arr = random_array(rng, (3, 1, 6, 7), "f4")
    store, full = _zarr_store(tmp_path / "k.zarr", arr, (1, 1, 4, 4), fmt=3, compressors=zarr.codecs.ZstdCodec(),
                              chunk_key_encoding={"name": "v2", "separator": "."})
    assert os.path.exists(os.path.join(store, "0.0.0.0"))
    _check(ZarrSource([store], None, _layout(), batch_size=1, shuffle=False), full, threads=(2,))


def test_zarr_forecast_and_several_stores(tmp_path):
    _need("blosc")
    """History and lead steps that share a chunk (time chunks of 3), two stores."""
    rng = np.random.default_rng(SEED)
    stores, data = [], []
    for i, steps in enumerate((5, 4)):
        arr = random_array(rng, (steps, 2, 9, 8), "f4")
        s, full = _zarr_store(tmp_path / f"f{i}.zarr", arr, (3, 2, 5, 4), compressors=numcodecs.Blosc("zstd", 1))
        stores.append(s)
        data.append(full)
    full = np.concatenate(data)
    src = ZarrSource(stores, None, _layout(), batch_size=2, shuffle=False, forecast=ForecastSpec(history=1, lead=2))
    p = native_pipeline(src)
    n = 0
    for _ in range(2):
        inp, tgt, ids, _ = p.run()
        for i in range(len(inp)):
            t = src.step_of(int(np.array(ids[i])))
            want_in = np.stack([take_window(full[t + k], src.region) for k in (-1, 0)])
            want_tgt = np.stack([take_window(full[t + k], src.region) for k in (1, 2)])
            np.testing.assert_array_equal(np.array(inp[i]), want_in)
            np.testing.assert_array_equal(np.array(tgt[i]), want_tgt)
            n += 1
    assert n == 4


def test_zarr_compressed_equals_partitioned_source_and_resumes(tmp_path, monkeypatch):
    from nvidia.dali import pipeline_def

    from dali_mesh.pipeline.external import partitioned_source
    from tests.helpers import ROOT

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    _need("lz4")
    rng = np.random.default_rng(SEED)
    store, _ = _zarr_store(tmp_path / "s.zarr", random_array(rng, (9, 2, 7, 8), "f4"), (2, 1, 4, 3),
                           compressors=numcodecs.LZ4())
    src = ZarrSource([store], None, _layout(), batch_size=2, seed=3)

    @pipeline_def(batch_size=2, num_threads=1, device_id=None, py_num_workers=1, py_start_method="spawn")
    def ref_pipe():
        return partitioned_source(src)

    ref = ref_pipe()
    ref.build()
    p = native_pipeline(src)
    for _ in range(len(src) // 2):
        (gw, gi, gp), (ww, wi, wp) = p.run(), ref.run()
        for k in range(2):
            assert int(np.array(gi[k])) == int(np.array(wi[k])) and bool(np.array(gp[k])) == bool(np.array(wp[k]))
            np.testing.assert_array_equal(np.array(gw[k]), np.array(ww[k]))
    # a checkpoint mid-epoch resumes the same batches
    p = native_pipeline(src)
    p.run()
    ck = p.checkpoint()
    rest = [[np.array(o[k]) for o in p.run() for k in range(2)] for _ in range(2)]
    q = native_pipeline(src, checkpoint=ck)
    again = [[np.array(o[k]) for o in q.run() for k in range(2)] for _ in range(2)]
    for a, b in zip(rest, again):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


def test_filters_and_unknown_codecs_fall_back_naming_them(tmp_path, caplog, monkeypatch):
    from tests.helpers import ROOT

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    arr = np.arange(2 * 4 * 6, dtype=np.int16).reshape(2, 4, 6)
    store, full = _zarr_store(tmp_path / "d.zarr", arr, (1, 2, 3), compressors=numcodecs.Zstd(),
                              filters=[numcodecs.Delta(dtype="i2")])
    layout = Layout(mesh_of((1, 2), (0, 1)), shard={"m0": 1})
    src = ZarrSource([store], None, layout, batch_size=1, shuffle=False)
    with pytest.raises(native.NotNativeError, match="filters \\['delta'\\]"):
        native.plan_source(src)
    store2, _ = _zarr_store(tmp_path / "b.zarr", arr, (1, 2, 3), compressors=numcodecs.BZ2())
    with pytest.raises(native.NotNativeError, match="compressor 'bz2'"):
        native.plan_source(ZarrSource([store2], None, layout, batch_size=1))
    store3, _ = _zarr_store(tmp_path / "s.zarr", arr, (1, 2, 3), fmt=3, filters=[zarr.codecs.TransposeCodec(
        order=(0, 2, 1))])  # (2, 1, 0), Fortran order, is read natively
    with pytest.raises(native.NotNativeError, match="TransposeCodec"):
        native.plan_source(ZarrSource([store3], None, layout, batch_size=1))
    # read_windows falls back with one line that names the filter, and reads the same windows
    from nvidia.dali import pipeline_def

    # spawned workers: forking a process that runs other pipelines' threads can deadlock
    @pipeline_def(batch_size=1, num_threads=1, device_id=None, py_num_workers=1, py_start_method="spawn")
    def pipe():
        return native.read_windows(src)

    with caplog.at_level(logging.INFO, logger="dali_mesh.pipeline.native"):
        p = pipe()
        p.build()
    assert any("delta" in r.getMessage() and "partitioned_source" in r.getMessage() for r in caplog.records)
    w, ids, _ = p.run()
    np.testing.assert_array_equal(np.array(w[0]), take_window(full[src.step_of(int(np.array(ids[0])))], src.region))


# ---- HDF5 and NetCDF4 ---------------------------------------------------------------------------------
_H5_FILTERS = [dict(compression="gzip", shuffle=True), dict(compression="gzip", shuffle=True, fletcher32=True),
               dict(compression="gzip", compression_opts=9), dict(shuffle=True), dict(fletcher32=True),
               dict(compression="gzip", fletcher32=True), dict(compression="lzf"),
               dict(compression="lzf", shuffle=True, fletcher32=True), dict(compression="szip"),
               dict(compression="szip", compression_opts=("nn", 16))]


@pytest.mark.parametrize("filters", _H5_FILTERS, ids=lambda f: "+".join(f"{k}" for k in f))
@pytest.mark.parametrize("dtype", ["<f4", ">f8", "<i2", "u1"])
def test_hdf5_filters(tmp_path, filters, dtype):
    _need({"gzip": "zlib"}.get(filters.get("compression"), filters.get("compression")) or "zlib")
    if filters.get("compression") == "szip" and dtype == ">f8":
        pytest.skip("HDF5's szip encoder takes 8-byte items only with 64 bits per pixel, which h5py does not set")
    rng = np.random.default_rng(SEED)
    arr = random_array(rng, (5, 3, 9, 11), dtype)
    p = str(tmp_path / "x.h5")
    with h5py.File(p, "w") as f:
        f.create_dataset("fields", data=arr, chunks=(2, 2, 4, 3), **filters)
    with h5py.File(p, "r") as f:
        full = f["fields"][:]
    src = HDF5Source([p], "fields", _layout(), batch_size=2, shuffle=False, channels=[2, 0])
    _check(src, full, channels=[2, 0])


def _netcdf4_file(path, rng):
    """A NetCDF4 file as netCDF4-python / xarray write ERA5 (an HDF5 file: variables as datasets with
    dimension scales, deflate + shuffle, chunked by field), written with h5py."""
    t2m = random_array(rng, (4, 9, 12), "f4")
    z = random_array(rng, (4, 3, 9, 12), "f4")
    with h5py.File(path, "w") as f:
        for name, n in (("time", 4), ("level", 3), ("latitude", 9), ("longitude", 12)):
            d = f.create_dataset(name, data=np.arange(n, dtype="f8"))
            d.make_scale(name)
        f.create_dataset("t2m", data=t2m, chunks=(1, 9, 12), compression="gzip", compression_opts=4, shuffle=True)
        f.create_dataset("z", data=z, chunks=(1, 1, 9, 12), compression="gzip", shuffle=True)
        f.attrs["_NCProperties"] = "version=2,netcdf=4.9.2,hdf5=1.14.3"
    return t2m, z


def test_netcdf4_variables_by_name(tmp_path):
    _need("zlib")
    rng = np.random.default_rng(SEED)
    p = str(tmp_path / "era5.nc")
    t2m, z = _netcdf4_file(p, rng)
    layout = Layout(mesh_of((1, 2), (0, 1)), shard={"m0": 0}, halo={0: 1, 1: 2}, boundary={1: "periodic"})
    src = HDF5Source([p], "t2m", layout, batch_size=2, shuffle=False)
    _check(src, t2m)
    layout3 = Layout(mesh_of((1, 2), (0, 1)), shard={"m0": 1}, halo={1: 1})
    src = HDF5Source([p], "z", layout3, batch_size=2, shuffle=False, channels=[2, 0])
    _check(src, z, channels=[2, 0])


@pytest.mark.parametrize("magic,kind", [(b"CDF\x01", "classic"), (b"CDF\x02", "64-bit offset"),
                                        (b"CDF\x05", "CDF-5")])
def test_netcdf3_files_are_refused_naming_the_format(tmp_path, magic, kind):
    from dali_mesh.io import DataFileError

    p = tmp_path / "old.nc"
    p.write_bytes(magic + b"\0" * 60)
    with pytest.raises(DataFileError, match=f"NetCDF3 file .*{kind}.*nccopy"):
        HDF5Source([str(p)], "t2m", Layout(mesh_of((1, 2), (0, 1)), shard={"m0": 0}), batch_size=1)


def test_hdf5_unsupported_filters_fall_back_naming_them(tmp_path):
    p = str(tmp_path / "l.h5")
    with h5py.File(p, "w") as f:
        f.create_dataset("y", data=np.zeros((2, 4, 6), np.float32), chunks=(1, 2, 3), scaleoffset=2)
    layout = Layout(mesh_of((1, 2), (0, 1)), shard={"m0": 1})
    with pytest.raises(native.NotNativeError, match="'scaleoffset'"):
        native.plan_source(HDF5Source([p], "y", layout, batch_size=1))


def test_hdf5_chunks_with_skipped_filters(tmp_path):
    """LZF is an optional filter: a chunk it cannot shrink (random bytes) is stored raw, its filter
    mask saying so, beside compressed chunks of the same dataset (Makani's converter writes LZF).
    Each chunk is decoded by the filters it went through; a chunk written with a mask by hand
    (write_direct_chunk) too."""
    _need("lzf")
    rng = np.random.default_rng(SEED)
    arr = np.zeros((4, 2, 16, 16), np.float32)
    arr[1] = rng.integers(0, 2**32, (2, 16, 16), dtype=np.uint32).view(np.float32)  # incompressible: stored raw
    arr[2] = np.arange(2 * 16 * 16).reshape(2, 16, 16)
    p = str(tmp_path / "m.h5")
    with h5py.File(p, "w") as f:
        ds = f.create_dataset("fields", data=arr, chunks=(1, 2, 16, 16), compression="lzf", fletcher32=True)
        masks = {}
        ds.id.chunk_iter(lambda c: masks.__setitem__(c.chunk_offset[0], c.filter_mask))
        # step 3 by hand: neither compressed nor checksummed (both filters skipped: mask 0b11)
        ds.id.write_direct_chunk((3, 0, 0, 0), (arr[3] + 7).tobytes(), filter_mask=0b11)
    arr[3] += 7
    assert masks[0] == 0 and masks[1] != 0  # both kinds of chunk are in the file
    with h5py.File(p, "r") as f:
        np.testing.assert_array_equal(f["fields"][:], arr)
    src = HDF5Source([p], "fields", _layout(), batch_size=2, shuffle=False)
    _check(src, arr)


# ---- read once per batch -----------------------------------------------------------------------------
def _rchar() -> int:
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("rchar:")).split()[1])


def test_each_chunk_is_read_once_per_batch(tmp_path):
    """A forecast whose history, input and lead steps lie in one chunk, with periodic halos from the
    far side of the same chunks: every chunk a batch needs is read once (bytes read by the process
    = the distinct chunks' stored bytes + the header checks), not once per part nor once per output
    (the input and the target are one operator's)."""
    _need("zlib")
    rng = np.random.default_rng(SEED)
    arr = random_array(rng, (8, 2, 32, 48), "f4")
    p = str(tmp_path / "f.h5")
    with h5py.File(p, "w") as f:
        f.create_dataset("fields", data=arr, chunks=(4, 2, 32, 48), compression="gzip", shuffle=True)
        sizes = {}
        f["fields"].id.chunk_iter(lambda c: sizes.__setitem__(c.chunk_offset, c.size))
    layout = Layout(mesh_of((1, 2), (0, 0)), shard={"m0": 2}, halo={2: 3}, boundary={2: "periodic"})
    src = HDF5Source([p], "fields", layout, batch_size=2, shuffle=False, forecast=ForecastSpec(history=1, lead=1))
    plans = native.plan_windows(src)
    pipe = native_pipeline(src, threads=1, prefetch=False)
    before = _rchar()
    inp, tgt, ids, _ = pipe.run()
    read = _rchar() - before
    steps = sorted({src.step_of(int(np.array(ids[i]))) + k for i in range(2) for k in (-1, 0, 1)})
    chunks = {s // 4 for s in steps}
    stored = sum(sizes[(c * 4, 0, 0, 0)] for c in chunks)
    parts = sum(len(it.parts) for it in plans[0].items[:2] + plans[1].items[:2])
    assert parts > len(chunks)  # several parts (steps, halo boxes, outputs) per chunk
    header = len(plans[0].plans[0].check)
    # each chunk task opens its file and checks the header once (+ the read of /proc/self/io)
    assert stored <= read <= stored + len(chunks) * header + 1024, (read, stored)
    for i in range(2):
        t = src.step_of(int(np.array(ids[i])))
        np.testing.assert_array_equal(np.array(inp[i]), np.stack([take_window(arr[t + k], src.region) for k in (-1, 0)]))
        np.testing.assert_array_equal(np.array(tgt[i]), take_window(arr[t + 1], src.region)[None])
    # the two-output operator checkpointed after the first batch of a shuffled epoch resumes the
    # same input and target batches
    src = HDF5Source([p], "fields", layout, batch_size=2, seed=5, forecast=ForecastSpec(history=1, lead=1))
    pipe = native_pipeline(src, threads=2)
    pipe.run()
    ck = pipe.checkpoint()
    rest = [[np.array(o[k]) for o in pipe.run() for k in range(2)] for _ in range(2)]
    again = native_pipeline(src, threads=2, checkpoint=ck)
    for want in rest:
        got = [np.array(o[k]) for o in again.run() for k in range(2)]
        for x, y in zip(want, got):
            np.testing.assert_array_equal(x, y)


# ---- bad chunks ----------------------------------------------------------------------------------------
def _zarr_bad(tmp_path, comp=None):
    rng = np.random.default_rng(SEED)
    arr = random_array(rng, (4, 1, 8, 8), "f4")
    store, _ = _zarr_store(tmp_path / "bad.zarr", arr, (1, 1, 8, 8), compressors=comp or numcodecs.Zstd())
    src = ZarrSource([store], None, Layout(mesh_of((1, 2), (0, 1)), shard={"m0": 2}), batch_size=2, shuffle=False)
    return store, src


def _run_all(p, n):
    for _ in range(n):
        p.run()


def _write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def _flip(path, at=None):
    data = bytearray(open(path, "rb").read())
    k = len(data) // 2 if at is None else at
    data[k] ^= 0x5A
    open(path, "wb").write(bytes(data))


@pytest.mark.parametrize("comp,change,match", [
    (numcodecs.Zlib(), lambda f: _flip(f, 6), "cannot be decoded: "),
    (numcodecs.LZ4(), lambda f: _flip(f, 0), "LZ4 header declares"),
    (numcodecs.Blosc(), lambda f: _flip(f, 4), "Blosc header declares"),
    (numcodecs.Zstd(), lambda f: _flip(f, 0), "not a zstd stream"),
    # another valid stream of more data, same file name: a decompression bomb for this chunk
    (numcodecs.Zlib(), lambda f: open(f, "wb").write(numcodecs.Zlib().encode(np.zeros(10**6, np.float32))),
     "more than the chunk's 256 bytes"),
    (numcodecs.Zstd(), lambda f: open(f, "wb").write(numcodecs.Zstd().encode(np.zeros(10**6, np.float32))),
     "declares 4000000 decoded bytes"),
    (numcodecs.GZip(), lambda f: _write(f, open(f, "rb").read()[:-9]), "truncated|cannot be decoded"),
])
def test_corrupt_zarr_chunks_are_errors_naming_file_and_reason(tmp_path, comp, change, match):
    _need(comp.codec_id)
    store, src = _zarr_bad(tmp_path, comp)
    p = native_pipeline(src)
    chunk = os.path.join(store, "2.0.0.0")  # step 2: this rank's second batch
    size = os.path.getsize(chunk)
    change(chunk)
    with pytest.raises(Exception):  # noqa: B017 - numcodecs (the oracle) refuses the chunk too
        comp.decode(open(chunk, "rb").read(), out=np.empty(64, np.float32))
    if os.path.getsize(chunk) != size:
        match = "changed since the plan|truncated"  # the file's size is checked first
    with pytest.raises(RuntimeError, match=f"{chunk}.*({match})"):
        _run_all(p, 2)
    # planned after the change: the decode itself refuses it
    if os.path.getsize(chunk) != size:
        with pytest.raises(RuntimeError, match=f"{chunk}: chunk of {os.path.getsize(chunk)} bytes at byte 0 "
                                               "cannot be decoded"):
            _run_all(native_pipeline(src), 2)


#: (codec, its id, the bytes it checks: header fields and checksums, as (start, stop) from the
#: start, negative from the end)
_CHECKED = [
    (numcodecs.Blosc("lz4", 5, 1), "blosc", [(0, 16)]),
    (numcodecs.Blosc("zstd", 5, 2), "blosc", [(0, 16)]),
    (numcodecs.Blosc("blosclz", 5, 0, blocksize=1024), "blosc", [(0, 16)]),
    (numcodecs.LZ4(), "lz4", [(0, 4)]),
    (numcodecs.Zlib(), "zlib", [(0, 2), (-4, None)]),          # header, adler32
    (numcodecs.GZip(), "gzip", [(0, 10), (-8, None)]),         # header, crc32 and size
    (numcodecs.Zstd(3), "zstd", [(0, 6)]),                     # frame header
    (numcodecs.Zstd(3, checksum=True), "zstd", [(0, None)]),   # any byte: the frame's checksum
]


@pytest.mark.parametrize("comp,name,checked", _CHECKED, ids=lambda c: getattr(c, "codec_id", None))
def test_corrupted_chunks_decode_as_numcodecs_or_fail(comp, name, checked):
    """Every bit flip in the bytes a codec checks (header fields: sizes, versions, flags; its
    checksums; of a checksum over the whole stream, its ends and 1,000 sampled bytes): wherever
    numcodecs (the oracle) refuses the chunk, the reader's decoder refuses it, and where both decode
    it they agree. (A flip inside a stream without a checksum may decode to
    other values in any reader, and decoders of other library versions may differ there: use a
    checksum -- zstd's, HDF5 Fletcher-32 -- where that matters.)"""
    _need(name)
    from dali_mesh import _kernels
    from dali_mesh.plan import CODECS

    rng = np.random.default_rng(SEED)
    data = rng.standard_normal(3000).astype(np.float32)
    good = comp.encode(data)
    steps = [(CODECS[name], 4 if name == "blosc" else 0)]
    assert _kernels.decode_chunk(steps, data.nbytes, good) == data.tobytes()
    refused = 0
    positions = sorted({p for a, b in checked for p in range(len(good))[slice(a, b)]})
    if len(positions) > 1024:  # a checksum over the whole stream: its ends and 1,000 bytes between
        ends = positions[:12] + positions[-12:]
        positions = sorted(set(ends) | set(rng.choice(positions, 1000, replace=False).tolist()))
    for at in positions:
        for bit in range(8):
            bad = bytearray(good)
            bad[at] ^= 1 << bit
            try:
                want = bytes(comp.decode(bytes(bad)))
                want = want if len(want) == data.nbytes else None
            except Exception:  # noqa: BLE001 - any refusal of the oracle
                want = None
            try:
                got = _kernels.decode_chunk(steps, data.nbytes, bytes(bad))
            except _kernels.KernelsError:
                refused += 1
                continue
            assert want is not None, f"byte {at} bit {bit}: numcodecs refuses the chunk, the reader decoded it"
            assert got == want, f"byte {at} bit {bit}"
    assert refused


def test_a_missing_chunk_written_after_the_plan_is_refused(tmp_path):
    _need("zstd")
    arr = np.zeros((2, 1, 4, 4), np.float32)
    store, _ = _zarr_store(tmp_path / "m.zarr", arr, (1, 1, 4, 4), compressors=numcodecs.Zstd(), fill_value=0)
    assert not os.path.exists(os.path.join(store, "1.0.0.0"))
    src = ZarrSource([store], None, Layout(mesh_of((1, 2), (0, 1)), shard={"m0": 2}), batch_size=1, shuffle=False)
    p = native_pipeline(src)
    p.run()
    zarr.open_array(store, mode="r+")[1] = 1
    with pytest.raises(RuntimeError, match="1.0.0.0: this chunk was missing when the plan was made"):
        p.run()


def test_hdf5_fletcher32_mismatch_and_corrupt_deflate(tmp_path):
    _need("zlib")
    arr = np.arange(4 * 16 * 16, dtype=np.float32).reshape(4, 16, 16)
    p = str(tmp_path / "c.h5")
    with h5py.File(p, "w") as f:
        f.create_dataset("a", data=arr, chunks=(1, 16, 16), fletcher32=True)
        f.create_dataset("b", data=arr, chunks=(1, 16, 16), compression="gzip")
        offs = {}
        for n in "ab":
            f[n].id.chunk_iter(lambda c, n=n: offs.setdefault(n, []).append((c.chunk_offset, c.byte_offset, c.size)))
    layout = Layout(mesh_of((1, 2), (0, 1)), shard={"m0": 1})
    pipes = {n: native_pipeline(HDF5Source([p], n, layout, batch_size=2, shuffle=False)) for n in "ab"}
    with open(p, "r+b") as f:
        for n in "ab":
            _, off, size = next(c for c in offs[n] if c[0][0] == 3)
            f.seek(off + size // 2)
            b = f.read(1)
            f.seek(off + size // 2)
            f.write(bytes([b[0] ^ 0x11]))
    # h5py itself refuses both chunks (the oracle): the reader must too, naming file and reason
    with h5py.File(p, "r") as f:
        for n in "ab":
            with pytest.raises(OSError):
                f[n][3]
    # the file was modified since the plan: the pipelines refuse every read of it
    for n in "ab":
        with pytest.raises(RuntimeError, match="modified since the plan"):
            _run_all(pipes[n], 2)
    # planned again on the corrupt file: the decode itself fails
    with pytest.raises(RuntimeError, match="Fletcher-32 checksum does not match"):
        _run_all(native_pipeline(HDF5Source([p], "a", layout, batch_size=2, shuffle=False)), 2)
    with pytest.raises(RuntimeError, match="cannot be decoded: (zlib|its zlib|libdeflate)"):
        _run_all(native_pipeline(HDF5Source([p], "b", layout, batch_size=2, shuffle=False)), 2)


# ---- sharded Zarr v3 -------------------------------------------------------------------------------
@pytest.mark.parametrize("inner", ["zstd", "blosc", "none"])
@pytest.mark.parametrize("index_location", ["end", "start"])
@pytest.mark.parametrize("index_crc", [True, False])
def test_zarr_v3_sharded(tmp_path, inner, index_location, index_crc):
    _need(inner)
    rng = np.random.default_rng(SEED)
    arr = random_array(rng, (5, 2, 13, 11), "f4")  # partial shards and partial inner chunks at the edges
    comp = {"zstd": zarr.codecs.ZstdCodec(level=3), "blosc": zarr.codecs.BloscCodec(cname="zstd"), "none": None}[inner]
    index_codecs = [zarr.codecs.BytesCodec()] + ([zarr.codecs.Crc32cCodec()] if index_crc else [])
    sharding = zarr.codecs.ShardingCodec(chunk_shape=(1, 1, 4, 3), codecs=[zarr.codecs.BytesCodec()] + ([comp] if comp else []),
                                         index_codecs=index_codecs, index_location=index_location)
    p = str(tmp_path / "s.zarr")
    z = zarr.create_array(p, shape=arr.shape, chunks=(2, 2, 8, 6), dtype="f4", zarr_format=3, serializer=sharding,
                          compressors=None, fill_value=-3)
    z[:] = arr
    z[4] = -3            # the last step's inner chunks are never written: the fill value
    z[0, :, 8:, 6:] = -3
    full = zarr.open_array(p, mode="r")[:]
    src = ZarrSource([p], None, _layout(), batch_size=2, shuffle=False, channels=[1, 0])
    _check(src, full, channels=[1, 0])


def _zstd_shards(tmp_path, shape, chunks, shards):
    """``s.zarr`` in ``tmp_path``: a random float32 array of ``shape`` in Zstd ``chunks`` within ``shards``.
    Returns (its path, its values)."""
    rng = np.random.default_rng(SEED)
    arr = random_array(rng, shape, "f4")
    p = str(tmp_path / "s.zarr")
    z = zarr.create_array(p, shape=arr.shape, chunks=chunks, shards=shards, dtype="f4",
                          compressors=zarr.codecs.ZstdCodec())
    z[:] = arr
    return p, arr


def test_zarr_v3_shard_reads_only_the_inner_chunks_touched(tmp_path):
    _need("zstd")
    p, arr = _zstd_shards(tmp_path, (2, 1, 64, 64), (1, 1, 8, 64), (1, 1, 64, 64))
    layout = Layout(mesh_of((1, 4), (0, 1)), shard={"m0": 1})  # rows 16..32 of 64: 2 of the 8 inner chunks
    src = ZarrSource([p], None, layout, batch_size=2, shuffle=False)
    plans = native.plan_source(src)
    pipe = native_pipeline(src, threads=1, prefetch=False)
    meta = os.path.getsize(os.path.join(p, "zarr.json"))
    before = _rchar()
    w, ids, _ = pipe.run()
    read = _rchar() - before
    used = {q.file for it in plans.items for q in it.parts if plans.plans[q.plan].coded}
    inner = sum(plans.chunks[c][2] for c in used)
    assert len(used) == 4  # 2 inner chunks x 2 steps
    index = 8 * 16 + 4  # each chunk's read checks its shard's index (8 inner chunks and a crc32c)
    assert inner <= read <= inner + 2 * meta + len(used) * index + 256, (read, inner)  # + the read of /proc/self/io
    shards = sum(os.path.getsize(os.path.join(p, "c", str(t), "0", "0", "0")) for t in range(2))
    assert inner < shards / 3  # 2 of the 8 inner chunks of each shard
    for i in range(2):
        t = src.step_of(int(np.array(ids[i])))
        np.testing.assert_array_equal(np.array(w[i]), take_window(arr[t], src.region))


def _sharded(tmp_path):
    p, _ = _zstd_shards(tmp_path, (2, 1, 16, 8), (1, 1, 4, 8), (1, 1, 16, 8))
    shard = os.path.join(p, "c", "1", "0", "0", "0")
    return p, shard


def _rewrite_index(shard, change):
    import google_crc32c

    data = bytearray(open(shard, "rb").read())
    n = 4
    table = np.frombuffer(bytes(data[-(16 * n + 4):-4]), "<u8").reshape(n, 2).copy()
    change(table)
    raw = table.astype("<u8").tobytes()
    data[-(16 * n + 4):] = raw + google_crc32c.value(raw).to_bytes(4, "little")
    _write(shard, bytes(data))


@pytest.mark.parametrize("change,match", [
    (lambda t: t.__setitem__((1, 0), 10**9), "inner chunk \\(0, 0, 1, 0\\) at bytes 1000000000.*outside"),
    (lambda t: t.__setitem__((2, 0), t[1, 0]), "over the same bytes"),
    (None, "crc32c does not match"),
])
def test_a_corrupt_shard_index_is_refused_naming_shard_and_chunk(tmp_path, change, match):
    from dali_mesh.io import HeaderError

    _need("zstd")
    p, shard = _sharded(tmp_path)
    if change is None:
        _flip(shard, os.path.getsize(shard) - 10)  # inside the index: its crc32c fails
    else:
        _rewrite_index(shard, change)
    layout = Layout(mesh_of((1, 2), (0, 1)), shard={"m0": 1})
    with pytest.raises(HeaderError, match=f"{shard}.*shard 'c/1/0/0/0'.*{match}"):
        native.plan_source(ZarrSource([p], None, layout, batch_size=1, shuffle=False))


def test_a_shard_rewritten_after_the_plan_is_refused(tmp_path):
    _need("zstd")
    p, shard = _sharded(tmp_path)
    src = ZarrSource([p], None, Layout(mesh_of((1, 2), (0, 1)), shard={"m0": 1}), batch_size=1, shuffle=False)
    pipe = native_pipeline(src)
    pipe.run()
    data = open(shard, "rb").read()
    os.utime(shard, ns=(os.stat(shard).st_atime_ns, os.stat(shard).st_mtime_ns + 10**9))  # same bytes, touched
    _write(shard, data)
    with pytest.raises(RuntimeError, match=f"{shard}: the file was modified since the plan was made"):
        pipe.run()


def test_a_huge_declared_chunk_falls_back_before_anything_is_allocated(tmp_path):
    """A metadata file (no chunk written) declaring 64 GB chunks: the native reader does not plan a
    decode of that size (every thread would keep one); the fallback names the limit."""
    import json

    p = tmp_path / "huge.zarr"
    p.mkdir()
    (p / ".zarray").write_text(json.dumps({
        "zarr_format": 2, "shape": [2, 4096, 4096, 1024], "chunks": [1, 4096, 4096, 1024], "dtype": "<f4",
        "compressor": {"id": "zstd", "level": 1}, "fill_value": 0, "order": "C", "filters": None}))
    src = ZarrSource([str(p)], None, Layout(mesh_of((1, 2), (0, 1)), shard={"m0": 1}), batch_size=1)
    with pytest.raises(native.NotNativeError, match="MAX_CODED_CHUNK_BYTES"):
        native.plan_source(src)


def test_the_process_exits_after_a_decode_error(tmp_path):
    """A corrupt chunk raises at pipe.run(); the process then exits by itself, promptly."""
    from tests.helpers import run_python_bounded

    _need("zstd")
    store, _ = _zarr_bad(tmp_path, numcodecs.Zstd())
    _flip(os.path.join(store, "3.0.0.0"), 0)  # a bad frame header: refused by libzstd
    out, err = run_python_bounded(f"""
        import sys
        import numpy as np
        from nvidia.dali import pipeline_def
        from dali_mesh import Layout
        from dali_mesh.pipeline import native
        from dali_mesh.source import ZarrSource
        from tests.helpers import mesh_of

        src = ZarrSource([{store!r}], None, Layout(mesh_of((1, 2), (0, 1)), shard={{"m0": 2}}), batch_size=2,
                         shuffle=False)

        @pipeline_def(batch_size=2, num_threads=2, device_id=None)
        def pipe():
            return native.read_windows(src, fallback=False)

        p = pipe()
        p.build()
        try:
            for _ in range(4):
                p.run()
        except RuntimeError as e:
            print("raised:", " ".join(str(e).split())[:3000])
            sys.exit(3)
    """, timeout=90)
    assert "raised:" in out and "3.0.0.0: chunk of" in out and "cannot be decoded" in out, (out, err[-2000:])


# ---- random configurations against the oracles -----------------------------------------------------
_RANDOM_CODECS = ["v2_blosc", "v2_zstd", "v2_lz4", "v2_zlib", "v2_gzip", "v3_zstd", "v3_blosc_sharded",
                  "v3_raw_sharded", "h5_gzip_shuffle", "h5_lzf", "h5_szip"]


def _random_store(tmp_path, rng, kind, arr, chunks):
    """``arr`` stored as ``kind`` with ``chunks``; returns (the source's file and array name, the
    oracle's copy of the array as zarr-python / h5py read it)."""
    if kind.startswith("h5"):
        p = str(tmp_path / "r.h5")
        kw = {"h5_gzip_shuffle": dict(compression="gzip", shuffle=True), "h5_lzf": dict(compression="lzf"),
              "h5_szip": dict(compression="szip", compression_opts=("nn", 8))}[kind]
        with h5py.File(p, "w") as f:
            f.create_dataset("fields", data=arr, chunks=chunks, **kw)
        with h5py.File(p, "r") as f:
            return (p, "fields"), f["fields"][:]
    p = str(tmp_path / "r.zarr")
    if kind.startswith("v2"):
        comp = {"v2_blosc": numcodecs.Blosc("lz4", 5, int(rng.integers(0, 3))), "v2_zstd": numcodecs.Zstd(1),
                "v2_lz4": numcodecs.LZ4(), "v2_zlib": numcodecs.Zlib(), "v2_gzip": numcodecs.GZip()}[kind]
        z = zarr.create_array(p, shape=arr.shape, chunks=chunks, dtype=arr.dtype, zarr_format=2, compressors=comp,
                              fill_value=0)
    elif kind == "v3_zstd":
        z = zarr.create_array(p, shape=arr.shape, chunks=chunks, dtype=arr.dtype, compressors=zarr.codecs.ZstdCodec(),
                              fill_value=0)
    else:
        shards = tuple(c * int(rng.integers(1, 3)) for c in chunks)
        comp = zarr.codecs.BloscCodec(cname="zstd") if "blosc" in kind else None
        z = zarr.create_array(p, shape=arr.shape, chunks=chunks, shards=shards, dtype=arr.dtype, compressors=comp,
                              fill_value=0)
    z[:] = arr
    return (p, None), zarr.open_array(p, mode="r")[:]


@pytest.mark.parametrize("case", range(88))
def test_random_compressed_configurations_match_the_oracle(tmp_path, case):
    """Random shapes, chunkings that cut and do not cut the shards, partial edge chunks, every
    boundary rule, halos, splits, channel lists, zeros (missing chunks), each codec: every window of
    an epoch equals take_window of what zarr-python or h5py read."""
    from dali_mesh.partition import BOUNDARIES, SPLITS

    rng = np.random.default_rng([SEED, case])
    kind = _RANDOM_CODECS[case % len(_RANDOM_CODECS)]
    _need({"v2_blosc": "blosc", "v2_zstd": "zstd", "v2_lz4": "lz4", "v2_zlib": "zlib", "v2_gzip": "zlib",
           "v3_zstd": "zstd", "v3_blosc_sharded": "blosc", "v3_raw_sharded": "zstd", "h5_gzip_shuffle": "zlib",
           "h5_lzf": "lzf", "h5_szip": "szip"}[kind])
    shape = (int(rng.integers(2, 6)), int(rng.integers(1, 4)), int(rng.integers(4, 26)), int(rng.integers(4, 26)))
    dtype = rng.choice(["f4", "i2", "u1", "f8", "i4"] if not kind == "h5_szip" else ["f4", "i2", "u1", "i4"])
    arr = random_array(rng, shape, dtype)
    arr[int(rng.integers(0, shape[0]))] = 0  # a step of zeros: chunks Zarr does not store
    chunks = tuple(int(rng.integers(1, n + 1)) for n in shape)
    if kind == "h5_szip":  # szip needs at least a block (8 pixels) per chunk
        chunks = chunks[:2] + (max(chunks[2], 2), max(chunks[3], 4))
    (path, name), full = _random_store(tmp_path, rng, kind, arr, chunks)
    k = int(rng.integers(1, 5))
    axis = int(rng.integers(1, 3))
    modes = [m for m in BOUNDARIES if m != "trim"]
    halo = {axis: int(rng.integers(0, 4)), 3 - axis: int(rng.integers(0, 3))}
    boundary = {a: str(rng.choice(modes)) for a in halo}
    split = str(rng.choice(SPLITS))
    layout = Layout(mesh_of((1, k), (0, int(rng.integers(0, k)))), shard={"m0": axis}, halo=halo, boundary=boundary,
                    split=split)
    channels = None
    if shape[1] > 1 and rng.random() < 0.5:
        channels = [int(c) for c in rng.permutation(shape[1])[:int(rng.integers(1, shape[1] + 1))]]
    kw = dict(batch_size=int(rng.integers(1, 3)), shuffle=bool(rng.random() < 0.5), seed=case)
    if channels is not None:
        kw["channels"] = channels
    src = (HDF5Source([path], name, layout, **kw) if kind.startswith("h5") else ZarrSource([path], name, layout, **kw))
    p = native_pipeline(src, threads=int(rng.integers(1, 3)))
    n = 0
    while True:
        try:
            w, ids, pads = p.run()
        except StopIteration:
            break
        for i in range(len(w)):
            t = src.step_of(int(np.array(ids[i])))
            sample = full[t] if channels is None else full[t][channels]
            np.testing.assert_array_equal(np.array(w[i]), take_window(sample, src.region),
                                          err_msg=f"{kind} {shape} {dtype} chunks {chunks} {layout!r} step {t}")
            n += 1
    assert n >= shape[0] - 1, n


# ---- Zarr v3 crc32c (issue 15) ----------------------------------------------------------------------
@pytest.mark.parametrize("codec", ["zstd", "none"])
@pytest.mark.parametrize("sharded", [False, True])
def test_zarr_v3_crc32c_chunks_are_verified_natively(tmp_path, codec, sharded):
    """Chunks stored [bytes, (zstd,) crc32c], as files or as a shard's inner chunks: read natively
    (they fell back before), windows as zarr-python reads them; a chunk with one byte changed is an
    error naming the chunk's file and the checksum, as zarr-python refuses it too."""
    _need("crc32c", codec)
    rng = np.random.default_rng(SEED)
    arr = random_array(rng, (4, 2, 10, 9), "f4")
    inner = [zarr.codecs.BytesCodec()] + ([zarr.codecs.ZstdCodec(level=2)] if codec == "zstd" else []) + \
        [zarr.codecs.Crc32cCodec()]
    p = str(tmp_path / "c.zarr")
    if sharded:
        serializer = zarr.codecs.ShardingCodec(chunk_shape=(1, 1, 5, 3), codecs=inner)
        z = zarr.create_array(p, shape=arr.shape, chunks=(2, 2, 10, 9), dtype="f4", zarr_format=3, serializer=serializer,
                              compressors=None)
    else:
        z = zarr.create_array(p, shape=arr.shape, chunks=(1, 2, 5, 3), dtype="f4", zarr_format=3,
                              serializer=inner[0], compressors=inner[1:])
    z[:] = arr
    full = zarr.open_array(p, mode="r")[:]
    src = ZarrSource([p], None, _layout(), batch_size=2, shuffle=False)
    native.plan_windows(src)  # natively (NotNativeError, "no transposition or checksum yet", before)
    _check(src, full, threads=(2,))
    # one byte of a payload changed, the size kept: zarr-python refuses it; so does the reader
    chunk = sorted(os.path.join(d, f) for d, _, fs in os.walk(os.path.join(p, "c")) for f in fs)[-1]
    data = bytearray(open(chunk, "rb").read())
    data[len(data) // 2] ^= 0x10
    open(chunk, "wb").write(bytes(data))
    with pytest.raises(Exception):  # noqa: B017 - the oracle's own refusal
        zarr.open_array(p, mode="r")[:]
    with pytest.raises(RuntimeError, match=f"{chunk}.*crc32c checksum does not match"):
        _run_all(native_pipeline(src), len(src) // src.batch_size)


# ---- Zarr chunks in Fortran order (issue 15) ----------------------------------------------------------
@pytest.mark.parametrize("kind", ["v2_raw", "v2_zstd", "v3_transpose", "v3_sharded_transpose"])
def test_zarr_chunks_in_fortran_order_are_read_natively(tmp_path, kind):
    """v2 ``order: "F"`` (raw and compressed) and v3 ``transpose`` to the reversed axes (as files and
    in a shard): each chunk's units land in the window's Fortran-order staging, which the finishing
    plan transposes; chunks of two steps (a step's values one item apart), partial edge chunks, halos
    under two rules, a channel list: windows as zarr-python reads them. A forecast of such chunks,
    and any other transposition, fall back naming why."""
    _need("zstd")
    rng = np.random.default_rng(SEED)
    arr = random_array(rng, (5, 3, 11, 10), "<f4")
    p = str(tmp_path / "f.zarr")
    chunks = (2, 2, 4, 3)
    if kind.startswith("v2"):
        z = zarr.create_array(p, shape=arr.shape, chunks=chunks, dtype="f4", zarr_format=2, order="F",
                              compressors=None if kind == "v2_raw" else numcodecs.Zstd(2))
    elif kind == "v3_transpose":
        z = zarr.create_array(p, shape=arr.shape, chunks=chunks, dtype="f4", zarr_format=3,
                              filters=[zarr.codecs.TransposeCodec(order=(3, 2, 1, 0))], compressors=zarr.codecs.ZstdCodec())
    else:
        sharding = zarr.codecs.ShardingCodec(chunk_shape=chunks, codecs=[
            zarr.codecs.TransposeCodec(order=(3, 2, 1, 0)), zarr.codecs.BytesCodec(), zarr.codecs.ZstdCodec()])
        z = zarr.create_array(p, shape=arr.shape, chunks=(4, 2, 8, 6), dtype="f4", zarr_format=3,
                              serializer=sharding, compressors=None)
    z[:] = arr
    full = zarr.open_array(p, mode="r")[:]
    np.testing.assert_array_equal(full, arr)
    src = ZarrSource([p], None, _layout(("reflect", "periodic")), batch_size=1, shuffle=False, channels=[2, 0])
    native.plan_windows(src)  # natively ("order 'F'" / "TransposeCodec" fell back before)
    _check(src, full, channels=[2, 0], threads=(2,))
    fc = ZarrSource([p], None, _layout(), batch_size=1, shuffle=False, forecast=ForecastSpec(history=1, lead=1))
    with pytest.raises(native.NotNativeError, match="forecast of chunks in Fortran order"):
        native.plan_windows(fc)


# ---- a rank's band of a whole-field Blosc chunk: only its blocks decoded (issue 15, 17) -----------------
@pytest.mark.parametrize("shuffle", [numcodecs.Blosc.SHUFFLE, numcodecs.Blosc.BITSHUFFLE])
def test_a_band_of_a_whole_field_blosc_chunk_decodes_only_its_blocks(tmp_path, shuffle):
    """Whole-field Blosc chunks of many blocks, latitude split over 4 ranks: each rank's windows equal
    zarr-python's. The reader reads a chunk's header and block index, then only the blocks its parts
    copy out of (a quarter of the chunk and the blocks the band's edges cut), and asks c-blosc2 for
    those bytes (getitem): rank 0 reads under half the chunks' stored bytes. A block that only
    another rank's band lies in is never decoded: with that block's start offset pointing past the
    chunk (c-blosc2 and numcodecs refuse the whole chunk), rank 0 still reads its band and rank 3,
    whose band the block holds, gets the error naming the chunk."""
    _need("blosc")
    rng = np.random.default_rng(SEED)
    arr = random_array(rng, (2, 3, 240, 256), "f4")
    p = str(tmp_path / "w.zarr")
    z = zarr.create_array(p, shape=arr.shape, chunks=(1, 3, 240, 256), dtype="f4", zarr_format=2,
                          compressors=numcodecs.Blosc("lz4", 5, shuffle, blocksize=16384))  # 12 blocks of 64 KiB
    z[:] = arr
    full = zarr.open_array(p, mode="r")[:]
    lay = lambda r: Layout(mesh_of((1, 4), (0, r)), shard={"m0": 1}, halo={1: 1}, boundary="reflect")  # noqa: E731
    for r in range(4):
        _check(ZarrSource([p], None, lay(r), batch_size=1, shuffle=False), full, threads=(1,))
    stored = sum(os.path.getsize(os.path.join(p, f"{t}.0.0.0")) for t in range(2))
    src0 = ZarrSource([p], None, lay(0), batch_size=1, shuffle=False)
    pipe0 = native_pipeline(src0, threads=1)

    def rchar():
        with open("/proc/self/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("rchar"))

    before = rchar()
    _run_all(pipe0, 2)
    assert rchar() - before < 0.5 * stored, (rchar() - before, stored)  # read in parts
    chunk = os.path.join(p, "1.0.0.0")
    data = bytearray(open(chunk, "rb").read())
    nblocks = -(-int.from_bytes(data[4:8], "little") // int.from_bytes(data[8:12], "little"))
    assert nblocks >= 8, nblocks
    last = 16 + 4 * (nblocks - 1)
    data[last:last + 4] = (len(data) + 100).to_bytes(4, "little")
    open(chunk, "wb").write(bytes(data))
    with pytest.raises(Exception):  # noqa: B017 - the oracle refuses the chunk
        zarr.open_array(p, mode="r")[1]
    got = _windows(native_pipeline(src0, threads=1), src0, 2)
    np.testing.assert_array_equal(dict(got)[1], take_window(full[1], src0.region))
    src3 = ZarrSource([p], None, lay(3), batch_size=1, shuffle=False)
    with pytest.raises(RuntimeError, match=f"{chunk}.*cannot be decoded"):
        _run_all(native_pipeline(src3, threads=1), 2)


def test_a_band_of_a_whole_field_zstd_chunk_is_decoded_from_the_whole_frame(tmp_path):
    """Whole-field Zstd chunks (one frame each, one level), latitude split over 4 ranks: each rank's
    windows equal zarr-python's. A frame is decoded whole even for a band near its start, so that
    its declared size is checked at its end (a zstd block does not state its decoded size: decoded
    only up to the band, a corrupt block could shift the bytes after it unseen): a chunk cut to 60%
    of its stored bytes (zarr-python refuses it) is an error naming the chunk for rank 0, whose band
    and halo lie in the first 30%, as for rank 3."""
    _need("zstd")
    rng = np.random.default_rng(SEED)
    arr = random_array(rng, (2, 1, 240, 256), "f4")
    p = str(tmp_path / "w.zarr")
    z = zarr.create_array(p, shape=arr.shape, chunks=(1, 1, 240, 256), dtype="f4", zarr_format=2,
                          compressors=numcodecs.Zstd(3))
    z[:] = arr
    full = zarr.open_array(p, mode="r")[:]
    lay = lambda r: Layout(mesh_of((1, 4), (0, r)), shard={"m0": 1}, halo={1: 1}, boundary="reflect")  # noqa: E731
    for r in range(4):
        _check(ZarrSource([p], None, lay(r), batch_size=1, shuffle=False), full, threads=(1,))
    chunk = os.path.join(p, "1.0.0.0")
    data = open(chunk, "rb").read()
    open(chunk, "wb").write(data[:len(data) * 6 // 10])
    with pytest.raises(Exception):  # noqa: B017 - the oracle refuses the chunk
        zarr.open_array(p, mode="r")[1]
    for r in (0, 3):
        src = ZarrSource([p], None, lay(r), batch_size=1, shuffle=False)
        with pytest.raises(RuntimeError, match=f"{chunk}.*cannot be decoded"):
            _run_all(native_pipeline(src, threads=1), 2)
