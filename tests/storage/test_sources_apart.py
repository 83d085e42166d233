"""Two sources of one bucket and key, on two S3 services with other endpoints and other keys (dev and
prod MinIO, a mirror), each read their own objects with their own keys: in Python, in the native
operator, in a worker process and in a DALI parallel external source's workers (issue 40, finding 3).
Both services are moto servers on 127.0.0.1 that check every signature against their own IAM user's
key, so a request signed with the other source's key, or sent to the other endpoint, is refused or reads
the other bytes: either fails these tests. No table of credentials exists: each store object keeps its
own, and a worker's store objects (one per source, shared by its files and by its open handles) take
them from the source that carried them (issue 41)."""
from __future__ import annotations

import gc
import multiprocessing
import os
import pickle

import numpy as np
import pytest

from tests.storage.s3_server import client, start_checking_server

pytestmark = pytest.mark.timeout(180)

SHAPE = (4, 12, 10)


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    """``[(storage_options, array)]`` of two checking servers holding other arrays under the same
    ``data/apart/...`` keys: ``.npy`` objects and a Zarr v2 store."""
    pytest.importorskip("moto")
    import zarr

    started = [start_checking_server() for _ in range(2)]
    try:
        out = []
        for n, (_, endpoint, key, secret) in enumerate(started):
            s3 = client(endpoint, key, secret)
            s3.create_bucket(Bucket="data")
            a = np.arange(np.prod(SHAPE), dtype="f4").reshape(SHAPE) + 1000 * (n + 1)
            for t in range(SHAPE[0]):
                buf = __import__("io").BytesIO()
                np.save(buf, a[t])
                s3.put_object(Bucket="data", Key=f"apart/{t}.npy", Body=buf.getvalue())
            local = tmp_path_factory.mktemp(f"service{n}") / "a.zarr"
            z = zarr.create_array(local, shape=SHAPE, chunks=(1, 6, 10), dtype="f4", zarr_format=2)
            z[:] = a
            for root, _, names in os.walk(local):
                for name in names:
                    path = os.path.join(root, name)
                    s3.upload_file(path, "data", "apart/a.zarr/" + os.path.relpath(path, local))
            out.append(({"key": key, "secret": secret, "endpoint_url": endpoint, "retries": 0}, a))
        yield out
    finally:
        for proc, *_ in started:
            proc.stdin.close()
            proc.wait(20)


def _source(kind, options, layout):
    from dali_mesh import NumpySource, ZarrSource

    if kind == "npy":
        return NumpySource([f"s3://data/apart/{t}.npy" for t in range(SHAPE[0])], layout, batch_size=2,
                           shuffle=False, storage_options=options)
    return ZarrSource(["s3://data/apart/a.zarr"], None, layout, batch_size=2, shuffle=False,
                      storage_options=options)


def _layout():
    from dali_mesh import Layout, MeshInfo

    return Layout(MeshInfo((2,), ("mp",), (1,)), shard={"mp": 0}, halo={0: 1}, boundary="periodic")


def _read_all(pickled: bytes) -> list:
    """In a fresh (spawned) process without any AWS variable: the source's windows, read with the
    credentials it carried in its pickle."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            del os.environ[name]
    src = pickle.loads(pickled)
    return [src.read_sample(i)[0] for i in range(src.num_samples)]


def _read_both(pickled: bytes) -> tuple[list, list]:
    """As :func:`_read_all`, for both sources of one pickle in one process; and every remote store object
    of the process after the reads (the files' stores, those of the open handles, any made on the way):
    ``(spec, has its own credentials)`` each."""
    from dali_mesh.storage.remote import RemoteStore

    for name in list(os.environ):
        if name.startswith("AWS_"):
            del os.environ[name]
    sources = pickle.loads(pickled)
    got = [[src.read_sample(i)[0] for i in range(src.num_samples)] for src in sources]
    stores = [o for o in gc.get_objects() if isinstance(o, RemoteStore)]
    return got, [(store.spec, store.credentials is not None) for store in stores]


@pytest.fixture(autouse=True)
def _no_aws_environment(monkeypatch):
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)


@pytest.mark.parametrize("kind", ["npy", "zarr"])
def test_two_sources_of_one_bucket_on_two_services_each_read_their_own(services, kind):
    from dali_mesh.partition import take_window

    (opts_a, a), (opts_b, b) = services
    layout = _layout()
    src_b = _source(kind, opts_b, layout)
    src_a = _source(kind, opts_a, layout)  # built after B: nothing of B's may change how A reads, nor the reverse
    for src, want in ((src_a, a), (src_b, b), (src_a, a)):
        for i in range(SHAPE[0]):
            np.testing.assert_array_equal(src.read_sample(i)[0], take_window(want[i], src.region))
    # a worker process (as DALI's parallel external source): the pickled source reads its own service
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        got_b, got_a = pool.map(_read_all, [pickle.dumps(src_b), pickle.dumps(src_a)])
    for got, want, src in ((got_a, a, src_a), (got_b, b, src_b)):
        for i in range(SHAPE[0]):
            np.testing.assert_array_equal(got[i], take_window(want[i], src.region))
    # neither a pickle nor the fingerprint of a source holds a secret
    for src, opts in ((src_a, opts_a), (src_b, opts_b)):
        assert opts["secret"] not in repr(src.fingerprint())
        assert opts["secret"].encode() not in pickle.dumps(src.files)


@pytest.mark.parametrize("kind", ["npy", "zarr"])
def test_each_store_object_a_worker_reads_with_has_its_sources_credentials(services, kind):
    """Both sources in one worker process: each source's files share one store object (the pickle keeps it
    one), its open handles read through that object (a Zarr array's store wraps it), and it has the
    source's credentials; no other store object is made. The store's own pickle holds none."""
    from dali_mesh.partition import take_window

    (opts_a, a), (opts_b, b) = services
    layout = _layout()
    src_a, src_b = _source(kind, opts_a, layout), _source(kind, opts_b, layout)
    assert [len(src.stores()) for src in (src_a, src_b)] == [1, 1]
    specs = [src.stores()[0].spec for src in (src_a, src_b)]
    assert specs[0] != specs[1]
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        (got, stores), = pool.map(_read_both, [pickle.dumps([src_a, src_b])])
    for windows, want, src in zip(got, (a, b), (src_a, src_b)):
        for i in range(SHAPE[0]):
            np.testing.assert_array_equal(windows[i], take_window(want[i], src.region))
    assert sorted(stores) == sorted((spec, True) for spec in specs)
    for store, opts in zip((src_a.stores()[0], src_b.stores()[0]), (opts_a, opts_b)):
        again = pickle.loads(pickle.dumps(store))
        assert again == store and again.credentials is None and opts["secret"].encode() not in pickle.dumps(store)


def test_a_dali_parallel_external_source_reads_each_source_with_its_credentials(services, monkeypatch):
    """Two ``partitioned_source`` of one pipeline in spawned DALI workers (no AWS variable there): each
    reads its own service with the credentials its pickle carried."""
    pytest.importorskip("nvidia.dali")
    from nvidia.dali import pipeline_def

    from dali_mesh.fn import partitioned_source
    from dali_mesh.partition import take_window

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    (opts_a, a), (opts_b, b) = services
    layout = _layout()
    src_a, src_b = _source("zarr", opts_a, layout), _source("npy", opts_b, layout)

    @pipeline_def(batch_size=2, num_threads=1, device_id=None, py_num_workers=1, py_start_method="spawn")
    def pipe():
        wa, ida, _ = partitioned_source(src_a)
        wb, idb, _ = partitioned_source(src_b)
        return wa, ida, wb, idb

    p = pipe()
    p.build()
    for _ in range(2):
        wa, ida, wb, idb = p.run()
        for w, ids, src, want in ((wa, ida, src_a, a), (wb, idb, src_b, b)):
            for j in range(2):
                np.testing.assert_array_equal(np.array(w[j]), take_window(want[int(np.array(ids[j]))], src.region))


@pytest.mark.parametrize("kind", ["npy", "zarr"])
def test_the_native_operator_reads_each_source_from_its_own_service(services, kind):
    pytest.importorskip("nvidia.dali")
    from nvidia.dali import pipeline_def

    from dali_mesh.fn import read_windows
    from dali_mesh.partition import take_window
    from dali_mesh.pipeline.plugin import load_plugin
    from dali_mesh.storage.remote import have_native_http

    if not have_native_http():
        pytest.skip("this build has no libcurl")
    load_plugin()
    (opts_a, a), (opts_b, b) = services
    layout = _layout()
    src_b = _source(kind, opts_b, layout)
    src_a = _source(kind, opts_a, layout)

    def pipe_of(src):
        @pipeline_def(batch_size=2, num_threads=1, device_id=None)
        def pipe():
            return read_windows(src, fallback=False)

        p = pipe()
        p.build()
        return p

    pipes = [(pipe_of(src_a), src_a, a), (pipe_of(src_b), src_b, b)]
    for _ in range(2):  # the two pipelines' batches interleaved: one process, one plugin, two services
        for p, src, want in pipes:
            w, ids, _ = p.run()
            for j in range(2):
                sid = int(np.array(ids[j]))
                np.testing.assert_array_equal(np.array(w[j]), take_window(want[sid], src.region))
