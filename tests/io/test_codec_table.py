"""The codec table (csrc/codecs/codec_table.inc) is the one list of codecs: read from its source as
CMake reads it, it equals what the kernels library exports (``_kernels.codec_table``) and what
Python's ``read_plan.CODECS`` and ``CODEC_LIBRARIES`` say, and every codec name the formats map
their own names to (HDF5 filters, Zarr v2 compressors, Zarr v3 codecs) is in it."""
from __future__ import annotations

import os

import pytest

from dali_mesh import _kernels
from dali_mesh.formats.hdf5 import hdf5_planner as hdf5
from dali_mesh.formats.zarr import zarr_planner as zarr
from tests.helpers import ROOT, codec_rows, codec_sources

KINDS = {"Decompressor": "decompressor", "Checksum": "checksum", "KeepsSize": "keeps_size"}


@pytest.fixture
def exported():
    try:
        return _kernels.codec_table()
    except _kernels.KernelsError as e:
        pytest.skip(f"the kernels library is not built: {e}")


def test_the_table_has_unique_ids_names_and_decoder_files():
    rows = codec_rows()
    assert rows
    assert len({r.id for r in rows}) == len(rows)
    assert len({r.name for r in rows}) == len(rows)
    assert len({r.symbol for r in rows}) == len(rows)
    for path in codec_sources():  # each decoder file exists (CMake compiles them all)
        assert os.path.isfile(os.path.join(ROOT, path)), path
    # a codec with a library names how CMake finds it; a step built in has neither
    for r in rows:
        assert bool(r.library) == bool(r.cmake_libs), r


def test_the_library_exports_the_table(exported):
    want = [{"id": r.id, "name": r.name, "kind": KINDS[r.kind], "library": r.library} for r in codec_rows()]
    assert [{k: row[k] for k in ("id", "name", "kind", "library")} for row in exported] == want
    for row in exported:
        assert row["available"] == _kernels.codec_available(row["id"])
        if not row["library"]:
            assert row["available"], f"{row['name']} is built in"
    assert not _kernels.codec_available(max(r.id for r in codec_rows()) + 1)


def test_python_reads_its_codecs_from_the_table(exported):
    from dali_mesh.plan import CODEC_LIBRARIES, CODECS

    assert dict(CODECS) == {r.name: r.id for r in codec_rows()}
    assert dict(CODEC_LIBRARIES) == {r.name: r.library for r in codec_rows() if r.library}
    assert "shuffle" in CODECS and "shuffle" not in CODEC_LIBRARIES
    assert repr(CODECS) == repr(dict(CODECS))


def test_the_formats_name_codecs_of_the_table():
    names = {r.name for r in codec_rows()}
    used = {"hdf5._FILTERS": set(hdf5._FILTERS.values()), "zarr._V2_COMPRESSORS": set(zarr._V2_COMPRESSORS),
            "zarr._V3_CODECS": set(zarr._V3_CODECS.values())}
    for where, codecs in used.items():
        assert codecs and codecs <= names, f"{where} names codecs the table does not have: {sorted(codecs - names)}"
