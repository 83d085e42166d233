"""Gzip chunks (Zarr v2 ``gzip``, v3 ``GzipCodec``) decoded as numcodecs' GZip decodes them (issue 29
item 11): Python's GzipFile reads one member after another and zero padding after a member; it
refuses any other bytes after a member (garbage, a member cut short). The reader's decoder
(csrc/codecs/inflate.cc) must agree case by case: the same bytes, or a refusal where numcodecs
refuses."""
from __future__ import annotations

import gzip
import zlib

import numpy as np
import pytest

numcodecs = pytest.importorskip("numcodecs")

from dali_mesh import _kernels  # noqa: E402
from tests.helpers import codec_rows, need_kernel_codec  # noqa: E402

GZIP, ZLIB = ({r.name: r.id for r in codec_rows()}[n] for n in ("gzip", "zlib"))  # the codec table's ids


@pytest.fixture(scope="module", autouse=True)
def _need_zlib():
    need_kernel_codec(GZIP, "libdeflate or zlib")


def _oracle(data: bytes, n: int):
    try:
        out = bytes(numcodecs.GZip().decode(data))
    except Exception:  # noqa: BLE001 - any refusal of numcodecs
        return None
    return out if len(out) == n else None


def _cases(raw: bytes):
    a, b, c = raw[:1000], raw[1000:2500], raw[2500:]
    one = gzip.compress(raw, 6)
    two = gzip.compress(a + b) + gzip.compress(c)
    three = gzip.compress(a) + gzip.compress(b, 1) + gzip.compress(c, 9)
    empty = gzip.compress(b"")
    return {
        "one member": one,
        "two members": two,
        "three members": three,
        "an empty member first": empty + one,
        "an empty member last": one + empty,
        "zero padding": one + bytes(9),
        "zero padding between members": gzip.compress(a + b) + bytes(3) + gzip.compress(c),
        "trailing garbage": one + b"garbage",
        "trailing 0x1f 0x8b": one + b"\x1f\x8b",
        "a second member cut short": one + gzip.compress(c)[:20],
        "a second member cut to its header": two[:len(gzip.compress(a + b)) + 10],
        "a zlib stream after a member": one + zlib.compress(c),
        "too many bytes in two members": two + gzip.compress(b"x"),
        "too few bytes": gzip.compress(a + b),
        "one byte of garbage after zeros": one + bytes(4) + b"\x01",
    }


def test_gzip_chunks_decode_as_numcodecs_or_are_refused():
    raw = np.sin(np.arange(1000) / 7.0).astype("f4").tobytes()
    decoded = refused = 0
    for name, data in _cases(raw).items():
        want = _oracle(data, len(raw))
        try:
            got = _kernels.decode_chunk([(GZIP, 0)], len(raw), data)
        except _kernels.KernelsError as e:
            assert want is None, f"{name}: numcodecs decodes it, the reader refuses it ({e})"
            refused += 1
            continue
        assert want is not None, f"{name}: numcodecs refuses it, the reader decoded it"
        assert got == want == raw, name
        decoded += 1
    assert decoded >= 6 and refused >= 6, (decoded, refused)


def test_zlib_streams_ignore_trailing_bytes_as_numcodecs_does():
    """numcodecs' Zlib (zlib.decompress) and HDF5's deflate filter read one stream and ignore what
    follows it."""
    raw = np.arange(1000, dtype="f4").tobytes()
    for tail in (b"", bytes(4), b"garbage"):
        data = zlib.compress(raw) + tail
        assert bytes(numcodecs.Zlib().decode(data)) == raw
        assert _kernels.decode_chunk([(ZLIB, 0)], len(raw), data) == raw
