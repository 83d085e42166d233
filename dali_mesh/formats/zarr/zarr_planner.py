"""Plan the native reads of a Zarr array's steps (v2 or v3, uncompressed or with the codecs the native
reader decodes, sharded or not): its chunk objects, the inner chunks of its shards, or, in a reference
set (``reference://``), the ranges of the original files that hold its chunks; what
:class:`~dali_mesh.formats.zarr.zarr_format.ZarrFormat` ``plan_steps`` returns. And the names of an
array's codecs, which ``dali-mesh plan`` describes."""
from __future__ import annotations

import math
import os
from typing import NamedTuple

import numpy as np

from dali_mesh.io._common import DataFileError, HeaderError, NotRegularFileError
from dali_mesh.plan import plan_window
from dali_mesh.plan.chunks import (StepReads, check_coded_chunk, chunk_coords, chunk_pieces, count_chunk_pieces,
                                   piece_plans, same_dtype, too_many_parts)
from dali_mesh.plan import (CHECK_JSON, CODEC_LIBRARIES, CODECS, Coder, NotNativeError, PlanSet, ReadPlan, native_dtype_of, native_store)
from dali_mesh.partition import Region
from dali_mesh.storage import ByteStore, MissingFileError, Version, store_of
from dali_mesh.formats.zarr.zarr_reader import open_zarr_array
from dali_mesh.storage.byte_store import read_exactly

__all__ = ["plan_zarr_steps", "zarr_codec_names"]


#: Zarr v2 compressors (numcodecs ``codec_id``) and Zarr v3 bytes-to-bytes codecs the reader decodes, as
#: codec names of the codec table (``read_plan.CODECS``; tests/io/test_codec_table.py checks each is there).
#: v2 filters are the compressors and numcodecs' Shuffle (Kerchunk writes HDF5's shuffle + deflate as
#: ``filters: [shuffle, zlib]`` with no compressor); v3 names numcodecs' codecs ``numcodecs.<id>`` (what
#: VirtualiZarr writes and zarr-python 3.1 loads through its numcodecs wrappers)
_V2_COMPRESSORS = ("blosc", "zstd", "lz4", "zlib", "gzip")
_V2_FILTERS = ("shuffle", *_V2_COMPRESSORS)
_V3_CODECS = {"BloscCodec": "blosc", "ZstdCodec": "zstd", "GzipCodec": "gzip", "numcodecs.shuffle": "shuffle",
              "numcodecs.zlib": "zlib", "numcodecs.gzip": "gzip", "numcodecs.zstd": "zstd", "numcodecs.lz4": "lz4"}


def _codec_steps(name: str, path: str, arr) -> tuple[tuple[int, int], ...]:
    """The coder steps of one decompressor (Blosc's argument: the type size its header must hold,
    the array's item size, as numcodecs and Zarr v3 write it), or :class:`NotNativeError` when this
    build lacks its library."""
    from dali_mesh import _kernels

    cid = CODECS[name]
    if not _kernels.codec_available(cid):
        what = "crc32c-checked" if name == "crc32c" else f"{name}-compressed"
        raise NotNativeError(f"{path}: Zarr array {arr.path!r} is {what}, but this build of the native "
                             f"reader has no {CODEC_LIBRARIES[name]} (it was not found when the plugin was built); "
                             "it is decoded by partitioned_source")
    return ((cid, np.dtype(arr.dtype).itemsize if name == "blosc" else 0),)


def _codec_label(codec) -> str:
    """A codec's name as its metadata says it: a numcodecs ``codec_id`` (v2), ``numcodecs.<id>`` (a v3
    numcodecs codec) or zarr-python's class name (a v3 codec of its own)."""
    return getattr(codec, "codec_name", None) or getattr(codec, "codec_id", None) or type(codec).__name__


def _config(codec) -> dict:
    """A numcodecs codec's configuration (v2: ``get_config()``; v3: the wrapper's ``codec_config``)."""
    config = getattr(codec, "codec_config", None)
    return dict(config) if config is not None else dict(codec.get_config())


def _chain_steps(chain, table: dict, path, arr, what: str) -> tuple[tuple[int, int], ...]:
    """The coder steps (decode order) of ``chain``, codecs that encode a chunk's bytes in this order
    (v2 filters then the compressor; v3 the codecs after ``bytes``), ``table`` naming each's codec of the
    table: numcodecs shuffles, then at most one decompressor (Blosc only on the array's own bytes, whose
    item size its header holds). :class:`NotNativeError` names a codec or an order the reader does not run."""
    labels = [_codec_label(c) for c in chain]
    names = [table.get(label) for label in labels]
    zips = [i for i, n in enumerate(names) if n not in (None, "shuffle")]
    if None in names or len(zips) > 1 or (zips and zips[0] != len(names) - 1) or \
            ("blosc" in names and len(names) > 1):
        compressors = sorted(label for label, name in table.items() if name != "shuffle")
        raise NotNativeError(f"{path}: Zarr array {arr.path!r} has {what} {labels}; the native reader decodes "
                             f"numcodecs shuffles followed by at most one of {compressors} (Blosc alone); it is "
                             "decoded by partitioned_source")
    chunk_bytes = math.prod(arr.chunks) * np.dtype(arr.dtype).itemsize
    steps = ()
    for codec, name in zip(chain, names):
        if name != "shuffle":
            steps = _codec_steps(name, path, arr) + steps
            continue
        # numcodecs' Shuffle by its own element size, whatever the dtype's (HDF5's is the item size):
        # byte j of element i at j * count + i, as csrc/codecs/shuffle.cc undoes it; <= 1: a copy
        size = int(_config(codec).get("elementsize", 4))
        if size <= 1:
            continue
        if chunk_bytes % size or size > 1 << 20:
            raise NotNativeError(f"{path}: Zarr array {arr.path!r} is shuffled by element size {size}, which does "
                                 f"not divide its chunks' {chunk_bytes} bytes (numcodecs refuses to decode them); "
                                 "it is read by partitioned_source")
        steps = ((CODECS["shuffle"], size),) + steps
    return steps


class _Coding(NamedTuple):
    """How an array's chunks are stored: the dtype of a chunk's decoded bytes (its byte order as
    stored), the coder steps that decode a stored chunk (``None``: stored raw), and, for a sharded
    v3 array, the shard shape and where its index lies (``None``: chunks are files)."""

    stored: np.dtype
    steps: tuple | None
    shard: tuple[int, ...] | None = None
    index_at_end: bool = True
    index_crc: bool = False
    fortran: bool = False  # chunks in Fortran order (v2 order "F", v3 transpose to the reversed axes)


def _v3_codecs(codecs, path, arr, what: str) -> tuple[np.dtype, tuple | None, bool]:
    """The stored dtype, coder steps and Fortran order of a v3 codec list [transpose to the
    reversed axes] ``bytes`` [+ numcodecs shuffles] [+ one compressor] [+ crc32c] (decoded in the
    other order: the checksum verified first, then the compressor, then the shuffles)."""
    names = [_codec_label(c) for c in codecs]
    fortran = bool(names) and names[0] == "TransposeCodec"
    if fortran:
        order = tuple(int(a) for a in codecs[0].order)
        if order != tuple(range(len(order)))[::-1]:
            raise NotNativeError(f"{path}: Zarr array {arr.path!r} has TransposeCodec(order={order}); the native "
                                 "reader reads chunks in C order or transposed to the reversed axes (Fortran "
                                 "order); it is decoded by partitioned_source")
        codecs, names = codecs[1:], names[1:]
    crc = bool(names) and names[-1] == "Crc32cCodec"
    body = names[:-1] if crc else names
    if not body or body[0] != "BytesCodec":
        raise NotNativeError(f"{path}: Zarr array {arr.path!r} has {what} {names}; the native reader decodes bytes "
                             f"followed by numcodecs shuffles and at most one of {sorted(_V3_CODECS)}, then "
                             "optionally crc32c, after a transpose to the reversed axes or none, in a shard or not; "
                             "it is decoded by partitioned_source")
    dtype = np.dtype(arr.dtype)
    endian = getattr(codecs[0].endian, "value", None)
    if dtype.itemsize > 1 and endian in ("little", "big"):
        dtype = dtype.newbyteorder("<" if endian == "little" else ">")
    if len(body) == 2 and body[1] == "BloscCodec":
        _check_v3_blosc(codecs[1], path, arr)
    steps = _chain_steps(codecs[1:len(body)], _V3_CODECS, path, arr, what)
    if crc:
        steps = _codec_steps("crc32c", path, arr) + steps
    return dtype, steps or None, fortran


def _check_v3_blosc(codec, path, arr) -> None:
    """:class:`NotNativeError` for a ``BloscCodec`` whose chunks c-blosc2 would decode other than
    numcodecs (c-blosc1) does: bit shuffle by a ``typesize`` that does not divide the chunk's bytes
    (its last block is then not a whole number of items; see csrc/codecs/blosc.cc BloscHeader)."""
    typesize = getattr(codec, "typesize", None)
    shuffle = str(getattr(getattr(codec, "shuffle", None), "value", getattr(codec, "shuffle", "")))
    chunk_bytes = int(np.prod(arr.chunks)) * np.dtype(arr.dtype).itemsize
    if typesize and shuffle == "bitshuffle" and chunk_bytes % int(typesize):
        raise NotNativeError(f"{path}: Zarr array {arr.path!r} is Blosc bit-shuffled by typesize {typesize}, which "
                             f"does not divide its chunks' {chunk_bytes} bytes (c-blosc2 decodes their last block "
                             "other than numcodecs does); it is decoded by partitioned_source")


def _zarr_coding(arr, path) -> _Coding:
    """How ``arr``'s chunks are stored (:class:`_Coding`), or :class:`NotNativeError` naming what the
    native reader does not decode (a filter, a codec, a transposition other than to the reversed axes)."""
    md = arr.metadata
    dtype = np.dtype(arr.dtype)
    if md.zarr_format == 2:
        fortran = md.order == "F"
        chain = list(md.filters or ()) + ([md.compressor] if md.compressor is not None else [])
        table = {name: name for name in _V2_FILTERS}
        labels = [_codec_label(c) for c in chain]
        if md.compressor is not None and labels[-1] not in _V2_COMPRESSORS:
            raise NotNativeError(f"{path}: Zarr array {arr.path!r} has compressor {labels[-1]!r}, which the native "
                                 f"reader does not decode (it decodes {', '.join(_V2_COMPRESSORS)}); it is decoded by "
                                 "partitioned_source")
        if any(label not in table for label in labels[:len(md.filters or ())]):
            raise NotNativeError(f"{path}: Zarr array {arr.path!r} has filters {labels[:len(md.filters)]}, which the "
                                 f"native reader does not apply (it applies {', '.join(_V2_FILTERS)}); it is decoded "
                                 "by partitioned_source")
        steps = _chain_steps(chain, table, path, arr, "filters and compressor")
        return _Coding(dtype, steps or None, fortran=fortran)
    if type(md.chunk_grid).__name__ != "RegularChunkGrid":
        raise NotNativeError(f"{path}: Zarr array {arr.path!r} has chunk grid {type(md.chunk_grid).__name__}; it is "
                             "read by partitioned_source")
    names = [type(c).__name__ for c in md.codecs]
    if names == ["ShardingCodec"]:
        sc = md.codecs[0]
        stored, steps, fortran = _v3_codecs(sc.codecs, path, arr, "inner codecs")
        index = [type(c).__name__ for c in sc.index_codecs]
        little = getattr(getattr(sc.index_codecs[0], "endian", None), "value", None) == "little" if index else False
        if index not in (["BytesCodec"], ["BytesCodec", "Crc32cCodec"]) or not little:
            raise NotNativeError(f"{path}: Zarr array {arr.path!r} has shard index codecs {index}; the native reader "
                                 "reads a little-endian index with or without crc32c; it is read by partitioned_source")
        # a coder without steps copies a raw inner chunk (sizes checked) out of the shard
        return _Coding(stored, steps or (), tuple(int(n) for n in md.chunk_grid.chunk_shape),
                       getattr(sc.index_location, "value", sc.index_location) == "end", len(index) == 2, fortran)
    stored, steps, fortran = _v3_codecs(md.codecs, path, arr, "codecs")
    return _Coding(stored, steps, fortran=fortran)


def _fill_bytes(arr, stored: np.dtype) -> bytes:
    """A missing chunk's value as zarr-python reads it (``fill_value``; none: zeros), one item in the
    stored byte order."""
    fv = arr.metadata.fill_value
    return np.asarray(0 if fv is None else fv).astype(stored).tobytes()


def plan_zarr_steps(store: str, name: str | None, steps: tuple[int, int], region: Region, *, plans: PlanSet,
                    max_parts: int, index_maps=None, merge_gap: int) -> StepReads:
    """The native reads of steps ``[first, stop)`` along axis 0 of the Zarr array ``name`` of the
    local store ``store`` (uncompressed v2/v3), as :func:`dali_mesh.formats.hdf5.plan_hdf5_steps`: per
    step the array's metadata file (checked, nothing read), then one part per box and chunk file
    touched (every chunk file is a raw C-order array of the full chunk shape), its plan shared by
    every step, its base the step's place in the chunk; then a finishing plan (boundary cells).
    Every chunk file needed is looked at once (its size): a missing one is :class:`NotNativeError`
    (``partitioned_source`` reads it as fill values)."""
    from dali_mesh import _kernels  # the canonical form of the metadata is the reader's own code

    l0, l1 = steps
    locals_ = np.arange(l0, l1, dtype=np.int64)
    arr = open_zarr_array(store, name, reuse=True)  # what the source's open read, not read again
    opened = getattr(getattr(arr.store, "_store", None), "opened", None)
    # a store the native reader has, or one that keeps its keys in files of stores it has (a Kerchunk
    # reference set: locate(key)), which it reads instead of the store's own objects
    bytes_store, root = store_of(store)
    locates = bytes_store.locates
    if not locates:
        native_store(store)  # NotNativeError when the native reader has no such store
    coding = _zarr_coding(arr, store)
    if locates and coding.shard:
        raise NotNativeError(f"{store}: a sharded array of a reference set is read in Python (its shards are "
                             "not located in their files natively yet)")
    stored, steps = coding.stored, coding.steps
    same_dtype(plans, native_dtype_of(stored, store), store)
    chunks = tuple(int(c) for c in arr.chunks)
    ct = chunks[0]
    chunk_bytes = math.prod(chunks) * stored.itemsize
    # a chunk's steps lie one step's bytes apart in C order, one item apart in Fortran order
    step_stride = stored.itemsize if coding.fortran else math.prod(chunks[1:]) * stored.itemsize
    wplan = plan_window(region, index_maps)
    shape = wplan.window_shape
    finish = plans.add_plan(ReadPlan.finishing(wplan, stored, coding.fortran))
    # the array's metadata file, checked whole at every read (a part that reads nothing): chunk
    # files of an array rewritten with another shape, chunking or dtype are refused, not read
    folder = os.path.join(root, *arr.path.split("/")) if arr.path else root
    meta = os.path.join(folder, ".zarray" if arr.metadata.zarr_format == 2 else "zarr.json")
    # an object store: the chunk objects' sizes and ETags from one listing of the array's folder (a
    # request per 1000 objects) instead of a HEAD request per chunk; the metadata object's too, and it
    # is read at that version (If-Match): its bytes and the ETag the plan names it by agree. Not a
    # reference set: its listing looks at every file it refers to, which _located_file looks at anyway
    listed = bytes_store if locates else _Listed.of(bytes_store, folder, opened)
    meta_version = listed.stat(meta) if isinstance(listed, _Listed) else None
    read = opened.objects.get(meta) if opened is not None else None
    try:
        if meta_version is not None and read is not None and read[1:] == (meta_version.size, meta_version.tag):
            meta_bytes = read[0]  # the open's GET named the version the listing names: those bytes
        elif meta_version is not None and not locates:  # a reference set's metadata is fixed: read as it is
            with bytes_store.open_version(meta, meta_version) as obj:
                meta_bytes = read_exactly(obj, meta_version.size, 0)
        else:
            meta_bytes = bytes_store.read_range(meta, 0, 1 << 30)
    except (OSError, DataFileError) as e:
        raise NotNativeError(f"{store}: the metadata file {meta} cannot be read ({e})") from None
    # in canonical form, attributes left out: adding one (z.attrs[...] = ...) rewrites zarr.json
    # but not the chunks, so the reads go on; any other change is refused
    canon = _kernels.canonical_json(meta_bytes)
    if canon is None:
        raise NotNativeError(f"{meta}: the metadata file is not one JSON object")
    # the metadata the opened array was made from must be the one the plan holds (and, in an object
    # store, names by its ETag): an array rewritten between the two reads would be planned with one
    # version's dtype, shape or codecs and read with the other's chunks
    opened = getattr(arr.store, "metadata", {}).get(
        "/".join(filter(None, (arr.path, ".zarray" if arr.metadata.zarr_format == 2 else "zarr.json"))))
    if opened is not None and _kernels.canonical_json(opened) != canon:
        raise DataFileError(meta, "the array's metadata changed while the plan was made (it differs from "
                            "the one the array was opened with); define the pipeline again")
    # a reference set's metadata is the set's own, read once and fixed for the store's life (its pickle
    # holds those bytes): nothing to check at read time, and no file of its own for the reader to open
    # (the part reads nothing from the first chunk's file: _meta_on_a_chunk_file)
    meta_plan = plans.add_plan(ReadPlan.reads_only(shape, stored, [], [], [], []) if locates else
                               ReadPlan.reads_only(shape, stored, [], [], [], [], canon, CHECK_JSON))
    # its size changes with its attributes: not checked. In an object store it is named by its ETag, and
    # the reader does not read it again: every chunk object the plan reads is pinned by its own ETag
    # (csrc/reader/open_file.cc)
    # a local file's version has no tag (its size and times are checked instead)
    meta_tag = (meta_version or bytes_store.stat(meta) or Version(-1)).tag.encode()
    meta_file = -1 if locates else plans.add_file(meta, store=bytes_store.spec, tag=meta_tag)
    too_many_parts(store, locals_.size * (1 + count_chunk_pieces(wplan, chunks)), max_parts, wplan)  # before they are made
    bytes_store = listed
    first_chunk = l0 // ct
    if steps is not None:
        check_coded_chunk(store, chunks, stored.itemsize)
        coder = plans.add_coder(Coder(steps, chunk_bytes, _fill_bytes(arr, stored)))
        chunk_of = _ShardIndex(arr, bytes_store, folder, plans, coding, chunks, coder) if coding.shard else \
            _chunk_files(arr, bytes_store, folder, plans, coder)
        pieces = chunk_pieces(wplan, chunks, stored, merge_gap, coding.fortran)
        if coding.shard:  # every shard index the steps need, in one round trip
            chunk_of.read_indexes(chunk_of.shard_of((c,) + coords) for _, coords in pieces
                                  for c in range(first_chunk, (l1 - 1) // ct + 1))
        parts = _coded_parts(plans, shape, chunks, stored, pieces, step_stride, chunk_of, locals_,
                             (meta_file, meta_plan))
        return _meta_on_a_chunk_file(parts, store, plans) if locates else parts, finish, wplan
    # the chunk files of the first step first: a store whose chunks were never written (a small
    # metadata file claiming a huge grid) falls back after a stat per chunk, not after planning all
    for coords in chunk_coords(wplan, chunks):
        key = arr.metadata.encode_chunk_key((first_chunk,) + coords)
        if _stored_version(bytes_store, os.path.join(folder, *key.split("/")), key) is None:
            raise NotNativeError(f"{os.path.join(folder, *key.split('/'))}: chunk file missing (it reads as fill "
                                 "values)")
    pieces = chunk_pieces(wplan, chunks, stored, merge_gap, coding.fortran)
    piece_ids = piece_plans(pieces, plans, shape, stored)
    chunk_ids = range(first_chunk, (l1 - 1) // ct + 1)
    parts = np.empty((locals_.size, 1 + len(pieces), 3), np.int64)
    parts[:, 0] = (meta_file, meta_plan, 0)
    for j, ((_, coords), pidx) in enumerate(zip(pieces, piece_ids)):
        files = np.empty(len(chunk_ids), np.int64)
        bases = np.zeros(len(chunk_ids), np.int64)  # where each chunk starts in its file
        for k, c in enumerate(chunk_ids):
            key = arr.metadata.encode_chunk_key((c,) + coords)
            path = os.path.join(folder, *key.split("/"))
            if locates:
                files[k], bases[k], length = _located_file(plans, bytes_store, path)
                if length != chunk_bytes:
                    raise NotNativeError(f"{path}: a range of {length} bytes, not the {chunk_bytes} of a raw chunk")
                continue
            fidx = plans.file_of(path, bytes_store.spec)
            if fidx is None:
                version = _stored_version(bytes_store, path, key)
                if version is None:
                    raise NotNativeError(f"{path}: chunk file missing (it reads as fill values)")
                if version.size != chunk_bytes:
                    raise NotNativeError(f"{path}: chunk file of {version.size} bytes, not the {chunk_bytes} of a "
                                         "raw chunk")
                fidx = plans.add_file(path, chunk_bytes, store=bytes_store.spec, tag=version.tag.encode())
            files[k] = fidx
        parts[:, 1 + j, 0] = files[locals_ // ct - first_chunk]
        parts[:, 1 + j, 1] = pidx
        parts[:, 1 + j, 2] = bases[locals_ // ct - first_chunk] + (locals_ % ct) * step_stride
    return StepReads(_meta_on_a_chunk_file(parts, store) if locates else parts, finish, wplan)


def _chunk_files(arr, bytes_store: ByteStore, folder, plans: PlanSet, coder: int):
    """``chunk_of(chunk coordinates)``: the chunk table entry of a chunk stored as its own file (its
    size: one stat per chunk file; a missing one reads as the fill value and must still be missing
    when read)."""

    locates = bytes_store.locates

    def chunk_of(coords) -> int:
        key = arr.metadata.encode_chunk_key(tuple(coords))
        path = os.path.join(folder, *key.split("/"))
        if locates:
            return plans.add_chunk(*_located_file(plans, bytes_store, path), coder)
        fidx = plans.file_of(path, bytes_store.spec)
        if fidx is None:
            version = _stored_version(bytes_store, path, key)
            fidx = plans.add_file(path, -1 if version is None else version.size, store=bytes_store.spec,
                                  tag=b"" if version is None else version.tag.encode())
        return plans.add_chunk(fidx, 0, plans.files[fidx].size, coder)

    return chunk_of


def _located_file(plans: PlanSet, bytes_store, path: str) -> tuple[int, int, int]:
    """``(file index, offset, length)`` in ``plans`` of the range of another store's file that holds the
    chunk ``path`` of a store that locates its keys (each file looked at once: its size, modification
    time and tag, which every read checks); :class:`NotNativeError` for a chunk held inline or missing (fill values), a file
    the native reader has no store for, or a range that the file does not hold (each read and named in
    Python)."""
    try:
        located = bytes_store.locate(path)
    except MissingFileError:
        raise NotNativeError(f"{bytes_store.name_of(path)}: chunk missing (it reads as fill values)") from None
    if located is None:
        raise NotNativeError(f"{bytes_store.name_of(path)}: a chunk held inline in the reference set")
    store, key, offset, length = located
    if not store.native:
        raise NotNativeError(f"{store.name_of(key)}: the native reader has no {store.spec!r} store")
    fidx = plans.file_of(key, store.spec)
    if fidx is None:
        version = bytes_store.located_version(store, key)
        if version is None:
            raise NotNativeError(f"{bytes_store.name_of(path)}: refers to {store.name_of(key)}, which is missing")
        # its modification time too (as HDF5 files): an original file rewritten at the same size is refused
        fidx = plans.add_file(key, version.size, version.mtime_ns, store=store.spec, tag=version.tag.encode())
    if offset + length > plans.files[fidx].size:
        raise NotNativeError(f"{bytes_store.name_of(path)}: refers to bytes past the end of {store.name_of(key)}")
    return fidx, offset, length


def _meta_on_a_chunk_file(parts: np.ndarray, location, plans: PlanSet | None = None) -> np.ndarray:
    """``parts`` with each step's metadata part (a part that reads nothing, for a store whose metadata is
    checked at plan time only) on that step's first chunk file, which the reader opens anyway; with
    ``plans``, the parts read coded chunks: their first column is a row of the chunk table, not a file."""
    if parts.shape[1] < 2:
        raise NotNativeError(f"{location}: a window that reads no chunk of a reference set")
    first = parts[:, 1, 0]
    if plans is not None:
        files = np.asarray([row[0] for row in plans.chunks], np.int64)
        first = files[first]
    parts[:, 0, 0] = first
    return parts


class _Listed:
    """A remote store whose ``stat`` answers, while one array is planned, from one listing of the
    array's folder (``RemoteStore.list``); everything else goes to the store itself."""

    def __init__(self, store, versions: dict) -> None:
        self._store, self._versions = store, versions

    @classmethod
    def of(cls, store, folder: str, opened=None):
        """``store`` listed under ``folder``, or ``store`` itself (a local store, one that cannot list).
        ``opened``: what the array's open read (zarr_store.OpenedObjects), whose listing, when complete and
        of a folder holding this one, serves without another request."""
        if opened is not None and opened.covers(folder.rstrip("/") + "/"):
            return cls(store, opened.listing)
        if not store.supports_listing:
            return store
        try:
            objects, _ = store.list(folder.rstrip("/") + "/", delimiter=False)
        except DataFileError:  # e.g. plain HTTPS: HEAD requests, one per chunk
            return store
        return cls(store, dict(objects))

    def stat(self, key: str):
        return self._versions.get(key)

    def __getattr__(self, name):
        return getattr(self._store, name)


def _stored_version(bytes_store: ByteStore, path: str, key: str):
    """The version of a chunk or shard object (a :class:`~dali_mesh.storage.Version`), None when it is
    missing; a key that is not a regular file is :class:`NotRegularFileError` (a FIFO would block a
    reader)."""
    try:
        return bytes_store.stat(path)
    except NotRegularFileError:
        raise NotRegularFileError(path, f"Zarr key {key!r} is not a regular file; a store holds regular files "
                                  "only") from None


def _coords(k: int, shape) -> tuple[int, ...]:
    """The coordinates of inner chunk ``k`` (C order) of a shard of ``shape`` inner chunks."""
    return tuple(int(i) for i in np.unravel_index(k, shape))


class _ShardIndex:
    """``chunk_of(inner chunk coordinates)`` of a sharded v3 array: each shard's index is read once
    (its crc32c verified with google-crc32c, zarr's own dependency) and kept in the plan as the
    inner chunks' byte ranges; the shard file's size, modification time and index bytes are checked
    at every read (a rewritten shard may hold its chunks elsewhere), except for an object that an S3
    ETag pins (RemoteStore.pins): its index is read at that ETag, as every read of it is. A missing shard reads as the fill value;
    an index that points past the shard or lists overlapping chunks is a :class:`HeaderError`
    naming the shard and the chunk."""

    def __init__(self, arr, bytes_store: ByteStore, folder, plans: PlanSet, coding: _Coding, inner, coder: int):
        self.arr, self.bytes_store, self.folder, self.plans, self.coder = arr, bytes_store, folder, plans, coder
        self.ratio = tuple(s // c for s, c in zip(coding.shard, inner))
        if any(s % c for s, c in zip(coding.shard, inner)):
            raise NotNativeError(f"{folder}: shard shape {coding.shard} is not a multiple of the chunk shape {inner}")
        self.at_end, self.crc = coding.index_at_end, coding.index_crc
        self.n = math.prod(self.ratio)
        self.index: dict = {}

    def read_indexes(self, shards) -> None:
        """Reads the indexes of ``shards`` (shard coordinates) not read yet, all at once (an object
        store's round trip for all of them, on zarr_store.fetch_pool), then adds them to the plan in
        their order (the plan's files are numbered the same whatever order the answers came in)."""
        todo = sorted({tuple(s) for s in shards} - set(self.index))
        if len(todo) > 1 and self.bytes_store.round_trip[0] > 0:  # each read a round trip: sent together
            from dali_mesh.storage.zarr_store import fetch_pool  # noqa: PLC0415 - zarr-python's module: zarr first

            pool = fetch_pool()
            fetched = [pool.submit(self._fetch_index, shard) for shard in todo]
            fetched = [f.result() for f in fetched]  # every one waited for before an error is raised
        else:
            fetched = [self._fetch_index(shard) for shard in todo]
        for shard, got in zip(todo, fetched):
            self.index[shard] = self._add_index(shard, *got)

    def _fetch_index(self, shard: tuple[int, ...]):
        """``(path, version, at, raw)``: where shard ``shard`` is, its version (None: missing), where its
        index lies and the index's bytes (one request)."""
        key = self.arr.metadata.encode_chunk_key(shard)
        path = os.path.join(self.folder, *key.split("/"))
        version = _stored_version(self.bytes_store, path, key)
        if version is None:
            return path, None, 0, b""
        size = version.size
        nbytes = 16 * self.n + 4 * self.crc
        if size < nbytes:
            raise HeaderError(path, f"shard {key!r} is {size} bytes, smaller than its index ({nbytes} bytes)")
        at = size - nbytes if self.at_end else 0
        if self.bytes_store.pins(version):
            # read at the ETag the plan records (If-Match): every read of the shard is at that ETag,
            # so the reader need not read the index again (csrc/reader/open_file.cc)
            with self.bytes_store.open_version(path, version) as obj:
                raw = read_exactly(obj, nbytes, at)
        else:
            raw = self.bytes_store.read_range(path, at, nbytes)
        return path, version, at, raw

    def _add_index(self, shard: tuple[int, ...], path, version, at, raw):
        if version is None:
            return path, None, None
        key = self.arr.metadata.encode_chunk_key(shard)
        size, nbytes = version.size, 16 * self.n + 4 * self.crc
        # size, modification time and the index's bytes as the index was read: every read checks
        # them, so a shard rewritten since is refused, even at its old size and time (cp -p)
        fidx = self.plans.add_file(path, size, version.mtime_ns, at, raw, self.bytes_store.spec, version.tag.encode())
        if self.crc:
            import google_crc32c

            want = int.from_bytes(raw[-4:], "little")
            if google_crc32c.value(raw[:-4]) != want:
                raise HeaderError(path, f"shard {key!r}: its index's crc32c does not match (the shard is corrupt)")
        table = np.frombuffer(raw[:16 * self.n], "<u8").reshape(self.n, 2)
        missing = (table[:, 0] == 2**64 - 1) & (table[:, 1] == 2**64 - 1)
        lo = 0 if self.at_end else nbytes
        hi = size - nbytes if self.at_end else size
        present = np.flatnonzero(~missing)
        offs, lens = table[present, 0], table[present, 1]
        bad = (offs < lo) | (lens > hi) | (offs > hi - np.minimum(lens, hi))
        if bad.any():
            k = int(present[np.argmax(bad)])
            raise HeaderError(path, f"shard {key!r}: its index puts inner chunk {_coords(k, self.ratio)} at "
                              f"bytes {int(table[k, 0])}..{int(table[k, 0]) + int(table[k, 1])}, outside the shard's "
                              f"data (bytes {lo}..{hi}): the shard is corrupt")
        order = np.argsort(offs, kind="stable")
        ends = offs[order] + lens[order]
        overlap = np.flatnonzero(offs[order][1:] < ends[:-1])
        if overlap.size:
            a, b = (int(present[order[i]]) for i in (overlap[0], overlap[0] + 1))
            raise HeaderError(path, f"shard {key!r}: its index lists inner chunks {_coords(a, self.ratio)} "
                              f"and {_coords(b, self.ratio)} over the same bytes: the shard is corrupt")
        return path, fidx, table

    def shard_of(self, coords) -> tuple[int, ...]:
        """The shard holding inner chunk ``coords``."""
        return tuple(c // r for c, r in zip(coords, self.ratio))

    def __call__(self, coords) -> int:
        shard = self.shard_of(coords)
        if shard not in self.index:
            self.read_indexes([shard])
        path, fidx, table = self.index[shard]
        if table is None:  # the whole shard was never written
            fidx = self.plans.file_of(path, self.bytes_store.spec)
            if fidx is None:
                fidx = self.plans.add_file(path, -1, store=self.bytes_store.spec)
            return self.plans.add_chunk(fidx, 0, -1, self.coder)
        k = int(np.ravel_multi_index(tuple(c % r for c, r in zip(coords, self.ratio)), self.ratio))
        off, ln = int(table[k, 0]), int(table[k, 1])
        if off == 2**64 - 1 and ln == 2**64 - 1:
            return self.plans.add_chunk(fidx, 0, -2, self.coder)  # the inner chunk was never written
        return self.plans.add_chunk(fidx, off, ln, self.coder)


def _coded_parts(plans: PlanSet, shape, chunks, stored, pieces, step_stride, chunk_of, locals_, meta_part):
    """The parts of compressed chunks: per step the metadata part, then one part per piece
    (:func:`chunk_pieces`: a box and a chunk touched), reading from the chunk table (``chunk_of(chunk
    coordinates)`` gives a chunk's entry), its plan shared by every step, its base the step's place in
    the decoded chunk (``step_stride`` bytes a step)."""
    ct = chunks[0]
    piece_ids = [plans.add_plan(ReadPlan.reads_only(shape, stored, *u.plan_args, coded=True, repeat=u.repeat))
                 for u, _ in pieces]
    first_chunk = int(locals_[0]) // ct if locals_.size else 0
    chunk_ids = range(first_chunk, (int(locals_[-1]) // ct + 1) if locals_.size else first_chunk)
    parts = np.empty((locals_.size, 1 + len(pieces), 3), np.int64)
    parts[:, 0] = (*meta_part, 0)
    for j, ((_, coords), pidx) in enumerate(zip(pieces, piece_ids)):
        ids = np.asarray([chunk_of((c,) + coords) for c in chunk_ids], np.int64)
        parts[:, 1 + j, 0] = ids[locals_ // ct - first_chunk]
        parts[:, 1 + j, 1] = pidx
        parts[:, 1 + j, 2] = (locals_ % ct) * step_stride
    return parts


def zarr_codec_names(arr) -> tuple[str, ...]:
    """An array's filters and codecs in encode order, by name (``()``: stored raw; a sharded array's
    inner codecs after ``sharding``): what ``dali-mesh plan`` describes."""
    md = arr.metadata
    if md.zarr_format == 2:
        parts = list(md.filters or ()) + ([md.compressor] if md.compressor is not None else [])
        return tuple(getattr(c, "codec_id", type(c).__name__) for c in parts)
    out = []
    for c in md.codecs:
        name = type(c).__name__.removesuffix("Codec").lower()
        if name == "bytes":
            continue
        out.append(name)
        if name == "sharding":
            out += [type(i).__name__.removesuffix("Codec").lower() for i in c.codecs
                    if type(i).__name__ != "BytesCodec"]
    return tuple(out)
