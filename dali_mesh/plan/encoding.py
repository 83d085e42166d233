"""The plan file's encoding: one field table per object, read by :func:`encode` and :func:`decode`
(tensorstore's json_binding: one definition serves both ways), the schema's one source. The C++ loader
(``LoadPlanSet``) and its dump read and write by one field list per object (csrc/plan/plan_fields.h);
``tests/io/test_read_plan.py`` holds those lists to these tables (names, order and values)."""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

__all__ = ["Field", "decode", "encode"]


class Field(NamedTuple):
    """One entry of an object's encoding, in file order.

    ``kind``: ``int`` (one word), ``count`` (one word: the length of the array field named by
    ``of``; several arrays may share one count), ``ints`` (the words of an array, its length given
    by the count field named by ``of``), ``bytes`` (a length word, the bytes, zero padding to 8),
    ``records`` (one record per entry of the count field ``of``, each encoded by ``table``)."""

    name: str
    kind: str
    of: str | None = None
    table: tuple | None = None


_AXIS_PROGRAM = (
    Field("n_copies", "count", "copy_dst"),
    Field("copy_dst", "ints", "n_copies"),
    Field("copy_src", "ints", "n_copies"),
    Field("n_fills", "count", "fills"),
    Field("fills", "ints", "n_fills"),
)

_READ_PLAN = (
    Field("ndim", "count", "shape"),
    Field("itemsize", "int"),
    Field("swap_unit", "int"),
    Field("fortran", "int"),
    Field("coded", "int"),
    Field("shape", "ints", "ndim"),
    Field("n_units", "count", "file_off"),
    Field("n_groups", "count", "group_begin"),
    Field("file_off", "ints", "n_units"),
    Field("dst_off", "ints", "n_units"),
    Field("unit_bytes", "ints", "n_units"),
    Field("unit_count", "ints", "n_units"),
    Field("file_step", "ints", "n_units"),
    Field("dst_step", "ints", "n_units"),
    Field("group_begin", "ints", "n_groups"),
    Field("group_end", "ints", "n_groups"),
    Field("check_offset", "int"),
    Field("check", "bytes"),
    Field("fill", "bytes"),
    Field("axes", "records", "ndim", _AXIS_PROGRAM),
)

_PLAN_FILE = (Field("store", "int"), Field("key", "bytes"), Field("size", "int"), Field("mtime_ns", "int"),
              Field("tag", "bytes"), Field("check_offset", "int"), Field("check", "bytes"))

_CODER = (
    Field("n_steps", "count", "ids"),
    Field("ids", "ints", "n_steps"),
    Field("args", "ints", "n_steps"),
    Field("chunk_bytes", "int"),
    Field("fill", "bytes"),
)


def _word(v) -> bytes:
    return int(v).to_bytes(8, "little", signed=True)


def encode(table: tuple, obj) -> bytes:
    """``obj``'s bytes by ``table`` (a count field is written from the length of the field it counts)."""
    out = []
    for f in table:
        if f.kind == "count":
            out.append(_word(len(getattr(obj, f.of))))
        elif f.kind == "int":
            out.append(_word(getattr(obj, f.name)))
        elif f.kind == "ints":
            out.append(np.asarray(getattr(obj, f.name), np.int64).astype("<i8").tobytes())
        elif f.kind == "bytes":
            b = getattr(obj, f.name)
            out += [_word(len(b)), b, b"\0" * (-len(b) % 8)]
        else:  # records
            out += [encode(f.table, r) for r in getattr(obj, f.name)]
    return b"".join(out)


def decode(table: tuple, words: np.ndarray, pos: int = 0) -> tuple[dict, int]:
    """The fields of one object encoded by ``table`` at word ``pos`` of ``words`` (``<i8``), and the
    position after it. Counts are checked against the words left, so a short buffer raises."""
    out: dict[str, Any] = {}
    counts: dict[str, int] = {}

    def take(n: int) -> np.ndarray:
        nonlocal pos
        if n < 0 or pos + n > words.size:
            raise ValueError(f"plan bytes end inside a field (needs {n} words at word {pos} of {words.size})")
        pos += n
        return words[pos - n:pos]

    for f in table:
        if f.kind in ("count", "int"):
            v = int(take(1)[0])
            if f.kind == "count":
                counts[f.name] = v
            else:
                out[f.name] = v
        elif f.kind == "ints":
            out[f.name] = take(counts[f.of]).astype(np.int64)
        elif f.kind == "bytes":
            n = int(take(1)[0])
            out[f.name] = take((n + 7) // 8).tobytes()[:n] if n >= 0 else take(-1)
        else:
            recs = []
            for _ in range(counts[f.of]):
                r, pos = decode(f.table, words, pos)
                recs.append(r)
            out[f.name] = recs
    return out, pos
