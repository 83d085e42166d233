"""The reader's fetch plan (csrc/reader/fetch_plan.h): which requests fetch a chunk's wanted byte ranges
given a store's latency and bandwidth. Its decisions on recorded links (a local file, S3 at 20 and 50 ms, a
Ceph S3 at 0.3 s), a fuzz of its invariants against interval arithmetic on the wanted ranges (every wanted
byte fetched, sorted and disjoint requests, over-read bounded, no gap read that costs more than the request
it saves), and the latency a remote store measures from its own requests."""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dali_mesh._kernels import KernelsError, merge_gap, plan_requests

KIB, MIB = 1 << 10, 1 << 20
LOCAL_GAP = 64 * KIB  # what a local file's reads merged before the model, and still do

#: recorded links: (latency s, bytes/s); 0 bytes/s: not measured yet
LOCAL = (0.0, 0.0)
S3_20MS = (0.020, 100e6)
S3_50MS = (0.050, 1e9)
CEPH = (0.300, 50e6)
UNMEASURED = (0.050, 0.0)

#: three ranges with gaps of 100 KiB and 500 KiB: 11.4 MiB wanted, so at most 730 KiB may be over-read
THREE = [(0, 4 * MIB), (4 * MIB + 100 * KIB, 8 * MIB), (8 * MIB + 512 * KIB, 12 * MIB)]
#: a band of a whole field in four levels (rank 1 of 4 of a Blosc chunk's blocks): 1 MiB every 4 MiB
BAND = [(k * 4 * MIB + MIB, k * 4 * MIB + 2 * MIB) for k in range(4)]


@pytest.mark.parametrize("link,gap", [(LOCAL, LOCAL_GAP), (UNMEASURED, LOCAL_GAP), ((0.002, 100e6), 200_000),
                                      (S3_20MS, 2_000_000), (S3_50MS, 50_000_000), (CEPH, 15_000_000)])
def test_the_gap_worth_reading_is_latency_times_bandwidth_at_least_the_local_one(link, gap):
    assert merge_gap(*link) == gap


@pytest.mark.parametrize("link,want", [
    # nothing to save on a local file, nor before the bandwidth is known: only gaps under 64 KiB
    (LOCAL, THREE),
    (UNMEASURED, THREE),
    # 2 ms at 100 MB/s: 200 KB arrive while a request waits; the 100 KiB gap is read, the 500 KiB one not
    ((0.002, 100e6), [(0, 8 * MIB), (8 * MIB + 512 * KIB, 12 * MIB)]),
    # 20 ms, 50 ms, 0.3 s: both gaps cost less than a request, and 612 KiB over 11.4 MiB is within 1/16
    (S3_20MS, [(0, 12 * MIB)]),
    (S3_50MS, [(0, 12 * MIB)]),
    (CEPH, [(0, 12 * MIB)]),
])
def test_decisions_on_recorded_links(link, want):
    assert plan_requests(THREE, *link) == want


@pytest.mark.parametrize("link", [LOCAL, S3_20MS, S3_50MS, CEPH])
def test_a_band_of_a_whole_field_is_never_read_whole(link):
    """Four 1 MiB ranges 3 MiB apart: at 50 ms and 1 GB/s each gap costs less than a request, but reading
    them would fetch 9 MiB more than the 4 MiB wanted: the bytes bound (1/16) keeps them four requests
    (sent together: one round trip all the same)."""
    assert plan_requests(BAND, *link) == BAND


@pytest.mark.parametrize("link", [LOCAL, S3_20MS, CEPH])
def test_gaps_under_the_local_gap_are_always_read(link):
    wanted = [(0, 100), (100, 200), (300, 400), (300 + LOCAL_GAP + 400, 300 + LOCAL_GAP + 500)]
    assert plan_requests(wanted, *link) == [(0, 400), (300 + LOCAL_GAP + 400, 300 + LOCAL_GAP + 500)]


def test_the_narrowest_gaps_are_read_first_within_the_bound():
    """4 MiB wanted in four 1 MiB ranges, 256 KiB may be over-read; gaps of 100, 150 and 120 KiB: the
    100 and 120 KiB gaps are read (220 KiB), the 150 KiB one then no more fits (left to right, 100 + 150
    would have been read instead)."""
    r = MIB
    starts = [0, r + 100 * KIB, 2 * r + 250 * KIB, 3 * r + 370 * KIB]
    wanted = [(s, s + r) for s in starts]
    assert plan_requests(wanted, *S3_20MS) == [(0, 2 * r + 100 * KIB), (starts[2], 4 * r + 370 * KIB)]


def test_ranges_that_are_not_sorted_and_disjoint_are_refused():
    with pytest.raises(KernelsError, match=r"sorted, disjoint and non-empty \(range 1: \[5, 20\)\)"):
        plan_requests([(0, 10), (5, 20)], *LOCAL)
    with pytest.raises(KernelsError, match="latency_s and bytes_per_s must be >= 0"):
        plan_requests([(0, 10)], -1.0, 0.0)


def _wanted(draw_gaps_and_lengths):
    out, at = [], 0
    for gap, length in draw_gaps_and_lengths:
        at += gap
        out.append((at, at + length))
        at += length
    return out


_sizes = st.one_of(st.integers(0, 300), st.integers(0, 200 * KIB), st.integers(0, 8 * MIB))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(parts=st.lists(st.tuples(_sizes, _sizes.map(lambda n: n + 1)), min_size=1, max_size=40),
       latency=st.one_of(st.just(0.0), st.floats(0, 1)), rate=st.one_of(st.just(0.0), st.floats(0, 1e10)))
def test_requests_cover_exactly_the_wanted_ranges(parts, latency, rate):
    """Interval arithmetic on the wanted ranges is the oracle: the requests are sorted and disjoint, each
    starts and ends where a wanted range does (no byte before the first or after the last), every wanted
    range lies in one; the gaps read are the wanted ranges' gaps that a request holds, none as wide as the
    link's merge gap, and those of 64 KiB or more add up to at most 1/16 of the wanted bytes."""
    wanted = _wanted(parts)
    got = plan_requests(wanted, latency, rate)
    assert all(lo < hi for lo, hi in got)
    assert all(a[1] < b[0] for a, b in zip(got, got[1:]))
    starts, ends = {lo for lo, _ in wanted}, {hi for _, hi in wanted}
    assert all(lo in starts and hi in ends for lo, hi in got)
    for lo, hi in wanted:
        assert sum(1 for a, b in got if a <= lo and hi <= b) == 1
    gaps = [b[0] - a[1] for a, b in zip(wanted, wanted[1:])]
    read = [g for g, (a, b) in zip(gaps, zip(wanted, wanted[1:])) if any(x <= a[1] and b[0] <= y for x, y in got)]
    assert all(g < max(LOCAL_GAP, merge_gap(latency, rate)) for g in read)
    wanted_bytes = sum(hi - lo for lo, hi in wanted)
    assert sum(g for g in read if g >= LOCAL_GAP) <= wanted_bytes // 16
    assert sum(hi - lo for lo, hi in got) == wanted_bytes + sum(read)


def test_a_remote_store_measures_its_latency_and_bandwidth_from_its_own_requests(tmp_path):
    """The benchmarks' parallel S3 server sleeps 50 ms before each answer's first byte: the median time to
    the first byte the store measured is at least that (the server's own cost and the machine's load only
    add), and a 1 MiB body gives a rate; nothing is measured before the first request."""
    from dali_mesh._kernels import store_round_trip
    from dali_mesh.storage import store_of
    from dali_mesh.storage.remote import have_native_http
    from tests.storage.request_log import LoggingS3Server
    from tests.storage.s3_server import options

    if not have_native_http():
        pytest.skip("this build has no libcurl")
    (tmp_path / "bench").mkdir()
    data = bytes(range(256)) * (4 * KIB)
    (tmp_path / "bench" / "obj.bin").write_bytes(data)
    with LoggingS3Server(root=str(tmp_path), latency=0.05) as server:
        store, _ = store_of("s3://bench/obj.bin", options(server.endpoint))
        assert store_round_trip(store.spec) == (0.0, 0.0)
        for k in range(3):
            assert store.read_range("bench/obj.bin", k * 1000, 300) == data[k * 1000:k * 1000 + 300]
        assert store.read_range("bench/obj.bin", 0, MIB) == data[:MIB]
        latency, rate = store_round_trip(store.spec)
    assert 0.05 <= latency < 5 and rate > 0
    assert merge_gap(latency, rate) == max(LOCAL_GAP, int(latency * rate))


# ---- a whole-field Blosc Zarr read in parts from the parallel S3 server: round trips per step ---------------
#: each answer's first byte waits this long: requests sent together overlap, requests sent after another's
#: answer do not, whatever the machine's load (tests/storage/request_log.py round_trips)
LATENCY = 0.05
#: steps of 4 MiB decoded, in blocks of 512 KiB (c-blosc's choice): rank 1 of 4 takes one of each level's two
SHAPE = (5, 4, 512, 512)


def _blosc_globe(root, noisy_step=None):
    """Whole-field Blosc(lz4) Zarr v2 (a chunk per step) of smooth fields, written with one Blosc thread (its
    blocks stored in order: every chunk's layout is the last one's, scaled); ``noisy_step``'s field is noise
    (its first levels noise, the rest zeros: a chunk whose blocks lie elsewhere, so the guess from the
    step before it is wrong, and its own guess wrong for the step after)."""
    import numcodecs
    import zarr
    from numcodecs import blosc

    lat = np.linspace(-1.5, 1.5, SHAPE[2])[:, None]
    lon = np.linspace(0, 6.28, SHAPE[3], endpoint=False)[None, :]
    rng = np.random.default_rng(7)
    data = np.empty(SHAPE, np.float32)
    for t in range(SHAPE[0]):
        for c in range(SHAPE[1]):
            data[t, c] = 250 + 40 * np.cos(lat) + 5 * np.sin(3 * lon + 0.2 * t + c) + rng.normal(size=SHAPE[2:]) * 0.05
    if noisy_step is not None:  # its first levels noise, the others zeros: blocks of very unequal sizes
        data[noisy_step, :2] = rng.normal(size=(2,) + SHAPE[2:]) * 1e3
        data[noisy_step, 2:] = 0
    threads = blosc.get_nthreads() if hasattr(blosc, "get_nthreads") else None
    blosc.set_nthreads(1)
    try:
        z = zarr.create_array(root / "bench" / "globe.zarr", shape=SHAPE, chunks=(1,) + SHAPE[1:], dtype="f4",
                              zarr_format=2,
                              compressors=numcodecs.Blosc("lz4", 5, numcodecs.Blosc.SHUFFLE))
        z[:] = data
    finally:
        if threads:
            blosc.set_nthreads(threads)
    return data


def _reads_over_s3(root, locations, layout, reads) -> list[tuple[int, int, int]]:
    """``reads`` (``(sample id, its whole field)``, in turn) by the native reader without reading ahead, from
    the tests' S3 server at :data:`LATENCY` over the folder ``root``, each window checked against numpy's
    (``take_window`` of the field); per read: ``(round trips, requests, bytes asked)``."""
    from dali_mesh import ZarrSource, _kernels
    from dali_mesh.partition import take_window
    from dali_mesh.pipeline import native
    from dali_mesh.storage.remote import have_native_http
    from tests.storage.request_log import LoggingS3Server, round_trips
    from tests.storage.s3_server import options

    if not have_native_http():
        pytest.skip("this build has no libcurl")
    out = []
    with LoggingS3Server(root=str(root), latency=LATENCY) as server:
        src = ZarrSource(locations, None, layout, shuffle=False, storage_options=options(server.endpoint))
        path = native.plan_windows(src)[0].write(str(root / "plan"))
        with _kernels.PlanReader(path, "f4", read_ahead=0) as reader:
            server.take_log()
            for sid, field in reads:
                np.testing.assert_array_equal(reader.read([sid])[0][0], take_window(field, src.region),
                                              err_msg=f"sample {sid}")
                log = server.take_log()
                asked = sum(int(b) - int(a) + 1 for a, b in (r.range[6:].split("-") for r in log
                                                              if r.range.startswith("bytes=")))
                out.append((round_trips(log, LATENCY), len(log), asked))
    return out


def test_a_batch_read_ahead_takes_the_layout_its_reader_learnt(tmp_path):
    """The readers of the batches read ahead share their reader's layouts: step 0 read (its header, then its
    blocks) places the blocks of step 1, read ahead on its own reader, in one round trip (each reader
    learning on its own took two for every batch in flight at an epoch's start); the windows are
    zarr-python's."""
    import zarr

    from dali_mesh import Layout, MeshInfo, ZarrSource, _kernels
    from dali_mesh.partition import take_window
    from dali_mesh.pipeline import native
    from dali_mesh.storage.remote import have_native_http
    from tests.storage.request_log import LoggingS3Server, round_trips
    from tests.storage.s3_server import options

    if not have_native_http():
        pytest.skip("this build has no libcurl")
    (tmp_path / "bench").mkdir()
    _blosc_globe(tmp_path)
    oracle = zarr.open_array(str(tmp_path / "bench" / "globe.zarr"), mode="r")[:]
    with LoggingS3Server(root=str(tmp_path), latency=LATENCY) as server:
        layout = Layout(MeshInfo((4,), ("mp",), (1,)), shard={"mp": 1})
        src = ZarrSource(["s3://bench/globe.zarr"], None, layout, shuffle=False,
                         storage_options=options(server.endpoint))
        path = native.plan_windows(src)[0].write(str(tmp_path / "plan"))
        with _kernels.PlanReader(path, "f4", read_ahead=1) as reader:
            server.take_log()
            first = reader.read([0])[0][0]
            assert round_trips(server.take_log(), LATENCY) == 2  # its header, then its blocks
            assert reader.read_ahead([1])
            second = reader.read([1])[0][0]  # waits for the batch read ahead, and takes it
            log = server.take_log()
            assert reader.ahead_counts()[0] == 1
    assert round_trips(log, LATENCY) == 1, [(r.method, r.range, round(r.start - log[0].start, 3)) for r in log]
    np.testing.assert_array_equal(first, take_window(oracle[0], src.region))
    np.testing.assert_array_equal(second, take_window(oracle[1], src.region))


@pytest.mark.parametrize("noisy_step", [None, 2])
def test_a_whole_field_blosc_step_takes_one_round_trip_when_the_guess_holds(tmp_path, noisy_step):
    """The first step reads its chunk's header, then its blocks; every later step sends the header with the
    blocks the last chunk's layout places, in one round trip. A chunk whose blocks lie elsewhere (noise and
    zeros among smooth fields) is read from a wrong guess in 2 round trips; the next ones, after a guess
    that did not hold, whole in one where the link's measured bandwidth makes the extra bytes cheaper than
    a round trip (else in parts again), until a layout holds again; every window is zarr-python's."""
    import zarr

    from dali_mesh import Layout, MeshInfo

    (tmp_path / "bench").mkdir()
    _blosc_globe(tmp_path, noisy_step)
    oracle = zarr.open_array(str(tmp_path / "bench" / "globe.zarr"), mode="r")[:]
    # rank 1 of 4 (latitude split), one step at a time, every window zarr-python's
    trips = [turns for turns, _, _ in _reads_over_s3(tmp_path, ["s3://bench/globe.zarr"],
                                                     Layout(MeshInfo((4,), ("mp",), (1,)), shard={"mp": 1}),
                                                     enumerate(oracle))]
    assert trips[0] <= 2, trips  # its header, then its blocks
    if noisy_step is None:
        assert trips[1:] == [1] * (SHAPE[0] - 1), trips
    else:  # read from the smooth chunk's layout: its blocks are not where it says
        assert trips[1:noisy_step + 1] == [1] * (noisy_step - 1) + [2], trips
        # then whole in one round trip, or (where the link measured slow: a loaded machine) in parts in two
        assert all(k in (1, 2) for k in trips[noisy_step + 1:]), trips


@pytest.mark.parametrize("names", [("500", "850"), ("a500", "a850")])
def test_arrays_with_numbers_for_names_keep_their_own_layouts(tmp_path, names):
    """Two arrays of one group named by pressure levels ("500", "850": the same dtype, chunks and compressor,
    so one coder), their chunks' blocks laid out differently, read in turn: each read after the first of an
    array sends its header with the blocks its OWN last chunk places, one round trip and about the band's
    bytes. Their keys' stems were once both "p.zarr" (every number stripped as a chunk coordinate), each
    array's read placed by the other's layout, and from then on every chunk read whole (8x the bytes) or in
    two round trips; the same data under names without numbers is the control. Windows are numpy's."""
    import numcodecs
    import zarr
    from numcodecs import blosc

    from dali_mesh import Layout, MeshInfo

    shape = (3, 4, 512, 512)
    rng = np.random.default_rng(7)
    lat = np.linspace(-1.5, 1.5, shape[2])[:, None]
    lon = np.linspace(0, 6.28, shape[3], endpoint=False)[None, :]
    smooth = (250 + 40 * np.cos(lat) + 5 * np.sin(3 * lon) + rng.normal(size=shape) * 0.05).astype("f4")
    other = np.zeros(shape, np.float32)  # its first levels noise, the rest zeros: its blocks lie elsewhere
    other[:, :2] = rng.normal(size=(shape[0], 2) + shape[2:]) * 1e3
    data = dict(zip(names, (smooth, other)))
    threads = blosc.get_nthreads() if hasattr(blosc, "get_nthreads") else None
    blosc.set_nthreads(1)
    try:
        for name, x in data.items():
            z = zarr.create_array(tmp_path / "bench" / "p.zarr" / name, shape=shape, chunks=(1,) + shape[1:],
                                  dtype="f4", zarr_format=2,
                                  compressors=numcodecs.Blosc("lz4", 5, numcodecs.Blosc.SHUFFLE))
            z[:] = x
    finally:
        if threads:
            blosc.set_nthreads(threads)
    chunk = max(os.path.getsize(tmp_path / "bench" / "p.zarr" / n / "0.0.0.0") for n in names)
    reads = _reads_over_s3(tmp_path, [f"s3://bench/p.zarr/{n}" for n in names],
                           Layout(MeshInfo((4,), ("mp",), (1,)), shard={"mp": 1}),
                           [(k * shape[0] + t, data[name][t]) for t in range(shape[0]) for k, name in enumerate(names)])
    assert all(trips <= 2 for trips, _, _ in reads[:2]), reads  # each array's first: its header, then its blocks
    assert all(trips == 1 for trips, _, _ in reads[2:]), reads
    assert all(asked * 4 < chunk * 3 for _, _, asked in reads), (reads, chunk)  # whole: 1.0x


def test_a_chunk_whose_blocks_spare_nothing_is_read_whole_in_one_round_trip(tmp_path):
    """Blosc(zlib, 5) chunks of 4 MiB in c-blosc's 1 MiB blocks, half of the rows and a halo of 2 for rank 1 of
    2: the ranges cover less than three quarters of a chunk (so it may be read in parts) but touch 3 of its 4
    blocks (so its decode is the whole chunk's). The first chunk's header shows it; every later chunk of the
    array is read whole in one round trip (each once took its header, then the rest: two). Windows: numpy's."""
    import numcodecs
    import zarr

    from dali_mesh import Layout, MeshInfo

    shape = (3, 1024, 1024)
    data = (np.random.default_rng(1).normal(size=shape) * 3 + 250).round(2).astype("f4")
    z = zarr.create_array(tmp_path / "bench" / "a.zarr", shape=shape, chunks=(1,) + shape[1:], dtype="f4",
                          zarr_format=2, compressors=numcodecs.Blosc("zlib", 5, numcodecs.Blosc.SHUFFLE))
    z[:] = data
    reads = _reads_over_s3(tmp_path, ["s3://bench/a.zarr"],
                           Layout(MeshInfo((2,), ("mp",), (1,)), shard={"mp": 0}, halo={0: 2}), enumerate(data))
    trips = [(turns, requests) for turns, requests, _ in reads]
    assert trips[0][0] <= 2 and trips[1:] == [(1, 1)] * (shape[0] - 1), trips


def test_a_chunk_of_other_blocks_than_the_guess_is_learnt_from(tmp_path):
    """An array whose first chunks have 1 MiB blocks (a band and its halo spare none of them: read whole at
    once) and whose later chunks, written by another writer, have 64 KiB blocks: the first of those is read
    whole by the old guess and shows its own layout, and the array's reads go back to parts (a guess kept
    from the old blocks once read every later chunk whole). Windows: numpy's."""
    import numcodecs
    import zarr

    from dali_mesh import Layout, MeshInfo

    shape = (5, 1024, 1024)
    data = (np.random.default_rng(2).normal(size=shape) * 3 + 250).round(2).astype("f4")
    folder = tmp_path / "bench" / "a.zarr"
    z = zarr.create_array(folder, shape=shape, chunks=(1,) + shape[1:], dtype="f4", zarr_format=2,
                          compressors=numcodecs.Blosc("zlib", 5, numcodecs.Blosc.SHUFFLE))
    z[:] = data
    small = numcodecs.Blosc("zlib", 5, numcodecs.Blosc.SHUFFLE, blocksize=1 << 16)
    for t in range(2, shape[0]):  # the later steps: another writer's blocks
        (folder / f"{t}.0.0").write_bytes(small.encode(np.ascontiguousarray(data[t])))
    sizes = [os.path.getsize(folder / f"{t}.0.0") for t in range(shape[0])]
    fetched = [asked for _, _, asked in _reads_over_s3(
        tmp_path, ["s3://bench/a.zarr"], Layout(MeshInfo((2,), ("mp",), (1,)), shard={"mp": 0}, halo={0: 2}),
        enumerate(data))]
    assert fetched[1] == sizes[1] and fetched[2] == sizes[2], (fetched, sizes)  # whole: the 1 MiB blocks' guess
    # step 3 from step 2's layout, a guess that had not held: whole where the link makes it cheaper than a
    # round trip, else in parts; step 4 from a layout that held: in parts
    assert fetched[4] * 4 < sizes[4] * 3, (fetched, sizes)
