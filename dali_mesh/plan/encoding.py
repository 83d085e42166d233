"""The plan file's encoding: one field table per object, written by :func:`encode`, the schema's one
source. The C++ loader (``LoadPlanSet``) reads it, and its dump (``_kernels.plan_dump``) writes it back,
by one field list per object (csrc/plan/plan_fields.h); ``tests/io/test_read_plan.py`` holds those lists
to these tables (names, order and values). Python has no decoder of its own: the loader is the one."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["Field", "encode"]


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
