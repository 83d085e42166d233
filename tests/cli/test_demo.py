"""`dali-mesh demo`: it never overwrites files it did not write, and bad input is one line, exit 2."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from dali_mesh.cli import main
from dali_mesh.cli.demo import MARKER, write_synthetic


def _one_line_error(capsys, argv, message):
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert "\n" not in err and err.startswith("dali-mesh: error: ") and message in err, err
    assert "Traceback" not in captured.out + captured.err
    return err


def test_demo_refuses_to_overwrite_a_foreign_sample(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    os.makedirs("demo_data")
    foreign = tmp_path / "demo_data" / "sample_00000.npy"
    np.save(foreign, np.arange(7, dtype=np.int16))
    before = foreign.read_bytes()
    _one_line_error(capsys, ["demo", "--nproc", "2", "--mesh", "model_parallel=2", "--samples", "4",
                             "--shape", "2,8,8"], "demo_data holds files the demo did not write (sample_00000.npy)")
    assert foreign.read_bytes() == before
    assert sorted(os.listdir(tmp_path / "demo_data")) == ["sample_00000.npy"]


def test_write_synthetic_marks_its_folder_and_keeps_foreign_files(tmp_path):
    folder = str(tmp_path / "d")
    files = write_synthetic(folder, 3, (2, 4, 6))
    record = json.load(open(os.path.join(folder, MARKER)))
    assert set(record["written"]) == {os.path.basename(f) for f in files} | {"meta.json"}
    first = np.load(files[0])
    assert first.shape == (2, 4, 6) and first.dtype == np.float32
    # its own folder is reused (same data), and rewritten for another shape
    assert write_synthetic(folder, 3, (2, 4, 6)) == files
    np.testing.assert_array_equal(np.load(files[0]), first)
    write_synthetic(folder, 3, (2, 4, 8))
    assert np.load(files[0]).shape == (2, 4, 8)
    # a file the demo did not write, dropped into its folder under a name it would use: refused, kept
    foreign = os.path.join(folder, "sample_00003.npy")
    np.save(foreign, np.ones(3))
    data = open(foreign, "rb").read()
    from dali_mesh.cli.options import UsageError

    with pytest.raises(UsageError, match="sample_00003.npy was not written by the demo"):
        write_synthetic(folder, 4, (2, 4, 8))
    assert open(foreign, "rb").read() == data
    # a folder with other files and no marker is refused; an empty one is taken
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="holds files the demo did not write"):
        write_synthetic(str(other), 1, (1, 2, 2))
    assert sorted(os.listdir(other)) == ["notes.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert len(write_synthetic(str(empty), 1, (1, 2, 2))) == 1


@pytest.fixture
def data_dir(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    return d


def test_demo_data_mixed_shapes(data_dir, capsys):
    np.save(data_dir / "a.npy", np.zeros((2, 8, 8), np.float32))
    np.save(data_dir / "b.npy", np.zeros((2, 8, 9), np.float32))
    _one_line_error(capsys, ["demo", "--data", str(data_dir)], f"{data_dir / 'b.npy'} holds samples of (2, 8, 9) float32")


def test_demo_data_mixed_dtypes(data_dir, capsys):
    np.save(data_dir / "a.npy", np.zeros((2, 8, 8), np.float32))
    np.save(data_dir / "b.npy", np.zeros((2, 8, 8), np.float64))
    _one_line_error(capsys, ["demo", "--data", str(data_dir)], "float64 but")


def test_demo_data_truncated_file(data_dir, capsys):
    np.save(data_dir / "a.npy", np.zeros((2, 8, 8), np.float32))
    np.save(data_dir / "b.npy", np.zeros((2, 8, 8), np.float32))
    with open(data_dir / "b.npy", "r+b") as f:
        f.truncate(200)
    err = _one_line_error(capsys, ["demo", "--data", str(data_dir)], "b.npy")
    assert "trunc" in err.lower() or "short" in err.lower() or "size" in err.lower(), err


def test_demo_data_not_a_data_file(tmp_path, capsys):
    notes = tmp_path / "notes.txt"
    notes.write_text("hello")
    _one_line_error(capsys, ["demo", "--data", str(notes)], "is neither a file or store of a known format (.npy, .h5")
    _one_line_error(capsys, ["demo", "--data", str(tmp_path / "missing")], "does not exist")


@pytest.mark.parametrize("argv,message", [
    (["--workers", "0"], "argument --workers: '0' must be at least 1"),
    (["--timeout", "0"], "argument --timeout: '0' must be a finite number of seconds above 0"),
    (["--timeout", "nan"], "argument --timeout: 'nan'"),
    (["--nproc", "-1"], "argument --nproc: '-1' must be at least 1"),
    (["--batch-size", "x"], "argument --batch-size: 'x' is not an integer"),
])
def test_demo_bad_numbers(argv, message, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "dali_mesh.cli", "demo"] + argv, capture_output=True, text=True,
                          cwd=tmp_path, timeout=60)
    assert proc.returncode == 2
    err = proc.stderr.strip()
    assert "\n" not in err and message in err, err
    assert os.listdir(tmp_path) == []  # nothing written


@pytest.mark.timeout(150)
def test_demo_external_hdf5_refused_unless_allowed(tmp_path, capsys, monkeypatch):
    """--data on an HDF5 file whose dataset is an external link: one line naming the link by default;
    with --allow-external the demo reads the linked data and verifies every window against it."""
    h5py = pytest.importorskip("h5py")
    x = np.arange(4 * 2 * 8 * 6, dtype=np.float32).reshape(4, 2, 8, 6)
    with h5py.File(tmp_path / "other.h5", "w") as f:
        f.create_dataset("pad", data=np.full(1000, 7, np.float32))
        f.create_dataset("x", data=x)
    with h5py.File(tmp_path / "main.h5", "w") as f:
        f.create_dataset("decoy", data=-np.ones((4, 2, 8, 6), np.float32))
        f["x"] = h5py.ExternalLink(str(tmp_path / "other.h5"), "/x")
    argv = ["demo", "--data", str(tmp_path / "main.h5"), "--dataset", "x", "--nproc", "2",
            "--mesh", "model_parallel=2", "--shard", "model_parallel=1", "--batch-size", "1", "--timeout", "120"]
    _one_line_error(capsys, argv, "external link")
    out = _demo_ok(capsys, tmp_path, monkeypatch, argv + ["--allow-external"])
    assert out.strip().splitlines()[-1].endswith("all 4 samples verified"), out


def _demo_ok(capsys, tmp_path, monkeypatch, argv):
    """The demo run in this process (its ranks fork from the launcher's fork server, started once for
    the suite, instead of a new interpreter importing torch and starting one): exit 0; its stdout."""
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 0, captured.out + captured.err
    return captured.out


@pytest.mark.timeout(150)
@pytest.mark.parametrize("share", ["group"])
def test_demo_on_a_compressed_zarr_store_reads_natively(tmp_path, share, capsys, monkeypatch):
    """dali-mesh demo --data on a Blosc-compressed Zarr store: the native reader on every rank,
    every window verified against the store; with --share group, each sample read by one rank and the
    windows exchanged (through shared memory: the ranks are local). (Without --share the same demo path
    runs in tests/cli/test_end_to_end.py; one run here keeps CI short.)"""
    zarr = pytest.importorskip("zarr")
    numcodecs = pytest.importorskip("numcodecs")
    from dali_mesh import _kernels
    from dali_mesh.plan import CODECS

    if not _kernels.codec_available(CODECS["blosc"]):
        pytest.skip("this build of the reader has no c-blosc2")
    x = (np.sin(np.arange(4 * 2 * 16 * 12) / 30.0) * 100).astype(np.float32).reshape(4, 2, 16, 12)
    store = str(tmp_path / "era.zarr")
    z = zarr.create_array(store, shape=x.shape, chunks=(1, 2, 8, 12), dtype="f4", zarr_format=2,
                          compressors=numcodecs.Blosc("lz4", 5, 1))
    z[:] = x
    argv = ["demo", "--data", store, "--nproc", "2", "--mesh", "model_parallel=2", "--shard", "model_parallel=1",
            "--batch-size", "1", "--timeout", "120"] + (["--share", share] if share else [])
    out = _demo_ok(capsys, tmp_path, monkeypatch, argv)
    lines = out.strip().splitlines()
    assert any(line.startswith("reader: native") and "on every rank" in line for line in lines), out
    assert lines[-1].endswith("all 4 samples verified"), out
    shared = [line for line in lines if line.startswith("share: ")]
    assert bool(shared) == bool(share), out
    if share:
        assert "groups of 2 ranks" in shared[0] and "through shared memory" in shared[0], out


@pytest.mark.timeout(150)
@pytest.mark.parametrize("where", ["reference set", "zarr store"])
def test_demo_on_a_corrupt_chunk_is_one_line_exit_2(tmp_path, capsys, monkeypatch, where):
    """Issue 52: a corrupt chunk that only the ranks' reads find (a reference set read by partitioned_source,
    a Zarr store by the native reader) printed every rank's traceback and exited 1; ``plan`` says such an
    error in one line, exit 2. Now the demo does too, naming the ranks and the store."""
    zarr = pytest.importorskip("zarr")
    numcodecs = pytest.importorskip("numcodecs")
    store = tmp_path / "bad.zarr"
    z = zarr.create_array(str(store), shape=(4, 8, 8), chunks=(1, 8, 8), dtype="f4", zarr_format=2,
                          compressors=numcodecs.Zlib(1))
    z[:] = np.arange(256, dtype=np.float32).reshape(4, 8, 8)
    (store / "1.0.0").write_bytes(b"not a zlib stream")
    if where == "zarr store":
        data, name = str(store), "bad.zarr/1.0.0"
    else:  # a kerchunk set over the same files; chunk 2 refers to bytes past the end of its file (not native)
        refs = {k: (store / k).read_text() for k in (".zarray", ".zattrs") if (store / k).exists()}
        refs.update({f"{i}.0.0": [str(store / f"{i}.0.0"), 0, (store / f"{i}.0.0").stat().st_size] for i in range(4)})
        refs["2.0.0"][2] += 100
        (tmp_path / "refs.json").write_text(json.dumps({"version": 1, "refs": refs}))
        data, name = f"reference://{tmp_path / 'refs.json'}", f"reference://{tmp_path / 'refs.json'}"
    monkeypatch.chdir(tmp_path)
    err = _one_line_error(capsys, ["demo", "--data", data, "--nproc", "2", "--mesh", "model_parallel=2",
                                   "--shard", "model_parallel=1", "--batch-size", "1", "--timeout", "120"], name)
    assert "rank" in err and "corrupt" in err, err
