"""`dali-mesh plan`: table, JSON, PNG, and one-line errors with exit code 2."""
from __future__ import annotations
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from dali_mesh import Layout, MeshInfo
from dali_mesh.cli import main

ERA5 = ["plan", "--shape", "8,721,1440", "--mesh", "data_parallel=2,model_parallel=4", "--shard", "model_parallel=1"]


def test_plan_json_matches_layout(capsys):
    assert main(ERA5 + ["--halo", "1=2", "--boundary", "1=periodic", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 8
    mesh = MeshInfo((2, 4), ("data_parallel", "model_parallel"))
    layout = Layout(mesh, shard={"model_parallel": 1}, halo={1: 2}, boundary={1: "periodic"})
    for row, coordinate, region in zip(rows, mesh.coordinates(), layout.regions((8, 721, 1440))):
        assert set(row) == {"rank", "coordinate", "start", "stop", "window_start", "window_stop", "window_shape", "bytes"}
        assert row["coordinate"] == {"data_parallel": coordinate[0], "model_parallel": coordinate[1]}
        assert (tuple(row["start"]), tuple(row["stop"])) == (region.start, region.stop)
        assert (tuple(row["window_start"]), tuple(row["window_stop"])) == (region.window_start, region.window_stop)
        assert row["bytes"] == 4 * int(np.prod(region.window_shape))
    assert rows[1]["window_start"] == [0, 179, 0] and rows[1]["window_shape"] == [8, 185, 1440]


def test_plan_table(capsys):
    assert main(ERA5 + ["--split", "even", "--dtype", "float64"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "rank" in lines[1] and "fraction" in lines[1]
    assert len(lines) == 3 + 8
    assert "[0:8, 181:361, 0:1440]" in lines[4]  # rank 1, even split: 181, 180, 180, 180
    assert "8x180x1440" in lines[4] and "25.0%" in lines[4] or "24.9%" in lines[4]


def test_plan_boundary_for_every_axis_and_halo_pairs(capsys):
    assert main(["plan", "--shape", "4,6", "--mesh", "2", "--shard", "dim0=0", "--halo", "1:2",
                 "--boundary", "periodic", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["window_start"] == [-1, -1] and rows[0]["window_stop"] == [4, 8]


def test_plan_png(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "plan.png"
    assert main(ERA5 + ["--halo", "1=20", "--png", str(out)]) == 0
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


@pytest.mark.parametrize("args,message", [
    (["--shape", "8,x,1440", "--mesh", "dp=2,mp=4", "--shard", "mp=1"], "malformed --shape '8,x,1440'"),
    (["--shape", "8,721", "--mesh", "dp=2,4", "--shard", "mp=1"], "name every dim or none"),
    (["--shape", "8,721", "--mesh", "dp=2,mp=four", "--shard", "mp=1"], "'four' is not an integer"),
    (["--shape", "8,721", "--mesh", "dp=2,mp=4", "--shard", "tp=1"], "unknown mesh dim 'tp'"),
    (["--shape", "8,721", "--mesh", "dp=2,mp=4", "--shard", "mp=1", "--batch", "mp"], "'mp' is used twice"),
    (["--shape", "8,721", "--mesh", "dp=2,mp=4", "--shard", "mp=2"], "axis 2 is out of range"),
    (["--shape", "8,721", "--mesh", "dp=2,mp=4", "--shard", "mp=1", "--halo", "1=-2"], "negative halo -2"),
    (["--shape", "8,721", "--mesh", "dp=2,mp=4", "--shard", "mp=1", "--boundary", "wrap"], "unknown boundary 'wrap'"),
    (["--shape", "8,721", "--mesh", "dp=2,mp=4", "--shard", "mp=1", "--split", "ceil"], "unknown split 'ceil'"),
    (["--shape", "8,0", "--mesh", "dp=2,mp=4", "--shard", "mp=1"], "has a size <= 0"),
    (["--shape", "8,721", "--mesh", "dp=2,mp=0", "--shard", "mp=1"], "has a size 0"),
    (["--shape", "8,721", "--mesh", "dp=-1,mp=-1", "--shard", "mp=1", "--world-size", "8"], "more than one -1"),
    (["--shape", "8,721", "--mesh", "dp=2,mp=4", "--shard", "mp=1", "--world-size", "6"], "but WORLD_SIZE=6"),
    (["--shape", "8,721", "--mesh", "dp=2,tp=2,mp=4", "--shard", "mp=1"], "batch is required"),
    (["--shape", "8,721", "--mesh", "dp=2,mp=4", "--shard", "mp=1", "--crop", ":,0:800"], "crop 0:800 of axis 1 lies outside"),
    (["--shape", "8,721", "--mesh", "dp=2,mp=4", "--shard", "mp"], "malformed --shard 'mp'"),
    (["--shape", "8,721", "--mesh", "dp=2,mp=4", "--shard", "mp=1", "--dtype", "float33"], "unknown --dtype 'float33'"),
])
def test_plan_errors_one_line_exit_2(args, message, capsys):
    assert main(["plan"] + args) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err.strip()
    assert "\n" not in err and err.startswith("dali-mesh: error: ") and message in err, err


def test_console_script_exit_code_and_no_traceback():
    proc = subprocess.run([sys.executable, "-m", "dali_mesh.cli", "plan", "--shape", "8,721", "--mesh", "dp=2,mp=4",
                           "--shard", "tp=1"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "unknown mesh dim 'tp'" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "dali_mesh.cli", "plan", "--mesh", "2"], capture_output=True, text=True)
    assert proc.returncode == 2 and "--shape" in proc.stderr and "Traceback" not in proc.stderr


def test_import_is_light():
    code = ("import sys, dali_mesh, dali_mesh.cli; "
            "bad = [m for m in ('torch', 'nvidia.dali', 'h5py', 'zarr') if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_plan_png_writes_exactly_the_path_given(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "decomposition.png"
    assert main(ERA5 + ["--png", str(out)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"wrote {out}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["decomposition.png"]
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("extra,message", [
    (["--dtype", ",f4"], "unknown --dtype ',f4'"),
    (["--dtype", "f4,f4"], "is not a plain numeric dtype"),
    (["--dtype", "S3"], "is not a plain numeric dtype"),
    (["--png", "p.xyz"], "--png 'p.xyz' does not end in .png"),
    (["--png", "no_such_folder/p.png"], "folder 'no_such_folder' does not exist"),
    (["--fill-value", "0.5", "--dtype", "uint8"], "fill_value 0.5 cannot be held by uint8"),
    (["--fill-value", "-1", "--dtype", "uint16"], "fill_value -1.0 cannot be held by uint16"),
    (["--rank", "8"], "--rank 8 is out of range for a mesh of 8 ranks"),
    (["--ranks", "3:2"], "--ranks '3:2': expected START:STOP"),
    (["--ranks", "0:9"], "--ranks '0:9'"),
    (["--rank", "1", "--ranks", "0:2"], "give --rank or --ranks, not both"),
    (["--split", "model_parallel=1/x"], "sizes of 'model_parallel' must be integers"),
])
def test_plan_more_errors_one_line_exit_2(extra, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(ERA5 + extra) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and os.listdir(tmp_path) == []
    err = captured.err.strip()
    assert "\n" not in err and err.startswith("dali-mesh: error: ") and message in err, err


def test_plan_png_refuses_a_directory(tmp_path, capsys):
    assert main(ERA5 + ["--png", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == [] and not os.path.exists(str(tmp_path) + ".png")


def test_plan_rank_and_ranks_select_rows(capsys):
    assert main(ERA5 + ["--json"]) == 0
    every = json.loads(capsys.readouterr().out)
    assert main(ERA5 + ["--json", "--rank", "5"]) == 0
    assert json.loads(capsys.readouterr().out) == [every[5]]
    assert main(ERA5 + ["--json", "--ranks", "2:6"]) == 0
    assert json.loads(capsys.readouterr().out) == every[2:6]
    assert main(ERA5 + ["--ranks", "6:"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 + 2 and lines[3].startswith("6 ") and lines[4].startswith("7 ")


def _run_limited(args, timeout=60):
    """The CLI in a subprocess with 1 GiB of address space: a command that grows memory with the
    mesh size dies instead of taking the machine."""
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30)); "
            "from dali_mesh.cli import main; sys.exit(main(sys.argv[1:]))")
    return subprocess.run([sys.executable, "-c", code] + args, capture_output=True, text=True, timeout=timeout)


def test_plan_huge_meshes_are_bounded():
    from dali_mesh.cli import MAX_ROWS

    proc = _run_limited(["plan", "--shape", "4,8", "--mesh", "a=1099511627776", "--shard", "a=1"])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"plan prints at most {MAX_ROWS} rows: pick some with --rank R or --ranks A:B, or give --all" in proc.stderr
    proc = _run_limited(["plan", "--shape", "4,8", "--mesh", "a=3000000", "--shard", "a=1", "--json"])
    assert proc.returncode == 2 and "3000000 ranks" in proc.stderr
    proc = _run_limited(["plan", "--shape", "4,8", "--mesh", "a=1099511627776", "--shard", "a=1", "--json",
                         "--rank", "1099511627775"])
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(proc.stdout)
    assert row["start"] == [0, 8] and row["window_shape"] == [4, 0]  # torch's empty trailing shard
    proc = _run_limited(["plan", "--shape", "4,3000000", "--mesh", "a=3000000", "--shard", "a=1", "--json",
                         "--ranks", "2999998:3000000"])
    assert proc.returncode == 0, proc.stderr
    assert [r["start"] for r in json.loads(proc.stdout)] == [[0, 2999998], [0, 2999999]]


def test_plan_all_streams_many_rows(capsys):
    from dali_mesh.cli import MAX_ROWS

    n = MAX_ROWS + 3
    assert main(["plan", "--shape", f"2,{n}", "--mesh", f"a={n}", "--shard", "a=1", "--all", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["start"][1] for r in rows] == list(range(n))
    assert main(["plan", "--shape", f"2,{n}", "--mesh", f"a={n}", "--shard", "a=1", "--all"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 + n and lines[-1].split()[0] == str(n - 1)


def test_plan_split_explicit_sizes(capsys):
    from dali_mesh.partition import LayoutError

    mesh = MeshInfo((4,), ("model_parallel",))
    try:
        layout = Layout(mesh, shard={"model_parallel": 1}, split={"model_parallel": [200, 181, 181, 159]})
        layout.region((8, 721))
    except (LayoutError, TypeError):
        pytest.skip("dali_mesh.partition does not take explicit split sizes yet")
    assert main(["plan", "--shape", "8,721", "--mesh", "model_parallel=4", "--shard", "model_parallel=1",
                 "--split", "model_parallel=200/181/181/159", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["start"][1] for r in rows] == [0, 200, 381, 562]
    assert [r["stop"][1] for r in rows] == [200, 381, 562, 721]
    assert main(["plan", "--shape", "8,721", "--mesh", "model_parallel=4", "--shard", "model_parallel=1",
                 "--split", "model_parallel=200/181/181/159"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("split model_parallel=200/181/181/159") and "[0:8, 200:381]" in out[4]
    assert main(["plan", "--shape", "8,721", "--mesh", "model_parallel=4", "--shard", "model_parallel=1",
                 "--split", "model_parallel=200/181/181/158"]) == 2
    assert "721" in capsys.readouterr().err


def test_cli_allow_external(tmp_path, capsys):
    h5py = pytest.importorskip("h5py")
    from dali_mesh.cli import main

    raw = np.arange(16, dtype="<f4")
    raw.tofile(tmp_path / "raw.bin")
    with h5py.File(tmp_path / "ext.h5", "w") as f:
        f.create_dataset("x", shape=(1, 4, 4), dtype="<f4", external=[(str(tmp_path / "raw.bin"), 0, raw.nbytes)])
    args = ["--mesh", "mp=1", "--shard", "mp=0"]
    assert main(["plan", "--data", str(tmp_path / "ext.h5")] + args) == 2
    assert "pass allow_external=True (dali-mesh commands: --allow-external)" in capsys.readouterr().err
    assert main(["plan", "--data", str(tmp_path / "ext.h5"), "--allow-external"] + args) == 0
    assert main(["convert", str(tmp_path / "ext.h5"), str(tmp_path / "o.h5"), "--no-progress"] + args) == 2
    capsys.readouterr()
    assert main(["convert", str(tmp_path / "ext.h5"), str(tmp_path / "o.h5"), "--no-progress",
                 "--allow-external"] + args) == 0
    with h5py.File(tmp_path / "o.h5") as f:
        np.testing.assert_array_equal(f["data"][0], raw.reshape(4, 4))


# ---- issue 19: --png shows a halo of one cell --------------------------------------------------------
def test_png_halo_bands_show_one_cell_and_stay_off_the_owned_region(tmp_path):
    """--png hatched whole windows as "halo": a 1-row halo was invisible and every region looked like
    halo. Halos are bands beside the owned region, at least MIN_HALO_FRACTION of the axis wide."""
    from dali_mesh.cli.main import MIN_HALO_FRACTION, draw_png, halo_bands

    shape = (8, 721, 1440)
    for coordinate, want in [((0,), 1), ((1,), 2), ((3,), 1)]:  # the poles clip nothing: constant halos
        layout = Layout(MeshInfo((4,), ("mp",), coordinate), shard={"mp": 1}, halo={1: 1}, boundary="trim")
        region = layout.region(shape)
        bands = halo_bands(region, 1, 2, (1440, 721))
        assert len(bands) == want, (coordinate, bands)
        for x, y, w, h in bands:
            assert h >= MIN_HALO_FRACTION * 721 and w == 1440
            assert y + h <= region.start[1] or y >= region.stop[1], (y, h, region)  # off the owned rows
    plain = Layout(MeshInfo((4,), ("mp",), (1,)), shard={"mp": 1})
    assert halo_bands(plain.region(shape), 1, 2, (1440, 721)) == []
    empty = Layout(MeshInfo((4,), ("mp",), (3,)), shard={"mp": 1}, halo={1: 2})  # 3 rows over 4: rank 3 owns none
    assert halo_bands(empty.region((2, 3, 4)), 1, 2, (4, 3)) == []
    path = str(tmp_path / "p.png")
    draw_png(path, Layout(MeshInfo((4,), ("mp",), (0,)), shard={"mp": 1}, halo={1: 1}), shape)
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_plan_data_channels_counts_the_chunks_each_rank_reads(tmp_path):
    """plan --data STORE --channels: per rank, the stored bytes of the chunks its window touches for the
    first sample (counted here from the chunk files), and the reader per variable."""
    xr = pytest.importorskip("xarray")
    pd = pytest.importorskip("pandas")
    pytest.importorskip("nvidia.dali")
    import numpy as np
    from numcodecs import Blosc

    rng = np.random.default_rng(2)
    ds = xr.Dataset({"t2m": (("time", "lat", "lon"), rng.standard_normal((4, 12, 8)).astype("f4")),
                     "z": (("time", "level", "lat", "lon"), rng.standard_normal((4, 2, 12, 8)).astype("f4"))},
                    coords={"time": pd.date_range("2020-01-01", periods=4, freq="6h"), "level": [500, 850]})
    store = str(tmp_path / "s.zarr")
    comp = [Blosc("lz4", 5, Blosc.SHUFFLE)]
    ds.to_zarr(store, zarr_format=2, mode="w", consolidated=False,
               encoding={"t2m": {"chunks": (1, 12, 8), "compressors": comp},
                         "z": {"chunks": (1, 1, 4, 8), "compressors": comp}})
    r = _run(["plan", "--data", store, "--channels", "t2m,z@850", "--mesh", "mp=3", "--shard", "mp=1", "--halo", "1=1"])
    assert r.returncode == 0, r.stdout + r.stderr
    rows = {int(line.split("|")[1]): line for line in r.stdout.splitlines() if line.startswith("| ") and
            line.split("|")[1].strip().isdigit()}
    size = lambda *key: os.path.getsize(os.path.join(store, *key))  # noqa: E731
    for rank, (lo, hi) in enumerate(((0, 5), (3, 9), (7, 12))):  # rows of the windows (halo 1, constant)
        want = size("t2m", "0.0.0") + sum(size("z", f"0.1.{c}.0") for c in range(lo // 4, (hi - 1) // 4 + 1))
        read = rows[rank].split("|")[5].strip()
        assert read == _human(want), (rank, rows[rank], want)
    assert "variable t2m: reader: native" in r.stdout and "variable z: reader: native" in r.stdout
    assert "read_dataset: one native reader" in r.stdout  # both float32: one operator reads them
    # --share group: the group window (every row, halo inside the sample) is read once per group of 3
    s = _run(["plan", "--data", store, "--channels", "t2m,z@850", "--mesh", "mp=3", "--shard", "mp=1", "--halo", "1=1",
              "--share", "group"])
    assert s.returncode == 0, s.stdout + s.stderr
    line = next(x for x in s.stdout.splitlines() if x.startswith("share=group"))
    whole = size("t2m", "0.0.0") + sum(size("z", f"0.1.{c}.0") for c in range(3))
    own = sum(size("t2m", "0.0.0") + sum(size("z", f"0.1.{c}.0") for c in range(lo // 4, (hi - 1) // 4 + 1))
              for lo, hi in ((0, 5), (3, 9), (7, 12))) / 3
    assert "groups of 3 ranks over mp" in line and f"{_human(whole)} per sample" in line, line
    assert f"{_human(int(whole / 3))} per rank on average, against {_human(int(own))}" in line, line
    assert "samples (channel, lat, lon) = (2, 12, 8) float32" in r.stdout
    bad = _run(["plan", "--data", store, "--channels", "t2m,z@300", "--mesh", "mp=3", "--shard", "mp=1"])
    assert bad.returncode == 2 and "'z' has no level 300" in bad.stderr + bad.stdout


def _run(args):
    return subprocess.run([sys.executable, "-m", "dali_mesh.cli"] + args, capture_output=True, text=True, timeout=120)


def _human(n):
    from dali_mesh.cli.main import _fmt_bytes

    return _fmt_bytes(n)
