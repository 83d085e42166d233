"""A location resolved with storage options keeps its store in what is derived from it (issue 53,
"Locations keep their store"). Before, ``os.path.join(loc, "t2m")``, ``f"{loc}/t2m"`` or
``loc.rstrip("/")`` of a location resolved with ``endpoint_url=...`` resolved again to the default
AWS endpoint with the environment's keys. Now ``loc / "t2m"`` (``loc.child``) is a location of the same
store, and a plain string made from such a location's name (below or above it) that would resolve to
another store is refused, naming the fix. The server is a moto server on 127.0.0.1 that checks every signature against its own key."""
from __future__ import annotations

import io
import os
import pickle

import numpy as np
import pytest

from tests.storage.s3_server import client, start_checking_server

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def service():
    """``(storage_options, array)`` of a checking server whose bucket ``lost`` holds ``d/{t}.npy``."""
    pytest.importorskip("moto")
    proc, endpoint, key, secret = start_checking_server()
    try:
        s3 = client(endpoint, key, secret)
        s3.create_bucket(Bucket="lost")
        a = np.arange(3 * 5 * 4, dtype="f4").reshape(3, 5, 4) - 7
        for t in range(3):
            buf = io.BytesIO()
            np.save(buf, a[t])
            s3.put_object(Bucket="lost", Key=f"d/{t}.npy", Body=buf.getvalue())
        yield {"key": key, "secret": secret, "endpoint_url": endpoint, "retries": 0}, a
    finally:
        proc.stdin.close()
        proc.wait(20)


@pytest.fixture(autouse=True)
def _environment_elsewhere(monkeypatch):
    """The environment names other keys and no endpoint: what a plain string would be read with."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAENVIRONMENT")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-services-secret")
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)


def _npy(store, key) -> np.ndarray:
    with store.open(key) as f:
        return np.load(io.BytesIO(f.read_exactly(f.size, 0)))


def test_a_child_of_a_resolved_location_reads_with_its_store(service):
    from dali_mesh.storage import StoredLocation, resolve_locations, store_of

    options, a = service
    (folder,) = resolve_locations(["s3://lost/d/"], options)
    for t in range(3):
        for loc in (folder / f"{t}.npy", folder.child(f"{t}.npy")):
            assert isinstance(loc, StoredLocation) and loc.store is folder.store
            assert str.__str__(loc) == f"s3://lost/d/{t}.npy"
            store, key = store_of(loc)
            np.testing.assert_array_equal(_npy(store, key), a[t])
    deep = folder.child("x/y", "z.npy")
    assert deep.key == "lost/d/x/y/z.npy" and deep.store is folder.store
    again = pickle.loads(pickle.dumps(folder / "1.npy"))  # a worker's copy: the same store's spec
    assert again.store.spec == folder.store.spec and again.key == "lost/d/1.npy"


@pytest.mark.parametrize("bad", ["", "/abs", "a//b", ".", "..", "a/../b", "a/./b", "x\ny", "t\x00"])
def test_a_child_stays_below_its_parent(service, bad):
    from dali_mesh.storage import resolve_locations

    (folder,) = resolve_locations(["s3://lost/d"], service[0])
    with pytest.raises(ValueError, match="is not a child of"):
        folder.child(bad)
    with pytest.raises(TypeError):
        folder.child(3)


@pytest.mark.parametrize("derive", ["join", "format", "rstrip", "dirname"])
def test_a_plain_string_derived_from_a_resolved_location_is_refused(service, derive):
    """Before this change each of these resolved to https://s3.us-east-1.amazonaws.com with the
    environment's keys (the request would have left this machine: here it is refused before any)."""
    from dali_mesh.storage import DataFileError, resolve_locations, store_of

    (folder,) = resolve_locations(["s3://lost/d/"], service[0])
    plain = {"join": lambda: os.path.join(folder, "0.npy"), "format": lambda: f"{folder}0.npy",
             "rstrip": lambda: folder.rstrip("/"), "dirname": lambda: os.path.dirname(folder.rstrip("/"))}[derive]()
    assert type(plain) is str
    with pytest.raises(DataFileError, match=r"loc / 'name' or loc.child\('name'\)") as got:
        store_of(plain)
    assert "not-the-services-secret" not in str(got.value) and service[0]["secret"] not in str(got.value)
    # said otherwise, it is read as said: with the options given again, or the environment's defaults
    store, key = store_of(plain, service[0])
    assert store == folder.store
    assert store_of(plain, {})[0] != folder.store


def test_a_source_given_children_reads_them_with_the_folders_store(service):
    from dali_mesh import Layout, MeshInfo, NumpySource
    from dali_mesh.storage import resolve_locations

    options, a = service
    (folder,) = resolve_locations(["s3://lost/d"], options)
    layout = Layout(MeshInfo((1,), ("mp",), (0,)), shard={"mp": 0})
    src = NumpySource([folder / f"{t}.npy" for t in range(3)], layout, batch_size=1, shuffle=False)
    for t in range(3):
        np.testing.assert_array_equal(src.read_sample(t)[0], a[t])


def test_other_buckets_and_the_same_options_resolve_as_before(service):
    from dali_mesh.storage import resolve_locations, store_of

    options, _ = service
    (folder,) = resolve_locations(["s3://lost/d"], options)
    store_of("s3://another-bucket/x.npy")  # nothing resolved there in this process: the defaults, as before
    store_of("s3://lost/other/0.npy")  # beside it, not made from its name: another dataset, read as said
    store_of("s3://lost/dx/0.npy")  # a name that only begins like it
    (same,) = resolve_locations(["s3://lost/d/0.npy"], dict(options))  # equal options: an equal store
    assert same.store == folder.store


def test_once_the_resolved_locations_are_gone_the_defaults_are_taken_again(service):
    """The refusal lasts while a location resolved with other options lives (a source holds its own):
    a later source of the bucket, in the same process, with the environment's defaults is not refused
    for a source long gone."""
    import gc

    from dali_mesh.storage import DataFileError, resolve_locations, store_of

    (folder,) = resolve_locations(["s3://lost/d"], service[0])
    with pytest.raises(DataFileError):
        store_of("s3://lost/d/0.npy")
    del folder
    gc.collect()
    store, key = store_of("s3://lost/d/0.npy")
    assert key == "lost/d/0.npy" and "127.0.0.1" not in store.spec


@pytest.mark.parametrize("name", ["a#b", "a?x=1", "a b%", "é"])
def test_a_child_of_an_https_location_is_the_object_of_that_name(tmp_path, name):
    """An http(s) store's key is its URL: a child's name is percent-encoded, so that ``loc / "a#b"`` reads the
    object ``a#b`` (before, libcurl dropped the '#...' and read the parent's sibling ``a``, which errors and
    checkpoints then named: silently another object) and ``loc / "a?x=1"`` sends no query."""
    import functools
    import http.server
    import threading

    from dali_mesh.storage import resolve_locations, store_of
    from dali_mesh.storage.remote import have_native_http

    if not have_native_http():
        pytest.skip("this build has no libcurl")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a").write_bytes(b"PARENT")
    (tmp_path / "data" / name).write_bytes(b"CHILD!")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        (folder,) = resolve_locations([f"http://127.0.0.1:{server.server_port}/data"], {})
        child = folder / name
        store, key = store_of(child)
        assert store.read_range(key, 0, 6) == b"CHILD!"
        assert "#" not in str(child) and "?" not in str(child)
    finally:
        server.shutdown()


def test_locations_made_on_threads_while_another_resolves_plain_strings(service):
    """The registry of live locations is read while other threads add to it (a thread pool opening arrays):
    no 'Set changed size during iteration'."""
    import threading

    from dali_mesh.storage import resolve_locations, store_of

    (folder,) = resolve_locations(["s3://lost/d"], service[0])
    stop, errors = threading.Event(), []

    def make():
        try:
            while not stop.is_set():
                for i in range(50):
                    folder / f"x{i}"
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=make) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for _ in range(300):
            store_of("s3://lost/elsewhere/0.npy")  # not made from it: read as said
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors
