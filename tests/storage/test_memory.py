"""The memory store (dali_mesh/storage/memory/, csrc/storage/memory_store.cc): the shared store tests,
listing against the set of keys written, the store registry's errors (csrc/storage/byte_store.cc: a kind
no library has, an operation a store lacks), names apart, the DALI plugin reaching every kind and every
object in the one native core with nothing given to it, and a format written into memory read back by the
native reader."""
from __future__ import annotations

import ctypes
import io
import itertools

import numpy as np
import pytest

from dali_mesh.storage import DataFileError, MissingFileError, store_of
from dali_mesh.storage.memory import MemoryStore
from dali_mesh.storage.native_store import store_api, store_message
from tests.helpers import SEED, mesh_of, random_array
from tests.storage.store_tests import FileObjectTests, StoreTests

_names = itertools.count()


def _fresh() -> MemoryStore:
    """A store of a name no other test uses (the stores live as long as the process)."""
    return MemoryStore(f"test-{next(_names)}")


def _c_error(entry: str, spec: str, *args) -> str:
    """The message of ``entry`` of the store C API, which must fail."""
    err = ctypes.create_string_buffer(4096)
    assert getattr(store_api(), entry)(spec.encode(), *args, err, 4096) == -1
    return store_message(err)


class TestMemoryStore(StoreTests, FileObjectTests):
    @pytest.fixture
    def store(self):
        return _fresh()

    def put(self, store, name, data):
        store.put(name, data)
        return name

    def rewrite(self, store, key, data):
        store.put(key, data)

    def missing_key(self, store):
        return "missing.bin"


# ---- listing ----------------------------------------------------------------------------------------
_KEYS = ["a", "a/", "a/b/c", "a/b/d", "a/x", "a/y/z/w", "ab/c", "b", "é/ü", "sp ace/x", "tab\tkey/1", "%41/x",
         "a+b", "x<y>&\"'"] + [f"many/{i:05d}" for i in range(1500)] + [f"groups/g{i:04d}/x" for i in range(1100)]


def _oracle(keys, prefix: str, delimiter: bool):
    """What a listing of ``prefix`` holds: the objects and the prefixes one level down."""
    under = sorted(k for k in keys if k.startswith(prefix))
    if not delimiter:
        return under, []
    objects = [k for k in under if "/" not in k[len(prefix):]]
    prefixes = sorted({prefix + k[len(prefix):].split("/")[0] + "/" for k in under if "/" in k[len(prefix):]})
    return objects, prefixes


@pytest.fixture(scope="module")
def listed():
    store = _fresh()
    for k in _KEYS:
        store.put(k, k.encode() * 3)
    return store


@pytest.mark.parametrize("prefix", ["", "a", "a/", "a/b/", "many/", "many/01", "groups/", "é/", "%41/", "nothing/"])
@pytest.mark.parametrize("delimiter", [True, False])
def test_listing_holds_the_keys_and_prefixes_written(listed, prefix, delimiter):
    objects, prefixes = listed.list(prefix, delimiter)
    want_objects, want_prefixes = _oracle(_KEYS, prefix, delimiter)
    assert [k for k, _ in objects] == want_objects
    assert prefixes == want_prefixes
    # pages of 1,000 entries: the many keys and groups cross page ends
    for key, version in objects[:: max(1, len(objects) // 20)]:
        assert version == listed.stat(key) and version.size == 3 * len(key.encode())


def test_a_listing_follows_writes_and_deletes():
    store = _fresh()
    store.put("d/1", b"x")
    store.put("d/2", b"y")
    assert store.delete("d/1") and not store.delete("d/1")
    assert [k for k, _ in store.list("d/")[0]] == ["d/2"]
    assert store.stat("d/1") is None
    # any buffer is written as its bytes
    arr = np.arange(7, dtype="<i2")
    assert store.put("d/3", arr).size == arr.nbytes and store.read_range("d/3", 0, 100) == arr.tobytes()
    assert store.put("d/4", bytearray(b"ab")).size == 2 and store.read_range("d/4", 1, 9) == b"b"
    assert [k for k, _ in store.list("d/")[0]] == ["d/2", "d/3", "d/4"]


def test_keys_of_every_byte_list_as_written():
    """The listing crosses the C API as length-prefixed fields (csrc/c_api/store_api.cc EncodedListing, read
    by dali_mesh/storage/listing.py read_page): keys of every byte but NUL (control characters, ':' and
    digits that look like a field's length, bytes that are not UTF-8), listed back as written, in byte
    order, pages of 1,000 crossed."""
    store = _fresh()
    odd = [bytes([b]).decode("utf-8", "surrogateescape") for b in range(1, 256)]
    keys = [f"b/{c}x" for c in odd] + ["b/12:o3:abc", "b/r1:5", "b/\n/n", "b/\x7f/d"]
    keys += [f"b/m{i:04d}" for i in range(900)]
    raw = {k: k.encode("utf-8", "surrogateescape") for k in keys}
    for k in keys:
        store.put(k, raw[k])
    by_bytes = sorted(keys, key=raw.get)
    objects, prefixes = store.list("b/", delimiter=False)
    assert [k for k, _ in objects] == by_bytes and prefixes == []
    for key, version in objects:
        assert version == store.stat(key) and store.read_range(key, 0, 1 << 10) == raw[key]
    objects, prefixes = store.list("b/", delimiter=True)
    assert ([k for k, _ in objects], prefixes) == _oracle(by_bytes, "b/", True)
    assert {"b/\n/", "b/\x7f/", "b//"} <= set(prefixes)


def test_a_page_that_is_not_one_is_refused():
    from dali_mesh.storage.listing import read_page

    page = read_page(b"o3:a/b2:10" + b"3:\"e\"" + b"p3:a/c" + b"n4:o\x01:z" + b"r3:512")
    assert page.objects == [("a/b", page.objects[0][1])] and page.objects[0][1].size == 10
    assert page.objects[0][1].tag == '"e"' and page.prefixes == ["a/c"] and page.next == b"o\x01:z"
    assert page.received == 512
    for bad in (b"x1:a", b"o3:a/b2:10", b"p9:a", b"pa:b", b"p-1:a"):
        with pytest.raises(ValueError):
            read_page(bad)


def test_a_zarr_group_lists_through_the_store():
    zarr = pytest.importorskip("zarr")
    store = _fresh()
    written: dict = {}
    group = zarr.open_group(zarr.storage.MemoryStore(written), mode="w")
    for name, shape in (("t", (4, 6)), ("u", (3,))):
        group.create_array(name, shape=shape, chunks=(2, 3)[: len(shape)], dtype="i4")[:] = np.arange(
            np.prod(shape), dtype="i4").reshape(shape)
    for key, buf in written.items():
        store.put(f"root/{key}", buf.to_bytes())
    read = zarr.open_group(store.zarr_store("root"), mode="r")
    assert sorted(read.array_keys()) == ["t", "u"]
    np.testing.assert_array_equal(read["t"][:], np.arange(24, dtype="i4").reshape(4, 6))


# ---- the registry -----------------------------------------------------------------------------------
def test_a_missing_kind_is_named_with_the_kinds_there_are():
    size, tag = ctypes.c_int64(), ctypes.create_string_buffer(64)
    message = _c_error("dali_mesh_store_head", "nosuch;x", b"k", ctypes.byref(size), tag, 64)
    assert 'byte store "nosuch;x": this build has no store of kind "nosuch"' in message
    assert "(its kinds: file, http, icechunk, memory, s3)" in message


def test_a_bad_spec_or_location_is_refused_naming_it():
    size, tag = ctypes.c_int64(), ctypes.create_string_buffer(64)
    assert "memory;name=<name>" in _c_error("dali_mesh_store_head", "memory;name=a b", b"k", ctypes.byref(size),
                                            tag, 64)
    assert "takes no settings" in _c_error("dali_mesh_store_head", "file;x=1", b"k", ctypes.byref(size), tag, 64)
    with pytest.raises(DataFileError, match="is not a memory://<name>/<key> location"):
        store_of("memory://a b/k")
    with pytest.raises(DataFileError, match="is not a memory://<name>/<key> location"):
        store_of("memory://name-only")
    with pytest.raises(ValueError, match="take nothing"):
        store_of("memory://m/k", {"anon": True})
    with pytest.raises(DataFileError, match="holds no NUL"):
        _fresh().put("a\0b", b"x")


def test_an_operation_a_store_lacks_names_the_store():
    store = _fresh()
    assert 'byte store "%s" cannot take credentials' % store.spec in _c_error(
        "dali_mesh_store_credentials", store.spec, b"k", b"s", b"")
    assert 'byte store "file" cannot list keys' in _c_error("dali_mesh_store_list", "file", b"/", 1, b"", None, 0)
    assert 'byte store "file" cannot write objects' in _c_error("dali_mesh_store_put", "file", b"/tmp/x", b"ab", 2,
                                                                None)


def test_two_names_are_two_stores_and_one_name_one_store():
    a, b = _fresh(), _fresh()
    a.put("k", b"from a")
    assert b.stat("k") is None
    with pytest.raises(MissingFileError, match="no such"):
        b.open("k")
    b.put("k", b"from b, longer")
    assert a.read_range("k", 0, 100) == b"from a" and b.read_range("k", 0, 100) == b"from b, longer"
    again, key = store_of(f"memory://{a.name}/k")
    assert again == a and again is not a and key == "k"
    assert again.read_range(key, 5, 100) == b"a"
    assert a != b and len({a, again, b}) == 2


def test_the_plugin_has_every_kind_and_sees_every_object_at_its_version_with_nothing_given():
    """One native core per process: the DALI plugin links the kernels library, so the store entry points found
    through the plugin are the kernels library's own, and what Python writes is there for the plugin at once,
    at its version (later writes and deletes too), with nothing copied or given to it."""
    pytest.importorskip("nvidia.dali")
    from dali_mesh.pipeline.plugin import PLUGIN_PATH, load_plugin

    load_plugin()
    plugin, kernels = ctypes.CDLL(str(PLUGIN_PATH)), store_api()  # the plugin DALI loaded, and its dependencies

    def address(fn) -> int:
        return ctypes.cast(fn, ctypes.c_void_p).value

    for entry in ("dali_mesh_store_head", "dali_mesh_store_put", "dali_mesh_store_credentials",
                  "dali_mesh_store_bind_reader", "dali_mesh_store_counters"):
        assert address(getattr(plugin, entry)) == address(getattr(kernels, entry)), entry
    head = plugin.dali_mesh_store_head
    head.argtypes, head.restype = kernels.dali_mesh_store_head.argtypes, kernels.dali_mesh_store_head.restype
    size, tag = ctypes.c_int64(), ctypes.create_string_buffer(64)
    assert "(its kinds: file, http, icechunk, memory, s3)" in _c_error(
        "dali_mesh_store_head", "nosuch;x", b"k", ctypes.byref(size), tag, 64)

    def plugin_head(store, key):
        err = ctypes.create_string_buffer(4096)
        found = head(store.spec.encode(), key.encode(), ctypes.byref(size), tag, 64, err, 4096)
        assert found >= 0, err.value
        return (size.value, tag.value.decode()) if found else None

    store, other = _fresh(), _fresh()
    v1 = store.put("x", b"first")
    store.put("y", b"")
    store.put("gone", b"z")
    store.delete("gone")
    assert plugin_head(store, "x") == (5, v1.tag) and plugin_head(store, "y")[0] == 0
    assert plugin_head(store, "gone") is None
    v2 = store.put("x", b"second!")  # later writes are there too, at their versions
    assert v2.tag != v1.tag and plugin_head(store, "x") == (7, v2.tag)
    store.delete("y")
    assert plugin_head(store, "y") is None
    v3 = other.put("o", b"1")  # every store, given to nothing
    assert plugin_head(other, "o") == (1, v3.tag)


# ---- a format in memory, read natively --------------------------------------------------------------
def test_npy_files_written_into_memory_read_back_through_the_native_reader(tmp_path):
    from dali_mesh import Layout, _kernels
    from dali_mesh.partition import take_window
    from dali_mesh.pipeline import native
    from dali_mesh.source import NumpySource

    store = _fresh()
    rng = np.random.default_rng(SEED)
    data = [random_array(rng, (2, 9, 11), np.dtype("<f4")) for _ in range(3)]
    for k, d in enumerate(data):
        buf = io.BytesIO()
        np.save(buf, d)
        store.put(f"s{k}.npy", buf.getvalue())
    layout = Layout(mesh_of((1, 2, 2), (0, 1, 1)), shard={"m0": 1, "m1": 2}, halo={1: 2, 2: 3},
                    boundary={1: "reflect", 2: "periodic"})
    src = NumpySource([f"memory://{store.name}/s{k}.npy" for k in range(3)], layout, batch_size=1, shuffle=False)
    (plan,) = native.plan_windows(src)
    assert {f.store for f in plan.files} == {store.spec}
    path = plan.write(str(tmp_path))
    ids = list(range(plan.num_items))
    with _kernels.PlanReader(path, plan.dtype, outputs=1) as reader:
        (wins,) = reader.read(ids, threads=2)
    for i, w in zip(ids, wins):
        np.testing.assert_array_equal(w, take_window(data[i], src.region))
    # a rewrite after the plan is a new version: the native reader refuses the file
    store.put("s1.npy", store.read_range("s1.npy", 0, 1 << 20))
    with _kernels.PlanReader(path, plan.dtype, outputs=1) as reader:
        with pytest.raises(Exception, match="modified since the plan was made"):
            reader.read([1], threads=1)


# ---- a format in memory, read by the DALI operator ---------------------------------------------------
@pytest.mark.parametrize("kind", ["npy", "zarr"])
def test_a_dali_pipeline_reads_arrays_written_into_memory(tmp_path, kind):
    """``.npy`` objects or a Zarr v2 array (Blosc chunks) written into a memory store, read by
    ``fn.read_windows`` (the plugin reads the one native core's store, which Python wrote) equal to numpy; then
    a rewrite reaches the plugin too (a new pipeline reads the new bytes)."""
    pytest.importorskip("nvidia.dali")
    import os

    import zarr
    from nvidia.dali import pipeline_def

    from dali_mesh import Layout, NumpySource, ZarrSource
    from dali_mesh.fn import read_windows
    from dali_mesh.partition import take_window

    store = _fresh()
    rng = np.random.default_rng(SEED)
    data = random_array(rng, (4, 9, 11), np.dtype("<f4"))
    if kind == "npy":
        for t in range(len(data)):
            buf = io.BytesIO()
            np.save(buf, data[t])
            store.put(f"s{t}.npy", buf.getvalue())
    else:
        local = tmp_path / "a.zarr"
        zarr.create_array(local, shape=data.shape, chunks=(1, 5, 6), dtype="f4", zarr_format=2)[:] = data
        for root, _, names in os.walk(local):
            for name in names:
                path = os.path.join(root, name)
                with open(path, "rb") as f:
                    store.put("a.zarr/" + os.path.relpath(path, local), f.read())
    layout = Layout(mesh_of((1, 2, 2), (0, 1, 0)), shard={"m0": 0, "m1": 1}, halo={0: 2, 1: 1},
                    boundary={0: "reflect", 1: "periodic"})

    def source():
        if kind == "npy":
            return NumpySource([f"memory://{store.name}/s{t}.npy" for t in range(len(data))], layout, batch_size=2,
                               shuffle=False)
        return ZarrSource([f"memory://{store.name}/a.zarr"], None, layout, batch_size=2, shuffle=False)

    def windows(src):
        @pipeline_def(batch_size=2, num_threads=2, device_id=None)
        def pipe():
            return read_windows(src, fallback=False)

        p = pipe()
        p.build()
        out = {}
        for _ in range(len(data) // 2):
            w, ids, _ = p.run()
            out.update((int(np.array(ids[j])), np.array(w[j])) for j in range(2))
        return out

    src = source()
    got = windows(src)
    assert sorted(got) == list(range(len(data)))
    for t, w in got.items():
        np.testing.assert_array_equal(w, take_window(data[t], src.region), err_msg=f"step {t}, seed {SEED}")
    if kind == "npy":  # a later write goes to the plugin's copy too
        buf = io.BytesIO()
        np.save(buf, data[0] + 1)
        store.put("s0.npy", buf.getvalue())
        src = source()
        np.testing.assert_array_equal(windows(src)[0], take_window(data[0] + 1, src.region))
