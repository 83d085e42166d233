"""``dali-mesh plan --data s3://...``: what one epoch fetches per rank (requests, round trips, bytes) and what
it costs, against two oracles: the sum over the rank's sample ids of ``PlanSet.item_requests`` /
``item_read_bytes`` one by one, and the requests and body bytes a real epoch sends (the kernels library's
fetch counters, every batch read natively by ``_kernels.PlanReader``) from a moto S3 server on 127.0.0.1.
Stores written by zarr-python (v2 Blosc, v3 sharded Zstd) and numpy (.npy)."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from dali_mesh import Layout, MeshInfo, NumpySource, ZarrSource, _kernels
from dali_mesh.cli import main
from dali_mesh.pipeline.native import plan_source
from dali_mesh.storage.remote import fetch_counters, have_native_http
from tests.storage.s3_server import s3_endpoint, s3_env, upload  # noqa: F401

pytestmark = pytest.mark.skipif(not have_native_http(), reason="this build has no libcurl")

SHAPE = (6, 2, 40, 24)  # samples of (level, lat, lon); 6 steps
# 4 ranks: 2 sample groups (dp) x 2 latitude bands (mp), halos of 3 rows: the bands' chunks overlap
MESH = ["--mesh", "dp=2,mp=2", "--batch", "dp", "--shard", "mp=1", "--halo", "1=3"]


def _layout(rank: int) -> Layout:
    mesh = MeshInfo((2, 2), ("dp", "mp")).with_rank(rank)
    return Layout(mesh, shard={"mp": 1}, batch=["dp"], halo={1: 3})


@pytest.fixture(scope="module")
def fields():
    return np.round(np.random.default_rng(41).normal(size=SHAPE), 2).astype("f4")


@pytest.fixture(scope="module")
def stores(s3_endpoint, fields, tmp_path_factory):  # noqa: F811
    """``name -> s3:// location`` of the stores of ``fields``."""
    import zarr
    from numcodecs import Blosc

    tmp = tmp_path_factory.mktemp("costs")
    blosc = [Blosc("lz4", 5, Blosc.SHUFFLE)]
    made = {
        # a chunk per step and 10 rows; chunks of 2 steps, which two samples of a batch share
        "v2-blosc": dict(chunks=(1, 2, 10, 24), zarr_format=2, compressors=blosc),
        "v2-blosc-2steps": dict(chunks=(2, 2, 10, 24), zarr_format=2, compressors=blosc),
        # shards of 3 steps and 20 rows, inner chunks of a step and 10 rows
        "v3-zstd": dict(chunks=(1, 2, 10, 24), shards=(3, 2, 20, 24), zarr_format=3,
                        compressors=[zarr.codecs.ZstdCodec(level=3)]),
    }
    out = {}
    for name, kw in made.items():
        z = zarr.create_array(tmp / f"{name}.zarr", shape=SHAPE, dtype="f4", **kw)
        z[:] = fields
        out[name] = upload(s3_endpoint, tmp / f"{name}.zarr", "data", f"costs/{name}.zarr")
    return out


def _plan_json(capsys, location, *extra) -> list[dict]:
    assert main(["plan", "--data", location, *MESH, "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def _real_epoch(src, batch_size: int):
    """``(requests, body bytes, sample ids, plans)`` of an epoch of ``src``'s pipeline (its group reader with
    ``share``), every batch of its own sample order read natively, counted by the fetch counters."""
    reader = src.group_reader()
    plans = plan_source(reader)
    ids = reader.sample_order(0).arrays()[0]
    path = plans.write()
    with _kernels.PlanReader(path, plans.dtype) as r:
        before = fetch_counters()
        for i in range(0, len(ids), batch_size):
            r.read(ids[i:i + batch_size])
        after = fetch_counters()
    return after[0] - before[0], after[1] - before[1], ids, plans


@pytest.mark.parametrize("name", ["v2-blosc", "v2-blosc-2steps", "v3-zstd"])
@pytest.mark.parametrize("share", [None, "group"])
@pytest.mark.parametrize("batch_size", [1, 2])
@pytest.mark.usefixtures("s3_env")
def test_an_epochs_requests_and_bytes_are_what_a_real_epoch_fetches(capsys, stores, name, share, batch_size):
    """Every rank's epoch as printed (``--json``) equals a real epoch of that rank's source, and with batches
    of one sample the sum over its sample ids of ``item_requests`` / ``item_read_bytes``."""
    extra = ["--batch-size", str(batch_size)] + (["--share", share] if share else [])
    rows = _plan_json(capsys, stores[name], *extra)
    assert [r["rank"] for r in rows] == [0, 1, 2, 3]
    for row in rows:
        src = ZarrSource([stores[name]], None, _layout(row["rank"]), shuffle=False, batch_size=batch_size,
                         share=share)
        requests, got, ids, plans = _real_epoch(src, batch_size)
        epoch = row["epoch_share" if share else "epoch"]
        assert (epoch["requests"], epoch["bytes"]) == (requests, got), (name, row["rank"], epoch)
        assert epoch["samples"] == len(ids) and epoch["batches"] == len(ids) // batch_size
        assert epoch["estimated_chunk_reads"] == 0  # chunks of 1-4 KiB: read whole
        assert epoch["round_trips"] == epoch["batches"] and epoch["max_round_trips_per_batch"] == 1
        if batch_size == 1 and name != "v3-zstd":  # a sample's reads, each chunk alone, as a local file's
            assert epoch["requests"] == sum(plans.item_requests(int(i)) for i in ids)
            assert epoch["bytes"] == sum(plans.item_read_bytes(int(i)) for i in ids)
        elif batch_size == 1:  # a shard's inner chunks lie side by side: fetched together, the gaps between too
            assert epoch["requests"] < sum(plans.item_requests(int(i)) for i in ids)


@pytest.mark.usefixtures("s3_env")
def test_a_chunk_two_samples_of_a_batch_need_is_fetched_once(capsys, stores):
    """Chunks of two steps, batches of steps (0, 1), (2, 3), (4, 5): each chunk once a batch, half the
    requests of reading the samples one by one, as a real epoch fetches them."""
    location = stores["v2-blosc-2steps"]
    assert main(["plan", "--data", location, "--mesh", "mp=2", "--shard", "mp=1", "--batch-size", "2", "--json"]) == 0
    for row in json.loads(capsys.readouterr().out):
        layout = Layout(MeshInfo((2,), ("mp",)).with_rank(row["rank"]), shard={"mp": 1})
        requests, got, ids, plans = _real_epoch(ZarrSource([location], None, layout, shuffle=False, batch_size=2), 2)
        assert list(ids) == [0, 1, 2, 3, 4, 5]
        assert (row["epoch"]["requests"], row["epoch"]["bytes"]) == (requests, got)
        assert 2 * requests == sum(plans.item_requests(int(i)) for i in ids)
        assert 2 * got == sum(plans.item_read_bytes(int(i)) for i in ids)


@pytest.mark.usefixtures("s3_env")
def test_printed_costs_are_the_prices_times_the_counts_and_share_saves(capsys, stores):
    """The text lines: each rank's cost is requests / 1000 * --get-price + bytes / 1e9 * --egress-price (its
    bytes from --json), all ranks add up, and the read groups' epoch costs less than every rank's own."""
    location = stores["v2-blosc"]
    prices = ["--get-price", "0.5", "--egress-price", "30"]
    rows = _plan_json(capsys, location, "--share", "group", *prices)
    assert main(["plan", "--data", location, *MESH, "--share", "group", *prices]) == 0
    out = capsys.readouterr().out
    assert "one epoch from the object store per rank" in out and "with share=group" in out
    assert "prices: $0.5 per 1,000 GET requests (--get-price), $30 per GB" in out
    ranks = re.findall(r"^  rank (\d+): \d+ samples? in \d+ batch(?:es)?: (\d+) requests?, (\d+) round trips? .*?"
                       r": \$([\d.,]+) GET \+ \$([\d.,]+) egress = \$([\d.,]+)$", out, re.M)
    assert len(ranks) == 8  # 4 ranks, then 4 with share
    totals = {}
    for k, (rank, requests, _, get, egress, total) in enumerate(ranks):
        key = "epoch" if k < 4 else "epoch_share"
        epoch = rows[int(rank)][key]
        assert int(requests) == epoch["requests"]
        want_get, want_egress = epoch["requests"] / 1000 * 0.5, epoch["bytes"] / 1e9 * 30
        assert (epoch["get_usd"], epoch["egress_usd"]) == pytest.approx((want_get, want_egress), rel=1e-12)
        for printed, want in ((get, want_get), (egress, want_egress), (total, want_get + want_egress)):
            assert float(printed.replace(",", "")) == pytest.approx(want, rel=6e-3), (printed, want)
        totals[key] = totals.get(key, 0) + want_get + want_egress
    all_ranks = re.findall(r"^  all 4 ranks: \d+ batch(?:es)?: (\d+) requests.*= \$([\d.,]+)$", out, re.M)
    assert [int(n) for n, _ in all_ranks] == [sum(r[k]["requests"] for r in rows) for k in ("epoch", "epoch_share")]
    assert [float(c) for _, c in all_ranks] == pytest.approx([totals["epoch"], totals["epoch_share"]], rel=6e-3)
    # the halos' rows are read once per group: fewer requests and bytes than every rank reading its own
    assert totals["epoch_share"] < totals["epoch"]
    saved = re.search(r"^share=group saves \$([\d.]+) an epoch over all ranks \((\d+)% of", out, re.M)
    assert float(saved.group(1)) == pytest.approx(totals["epoch"] - totals["epoch_share"], rel=6e-3)


@pytest.mark.usefixtures("s3_env")
def test_egress_inside_the_region_costs_nothing(capsys, stores):
    rows = _plan_json(capsys, stores["v3-zstd"], "--egress-price", "0")
    assert all(r["epoch"]["egress_usd"] == 0 and r["epoch"]["usd"] == r["epoch"]["get_usd"] > 0 for r in rows)
    assert all(r["epoch"]["get_price_per_1000"] == 0.0004 for r in rows)  # S3 Standard's default


@pytest.mark.usefixtures("s3_env")
def test_raw_npy_reads_are_counted_as_the_reader_splits_them(capsys, s3_endpoint, tmp_path):  # noqa: F811
    """.npy samples split on their innermost axis: each rank's rows are runs of 1 KiB with gaps between, in
    groups larger than a task (4 MiB: split) of more than 1024 buffers (several requests each)."""
    a = np.random.default_rng(5).normal(size=(2, 1400, 512)).astype("f4")  # 2.7 MiB a sample
    folder = tmp_path / "n"
    folder.mkdir()
    for i, s in enumerate(a):
        np.save(folder / f"{i}.npy", s)
    location = upload(s3_endpoint, folder, "data", "costs/npy")
    assert main(["plan", "--data", location, "--mesh", "mp=2", "--shard", "mp=1", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    for row in rows:
        layout = Layout(MeshInfo((2,), ("mp",)).with_rank(row["rank"]), shard={"mp": 1})
        src = NumpySource([f"{location}/{i}.npy" for i in range(2)], layout, shuffle=False)
        requests, got, ids, plans = _real_epoch(src, 1)
        assert (row["epoch"]["requests"], row["epoch"]["bytes"]) == (requests, got)
        # more than one request per sample (1400 runs and gaps: 2800 buffers), the gaps' bytes fetched too
        assert requests > 2 * len(ids) and got > sum(plans.item_read_bytes(int(i)) for i in ids)


@pytest.mark.usefixtures("s3_env")
def test_blosc_chunks_read_in_parts_are_estimated_near_a_real_epoch(capsys, s3_endpoint, tmp_path):  # noqa: F811
    """Whole-field Blosc chunks (blocks of 512 KiB, c-blosc's choice), 4 latitude bands with halos: where a
    band's blocks cover less than 3/4 of a chunk it is read in parts (a header and index, then the band's
    blocks of each level), elsewhere whole after its first 4 KiB (the array's next chunks whole in one
    request: the first showed their blocks spare nothing). Whole reads are counted exactly; reads in
    parts are estimated (blocks placed as if they compressed alike) within 5% of the bytes a real epoch
    fetches, or up to 1/16 more where the reader merged ranges by its measured link, and no fewer
    requests (the reader's guess of the blocks fetches the header with the first ones, and it merges);
    2 round trips a batch either way."""
    import zarr
    from numcodecs import Blosc

    a = np.round(np.random.default_rng(9).normal(size=(2, 4, 360, 720)), 1).astype("f4")  # compresses
    z = zarr.create_array(tmp_path / "w.zarr", shape=a.shape, chunks=(1, 4, 360, 720), dtype="f4", zarr_format=2,
                          compressors=[Blosc("lz4", 5, Blosc.SHUFFLE)])
    z[:] = a
    location = upload(s3_endpoint, tmp_path / "w.zarr", "data", "costs/w.zarr")
    assert main(["plan", "--data", location, "--mesh", "mp=4", "--shard", "mp=1", "--halo", "1=3", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    in_parts = 0
    for row in rows:
        layout = Layout(MeshInfo((4,), ("mp",)).with_rank(row["rank"]), shard={"mp": 1}, halo={1: 3})
        requests, got, ids, plans = _real_epoch(ZarrSource([location], None, layout, shuffle=False), 1)
        epoch, stored = row["epoch"], sum(int(c[2]) for c in plans.chunks)
        assert epoch["max_round_trips_per_batch"] == 2
        if epoch["estimated_chunk_reads"] == 0:  # read whole: its first 4 KiB, then the rest; the next ones at once
            assert (epoch["requests"], epoch["bytes"]) == (requests, got) == (len(ids) + 1, stored)
            assert epoch["round_trips"] == len(ids) + 1
            continue
        # the first chunk: its header and index, then its blocks; the next ones' blocks placed by the guess the
        # first one taught the reader (fetch_plan.h FetchChunk), fetched with their headers in one round trip
        assert len(ids) < epoch["round_trips"] <= 2 * len(ids)
        in_parts += 1
        assert epoch["estimated_chunk_reads"] == len(ids)
        # the estimate is a link not measured yet (gaps under 64 KiB merged); the reader, once it has measured
        # the server's latency and bandwidth, may read wider gaps instead of sending requests (fetch_plan.h
        # PlanRequests: at most 1/16 more bytes than the blocks)
        assert 1 <= requests <= epoch["requests"], (row["rank"], epoch, requests)
        assert 0.95 * epoch["bytes"] <= got <= (1 + 1 / 16) * 1.05 * epoch["bytes"], (row["rank"], epoch, got)
        assert got < 0.8 * stored  # a band's blocks (and its halo's), not the whole chunks
    assert in_parts >= 2


def test_a_local_store_prints_no_cost_lines(tmp_path, capsys, fields):
    import zarr

    z = zarr.create_array(tmp_path / "l.zarr", shape=SHAPE, chunks=(1, 2, 10, 24), dtype="f4", zarr_format=2)
    z[:] = fields
    assert main(["plan", "--data", str(tmp_path / "l.zarr"), *MESH, "--share", "group"]) == 0
    out = capsys.readouterr().out
    assert "object store" not in out and "$" not in out and "prices:" not in out
    rows = _plan_json(capsys, str(tmp_path / "l.zarr"))
    assert rows and all("epoch" not in r for r in rows)


@pytest.mark.parametrize("args, message", [
    (["--get-price", "-1"], "--get-price: '-1' is not a price in USD"),
    (["--egress-price", "nan"], "--egress-price: 'nan' is not a price in USD"),
    (["--batch-size", "0"], "--batch-size"),
])
def test_bad_prices_and_batch_sizes_are_refused(capsys, args, message):
    with pytest.raises(SystemExit) as e:
        main(["plan", "--shape", "4,8", "--mesh", "mp=2", *args])
    assert e.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--get-price", "--egress-price", "--batch-size"])
def test_the_epoch_flags_go_with_data(capsys, flag):
    assert main(["plan", "--shape", "4,8", "--mesh", "mp=2", flag, "1"]) == 2
    assert f"{flag} goes with --data" in capsys.readouterr().err


@pytest.mark.usefixtures("s3_env")
def test_one_rank_shown_and_a_mesh_too_large_to_add_up(capsys, stores, monkeypatch):
    """``--rank R`` prints that rank's epoch and still all ranks' (their JSON rows added up); above
    MAX_EPOCH_RANKS the total says it was not added up."""
    from dali_mesh.cli import advice

    location = stores["v3-zstd"]
    rows = _plan_json(capsys, location)
    assert main(["plan", "--data", location, *MESH, "--rank", "2"]) == 0
    out = capsys.readouterr().out
    assert re.search(rf"^  rank 2: 3 samples in 3 batches: {rows[2]['epoch']['requests']} requests,", out, re.M)
    assert not re.search(r"^  rank [013]:", out, re.M)
    assert f"  all 4 ranks: 12 batches: {sum(r['epoch']['requests'] for r in rows)} requests," in out
    monkeypatch.setattr(advice, "MAX_EPOCH_RANKS", 2)
    assert main(["plan", "--data", location, *MESH, "--rank", "2"]) == 0
    assert "  all 4 ranks: not added up (more than 2 ranks)" in capsys.readouterr().out
