"""Plan the native reads of an HDF5 dataset's steps: its file's byte ranges (contiguous), or its chunks'
(chunked, raw or with the filters the native reader decodes), found in the dataset's chunk index; what
:class:`~dali_mesh.formats.hdf5.hdf5_format.HDF5Format` ``plan_steps`` returns. And the names of a
dataset's filters, which ``dali-mesh plan`` describes."""
from __future__ import annotations

import ctypes
import logging
import math
import os
from typing import Mapping

import numpy as np

from dali_mesh.io._common import MissingFileError
from dali_mesh.plan import plan_window
from dali_mesh.plan.chunks import (StepReads, check_coded_chunk, chunk_pieces, count_chunk_pieces, merge_pieces,
                                   piece_plans, same_dtype, too_many_parts)
from dali_mesh.plan.ranges import StoredArray, plan_npy_units
from dali_mesh.plan import (CODEC_LIBRARIES, CODECS, Coder, NotNativeError, PlanFile, PlanSet, ReadPlan, native_dtype_of, native_store, read_file_at)
from dali_mesh.partition import Region
from dali_mesh.storage.byte_store import read_exactly

from dali_mesh.formats.hdf5.hdf5_reader import open_hdf5_dataset

__all__ = ["hdf5_filter_names", "plan_hdf5_steps"]

log = logging.getLogger(__name__)


def _header_check(ds, path, read_at=None) -> tuple[int, bytes]:
    """``(offset, bytes)`` of the first chunk of the dataset's object header (its dataspace,
    datatype and storage layout messages: shape, dtype, data address, chunking): the operator
    checks them at every read, so a file rewritten with another layout since the plan is refused.
    ``read_at(offset, size)``: how the file's bytes are read (default: through its byte store)."""
    import h5py

    read_at = read_at or (lambda offset, size: read_file_at(path, offset, size))
    # the object header's address counts from the HDF5 base address, after a user block (data
    # offsets from H5Dget_offset and the chunk index are absolute already)
    addr = int(h5py.h5o.get_info(ds.id).addr) + int(ds.file.id.get_create_plist().get_userblock())
    head = read_at(addr, 64)
    if head[:4] == b"OHDR":  # version 2: signature, version, flags, [times], [phase change], chunk 0 size
        flags = head[5]
        pos = 6 + (16 if flags & 0x20 else 0) + (4 if flags & 0x10 else 0)
        width = 1 << (flags & 3)
        size = pos + width + int.from_bytes(head[pos:pos + width], "little") + 4  # + checksum
    elif head[:1] == b"\x01":  # version 1: 16-byte prefix, chunk 0 size at byte 8
        size = 16 + int.from_bytes(head[8:12], "little")
    else:
        raise NotNativeError(f"{path}: dataset {ds.name!r}: object header of unknown version at byte {addr}")
    check = read_at(addr, size)
    if len(check) != size:
        raise NotNativeError(f"{path}: dataset {ds.name!r}: object header at byte {addr} runs past the end of the file")
    return addr, check


def _check_stored_type(ds, path, name) -> None:
    """:class:`NotNativeError` unless the stored bytes are ``ds.dtype``'s own: HDF5 types that h5py
    converts on every read (integers of another precision or bit offset, floats with another exponent
    bias or size, which h5py delivers as float64) are read through h5py, never as raw bytes."""
    import h5py

    stored = ds.id.get_type()
    if stored.equal(h5py.h5t.py_create(ds.dtype)):
        return
    what = f"an HDF5 {type(stored).__name__} of {stored.get_size()} bytes"
    if isinstance(stored, h5py.h5t.TypeIntegerID):
        what += f", {stored.get_precision()} bits at bit offset {stored.get_offset()}"
    elif isinstance(stored, h5py.h5t.TypeFloatID):
        what += f", exponent bias {stored.get_ebias()}, fields {stored.get_fields()}"
    raise NotNativeError(f"{path}: dataset {name!r} stores {what}, which h5py converts to {ds.dtype} when it "
                         "reads it; it is read by partitioned_source")


_LOOKUP = []  # [H5Dget_chunk_storage_size of the libhdf5 h5py uses, or None]


def _chunk_lookup():
    """``H5Dget_chunk_storage_size`` of the HDF5 library h5py has loaded (found in /proc/self/maps),
    or None: it looks a chunk up by coordinate as a read does (h5py offers only lookups that iterate
    the index, which a corrupt B-tree satisfies while a read misses the chunk)."""
    if not _LOOKUP:
        fn = None
        try:
            with open("/proc/self/maps") as maps:
                paths = {line.split()[-1] for line in maps if "/libhdf5" in line and "_hl" not in line.rsplit("/", 1)[-1]}
            for path in sorted(paths):
                try:
                    fn = ctypes.CDLL(path).H5Dget_chunk_storage_size
                    break
                except (OSError, AttributeError):
                    continue
        except OSError:
            pass
        if fn is not None:
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_int64, ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64)]
        _LOOKUP.append(fn)
    return _LOOKUP[0]


def _check_chunk_lookups(ds, path, needed, offsets) -> None:
    """:class:`NotNativeError` unless looking each needed chunk up by coordinate, as h5py's reads do,
    finds it with the size the planner's one pass over the chunk index listed: a corrupt B-tree can
    list a chunk that a read then misses (h5py returns fill values there, the planned read would
    not). About 5 us a chunk."""
    lookup = _chunk_lookup()
    if lookup is None:  # pragma: no cover - an h5py without a separate libhdf5 in the process
        log.debug("%s: no H5Dget_chunk_storage_size found; chunk lookups not cross-checked", path)
        return
    size = ctypes.c_uint64(0)
    for coord in dict.fromkeys(needed):
        offset = (ctypes.c_uint64 * len(coord))(*coord)
        found = int(size.value) if lookup(ds.id.id, offset, ctypes.byref(size)) >= 0 else None
        if found != offsets.get(coord, (None, None))[1]:
            raise NotNativeError(f"{path}: dataset {ds.name!r}: its chunk index is inconsistent (chunk {coord} is "
                                 f"listed as {offsets.get(coord)} but a lookup finds "
                                 f"{'no chunk' if found is None else f'{found} bytes'}); the file is corrupt; it "
                                 "is read by partitioned_source, as h5py reads it")


def _chunk_offsets(ds) -> dict:
    """``{chunk's first element: (byte offset, stored bytes, filter mask)}`` of every chunk written.
    One pass over the chunk index (``chunk_iter``): looking chunks up one by one costs time that
    grows with their number, per lookup."""
    out = {}
    if hasattr(ds.id, "chunk_iter"):
        ds.id.chunk_iter(lambda c: out.__setitem__(tuple(c.chunk_offset), (c.byte_offset, c.size, c.filter_mask)))
        return out
    for i in range(ds.id.get_num_chunks()):  # pragma: no cover - HDF5 < 1.12.3
        c = ds.id.get_chunk_info(i)
        out[tuple(c.chunk_offset)] = (c.byte_offset, c.size, c.filter_mask)
    return out


#: HDF5 filters the native reader applies (H5Z filter ids), as coder steps: codec names of the codec
#: table (``read_plan.CODECS``; tests/io/test_codec_table.py checks each is there)
_FILTERS = {1: "zlib", 2: "shuffle", 3: "fletcher32", 4: "szip", 32000: "lzf"}
_FILTER_NAMES = {1: "deflate", 2: "shuffle", 3: "fletcher32", 4: "szip", 5: "nbit", 6: "scaleoffset",
                 307: "bzip2", 32000: "lzf", 32001: "blosc", 32004: "lz4", 32008: "bitshuffle", 32015: "zstd"}


def _hdf5_filters(dcpl, path, name) -> tuple[tuple[str, int, int], ...] | None:
    """A dataset's filter pipeline in encode order as ``(label, codec id, arg)``, ``None`` without
    filters, or :class:`NotNativeError` naming a filter the native reader does not apply (or whose
    library this build lacks)."""
    from dali_mesh import _kernels

    n = dcpl.get_nfilters()
    if not n:
        return None
    encode = []
    for i in range(n):
        code, _flags, values, fname = dcpl.get_filter(i)
        label = _FILTER_NAMES.get(code, (fname.decode(errors="replace") if isinstance(fname, bytes) else str(fname))
                                  or f"filter {code}")
        if code not in _FILTERS:
            raise NotNativeError(f"{path}: dataset {name!r} uses the HDF5 filter {label!r} (id {code}), which the "
                                 "native reader does not apply; it is decoded by h5py in partitioned_source")
        codec = _FILTERS[code]
        if codec in CODEC_LIBRARIES and not _kernels.codec_available(CODECS[codec]):
            raise NotNativeError(f"{path}: dataset {name!r} is {label}-compressed, but this build of the native "
                                 f"reader has no {CODEC_LIBRARIES[codec]}; it is decoded by partitioned_source")
        arg = 0
        if codec == "shuffle":
            arg = int(values[0]) if len(values) else 0
        elif codec == "szip":  # options mask, pixels per block, bits per pixel, pixels per scanline
            if len(values) < 4:
                raise NotNativeError(f"{path}: dataset {name!r}: szip filter parameters {tuple(values)} are incomplete")
            mask, ppb, bpp, pps = (int(v) for v in values[:4])
            arg = mask | ppb << 16 | bpp << 24 | pps << 32
        encode.append((label, CODECS[codec], arg))
    return tuple(encode)


def _coder_steps(encode, mask: int, path, name) -> tuple[tuple[int, int], ...]:
    """The coder steps (decode order) of the filters ``encode`` that chunk filter mask ``mask`` did
    not skip (bit i set: filter i was not applied, as HDF5 records for an optional filter that
    failed, e.g. LZF on incompressible data), or :class:`NotNativeError` when the checksum is not the
    last filter applied, or the compressor not just before it."""
    from dali_mesh import _kernels

    steps = tuple((cid, arg) for i, (_, cid, arg) in reversed(list(enumerate(encode))) if not mask >> i & 1)
    kind = {row["id"]: row["kind"] for row in _kernels.codec_table()}  # the codec table's kinds
    kinds = [{"checksum": "check", "decompressor": "zip"}.get(kind[c], "keep") for c, _ in steps]
    # checksums first, then at most one decompressor, then size-keeping steps (csrc/codecs/codecs.h CheckCoder)
    if kinds != sorted(kinds, key=["check", "zip", "keep"].index) or kinds.count("zip") > 1 or \
            any(c == CODECS["shuffle"] and a < 1 for c, a in steps):
        raise NotNativeError(f"{path}: dataset {name!r} has its filters in an order the native reader does not run "
                             f"({[label for label, _, _ in encode]}); it is decoded by partitioned_source")
    return steps


def plan_hdf5_steps(path: str, name: str, steps: tuple[int, int], region: Region, *, plans: PlanSet, max_parts: int,
                    index_maps=None, merge_gap: int, h5_kwargs: Mapping | None = None) -> StepReads:
    """The native reads of steps ``[first, stop)`` (``steps``) along axis 0 of dataset ``name`` of
    ``path``, each step's window ``region``: a :class:`~dali_mesh.plan.chunks.StepReads` whose plans and
    file are added to ``plans`` (the series' :class:`PlanSet`), at most ``max_parts`` parts (see
    :func:`dali_mesh.plan.chunks.plan_time_series`).

    Contiguous datasets: one plan, a base offset per step. Chunked datasets without filters: one
    part per box and chunk touched, its plan shared by every step (the units relative to the
    chunk's first step), its base the chunk's offset plus the step's place in the chunk: the plans
    are as many as the chunks one window touches, whatever the number of steps. Anything else
    (filters, external or virtual storage, chunks never written) is :class:`NotNativeError`."""
    import h5py

    l0, l1 = steps
    locals_ = np.arange(l0, l1, dtype=np.int64)
    bytes_store, key = native_store(path)  # before anything is opened: a store the reader has not falls back
    # the file's version before h5py opens it: whatever h5py then reads is this version (an object
    # store's, read at its ETag) or a later one, which the reader refuses (size, time, identity)
    version = bytes_store.stat(key)
    if version is None:
        raise MissingFileError(path, "no such HDF5 file; check the path and the file list")
    pinned = bytes_store.pins(version)
    f, ds = open_hdf5_dataset(path, name, version=version if pinned else None, **(h5_kwargs or {}))
    try:
        dcpl = ds.id.get_create_plist()
        filters = _hdf5_filters(dcpl, path, name)
        if filters is not None:
            _coder_steps(filters, 0, path, name)  # the pipeline runs as a whole
        if ds.external or ds.is_virtual:
            raise NotNativeError(f"{path}: dataset {name!r} has external or virtual storage")
        local = bytes_store.local_path(key)
        if (not os.path.samefile(ds.file.filename, local)) if local is not None else ds.file.filename != f.filename:
            # an external link (allow_external=True): the offsets are in another file
            raise NotNativeError(f"{path}: dataset {name!r} lives in {ds.file.filename} "
                                 "(an external link)")
        _check_stored_type(ds, path, name)
        same_dtype(plans, native_dtype_of(ds.dtype, path), path)
        if pinned:
            # every read of the plan is at this ETag (If-Match), as everything h5py read to plan it
            # and the object header read here: the reader need not read the header again (a request
            # per sample)
            with bytes_store.open_version(key, version) as obj:
                check_at, _ = _header_check(ds, path, lambda at, n: read_exactly(obj, n, at, allow_short=True))
            check = b""
        else:
            check_at, check = _header_check(ds, path)
        frame = tuple(ds.shape[1:])
        wplan = plan_window(region, index_maps)
        shape = wplan.window_shape
        fidx = len(plans.files)
        # size and time (an object's ETag): any rewrite of an HDF5 file is refused (csrc/plan/plan.h)
        plans.files.append(PlanFile(key, version.size, version.mtime_ns, store=bytes_store.spec,
                                    tag=version.tag.encode()))
        if ds.chunks is None:
            too_many_parts(path, locals_.size, max_parts)
            offset = ds.id.get_offset()
            if dcpl.get_layout() == h5py.h5d.COMPACT:
                raise NotNativeError(f"{path}: dataset {name!r} is stored compact (its data inside its object "
                                     "header); it is read by partitioned_source")
            if offset is None:
                raise NotNativeError(f"{path}: dataset {name!r} has no stored data (never written)")
            if int(offset) + math.prod(ds.shape) * ds.dtype.itemsize > version.size:
                raise NotNativeError(f"{path}: dataset {name!r} claims data at bytes {int(offset)}.."
                                     f"{int(offset) + math.prod(ds.shape) * ds.dtype.itemsize} but the file has "
                                     f"{version.size}: the file is truncated or corrupt")
            u = plan_npy_units(StoredArray(frame, ds.dtype), wplan, (), merge_gap)
            pidx = plans.add_plan(ReadPlan.from_units(wplan, ds.dtype, False, *u.plan_args, check, check_at,
                                                      repeat=u.repeat))
            step_bytes = math.prod(frame) * ds.dtype.itemsize
            parts = np.stack([np.full_like(locals_, fidx), np.full_like(locals_, pidx),
                              int(offset) + locals_ * step_bytes], -1)[:, None, :]
            return StepReads(parts, pidx, wplan)
        chunks = tuple(int(c) for c in ds.chunks)
        ct, chunk_bytes = chunks[0], math.prod(chunks) * ds.dtype.itemsize
        step_stride = math.prod(chunks[1:]) * ds.dtype.itemsize  # one step inside a chunk
        finish = plans.add_plan(ReadPlan.finishing(wplan, ds.dtype))
        too_many_parts(path, locals_.size * count_chunk_pieces(wplan, chunks), max_parts, wplan)  # before they are made
        pieces = chunk_pieces(wplan, chunks, ds.dtype, merge_gap)
        offsets = _chunk_offsets(ds) if pieces else {}
        if filters is not None:
            check_coded_chunk(path, chunks, ds.dtype.itemsize)

            coders: dict[int, int] = {}  # filter mask -> coder: one per mask, not one per chunk

            def coder_of(mask: int) -> int:
                if mask not in coders:
                    coders[mask] = plans.add_coder(Coder(_coder_steps(filters, mask, path, name), chunk_bytes))
                return coders[mask]

            parts = _coded_parts(ds, path, plans, fidx, coder_of, pieces, offsets, locals_, chunks, version.size,
                                 (check, check_at), shape)
            return StepReads(parts, finish, wplan)
        first_chunk = l0 // ct
        chunk_ids = np.arange(first_chunk, (l1 - 1) // ct + 1, dtype=np.int64)
        parts = np.empty((locals_.size, len(pieces), 3), np.int64)
        needed: list[tuple[int, ...]] = []
        for j, (_, coords) in enumerate(pieces):
            base = np.empty(chunk_ids.size, np.int64)
            for k, c in enumerate(chunk_ids):
                coord = _chunk_coord(int(c), coords, chunks)
                base[k] = _stored_chunk(ds, path, offsets, coord, version.size, raw_bytes=chunk_bytes)[0]
                needed.append(coord)
            parts[:, j, 0] = fidx
            parts[:, j, 2] = base[locals_ // ct - first_chunk] + (locals_ % ct) * step_stride
        _check_chunk_lookups(ds, path, needed, offsets)
        merged = merge_pieces(parts, pieces, plans, shape, ds.dtype, merge_gap, check, check_at)
        if merged is None:
            parts[:, :, 1] = piece_plans(pieces, plans, shape, ds.dtype, check, check_at)
        else:
            parts = merged
        return StepReads(parts, finish, wplan)
    finally:
        f.close()


def _chunk_coord(step_chunk: int, coords, chunks) -> tuple[int, ...]:
    """The first element of the chunk ``step_chunk`` along the step axis and ``coords`` (chunk indices)
    along the others: how the chunk index names a chunk."""
    return (step_chunk * chunks[0],) + tuple(i * n for i, n in zip(coords, chunks[1:]))


def _stored_chunk(ds, path, offsets, coord, file_size: int, raw_bytes: int | None = None):
    """``(byte offset, stored bytes, filter mask)`` of the chunk at ``coord`` (from
    :func:`_chunk_offsets`), or :class:`NotNativeError` when it was never written, lies past the end
    of the file, or (``raw_bytes``: an unfiltered dataset's chunk size) is not stored raw."""
    info = offsets.get(coord)
    if info is None or info[0] is None:
        raise NotNativeError(f"{path}: chunk {coord} of dataset {ds.name} was never written (it reads as "
                             "fill values)")
    offset, size, mask = info
    if raw_bytes is not None and size != raw_bytes:
        raise NotNativeError(f"{path}: chunk {coord} of dataset {ds.name} is stored in {size} bytes, not as raw "
                             "data")
    if not (0 <= offset and 0 < size <= file_size - offset):
        raise NotNativeError(f"{path}: chunk {coord} of dataset {ds.name} lies at bytes {offset}.."
                             f"{offset + size}, past the end of the file ({file_size} bytes): its chunk "
                             "index is corrupt or the file is truncated")
    return info


def _coded_parts(ds, path, plans: PlanSet, fidx, coder_of, pieces, offsets, locals_, chunks, file_size, check,
                 shape):
    """The parts of a filtered dataset: one per box and chunk touched, reading from the chunk table
    (each chunk's byte range from the chunk index, decoded once per batch however many parts use
    it, by the coder of its filter mask, ``coder_of(mask)``), its plan's units relative to the
    decoded chunk's first step, its base the step's place in the chunk. A chunk never written or
    lying past the end of the file is :class:`NotNativeError`."""
    ct = chunks[0]
    step_stride = math.prod(chunks[1:]) * ds.dtype.itemsize
    first_chunk = int(locals_[0]) // ct if locals_.size else 0
    chunk_ids = range(first_chunk, (int(locals_[-1]) // ct + 1) if locals_.size else first_chunk)
    parts = np.empty((locals_.size, len(pieces), 3), np.int64)
    needed = []
    for j, (u, coords) in enumerate(pieces):
        pidx = plans.add_plan(ReadPlan.reads_only(shape, ds.dtype, *u.plan_args, check[0], check[1], coded=True,
                                                  repeat=u.repeat))
        ids = np.empty(len(chunk_ids), np.int64)
        for k, c in enumerate(chunk_ids):
            coord = _chunk_coord(c, coords, chunks)
            offset, size, mask = _stored_chunk(ds, path, offsets, coord, file_size)
            ids[k] = plans.add_chunk(fidx, offset, size, coder_of(int(mask)))
            needed.append(coord)
        parts[:, j, 0] = ids[locals_ // ct - first_chunk]
        parts[:, j, 1] = pidx
        parts[:, j, 2] = (locals_ % ct) * step_stride
    _check_chunk_lookups(ds, path, needed, offsets)
    return parts


def hdf5_filter_names(dataset) -> tuple[str, ...]:
    """A dataset's filters in encode order, by name (``()``: stored raw): what ``dali-mesh plan``
    describes."""
    dcpl = dataset.id.get_create_plist()
    out = []
    for i in range(dcpl.get_nfilters()):
        code, _, _, label = dcpl.get_filter(i)
        out.append(_FILTER_NAMES.get(code, label.decode(errors="replace") if isinstance(label, bytes) else str(label)))
    return tuple(out)
