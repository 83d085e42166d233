"""Remote object storage (issues 31 and 42's "Performance"): the native reader against tensorstore and
zarr-python (fsspec's s3fs, obstore) on the same S3 objects and windows, side by side in one run, from a
loopback S3 server that answers in parallel and adds latency per request.

    python benchmarks/remote_bench.py [--steps 16] [--runs 3] [--latencies 0,0.02,0.05] [--mbps 0,100]
        [--concurrency 2] [--readers ...] [--stores ...] [--plot PNG] [--quick]

Server: benchmarks/s3_server.py on 127.0.0.1, in a process of its own (so that its Python shares no
interpreter lock with the readers), serving the stores' files as S3 objects: a thread per connection,
so requests sent together are answered side by side as S3 answers them (moto, used here before, answered
one at a time, ~8 ms each, and hid every reader's concurrency); its cost is ~0.12 ms of CPU per request
(its docstring). A link: a latency of ``--latencies`` and a bandwidth of ``--mbps``, every pair (a row
group each; the table's link column names both): the server sleeps the latency before each answer's
first byte (requests in flight wait side by side) and sends each body at most that many MB/s per
connection (0: unlimited; an object store's throughput is per connection; on loopback bandwidth is
otherwise free, and only round trips count). A ``--latencies`` entry ``SECONDS:MBPS`` keeps its own
bandwidth. It does not check signatures (every reader signs as it would for S3). Nothing reaches beyond
127.0.0.1.

Data: ``--steps`` × (4, 721, 1440) float32 (16 by default, the issue's benchmark; 8 before) (compressed_bench.py's ERA5-like smooth fields plus noise),
rank 1 of 4, latitude split (axis 1 of (C, lat, lon); torch.chunk: rows 181..362), one sample per step.
Stores, written once into the server's folder:
  blosc_globe     Zarr v2, Blosc(lz4, 5, shuffle), chunks (1, 4, 721, 1440): a whole field per object
  zstd_sharded    Zarr v3, Zstd(3), inner chunks (1, 4, 721, 1440), shards of 4 steps (crc32c index)
  blosc_band      Zarr v2, Blosc(lz4, 5, shuffle), chunks (1, 4, 181, 1440): one chunk per window
Readers (each reads rank 1's window of every step in order, with ``--concurrency`` threads decoding and, unless
said otherwise below, at most as many requests in flight):
  native        dali_mesh ZarrSource(s3://..., storage_options=...) + read_windows, CPU pipeline
                (device_id=None), batch 1, num_threads = concurrency, prefetch_queue_depth=1; the
                operator reads the next eight steps ahead while it reads this one (read_ahead's and
                read_ahead_batches' defaults for object stores; four before 2026-12-06): nine steps in flight
  native_sync   the same with read_ahead=False: one step at a time
  native_aheadK the same with read_ahead_batches=K (native_ahead1: two steps in flight, as before issue 42)
  tensorstore   ts.open(zarr / zarr3, kvstore s3 with endpoint = the server), window[t].read() per step,
                one step at a time; s3_request_concurrency, data_copy_concurrency = concurrency, no
                cache pool
  tensorstore_ahead  the same, step t+1's read issued before step t's is waited for: two steps in
                flight, as native_ahead1 (the context's limits as above)
  tensorstore_aheadK  the next K steps' reads issued before step t's is waited for: K + 1 steps in
                flight; tensorstore_ahead8 is as deep as native (8 steps ahead). K > 1: up to 32 requests
                in flight (s3_request_concurrency: tensorstore's default, which it likes best), decoding
                data_copy_concurrency = concurrency
  zarr_fsspec   zarr-python 3 over FsspecStore (s3fs), array[t, :, lat0:lat1, :] per step;
                async.concurrency = threading.max_workers = concurrency
  zarr_obstore  the same over zarr.storage.ObjectStore(obstore S3Store), async.concurrency 64 (zarr-python
                3.3's default; obstore coalesces ranges itself), threading.max_workers = concurrency (left
                out when obstore is not installed). A step is one chunk (one request, sharded: index and
                inner chunk), so the requests in flight within a step change nothing here; steps ahead do:
  zarr_obstore_aheadK  the same through zarr-python's async API (AsyncArray.getitem on its event loop), the
                next K steps' reads begun before step t's is awaited: K + 1 steps in flight
Per run, latency, store and reader: a new reader (new pipeline / context / store objects: nothing cached
from an earlier one), the server's counts reset; ``open`` = making the reader (metadata, plans, pipeline
build), ``epoch`` = reading every step's window (cold: nothing of the data cached anywhere); counted at the
server from the reader's creation to the epoch's end (``open to 1st batch``: from the reader's creation
to its first window in hand, the issue's "open to first batch"; the epoch's time is from after the open); bytes = body bytes of its answers (GETs of objects
and listings), requests = GETs of objects, HEADs and bucket-level GETs (LIST), the most requests in
flight at once, and the server's CPU seconds (what serving cost it, not the reader). Before the runs every
reader is made once, untimed (a process imports its modules and loads its libraries once). In the first
run an untimed epoch at latency 0 then checks every reader's windows against numpy. Medians over
``--runs``; the ratio columns are medians of per-run ratios of the epoch time to tensorstore's and to the
fastest peer's (every reader not dali_mesh's), measured in the same run. Readers take turns going first.

Run time on the 2-core VM (2026-12-05, shared with other sessions, load average 4-7): the defaults with
``--runs 1`` (16 steps, 0 / 20 / 50 ms, 8 readers, 3 stores, the cache table, the plot) took 1 min 14 s, so
the three runs of the defaults take about 3 min (a quiet machine: less); ``--mbps 0,100`` adds a row group
per latency, where every reader fetching whole chunks (140 MB per epoch on blosc_globe) waits ~1.4 s for
the bytes.

Cache (when ``storage_options`` take ``cache_dir``): a native pipeline with a fresh ``cache_dir`` reads two
epochs; the second (its time, bytes and requests at the server) against the same windows from local copies
of the stores (a native pipeline's second epoch, files in the page cache).

``--quick``: 4 steps of (4, 91, 180), one run, latency 20 ms (a CI-size check that every reader runs and
agrees).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

from benchmarks.s3_server import CONTROL  # noqa: E402  (share_bench.py's tensorstore ranks read the counts)

BUCKET = "bench"
STORES = ("blosc_globe", "zstd_sharded", "blosc_band")
READERS = ("native", "native_sync", "tensorstore", "tensorstore_ahead", "tensorstore_ahead4", "tensorstore_ahead8",
           "zarr_fsspec", "zarr_obstore", "zarr_obstore_ahead8")
STEPS_PER_SHARD = 4
#: the issue's benchmark: 16 steps (4 shards of the sharded store)
STEPS = 16
#: requests in flight that a reader keeping several steps in flight may send (tensorstore's default
#: s3_request_concurrency, 32; zarr-python 3.3's async.concurrency is 64): its own best, not --concurrency
AHEAD_REQUESTS = {"tensorstore": 32, "zarr": 64}


def is_peer(reader: str) -> bool:
    """A reader that is not dali_mesh: "vs fastest peer" compares each reader with the fastest of these."""
    return not reader.startswith("native")


def _ahead(reader: str, prefix: str) -> int | None:
    """K of ``PREFIX_aheadK`` (``PREFIX_ahead``: 1), None for a reader of that prefix that reads one step
    at a time."""
    rest = reader.removeprefix(prefix)
    if rest == reader or not rest.startswith("_ahead"):
        return None
    digits = rest.removeprefix("_ahead")
    if digits and not digits.isdigit():
        raise ValueError(f"unknown reader {reader!r}: {prefix}_aheadK reads K steps ahead (K a number)")
    return int(digits or 1)


class Server:
    """benchmarks/s3_server.py in a process of its own (``--stdin``: it ends with this one), so that its
    Python shares no interpreter lock with the readers: objects from ``root`` (its folder ``BUCKET``
    holds the stores; files ``ROOT/BUCKET/KEY``), or in memory with an empty bucket ``BUCKET`` (uploads:
    share_bench.py's)."""

    def __init__(self, root: str | None = None) -> None:
        where = ["--root", root] if root is not None else ["--bucket", BUCKET]
        self.proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "benchmarks", "s3_server.py"), "--port", "0",
                                      "--stdin", *where], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     cwd=ROOT)
        line = self.proc.stdout.readline().strip()
        if not line.isdigit():
            self.proc.kill()
            raise RuntimeError("the benchmark's S3 server did not start (see the output above)")
        self.endpoint = f"http://127.0.0.1:{line}"
        # share_bench.py's names for it (uploads went to moto, reads through the proxy)
        self.moto = self.proxy = self.endpoint

    def control(self, what: str) -> dict:
        """``counts``, ``reset`` (the counts, then zero), ``latency/SECONDS``, ``bandwidth/BYTES_PER_S``."""
        name, _, arg = what.partition("/")
        if name in ("latency", "bandwidth"):
            what = f"set?latency={arg}" if name == "latency" else f"set?mbps={float(arg) / 1e6}"
        data = None if what == "counts" else b""  # a POST: anything but reading the counts
        with urllib.request.urlopen(self.endpoint + CONTROL + what, data=data, timeout=30) as r:
            return json.loads(r.read())

    def link(self, link: tuple) -> None:
        """Every answer from now on after ``link[0]`` seconds, at most ``link[1]`` MB/s per connection and,
        with a third entry, over one link of ``link[2]`` MB/s that every connection shares (0: none)."""
        shared = link[2] if len(link) > 2 else 0
        self.control(f"set?latency={link[0]}&mbps={link[1]}&shared_mbps={shared}")

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


# ---- data ---------------------------------------------------------------------------------------------------
def _write(store: str, folder: str, data: np.ndarray) -> str:
    import numcodecs
    import zarr

    shape = data.shape[1:]
    path = os.path.join(folder, f"{store}.zarr")
    if store == "zstd_sharded":
        z = zarr.create_array(path, shape=data.shape, chunks=(1,) + shape, shards=(STEPS_PER_SHARD,) + shape,
                              dtype="f4", compressors=zarr.codecs.ZstdCodec(level=3))
    else:
        band = -(-shape[1] // 4)  # torch.chunk's rows per rank: one chunk per window
        chunks = (1,) + shape if store == "blosc_globe" else (1, shape[0], band, shape[2])
        z = zarr.create_array(path, shape=data.shape, chunks=chunks, dtype="f4", zarr_format=2,
                              compressors=numcodecs.Blosc("lz4", 5, numcodecs.Blosc.SHUFFLE))
    z[:] = data
    return path


def _data_bytes(path: str) -> int:
    """Stored bytes of a store's chunks (or shards): every object but the metadata."""
    meta = {".zarray", ".zattrs", ".zgroup", "zarr.json"}
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs if f not in meta)


def _options(endpoint: str, **more) -> dict:
    from tests.storage.s3_server import options

    return options(endpoint, **more)


# ---- readers ------------------------------------------------------------------------------------------------
class _Reader:
    """What the readers share: ``first``, when the last epoch's first window was in hand
    (``time.perf_counter``): the open to the first batch is the open plus the time to it."""

    first: float | None = None

    def _got(self, out: list, window) -> None:
        out.append(window)
        if len(out) == 1:
            self.first = time.perf_counter()


class _Native(_Reader):
    def __init__(self, location, steps, conc, layout, storage_options=None, read_ahead=None, read_ahead_batches=None):
        from nvidia.dali import pipeline_def

        from dali_mesh.pipeline import native
        from dali_mesh.source import ZarrSource

        kw = {"storage_options": storage_options} if storage_options is not None else {}
        src = ZarrSource([location], None, layout, batch_size=1, shuffle=False, **kw)

        @pipeline_def(batch_size=1, num_threads=conc, device_id=None, prefetch_queue_depth=1)
        def pipe():
            return native.read_windows(src, fallback=False, read_ahead=read_ahead,
                                       read_ahead_batches=read_ahead_batches)[0]

        self.pipe = pipe()
        self.pipe.build()

    def epoch(self, keep=False):
        """As benchmarks/_common.py's pipeline_epoch, noting when the first batch came."""
        out, self.first = [], None
        while True:
            try:
                w = self.pipe.run()[0]
            except StopIteration:
                self.pipe.reset()
                return out if keep else []
            self._got(out, np.array(w[0]) if keep else None)


class _TensorStore(_Reader):
    def __init__(self, store, endpoint, steps, conc, sl, ahead=0):
        import tensorstore as ts

        # several steps ahead: as many requests in flight as tensorstore sends by default (one step ahead
        # keeps --concurrency, as before)
        requests = AHEAD_REQUESTS["tensorstore"] if ahead > 1 else conc
        ctx = ts.Context({"s3_request_concurrency": {"limit": requests}, "data_copy_concurrency": {"limit": conc},
                          "cache_pool": {"total_bytes_limit": 0}})
        spec = {"driver": "zarr3" if store == "zstd_sharded" else "zarr",
                "kvstore": {"driver": "s3", "bucket": BUCKET, "path": f"{store}.zarr/", "endpoint": endpoint,
                            "aws_region": "us-east-1"}}
        self.arr = ts.open(spec, context=ctx, read=True).result()
        self.steps, self.sl, self.ahead = steps, sl, ahead

    def epoch(self, keep=False):
        # the next ``ahead`` steps' reads are issued before this one's is waited for (ahead + 1 in flight)
        futures, out = {}, []
        for t in range(self.steps):
            for u in range(t, min(self.steps, t + self.ahead + 1)):
                if u not in futures:
                    futures[u] = self.arr[(u,) + self.sl].read()
            self._got(out, futures.pop(t).result())
        return out


class _Zarr(_Reader):
    def __init__(self, store, endpoint, steps, conc, sl, backend, ahead=0):
        import zarr

        # obstore: zarr-python 3.3's default of requests in flight (its coalescing is obstore's own); the
        # decoding threads are --concurrency for every reader
        requests = AHEAD_REQUESTS["zarr"] if backend == "obstore" else conc
        zarr.config.set({"async.concurrency": requests, "threading.max_workers": conc})
        if backend == "fsspec":
            zstore = zarr.storage.FsspecStore.from_url(
                f"s3://{BUCKET}/{store}.zarr", read_only=True,
                storage_options={**_options(endpoint), "skip_instance_cache": True,
                                 "client_kwargs": {"region_name": "us-east-1"}})
        else:
            from obstore.store import S3Store

            from tests.storage.s3_server import KEY, SECRET

            zstore = zarr.storage.ObjectStore(S3Store(BUCKET, prefix=f"{store}.zarr", endpoint=endpoint,
                                                      access_key_id=KEY, secret_access_key=SECRET,
                                                      region="us-east-1", client_options={"allow_http": True}),
                                              read_only=True)
        self.arr = zarr.open_array(store=zstore, mode="r", zarr_format=3 if store == "zstd_sharded" else 2)
        self.steps, self.sl, self.ahead = steps, sl, ahead

    def epoch(self, keep=False):
        if not self.ahead:
            out = []
            for t in range(self.steps):
                self._got(out, self.arr[(t,) + self.sl])
            return out
        from zarr.core.sync import sync

        return sync(self._epoch_ahead())

    async def _epoch_ahead(self):
        """Each step's window by zarr-python's async API, the next ``ahead`` steps' reads begun before this
        one's is awaited (ahead + 1 in flight), on zarr-python's own event loop."""
        import asyncio

        arr, tasks, out = self.arr._async_array, {}, []
        for t in range(self.steps):
            for u in range(t, min(self.steps, t + self.ahead + 1)):
                if u not in tasks:
                    tasks[u] = asyncio.ensure_future(arr.getitem((u,) + self.sl))
            self._got(out, await tasks.pop(t))
        return out


def _known_reader(reader: str) -> bool:
    if reader in READERS or reader == "zarr_fsspec":
        return True
    for prefix in ("native", "tensorstore", "zarr_obstore", "zarr_fsspec"):
        try:
            if _ahead(reader, prefix):
                return True
        except ValueError:
            return False
    return False


def _have_obstore() -> bool:
    import importlib.util

    return importlib.util.find_spec("obstore") is not None


def _versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for name in ("tensorstore", "zarr", "s3fs", "obstore", "nvidia-dali-cuda120"):
        try:
            out.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            pass
    return ", ".join(out)


def _make(reader, store, server, steps, conc, layout, sl):
    if reader.startswith("native"):
        batches = _ahead(reader, "native")
        return _Native(f"s3://{BUCKET}/{store}.zarr", steps, conc, layout, _options(server.endpoint),
                       read_ahead=False if reader == "native_sync" else None, read_ahead_batches=batches)
    if reader.startswith("tensorstore"):
        return _TensorStore(store, server.endpoint, steps, conc, sl, ahead=_ahead(reader, "tensorstore") or 0)
    backend = reader.removeprefix("zarr_").partition("_")[0]
    return _Zarr(store, server.endpoint, steps, conc, sl, backend, ahead=_ahead(reader, f"zarr_{backend}") or 0)


def _check(got, want, what: str) -> None:
    assert len(got) == len(want), (what, len(got), len(want))
    for t, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_array_equal(np.asarray(g), w, err_msg=f"{what}, step {t}")


def _cache_option_exists() -> bool:
    from dali_mesh.storage import remote

    return "cache_dir" in getattr(remote, "CLIENT_SETTINGS", ())


def _link(text: str) -> tuple[float, float, float]:
    """``"0.02:100"`` -> (0.02 s per request, 100 MB/s per connection, no shared link); no colon:
    unlimited (0)."""
    latency, _, mbps = text.partition(":")
    return float(latency), float(mbps or 0), 0.0


def _links(latencies: str, mbps: str, shared_mbps: str = "") -> list[tuple[float, float, float]]:
    """The links of ``--latencies`` and ``--mbps``: every latency with every bandwidth, bandwidths outer
    (a row group per pair); a latency given as ``SECONDS:MBPS`` keeps its own bandwidth. Then every
    latency with every shared link of ``--shared-mbps`` (``(latency, 0, MBPS)``: one link of that rate
    for every connection together)."""
    out = []
    for rate in (float(x) for x in mbps.split(",")):
        if not rate >= 0:
            raise ValueError(f"--mbps: a bandwidth must be >= 0 MB/s (0: unlimited), got {rate}")
        for text in latencies.split(","):
            link = _link(text) if ":" in text else (float(text), rate, 0.0)
            if not link[0] >= 0:
                raise ValueError(f"--latencies: a latency must be >= 0 s, got {text!r}")
            if link not in out:
                out.append(link)
    for shared in (float(x) for x in shared_mbps.split(",") if x.strip()):
        if not shared > 0:
            raise ValueError(f"--shared-mbps: a shared link's bandwidth must be > 0 MB/s, got {shared}")
        for text in latencies.split(","):
            link = (_link(text)[0], 0.0, shared)
            if link not in out:
                out.append(link)
    return out


def _link_name(link: tuple[float, float, float]) -> str:
    """The table's link column: the latency per request and the bandwidth per connection, or the shared
    link's."""
    if link[2]:
        return f"{link[0] * 1e3:g} ms, {link[2]:g} MB/s shared"
    return f"{link[0] * 1e3:g} ms, " + (f"{link[1]:g} MB/s" if link[1] else "unlimited")


def _measure_cache(server, stores, paths, steps, conc, layout, want, link, runs) -> list[str]:
    """Rows of the cache table: the second epoch of a native pipeline with a fresh cache_dir against the
    second epoch of one over the local copy."""
    server.link(link)
    r = {}
    for run in range(runs):
        for store in stores:
            for kind in ("cache", "local"):
                folder = tempfile.mkdtemp(prefix="dm_remote_cache_")
                try:
                    server.control("reset")
                    if kind == "cache":
                        obj = _Native(f"s3://{BUCKET}/{store}.zarr", steps, conc, layout,
                                      _options(server.endpoint, cache_dir=folder))
                    else:
                        obj = _Native(paths[store], steps, conc, layout)
                    obj.epoch()
                    server.control("reset")
                    t0 = time.perf_counter()
                    obj.epoch()
                    dt = time.perf_counter() - t0
                    counts = server.control("counts")
                    if run == 0:
                        _check(obj.epoch(keep=True), want, f"native {kind} {store}")
                    e = r.setdefault((store, kind), {"t": [], "bytes": [], "req": []})
                    e["t"].append(dt)
                    e["bytes"].append(counts["bytes"])
                    e["req"].append(counts["requests"])
                    del obj
                finally:
                    shutil.rmtree(folder, ignore_errors=True)
    rows = []
    for (store, kind), e in r.items():
        local = r[(store, "local")]["t"]
        ratio = statistics.median(a / b for a, b in zip(e["t"], local))
        fetched = f"{statistics.median(e['bytes']) / 1e6:.1f}" if kind == "cache" else "-"
        reqs = f"{statistics.median(e['req']):.0f}" if kind == "cache" else "-"
        rows.append(f"| {store} | {'native, cache_dir' if kind == 'cache' else 'native, local files'} | "
                    f"{fetched} | {reqs} | {statistics.median(e['t']):.3f} | {ratio:.2f}x |")
    return rows


# ---- the benchmark ----------------------------------------------------------------------------------------
def _fastest_peer(results: dict, link, store: str) -> list[float] | None:
    """Per run, the shortest epoch of the peers measured at this link and store (None: no peer ran)."""
    peers = [r["epoch"] for (lk, st, reader), r in results.items() if (lk, st) == (link, store) and is_peer(reader)]
    return [min(per_run) for per_run in zip(*peers)] if peers else None


def _plot(path: str, results: dict, links: list, stores: list[str], readers: list[str]) -> None:
    """The epoch (median) against the link's latency: a panel per store (a row of them per bandwidth), a
    line per reader."""
    import matplotlib  # noqa: PLC0415 - only when a plot is asked for

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    rates = sorted({link[1:] for link in links})
    fig, axes = plt.subplots(len(rates), len(stores), figsize=(5 * len(stores), 4 * len(rates)), squeeze=False)
    for row, (rate, shared) in zip(axes, rates):
        these = sorted(link for link in links if link[1:] == (rate, shared))
        ms = [link[0] * 1e3 for link in these]
        for ax, store in zip(row, stores):
            for reader in readers:
                ax.plot(ms, [statistics.median(results[(link, store, reader)]["epoch"]) for link in these],
                        marker="o", linestyle="-" if reader.startswith("native") else "--", label=reader)
            ax.set_title(f"{store}, " + (f"{shared:g} MB/s shared by all connections" if shared else
                                         f"{rate:g} MB/s per connection" if rate else "bandwidth unlimited"))
            ax.set_xlabel("latency per request, ms")
            ax.set_ylabel("epoch, s")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=STEPS, help=f"steps read (default {STEPS}, the issue's)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--latencies", default="0,0.02,0.05",
                    help="the links, comma-separated: seconds the server waits before each answer, and after a "
                         "colon the MB/s it sends per connection (none: each of --mbps)")
    ap.add_argument("--mbps", default="0", help="bandwidths per connection, MB/s, comma-separated (0: unlimited); "
                                                "each with each latency, a row group per pair (e.g. 0,100)")
    ap.add_argument("--shared-mbps", default="", help="shared links, MB/s, comma-separated: one link of that "
                                                       "rate for every connection together (a rank's share of "
                                                       "a node's network interface), each with each latency")
    ap.add_argument("--concurrency", type=int, default=2, help="requests in flight and decoding threads, every reader")
    ap.add_argument("--stores", default=",".join(STORES))
    ap.add_argument("--readers", default=",".join(READERS))
    ap.add_argument("--shape", default="4,721,1440", help="one step's (C, lat, lon)")
    ap.add_argument("--quick", action="store_true", help="4 steps of (4, 91, 180), one run, 20 ms: a CI-size check")
    ap.add_argument("--no-cache", action="store_true", help="leave out the cache_dir measurement")
    ap.add_argument("--plot", metavar="PNG", help="also draw the epoch against the link's latency, a panel per "
                                                   "store and a line per reader, into this file")
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.runs, args.latencies, args.shape = 4, 1, "0.02", "4,91,180"
    import benchmarks.compressed_bench as cb
    from benchmarks.compressed_bench import _layout
    from tests.storage.s3_server import KEY, SECRET

    shape = tuple(int(x) for x in args.shape.split(","))
    if args.steps % STEPS_PER_SHARD:
        ap.error(f"--steps must be a multiple of {STEPS_PER_SHARD} (the sharded store's steps per shard)")
    stores = args.stores.split(",")
    for r in args.readers.split(","):
        if not _known_reader(r):
            ap.error(f"unknown reader {r!r}: {', '.join(READERS)}, native_aheadK, tensorstore_aheadK, "
                     "zarr_obstore_aheadK (K steps ahead)")
    readers = [r for r in args.readers.split(",") if not r.startswith("zarr_obstore") or _have_obstore()]
    skipped = [r for r in args.readers.split(",") if r not in readers]
    try:
        links = _links(args.latencies, args.mbps, args.shared_mbps)
    except ValueError as e:
        ap.error(str(e))
    os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"] = KEY, SECRET  # tensorstore's credentials
    os.environ.pop("AWS_SESSION_TOKEN", None)

    cb.SHAPE = shape  # the same fields as compressed_bench's, of this shape
    data = cb._fields(args.steps)
    region = _layout().region(shape)
    sl = tuple(slice(a, b) for a, b in zip(region.start, region.stop))
    want = [data[t][sl] for t in range(args.steps)]
    folder = tempfile.mkdtemp(prefix="dm_remote_bench_")
    server = None
    results = {}  # (link, store, reader) -> {"open": [], "epoch": [], "bytes": [], "GET": [], ...}
    try:
        # the stores are written where the server serves them from (its root's folder BUCKET), before it
        # starts: it computes every object's ETag then, not while a reader waits
        paths = {s: _write(s, os.path.join(folder, BUCKET), data) for s in stores}
        stored = {s: _data_bytes(paths[s]) for s in stores}
        server = Server(folder)
        # each reader made once, untimed and uncounted: a process imports its modules and loads its
        # libraries (DALI's plugin, tensorstore's) once, not at every open of a training job
        server.link((0, 0, 0))
        for reader in readers:
            del_me = _make(reader, stores[0], server, args.steps, args.concurrency, _layout(), sl)
            del del_me
        order = list(readers)
        for run in range(args.runs):
            for link in links:
                for store in stores:
                    for reader in order:
                        server.link(link)
                        server.control("reset")
                        t0 = time.perf_counter()
                        obj = _make(reader, store, server, args.steps, args.concurrency, _layout(), sl)
                        t1 = time.perf_counter()
                        opened = server.control("counts")  # neither timed nor counted
                        t2 = time.perf_counter()
                        obj.epoch()
                        t3 = time.perf_counter()
                        counts = server.control("counts")
                        r = results.setdefault((link, store, reader), {"open": [], "epoch": []})
                        r["open"].append(t1 - t0)
                        r["epoch"].append(t3 - t2)
                        r.setdefault("first", []).append(t1 - t0 + obj.first - t2)
                        for k in ("requests", "bytes", "GET", "HEAD", "LIST", "in_flight_max", "cpu_seconds"):
                            r.setdefault(k, []).append(counts[k])
                        r.setdefault("open_requests", []).append(opened["requests"])
                        if run == 0 and link == links[0]:  # every reader's windows checked, untimed
                            server.link((0, 0, 0))
                            _check(obj.epoch(keep=True), want, f"{reader} {store}")
                        del obj
                order = order[1:] + order[:1]  # readers take turns going first
            print(f"run {run + 1}/{args.runs} done", file=sys.stderr)
        cache_rows = None
        if not args.no_cache and _cache_option_exists():
            cache_rows = _measure_cache(server, stores, paths, args.steps, args.concurrency, _layout(), want,
                                        links[0], args.runs)
    finally:
        if server is not None:
            server.close()
        shutil.rmtree(folder, ignore_errors=True)

    print(f"{args.steps} x {shape} float32, rank 1 of 4 (latitude rows {region.start[1]}..{region.stop[1]}), "
          f"batch 1, {args.concurrency} decoding threads per reader and as many requests in flight (but "
          f"tensorstore_aheadK, K > 1: {AHEAD_REQUESTS['tensorstore']}; zarr_obstore*: {AHEAD_REQUESTS['zarr']}; "
          f"native*: its own), medians of {args.runs} runs; link: latency per request, bandwidth per connection")
    print(_versions())
    if skipped:
        print(f"left out (not installed): {', '.join(skipped)}")
    print("\n| link | store | reader | stored MB (steps read) | fetched / stored | requests: open + epoch "
          "| GET / HEAD / LIST | open s | open to 1st batch s | epoch s | epoch vs tensorstore | vs fastest peer "
          "| fetched MB | most in flight | server CPU s |")
    print("|---" * 15 + "|")
    med = statistics.median
    for (link, store, reader), r in results.items():
        ref = results.get((link, store, "tensorstore"))
        ratio = f"{med(a / b for a, b in zip(r['epoch'], ref['epoch'])):.2f}x" if ref else "-"
        fastest = _fastest_peer(results, link, store)
        to_fastest = f"{med(a / b for a, b in zip(r['epoch'], fastest)):.2f}x" if fastest else "-"
        opened = med(r["open_requests"])
        print(f"| {_link_name(link)} | {store} | {reader} | {stored[store] / 1e6:.1f} | "
              f"{med(r['bytes']) / stored[store]:.2f}x | {opened:.0f} + {med(r['requests']) - opened:.0f} | "
              f"{med(r['GET']):.0f} / {med(r['HEAD']):.0f} / {med(r['LIST']):.0f} | {med(r['open']):.3f} | "
              f"{med(r['first']):.3f} | {med(r['epoch']):.3f} | {ratio} | {to_fastest} | {med(r['bytes']) / 1e6:.1f} | "
              f"{max(r['in_flight_max'])} | {med(r['cpu_seconds']):.2f} |")
    if len(links) > 1:
        print("\nEpoch s by link (medians, as above)\n")
        print("| store | reader | " + " | ".join(_link_name(link) for link in links) + " |")
        print("|---|---|" + "---|" * len(links))
        for store in stores:
            for reader in readers:
                print(f"| {store} | {reader} | " + " | ".join(f"{med(results[(link, store, reader)]['epoch']):.3f}"
                                                            for link in links) + " |")
    if args.plot:
        _plot(args.plot, results, links, stores, readers)
        print(f"\nplot: {args.plot}")
    if cache_rows is None:
        print("\ncache: not yet built" if not _cache_option_exists() else "\ncache: not measured (--no-cache)")
    else:
        print(f"\nCache, {_link_name(links[0])}: the second epoch of one pipeline\n")
        print("| store | reader | fetched MB | requests | epoch s | vs local files |")
        print("|---|---|---|---|---|---|")
        print("\n".join(cache_rows))


if __name__ == "__main__":
    main()
