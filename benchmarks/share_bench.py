"""Read once per group (``share="group"``) against independent reading: 4 ranks on this machine (gloo),
whole-field Blosc (or Zstd) chunks, latitude split.

    python benchmarks/share_bench.py [--steps 16] [--shape 4,721,1440] [--epochs 3] [--mesh 4 | --mesh 2,2]
                                     [--cname lz4 | zstd | zstd-frame | zstd-sharded] [--remote 0.02[:100]]

The store: ``--steps`` samples of float32 ``--shape`` (ERA5's 0.25 degree grid), Zarr v2, one chunk per
sample (the whole field, as WeatherBench2 and ARCO-ERA5 chunk), Blosc(``--cname``, clevel 5, shuffle)
(``zstd-frame``: numcodecs' Zstd(3), one frame per chunk, which no reader decodes in parts;
``zstd-sharded``: Zarr v3, Zstd(3) inner chunks of one sample, shards of 4 samples), values rounded
to 0.01. Mesh ``4``: ``mp=4`` shards the latitude (a group of 4); ``2,2``: ``mp=2`` shards it and ``tp=2``
replicates (a group of 4 whose pairs share a window). Batch 1, 2 reader threads per rank, every
sample once per epoch. Per mode and rank:

- ``requested``: bytes the rank's reads asked for (``/proc/self/io`` ``rchar`` over one epoch: page
  cache hits included, so it is what the rank would pull from storage on a node of its own), against
  the stored bytes of the samples of an epoch;
- ``cold``: bytes the rank pulled from the disk (``read_bytes``) in the first epoch after the store
  was evicted (the ranks share this machine's page cache, so the group's sum is what matters here);
- epoch seconds (median of ``--epochs`` after the cold one; the slowest rank, between barriers);
- for the group: bytes of windows sent and received per rank, and seconds in the exchange (status
  and data collectives, waiting for the members' reads included).

``--remote LATENCY[:MBPS]``: the store is uploaded to the benchmarks' S3 server on 127.0.0.1 (s3_server.py:
it answers in parallel, LATENCY seconds added per request, at most MBPS per connection), and every rank
reads ``s3://``; ``requested`` is then the body bytes the rank fetched (``fetch_counters`` of the one
native core, which the plugin's reads and Python's planning share: every request of the rank's process,
planning included, over the epochs after the first) and ``cold`` the requests it sent per epoch.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def make_store(path, steps, shape, cname="lz4"):
    import zarr
    from numcodecs import Blosc

    if os.path.exists(os.path.join(path, ".zarray")) or os.path.exists(os.path.join(path, "zarr.json")):
        return
    rng = np.random.default_rng(0)
    from numcodecs import Zstd

    # "zstd-frame": numcodecs' Zstd, one frame per chunk (decoded whole); else Blosc with that cname
    # (divisible into blocks: a rank's band decodes alone)
    if cname == "zstd-sharded":
        z = zarr.create_array(path, shape=(steps,) + shape, chunks=(1,) + shape, shards=(4,) + shape, dtype="f4",
                              compressors=zarr.codecs.ZstdCodec(level=3))
    else:
        codec = Zstd(3) if cname == "zstd-frame" else Blosc(cname, 5, Blosc.SHUFFLE)
        z = zarr.create_array(path, shape=(steps,) + shape, chunks=(1,) + shape, dtype="f4", zarr_format=2,
                              compressors=[codec])
    for t in range(steps):
        z[t] = np.round(rng.standard_normal(shape), 2).astype("f4")


def _io():
    out = {}
    with open("/proc/self/io") as f:
        for line in f:
            k, v = line.split(":")
            out[k] = int(v)
    return out


def _fetched():
    """As _io's keys: the body bytes and the requests this process's remote stores fetched and sent (the
    plugin's reads and Python's planning, counted together by the one native core)."""
    from dali_mesh.storage.remote import fetch_counters

    requests, got = fetch_counters()
    return {"rchar": got, "read_bytes": requests}


def _mesh_and_layout(mesh_shape):
    """This rank's mesh (``mp``, and ``tp`` a replica dim) and its layout: latitude split, halo 1."""
    from torch.distributed.device_mesh import init_device_mesh

    from dali_mesh import Layout, MeshInfo

    names = ("mp",) if len(mesh_shape) == 1 else ("mp", "tp")
    mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)
    return mesh, Layout(MeshInfo.from_device_mesh(mesh), shard={"mp": 1}, batch=(), halo={1: 1})  # tp: a replica


def _rank(rank, world, store, mesh_shape, epochs, out_dir, share, storage_options=None, read_ahead=None):
    import torch.distributed as dist
    from nvidia.dali import pipeline_def

    from dali_mesh import ZarrSource
    from dali_mesh.fn import read_windows
    from dali_mesh.io.pagecache import evict
    from dali_mesh.torch import MeshLoader

    mesh, layout = _mesh_and_layout(mesh_shape)
    kw = {} if storage_options is None else {"storage_options": storage_options}
    src = ZarrSource([store], None, layout, batch_size=1, share=share, shuffle=True, seed=1, **kw)
    io = _io if storage_options is None else _fetched

    @pipeline_def(batch_size=1, num_threads=2, device_id=None, prefetch_queue_depth=2)
    def pipe():
        return read_windows(src, fallback=False, read_ahead=read_ahead)

    if rank == 0 and storage_options is None:
        evict(store)
    dist.barrier()
    io0 = io()
    loader = MeshLoader(pipe(), layout, device_mesh=mesh)  # builds the pipeline: reads the first batch
    waited = [0.0]
    inner = loader._next_batch

    def timed():  # the seconds this rank waits for its own pipeline's batches
        t = time.perf_counter()
        try:
            return inner()
        finally:
            waited[0] += time.perf_counter() - t

    loader._next_batch = timed
    times, first = [], None
    for e in range(epochs + 1):
        dist.barrier()
        t0 = time.perf_counter()
        n = sum(1 for _ in loader)
        dist.barrier()
        times.append(time.perf_counter() - t0)
        if e == 0:
            first = io()
            waited0 = waited[0]
            stats0 = dict(loader._exchange.stats) if loader._exchange is not None else None
        loader.reset()
    io1 = io()
    stats = None
    if loader._exchange is not None:  # the warm epochs'
        stats = {k: v if isinstance(v, str) else (v - stats0[k]) / epochs for k, v in loader._exchange.stats.items()}
    result = {"rank": rank, "batches": n, "cold_read_bytes": first["read_bytes"] - io0["read_bytes"],
              "rchar_epoch": (io1["rchar"] - first["rchar"]) / epochs,
              "requests_epoch": (io1["read_bytes"] - first["read_bytes"]) / epochs, "seconds": times[1:], "stats": stats,
              "steps": src.num_samples, "pipeline_wait": (waited[0] - waited0) / epochs}
    with open(os.path.join(out_dir, f"{share}.{rank}.json"), "w") as f:
        json.dump(result, f)
    loader.close()


def _tensorstore_rank(rank, world, key, mesh_shape, epochs, out_dir, proxy, v3, ahead=1):
    """``--remote``'s peer: every rank reads its windows (halo included) of every sample with tensorstore (an
    ``s3`` kvstore on the server, 2 threads, no cache, ``ahead + 1`` samples' reads in flight: ``--ts-ahead``;
    2 requests in flight for 1, else 32, tensorstore's default, as remote_bench.py's tensorstore_aheadK);
    bytes and requests at the server over the epochs after the first, per rank (the group's total / the
    world)."""
    import tensorstore as ts
    import torch.distributed as dist

    from benchmarks.remote_bench import BUCKET, CONTROL
    from tests.storage.s3_server import KEY, SECRET

    os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"] = KEY, SECRET
    _, layout = _mesh_and_layout(mesh_shape)
    ctx = ts.Context({"s3_request_concurrency": {"limit": 2 if ahead <= 1 else 32}, "data_copy_concurrency": {"limit": 2},
                      "cache_pool": {"total_bytes_limit": 0}})
    arr = ts.open({"driver": "zarr3" if v3 else "zarr",
                   "kvstore": {"driver": "s3", "bucket": BUCKET, "path": key + "/", "endpoint": proxy,
                               "aws_region": "us-east-1"}}, context=ctx, read=True).result()
    region = layout.region(tuple(arr.shape[1:]))
    sl = tuple(slice(max(0, a - (d == 1)), min(n, b + (d == 1)))
               for d, (a, b, n) in enumerate(zip(region.start, region.stop, arr.shape[1:])))

    def control(what):
        import urllib.request

        with urllib.request.urlopen(proxy + CONTROL + what, timeout=30) as r:
            return json.loads(r.read())

    times, counts = [], []
    for e in range(epochs + 1):
        dist.barrier()
        if rank == 0:
            control("reset")
        dist.barrier()
        t0 = time.perf_counter()
        pending = []  # ahead + 1 samples' reads in flight, as the DALI ranks' pipelines read ahead
        for t in range(arr.shape[0]):
            pending.append(arr[(t,) + sl].read())
            if len(pending) == ahead + 1:
                pending.pop(0).result()
        for p in pending:
            p.result()
        dist.barrier()
        times.append(time.perf_counter() - t0)
        if rank == 0:
            counts.append(control("counts"))
    result = {"rank": rank, "batches": arr.shape[0], "cold_read_bytes": 0, "stats": None, "seconds": times[1:],
              "steps": arr.shape[0], "pipeline_wait": statistics.median(times[1:])}
    if rank == 0:
        result["rchar_epoch"] = statistics.mean(c["bytes"] for c in counts[1:]) / world
        result["requests_epoch"] = statistics.mean(c["GET"] + c["HEAD"] + c["LIST"] + c["other"]
                                                   for c in counts[1:]) / world
    with open(os.path.join(out_dir, f"tensorstore.{rank}.json"), "w") as f:
        json.dump(result, f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--shape", default="4,721,1440")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--mesh", default="4")
    ap.add_argument("--cname", default="lz4", help="Blosc's compressor (lz4, zstd, ...), or zstd-frame: "
                    "numcodecs' Zstd(3), not Blosc")
    ap.add_argument("--dir", default="/tmp/dali_mesh_share_bench")
    ap.add_argument("--read-ahead", choices=("auto", "off"), default="auto",
                    help="the native ranks' read_ahead: auto (the default: on for s3://) or off")
    ap.add_argument("--tiny", action="store_true", help="4 samples of (2, 16, 32), 1 epoch, mesh 2: a smoke test")
    ap.add_argument("--remote", help="LATENCY[:MBPS]: read s3:// from a loopback moto behind a proxy adding LATENCY "
                    "seconds per request (at most MBPS per connection)")
    ap.add_argument("--ts-ahead", type=int, default=8, help="--remote's tensorstore ranks read this many samples "
                    "ahead (8: as deep as the native reader's default; 1: before 2026-12-06)")
    args = ap.parse_args()
    if args.tiny:
        args.steps, args.shape, args.epochs, args.mesh = 4, "2,16,32", 1, "2"
        args.dir += "_tiny"
    shape = tuple(int(s) for s in args.shape.split(","))
    mesh_shape = tuple(int(s) for s in args.mesh.split(","))
    os.makedirs(args.dir, exist_ok=True)
    store = os.path.join(args.dir, f"whole_{args.cname}_{args.steps}_{'x'.join(map(str, shape))}.zarr")
    make_store(store, args.steps, shape, args.cname)
    from benchmarks.remote_bench import _data_bytes

    stored = _data_bytes(store)

    from dali_mesh.cli.launch import run_ranks

    world = int(np.prod(mesh_shape))
    results = {}
    server, location, options = None, store, None
    if args.remote:
        from benchmarks.remote_bench import BUCKET, Server, _link, _link_name, _options
        from tests.storage.s3_server import upload

        link = _link(args.remote)
        server = Server()
        upload(server.moto, store, BUCKET, os.path.basename(store))
        location, options = f"s3://{BUCKET}/{os.path.basename(store)}", _options(server.proxy)
        server.control(f"latency/{link[0]}")
        server.control(f"bandwidth/{link[1] * 1e6}")
    try:
        for share in (None, "group") + (("tensorstore",) if args.remote else ()):
            with tempfile.TemporaryDirectory() as tmp:
                if share == "tensorstore":
                    run_ranks(_tensorstore_rank, world, tmp, os.path.basename(store), mesh_shape, args.epochs, tmp,
                              server.proxy, args.cname == "zstd-sharded", args.ts_ahead, timeout_s=1800)
                else:
                    run_ranks(_rank, world, tmp, location, mesh_shape, args.epochs, tmp, share, options,
                              {"auto": None, "off": False}[args.read_ahead], timeout_s=1800)
                results[share] = [json.load(open(os.path.join(tmp, f"{share}.{r}.json"))) for r in range(world)]
    finally:
        if server is not None:
            server.close()
    what = {"zstd-frame": "Zstd(3)", "zstd-sharded": "Zstd(3), shards of 4"}.get(args.cname, f"Blosc({args.cname}, shuffle)")
    where = f"from s3:// on 127.0.0.1 ({_link_name(link)})" if args.remote else "local files"
    print(f"{args.steps} samples of float32 {shape}, Zarr v{3 if args.cname == 'zstd-sharded' else 2}, whole-field "
          f"{what} chunks ({stored / 2**20:.0f} MiB stored), {where}; mesh {mesh_shape} "
          f"({'mp' if len(mesh_shape) == 1 else 'mp, tp'}), latitude split, halo 1, batch 1, "
          f"2 threads per rank; {os.cpu_count()} CPUs; epoch: median of {args.epochs} after the cold one")
    print()
    if args.remote:
        print("| mode | rank | fetched / stored (epoch) | requests per epoch | epoch s (slowest rank) | s waiting for its pipeline | exchange per epoch: transport: MiB sent, received, s |")
    else:
        print("| mode | rank | requested / stored (epoch) | cold MiB from disk | epoch s (slowest rank) | s waiting for its pipeline | exchange per epoch: transport: MiB sent, received, s |")
    print("|---|---|---|---|---|---|---|")
    epoch = {}
    for share, rows in results.items():
        slowest = [max(r["seconds"][i] for r in rows) for i in range(args.epochs)]
        epoch[share] = statistics.median(slowest)
        for r in rows:
            if "rchar_epoch" not in r:  # tensorstore's ranks other than 0: counted at the proxy, by rank 0
                continue
            st = r["stats"]
            ex = "-" if st is None else (f"{st['transport']}: {st['bytes_sent'] / 2**20:.0f}, {st['bytes_received'] / 2**20:.0f}, "
                                         f"{st['seconds']:.2f} ({st['status_seconds']:.2f} status, "
                                         f"{st['data_seconds']:.2f} data)")
            cold = r["requests_epoch"] if args.remote else r["cold_read_bytes"] / 2**20
            mode = {None: "independent", "group": "group"}.get(
                share, f"tensorstore {args.ts_ahead} ahead (the world's / {world})")
            print(f"| {mode} | {r['rank']} | {r['rchar_epoch'] / stored:.3f} | "
                  f"{cold:.0f} | {epoch[share]:.2f} | {r['pipeline_wait']:.2f} | {ex} |")
    print()
    print(f"group epoch / independent epoch: {epoch['group'] / epoch[None]:.2f}")
    if "tensorstore" in epoch:
        print(f"group epoch / tensorstore's epoch: {epoch['group'] / epoch['tensorstore']:.2f}; independent / "
              f"tensorstore: {epoch[None] / epoch['tensorstore']:.2f}")


if __name__ == "__main__":
    main()
