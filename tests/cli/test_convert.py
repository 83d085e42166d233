"""`dali-mesh convert`: exact copies whose chunks follow the shards, so an innermost split reads its window."""
from __future__ import annotations

import os

import numpy as np
import pytest

from dali_mesh import Layout, MeshInfo
from dali_mesh.cli import main
from dali_mesh.io import IOStats
from dali_mesh.formats.npy import read_npy_window
from dali_mesh.partition import take_window
from dali_mesh.source import ZarrSource
from tests.helpers import run_python

h5py = pytest.importorskip("h5py")
zarr = pytest.importorskip("zarr")


SHAPE = (3, 24, 720)  # channels, lat, lon: an innermost (lon) split over 4 ranks: 180 columns each


def _samples(folder, n=5, shape=SHAPE, dtype="<f4"):
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(11)
    out = []
    for i in range(n):
        a = rng.standard_normal(shape).astype(dtype)
        if i == 1 and a.dtype.kind == "f":  # bit patterns a value compare would miss
            a.flat[:3] = [np.nan, -0.0, np.inf]
        np.save(os.path.join(folder, f"s{i:03d}.npy"), a)
        out.append(a)
    return out


def _read_back(dst, name="data"):
    if dst.endswith(".zarr"):
        return np.asarray(zarr.open_array(dst, path=name, mode="r")[...])
    with h5py.File(dst, "r") as f:
        return f[name][...]


def _bits_equal(a, b):
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b).astype(a.dtype.newbyteorder("="))
    return a.shape == b.shape and np.array_equal(a.astype(a.dtype.newbyteorder("=")).view(np.uint8), b.view(np.uint8))


@pytest.mark.parametrize("suffix", [".h5", ".zarr"])
@pytest.mark.parametrize("dtype", ["<f4", ">f4", "<i2"])
def test_npy_folder_round_trip_exact(tmp_path, capsys, suffix, dtype):
    src = str(tmp_path / "src")
    samples = _samples(src, dtype=dtype)
    dst = str(tmp_path / ("out" + suffix))
    assert main(["convert", src, dst, "--mesh", "dp=2,mp=4", "--shard", "mp=2", "--workers", "3"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith(f"wrote {dst} ") and "chunks (1, 3, 24, 180)" in captured.out
    assert "copy   [" in captured.err and "verify [" in captured.err and "5/5 samples" in captured.err
    back = _read_back(dst)
    assert back.dtype == np.dtype(dtype).newbyteorder("=") and back.shape == (5,) + SHAPE
    for i, s in enumerate(samples):
        assert _bits_equal(s, back[i]), i
    assert sorted(os.listdir(tmp_path)) == sorted(["src", "out" + suffix])  # no partial copy left


def test_single_npy_and_hdf5_to_zarr(tmp_path, capsys):
    a = np.arange(2 * 6 * 10, dtype=np.float64).reshape(2, 6, 10)
    np.save(tmp_path / "one.npy", a)
    assert main(["convert", str(tmp_path / "one.npy"), str(tmp_path / "one.h5"), "--mesh", "mp=2",
                 "--shard", "mp=1", "--no-progress"]) == 0
    assert capsys.readouterr().err == ""
    back = _read_back(str(tmp_path / "one.h5"))
    assert back.shape == (1, 2, 6, 10) and np.array_equal(back[0], a)
    # HDF5 (samples along axis 0) -> Zarr, explicit chunks
    with h5py.File(tmp_path / "ts.h5", "w") as f:
        f.create_dataset("fields", data=np.stack([a, a + 1, a * 3]), chunks=(3, 1, 6, 10))
    assert main(["convert", str(tmp_path / "ts.h5"), str(tmp_path / "ts.zarr"), "--mesh", "mp=2", "--shard", "mp=2",
                 "--chunks", "1,2,3,5", "--name", "x", "--no-progress"]) == 0
    z = zarr.open_array(str(tmp_path / "ts.zarr"), path="x", mode="r")
    assert z.chunks == (1, 2, 3, 5) and np.array_equal(z[...], np.stack([a, a + 1, a * 3]))


@pytest.mark.parametrize("suffix", [".h5", ".zarr"])
def test_innermost_split_reads_its_window_after_conversion(tmp_path, capsys, suffix):
    src = str(tmp_path / "src")
    samples = _samples(src, n=3)
    dst = str(tmp_path / ("out" + suffix))
    assert main(["convert", src, dst, "--mesh", "mp=4", "--shard", "mp=2", "--no-progress"]) == 0
    mesh = MeshInfo((4,), ("mp",))
    for rank in range(4):
        region = Layout(mesh.with_rank(rank), shard={"mp": 2}).region(SHAPE)
        before = IOStats()
        read_npy_window(os.path.join(src, "s000.npy"), region, stats=before)
        after = IOStats()
        for i in range(3):
            if suffix == ".h5":
                from dali_mesh.formats.hdf5 import open_hdf5_dataset, read_hdf5_window

                f, ds = open_hdf5_dataset(dst, "data")
                with f:
                    w = read_hdf5_window(ds, region, prefix=(i,), stats=after)
            else:
                from dali_mesh.formats.zarr import open_zarr_array, read_zarr_window

                w = read_zarr_window(open_zarr_array(dst, "data"), region, prefix=(i,), stats=after)
            assert _bits_equal(samples[i][region.window_slices], w)
        assert before.bytes_read > 3 * before.window_bytes  # the .npy: every page holds every rank's columns
        assert after.bytes_read <= 1.05 * after.window_bytes, (rank, after)


def test_existing_dst_is_refused_unless_overwrite(tmp_path, capsys):
    src = str(tmp_path / "src")
    samples = _samples(src, n=2, shape=(2, 4, 8))
    dst = tmp_path / "out.h5"
    dst.write_bytes(b"precious")
    argv = ["convert", src, str(dst), "--mesh", "mp=2", "--shard", "mp=2", "--no-progress"]
    assert main(argv) == 2
    assert "exists: pass --overwrite" in capsys.readouterr().err
    assert dst.read_bytes() == b"precious"
    assert main(argv + ["--overwrite"]) == 0
    assert _bits_equal(samples[1], _read_back(str(dst))[1])
    # a folder that is not a Zarr store is never removed
    folder = tmp_path / "keep.zarr"
    folder.mkdir()
    (folder / "mine.txt").write_text("x")
    assert main(["convert", src, str(folder), "--mesh", "mp=2", "--shard", "mp=2", "--overwrite"]) == 2
    assert "never removed" in capsys.readouterr().err and (folder / "mine.txt").read_text() == "x"
    # a Zarr store is replaced with --overwrite
    z = str(tmp_path / "z.zarr")
    assert main(["convert", src, z, "--mesh", "mp=2", "--shard", "mp=2", "--no-progress"]) == 0
    assert main(["convert", src, z, "--mesh", "mp=1", "--shard", "mp=2", "--no-progress", "--overwrite"]) == 0
    assert zarr.open_array(z, path="data", mode="r").chunks == (1, 2, 4, 8)


@pytest.mark.parametrize("argv,message", [
    (["{src}", "{tmp}/out.npy", "--mesh", "mp=2", "--shard", "mp=2"], "must end in .h5, .hdf5 or .zarr"),
    (["{src}", "{tmp}/no/out.h5", "--mesh", "mp=2", "--shard", "mp=2"], "does not exist"),
    (["{tmp}/nothing", "{tmp}/out.h5", "--mesh", "mp=2", "--shard", "mp=2"], "SRC '{tmp}/nothing' does not exist"),
    (["{src}", "{tmp}/out.h5", "--mesh", "mp=2", "--shard", "mp=5"], "axis 5 is out of range"),
    (["{src}", "{tmp}/out.h5", "--mesh", "mp=2", "--shard", "mp=2", "--chunks", "1,2"], "give 4 positive sizes"),
    (["{src}", "{tmp}/out.h5", "--mesh", "mp=2", "--shard", "mp=2", "--workers", "0"], "must be at least 1"),
    (["{src}", "{tmp}/out.h5", "--mesh", "mp=2", "--shard", "mp=2", "--dataset", "x"], ".npy files have none"),
    (["{mixed}", "{tmp}/out.h5", "--mesh", "mp=2", "--shard", "mp=2"], "every file must hold samples of one shape"),
])
def test_convert_errors_one_line_exit_2(tmp_path, capsys, argv, message):
    src = str(tmp_path / "src")
    _samples(src, n=2, shape=(2, 4, 8))
    mixed = tmp_path / "mixed"
    _samples(str(mixed), n=2, shape=(2, 4, 8))
    np.save(mixed / "s999.npy", np.zeros((2, 4, 9), np.float32))
    fill = {"{src}": src, "{tmp}": str(tmp_path), "{mixed}": str(mixed)}

    def sub(s):
        for k, v in fill.items():
            s = s.replace(k, v)
        return s

    with pytest.raises(SystemExit) if "--workers" in argv else _nullcontext():
        assert main(["convert"] + [sub(a) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and sub(message) in err, err
    assert sorted(os.listdir(tmp_path)) == ["mixed", "src"]


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# ---- a Zarr store written by convert is read without naming its one array -------------------------------
def test_convert_zarr_then_read_without_a_name(tmp_path, capsys):
    zarr = pytest.importorskip("zarr")
    from dali_mesh.cli import main
    from dali_mesh.io import MissingArrayError
    from dali_mesh.formats.zarr import open_zarr_array

    a = np.arange(2 * 3 * 8 * 16, dtype="<f4").reshape(2, 3, 8, 16)
    for i in range(2):
        np.save(tmp_path / f"s{i}.npy", a[i])
    out = str(tmp_path / "o.zarr")
    assert main(["convert", str(tmp_path), out, "--mesh", "mp=4", "--shard", "mp=2", "--no-progress"]) == 0
    assert main(["plan", "--data", out, "--mesh", "mp=4", "--shard", "mp=2"]) == 0
    assert "1.00x the window bytes" in capsys.readouterr().out
    layout = Layout(MeshInfo((4,), ("mp",), (2,)), shard={"mp": 2})
    src = ZarrSource([out], None, layout, batch_size=1, shuffle=False)
    for i in range(2):
        np.testing.assert_array_equal(src.read_sample(i)[0], take_window(a[i], src.region))
    # a root group of several arrays: refused, listing them
    g = zarr.open_group(str(tmp_path / "two.zarr"), mode="w")
    g.create_array("a", shape=(2, 3), dtype="f4")
    g.create_array("b", shape=(2, 3), dtype="f4")
    with pytest.raises(MissingArrayError, match=r"holding 2 arrays \['a', 'b'\]: name the one to read"):
        open_zarr_array(str(tmp_path / "two.zarr"))


# ---- issue 19: convert never deletes data it did not write -----------------------------------------
@pytest.mark.parametrize("argv,message", [
    (["--name", ""], "--name '': give one plain name"),
    (["--name", "../escape"], "--name '../escape': give one plain name"),
    (["--chunks", "1,2,4,100000"], "100000 cells on axis 3 is larger than the data (8)"),
])
def test_convert_names_and_chunks_one_line_exit_2(tmp_path, capsys, argv, message):
    """An empty name, a name with a path, chunks larger than the data (Zarr tried to allocate
    1.86 TiB): one line, exit 2, nothing written."""
    src = str(tmp_path / "src")
    _samples(src, n=2, shape=(2, 4, 8))
    assert main(["convert", src, str(tmp_path / "out.zarr"), "--mesh", "mp=2", "--shard", "mp=2",
                 "--no-progress"] + argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and message in err, err
    assert sorted(os.listdir(tmp_path)) == ["src"]


def test_overwrite_of_a_dst_that_holds_the_source_is_refused(tmp_path, capsys):
    """convert SRC DST --overwrite with SRC inside DST deleted the source."""
    dst = tmp_path / "all.zarr"
    src = str(dst / "samples")
    samples = _samples(src, n=2, shape=(2, 4, 8))
    (dst / "zarr.json").write_text('{"zarr_format": 3, "node_type": "group", "attributes": {}}')
    assert main(["convert", src, str(dst), "--mesh", "mp=2", "--shard", "mp=2", "--no-progress", "--overwrite"]) == 2
    assert "holds the source" in capsys.readouterr().err
    assert _bits_equal(samples[1], np.load(os.path.join(src, "s001.npy")))


def test_a_dst_that_appears_during_the_copy_is_left_alone(tmp_path, capsys, monkeypatch):
    """A folder created at DST while the copy runs (no --overwrite) was removed and replaced, even a
    folder that is not a Zarr store."""
    from dali_mesh.cli import convert as conv

    src = str(tmp_path / "src")
    _samples(src, n=2, shape=(2, 4, 8))
    dst = tmp_path / "out.zarr"
    real = conv._verify

    def verify_then_someone_writes(*a, **k):
        real(*a, **k)
        dst.mkdir()
        (dst / "theirs.txt").write_text("x")

    monkeypatch.setattr(conv, "_verify", verify_then_someone_writes)
    assert main(["convert", src, str(dst), "--mesh", "mp=2", "--shard", "mp=2", "--no-progress"]) == 2
    assert "exists" in capsys.readouterr().err
    assert (dst / "theirs.txt").read_text() == "x" and sorted(os.listdir(dst)) == ["theirs.txt"]
    assert sorted(os.listdir(tmp_path)) == ["out.zarr", "src"]  # no partial copy left


def _convert_script(src, dst, extra=""):
    return f"""
        import signal, sys
        {extra}
        from dali_mesh.cli import main
        sys.exit(main(["convert", {src!r}, {dst!r}, "--mesh", "mp=2", "--shard", "mp=2", "--no-progress",
                       "--workers", "1"]))
    """


@pytest.mark.timeout(120)
@pytest.mark.parametrize("suffix", [".h5", ".zarr"])
def test_a_full_disk_is_one_line_exit_2_and_no_partial_copy(tmp_path, suffix):
    """Writes that fail (the file size limit stands in for a full disk: EFBIG): one line, exit 2, the
    partial copy removed, and the process exits cleanly (HDF5 chained two tracebacks and then crashed
    with SIGSEGV at exit; Zarr printed an 80-line traceback)."""
    src = str(tmp_path / "src")
    _samples(src, n=4, shape=(2, 64, 256))
    dst = str(tmp_path / f"out{suffix}")
    size = 200_000 if suffix == ".h5" else 20_000  # (Zarr: each chunk is its own file, 64 KiB here)
    limit = f"""import resource
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, ({size}, {size}))"""
    proc = run_python(_convert_script(src, dst, limit), timeout=100, cwd=str(tmp_path))
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    err = proc.stderr.strip()
    assert "\n" not in err and err.startswith("dali-mesh: error: convert failed writing the copy"), err
    assert sorted(os.listdir(tmp_path)) == ["src"]


@pytest.mark.timeout(120)
def test_sigterm_removes_the_partial_copy_and_sigkill_leftovers_go_next_time(tmp_path):
    """SIGTERM: the partial copy is removed, one line, no traceback; SIGKILL leaves one behind, and
    the next convert of that DST removes it (a 72 MiB .DST.partial-PID stayed for ever)."""
    import signal as sig
    import subprocess
    import sys
    import time

    from tests.helpers import ROOT

    src = str(tmp_path / "src")
    _samples(src, n=40, shape=(2, 64, 256))
    dst = str(tmp_path / "out.h5")
    slow = """import numpy as np, time
        from dali_mesh.cli import convert as c
        real = c.SampleReader.read
        c.SampleReader.read = lambda self, i: (time.sleep(0.2), real(self, i))[1]"""
    for signum in (sig.SIGTERM, sig.SIGKILL):
        env = dict(os.environ, PYTHONPATH=ROOT)
        import textwrap
        proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_convert_script(src, dst, slow))],
                                cwd=str(tmp_path), env=env, stderr=subprocess.PIPE, text=True)
        partial = tmp_path / f".out.h5.partial-{proc.pid}"
        end = time.monotonic() + 60
        while not partial.exists():
            assert proc.poll() is None and time.monotonic() < end, proc.stderr.read() if proc.poll() else "slow"
            time.sleep(0.05)
        proc.send_signal(signum)
        err = proc.communicate(timeout=60)[1].strip()
        if signum == sig.SIGTERM:
            assert proc.returncode == 130 and err == "dali-mesh: convert interrupted; the partial copy is removed", err
            assert not partial.exists()
        else:
            assert partial.exists()
    fast = run_python(_convert_script(src, dst), timeout=100, cwd=str(tmp_path))
    assert fast.returncode == 0, fast.stderr[-2000:]
    assert sorted(os.listdir(tmp_path)) == ["out.h5", "src"]
