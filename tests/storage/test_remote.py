"""Remote objects (dali_mesh/storage/remote.py, csrc/storage/http_store.cc) against a real S3 server on
127.0.0.1 (moto): the shared store tests; every window of every rank read natively from ``s3://`` (and
anonymously from ``http://``) equal to the local copy's, for every format; listing, locations and
options; credentials absent from specs, plans, pickles and messages. Faults: test_remote_faults.py."""
from __future__ import annotations

import hashlib
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dali_mesh.storage import DataFileError, MissingFileError, store_of
from dali_mesh.storage.remote import RemoteStore, have_native_http
from tests.storage.s3_server import KEY, SECRET, client, options, s3_endpoint, s3_env, upload  # noqa: F401
from tests.storage.store_tests import FileObjectTests, StoreTests

pytestmark = pytest.mark.skipif(not have_native_http(), reason="this build has no libcurl")


class TestS3Store(StoreTests, FileObjectTests):
    @pytest.fixture
    def store(self, s3_endpoint, request):
        self.endpoint = s3_endpoint
        self.prefix = f"store-tests/{request.node.name}"
        store, _ = store_of("s3://data/x", options(s3_endpoint))
        return store

    def put(self, store, name, data):
        client(self.endpoint).put_object(Bucket="data", Key=f"{self.prefix}/{name}", Body=data)
        return f"data/{self.prefix}/{name}"

    def rewrite(self, store, key, data):
        client(self.endpoint).put_object(Bucket="data", Key=key.split("/", 1)[1], Body=data)

    def missing_key(self, store):
        return f"data/{self.prefix}/missing.bin"


# ---- locations and options ----------------------------------------------------------------------------------
def test_locations_name_their_store_and_key(s3_endpoint):
    store, key = store_of("s3://data/a/b.zarr", options(s3_endpoint))
    assert isinstance(store, RemoteStore) and key == "data/a/b.zarr"
    assert store.spec.startswith(f"s3;endpoint={s3_endpoint};region=us-east-1;addressing=path;anon=0;signer=")
    assert KEY not in store.spec
    assert store.name_of(key) == "s3://data/a/b.zarr"
    gs, key = store_of("gs://bucket/era5.zarr", {"anon": True})
    assert gs.spec == "s3;endpoint=https://storage.googleapis.com;region=auto;addressing=path;anon=1"
    assert gs.name_of(key) == "gs://bucket/era5.zarr"
    aws, _ = store_of("s3://b/k", {"client_kwargs": {"region_name": "eu-west-1"}, "anon": True})
    assert aws.spec.startswith("s3;endpoint=https://s3.eu-west-1.amazonaws.com;region=eu-west-1;addressing=virtual")
    http, key = store_of("https://example.org/d/a.npy?sig=1", {"retries": 2})
    # a presigned URL's query is a credential of its store: not in the key, the spec holds its hash
    assert http.spec == f"http;q={hashlib.sha256(b'sig=1').hexdigest()[:32]};retries=2", http.spec
    assert key == "https://example.org/d/a.npy" and http.credentials.token == "sig=1"
    assert http.name_of(key) == "https://example.org/d/a.npy"
    plain, key = store_of("https://example.org/d/a.npy#part", {"retries": 2})
    assert plain.spec == "http;retries=2" and key == "https://example.org/d/a.npy"


@pytest.mark.parametrize("location, opts, match", [
    ("s3://data/k", {"bogus": 1}, "do not take"),
    ("s3://data/k", {"key": "a"}, "both key and secret"),
    ("s3://data/k", {"retries": -1}, "retries"),
    ("s3://data/k", {"stall": 0}, "stall"),
    ("s3://data/k", {"endpoint_url": "ftp://x"}, "http"),
    ("gs://b/k", {"token": "/path/to/service-account.json"}, "OAuth tokens"),
    ("https://user:pw@example.org/a", {}, "credentials in a URL"),
    ("s3:///k", {}, "BUCKET/KEY"),
])
def test_bad_locations_and_options_are_refused_by_name(location, opts, match):
    with pytest.raises((ValueError, DataFileError), match=match) as info:
        store_of(location, opts)
    assert "pw" not in str(info.value)


def test_environment_and_profile_credentials(s3_endpoint, monkeypatch, tmp_path):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    client(s3_endpoint).put_object(Bucket="data", Key="env/a.bin", Body=b"0123456789")
    store, key = store_of("s3://data/env/a.bin")
    assert store.anon  # no credentials anywhere: unsigned requests, refused by a private bucket
    with pytest.raises(DataFileError, match="access denied"):
        store.read_range(key, 0, 4)
    creds = tmp_path / "credentials"
    creds.write_text(f"[team]\naws_access_key_id = {KEY}\naws_secret_access_key = {SECRET}\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    monkeypatch.setenv("AWS_PROFILE", "team")
    store, key = store_of("s3://data/env/a.bin")
    assert store.read_range(key, 2, 4) == b"2345"
    monkeypatch.delenv("AWS_PROFILE")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    store, key = store_of("s3://data/env/a.bin")
    assert store.read_range(key, 8, 4) == b"89"


def test_listing_pages_through_every_object(s3_endpoint):
    s3 = client(s3_endpoint)
    names = [f"list/k{i:04d}" for i in range(1003)] + ["list/sub/a", "list/sub/b"]
    for n in names:
        s3.put_object(Bucket="data", Key=n, Body=n.encode())
    store, _ = store_of("s3://data/list", options(s3_endpoint))
    objects, prefixes = store.list("data/list/", delimiter=True)
    assert [k for k, _ in objects] == [f"data/{n}" for n in names[:1003]]  # two pages
    assert prefixes == ["data/list/sub/"]
    assert all(v.size == len(k) - len("data/") for k, v in objects)
    objects, prefixes = store.list("data/list/", delimiter=False)
    assert len(objects) == 1005 and not prefixes


def test_a_missing_object_is_named(s3_endpoint):
    store, key = store_of("s3://data/nothing/here.npy", options(s3_endpoint))
    assert store.stat(key) is None
    with pytest.raises(MissingFileError, match="s3://data/nothing/here.npy"):
        store.open(key)


# ---- windows from S3 equal the local copy's ----------------------------------------------------------------
def _layouts(shape, n=2, axis=0, halo=2, boundary="periodic"):
    from dali_mesh import Layout, MeshInfo

    return [Layout(MeshInfo((1, n), ("dp", "mp"), (0, r)), shard={"mp": axis}, halo={axis: halo},
                   boundary=boundary) for r in range(n)]


def _windows(src, steps):
    from tests.helpers import native_batches

    return dict(native_batches(src, steps))


@pytest.fixture
def _plugin():
    pytest.importorskip("nvidia.dali")
    from dali_mesh.pipeline.plugin import load_plugin

    load_plugin()


@pytest.mark.usefixtures("_plugin")
@pytest.mark.parametrize("boundary", ["periodic", "reflect", "constant"])
def test_every_rank_reads_hdf5_and_zarr_from_s3_natively_as_the_local_copy(s3_env, tmp_path, boundary):
    import h5py
    import zarr

    from dali_mesh import HDF5Source, ZarrSource
    from dali_mesh.partition import take_window

    rng = np.random.default_rng(31)
    data = rng.normal(size=(3, 37, 24)).astype(np.float32)
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f.create_dataset("chunked", data=data, chunks=(1, 10, 24))
        f.create_dataset("contiguous", data=data)
    z2 = zarr.create_array(tmp_path / "v2.zarr", shape=data.shape, chunks=(1, 37, 24), dtype="f4", zarr_format=2)
    z2[:] = data
    z3 = zarr.create_array(tmp_path / "v3.zarr", shape=data.shape, chunks=(1, 9, 24), shards=(1, 18, 24),
                           dtype="f4", compressors=zarr.codecs.ZstdCodec(level=3))
    z3[:] = data
    tag = f"w-{boundary}"
    h5 = upload(s3_env, tmp_path / "a.h5", "data", f"{tag}/a.h5")
    v2 = upload(s3_env, tmp_path / "v2.zarr", "data", f"{tag}/v2.zarr")
    v3 = upload(s3_env, tmp_path / "v3.zarr", "data", f"{tag}/v3.zarr")
    for layout in _layouts(data.shape[1:], boundary=boundary):
        sources = [HDF5Source([h5], "chunked", layout, shuffle=False), HDF5Source([h5], "contiguous", layout,
                   shuffle=False), ZarrSource([v2], None, layout, shuffle=False), ZarrSource([v3], None, layout,
                   shuffle=False)]
        for src in sources:
            got = _windows(src, 3)
            assert sorted(got) == [0, 1, 2]
            for sid, win in got.items():
                np.testing.assert_array_equal(win, take_window(data[sid], src.region),
                                              err_msg=f"{src.files[0]} rank {layout.mesh.coordinate}")


@pytest.mark.usefixtures("_plugin")
def test_npy_files_from_s3_and_anonymous_http_equal_numpy(s3_env, tmp_path):
    from dali_mesh import NumpySource
    from dali_mesh.partition import take_window

    rng = np.random.default_rng(5)
    arrays = [rng.integers(-1000, 1000, (40, 30)).astype(">i4") for _ in range(3)]
    s3 = client(s3_env)
    locations, public = [], []
    for i, a in enumerate(arrays):
        np.save(tmp_path / f"{i}.npy", a)
        locations.append(upload(s3_env, tmp_path / f"{i}.npy", "data", f"npy/{i}.npy"))
        s3.put_object(Bucket="data", Key=f"pub/{i}.npy", Body=(tmp_path / f"{i}.npy").read_bytes(), ACL="public-read")
        public.append(f"{s3_env}/data/pub/{i}.npy")  # an anonymous http:// URL of the object
    for layout in _layouts((40, 30), n=3, axis=1, halo=1, boundary="reflect"):
        for files in (locations, public):
            src = NumpySource(files, layout, shuffle=False)
            got = _windows(src, 3)
            for sid, win in got.items():
                np.testing.assert_array_equal(win, take_window(arrays[sid].astype("<i4"), src.region))


@pytest.mark.usefixtures("_plugin")
def test_the_differential_zarr_fuzz_holds_over_s3(s3_env, tmp_path):
    """The random stores of the local differential fuzz (every codec, v2 / v3 / sharded, chunks that
    follow no shard, every boundary rule and split), read from S3: every window equals zarr-python's."""
    from dali_mesh.partition import take_window
    from dali_mesh.source import ZarrSource
    from tests.pipeline.test_read_windows_differential import _layouts as random_layouts
    from tests.pipeline.test_read_windows_differential import _store as random_store

    rng = np.random.default_rng(31_2026)
    for k in range(8):
        path, full, what = random_store(tmp_path, rng, k)
        location = upload(s3_env, path, "data", f"fuzz/s{k}.zarr")
        layouts, layout_what = random_layouts(rng, full.shape[1:])
        for layout in layouts[:2]:
            src = ZarrSource([location], None, layout, batch_size=1, shuffle=False)
            for sid, win in _windows(src, full.shape[0]).items():
                np.testing.assert_array_equal(win, take_window(full[sid], src.region),
                                              err_msg=f"case {k}: {what}; {layout_what}")


# ---- credentials never leave memory ---------------------------------------------------------------------------
@pytest.mark.usefixtures("_plugin")
def test_no_credential_in_specs_plans_pickles_or_messages(s3_endpoint, tmp_path, monkeypatch):
    from dali_mesh import ZarrSource
    from dali_mesh.pipeline.native import plan_windows
    import zarr

    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(var, raising=False)
    z = zarr.create_array(tmp_path / "c.zarr", shape=(2, 8, 8), chunks=(1, 8, 8), dtype="f4")
    z[:] = 1
    location = upload(s3_endpoint, tmp_path / "c.zarr", "data", "cred/c.zarr")
    opts = options(s3_endpoint)
    store, key = store_of(location, opts)
    texts = [store.spec, repr(store), pickle.dumps(store)]
    src = ZarrSource([location], None, _layouts((8, 8))[0], shuffle=False, storage_options=opts)
    texts.append(pickle.dumps(src.fingerprint()))
    plans = plan_windows(src)
    texts += [p.write(str(tmp_path / "plans")) for p in plans]
    texts = [t if isinstance(t, bytes) else str(t).encode() for t in texts]
    texts += [open(t, "rb").read() for t in texts[-len(plans):]]
    bad, _ = store_of(location, options(s3_endpoint, secret="wrong-" + SECRET))
    client(s3_endpoint)  # the server accepts any signature; a wrong key id is refused only by a checking one
    with pytest.raises(MissingFileError) as info:
        store.open(key + "/nope")
    texts.append(str(info.value).encode())
    for text in texts:
        assert SECRET.encode() not in text
    assert SECRET not in repr(bad.__reduce__())


@pytest.mark.usefixtures("_plugin")
@pytest.mark.timeout(300)
def test_dataset_sources_read_from_s3_with_storage_options_equal_xarray(s3_endpoint, tmp_path, monkeypatch):
    """ZarrDatasetSource (v2 Blosc/Zstd, v3 sharded) and NetCDFDatasetSource (several files) from s3://,
    credentials given as storage_options only (none in the environment), forecasts and halos under
    every boundary rule, against xarray on the local copy."""
    pytest.importorskip("xarray")
    from numcodecs import Blosc, Zstd

    from dali_mesh import ForecastSpec, MeshInfo, NamedLayout, NetCDFDatasetSource, ZarrDatasetSource
    from dali_mesh.partition import take_window
    from dali_mesh.pipeline.plugin import plugin_read_ahead_counts
    from tests.pipeline.test_dataset import CHANNELS, H, W, _dataset, _oracle, _pipeline

    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    ds = _dataset(2)
    enc = {"2m_temperature": {"chunks": (1, H, W), "compressors": [Blosc("lz4", 5, Blosc.SHUFFLE)]},
           "geopotential": {"chunks": (1, 1, 6, W), "compressors": [Zstd(3)]}}
    ds.to_zarr(tmp_path / "era5.zarr", zarr_format=2, encoding=enc, mode="w", consolidated=False)
    files = []
    for i, (a, b) in enumerate([(0, 7), (7, 16)]):
        ds.isel(time=slice(a, b)).to_netcdf(tmp_path / f"era5_{i}.nc", engine="h5netcdf", encoding={
            "temperature": {"chunksizes": (2, 3, 4, 8)}})
        files.append(upload(s3_endpoint, tmp_path / f"era5_{i}.nc", "data", f"ds/era5_{i}.nc"))
    zarr_location = upload(s3_endpoint, tmp_path / "era5.zarr", "data", "ds/era5.zarr")
    opts = options(s3_endpoint)
    for mp, boundary in [(0, "reflect"), (2, "periodic"), (1, "constant")]:
        layout = NamedLayout(MeshInfo((3,), ("mp",), (mp,)), shard={"mp": "latitude"},
                             halo={"latitude": 2, "longitude": 1}, boundary={"latitude": boundary,
                                                                            "longitude": "periodic"})
        for src in (ZarrDatasetSource(zarr_location, CHANNELS, layout, batch_size=2, shuffle=False,
                                      forecast=ForecastSpec(1, 1), dtype="f8", storage_options=opts),
                    NetCDFDatasetSource(files, CHANNELS, layout, batch_size=2, shuffle=False,
                                        forecast=ForecastSpec(1, 1), dtype="f8", storage_options=opts)):
            p = _pipeline(src)
            used = plugin_read_ahead_counts()[0]
            for _ in range(2):
                inp, tgt, ids, _ = p.run()
                for j in range(2):
                    t = src.time_index(int(np.array(ids[j])))
                    want = np.stack([take_window(_oracle(ds, s, np.float64), src.region) for s in (t - 1, t)])
                    np.testing.assert_array_equal(np.array(inp[j]), want, err_msg=f"{src.store} rank {mp} step {t}")
                    np.testing.assert_array_equal(np.array(tgt[j])[0],
                                                  take_window(_oracle(ds, t + 1, np.float64), src.region))
            assert plugin_read_ahead_counts()[0] > used  # the 2nd batch (input and target) came read ahead


@pytest.mark.usefixtures("_plugin")
def test_plan_data_prints_what_each_rank_fetches_and_the_reader_fetches_it(s3_endpoint, tmp_path, monkeypatch, capsys):
    """``dali-mesh plan --data s3://...``: per rank the bytes and requests of one sample, with and without
    ``--share group``; the requests are the GETs the native reader then makes for that sample (counted by
    a proxy in front of the server), the bytes the stored bytes of the chunks the window touches."""
    import zarr

    from dali_mesh import Layout, MeshInfo, ZarrSource
    from dali_mesh.cli.main import main
    from tests.helpers import native_pipeline
    from tests.storage.fault_proxy import FaultProxy

    a = np.random.default_rng(2).normal(size=(2, 4, 60, 40)).astype("f4")
    z = zarr.create_array(tmp_path / "p.zarr", shape=a.shape, chunks=(1, 4, 20, 40), dtype="f4", zarr_format=3)
    z[:] = a
    location = upload(s3_endpoint, tmp_path / "p.zarr", "data", "plan/p.zarr")
    stored = {k: client(s3_endpoint).head_object(Bucket="data", Key=f"plan/p.zarr/c/0/0/{k}/0")["ContentLength"]
              for k in range(3)}
    with FaultProxy(s3_endpoint) as proxy:
        for var, value in (("AWS_ACCESS_KEY_ID", KEY), ("AWS_SECRET_ACCESS_KEY", SECRET),
                           ("AWS_ENDPOINT_URL", proxy.endpoint)):
            monkeypatch.setenv(var, value)
        assert main(["plan", "--data", location, "--mesh", "mp=2", "--shard", "mp=1", "--share", "group"]) == 0
        out = capsys.readouterr().out
        # rank 0's window (rows 0..29) touches chunks 0 and 1, rank 1's chunks 1 and 2
        from dali_mesh.cli.main import _fmt_bytes

        assert f"rank 0: {_fmt_bytes(stored[0] + stored[1])} in 2 requests; " \
               f"rank 1: {_fmt_bytes(stored[1] + stored[2])} in 2 requests" in out
        assert (f"one member of each group of 2 fetches the group window's {_fmt_bytes(sum(stored.values()))} in 3 "
                "requests per sample") in out
        layout = Layout(MeshInfo((2,), ("mp",), (1,)), shard={"mp": 1})
        p = native_pipeline(ZarrSource([location], None, layout, batch_size=1, shuffle=False, time_range=(0, 1)))
        before, heads = proxy.count("GET"), proxy.count("HEAD")
        p.run()
        assert proxy.count("GET") - before == 2 and proxy.count("HEAD") == heads  # what the plan said for rank 1


def _cli_env(endpoint):
    return dict(os.environ, AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET, AWS_ENDPOINT_URL=endpoint,
                PYTHONPATH=str(Path(__file__).parents[2]))


def test_convert_copies_an_s3_source_as_h5py_reads_it(s3_endpoint, tmp_path):
    import h5py
    import zarr

    a = np.random.default_rng(4).normal(size=(5, 2, 30, 24)).astype("f4")
    with h5py.File(tmp_path / "c.h5", "w") as f:
        f.create_dataset("fields", data=a, chunks=(1, 2, 10, 24), compression="gzip")
    location = upload(s3_endpoint, tmp_path / "c.h5", "data", "convert/c.h5")
    out = tmp_path / "out.zarr"
    r = subprocess.run([sys.executable, "-m", "dali_mesh.cli", "convert", location, str(out), "--mesh", "mp=2",
                        "--shard", "mp=1"], env=_cli_env(s3_endpoint), capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "every sample verified against the source" in r.stdout
    np.testing.assert_array_equal(zarr.open_array(str(out), path="fields" if (out / "fields").exists() else "data",
                                                  mode="r")[:], a)


@pytest.mark.timeout(300)
def test_demo_reads_an_s3_store_and_counts_the_bytes_fetched(s3_endpoint, tmp_path):
    import zarr
    from numcodecs import Blosc

    a = np.random.default_rng(6).normal(size=(8, 2, 256, 128)).astype("f4")
    z = zarr.create_array(tmp_path / "d.zarr", shape=a.shape, chunks=(1, 2, 64, 128), dtype="f4", zarr_format=2,
                          compressors=[Blosc("lz4", 5, Blosc.SHUFFLE)])
    z[:] = a
    location = upload(s3_endpoint, tmp_path / "d.zarr", "data", "demo/d.zarr")
    r = subprocess.run([sys.executable, "-m", "dali_mesh.cli", "demo", "--data", location, "--nproc", "2",
                        "--mesh", "mp=2", "--shard", "mp=1", "--timeout", "200"], env=_cli_env(s3_endpoint),
                       capture_output=True, text=True, timeout=280)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "body bytes each rank's native reader fetched from the object store" in r.stdout
    assert "all 8 samples verified" in r.stdout
    # each rank's band is 2 of the 4 chunks of a sample: about half of the stored bytes, never all of them
    stored = sum(p.stat().st_size for p in (tmp_path / "d.zarr").rglob("*") if p.is_file() and p.name[0] != ".")
    mib = [float(line.split()[-4]) for line in r.stdout.splitlines() if line.strip()[:1].isdigit() and "MiB" in line]
    assert len(mib) == 2 and all(0.3 * stored / 2**20 < m < 0.7 * stored / 2**20 for m in mib), (mib, stored)


@pytest.mark.usefixtures("_plugin")
def test_a_checkpoint_mid_epoch_resumes_the_same_batches_from_s3(s3_endpoint, tmp_path):
    """A native pipeline over S3 checkpointed after one batch, restored into a new pipeline (a new plan,
    new connections), gives the same batches as the first one, into the next epoch; the checkpoint
    holds no credential."""
    import zarr

    from dali_mesh import ZarrSource
    from dali_mesh.partition import take_window
    from dali_mesh.pipeline.plugin import plugin_read_ahead_counts
    from tests.helpers import native_pipeline

    a = np.random.default_rng(8).normal(size=(6, 2, 40, 24)).astype("f4")
    z = zarr.create_array(tmp_path / "k.zarr", shape=a.shape, chunks=(1, 2, 20, 24), dtype="f4")
    z[:] = a
    location = upload(s3_endpoint, tmp_path / "k.zarr", "data", "ckpt/k.zarr")
    layout = _layouts(a.shape[1:], n=2, axis=1, halo=3, boundary="periodic")[1]

    def batches(p):  # the rest of this epoch, and the first batch of the next
        out = []
        for epoch_end in (False, True):
            while True:
                try:
                    w, ids, _ = p.run()
                except StopIteration:
                    p.reset()
                    break
                out.append([(int(np.array(ids[i])), np.array(w[i])) for i in range(len(w))])
                if epoch_end:
                    return out
        return out

    src = ZarrSource([location], None, layout, batch_size=2, shuffle=True, seed=5,
                     storage_options=options(s3_endpoint))
    p = native_pipeline(src)
    p.run()
    ck = p.checkpoint()
    assert SECRET.encode() not in (ck if isinstance(ck, bytes) else str(ck).encode())
    rest = batches(p)  # the rest of epoch 0, and into epoch 1
    assert len(rest) == 3
    q = native_pipeline(ZarrSource([location], None, layout, batch_size=2, shuffle=True, seed=5,
                                   storage_options=options(s3_endpoint)), checkpoint=ck)
    used = plugin_read_ahead_counts()[0]
    again = batches(q)
    assert plugin_read_ahead_counts()[0] - used == 1  # the resumed epoch's 3rd batch came read ahead
    assert [[i for i, _ in b] for b in rest] == [[i for i, _ in b] for b in again]
    for b, c in zip(rest, again):
        for (sid, x), (_, y) in zip(b, c):
            np.testing.assert_array_equal(x, y)
            np.testing.assert_array_equal(x, take_window(a[sid], src.region))


def test_virtual_hosted_addressing_and_gcs_hmac_keys(s3_endpoint):
    """Virtual-hosted addressing (bucket.host: libcurl resolves *.localhost to loopback itself) and a
    gs:// location signed with HMAC keys (GCS's XML API, region "auto"), both against the test server."""
    client(s3_endpoint).put_object(Bucket="data", Key="v/a.bin", Body=b"0123456789")
    port = s3_endpoint.rsplit(":", 1)[1]
    virtual, key = store_of("s3://data/v/a.bin", options(f"http://localhost:{port}", addressing="virtual"))
    assert "addressing=virtual" in virtual.spec
    assert virtual.read_range(key, 2, 4) == b"2345"
    gs, key = store_of("gs://data/v/a.bin", options(s3_endpoint))
    assert "region=auto" in gs.spec and "anon=0" in gs.spec and gs.name_of(key) == "gs://data/v/a.bin"
    assert gs.read_range(key, 6, 10) == b"6789"


@pytest.mark.parametrize("location", ["s3://data/a.bin", "gs://data/a.bin", "https://host/a.bin?X-Amz-Signature=s"])
def test_without_libcurl_a_remote_location_is_refused_naming_the_fix(location, monkeypatch):
    """A build without libcurl reads no remote object (there is no other client): its locations are refused
    when they are resolved, naming the package and the rebuild; so is DALI_MESH_HTTP=python, which chose the
    Python client that is gone."""
    import dali_mesh.storage.remote as remote

    monkeypatch.setattr(remote, "have_native_http", lambda: False)
    with pytest.raises(DataFileError, match=r"has no libcurl or no libexpat .*install libcurl4-openssl-dev and "
                                            r"libexpat1-dev and rebuild \(make install\)") as info:
        store_of(location, {})
    assert "X-Amz" not in str(info.value)
    monkeypatch.undo()
    monkeypatch.setenv("DALI_MESH_HTTP", "python")
    with pytest.raises(DataFileError, match="DALI_MESH_HTTP=python is no longer taken.*unset DALI_MESH_HTTP"):
        store_of(location, {})
    monkeypatch.setenv("DALI_MESH_HTTP", "")
    assert store_of(location, {})[0].native


@pytest.mark.usefixtures("_plugin")
def test_blosc_chunks_read_in_parts_over_s3_equal_zarr_python(s3_endpoint, tmp_path, monkeypatch):
    """The fast path of whole-field Blosc chunks over the network: the header and block index, then the
    blocks of each level's band as ranged GETs sent together (HttpStore::GetMany). Every rank's window
    against zarr-python's read of the local copy, under two boundary rules, and the proxy's log shows
    the parts."""
    import zarr
    from numcodecs import Blosc

    from dali_mesh import ZarrSource
    from dali_mesh.partition import take_window
    from tests.helpers import native_batches
    from tests.storage.fault_proxy import FaultProxy

    a = np.round(np.random.default_rng(12).normal(size=(2, 4, 360, 720)), 1).astype("f4")  # compresses
    z = zarr.create_array(tmp_path / "p.zarr", shape=a.shape, chunks=(1, 4, 360, 720), dtype="f4", zarr_format=2,
                          compressors=[Blosc("lz4", 5, Blosc.SHUFFLE)])
    z[:] = a
    oracle = zarr.open_array(str(tmp_path / "p.zarr"), mode="r")[:]
    location = upload(s3_endpoint, tmp_path / "p.zarr", "data", "parts/p.zarr")
    stored = sum(client(s3_endpoint).head_object(Bucket="data", Key=f"parts/p.zarr/{t}.0.0.0")["ContentLength"]
                 for t in range(2))
    parts = {}  # GETs of chunk objects per (boundary, rank)
    with FaultProxy(s3_endpoint) as proxy:
        for boundary in ("reflect", "constant"):
            for layout in _layouts(a.shape[1:], n=4, axis=1, halo=3, boundary=boundary):
                src = ZarrSource([location], None, layout, shuffle=False,
                                 storage_options=options(proxy.endpoint))
                start = len(proxy.requests)
                got = dict(native_batches(src, 2))
                for sid, win in got.items():
                    np.testing.assert_array_equal(win, take_window(oracle[sid], src.region),
                                                  err_msg=f"{boundary} rank {layout.mesh.coordinate}")
                reads = [r for r in proxy.requests[start:] if r[0] == "GET" and "/p.zarr/" in r[1] and "." in
                         r[1].rsplit("/", 1)[1] and r[1][-1].isdigit() and r[2]]
                parts[(boundary, layout.mesh.coordinate)] = len(reads)
    assert stored > 2 * (256 << 10)  # large enough to be read in parts (fetch_plan.h kMinPartsBytes)
    # read whole, a chunk is two GETs (its first 4 KiB, then the rest); in parts, its header and index,
    # then the levels' bands together: under each boundary rule some rank's chunks went in parts (a
    # rank whose band's blocks hold streams reaching past what was read takes the whole chunk)
    for boundary in ("reflect", "constant"):
        assert max(n for (b, _), n in parts.items() if b == boundary) >= 2 * (1 + 3), parts



@pytest.mark.parametrize("location", ["s3://AKIDSECRETID:SECRETKEY0123@data/k.npy", "gs://AKIDSECRETID:SECRETKEY0123@b/k",
                                      "s3://SECRETKEY0123@data/k.npy", "https://AKIDSECRETID:SECRETKEY0123@host/k.npy"])
def test_user_info_in_a_location_is_refused_without_showing_it(location):
    """Issue 40, finding 16: ``s3://KEY:SECRET@bucket/key`` was taken as bucket ``KEY:SECRET@bucket`` and the
    secret showed in names and errors: refused, and the message shows neither part."""
    with pytest.raises(DataFileError) as info:
        store_of(location, {"anon": True} if not location.startswith("http") else {})
    text = str(info.value) + repr(info.value)
    assert "credentials in a" in text and "SECRETKEY0123" not in text and "AKIDSECRETID" not in text, text


@pytest.mark.parametrize("key", ["k/sub/../a.npy", "../other/a.npy", "a?b=1#c", "sp ace+plus/ü.npy"])
def test_s3_keys_are_opaque(key):
    """Issue 40, finding 7 (locations): a key holding ``?``, ``#``, ``..``, spaces, ``+`` or unicode is a key of
    its bucket as written (it was refused as "not a s3://BUCKET/KEY location")."""
    store, got = store_of(f"s3://data/{key}", {"anon": True, "endpoint_url": "http://127.0.0.1:9"})
    assert got == f"data/{key}" and store.name_of(got) == f"s3://data/{key}"


def test_a_specs_signer_is_salted_per_process():
    """Issue 40, finding 16: the signer was 64 bits of an unsalted SHA-256 of key and secret (a spec of
    minioadmin/minioadmin was found offline); now an HMAC under a random salt of the process: two processes
    name the same keys differently, and the plain hash is not it."""
    code = ("from dali_mesh.storage import store_of; print(store_of('s3://data/k', {'key': 'minioadmin', "
            "'secret': 'minioadmin', 'endpoint_url': 'http://127.0.0.1:9'})[0].spec)")
    specs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            cwd=Path(__file__).parents[2]).stdout.strip() for _ in range(2)}
    assert len(specs) == 2, specs
    plain = hashlib.sha256(b"minioadmin\0minioadmin\0").hexdigest()[:16]
    assert all("signer=" in s and plain not in s for s in specs), specs


@pytest.mark.parametrize("location", ["s3://AKIDSECRETID:SEC/RETKEY0123@data/k.npy",
                                      "s3://AKIDSECRETID:p@ssRETKEY0123@data/k.npy",
                                      "https://AKIDSECRETID:sec/RETKEY0123@host/x.npy"])
def test_user_info_with_a_slash_or_an_at_in_the_secret_is_not_shown(location):
    with pytest.raises(DataFileError) as info:
        store_of(location, {"anon": True} if location.startswith("s3") else {})
    text = str(info.value)
    assert "AKIDSECRETID" not in text and "RETKEY0123" not in text and "ssRET" not in text, text


@pytest.mark.parametrize("location", ["s3://data/a.npy\x00.evil", "s3://data/a\r\nX-Injected: 1",
                                      "https://host/a.npy\x00.evil"])
def test_a_location_with_a_control_character_is_refused(location):
    """A NUL would cut the key where C reads it (another object than the one named)."""
    with pytest.raises(DataFileError, match="control character"):
        store_of(location, {"anon": True} if location.startswith("s3") else {})


# ---- issue 52: an endpoint's user info and a region that is no region's name ----------------------------
@pytest.mark.parametrize("scheme", ["s3", "gs"])
@pytest.mark.parametrize("endpoint", ["http://AKIDSECRETID:RETKEY0123@127.0.0.1:9000",
                                      "http://AKIDSECRETID:sec/RETKEY0123@127.0.0.1:9000",
                                      "https://AKIDSECRETID:p@ssRETKEY0123@127.0.0.1/",
                                      "http://AKIDSECRETID@127.0.0.1:9000",
                                      "AKIDSECRETID:RETKEY0123@minio:9000"])  # no scheme: was shown as given
def test_an_endpoint_with_user_info_is_refused_without_showing_it(scheme, endpoint, monkeypatch):
    """The endpoint is in the store's spec, which plan files and every range-cache entry record: a password
    in it was kept there (and in the store's repr)."""
    for how in ("option", "environment"):
        options = {"anon": True}
        if how == "option":
            options["endpoint_url"] = endpoint
        elif scheme == "s3":
            monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        else:
            continue  # gs:// takes its endpoint from the options only
        with pytest.raises(ValueError, match="holds user info|port that is not a number") as info:
            store_of(f"{scheme}://data/k.npy", options)
        text = str(info.value)
        assert "AKIDSECRETID" not in text and "RETKEY0123" not in text and "ssRET" not in text, text


@pytest.mark.parametrize("endpoint", ["http://127.0.0.1:9000/?x=1", "http://127.0.0.1:9000#f", "ftp://127.0.0.1",
                                      "http://127.0.0.1:port", "http://", "http://127.0.0.1\r\nX: 1"])
def test_an_endpoint_that_is_no_http_url_is_refused(endpoint):
    with pytest.raises(ValueError, match="endpoint_url"):
        store_of("s3://data/k.npy", {"anon": True, "endpoint_url": endpoint})


@pytest.mark.parametrize("region", ["x@127.0.0.1/#", "us-east-1.evil.com/", "eu_west_1", "a b", "-us", "us-",
                                    "r" * 64, "us-east-1\n"])
def test_a_region_that_is_no_regions_name_is_refused(region, monkeypatch, tmp_path):
    """The region became part of the default endpoint's host (``https://s3.{region}.amazonaws.com``):
    ``x@127.0.0.1/#`` sent signed requests to 127.0.0.1. boto3 refuses such names; so does the store, from
    every place a region comes from."""
    for where in ("region", "client_kwargs", "AWS_REGION", "profile"):
        options = {"key": "AKIDEXAMPLE", "secret": "s"}
        if where == "region":
            options["region"] = region
        elif where == "client_kwargs":
            options["client_kwargs"] = {"region_name": region}
        elif where == "AWS_REGION":
            monkeypatch.setenv("AWS_REGION", region)
        else:
            monkeypatch.delenv("AWS_REGION", raising=False)
            monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
            (tmp_path / "config").write_text(f"[default]\nregion = {region}\n")
            monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
            if region != region.strip():
                continue  # configparser strips it: a good name
        with pytest.raises(ValueError, match="is not a region name"):
            store_of("s3://data/k.npy", options)
        monkeypatch.delenv("AWS_REGION", raising=False)


@pytest.mark.parametrize("region", ["us-east-1", "eu-central-1", "auto", "garage", "us-gov-west-1"])
def test_a_regions_name_is_taken(region):
    store, _ = store_of("s3://data/k.npy", {"anon": True, "region": region})
    assert f"endpoint=https://s3.{region}.amazonaws.com;region={region};" in store.spec
