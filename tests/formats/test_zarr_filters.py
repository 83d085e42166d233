"""The native reader on Zarr filters and numcodecs' v3 codecs (formats/zarr/zarr_planner.py ``_chain_steps``):
v2 ``filters: [shuffle(elementsize), zlib(level)]`` with ``compressor: null`` (what Kerchunk writes of HDF5's
shuffle + deflate), shuffles before any compressor of the table, and v3 ``numcodecs.shuffle`` /
``numcodecs.zlib``... (what VirtualiZarr writes), each against zarr-python reading the same array: a
differential fuzz over dtypes of 1, 2, 4 and 8 bytes in both byte orders, element sizes other than the
item size, levels, chunk shapes with edge chunks, v3 shards, and every window of a split with halo.
What the reader does not run (a filter it lacks, a shuffle after the compressor, an element size that
does not divide a chunk) falls back with the reason."""
from __future__ import annotations

import os
import tempfile
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import mesh_of

zarr = pytest.importorskip("zarr")
numcodecs = pytest.importorskip("numcodecs")

#: compressors after the shuffle, by numcodecs id (None: the shuffle alone)
_COMPRESSORS = (None, "zlib", "gzip", "zstd", "lz4")


def _numcodec(name: str, level: int):
    return {"zlib": lambda: numcodecs.Zlib(level), "gzip": lambda: numcodecs.GZip(level),
            "zstd": lambda: numcodecs.Zstd(level), "lz4": lambda: numcodecs.LZ4(level)}[name]()


def _v3_codec(name: str, level: int, elementsize: int | None = None):
    import numcodecs.zarr3 as z3

    with warnings.catch_warnings():  # "not in the Zarr v3 specification": what VirtualiZarr writes anyway
        warnings.simplefilter("ignore")
        if name == "shuffle":
            return z3.Shuffle(elementsize=elementsize)
        if name == "lz4":
            return z3.LZ4(acceleration=level)
        return {"zlib": z3.Zlib, "gzip": z3.GZip, "zstd": z3.Zstd}[name](level=level)


def _write(path, x: np.ndarray, chunks, zarr_format: int, elementsize: int, compressor, level: int, shards=None):
    """``x`` as a Zarr array at ``path``: shuffled by ``elementsize`` then compressed by ``compressor``
    (v2: both filters, no compressor, as Kerchunk writes them; v3: numcodecs' codecs after bytes, in
    shards of ``shards`` or not)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if zarr_format == 2:
            filters = [numcodecs.Shuffle(elementsize)] + ([_numcodec(compressor, level)] if compressor else [])
            arr = zarr.create_array(str(path), shape=x.shape, chunks=chunks, dtype=x.dtype, filters=filters,
                                    compressors=None, zarr_format=2, fill_value=0)
        else:
            codecs = [_v3_codec("shuffle", level, elementsize)] + ([_v3_codec(compressor, level)] if compressor else [])
            arr = zarr.create_array(str(path), shape=x.shape, chunks=chunks, dtype=x.dtype, compressors=codecs,
                                    serializer=zarr.codecs.BytesCodec(endian="big" if x.dtype.byteorder == ">"
                                                                      else "little"),
                                    zarr_format=3, fill_value=0, shards=shards)
        arr[...] = x


def _windows(store: str, name: str, mesh_shape, coordinate, halo: int, boundary: str):
    """Every window of the rank at ``coordinate`` of a split of both sample axes (halo on both), read by
    the native reader through its plan file, and the source."""
    from dali_mesh import Layout, ZarrSource, _kernels
    from dali_mesh.pipeline import native

    layout = Layout(mesh_of((1, *mesh_shape), (0, *coordinate)), shard={"m0": 0, "m1": 1},
                    halo={0: halo, 1: halo}, boundary={0: boundary, 1: boundary})
    src = ZarrSource([store], name, layout, batch_size=1, shuffle=False)
    (plan,) = native.plan_windows(src)
    ids = list(range(plan.num_items))
    with _kernels.PlanReader(plan.write(os.path.dirname(store)), plan.dtype, outputs=1) as reader:
        (wins,) = reader.read(ids, threads=2)
    return src, dict(zip(ids, wins))


@st.composite
def filtered_arrays(draw):
    itemsize = draw(st.sampled_from([1, 2, 4, 8]))
    kind = draw(st.sampled_from("iuf" if itemsize > 1 else "iu"))
    dtype = np.dtype(f"{draw(st.sampled_from('<>'))}{kind}{itemsize}")
    shape = tuple(draw(st.integers(lo, hi)) for lo, hi in ((1, 4), (2, 11), (2, 13)))
    chunks = tuple(draw(st.integers(1, n)) for n in shape)
    chunk_bytes = int(np.prod(chunks)) * itemsize
    # element sizes dividing a chunk's bytes: the item size, others (numcodecs' default 4 on float64...)
    elementsize = draw(st.sampled_from(sorted({d for d in (1, 2, 3, 4, 8, 16, itemsize) if chunk_bytes % d == 0})))
    return dict(dtype=dtype, shape=shape, chunks=chunks, elementsize=elementsize,
                compressor=draw(st.sampled_from(_COMPRESSORS)), level=draw(st.integers(1, 9)),
                zarr_format=(fmt := draw(st.sampled_from([2, 3]))), seed=draw(st.integers(0, 2**16)),
                # v3: the codecs inside shards of 1 or 2 chunks along each axis too
                shards=tuple(c * draw(st.integers(1, 2)) for c in chunks) if fmt == 3 and draw(st.booleans()) else None,
                mesh_shape=draw(st.sampled_from([(1, 2), (2, 1), (2, 2), (1, 3)])), halo=draw(st.integers(0, 2)),
                boundary=draw(st.sampled_from(["constant", "periodic", "symmetric", "reflect", "edge"])))


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=filtered_arrays())
def test_shuffled_and_compressed_chunks_read_natively_as_zarr_python_reads_them(tmp_path, case):
    from dali_mesh.partition import take_window

    rng = np.random.default_rng(case["seed"])
    x = rng.integers(0, 256, int(np.prod(case["shape"])) * case["dtype"].itemsize, np.uint8)
    x = x.view(case["dtype"]).reshape(case["shape"])
    if x.dtype.kind == "f":
        x = np.where(np.isfinite(x), x, 0).astype(x.dtype)  # NaN != NaN in the comparison
    path = tempfile.mkdtemp(dir=tmp_path)  # one store per example: hypothesis reuses the test's tmp_path
    _write(path, x, case["chunks"], case["zarr_format"], case["elementsize"], case["compressor"], case["level"],
           case["shards"])
    oracle = zarr.open_array(path, mode="r")[...]  # zarr-python (numcodecs) decodes the same chunks
    np.testing.assert_array_equal(oracle, x)
    for coordinate in np.ndindex(*case["mesh_shape"]):
        src, wins = _windows(path, None, case["mesh_shape"], coordinate, case["halo"], case["boundary"])
        for t, w in wins.items():
            np.testing.assert_array_equal(w, take_window(oracle[t], src.region), err_msg=f"{case}, {coordinate}, {t}")


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_kerchunks_shuffle_and_zlib_are_planned_as_one_coder(tmp_path, zarr_format):
    """HDF5's shuffle + deflate as the libraries write them: the coder inflates, then unshuffles by the
    element size the metadata says (not the item size)."""
    from dali_mesh import _kernels
    from dali_mesh.plan import CODECS
    from dali_mesh.pipeline import native

    x = np.arange(6 * 8 * 10, dtype="<f8").reshape(6, 8, 10)
    _write(tmp_path / "a", x, (2, 4, 10), zarr_format, 4, "zlib", 5)
    src, wins = _windows(str(tmp_path / "a"), None, (1, 2), (0, 1), 1, "periodic")
    (plan,) = native.plan_windows(src)
    assert [c.steps for c in plan.coders] == [((CODECS["zlib"], 0), (CODECS["shuffle"], 4))]
    assert _kernels.codec_available(CODECS["zlib"])
    assert len(wins) == 6


@pytest.mark.parametrize("zarr_format,chain,words", [
    (2, ["delta"], r"has filters \['delta'\], which the native reader does not apply"),
    (2, ["zlib", "shuffle"], r"has filters and compressor \['zlib', 'shuffle'\]"),
    (2, ["shuffle", "zlib", "zstd"], r"has filters and compressor \['shuffle', 'zlib', 'zstd'\]"),
    (2, ["shuffle3"], "shuffled by element size 3, which does not divide its chunks' 320 bytes"),
    (3, ["zlib", "shuffle"], r"has codecs \['numcodecs.zlib', 'numcodecs.shuffle'\]"),
    (3, ["shuffle3"], "shuffled by element size 3, which does not divide"),
])
def test_chains_the_reader_does_not_run_fall_back_with_the_reason(tmp_path, zarr_format, chain, words):
    from dali_mesh.pipeline import native

    x = np.arange(4 * 8 * 10, dtype="<i4").reshape(4, 8, 10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if zarr_format == 2:
            filters = [numcodecs.Delta("<i4") if c == "delta" else numcodecs.Shuffle(3) if c == "shuffle3" else
                       numcodecs.Shuffle(4) if c == "shuffle" else _numcodec(c, 1) for c in chain]
            arr = zarr.create_array(str(tmp_path / "a"), shape=x.shape, chunks=(1, 8, 10), dtype=x.dtype,
                                    filters=filters, compressors=None, zarr_format=2)
        else:
            codecs = [_v3_codec("shuffle", 1, 3 if c == "shuffle3" else 4) if c.startswith("shuffle") else
                      _v3_codec(c, 1) for c in chain]
            arr = zarr.create_array(str(tmp_path / "a"), shape=x.shape, chunks=(1, 8, 10), dtype=x.dtype,
                                    compressors=codecs, zarr_format=3)
    assert arr.shape == x.shape  # no chunk written: the metadata alone is refused, at planning
    from dali_mesh import Layout, ZarrSource

    src = ZarrSource([str(tmp_path / "a")], None, Layout(mesh_of((1, 2), (0, 0)), shard={"m0": 0}), batch_size=1,
                     shuffle=False)
    with pytest.raises(native.NotNativeError, match=words):
        native.plan_windows(src)
