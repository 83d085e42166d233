"""Which chunks of a batch (read whole) one request fetches together: the reader's decision
(csrc/reader/fetch_plan.h ChunkRuns, through dali_mesh_chunk_runs), on the link ``dali-mesh plan`` counts for
a store not measured yet (it counts by the reader's own code, csrc/reader/fetch_epoch.h) and at measured
links, against the contract checked by brute force: every chunk in at most one run, a run's chunks of one file in
offset order inside one request of the file's wanted ranges (PlanRequests at the file's link), a run at
most ``max_bytes`` from its first byte to its last, and a run cut only where the next chunk would pass it."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dali_mesh._kernels import KernelsError, chunk_runs, plan_requests

KIB, MIB = 1 << 10, 1 << 20
LOCAL_GAP = 64 * KIB
MAX_MERGED_REQUEST = 64 * MIB  # fetch_plan.h kMaxMergedRequest: the reader's own (max_bytes 0)

#: (latency s, bytes/s): a local file; a remote store not measured yet; a 2 ms link (200 KB merge gap); S3 at
#: 20 ms (2 MB); a Ceph S3 at 0.3 s (15 MB)
LOCAL, UNMEASURED, LAN, S3_20MS, CEPH = (0.0, 0.0), (0.05, 0.0), (0.002, 100e6), (0.020, 100e6), (0.300, 50e6)
LINKS = [LOCAL, UNMEASURED, LAN, S3_20MS, CEPH]


def estimate(spans, max_bytes=MAX_MERGED_REQUEST):
    """The runs ``dali-mesh plan`` counts for a batch on a store not measured yet: the reader's ChunkRuns at
    that link (the epoch counter calls it, fetch_epoch.h), its request bound set to ``max_bytes``."""
    n_files = 1 + max((f for f, _, _ in spans), default=0)
    return chunk_runs(spans, [UNMEASURED] * n_files, max_bytes)


def check_contract(spans, runs, costs, max_bytes):
    """The contract of fetch_plan.h ChunkRuns, by brute force over the chunks: each request of a file is
    found by scanning the file's requests for the one holding the chunk."""
    costs = costs or [LOCAL] * (1 + max((f for f, _, _ in spans), default=0))
    placed = [k for run in runs for k in run]
    assert len(placed) == len(set(placed)), f"a chunk in two runs: {runs}"
    assert all(len(run) >= 2 for run in runs)
    assert all(spans[k][2] > 0 for k in placed), "a chunk of 0 bytes fetched"
    # the file's requests: PlanRequests over its wanted ranges (touching and overlapping chunks merged)
    requests = {}
    for f in {f for f, _, n in spans if n > 0}:
        wanted = []
        for lo, hi in sorted((o, o + n) for g, o, n in spans if g == f and n > 0):
            if wanted and lo <= wanted[-1][1]:
                wanted[-1] = (wanted[-1][0], max(wanted[-1][1], hi))
            else:
                wanted.append((lo, hi))
        requests[f] = plan_requests(wanted, *costs[f])

    def request_of(k):
        f, o, n = spans[k]
        holding = [r for r, (lo, hi) in enumerate(requests[f]) if lo <= o and o + n <= hi]
        assert len(holding) == 1, f"chunk {k} {spans[k]} lies in requests {holding} of {requests[f]}"
        return f, holding[0]

    def span_of(ks):
        return max(spans[k][1] + spans[k][2] for k in ks) - min(spans[k][1] for k in ks)

    for run in runs:
        assert len({request_of(k) for k in run}) == 1, f"run {run} crosses requests"
        assert [spans[k] for k in run] == sorted(spans[k] for k in run), f"run {run} not in offset order"
        assert span_of(run) <= max_bytes, f"run {run} spans {span_of(run)} > {max_bytes}"
    # runs in file and offset order
    firsts = [(spans[run[0]], run[0]) for run in runs]
    assert firsts == sorted(firsts)
    # every request's chunks, in file and offset order (ties: by index), are its runs and lone chunks one
    # after another, each cut where the next chunk would take the run past max_bytes
    run_of = {k: i for i, run in enumerate(runs) for k in run}
    alive = sorted((k for k, s in enumerate(spans) if s[2] > 0), key=lambda k: (spans[k], k))
    segments = []
    for k in alive:
        same = segments and request_of(segments[-1][-1]) == request_of(k)
        if same and k in run_of and run_of.get(segments[-1][-1]) == run_of[k]:
            segments[-1].append(k)
        else:
            segments.append([k])
    assert [s for s in segments if len(s) >= 2] == runs, "a run's chunks are not one after another"
    for a, b in zip(segments, segments[1:]):
        if request_of(a[-1]) == request_of(b[0]):
            assert span_of(a + [b[0]]) > max_bytes, f"{a} and {b} lie in one request and fit {max_bytes}: cut"


# ---- explicit cases -----------------------------------------------------------------------------------

def test_the_headers_example():
    """fetch_plan.h: file 0's three touching chunks in one request; file 1's 50-byte chunks 1 MiB apart alone."""
    spans = [(0, 0, 100), (0, 100, 200), (0, 300, 50), (1, 0, 50), (1, MIB, 50)]
    assert chunk_runs(spans) == [[0, 1, 2]] == estimate(spans)


def test_touching_overlapping_and_duplicate_chunks_are_one_run_in_offset_order():
    """Two keys of one range (3 and 1), a chunk inside another (2 in 0), and one touching the last: one run,
    the duplicates in index order."""
    spans = [(0, 1000, 500), (0, 5000, 10), (0, 1100, 100), (0, 5000, 10), (0, 5010, 1)]
    assert chunk_runs(spans) == [[0, 2, 1, 3, 4]] == estimate(spans)


@pytest.mark.parametrize("gap,runs", [(LOCAL_GAP - 1, [[0, 1]]), (LOCAL_GAP, [])])
def test_a_gap_under_the_local_gap_is_read_one_of_64_kib_is_not(gap, runs):
    spans = [(0, 0, 10), (0, 10 + gap, 10)]
    assert chunk_runs(spans) == runs == estimate(spans)
    assert chunk_runs(spans, [UNMEASURED]) == runs


def test_a_measured_link_reads_wider_gaps():
    """Two 4 MiB chunks 200 KiB apart: a local file or an unmeasured store fetches them alone; at 20 ms and
    100 MB/s (a 2 MB merge gap, 200 KiB within 1/16 of 8 MiB) one request; the estimate is of an unmeasured
    link (dali-mesh plan on a store not measured yet)."""
    spans = [(0, 0, 4 * MIB), (0, 4 * MIB + 200 * KIB, 4 * MIB)]
    assert chunk_runs(spans, [LOCAL]) == chunk_runs(spans, [UNMEASURED]) == [] == estimate(spans)
    assert chunk_runs(spans, [S3_20MS]) == [[0, 1]]


def test_a_run_longer_than_max_bytes_is_cut_between_chunks():
    """Five 20 MiB chunks side by side: 64 MiB holds three, the next run two; at max_bytes 30 MiB: pairs
    cut at one chunk each, the fifth alone."""
    spans = [(0, k * 20 * MIB, 20 * MIB) for k in range(5)]
    assert chunk_runs(spans) == [[0, 1, 2], [3, 4]] == estimate(spans)
    assert chunk_runs(spans, max_bytes=64 * MIB) == chunk_runs(spans)
    assert chunk_runs(spans, max_bytes=40 * MIB) == [[0, 1], [2, 3]] == estimate(spans, 40 * MIB)
    assert chunk_runs(spans, max_bytes=40 * MIB - 1) == [] == estimate(spans, 40 * MIB - 1)


def test_zero_byte_chunks_are_in_no_run_and_break_none():
    spans = [(0, 0, 10), (0, 10, 0), (0, 10, 10), (0, 5, 0)]
    assert chunk_runs(spans) == [[0, 2]] == estimate(spans)


def test_after_a_cut_the_next_run_reads_the_gap_its_request_reads():
    """A 150 KB chunk, one inside it, and one 20 KB past its end (so 70 KB past the inner one's): one wanted
    request (a 20 KB gap); max_bytes 100 KB cuts after the first, and the inner one and the last (70 KB
    apart, 70,010 bytes) are one run: the reader reads the gap its request reads, not a new gap from the
    inner chunk's end. The estimate measured the gap from the run's last end and fetched them alone."""
    spans = [(0, 0, 150_000), (0, 100_000, 10), (0, 170_000, 10)]
    assert chunk_runs(spans, max_bytes=100_000) == [[1, 2]] == estimate(spans, 100_000)


def test_int64_large_offsets():
    top = (1 << 63) - 1
    spans = [(0, top - 30, 10), (0, top - 20, 20), (1, 1 << 62, 5), (1, (1 << 62) + 5, 5)]
    assert chunk_runs(spans) == [[0, 1], [2, 3]] == estimate(spans)


def test_bad_spans_and_costs_are_refused_with_the_chunk_named():
    with pytest.raises(KernelsError, match=r"chunk 1: offset 9223372036854775800 and 8 bytes .* within int64"):
        chunk_runs([(0, 0, 1), (0, (1 << 63) - 8, 8)])
    with pytest.raises(KernelsError, match=r"chunk 0: offset -1 and 5 bytes must be >= 0"):
        chunk_runs([(0, -1, 5)])
    with pytest.raises(KernelsError, match=r"chunk 1's file 2 is not one of the 2 files"):
        chunk_runs([(0, 0, 5), (2, 0, 5)], [LOCAL, LOCAL])
    with pytest.raises(KernelsError, match=r"must be >= 0, not -1.000000 and 0.000000 \(file 1\)"):
        chunk_runs([(0, 0, 5)], [LOCAL, (-1.0, 0.0)])
    with pytest.raises(KernelsError, match="max_bytes must be >= 0"):
        chunk_runs([(0, 0, 5)], max_bytes=-1)


# ---- the fuzz -------------------------------------------------------------------------------------------

#: gaps around the local gap and the links' merge gaps (200 KB, 2 MB, 15 MB), overlaps (negative), touching
_gaps = st.one_of(st.just(0), st.integers(-300, 300), st.sampled_from([LOCAL_GAP - 1, LOCAL_GAP, 199_999, 200_001]),
                  st.integers(LOCAL_GAP - 50, LOCAL_GAP + 50), st.integers(0, 3 * MIB), st.integers(0, 16 * MIB),
                  st.integers(-4 * MIB, 0))
_sizes = st.one_of(st.just(0), st.integers(1, 300), st.integers(1, 200 * KIB), st.integers(1, 8 * MIB),
                   st.integers(1, 40 * MIB))
#: the byte every file's chunks start after: small, or near the end of int64 (room for 40 chunks of at most
#: 40 MiB and their gaps)
_backs = st.one_of(st.just(0.0), st.floats(0, 1))
_bases = st.one_of(st.just(0), st.integers(0, 1 << 40), st.integers((1 << 63) - (1 << 33), (1 << 63) - (1 << 32)))


@st.composite
def _batches(draw):
    """Chunks of up to four files, each file's laid out from a base by gaps (touching, overlapping, below
    and above the merge gaps), some starting inside the chunk before (``back``: that fraction of it from its
    end), and sizes (0 bytes among them), some repeated (two keys of one range), then shuffled:
    ``[(file, offset, nbytes), ...]``."""
    spans = []
    for f in range(draw(st.integers(1, 4))):
        at, size = draw(_bases), 0
        for gap, back, next_size in draw(st.lists(st.tuples(_gaps, _backs, _sizes), max_size=12)):
            at = max(0, at - int(back * size) + gap)
            size = next_size
            spans.append((f, at, size))
            at += size
    spans += draw(st.lists(st.sampled_from(spans), max_size=4)) if spans else []
    return draw(st.permutations(spans))


_max_bytes = st.one_of(st.just(0), st.integers(1, 300), st.integers(LOCAL_GAP, 2 * MIB), st.integers(1, 80 * MIB))


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spans=_batches(), max_bytes=_max_bytes)
@example(spans=[(0, 0, 150_000), (0, 100_000, 10), (0, 170_000, 10)], max_bytes=100_000)
def test_the_estimate_is_the_readers_runs_on_an_unmeasured_link(spans, max_bytes):
    """The planner's count (the reader's ChunkRuns on an unmeasured link) is its ChunkRuns on a local file and on a
    remote store not measured yet (the link the estimate assumes), run for run and chunk for chunk."""
    n_files = 1 + max((f for f, _, _ in spans), default=0)
    bound = max_bytes or MAX_MERGED_REQUEST
    want = estimate(spans, bound)
    assert chunk_runs(spans, None, max_bytes) == want
    assert chunk_runs(spans, [UNMEASURED] * n_files, max_bytes) == want


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spans=_batches(), max_bytes=_max_bytes, links=st.lists(st.sampled_from(LINKS), min_size=4, max_size=4))
def test_the_readers_runs_keep_their_contract_at_every_link(spans, max_bytes, links):
    """The reader's runs against the brute-force contract, each file at its own link."""
    n_files = 1 + max((f for f, _, _ in spans), default=0)
    costs = links[:n_files]
    runs = chunk_runs(spans, costs, max_bytes)
    check_contract(spans, runs, costs, max_bytes or MAX_MERGED_REQUEST)
    # a measured link's requests join local ones, so it never sends more (docs/remote-storage.md: a real epoch
    # sends at most the requests `dali-mesh plan` prints): a request per run and per chunk alone
    alive = sum(1 for _, _, n in spans if n > 0)
    local = chunk_runs(spans, None, max_bytes)
    assert alive - sum(len(r) - 1 for r in runs) <= alive - sum(len(r) - 1 for r in local)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spans=_batches(), max_bytes=_max_bytes)
def test_the_estimate_keeps_the_contract(spans, max_bytes):
    """The estimate checked on its own against the brute-force contract (a local link), so that a defect
    shared by both sides of the differential test cannot hide."""
    bound = max_bytes or MAX_MERGED_REQUEST
    check_contract(spans, estimate(spans, bound), None, bound)
