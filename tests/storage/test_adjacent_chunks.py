"""Chunks of one file at adjacent byte ranges fetched in one request (issues 42 and 43): a batch's chunks
that lie next to each other in one object-store file (an HDF5 file's chunks referenced by kerchunk, a set
of chunks packed into files) are fetched by one ranged GET per run of neighbours, counted at the
benchmarks' S3 server (tests/storage/request_log.py), and every window still equals h5py's / numpy's; a
gap wider than the round-trip model reads splits a run; a file truncated or replaced after the plan is an
error naming it; a fuzz of the grouping over chunks placed at random in a few files."""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import SEED, mesh_of
from tests.storage.request_log import LoggingS3Server
from tests.storage.s3_server import options

pytest.importorskip("kerchunk")

#: gaps under this are read rather than sent as a request of their own, whatever the store
#: (csrc/reader/fetch_plan.h kLocalGap)
LOCAL_GAP = 64 << 10
#: each answer's latency: a merged request is one GET whatever the machine's load
LATENCY = 0.02
BUCKET = "bench"


pytestmark = pytest.mark.usefixtures("kernels_library")


@pytest.fixture
def server(tmp_path):
    (tmp_path / BUCKET).mkdir()
    with LoggingS3Server(root=str(tmp_path), latency=LATENCY) as s:
        yield s


def _source(server, refs: str, rank: int, ranks: int = 2, halo: int = 1):
    from dali_mesh import Layout, ZarrSource

    layout = Layout(mesh_of((1, ranks), (0, rank)), shard={"m0": 0}, halo={0: halo})  # a sample's rows
    return ZarrSource([f"reference://{refs}"], "x", layout, batch_size=2, shuffle=False,
                      storage_options=options(server.endpoint))


def _reader(src, folder):
    """The kernels library's reader of ``src``'s native plan (no read ahead: a batch's requests are its own)."""
    from dali_mesh import _kernels
    from dali_mesh.pipeline import native

    (plan,) = native.plan_windows(src)
    return _kernels.PlanReader(plan.write(str(folder)), plan.dtype, outputs=1, read_ahead=0)


def _runs(spans: list[tuple[str, int, int]]) -> list[tuple[str, int, int]]:
    """The requests that fetch ``spans`` (file, offset, length) when neighbours closer than LOCAL_GAP are
    fetched together and nothing else is: ``(file, first byte, last byte)`` as a Range header names them."""
    out: list[list] = []
    for f, off, n in sorted(set(spans)):
        if out and out[-1][0] == f and off - out[-1][2] - 1 < LOCAL_GAP:
            out[-1][2] = max(out[-1][2], off + n - 1)
        else:
            out.append([f, off, off + n - 1])
    return [tuple(r) for r in out]


def _gets(log) -> list[tuple[str, int, int]]:
    """The ranged GETs of ``log`` as ``(file, first byte, last byte)``."""
    out = []
    for r in log:
        assert r.method == "GET" and r.range.startswith("bytes="), r
        lo, hi = r.range.removeprefix("bytes=").split("-")
        out.append((r.key.removeprefix(f"{BUCKET}/"), int(lo), int(hi)))
    return sorted(out)


def _needed(refs: dict, steps, rows: tuple[int, int], chunk_rows: int, name: str = "x"):
    """``(file, offset, length)`` of the chunks of ``steps`` that rows ``[rows)`` touch, from the set."""
    out = []
    for t in steps:
        for i in range(rows[0] // chunk_rows, (rows[1] - 1) // chunk_rows + 1):
            url, off, n = refs["refs"][f"{name}/{t}.{i}.0"]
            out.append((url.removeprefix(f"s3://{BUCKET}/"), off, n))
    return out


# ---- an HDF5 file's gzip + shuffle chunks, referenced by kerchunk ---------------------------------------
def _h5_set(tmp_path, x, chunks) -> tuple[str, dict]:
    """``x`` as an HDF5 file of gzip + shuffle chunks in the bucket, and its kerchunk set naming it by
    ``s3://``: ``(set path, references)``."""
    import h5py
    from kerchunk.hdf import SingleHdf5ToZarr

    path = tmp_path / BUCKET / "f.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=x, chunks=chunks, compression="gzip", shuffle=True)
    refs = SingleHdf5ToZarr(str(path), inline_threshold=0).translate()
    refs["refs"] = {k: [f"s3://{BUCKET}/f.h5", *v[1:]] if isinstance(v, list) else v for k, v in refs["refs"].items()}
    out = tmp_path / "f.json"
    out.write_text(json.dumps(refs))
    return str(out), refs


def test_each_run_of_adjacent_chunks_is_one_get_and_the_windows_equal_h5py(server, tmp_path):
    """Chunks of (1, 64, 512) float32 (~110 KiB each, noise: gzip keeps most of it): a rank's window with
    its halo touches 3 of a step's 4 chunks, which lie next to each other in the file; the fourth (the
    other rank's) lies between two steps' and is wider than the 1/16 over-read the model allows. So a
    batch of two steps is two GETs, each of its step's three chunks, not six."""
    import h5py

    from dali_mesh.partition import take_window

    x = np.random.default_rng(SEED).standard_normal((4, 256, 512)).astype("<f4")
    refs_path, refs = _h5_set(tmp_path, x, (1, 64, 512))
    with h5py.File(tmp_path / BUCKET / "f.h5", "r") as f:
        oracle = f["x"][...]
    for rank in range(2):
        src = _source(server, refs_path, rank)
        r = src.region
        rows = (max(r.window_start[0], r.domain_start[0]), min(r.window_stop[0], r.domain_stop[0]))
        with _reader(src, tmp_path) as reader:
            for ids in ([0, 1], [2, 3]):
                server.take_log()
                (wins,) = reader.read(ids, threads=2)
                gets = _gets(server.take_log())
                for t, w in zip(ids, wins):
                    np.testing.assert_array_equal(w, take_window(oracle[t], src.region),
                                                  err_msg=f"rank {rank}, step {t}, seed {SEED}")
                want = _runs(_needed(refs, ids, rows, 64))
                assert gets == want, f"rank {rank}, batch {ids}: {gets} != {want}"
                assert len(gets) == 2  # one per step: the other rank's chunk between them is not read


def test_a_file_truncated_or_replaced_after_the_plan_is_named(server, tmp_path):
    x = np.random.default_rng(SEED).standard_normal((2, 64, 128)).astype("<f4")
    refs_path, _ = _h5_set(tmp_path, x, (1, 16, 128))
    path = tmp_path / BUCKET / "f.h5"
    data = path.read_bytes()
    src = _source(server, refs_path, 0)
    with _reader(src, tmp_path) as reader:
        reader.read([0, 1], threads=2)  # the chunks of both steps, merged, read as planned
        path.write_bytes(data[: len(data) // 2])
        with pytest.raises(Exception, match=r"f\.h5.*(truncated|changed|replaced|modified)"):
            reader.read([0, 1], threads=2)
        path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # the same size, another version
        with pytest.raises(Exception, match=r"f\.h5.*(changed|replaced|modified)"):
            reader.read([0, 1], threads=2)
        path.write_bytes(data)


# ---- chunks packed into files at chosen places ----------------------------------------------------------
def _zlib_chunks(x, chunks) -> tuple[dict, dict]:
    """A Zarr v2 array of ``x`` (zlib chunks) written by zarr-python: ``(metadata texts, chunk bytes)`` by key."""
    import zarr
    from numcodecs import Zlib

    written: dict = {}
    zarr.create_array(zarr.storage.MemoryStore(written), shape=x.shape, chunks=chunks, dtype=x.dtype.str,
                      zarr_format=2, compressors=Zlib(level=1))[:] = x
    meta = {f"x/{k}": v.to_bytes().decode() for k, v in written.items() if k.startswith(".")}
    return meta, {f"x/{k}": v.to_bytes() for k, v in written.items() if not k.startswith(".")}


def _pack(folder, meta, blobs, placement, gaps, seed) -> str:
    """The chunks ``blobs`` written into files ``p<i>.bin`` of the bucket: ``placement`` lists ``(file,
    key)`` in the order they are written, ``gaps[k]`` random bytes before the k-th; the set naming their
    ranges by ``s3://``."""
    rng = np.random.default_rng(seed)
    files: dict[int, bytearray] = {}
    refs = dict(meta)
    for (f, key), gap in zip(placement, gaps):
        blob = files.setdefault(f, bytearray())
        blob += rng.bytes(gap)
        refs[key] = [f"s3://{BUCKET}/p{f}.bin", len(blob), len(blobs[key])]
        blob += blobs[key]
    for f, blob in files.items():
        (folder / BUCKET / f"p{f}.bin").write_bytes(bytes(blob))
    out = folder / "packed.json"
    out.write_text(json.dumps({"version": 1, "refs": refs}))
    return str(out)


def test_a_gap_wider_than_the_model_reads_splits_a_run(server, tmp_path):
    """One step's four chunks of (1, 8, 64) int32 in one file: the first two touching, 100 bytes before
    the third (read: under the local gap), 1 MiB before the fourth (far more than 1/16 of the wanted
    bytes: a request of its own)."""
    from dali_mesh.partition import take_window

    x = np.random.default_rng(SEED).integers(0, 1000, (1, 32, 64)).astype("<i4")
    meta, blobs = _zlib_chunks(x, (1, 8, 64))
    keys = [f"x/0.{i}.0" for i in range(4)]
    refs_path = _pack(tmp_path, meta, blobs, [(0, k) for k in keys], [0, 0, 100, 1 << 20], SEED)
    refs = json.loads(open(refs_path).read())["refs"]
    src = _source(server, refs_path, 0, ranks=1, halo=0)
    with _reader(src, tmp_path) as reader:
        server.take_log()
        (wins,) = reader.read([0], threads=2)
        gets = _gets(server.take_log())
    np.testing.assert_array_equal(wins[0], take_window(x[0], src.region))
    first, third, fourth = refs[keys[0]], refs[keys[2]], refs[keys[3]]
    assert gets == [("p0.bin", first[1], third[1] + third[2] - 1), ("p0.bin", fourth[1], fourth[1] + fourth[2] - 1)]


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    (root / BUCKET).mkdir()
    with LoggingS3Server(root=str(root), latency=0) as s:
        yield root, s


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_fuzz_chunks_placed_at_random_in_a_few_files_are_each_read_from_their_range(fuzz_server, data):
    """Chunks of a (3, 24, 16) int32 array placed in 1-3 files in a random order with random gaps (0, a few
    bytes, under and over the local gap): every window of every rank equals numpy's (a chunk decoded from
    another's bytes fails or differs), and every GET begins at a chunk's first byte and ends at a chunk's
    last (nothing fetched beyond the chunks a batch needs)."""
    from dali_mesh.partition import take_window

    root, server = fuzz_server
    seed = data.draw(st.integers(0, 2**31 - 1), label="seed")
    x = np.random.default_rng(seed).integers(0, 1 << 20, (3, 24, 16)).astype("<i4")
    meta, blobs = _zlib_chunks(x, (1, 4, 16))
    keys = data.draw(st.permutations(sorted(blobs)), label="order")
    n_files = data.draw(st.integers(1, 3), label="files")
    placement = [(data.draw(st.integers(0, n_files - 1)), k) for k in keys]
    gaps = [data.draw(st.sampled_from([0, 0, 0, 7, 300, 40_000, 70_000])) for _ in keys]
    for f in range(3):
        (root / BUCKET / f"p{f}.bin").unlink(missing_ok=True)
    refs_path = _pack(root, meta, blobs, placement, gaps, seed)
    refs = json.loads(open(refs_path).read())["refs"]
    starts = {(v[0].removeprefix(f"s3://{BUCKET}/"), v[1]) for k, v in refs.items() if isinstance(v, list)}
    ends = {(v[0].removeprefix(f"s3://{BUCKET}/"), v[1] + v[2] - 1) for k, v in refs.items() if isinstance(v, list)}
    ranks = data.draw(st.integers(1, 3), label="ranks")
    for rank in range(ranks):
        src = _source(server, refs_path, rank, ranks=ranks, halo=data.draw(st.integers(0, 2), label="halo"))
        with _reader(src, root) as reader:
            server.take_log()
            (wins,) = reader.read([0, 1, 2], threads=2)
            for f, lo, hi in _gets(server.take_log()):
                assert (f, lo) in starts and (f, hi) in ends, (f, lo, hi)
        for t in range(3):
            np.testing.assert_array_equal(wins[t], take_window(x[t], src.region),
                                          err_msg=f"rank {rank} of {ranks}, step {t}, seed {seed}")
