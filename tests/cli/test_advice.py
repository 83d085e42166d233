"""`dali-mesh plan --data`: predicted cold bytes per rank equal what the readers count (IOStats)."""
from __future__ import annotations
import json
import os

import numpy as np
import pytest

from dali_mesh import Layout, MeshInfo
from dali_mesh.cli.advice import aligned_chunks, open_layout_target
from dali_mesh.cli import main
from dali_mesh.io import IOStats
from dali_mesh.formats.npy import read_npy_window

SHAPE = (6, 40, 300)  # odd sizes: shards of 10/10/10/10 rows, 75 columns; rows of 1200 bytes


def _plan(capsys, data, *extra):
    assert main(["plan", "--data", str(data), "--json"] + list(extra)) == 0
    return json.loads(capsys.readouterr().out)


def _layout(mesh_shape, names, rank, **kw):
    mesh = MeshInfo(mesh_shape, names).with_rank(rank)
    return Layout(mesh, **kw)


def _check_rows(rows, read, layout_kw, mesh_shape, names, shape=SHAPE):
    assert rows
    for row in rows:
        layout = _layout(mesh_shape, names, row["rank"], **layout_kw)
        region = layout.region(shape)
        stats = IOStats()
        window = read(region, stats)
        assert stats.window_bytes == window.nbytes
        assert row["needed_bytes"] <= row["bytes"] == window.nbytes
        assert stats.bytes_read == pytest.approx(row["cold_bytes"], rel=0.01), (row, stats)


@pytest.fixture(scope="module")
def sample():
    return np.random.default_rng(3).standard_normal(SHAPE).astype(np.float32)


@pytest.mark.parametrize("axis,extra,layout_kw", [
    (0, [], {}),
    (1, ["--halo", "1=2", "--boundary", "1=periodic"], {"halo": {1: 2}, "boundary": {1: "periodic"}}),
    (2, ["--halo", "2=3"], {"halo": {2: 3}}),
    (2, ["--split", "even"], {"split": "even"}),
])
def test_npy_cold_bytes_equal_reader_counters(tmp_path, capsys, sample, axis, extra, layout_kw):
    path = tmp_path / "s.npy"
    np.save(path, sample)
    rows = _plan(capsys, path, "--mesh", "mp=4", "--shard", f"mp={axis}", *extra)
    kw = dict(shard={"mp": axis}, **layout_kw)
    _check_rows(rows, lambda region, st: read_npy_window(str(path), region, stats=st), kw, (4,), ("mp",))
    if axis == 2:  # innermost split: every page holds window bytes of every rank
        assert all(r["cold_bytes"] > 3 * r["needed_bytes"] for r in rows)
    if axis == 0:
        assert all(r["cold_bytes"] < 1.1 * r["needed_bytes"] for r in rows if r["needed_bytes"])
        assert rows[3]["needed_bytes"] == 0 and rows[3]["cold_bytes"] == 512  # an empty shard: the header only


@pytest.mark.parametrize("chunks", [None, (1, 3, 8, 300), (2, 6, 40, 64), (1, 6, 10, 75)])
def test_hdf5_cold_bytes_equal_reader_counters(tmp_path, capsys, sample, chunks):
    h5py = pytest.importorskip("h5py")
    from dali_mesh.formats.hdf5 import open_hdf5_dataset, read_hdf5_window

    path = tmp_path / "s.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("fields", data=np.stack([sample, sample + 1]), chunks=chunks)
    rows = _plan(capsys, path, "--mesh", "dp=2,mp=2", "--shard", "mp=2", "--halo", "2=1")
    f, ds = open_hdf5_dataset(str(path), "fields")
    with f:
        _check_rows(rows, lambda region, st: read_hdf5_window(ds, region, prefix=(0,), stats=st),
                    {"shard": {"mp": 2}, "halo": {2: 1}}, (2, 2), ("dp", "mp"))
    if chunks == (1, 6, 10, 75):  # windows of 151 columns touch 3 chunks of 75: 225 columns read
        assert all(r["cold_bytes"] < 2 * r["needed_bytes"] for r in rows)


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_zarr_cold_bytes_equal_reader_counters(tmp_path, capsys, sample, zarr_format):
    zarr = pytest.importorskip("zarr")
    from dali_mesh.formats.zarr import open_zarr_array, read_zarr_window

    path = tmp_path / "s.zarr"
    data = np.stack([sample, sample * 2])
    arr = zarr.create_array(store=str(path), shape=data.shape, chunks=(1, 2, 16, 128), dtype="f4",
                            zarr_format=zarr_format)  # default compressor: chunk objects differ in size
    arr[...] = data
    rows = _plan(capsys, path, "--mesh", "mp=3", "--shard", "mp=1", "--halo", "1=2", "--boundary", "1=periodic")
    z = open_zarr_array(str(path))
    _check_rows(rows, lambda region, st: read_zarr_window(z, region, prefix=(0,), stats=st),
                {"shard": {"mp": 1}, "halo": {1: 2}, "boundary": {1: "periodic"}}, (3,), ("mp",))


def test_advice_names_a_chunk_shape_that_reads_the_window(tmp_path, capsys, sample):
    path = tmp_path / "s.npy"
    np.save(path, sample)
    assert main(["plan", "--data", str(path), "--mesh", "dp=2,mp=4", "--shard", "mp=2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "cold read" in out[1] and "x window" in out[1]
    assert out[-1].startswith("advice: store the data chunked (1, 6, 40, 75) ") and "~1.00x" in out[-1], out[-1]
    assert main(["plan", "--data", str(path), "--mesh", "dp=2,mp=4", "--shard", "mp=0"]) == 0
    assert "advice:" not in capsys.readouterr().out


@pytest.mark.parametrize("split,sizes,expect", [
    ("chunk", (721,), 181),         # 181, 181, 181, 178: boundaries 181, 362, 543
    ("even", (721,), 181),          # 181, 180, 180, 180: no common size: the largest shard
    ("chunk", (1440,), 360),
])
def test_aligned_chunks(split, sizes, expect):
    layout = Layout(MeshInfo((4,), ("mp",)), shard={"mp": 1}, split=split)
    assert aligned_chunks(layout, (8,) + sizes, 4) == (1, 8, expect)


def test_aligned_chunks_nested_and_capped():
    layout = Layout(MeshInfo((2, 2, 3), ("dp", "h", "w")), shard={"h": 1, "w": 1}, batch="dp")
    assert aligned_chunks(layout, (4, 24, 10), 4) == (1, 4, 4, 10)  # 2x3 = 6 shards of 4 rows
    layout = Layout(MeshInfo((4,), ("mp",)), shard={"mp": 2})
    chunks = aligned_chunks(layout, (64, 1024, 2048), 4, max_bytes=1 << 20)
    assert np.prod(chunks) * 4 <= 1 << 20 and chunks[3] == 512 and 512 % chunks[3] == 0


@pytest.mark.parametrize("argv,message", [
    (["--data", "nowhere.npy", "--mesh", "mp=2", "--shard", "mp=0"], "--data 'nowhere.npy' does not exist"),
    (["--data", "{npy}", "--mesh", "mp=2", "--shard", "mp=0", "--dataset", "x"], "a .npy file has none"),
    (["--data", "{npy}", "--mesh", "mp=2", "--shard", "mp=0", "--shape", "1,2"], "disagrees with --data"),
    (["--data", "{npy}", "--mesh", "mp=2", "--shard", "mp=0", "--dtype", "float64"], "disagrees with --data"),
    (["--mesh", "mp=2", "--shard", "mp=0"], "plan needs --shape"),
])
def test_plan_data_errors(tmp_path, capsys, sample, argv, message, monkeypatch):
    monkeypatch.chdir(tmp_path)
    np.save(tmp_path / "s.npy", sample)
    argv = [a.replace("{npy}", str(tmp_path / "s.npy")) for a in argv]
    assert main(["plan"] + argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and message in err, err


def test_open_layout_target_folder_takes_first_file(tmp_path, sample):
    np.save(tmp_path / "b.npy", sample)
    np.save(tmp_path / "a.npy", sample[:, :10])
    target = open_layout_target(str(tmp_path))
    assert target.path.endswith("a.npy") and target.sample_shape == (6, 10, 300)


# ---- chunk advice for unequal explicit sizes says plainly that no regular grid reads ~1.0x -----------------
def test_advice_for_unequal_explicit_sizes(tmp_path, capsys):
    pytest.importorskip("h5py")
    from dali_mesh.cli.advice import chunk_advice
    from dali_mesh.cli import main

    layout = Layout(MeshInfo((4,), ("mp",)), shard={"mp": 2}, split={"mp": [250, 262, 256, 256]})
    chunks, note = chunk_advice(layout, (4, 64, 1024), 4)
    assert chunks == (1, 4, 64, 262)
    assert "only common chunk width is 2 cells" in note and "256/256/256/256" in note
    # the common width when its chunks are large enough: a grid on every boundary, no note
    chunks, note = chunk_advice(layout, (512, 256, 1024), 4)
    assert chunks == (1, 512, 256, 2) and note is None
    a = np.arange(4 * 64 * 1024, dtype="<f4").reshape(4, 64, 1024)
    np.save(tmp_path / "u.npy", a)
    args = ["--mesh", "mp=4", "--shard", "mp=2", "--split", "mp=250/262/256/256"]
    assert main(["convert", str(tmp_path / "u.npy"), str(tmp_path / "u.h5"), "--no-progress"] + args) == 0
    assert "note: these chunks do not follow every shard boundary" in capsys.readouterr().out
    assert main(["plan", "--data", str(tmp_path / "u.npy")] + args) == 0
    out = capsys.readouterr().out.splitlines()[-1]
    assert out.startswith("advice: no chunk shape aligned with these shards reads ~1.0x") and "~2.05x" in out
    assert main(["plan", "--data", str(tmp_path / "u.h5")] + args) == 0
    out = capsys.readouterr().out.splitlines()[-1]
    assert "The data already has the best regular chunks found ((1, 4, 64, 262), ~2.05x)" in out
    assert "store the data chunked" not in out
    np.testing.assert_array_equal(__import__("h5py").File(tmp_path / "u.h5")["data"][0], a)


# ---- issue 19: plan --data is bounded before it works --------------------------------------------------
def _tiny_hdf5_with_one_cell_chunks(path):
    h5py = pytest.importorskip("h5py")
    with h5py.File(path, "w") as f:
        f.create_dataset("x", shape=(2, 8192, 8192), chunks=(1, 1, 1), dtype="f4")  # nothing written
    assert os.path.getsize(path) < 1 << 14


def _metadata_only_zarr(path, shape, chunks):
    os.makedirs(path)
    with open(os.path.join(path, ".zarray"), "w") as f:
        json.dump({"zarr_format": 2, "shape": list(shape), "chunks": list(chunks), "dtype": "<f4",
                   "compressor": None, "fill_value": 0.0, "filters": None, "order": "C"}, f)


def _sparse_npy(path: str, shape) -> str:
    """A float32 .npy claiming ``shape``, its data a hole (nothing stored)."""
    header = np.lib.format.header_data_from_array_1_0(np.zeros((1, 4), np.float32))
    header["shape"] = tuple(shape)
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, header)
        f.truncate(f.tell() + int(np.prod(shape)) * 4)
    return path


@pytest.mark.timeout(60)
def test_plan_data_on_a_window_of_millions_of_rows_plans_them_as_one_unit(tmp_path, capsys):
    """A (2**22, 4) float32 .npy split on its last axis: a window of 2**22 rows 16 bytes apart. It was
    refused ("4194304 separate byte ranges"); its rows are one repeated unit now: planned, the native
    reader, each rank reading the whole file (its rows lie in every page)."""
    path = _sparse_npy(str(tmp_path / "rows.npy"), (1 << 22, 4))
    assert main(["plan", "--data", path, "--mesh", "mp=4", "--shard", "mp=1"]) == 0
    out = capsys.readouterr().out
    assert "reader: native (read_windows)" in out, out
    assert "64.0 MiB   4.00x" in out, out  # cold read: the file, 4x the 16 MiB window


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["hdf5", "zarr", "npy", "npy_runs"])
def test_plan_data_on_a_tiny_file_claiming_a_huge_grid_is_one_line_quickly(tmp_path, capsys, kind):
    """A 1.4 KB HDF5 file or a metadata-only Zarr store claiming (2, 8192, 8192) chunks of one cell, or
    a sparse .npy claiming 2**40 bytes, split so that a window is millions of chunks or byte ranges
    (rows a page or more apart: separate reads): plan --data ran past 120 s (or wanted more than
    4 GiB); now one line, exit 2, within the bound."""
    if kind == "hdf5":
        path = str(tmp_path / "tiny.h5")
        _tiny_hdf5_with_one_cell_chunks(path)
        argv = ["plan", "--data", path, "--mesh", "mp=4", "--shard", "mp=1"]
        words = "touches 16777216 chunks"
    elif kind == "zarr":
        path = str(tmp_path / "tiny.zarr")
        _metadata_only_zarr(path, (2, 8192, 8192), (1, 1, 1))
        argv = ["plan", "--data", path, "--mesh", "mp=4", "--shard", "mp=1"]
        words = "touches 16777216 chunks"
    else:  # 2**36 rows: an axis too long to plan; 2**21 rows of 16 KiB: a window of 2**21 byte ranges
        rows, cols = (1 << 36, 4) if kind == "npy" else (1 << 21, 4096)
        path = _sparse_npy(str(tmp_path / "sparse.npy"), (rows, cols))
        argv = ["plan", "--data", path, "--mesh", "mp=4", "--shard", "mp=1"]
        words = "cells on one axis" if kind == "npy" else "2097152 separate byte ranges"
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and words in err, err


@pytest.mark.parametrize("filters,expect", [
    (None, r"reader: native \(read_windows\), decoding blosc chunks on DALI's threads, each chunk once per batch"),
    ("delta", r"reader: partitioned_source \(the native reader falls back: .* has filters \['delta'\].*"),
])
def test_plan_data_says_which_reader_and_why(tmp_path, capsys, filters, expect):
    zarr = pytest.importorskip("zarr")
    numcodecs = pytest.importorskip("numcodecs")
    import re

    path = str(tmp_path / "c.zarr")
    z = zarr.create_array(path, shape=(2, 3, 32, 16), chunks=(1, 3, 8, 16), dtype="f4", zarr_format=2,
                          compressors=numcodecs.Blosc(), filters=[numcodecs.Delta("f4")] if filters else None)
    z[:] = np.arange(z.size, dtype="f4").reshape(z.shape)
    assert main(["plan", "--data", path, "--mesh", "mp=4", "--shard", "mp=1"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("reader: ")]
    assert len(lines) == 1 and re.fullmatch(expect, lines[0]), lines


def test_a_sharded_zarr_array_is_counted_by_its_inner_chunks(tmp_path, capsys):
    """A sharded v3 array's chunks are the shards' inner chunks, read by byte range: each rank's cold read
    is its inner chunks' share of the shard (it was the whole shard for the rank whose first inner chunk
    shares the shard's key, and nothing for the others: 14.9x and 0x of the window). The oracle is the
    shard object's size on disk: the ranks together read the inner chunks of one step."""
    zarr = pytest.importorskip("zarr")
    data = np.random.default_rng(1).standard_normal((8, 4, 64, 128)).astype(np.float32)
    path = tmp_path / "s.zarr"
    arr = zarr.create_array(store=str(path), shape=data.shape, chunks=(1, 4, 16, 32), shards=(4, 4, 64, 128),
                            dtype="f4", compressors=zarr.codecs.ZstdCodec(level=3))
    arr[...] = data
    shard = os.path.getsize(path / "c" / "0" / "0" / "0" / "0")
    inner_per_shard = 4 * 1 * 4 * 4
    rows = _plan(capsys, path, "--mesh", "mp=4", "--shard", "mp=2")
    # each rank's window is 4 x 64 x 32 of step 0: 4 inner chunks (16 rows each) of the first shard
    assert [r["cold_bytes"] for r in rows] == [4 * (shard // inner_per_shard)] * 4
