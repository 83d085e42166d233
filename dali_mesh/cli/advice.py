"""Layout advice: what a cold read of each rank's window costs with the file's layout, and a chunk
shape that would make it cost no more than the window (``dali-mesh plan --data FILE``).

Everything here is computed from metadata, never from the data: what a cold read of a window costs is
the format's own answer (:meth:`ArrayFormat.advice_target <dali_mesh.formats.ArrayFormat.advice_target>`,
a :class:`~dali_mesh.formats.cold_reads.ColdReads` in the format's folder: ``.npy`` byte ranges, an HDF5
chunk index, Zarr chunk objects); this module turns it into per-rank rows, totals and a chunk shape.

Samples: a ``.npy`` file is one sample; HDF5 and Zarr arrays hold samples along axis 0 (as
:class:`~dali_mesh.HDF5Source` and :class:`~dali_mesh.ZarrSource` read them); sample 0 is planned
(every sample of a chunked array is laid out alike when chunks do not span samples).
"""
from __future__ import annotations

import itertools
import logging
import math
from typing import Iterable, Iterator, NamedTuple, Sequence


from dali_mesh.cli.options import UsageError, find_data
from dali_mesh.cli.locations import scrub, shown
from dali_mesh.formats.cold_reads import MAX_ADVICE_CHUNKS, ColdReads, chunk_ranges
from dali_mesh.plan import WindowPlan, plan_window
from dali_mesh._kernels.fetch_api import EpochFetches, store_round_trip
from dali_mesh.partition import Layout, Region
from dali_mesh.storage import store_of

__all__ = [
    "EpochCounter",
    "MAX_CHUNK_BYTES",
    "LayoutTarget",
    "Prices",
    "S3_STANDARD",
    "aligned_chunks",
    "chunked_cold_bytes",
    "open_layout_target",
]

log = logging.getLogger(__name__)

#: Largest chunk :func:`aligned_chunks` proposes: a bigger one is split further (a chunk is read
#: and, compressed, decoded whole; tens of MiB keep per-chunk overheads small and memory bounded).
MAX_CHUNK_BYTES = 64 << 20
#: Smallest chunk worth taking to follow unequal shard boundaries exactly (their common width).
MIN_ALIGNED_CHUNK_BYTES = 1 << 20
#: Above this ratio of cold bytes to window bytes the advice proposes another chunk shape.
ADVICE_RATIO = 1.1
#: Most shard coordinates walked to find the shard boundaries of one axis.
_MAX_BOUNDARY_WALK = 1 << 16


# ---- chunk shapes that follow the shards ------------------------------------------------------------
def _shard_mesh_dims(layout: Layout, ndim: int) -> dict[int, list[int]]:
    """Sample axis -> the mesh dims that shard it."""
    out: dict[int, list[int]] = {}
    for mesh_dim, axis in enumerate(layout.shard_axes(ndim)):
        if axis >= 0:
            out.setdefault(axis, []).append(mesh_dim)
    return out


def shard_boundaries(layout: Layout, sample_shape: Sequence[int]) -> dict[int, list[tuple[int, int]]]:
    """Sample axis -> the owned ``(start, stop)`` of every shard along it (empty shards left out)."""
    shape = tuple(sample_shape)
    ndim = len(shape)
    out = {}
    for axis, dims in _shard_mesh_dims(layout, ndim).items():
        count = math.prod(layout.mesh.shape[d] for d in dims)
        if count > _MAX_BOUNDARY_WALK:
            raise UsageError(f"axis {axis} is split into {count} shards; chunk advice walks at most "
                             f"{_MAX_BOUNDARY_WALK}: give --chunks explicitly")
        coordinate = [0] * layout.mesh.ndim
        spans = set()
        for combo in itertools.product(*(range(layout.mesh.shape[d]) for d in dims)):
            for d, c in zip(dims, combo):
                coordinate[d] = c
            r = layout.region(shape, coordinate)
            if r.stop[axis] > r.start[axis]:
                spans.add((r.start[axis], r.stop[axis]))
        out[axis] = sorted(spans)
    return out


def aligned_chunks(layout: Layout, sample_shape: Sequence[int], itemsize: int,
                   max_bytes: int = MAX_CHUNK_BYTES, lead: int = 1) -> tuple[int, ...]:
    """The chunk shape of :func:`chunk_advice` (without its note)."""
    return chunk_advice(layout, sample_shape, itemsize, max_bytes, lead)[0]


def chunk_advice(layout: Layout, sample_shape: Sequence[int], itemsize: int,
                 max_bytes: int = MAX_CHUNK_BYTES, lead: int = 1) -> tuple[tuple[int, ...], str | None]:
    """The chunk shape, ``lead`` sample axes of 1 first, whose chunk grid follows the layout's shard
    boundaries: along a sharded axis the largest size that divides every shard boundary (one chunk
    per rank's owned region for ``chunk``/``physicsnemo`` splits); other axes whole. Halved (other
    axes first) while a chunk exceeds ``max_bytes``. A split whose boundaries share no useful common
    size (``even`` splits: 181, 180, 180, 180) gets the largest shard size: a window then touches at
    most two chunks along that axis.

    Returns ``(chunks, note)``: ``note`` is ``None`` when the chunk grid follows every shard
    boundary (a cold read of ~1.0x the window), else a plain sentence saying why no regular chunk
    grid can, and what would. The common width (the gcd of the boundaries) is taken, even when it is
    much smaller than a shard, while its chunks hold at least ``MIN_ALIGNED_CHUNK_BYTES``: smaller
    chunks cost more in per-chunk overhead than the extra bytes of a boundary-straddling chunk."""
    shape = tuple(int(s) for s in sample_shape)
    chunks = list(shape)
    spans = shard_boundaries(layout, shape)
    notes = []
    for axis, owned in spans.items():
        edges = sorted({e for span in owned for e in span if 0 < e < shape[axis]})
        sizes = [b - a for a, b in owned]
        step = 0
        for e in edges:
            step = math.gcd(step, e)
        # bytes of one chunk of width step along this axis, the other axes whole (before capping)
        step_bytes = step * itemsize * math.prod(shape[a] for a in range(len(shape)) if a != axis)
        if not edges:
            chunks[axis] = shape[axis]
        elif step * 4 >= min(sizes) or step_bytes >= MIN_ALIGNED_CHUNK_BYTES:
            chunks[axis] = step
        else:
            chunks[axis] = max(sizes)
            notes.append(
                f"the shards of axis {axis} ({'/'.join(map(str, sizes))} cells) have boundaries {edges} whose "
                f"only common chunk width is {step} cell{'s' if step != 1 else ''} ({_bytes(step_bytes)} chunks, "
                f"{-(-min(sizes) // step)}+ per window: too small to be worth it); regular HDF5/Zarr chunks cannot "
                f"follow shards of unequal sizes, so chunks of {max(sizes)} cells straddle the boundaries and a "
                "window reads up to two of them along that axis. For ~1.0x: shard sizes that are multiples of one "
                f"width (e.g. --split chunk: {'/'.join(map(str, _chunk_sizes(shape[axis], len(sizes))))})")
            log.info("chunk advice: %s", notes[-1])
    sharded = set(spans)
    while math.prod(chunks) * itemsize > max_bytes:
        free = [a for a in range(len(shape)) if a not in sharded and chunks[a] > 1]
        pool = free or [a for a in sharded if chunks[a] > 1 and chunks[a] % 2 == 0] or \
            [a for a in range(len(shape)) if chunks[a] > 1]
        if not pool:
            break
        a = max(pool, key=lambda i: chunks[i])
        chunks[a] = -(-chunks[a] // 2)
    return (1,) * lead + tuple(chunks), ("; ".join(notes) or None)


def _chunk_sizes(n: int, k: int) -> list[int]:
    from dali_mesh.partition import split_sizes  # noqa: PLC0415

    return list(split_sizes(n, k, "chunk"))


def _bytes(n: int) -> str:
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.0f} {unit}"
    return f"{n} B"


def chunked_cold_bytes(plan: WindowPlan, chunks: Sequence[int], itemsize: int, prefix: Sequence[int] = ()) -> int:
    """Bytes of the (uncompressed) chunks of shape ``chunks`` that the boxes of ``plan`` touch,
    each chunk counted once."""
    chunk_bytes = math.prod(chunks) * itemsize
    seen = set()
    for _, fst, ln in plan.boxes():
        full_start = tuple(prefix) + tuple(fst)
        full_len = (1,) * len(prefix) + tuple(ln)
        seen.update(itertools.product(*chunk_ranges(full_start, full_len, chunks)))
    return len(seen) * chunk_bytes


#: ``plan --data`` plans windows of at most this many cells along any one axis
MAX_ADVICE_AXIS_CELLS = 1 << 26


# ---- what an epoch fetches from an object store, and what it costs --------------------------------------------
class Prices(NamedTuple):
    """An object store's published prices in USD: per 1,000 GET requests, and per GB (10^9 bytes) sent out
    of its region (0 for readers inside the region: S3 charges no transfer to EC2 in the bucket's region)."""

    get_per_1000: float
    egress_per_gb: float

    def cost(self, requests: int, nbytes: int) -> tuple[float, float]:
        """``(GET requests, egress)`` in USD."""
        return requests / 1000 * self.get_per_1000, nbytes / 1e9 * self.egress_per_gb


#: S3 Standard in us-east-1, as AWS's S3 pricing page lists them (aws.amazon.com/s3/pricing): GET $0.0004
#: per 1,000 requests; data transfer out to the internet $0.09 per GB (100 GB to 10 TB a month: the free first
#: 100 GB and the cheaper tiers above 10 TB are left out). Values of 2026-12-05 (docs/cli.md says how read).
S3_STANDARD = Prices(0.0004, 0.09)
#: ``plan --data`` plans the epochs of at most this many distinct windows (each plans every sample id) ...
MAX_EPOCH_WINDOWS = 64
#: ... and adds up the epochs of all ranks of meshes of at most this many ranks
MAX_EPOCH_RANKS = 4096
#: what the counts take of the reader's settings: ``read_windows``' default ``task_bytes``
EPOCH_TASK_BYTES = 4 << 20


class TooManyWindows(Exception):
    """More distinct windows than :data:`MAX_EPOCH_WINDOWS` would be planned."""


class EpochCounter:
    """Per rank, what one epoch (epoch 0, in the sample order: every sample id of the rank's share of the
    dataset, or of its read group's batches with ``share``) fetches from the object store, as the native
    reader's own code counts it (:meth:`PlanEpochs.epoch <dali_mesh.plan.plan_set.PlanEpochs.epoch>`, through
    csrc/reader/fetch_epoch.h), at each store's round-trip cost as measured so far. Plans are made once per
    distinct window (a plan holds every sample id: ranks that differ only in their samples share it), with
    the Blosc header read from one chunk of each array (16 bytes, one request)."""

    def __init__(self, target: "LayoutTarget", share, batch_size: int = 1) -> None:
        self.target = target
        self.share = share
        self.batch_size = int(batch_size)
        self._plans: dict = {}    # window -> (the source reading it, its PlanEpochs)
        self._epochs: dict = {}   # (window, sample group, group member) -> EpochFetches
        self._headers: dict = {}  # (key, offset) -> the first 16 bytes of a chunk

    def rank(self, layout: Layout) -> EpochFetches:
        """The epoch of the rank whose layout is ``layout``."""
        from dali_mesh.partition.read_groups import GroupReads, OwnReads, group_index, share_dims  # noqa: PLC0415

        dims = share_dims(layout, self.share)
        reads = GroupReads(dims) if dims else OwnReads()
        window = _window_key(reads.region_of(layout, self.target.sample_shape))
        key = (window, layout.batch_index, group_index(layout, dims) if dims else 0)
        hit = self._epochs.get(key)
        if hit is None:
            reader, fetches = self._plan(window, layout)
            # the reader's own sample order (WindowSource.sample_order), for this rank's coordinate
            order = reader.reads.order_of(layout, layout.order(
                reader.num_samples, 0, seed=reader.seed, shuffle=reader.shuffle, batch_size=reader.batch_size,
                drop_last=reader.drop_last))
            hit = self._epochs[key] = fetches.epoch(order.arrays()[0], self.batch_size)
        return hit

    def _plan(self, window, layout: Layout):
        hit = self._plans.get(window)
        if hit is None:
            from dali_mesh.pipeline.native import plan_source  # noqa: PLC0415

            if len(self._plans) >= MAX_EPOCH_WINDOWS:
                raise TooManyWindows
            reader = self.target.source(layout, epoch=True, batch_size=self.batch_size, share=self.share).group_reader()
            plans = plan_source(reader)
            headers = blosc_headers(plans, self.target.path, self._headers)
            hit = self._plans[window] = (reader, plans.fetches(EPOCH_TASK_BYTES, headers, _store_costs(plans)))
        return hit

    def total(self, layout_of, size: int) -> EpochFetches | None:
        """The epochs of all ``size`` ranks added up (``round_trips``: the most of one rank; ``batches``: all
        the ranks' batches), or ``None`` for a mesh larger than :data:`MAX_EPOCH_RANKS`."""
        if size > MAX_EPOCH_RANKS:
            return None
        return EpochFetches.added([self.rank(layout_of(r)) for r in range(size)])


def blosc_headers(plans, location, cache: dict | None = None) -> dict[int, bytes]:
    """Coder -> the first 16 bytes of one of its chunks (their Blosc header: the block size), read from the
    store of ``location`` (``cache``: ``(key, offset) -> bytes`` already read)."""
    store, _ = store_of(location)
    cache = {} if cache is None else cache
    out = {}
    for coder, file, offset in plans.blosc_probes():
        where = (plans.files[file].key, offset)
        if where not in cache:
            cache[where] = store.read_range(where[0], offset, 16)
        out[coder] = cache[where]
    return out


def _store_costs(plans) -> list[tuple[float, float]]:
    """Per store of the plan file (its store table: the files' stores in the order they first appear), what a
    request costs as this process measured it so far (0: not measured), as the reader would weigh it now."""
    specs = list(dict.fromkeys(f.store for f in plans.files)) or ["file"]
    return [store_round_trip(spec) if spec != "file" else (0.0, 0.0) for spec in specs]


def _window_key(region: Region) -> tuple:
    return (region.window_start, region.window_stop, region.domain_start, region.domain_stop, region.boundary,
            region.fill_value)


def usd(x: float) -> str:
    """A price in USD: cents above a dollar, else three significant digits (an epoch may cost 10^-6 USD)."""
    if x < 0:
        return "-" + usd(-x)
    if x >= 1 or x == 0:
        return f"${x:,.2f}"
    return f"${x:.{min(12, 2 - math.floor(math.log10(x)))}f}"


def epoch_record(e: EpochFetches, prices: Prices, batch_size: int) -> dict:
    """One rank's epoch as plain values (``--json``)."""
    get, egress = prices.cost(e.requests, e.bytes)
    return {"samples": e.batches * batch_size, "batches": e.batches, "requests": e.requests,
            "round_trips": e.round_trips, "max_round_trips_per_batch": e.max_round_trips, "bytes": e.bytes,
            "estimated_chunk_reads": e.parts_chunks, "get_usd": get, "egress_usd": egress, "usd": get + egress,
            "get_price_per_1000": prices.get_per_1000, "egress_price_per_gb": prices.egress_per_gb}


def _epoch_text(e: EpochFetches, prices: Prices, fmt, per_rank: bool, batch_size: int) -> str:
    get, egress = prices.cost(e.requests, e.bytes)
    about = "~" if e.parts_chunks else ""
    trips = (f"{_n(e.round_trips, 'round trip')} (at most {e.max_round_trips} a batch)" if per_rank else
             f"at most {_n(e.round_trips, 'round trip')} on one rank")
    return ((f"{_n(e.batches * batch_size, 'sample')} in " if per_rank else "") + f"{_n(e.batches, 'batch')}: "
            f"{about}{_n(e.requests, 'request')}, {trips}, {about}{fmt(e.bytes)}: {usd(get)} GET + {usd(egress)} "
            f"egress = {usd(get + egress)}"
            + (f" ({_n(e.parts_chunks, 'chunk read')} in parts estimated)" if e.parts_chunks else ""))


def _n(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 'es' if word.endswith('ch') else 's'}"


# ---- what a cold read of a window costs, per format ------------------------------------------------------
class LayoutTarget:
    """A data file whose layout is judged against a split, from its format's
    :class:`~dali_mesh.formats.cold_reads.ColdReads`. ``cost(region)`` gives ``(needed_bytes, cold_bytes)``
    of one sample's window."""

    def __init__(self, cold: ColdReads, files: Sequence[str] = ()) -> None:
        self.cold = cold
        self.files = list(files) or [cold.path]  # every data file of --data (an epoch reads them all)
        self.format = cold.format
        self.path = cold.path  # read from; printed only as self.shown (no presigned query, no user info)
        self.shown = shown(cold.path)
        self.name = cold.name
        self.sample_shape = cold.sample_shape
        self.dtype = cold.dtype
        self.chunks = cold.chunks  # stored chunk shape (prefix axes included), None: contiguous
        self.prefix = cold.prefix
        self._cache: dict = {}
        self._worst: tuple[float, int] | None = None
        self._totals = [0, 0]

    def cost(self, region: Region) -> tuple[int, int]:
        """``(needed_bytes, cold_bytes)``: the bytes of the window cells read from storage (halo
        cells copied or filled inside the window excluded), and the bytes a cold read asks for."""
        key = (region.window_start, region.window_stop, region.domain_start, region.domain_stop, region.boundary)
        hit = self._cache.get(key)
        if hit is None:
            if max(region.window_shape) > MAX_ADVICE_AXIS_CELLS:
                # a window plan holds a few integers per cell of each axis
                raise UsageError(f"{self.shown}: a window spans {max(region.window_shape)} cells on one axis; "
                                 f"plan --data plans at most {MAX_ADVICE_AXIS_CELLS} per axis, and at most "
                                 f"{MAX_ADVICE_CHUNKS} separate byte ranges or chunks per window")
            plan = plan_window(region)
            needed = 0 if plan.empty else plan.read_cells * self.dtype.itemsize
            hit = (needed, self.cold.cold_bytes(plan))  # .npy: the header is read even for an empty window
            if len(self._cache) < 4096:  # replicas and sample groups repeat the same few windows
                self._cache[key] = hit
        return hit

    def annotate(self, layout: Layout, rows: Iterable[dict]) -> Iterator[dict]:
        """Add ``needed_bytes`` and ``cold_bytes`` to plan rows (one sample's window each)."""
        for r in rows:
            region = layout.region(self.sample_shape, layout.mesh.coordinate_of(r["rank"]))
            needed, cold = self.cost(region)
            r["needed_bytes"], r["cold_bytes"] = needed, cold
            self._totals[0] += needed
            self._totals[1] += cold
            ratio = cold / needed if needed else 0.0
            if self._worst is None or ratio > self._worst[0]:
                self._worst = (ratio, r["rank"])
            yield r

    def suggestion(self, layout: Layout) -> tuple[tuple[int, ...], float]:
        """A chunk shape aligned with the shards (sample axis first) and the worst cold/needed ratio
        it would give over the ranks' windows."""
        chunks = aligned_chunks(layout, self.sample_shape, self.dtype.itemsize)
        return chunks, self.chunked_ratio(layout, chunks)

    def chunked_ratio(self, layout: Layout, chunks: Sequence[int]) -> float:
        """The worst cold/needed ratio over the ranks' windows were the data chunked ``chunks``."""
        worst = 0.0
        seen = set()
        # the windows differ only along sharded axes: walk the shard coordinates, as the boundaries do
        dims = [d for d, a in enumerate(layout.shard_axes(len(self.sample_shape))) if a >= 0]
        count = math.prod(layout.mesh.shape[d] for d in dims)
        if count > _MAX_BOUNDARY_WALK:
            return float("nan")
        coordinate = [0] * layout.mesh.ndim
        for combo in itertools.product(*(range(layout.mesh.shape[d]) for d in dims)):
            for d, c in zip(dims, combo):
                coordinate[d] = c
            region = layout.region(self.sample_shape, coordinate)
            key = (region.window_start, region.window_stop)
            if key in seen:
                continue
            seen.add(key)
            plan = plan_window(region)
            if plan.empty:
                continue
            needed = plan.read_cells * self.dtype.itemsize
            worst = max(worst, chunked_cold_bytes(plan, chunks, self.dtype.itemsize, (0,)) / needed)
        return worst

    def native_path(self, layout: Layout) -> str:
        """Which reader ``read_windows`` takes for this file with ``layout`` (its first sample planned,
        as the pipeline would plan it), and why: one line."""
        from dali_mesh.plan import CODECS, NotNativeError  # noqa: PLC0415
        from dali_mesh.pipeline.native import plan_source  # noqa: PLC0415

        try:
            plans = plan_source(self.source(layout))
        except NotNativeError as e:
            return f"reader: partitioned_source (the native reader falls back: {scrub(str(e), [self.path])})"
        except (OSError, ValueError, RuntimeError) as e:  # e.g. no kernels library in this install
            return f"reader: not checked ({type(e).__name__}: {scrub(str(e), [self.path])})"
        names = {v: k for k, v in CODECS.items()}
        used = sorted({names.get(i, str(i)) for c in plans.coders for i in c.ids})
        return "reader: native (read_windows)" + (f", decoding {'+'.join(used)} chunks on DALI's threads, each "
                                                  "chunk once per batch" if used else "")

    def source(self, layout: Layout, *, epoch: bool = False, batch_size: int = 1, **kw):
        """The source that reads this file's first sample with ``layout`` (``kw``: e.g. ``share``), or with
        ``epoch`` every sample of every file of ``--data`` (in order, batches of ``batch_size``)."""
        from dali_mesh.source import array_source, file_source  # noqa: PLC0415

        files = self.files if epoch else [self.path]
        if not self.format.steps:
            return file_source(files, layout, format=self.format, batch_size=batch_size, shuffle=False, **kw)
        return array_source(files, self.name, layout, format=self.format, batch_size=batch_size, shuffle=False,
                            **({} if epoch else {"time_range": (0, 1)}), **kw)

    def costs_round_trips(self) -> bool:
        """Whether a request for this data costs a round trip (its store's :attr:`~dali_mesh.storage.ByteStore.
        round_trip`): then what the native reader fetches, in requests and bytes, is worth showing and pricing."""
        return store_of(self.path)[0].round_trip[0] > 0

    def fetch_lines(self, layout_of, ranks, share=None, fmt=str) -> list[str]:
        """For data in object storage: per rank (``layout_of(rank)``: its layout), the bytes and requests
        the native reader fetches for one sample (its plan's, before any cache), and with ``share`` per
        rank of a read group (``fmt``: how a byte count is shown); nothing for local files."""
        from dali_mesh.plan import NotNativeError  # noqa: PLC0415
        from dali_mesh.pipeline.native import plan_source  # noqa: PLC0415

        if not self.costs_round_trips():
            return []
        shown = list(ranks[:8])
        cells = []
        try:
            for rank in shown:
                plans = plan_source(self.source(layout_of(rank)))
                n = plans.item_requests(0)
                cells.append(f"rank {rank}: {fmt(plans.item_read_bytes(0))} in {n} request{'s' * (n != 1)}")
            lines = ["fetched from the object store per sample by the native reader (at least; a Blosc chunk "
                     "read in parts takes 2-3 requests and fewer bytes): " + "; ".join(cells)
                     + ("; ..." if len(ranks) > len(shown) else "")]
            if share is not None:
                from dali_mesh.partition.read_groups import group_coordinates, share_dims  # noqa: PLC0415

                layout = layout_of(shown[0])
                dims = share_dims(layout, share)
                if dims:
                    g = len(group_coordinates(layout, dims))
                    plans = plan_source(self.source(layout, share=share).group_reader())
                    got, n = plans.item_read_bytes(0), plans.item_requests(0)
                    lines.append(f"with share={share if isinstance(share, str) else ','.join(share)}: one member of "
                                 f"each group of {g} fetches the group window's {fmt(got)} in {n} request{'s' * (n != 1)} per "
                                 f"sample: {fmt(got // g)} and {n / g:.1f} requests per rank on average")
        except NotNativeError as e:
            return [f"fetched from the object store: not planned natively ({scrub(str(e), [self.path])})"]
        return lines

    def epoch_lines(self, layout_of, ranks, share=None, *, batch_size: int = 1, prices: Prices = S3_STANDARD,
                    fmt=str) -> list[str]:
        """For data in object storage: per rank (``layout_of(rank)``: its layout; the first 8 of ``ranks``) and
        for all ranks, the requests, round trips and bytes of one epoch as the native reader fetches them
        (:class:`EpochCounter`) and what they cost at ``prices``; with ``share`` the same for read groups and
        what sharing saves. Nothing for local files."""
        from dali_mesh.plan import NotNativeError  # noqa: PLC0415

        if not self.costs_round_trips():
            return []
        size = layout_of(ranks[0]).mesh.size
        lines = [f"one epoch from the object store per rank, as the native reader fetches it (batches of "
                 f"{batch_size}, read_windows' task_bytes {EPOCH_TASK_BYTES >> 20} MiB):"]
        totals = []
        for variant in [None] + ([share] if share is not None else []):
            counter = EpochCounter(self, variant, batch_size)
            try:
                rows = [(r, counter.rank(layout_of(r))) for r in ranks[:8]]
            except NotNativeError as e:
                return [f"one epoch from the object store: not planned natively ({scrub(str(e), [self.path])})"]
            try:
                total = counter.total(layout_of, size)
                why = f"not added up (more than {MAX_EPOCH_RANKS} ranks)"
            except TooManyWindows:
                total, why = None, f"not added up (the ranks have more than {MAX_EPOCH_WINDOWS} windows to plan)"
            except NotNativeError as e:
                total, why = None, f"not added up (a window is not planned natively: {scrub(str(e), [self.path])})"
            if variant is not None:
                name = share if isinstance(share, str) else ",".join(share)
                lines.append(f"with share={name} (each batch read once per read group, by one member; the windows "
                             "exchanged):")
            lines += [f"  rank {r}: {_epoch_text(e, prices, fmt, True, batch_size)}" for r, e in rows]
            if len(ranks) > len(rows):
                lines.append(f"  ... ({len(ranks) - len(rows)} more ranks)")
            lines.append(f"  all {size} ranks: " + (_epoch_text(total, prices, fmt, False, batch_size) if total else why))
            totals.append(total)
        if len(totals) == 2 and all(totals):
            (own, grouped), name = totals, share if isinstance(share, str) else ",".join(share)
            before, after = (sum(prices.cost(t.requests, t.bytes)) for t in totals)
            lines.append(f"share={name} {'saves' if before >= after else 'costs'} {usd(abs(before - after))} an epoch "
                         f"{'' if before >= after else 'more '}over all ranks"
                         + (f" ({(before - after) / before:.0%} of {usd(before)})" if before else "")
                         + f": {own.requests - grouped.requests} fewer requests, {fmt(own.bytes - grouped.bytes)} "
                         "fewer bytes")
        lines += ["round trips: every request of a batch is sent at once; a Blosc chunk read in parts takes 2 (its "
                  "header and block index, then its blocks), a raw read task its requests one after another; reading "
                  "ahead overlaps a batch's round trips with the use of the batch before",
                  f"prices: ${prices.get_per_1000:g} per 1,000 GET requests (--get-price), ${prices.egress_per_gb:g} "
                  "per GB out of the store's region (--egress-price; 0 for readers inside the region); the defaults "
                  "are S3 Standard's, us-east-1"]
        return lines

    def epoch_rows(self, layout_of, rows: Iterable[dict], share=None, *, batch_size: int = 1,
                   prices: Prices = S3_STANDARD) -> Iterator[dict]:
        """Add ``epoch`` (and with ``share`` ``epoch_share``) to plan rows: :func:`epoch_record` of the rank's
        epoch (:meth:`epoch_lines`), for data in object storage; ``None`` where not counted."""
        from dali_mesh.plan import NotNativeError  # noqa: PLC0415

        remote = self.costs_round_trips()
        counters = {"epoch": EpochCounter(self, None, batch_size)}
        if share is not None:
            counters["epoch_share"] = EpochCounter(self, share, batch_size)
        for r in rows:
            for name, counter in counters.items() if remote else ():
                try:
                    r[name] = epoch_record(counter.rank(layout_of(r["rank"])), prices, batch_size)
                except (NotNativeError, TooManyWindows):
                    r[name] = None
            yield r

    def summary(self, layout: Layout) -> list[str]:
        """Lines after the table: totals, the worst rank, and a chunk shape when the ratio is high."""
        needed, cold = self._totals
        if not needed:
            return [f"{self.shown}: the windows read nothing from storage", self.native_path(layout)]
        worst, rank = self._worst
        what = self.format.label
        layout_text = "contiguous" if self.chunks is None else f"chunks {self.chunks}"
        lines = [f"cold read of one sample per rank: {cold / needed:.2f}x the window bytes in all "
                 f"({what} {self.shown}, {layout_text}); worst rank {rank}: {worst:.2f}x", self.native_path(layout)]
        if worst > ADVICE_RATIO:
            chunks, note = chunk_advice(layout, self.sample_shape, self.dtype.itemsize)
            after = self.chunked_ratio(layout, chunks)
            already = self.chunks is not None and tuple(self.chunks) == tuple(chunks)
            if note is None and not after > ADVICE_RATIO:
                lines.append(f"advice: store the data chunked {chunks} (sample axis first; HDF5 or Zarr) to read "
                             f"~{after:.2f}x: dali-mesh convert {self.shown} OUT.zarr (or OUT.h5) with the same "
                             "--mesh/--shard/--split")
            else:
                best = (f"The data already has the best regular chunks found ({chunks}, ~{after:.2f}x): "
                        "converting again will not help" if already else
                        f"The best regular chunks found, {chunks}, read ~{after:.2f}x (dali-mesh convert with the "
                        "same --mesh/--shard/--split writes them)")
                lines.append(f"advice: no chunk shape aligned with these shards reads ~1.0x"
                             + (f": {note}" if note else "") + f". {best}")
        return lines


def open_layout_target(path: str, dataset: str | None = None, *, allow_external: bool = False) -> LayoutTarget:
    """The :class:`LayoutTarget` of ``--data`` (a folder: its first data file, by name): its format's
    :meth:`~dali_mesh.formats.ArrayFormat.advice_target`. ``allow_external``: read HDF5 datasets kept in
    or linked to other files (``--allow-external``)."""
    fmt, files = find_data(path)
    if dataset and not fmt.steps:  # a format of one array per location names none
        raise UsageError(f"--dataset names an HDF5 dataset or Zarr array; a {fmt.label} has none")
    return LayoutTarget(fmt.advice_target(files[0], dataset, **fmt.trust_options(allow_external)), files)
