"""A bounded differential fuzz of the native reader against zarr-python (issue 29, "trust first"):
random Zarr stores (v2; v3; v3 sharded, with small inner chunks), random codecs (Blosc with every
compressor, shuffle, block size and header type size; Zstd; raw), dtypes of either byte order,
chunks that follow no shard, and random layouts (2-4 ranks on one or two axes, halos wider than a
rank's rows, every boundary rule, crops, every split rule). Every window of every rank must equal
``take_window`` of what zarr-python reads, or the reader must refuse with an error: never a third
outcome. The fixed seed makes a failure reproducible; each case prints its configuration."""
from __future__ import annotations

import itertools
import os
import struct

import numpy as np
import pytest

from dali_mesh import Layout, MeshInfo
from dali_mesh.partition import take_window
from dali_mesh.source import ZarrSource

pytest.importorskip("nvidia.dali")
zarr = pytest.importorskip("zarr")
numcodecs = pytest.importorskip("numcodecs")

from tests.helpers import native_pipeline  # noqa: E402

SEED = 29_2026_12_03
CASES = 36

pytestmark = pytest.mark.usefixtures("_plugin")


@pytest.fixture
def _plugin():
    from dali_mesh import _kernels
    from dali_mesh.pipeline.plugin import load_plugin

    load_plugin()
    if not _kernels.codec_available(1):
        pytest.skip("this build has no c-blosc2")


def _codec(rng, fmt, itemsize):
    """``(v2 compressor or v3 bytes-to-bytes codec or None, description)``."""
    kind = rng.choice(["blosc", "blosc", "blosc", "zstd", "raw"])
    if kind == "raw":
        return None, "raw"
    if kind == "zstd":
        return (numcodecs.Zstd(level=3) if fmt == 2 else zarr.codecs.ZstdCodec(level=3)), "zstd"
    cname = str(rng.choice(["lz4", "lz4hc", "blosclz", "zstd", "zlib"]))
    shuffle = int(rng.integers(0, 3))
    blocksize = int(rng.choice([0, 0, 0, 256, 1024, 4096]))
    if fmt == 2:
        return numcodecs.Blosc(cname, 5, shuffle, blocksize=blocksize), f"blosc {cname} shuffle {shuffle} bs {blocksize}"
    typesize = int(rng.choice([itemsize, 1]))  # zarr-python may write type size 1 for any dtype
    shuf = ["noshuffle", "shuffle", "bitshuffle"][shuffle]
    return (zarr.codecs.BloscCodec(cname=cname, clevel=5, shuffle=shuf, blocksize=blocksize, typesize=typesize),
            f"blosc {cname} {shuf} bs {blocksize} typesize {typesize}")


def _store(tmp_path, rng, k):
    """A random store: ``(path, zarr-python's array, description)``."""
    ndim = int(rng.integers(2, 4))  # sample axes
    steps = int(rng.integers(2, 4))
    sample = [int(rng.choice([1, 2, 3, 7, 10, 33, 64, 129])) if a < ndim - 2 else int(rng.integers(5, 120))
              for a in range(ndim)]
    big = rng.integers(0, 3) == 0
    if big:  # a whole field of a size Blosc cuts into several blocks (bands of a block's length)
        ndim, steps = 2, 2
        sample = [int(rng.choice([257, 513, 721, 1025])), int(rng.choice([128, 256, 360]))]
    dtype = np.dtype(str(rng.choice(["<f4", ">f4", "<f8", ">f8", "<i2", "|u1", "<i8"] if not big else ["<f4", "<f8"])))
    arr = rng.normal(0, 100, (steps, *sample))
    arr = arr.astype(dtype) if dtype.kind == "f" else np.clip(arr, -100, 100).astype(dtype)
    fmt = int(rng.choice([2, 3, 3]))
    sharded = fmt == 3 and bool(rng.integers(0, 2))
    codec, what = _codec(rng, fmt, dtype.itemsize)
    # whole-field chunks often (ARCO-ERA5, WeatherBench2), else chunks that follow no shard
    whole = big or bool(rng.integers(0, 2))
    chunks = [int(rng.integers(1, 3))] + [s if whole else int(rng.integers(1, s + 1)) for s in sample]
    p = str(tmp_path / f"s{k}.zarr")
    kw = {}
    if fmt == 2:
        kw["compressors"] = codec
    else:
        kw["compressors"] = codec if codec is not None else None
        kw["serializer"] = zarr.codecs.BytesCodec(endian="big" if dtype.byteorder == ">" else "little")
    if sharded:
        inner = [chunks[0]] + [int(rng.integers(1, c + 1)) for c in chunks[1:]]
        shards = [inner[0]] + [c * int(rng.integers(1, 3)) for c in inner[1:]]
        chunks = inner
        kw["shards"] = shards
        what += f" sharded {shards}"
    z = zarr.create_array(p, shape=arr.shape, chunks=chunks, dtype=dtype, zarr_format=fmt, **kw)
    z[:] = arr
    full = zarr.open_array(p, mode="r")[:]
    return p, full, f"v{fmt} {dtype.str} {arr.shape} chunks {chunks} {what}"


def _layouts(rng, sample_shape):
    """Every rank's layout of one random mesh: ``[Layout, ...]`` and a description."""
    nd = len(sample_shape)
    n_mesh = int(rng.integers(1, 3))
    sizes = [int(rng.choice([2, 3, 4])) for _ in range(n_mesh)]
    axes = [int(rng.integers(0, nd)) for _ in range(n_mesh)]
    names = ("data_parallel",) + tuple(f"m{i}" for i in range(n_mesh))
    halo, boundary, crop = {}, {}, [None] * nd
    for a in range(nd):
        if rng.integers(0, 2):
            h = int(rng.choice([1, 2, 11]))  # 11: wider than a rank's rows on small axes
            halo[a] = h if rng.integers(0, 2) else (h, int(rng.integers(0, 3)))
            boundary[a] = str(rng.choice(["constant", "periodic", "reflect", "symmetric", "edge", "trim"]))
        if rng.integers(0, 3) == 0 and sample_shape[a] > 3:
            lo = int(rng.integers(0, 2))
            crop[a] = (lo, sample_shape[a] - int(rng.integers(0, 2)))
    split = str(rng.choice(["chunk", "physicsnemo", "even"]))
    # periodic / reflect halos need the domain to be at least the halo: narrow the rules where it is not
    for a, b in list(boundary.items()):
        n = sample_shape[a] if crop[a] is None else crop[a][1] - crop[a][0]
        h = halo[a] if isinstance(halo[a], int) else max(halo[a])
        if b in ("periodic", "reflect", "symmetric") and h >= n:
            boundary[a] = "constant"
    layouts = []
    for coord in itertools.product(*[range(s) for s in sizes]):
        mesh = MeshInfo((1, *sizes), names, (0, *coord))
        layouts.append(Layout(mesh, shard={f"m{i}": axes[i] for i in range(n_mesh)}, halo=halo or 0,
                              boundary=boundary or "constant", crop=crop if any(c is not None for c in crop) else None,
                              split=split, fill_value=7))
    return layouts, f"mesh {sizes} on axes {axes} halo {halo} boundary {boundary} crop {crop} split {split}"


def test_every_window_equals_zarr_python(tmp_path):
    rng = np.random.default_rng(SEED)
    windows = 0
    for k in range(CASES):
        p, full, store_what = _store(tmp_path, rng, k)
        layouts, layout_what = _layouts(rng, full.shape[1:])
        for layout in layouts:
            where = f"case {k}: {store_what}; {layout_what}; rank {layout.mesh.coordinate}"
            try:
                src = ZarrSource([p], None, layout, batch_size=1, shuffle=False)
            except ValueError as e:  # a layout the partition refuses (e.g. a halo over an empty axis)
                print(f"{where}: refused at set-up: {e}")
                continue
            pipe = native_pipeline(src, threads=2)
            for _ in range(full.shape[0]):
                w, ids, _ = pipe.run()
                step = src.step_of(int(np.array(ids[0])))
                want = take_window(full[step], src.region)
                np.testing.assert_array_equal(np.array(w[0]), want, err_msg=f"{where}, step {step}")
                windows += 1
            del pipe
    assert windows > 150


@pytest.mark.parametrize("store", ["v2-lz4", "v2-zstd", "v2-blosclz", "v3-blosc", "v3-sharded-blosc"])
def test_whole_field_band_of_one_block_length_equals_zarr_python(tmp_path, store):
    """The stores zarr-python writes with its defaults, one whole-field Blosc chunk per step, split 4
    ways after a one-row crop: each rank's band is exactly Blosc's block length and crosses a block
    boundary (the class c-blosc2's getitem decodes wrongly; issue 29 item 1)."""
    rng = np.random.default_rng(SEED)
    arr = rng.normal(0, 100, (2, 2049, 256)).astype("<f4")
    p = str(tmp_path / "w.zarr")
    fmt, _, kind = store.partition("-")
    if fmt == "v2":
        z = zarr.create_array(p, shape=arr.shape, chunks=(1, 2049, 256), dtype="f4", zarr_format=2,
                              compressors=numcodecs.Blosc(kind, 5, numcodecs.Blosc.SHUFFLE))
    else:
        kw = {"shards": (1, 2049, 256), "chunks": (1, 2049, 256)} if "sharded" in kind else {"chunks": (1, 2049, 256)}
        z = zarr.create_array(p, shape=arr.shape, dtype="f4", zarr_format=3,
                              compressors=zarr.codecs.BloscCodec(cname="lz4", shuffle="shuffle"), **kw)
    z[:] = arr
    full = zarr.open_array(p, mode="r")[:]
    first = os.path.join(p, "0.0.0") if fmt == "v2" else os.path.join(p, "c", "0", "0", "0")
    with open(first, "rb") as f:  # a sharded store's first inner chunk starts the shard
        blocksize = struct.unpack("<I", f.read(16)[8:12])[0]
    rows = blocksize // (256 * 4)  # a band of exactly one block
    assert rows * 256 * 4 == blocksize and 4 * rows < 2049, blocksize
    for coord in range(4):
        layout = Layout(MeshInfo((1, 4), ("data_parallel", "m0"), (0, coord)), shard={"m0": 0},
                        crop=[(1, 1 + 4 * rows), None])
        src = ZarrSource([p], None, layout, batch_size=1, shuffle=False)
        pipe = native_pipeline(src, threads=1)
        for _ in range(2):
            w, ids, _ = pipe.run()
            step = src.step_of(int(np.array(ids[0])))
            np.testing.assert_array_equal(np.array(w[0]), take_window(full[step], src.region),
                                          err_msg=f"rank {coord}, step {step}")


def test_sharded_small_blosc_inner_chunks_with_a_halo_wider_than_the_rows(tmp_path):
    """Issue 29 item 3: a v3 sharded store of small inner chunks (Blosc zstd, block size 256,
    big-endian float64, inner chunks (2, 10, 3) of two steps), a constant halo on axis 0 over 2
    ranks: every cell as zarr-python reads it (the second step of each inner chunk came back wrong:
    a 480-byte chunk is two Blosc blocks, and its second step's bytes crossed their boundary)."""
    rng = np.random.default_rng(SEED + 3)
    arr = rng.normal(0, 100, (4, 24, 19)).astype(">f8")
    p = str(tmp_path / "s.zarr")
    z = zarr.create_array(p, shape=arr.shape, chunks=(2, 10, 3), shards=(2, 20, 3), dtype=">f8", zarr_format=3,
                          serializer=zarr.codecs.BytesCodec(endian="big"),
                          compressors=zarr.codecs.BloscCodec(cname="zstd", shuffle="shuffle", blocksize=256))
    z[:] = arr
    full = zarr.open_array(p, mode="r")[:]
    for coord in range(2):
        layout = Layout(MeshInfo((1, 2), ("data_parallel", "m0"), (0, coord)), shard={"m0": 0}, halo={0: 3},
                        boundary="constant")
        # batches of one step: a batch needs one step's half of each inner chunk (with both steps in
        # a batch the chunk is covered and decoded whole)
        src = ZarrSource([p], None, layout, batch_size=1, shuffle=False)
        pipe = native_pipeline(src, threads=2)
        for _ in range(4):
            w, ids, _ = pipe.run()
            for i in range(len(w)):
                step = src.step_of(int(np.array(ids[i])))
                np.testing.assert_array_equal(np.array(w[i]), take_window(full[step], src.region),
                                              err_msg=f"rank {coord}, step {step}")
