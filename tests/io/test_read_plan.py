"""The plan file across the language boundary: what Python's typed plan objects
(dali_mesh.plan: ReadPlan, PlanSet) encode is what the C++ reader loads (LoadPlanSet, seen
through ``_kernels.plan_dump``): ``decode(encode(plan)) == plan``. The canonical JSON and the checksum
exist once, in C++ (``_kernels.canonical_json``, ``_kernels.plan_checksum``, which the writer calls),
held here to ``json`` and to the checksum's definition. The reader puts a plan's JSON check in
canonical form when it loads it, so a writer may give a metadata file's bytes as they are.
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from dali_mesh.plan import AxisPlan, WindowPlan, plan_window
from dali_mesh.plan.ranges import DEFAULT_MERGE_GAP, plan_npy_units
from dali_mesh.formats.npy import read_npy_header
from dali_mesh import Layout, _kernels
dali = pytest.importorskip("nvidia.dali")
from dali_mesh.plan import CHECK_JSON, PLAN_MAGIC, PlanFile, PlanSet, ReadPlan  # noqa: E402
from tests.helpers import SEED, random_array  # noqa: E402
from tests.helpers import mesh_of, needs_read_windows  # noqa: E402
from tests.helpers import crafted_plan, crafted_plan_file, run_plan_file  # noqa: E402

pytestmark = pytest.mark.skipif(not _kernels.library_path().exists(),
                                reason="libdali_mesh_kernels.so not built (pip install --no-build-isolation -e .)")


# ---- the expected decoding of what encode_units writes, computed from its inputs ------------------
def _gaps(fo, ub, count, fstep, groups) -> list[int]:
    """The gaps a plan's reads pass (between the units of a group, between a unit's runs)."""
    fo, ub, count, fstep = (np.asarray(v, np.int64) for v in (fo, ub, count, fstep))
    ends = fo + (count - 1) * fstep + ub
    return ([int(fo[u] - ends[u - 1]) for b, e in groups for u in range(b + 1, e)] +
            [int(fs - b) for n, fs, b in zip(count, fstep, ub) if n > 1])


def _expected_plan(wplan, dtype: np.dtype, fortran: bool, fo, do, ub, groups, check: bytes,
                   check_offset: int, repeat=None) -> dict:
    """The ReadPlan the reader must load for ``ReadPlan.from_units(wplan, dtype, fortran, fo, do, ub,
    groups, check, check_offset, repeat)`` (a JSON check in canonical form), computed from those inputs."""
    fo, do, ub = (np.asarray(v, np.int64) for v in (fo, do, ub))
    count, fstep, dstep = ((np.ones_like(fo), np.zeros_like(fo), np.zeros_like(fo)) if repeat is None
                           else (np.asarray(v, np.int64) for v in repeat))
    gaps = _gaps(fo, ub, count, fstep, groups)
    has_fill = any(a.fill.size for a in wplan.axes)
    ndim = len(wplan.axes)
    return {
        "ndim": ndim,
        "itemsize": dtype.itemsize,
        "swap_unit": 0 if dtype.isnative or dtype.itemsize == 1 else dtype.itemsize,
        "fortran": bool(fortran) and ndim > 1,
        "coded": False,
        "shape": list(wplan.window_shape),
        "file_off": fo.tolist(),
        "dst_off": do.tolist(),
        "unit_bytes": ub.tolist(),
        "unit_count": count.tolist(),
        "file_step": fstep.tolist(),
        "dst_step": dstep.tolist(),
        "group_begin": [int(b) for b, _ in groups],
        "group_end": [int(e) for _, e in groups],
        "check_offset": check_offset,
        "check": _kernels.canonical_json(check) if check_offset == CHECK_JSON else check,
        "fill": np.asarray(wplan.fill_value).astype(dtype.newbyteorder("=")).tobytes() if has_fill else b"",
        "copy_dst": [a.copy_dst.tolist() for a in wplan.axes],
        "copy_src": [a.copy_src.tolist() for a in wplan.axes],
        "fills": [a.fill.tolist() for a in wplan.axes],
        "max_gap": max(gaps, default=0),
    }


def _read_only(shape) -> WindowPlan:
    """A plan with no boundary program (every cell read), for a part that only checks a file."""
    empty = np.empty(0, np.int64)
    return WindowPlan(tuple(AxisPlan(n, ((0, 0, n),), empty, empty, empty) for n in shape), 0)


# A raw Zarr-like metadata file: whitespace, members out of order, attributes (left out when canonical)
RAW_META = b'{\n  "zarr_format": 3,\n  "shape": [4, 8],\n  "attributes": {"units": "K"},\n  "fill_value": 0\n}\n'

CASES = {
    "f4_constant": ((6, 11, 9), "<f4", False, dict(shard={"m0": 1}, halo={1: 2, 2: (1, 3)}, boundary="constant",
                                                   fill_value=-7)),
    "f8_big_endian_fortran_reflect": ((5, 12, 7), ">f8", True, dict(shard={"m0": 1}, halo={1: 3, 2: 2},
                                                                    boundary="reflect")),
    "i2_periodic_crop": ((4, 13, 10), "<i2", False, dict(shard={"m0": 2}, crop=(None, slice(1, 12), None),
                                                         halo={2: (2, 4)}, boundary="periodic")),
    "u1_symmetric_edge_even": ((3, 9, 8), "u1", True, dict(shard={"m0": 1, "m1": 2}, halo={1: 4, 2: 1},
                                                          boundary={1: "symmetric", 2: "edge"}, split="even")),
    "bool_constant_wide_halo": ((2, 7, 5), "?", False, dict(shard={"m0": 1}, halo={1: 6}, boundary="constant",
                                                            fill_value=True)),
    "i8_big_endian_edge_1d": ((17,), ">i8", False, dict(shard={"m0": 0}, halo={0: (2, 9)}, boundary="edge")),
}


@pytest.mark.parametrize("items_as_words", [False, True], ids=["items", "item_words"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_plan_file_loads_as_it_was_encoded(tmp_path, case, items_as_words):
    """Every field of the loaded PlanSet equals what the Python writer was given: the plans (units,
    groups, check, fill, boundary program), the file table and the items' parts; the raw JSON check
    comes back in canonical form."""
    shape, dtype, fortran, layout_kw = CASES[case]
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(SEED)
    mesh_shape = (1,) + (3,) * (len(layout_kw["shard"]))
    coordinate = (0,) + tuple(int(rng.integers(0, 3)) for _ in layout_kw["shard"])
    layout = Layout(mesh_of(mesh_shape, coordinate), **layout_kw)
    files = []
    for k in range(2):  # two files of one layout share a plan
        a = random_array(rng, shape, dtype.newbyteorder("=")).astype(dtype)
        files.append(str(tmp_path / f"s{k}.npy"))
        np.save(files[-1], np.asfortranarray(a) if fortran else a)
    header = read_npy_header(files[0])
    with open(files[0], "rb") as f:
        npy_check = f.read(header.data_offset)
    wplan = plan_window(layout.region(shape))
    # units merged into reads as the planner merges them (gaps inside reads), or one read per run of
    # adjacent units (many reads)
    merged = case in ("f4_constant", "f8_big_endian_fortran_reflect", "i8_big_endian_edge_1d")
    # the native planner's units: a box's runs repeated along one axis where their gaps are merged
    units = plan_npy_units(header, wplan, merge_gap=DEFAULT_MERGE_GAP if merged else 0, page_merge=merged)
    fo, do, ub, groups = units.plan_args
    if case in ("f4_constant", "f8_big_endian_fortran_reflect"):
        assert (units.count > 1).any(), units  # rows merged into reads: repeated units
    window = wplan.window_shape
    meta = tmp_path / "meta.json"
    meta.write_bytes(RAW_META)
    assert _kernels.canonical_json(RAW_META) != RAW_META  # the reader must canonicalise it

    plans = PlanSet(dtype.newbyteorder("="), len(shape))
    read = ReadPlan.from_units(wplan, header.dtype, header.fortran_order, fo, do, ub, groups, npy_check, 0,
                               repeat=units.repeat)
    meta_plan = ReadPlan.from_units(_read_only(window), header.dtype, False, [], [], [], [], RAW_META, CHECK_JSON)
    assert plans.add_plan(read) == 0
    assert plans.add_plan(meta_plan) == 1
    plans.files += [PlanFile(f, os.path.getsize(f)) for f in files] + [PlanFile(str(meta), -1)]
    # (file, plan, base, window byte offset): sample 0 reads file 0 and checks the metadata; sample 1
    # reads file 1 at a base offset (as a step of a time series is read)
    items = [(0, [(0, 0, 0, 0), (2, 1, 0, 0)]), (0, [(1, 0, 24, 0)]), (1, [])]
    if items_as_words:
        words = [w for fin, parts in items for w in (fin, len(parts), *(v for p in parts for v in p))]
        plans.set_item_words(np.asarray(words, np.int64), len(items))
    else:
        plans.items = items
    path = plans.write(str(tmp_path / "plans"))

    dump = _kernels.plan_dump(path)
    parts, want_items = [], []
    for fin, item_parts in items:
        want_items.append({"finish": fin, "part_begin": len(parts), "part_end": len(parts) + len(item_parts)})
        parts += [{"file": f, "plan": p, "base": b, "dst_base": d} for f, p, b, d in item_parts]
    want = {
        "source": os.fsencode(path),
        "plans": [_expected_plan(wplan, header.dtype, header.fortran_order, fo, do, ub, groups, npy_check, 0,
                                 units.repeat),
                  _expected_plan(_read_only(window), header.dtype, False, [], [], [], [], RAW_META, CHECK_JSON)],
        "files": [{"store": f.store.encode(), "key": os.fsencode(f.key), "size": f.size, "mtime_ns": f.mtime_ns,
                   "tag": f.tag, "check_offset": f.check_offset, "check": f.check} for f in plans.files],
        "parts": parts,
        "items": want_items,
        "coders": [],
        "chunks": [],
    }
    assert dump == want, f"seed {SEED}"
    # and the typed objects say the same as the reader (the JSON check aside, which it canonicalises):
    # decode(encode(plan)) is the plan, the decoder being the reader's loader (Python has none)
    assert _as_dump(read) == dump["plans"][0]
    assert {**_as_dump(meta_plan), "check": dump["plans"][1]["check"]} == dump["plans"][1]
    assert dump["plans"][1]["check"] == b'{"fill_value":0,"shape":[4,8],"zarr_format":3}'
    assert _kernels.plan_dump(path, size_hint=16) == dump  # a buffer too small: asked again


def test_a_metadata_check_that_is_not_json_is_refused_when_loaded(tmp_path):
    plans = PlanSet(np.dtype(np.float32), 1)
    plans.add_plan(ReadPlan.from_units(_read_only((4,)), np.dtype(np.float32), False, [], [], [], [], b"[1, 2]",
                                       CHECK_JSON))
    plans.files.append(PlanFile(str(tmp_path / "meta.json"), -1))
    plans.items = [(0, [(0, 0, 0, 0)])]
    path = plans.write(str(tmp_path))
    with pytest.raises(_kernels.KernelsError,
                       match="the plan file is corrupt \\(a metadata check that is not one JSON object"):
        _kernels.plan_dump(path)


def test_a_raw_metadata_check_is_read_by_the_operator(tmp_path):
    """A plan whose JSON check holds the metadata file's bytes as they are (not canonical): the
    operator reads while the metadata says the same in other whitespace, order or attributes, and
    refuses once it says something else."""
    needs_read_windows()
    from nvidia.dali import fn, pipeline_def, types

    from dali_mesh.fn import load_plugin

    data = tmp_path / "data.bin"
    raw = np.arange(4, dtype=np.float32)
    data.write_bytes(raw.tobytes())
    meta = tmp_path / "meta.json"
    plans = PlanSet(np.dtype(np.float32), 1)
    plans.add_plan(ReadPlan.from_units(_read_only((4,)), raw.dtype, False, [0], [0], [16], [(0, 1)]))
    plans.add_plan(ReadPlan.from_units(_read_only((4,)), raw.dtype, False, [], [], [], [], RAW_META, CHECK_JSON))
    plans.files += [PlanFile(str(data), raw.nbytes), PlanFile(str(meta), -1)]
    plans.items = [(0, [(0, 0, 0, 0), (1, 1, 0, 0)])]
    path = plans.write(str(tmp_path / "plans"))
    ops = load_plugin()

    def run():
        @pipeline_def(batch_size=1, num_threads=1, device_id=None)
        def pipe():
            ids = fn.external_source(source=lambda: [np.array(0, np.int64)], batch=True, dtype=types.INT64)
            return ops.read_windows(ids, plan_file=path, dtype=types.FLOAT)

        p = pipe()
        p.build()
        (w,) = p.run()
        return np.array(w[0])

    obj = json.loads(RAW_META)
    for text in (RAW_META, json.dumps(obj).encode(), json.dumps({**obj, "attributes": {"a": 1}}, indent=1).encode()):
        meta.write_bytes(text)
        np.testing.assert_array_equal(run(), raw)
    meta.write_bytes(json.dumps({**obj, "shape": [4, 9]}).encode())
    with pytest.raises(RuntimeError, match="meta.json: its metadata .* differs"):
        run()


def test_outputs_are_runs_of_items_and_a_wrong_count_is_refused(tmp_path):
    """outputs=2: the plan set's items are output 0's, then output 1's, one per sample id; each
    sample's two windows come out of the two outputs. PlanSet.joined makes such a set of two sets
    with tables of their own (re-indexed into one, equal entries once). Items that are not a whole
    number of outputs' runs are refused when the pipeline is built."""
    needs_read_windows()
    from nvidia.dali import fn, pipeline_def, types

    from dali_mesh.fn import load_plugin

    data = tmp_path / "data.bin"
    raw = np.arange(12, dtype=np.float32)
    data.write_bytes(raw.tobytes())

    def plan_set(bases):  # one item per base: the 4 floats from that byte
        plans = PlanSet(np.dtype(np.float32), 1)
        plans.add_plan(ReadPlan.from_units(_read_only((4,)), raw.dtype, False, [0], [0], [16], [(0, 1)]))
        plans.files.append(PlanFile(str(data), raw.nbytes))
        plans.items = [(0, [(0, 0, b, 0)]) for b in bases]
        return plans

    ops = load_plugin()

    def run(path, outputs):
        @pipeline_def(batch_size=2, num_threads=1, device_id=None)
        def pipe():
            ids = fn.external_source(source=lambda: [np.array(1, np.int64), np.array(0, np.int64)], batch=True,
                                     dtype=types.INT64)
            return tuple(ops.read_windows(ids, plan_file=path, dtype=types.FLOAT, outputs=outputs))

        p = pipe()
        p.build()
        return [[np.array(o[i]) for i in range(2)] for o in p.run()]

    # sample ids 0 and 1: output 0 reads floats [4 id, 4 id + 4), output 1 floats [8 - 4 id, 12 - 4 id)
    joined = PlanSet.joined([plan_set([0, 16]), plan_set([32, 16])])
    assert joined.num_items == 4 and len(joined.plans) == 1 and len(joined.files) == 1
    (a1, a0), (b1, b0) = run(joined.write(str(tmp_path / "p2")), 2)
    np.testing.assert_array_equal(a0, raw[0:4])
    np.testing.assert_array_equal(a1, raw[4:8])
    np.testing.assert_array_equal(b0, raw[8:12])
    np.testing.assert_array_equal(b1, raw[4:8])
    with pytest.raises(RuntimeError, match="3 items are not 2 outputs' items per sample id"):
        run(plan_set([0, 16, 32]).write(str(tmp_path / "p3")), 2)
    with pytest.raises(ValueError, match="different numbers of items"):
        PlanSet.joined([plan_set([0]), plan_set([0, 16])])
    assert PlanSet.joined([plan_set([]), plan_set([])]).num_items == 0  # no samples: no items, no words


# ---- canonical JSON: the texts of tests/test_native_review.py's canonical-json tests -------------
REVIEW_JSONS = [  # test_canonical_json_agrees_with_the_reader
    b'{"zarr_format": 3, "shape": [4, 8], "fill_value": "NaN", "attributes": {"a": [1, {"b": "}"}]}}',
    b'{"k": "a \\" , ] } \\\\", "n": -1.5e+3, "u": "\xc3\xa9\\u00e9", "o": {"x": [ ], "y": { }}}',
    b'{ }',
    b'{"dimension_names": ["t", null], "t": true, "f": false, "z": null}',
]
CANONICAL_CASES = [  # test_canonical_json
    b'{ "b" : [1, 2],\n "a": {"x": "s p"}, "attributes": {"u": 1}}',
    b'{"a":{"x":"s p"},"b":[1,2]}',
    b'{"b":[1,2],"a":{"x":"s p"}}',
    b'{"k": "a \\" , }"}',
    b'{"shape": [4, 8]}',
    b'{"shape": [4, 9]}',
    b'{"dimension_names": ["t", "c"], "zarr_format": 3}',
    b"{}",
    b"", b"[1]", b'{"a": 1,}', b'{"a" 1}', b'{"a": [1}', b'{"a": "x}', b"{1: 2}", b'{"a":}',
]


def _variants(text: bytes) -> list[bytes]:
    """``text`` and the texts test_canonical_json_agrees_with_the_reader derives from it."""
    out = [text, b"\n " + text.replace(b', "', b',\n\t "') + b"\r\n", text[:-1]]
    try:
        obj = json.loads(text)
    except ValueError:
        return out
    if not isinstance(obj, dict):
        return out
    return out + [json.dumps(dict(reversed(list({**obj, "attributes": {"units": "K"}}.items()))), indent=3).encode(),
                  json.dumps({**obj, "shape": [4, 9]}).encode()]


_IGNORED = ("attributes", "dimension_names")


def _object(text: bytes):
    """``json``'s reading of ``text`` when it is one JSON object, else None."""
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


@pytest.mark.parametrize("text", [v for t in REVIEW_JSONS + CANONICAL_CASES for v in _variants(t)])
def test_canonical_json_agrees_with_json(text):
    """The reader's canonical form says what ``json`` reads, less the members that do not change a
    chunk's bytes, with no whitespace outside strings and the members sorted by key; it refuses
    what ``json`` does not read as one object; it is idempotent."""
    got = _kernels.canonical_json(text)
    obj = _object(text)
    if obj is None:
        assert got is None, text
        return
    assert got is not None, text
    assert json.loads(got) == {k: v for k, v in obj.items() if k not in _IGNORED}, text
    keys = [k.encode() for k in json.loads(got)]
    assert keys == sorted(keys)
    assert _kernels.canonical_json(got) == got  # a check written canonical loads as it is
    spaced = b"\n " + text.replace(b', "', b',\n\t "') + b"\r\n"
    if _object(spaced) == obj:
        assert _kernels.canonical_json(spaced) == got


def _as_dump(plan: ReadPlan) -> dict:
    """A typed plan as ``_kernels.plan_dump`` names its fields."""
    d = plan.to_dict()
    gaps = _gaps(d["file_off"], d["unit_bytes"], d["unit_count"], d["file_step"],
                 zip(d["group_begin"], d["group_end"]))
    axes = d.pop("axes")
    return {**d, "ndim": plan.ndim, "fortran": bool(d["fortran"]), "coded": bool(d["coded"]), "max_gap": max(gaps, default=0),
            **{k: [a[k] for a in axes] for k in ("copy_dst", "copy_src", "fills")}}


# ---- checksum ----------------------------------------------------------------------------------------
def _checksum(words: bytes) -> bytes:
    """The checksum's definition (csrc/plan/plan.h): sum of word_i * k_i mod 2**64 over the little-endian
    words, k_i = (i * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) | 1 -- plain integers, no numpy."""
    total = 0
    for i in range(len(words) // 8):
        k = ((i * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) % 2**64) | 1
        total = (total + int.from_bytes(words[8 * i:8 * i + 8], "little") * k) % 2**64
    return total.to_bytes(8, "little")


def test_plan_checksum_of_cxx_equals_its_definition(tmp_path):
    rng = np.random.default_rng(SEED)
    for n_words in (0, 1, 2, 3, 7, 8, 64, 1001):
        for _ in range(4):
            words = rng.integers(0, 256, 8 * n_words, dtype=np.uint8).tobytes()
            assert _kernels.plan_checksum(words) == _checksum(words), f"seed {SEED}, {n_words} words"
    extreme = np.array([0, 1, 2**64 - 1, 2**63, 2**63 - 1], np.uint64).astype("<u8").tobytes()
    assert _kernels.plan_checksum(extreme) == _checksum(extreme)
    # a real plan file: its last word is the checksum of the words between the magic and it
    plans = PlanSet(np.dtype(np.float32), 1)
    plans.add_plan(ReadPlan.from_units(_read_only((4,)), np.dtype(np.float32), False, [0], [0], [16], [(0, 1)]))
    plans.files.append(PlanFile(str(tmp_path / "data.bin"), 16))
    plans.items = [(0, [(0, 0, 0, 0)])]
    data = plans.to_bytes()
    assert data[:8] == PLAN_MAGIC
    assert _checksum(data[8:-8]) == data[-8:]
    with pytest.raises(_kernels.KernelsError, match="not a whole number of 8-byte words"):
        _kernels.plan_checksum(b"\0" * 12)


# ---- Zarr metadata in canonical form ---------------------------------------------------------------
@pytest.mark.timeout(180)
def test_canonical_json():
    c = _kernels.canonical_json
    assert c(b'{ "b" : [1, 2],\n "a": {"x": "s p"}, "attributes": {"u": 1}}') == b'{"a":{"x":"s p"},"b":[1,2]}'
    assert c(b'{"a":{"x":"s p"},"b":[1,2]}') == c(b'{"b":[1,2],"a":{"x":"s p"}}')
    assert c(b'{"k": "a \\" , }"}') == b'{"k":"a \\" , }"}'  # an escaped quote and brackets in a string
    assert c(b'{"shape": [4, 8]}') != c(b'{"shape": [4, 9]}')
    assert c(b'{"dimension_names": ["t", "c"], "zarr_format": 3}') == b'{"zarr_format":3}'
    assert c(b"{}") == b"{}"
    for bad in (b"", b"[1]", b'{"a": 1,}', b'{"a" 1}', b'{"a": [1}', b'{"a": "x}', b"{1: 2}", b'{"a":}'):
        assert c(bad) is None, bad


@pytest.mark.timeout(180)
@pytest.mark.parametrize("text", REVIEW_JSONS)
def test_canonical_json_agrees_with_the_reader(tmp_path, text):
    """The plan's canonical form (the kernels library's, as the planner takes it) against the reader's,
    through the operator: the same
    text with other whitespace, member order and attributes is read; another value is refused."""
    needs_read_windows()
    data = tmp_path / "data.bin"
    raw = np.arange(4, dtype=np.float32)
    data.write_bytes(raw.tobytes())
    meta = tmp_path / "meta.json"
    canon = _kernels.canonical_json(text)
    assert canon is not None
    read = crafted_plan(1, 4, 0, 0, [4], [0], [0], [16], [0], [1])
    check = crafted_plan(1, 4, 0, 0, [4], [], [], [], [], [], check=canon, check_off=CHECK_JSON)
    path = crafted_plan_file(tmp_path / "p.plan", [read, check], [(str(data), 16), (str(meta), -1)],
                      [(0, [(0, 0, 0, 0), (1, 1, 0, 0)])])
    import json

    obj = json.loads(text)
    same = [text, b"\n " + text.replace(b', "', b',\n\t "') + b"\r\n"]  # (no ', "' inside their strings)
    other = json.dumps(dict(reversed(list({**obj, "attributes": {"units": "K"}}.items()))), indent=3).encode()
    if _kernels.canonical_json(other) == canon:  # json.dumps writes the values as they were written
        same.append(other)
    for t in same:
        meta.write_bytes(t)
        (w,) = run_plan_file(path)
        np.testing.assert_array_equal(np.array(w[0]), raw)
    meta.write_bytes(json.dumps({**obj, "shape": [4, 9]}).encode())
    with pytest.raises(RuntimeError, match="meta.json: its metadata .* differs"):
        run_plan_file(path)
    meta.write_bytes(text[:-1])  # not one JSON object
    with pytest.raises(RuntimeError, match="meta.json: its metadata .* differs"):
        run_plan_file(path)


# ---- the schema: one source (Python's tables), the C++ loader's field lists held to it ------------------
def _file_order(table) -> list[str]:
    """The fields of an encoding table as the loaded objects keep them, in file order: counts are kept
    only as their arrays' lengths (a ReadPlan's ``ndim`` aside), a list of records as one list per field."""
    out = []
    for f in table:
        if f.kind == "records":
            out += _file_order(f.table)
        elif f.kind != "count" or f.name == "ndim":
            out.append(f.name)
    return out


def test_the_loaders_field_lists_are_the_python_tables(tmp_path):
    """The plan file's fields are written once, by Python's tables (dali_mesh/plan/encoding.py, the item
    parts of types.py, the chunk rows of PlanSet.add_chunk); the C++ loader reads by one list per object
    (csrc/plan/plan_fields.h), and its dump writes the fields in that order: names and order are the
    tables'. (Values across the boundary: test_a_plan_file_loads_as_it_was_encoded.)"""
    import inspect

    from dali_mesh.plan import CODECS, Coder
    from dali_mesh.plan.encoding import _CODER, _PLAN_FILE, _READ_PLAN
    from dali_mesh.plan.types import PlanPart

    data = tmp_path / "x.bin"
    data.write_bytes(bytes(64))
    plans = PlanSet(np.dtype("f4"), 1)
    plans.add_plan(ReadPlan.from_units(_read_only((16,)), np.dtype("f4"), False, [0], [0], [64], [(0, 1)]))
    plans.files.append(PlanFile(str(data), 64))
    plans.add_chunk(0, 0, 64, plans.add_coder(Coder(((CODECS["zlib"], 0),), 64)))
    plans.items = [(0, [(0, 0, 0, 0)])]
    dump = _kernels.plan_dump(plans.write(str(tmp_path / "plans")))
    assert [k for k in dump["plans"][0] if k != "max_gap"] == _file_order(_READ_PLAN)  # max_gap: derived
    assert list(dump["files"][0]) == _file_order(_PLAN_FILE)
    assert list(dump["coders"][0]) == _file_order(_CODER)
    assert list(dump["parts"][0]) == list(PlanPart._fields)
    assert list(dump["chunks"][0]) == list(inspect.signature(PlanSet.add_chunk).parameters)[1:]
