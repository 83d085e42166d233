"""The reader's codecs (csrc/c_api/codec_api.cc): the codec table, and a chunk decoded whole or in
ranges as the reader decodes it."""
from __future__ import annotations

import ctypes
import json

from dali_mesh._kernels.library import I64P, KernelsError, _i64, bound


def _declare(lib) -> None:
    """The argument and result types of the functions of csrc/c_api/codec_api.cc."""
    lib.dali_mesh_codec_available.argtypes = [ctypes.c_int64]
    lib.dali_mesh_codec_available.restype = ctypes.c_int
    lib.dali_mesh_decode_chunk.argtypes = [I64P, I64P, ctypes.c_int64, ctypes.c_int64, ctypes.c_char_p,
                                           ctypes.c_int64, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int64]
    lib.dali_mesh_decode_chunk.restype = ctypes.c_int64
    lib.dali_mesh_decode_chunk_ranges.argtypes = [I64P, I64P, ctypes.c_int64, ctypes.c_int64, ctypes.c_char_p,
                                                  ctypes.c_int64, I64P, ctypes.c_int64, ctypes.c_int, ctypes.c_int64,
                                                  ctypes.c_char_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_char_p,
                                                  ctypes.c_int64]
    lib.dali_mesh_decode_chunk_ranges.restype = ctypes.c_int64
    lib.dali_mesh_codec_table.restype = ctypes.c_int64
    lib.dali_mesh_codec_table.argtypes = [ctypes.c_char_p, ctypes.c_int64]


def _lib() -> ctypes.CDLL:
    return bound("codec_api", _declare)


_codec_table = None


def codec_table() -> tuple[dict, ...]:
    """The reader's codec table (csrc/codecs/codec_table.inc, the one list of codecs), one dict per
    codec in table order: ``id`` (as plan files write it), ``name``, ``kind`` (``"decompressor"``,
    ``"checksum"`` or ``"keeps_size"``), ``library`` (what decodes it, ``""`` for a step built
    in) and ``available`` (whether this build has that library). :class:`KernelsError` when the
    library is not built."""
    global _codec_table
    if _codec_table is None:
        lib = _lib()
        n = lib.dali_mesh_codec_table(None, 0)
        out = ctypes.create_string_buffer(n + 1)
        if lib.dali_mesh_codec_table(out, n + 1) != n:
            raise KernelsError("codec_table: the library's table changed between two calls")
        _codec_table = tuple(json.loads(out.raw[:n]))
    return _codec_table


def codec_available(codec_id: int) -> bool:
    """Whether this build of the reader decodes codec ``codec_id`` (``read_plan.CODECS``): its
    library (``codec_table()``'s ``library``) was found when the plugin was built."""
    return bool(_lib().dali_mesh_codec_available(int(codec_id)))


def decode_chunk(steps, chunk_bytes: int, data: bytes) -> bytes:
    """``data`` (a stored chunk) decoded by the coder ``steps`` (``[(codec id, arg), ...]`` in decode
    order) into ``chunk_bytes`` bytes, by the reader's own code (DecodeChunk); :class:`KernelsError`
    with the reader's reason for a chunk it refuses."""
    data = bytes(data)
    ids = _i64([s[0] for s in steps] or [0])
    args = _i64([s[1] for s in steps] or [0])
    out = ctypes.create_string_buffer(max(int(chunk_bytes), 1))
    err = ctypes.create_string_buffer(1024)
    rc = _lib().dali_mesh_decode_chunk(ids, args, len(steps), int(chunk_bytes), data, len(data), out, err, len(err))
    if rc < 0:
        raise KernelsError(err.value.decode(errors="replace"))
    return out.raw[:int(chunk_bytes)]


def decode_chunk_ranges(steps, chunk_bytes: int, data: bytes, ranges, *, stale: int = 0x5A,
                        min_parts: int = -1) -> tuple[bytes, bool]:
    """Only the byte ``ranges`` (``[(first, stop), ...]``, sorted and disjoint) of the stored chunk
    ``data`` decoded as the reader decodes a batch's ranges: its stored bytes read as a read takes
    them (a Blosc chunk of at least ``min_parts`` stored bytes in parts: header, block index, the
    blocks the ranges touch; -1: the reader's 256 KiB) into a buffer of ``stale`` bytes, then decoded.
    Returns the chunk-sized output (bytes outside the ranges are undefined) and whether it was read
    in parts; :class:`KernelsError` with the reader's reason."""
    out, parts, _ = read_chunk_ranges(steps, chunk_bytes, data, ranges, stale=stale, min_parts=min_parts)
    return out, parts


def read_chunk_ranges(steps, chunk_bytes: int, data: bytes, ranges, *, guess_from: bytes | None = None,
                      stale: int = 0x5A, min_parts: int = -1) -> tuple[bytes, bool, int]:
    """As :func:`decode_chunk_ranges`; with ``guess_from`` (the stored bytes of another chunk of the same
    coder) that chunk is read first for the same ranges, and the layout it shows is the guess the read
    of ``data`` starts from, as a remote store's reads start (its header and index fetched together
    with the parts the guess places). Returns ``(output, read in parts, reads in turn)``: the reads in
    turn are the round trips a remote store would take."""
    data = bytes(data)
    prev = None if guess_from is None else bytes(guess_from)
    ids = _i64([s[0] for s in steps] or [0])
    args = _i64([s[1] for s in steps] or [0])
    flat = _i64([v for r in ranges for v in r] or [0])
    out = ctypes.create_string_buffer(max(int(chunk_bytes), 1))
    err = ctypes.create_string_buffer(1024)
    rc = _lib().dali_mesh_decode_chunk_ranges(ids, args, len(steps), int(chunk_bytes), data, len(data), flat,
                                              len(ranges), int(stale), int(min_parts), prev,
                                              0 if prev is None else len(prev), out, err, len(err))
    if rc < 0:
        raise KernelsError(err.value.decode(errors="replace"))
    return out.raw[:int(chunk_bytes)], bool(rc & 1), int(rc >> 1)

