"""Which files a reference set may name and which options reach them (issue 52, items 4, 6 and 8;
dali_mesh/storage/references/targets.py): the keys that read a set in ``s3://`` never sign its ``gs://`` files
(nor a set's GCS HMAC keys its ``s3://`` files), unless the source gives those files their own options; a set
read from an object store or an http(s) URL may not name loopback, link-local, private or reserved hosts, in
any spelling, unless ``allow_private_references`` says so, while a local set may; a set in ``s3://`` whose
files are all ``https://`` reads with the set's keys; a reference URL that is no string and options a file's
store cannot take are named as what they are.

Every server is moto's on 127.0.0.1 (tests/storage/s3_server.py); the refusals of other hosts happen when the
set is loaded, before any request (the addresses refused are literals, or ``localhost`` of /etc/hosts:
nothing is asked of a DNS server)."""
from __future__ import annotations

import json
import re
import time

import numpy as np
import pytest

from dali_mesh.storage import DataFileError, store_of
from tests.helpers import SEED, mesh_of
from tests.storage.s3_server import KEY, SECRET, client, options, s3_endpoint  # noqa: F401 - s3_endpoint: a fixture

pytest.importorskip("kerchunk")
pytest.importorskip("moto")

PREFIX = f"targets/{SEED}"


def _put(endpoint: str, key: str, data: bytes, public: bool = False) -> str:
    """``data`` as the object ``data/<key>`` of the test server (readable anonymously when ``public``)."""
    client(endpoint).put_object(Bucket="data", Key=key, Body=data, **({"ACL": "public-read"} if public else {}))
    return f"s3://data/{key}"


def _document(refs: dict) -> bytes:
    return json.dumps({"version": 1, "refs": {".zgroup": '{"zarr_format":2}', **refs}}).encode()


def _set_in_s3(endpoint: str, name: str, refs: dict, public: bool = False) -> str:
    """``reference://s3://data/...`` of a set of ``refs`` on the test server."""
    return "reference://" + _put(endpoint, f"{PREFIX}/{name}.json", _document(refs), public)


def _loaded(location: str, opts: dict):
    """The reference store of ``location`` read with ``opts``, its set loaded (its files' stores resolved, none
    of them asked anything)."""
    store, _ = store_of(location, opts)
    store._load()
    return store


def _target_stores(store) -> dict:
    return {url: store_of(loc)[0] for url, loc in store._targets.items()}


# ---- item 4: one service's keys never reach another service ----------------------------------------------
def test_aws_keys_that_read_a_set_in_s3_never_reach_its_gs_files(s3_endpoint):
    """Today's code gave the AWS keys and the S3 endpoint to the gs:// files (the only object store the set
    named): requests for Google's buckets signed with an AWS key."""
    location = _set_in_s3(s3_endpoint, "gs-only", {"a/0": ["gs://public-bucket/a.nc", 0, 10],
                                                   "b/0": ["gs://other-bucket/b.nc", 0, 10]})
    with pytest.raises(DataFileError, match=r"refers to files of gs:// \(gs://other-bucket, gs://public-bucket\): "
                                            r"the storage_options \['endpoint_url', 'key', 'secret'\] are s3://'s, "
                                            r"where the set is read from, and never sign .*reference_options=\{'gs'"):
        _loaded(location, options(s3_endpoint))
    # said so: read anonymously, at Google's endpoint (nothing is requested here)
    anonymous = {**options(s3_endpoint), "reference_options": {"gs": {"anon": True}}}
    for store in _target_stores(_loaded(location, anonymous)).values():
        assert store.anon and store._credentials is None
        assert "endpoint=https://storage.googleapis.com;" in store.spec and s3_endpoint not in store.spec
    # or with the files' own HMAC keys
    hmac = {**options(s3_endpoint), "reference_options": {"gs": {"key": "GOOG1EHMACKEY", "secret": "hmac-secret"}}}
    for store in _target_stores(_loaded(location, hmac)).values():
        assert store._credentials.key == "GOOG1EHMACKEY" and s3_endpoint not in store.spec


def test_gcs_hmac_keys_that_read_a_set_in_gs_never_reach_its_s3_files(s3_endpoint):
    """The set's gs:// endpoint is the test server (an S3 XML API, as GCS's): today's code signed the s3://
    files with the GCS HMAC keys, at the gs:// endpoint."""
    key = f"{PREFIX}/s3-only.json"
    _put(s3_endpoint, key, _document({"a/0": ["s3://bkt/a.nc", 0, 10]}))
    location = f"reference://gs://data/{key}"
    hmac = {"key": KEY, "secret": SECRET, "endpoint_url": s3_endpoint}
    with pytest.raises(DataFileError, match=r"refers to files of s3:// \(s3://bkt\): the storage_options "
                                            r"\['endpoint_url', 'key', 'secret'\] are gs://'s"):
        _loaded(location, hmac)
    (store,) = _target_stores(_loaded(location, {**hmac, "reference_options": {"s3": {"anon": True}}})).values()
    assert store.anon and store._credentials is None and s3_endpoint not in store.spec


def test_a_set_in_s3_with_only_https_files_reads_them_with_the_sets_keys(tmp_path, s3_endpoint):
    """The keys read the set; its http(s) files are read anonymously. Today's code gave the keys to the http(s)
    files, whose store refused them, and the source said the array was missing."""
    import h5py
    from kerchunk.hdf import SingleHdf5ToZarr

    from dali_mesh import Layout, ZarrSource
    from dali_mesh.partition import take_window

    x = np.random.default_rng(SEED).standard_normal((2, 8, 9)).astype("<f4")
    path = tmp_path / "h.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=x, chunks=(1, 4, 9), compression="gzip", shuffle=True)
    refs = SingleHdf5ToZarr(str(path), inline_threshold=0).translate()
    _put(s3_endpoint, f"{PREFIX}/h.h5", path.read_bytes(), public=True)
    url = f"{s3_endpoint}/data/{PREFIX}/h.h5"  # the object's anonymous http:// URL
    moved = {k: [url, *v[1:]] if isinstance(v, list) else v for k, v in refs["refs"].items()}
    location = "reference://" + _put(s3_endpoint, f"{PREFIX}/h.json", json.dumps({**refs, "refs": moved}).encode())
    layout = Layout(mesh_of((1, 2), (0, 1)), shard={"m0": 1}, halo={1: 2})
    with pytest.raises(DataFileError, match=r"h\.json: refers to http://127\.0\.0\.1:\d+/data/.*h\.h5, whose host "
                                            r"'127\.0\.0\.1' is 127\.0\.0\.1, a loopback address"):  # not "no array"
        ZarrSource([location], "x", layout, batch_size=1, shuffle=False,
                   storage_options=options(s3_endpoint)).read_sample(0)
    opts = {**options(s3_endpoint), "allow_private_references": True}  # the test server is on loopback
    src = ZarrSource([location], "x", layout, batch_size=1, shuffle=False, storage_options=opts)
    for t in range(2):
        np.testing.assert_array_equal(src.read_sample(t)[0], take_window(x[t], src.region))
    assert all(s._credentials is None for s in _target_stores(store_of(location, opts)[0]).values())


# ---- item 6: a set read from elsewhere names no private host ----------------------------------------------
#: hosts that are, or resolve to, addresses that are not public: loopback in every IPv4 spelling glibc and
#: libcurl take, IPv6 and IPv4 carried in IPv6 (mapped, compatible, NAT64, 6to4), a cloud's metadata,
#: private, shared, unspecified, multicast and broadcast
PRIVATE_HOSTS = ["127.0.0.1", "127.1", "2130706433", "0x7f.1", "0177.0.0.1", "0x7f000001", "localhost", "[::1]",
                 "[::ffff:127.0.0.1]", "[::127.0.0.1]", "169.254.169.254", "[::ffff:169.254.169.254]",
                 "[64:ff9b::a9fe:a9fe]", "[2002:a9fe:a9fe::]", "[fe80::1]", "[fd00:ec2::254]", "10.0.0.8",
                 "172.16.5.4", "192.168.1.1", "100.100.100.200", "0.0.0.0", "[::]", "224.0.0.251",
                 "255.255.255.255"]


@pytest.mark.parametrize("host", PRIVATE_HOSTS)
def test_a_set_in_s3_may_not_name_a_private_host(s3_endpoint, host):
    """Refused when the set is loaded, before any request; today's code resolved them all."""
    name = "host-" + re.sub(r"[^0-9a-z]", "_", host)
    location = _set_in_s3(s3_endpoint, name, {"a/0": ["s3://data/x.bin", 0, 4],
                                              "b/0": [f"http://{host}:8080/latest/meta-data/", 0, 10]})
    with pytest.raises(DataFileError, match=rf"refers to http://{re.escape(host)}:8080/latest/meta-data/, whose host "
                                            r".* is \S+, an? [a-z -]+ address: a reference set read from s3:// may "
                                            r"not name loopback, link-local, private or reserved hosts.*give "
                                            r"storage_options allow_private_references=True"):
        _loaded(location, options(s3_endpoint))


def test_a_named_host_is_judged_by_the_addresses_it_resolves_to(s3_endpoint, monkeypatch):
    """The system's resolver answers (here a stand-in: no DNS server is asked): a name of a public address is
    read, a name of a private one refused naming both, a name that does not resolve refused naming it."""
    import socket

    from dali_mesh.storage.references import targets

    answers = {"data.example.org": "93.184.215.14", "inside.example.org": "10.20.30.40", "nowhere.example.org": None}
    system = socket.getaddrinfo  # the test server's clients resolve 127.0.0.1 meanwhile

    def getaddrinfo(host, port, *args, **kw):
        if host not in answers:
            return system(host, port, *args, **kw)
        if answers[host] is None:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (answers[host], port or 443))]

    monkeypatch.setattr(targets.socket, "getaddrinfo", getaddrinfo)
    public = _set_in_s3(s3_endpoint, "public-host", {"a/0": ["https://data.example.org/a.nc", 0, 10]})
    assert set(_target_stores(_loaded(public, options(s3_endpoint)))) == {"https://data.example.org/a.nc"}
    inside = _set_in_s3(s3_endpoint, "inside-host", {"a/0": ["https://data.example.org/a.nc", 0, 10],
                                                     "b/0": ["https://inside.example.org/b.nc", 0, 10]})
    with pytest.raises(DataFileError, match=r"refers to https://inside\.example\.org/b\.nc, whose host "
                                            r"'inside\.example\.org' is 10\.20\.30\.40, a private address"):
        _loaded(inside, options(s3_endpoint))
    nowhere = _set_in_s3(s3_endpoint, "no-host", {"a/0": ["https://nowhere.example.org/a.nc", 0, 10]})
    with pytest.raises(DataFileError, match=r"refers to https://nowhere\.example\.org/a\.nc, whose host "
                                            r"'nowhere\.example\.org' cannot be resolved"):
        _loaded(nowhere, options(s3_endpoint))


def test_a_set_in_s3_naming_a_loopback_url_is_read_only_when_allowed(s3_endpoint):
    """Today's code read the loopback service's bytes as the key's."""
    secret = b"what only this machine may read"
    _put(s3_endpoint, f"{PREFIX}/secret.bin", secret, public=True)
    url = f"{s3_endpoint}/data/{PREFIX}/secret.bin"
    location = _set_in_s3(s3_endpoint, "loopback", {"a/0": [url, 0, len(secret)], "b/0": ["s3://data/x.bin", 0, 4]})
    store, _ = store_of(location, options(s3_endpoint))
    with pytest.raises(DataFileError, match=r"whose host '127\.0\.0\.1' is 127\.0\.0\.1, a loopback address"):
        with store.open("a/0") as obj:
            obj.readv([bytearray(len(secret))], 0)
    store, _ = store_of(location, {**options(s3_endpoint), "allow_private_references": True})
    with store.open("a/0") as obj:
        buf = bytearray(len(secret))
        assert obj.readv([buf], 0) == len(secret) and bytes(buf) == secret


def test_a_set_read_from_an_http_url_may_not_name_a_loopback_host_unless_allowed(s3_endpoint):
    """The set's own host is the user's choice; the hosts it names are its author's."""
    secret = b"an internal service's answer"
    _put(s3_endpoint, f"{PREFIX}/internal.bin", secret, public=True)
    spelled = f"http://0x7f.1:{s3_endpoint.rsplit(':', 1)[1]}/data/{PREFIX}/internal.bin"
    _set_in_s3(s3_endpoint, "over-http", {"a/0": [spelled, 0, len(secret)]}, public=True)
    location = f"reference://{s3_endpoint}/data/{PREFIX}/over-http.json"
    with pytest.raises(DataFileError, match=r"whose host '0x7f\.1' is 127\.0\.0\.1, a loopback address: a reference "
                                            r"set read from http:// may not name"):
        _loaded(location, {})
    assert set(_target_stores(_loaded(location, {"allow_private_references": True}))) == {spelled}


def test_a_local_set_may_name_loopback_urls(tmp_path, s3_endpoint):
    """The user's own file: unchanged."""
    secret = b"the user's own service"
    _put(s3_endpoint, f"{PREFIX}/own.bin", secret, public=True)
    refs = tmp_path / "local.json"
    refs.write_bytes(_document({"a/0": [f"{s3_endpoint}/data/{PREFIX}/own.bin", 0, len(secret)]}))
    store, _ = store_of(f"reference://{refs}")
    with store.open("a/0") as obj:
        buf = bytearray(len(secret))
        assert obj.readv([buf], 0) == len(secret) and bytes(buf) == secret


def test_the_sets_own_options_are_checked_and_reach_no_store(tmp_path):
    refs = tmp_path / "gs.json"
    refs.write_bytes(_document({"a/0": ["gs://public-bucket/a.nc", 0, 10]}))
    location = f"reference://{refs}"
    for bad, said in (({"allow_private_references": "yes"}, r"allow_private_references must be True or False"),
                      ({"reference_options": {"gs": "anon"}}, r"reference_options must map a scheme"),
                      ({"reference_options": {"file": {}}}, r"'file' is no scheme of files read with options"),
                      ({"reference_options": {"http": {}, "https": {}}}, r"names the http files twice")):
        with pytest.raises(ValueError, match=said):
            store_of(location, bad)
    given = {"allow_private_references": True, "reference_options": {"gs": {"anon": True, "timeout": 9}}}
    (store,) = _target_stores(_loaded(location, given)).values()
    assert store.anon and "timeout=9" in store.spec


# ---- item 8: errors name the real cause -----------------------------------------------------------------
@pytest.mark.parametrize("url", [123, 1.5, True, ["s3://data/x.bin"], {"url": "s3://data/x.bin"}])
def test_a_reference_whose_url_is_no_string_is_refused_naming_the_key(tmp_path, url):
    """Today's code raised TypeError (sorting URLs of two types, or fspath of a number)."""
    data = tmp_path / "data.bin"
    data.write_bytes(bytes(range(64)))
    refs = tmp_path / "bad.json"
    refs.write_bytes(_document({"a/0": [url, 0, 4], "b/0": [str(data), 0, 4]}))
    store, _ = store_of(f"reference://{refs}")
    for look in (store.stat, store.locate, store.open):
        with pytest.raises(DataFileError, match=r"bad\.json#a/0: refers to .*, which is no URL or path \(of type "
                                                r"\w+\); the reference set is corrupt"):
            look("b/0")  # the set as a whole: its load refuses it


def test_options_a_referenced_files_store_refuses_are_named_not_taken_for_a_missing_array(tmp_path, s3_endpoint):
    """A local set of https:// files given S3 keys: the http(s) store does not take keys. Today's source said
    the array was missing."""
    from dali_mesh import Layout, ZarrSource

    _put(s3_endpoint, f"{PREFIX}/raw.bin", bytes(16), public=True)
    refs = tmp_path / "local-http.json"
    refs.write_bytes(_document({"x/.zarray": json.dumps({"zarr_format": 2, "shape": [2, 2], "chunks": [2, 2],
                                                         "dtype": "<f4", "compressor": None, "filters": None,
                                                         "fill_value": 0, "order": "C"}),
                                "x/0.0": [f"{s3_endpoint}/data/{PREFIX}/raw.bin", 0, 16]}))
    layout = Layout(mesh_of((1, 2), (0, 1)), shard={"m0": 0})
    with pytest.raises(DataFileError, match=r"local-http\.json: its http:// files \(such as http://127\.0\.0\.1:\d+"
                                            r"/data/.*raw\.bin\) cannot be read with the options they get \("
                                            r"storage_options for http\(s\):// locations do not take"):
        ZarrSource([f"reference://{refs}"], "x", layout, batch_size=1, shuffle=False,
                   storage_options=options(s3_endpoint)).read_sample(0)


# ---- the review of issue 52 ----------------------------------------------------------------------------------
def test_a_set_in_s3_may_not_name_objects_this_process_holds_in_memory(s3_endpoint):
    """A set read from an object store named memory:// objects of this process (as it may not name local files)."""
    from dali_mesh.storage.memory import MemoryStore

    MemoryStore("held-secret").put("secret.bin", b"what only this process holds")
    location = _set_in_s3(s3_endpoint, "memory", {"a/0": ["memory://held-secret/secret.bin", 0, 8]})
    with pytest.raises(DataFileError, match=r"refers to memory://held-secret/secret\.bin: a reference set read from "
                                            r"s3:// may not name objects this process holds in memory"):
        _loaded(location, options(s3_endpoint))


def test_the_host_look_ups_of_a_set_are_bounded_together(s3_endpoint, monkeypatch):
    """A set naming many hosts whose resolvers never answer held the source's construction for the sum of their
    look-ups (one after another): now they run 16 at a time, bounded together."""
    import socket
    import threading

    from dali_mesh.storage.references import targets

    system, release = socket.getaddrinfo, threading.Event()

    def getaddrinfo(host, port, *args, **kw):
        if host.endswith(".stalls.example.org"):
            release.wait(30)  # a resolver that does not answer
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return system(host, port, *args, **kw)

    monkeypatch.setattr(targets.socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(targets, "LOOKUP_S", 1.0)
    refs = {f"a/{i}": [f"https://h{i}.stalls.example.org/a.nc", 0, 10] for i in range(40)}
    location = _set_in_s3(s3_endpoint, "stalls", refs)
    try:
        t0 = time.monotonic()
        with pytest.raises(DataFileError, match=r"whose host 'h\d+\.stalls\.example\.org' cannot be resolved \(no "
                                                r"answer within 1 s\)"):
            _loaded(location, options(s3_endpoint))
        assert time.monotonic() - t0 < 10  # one bound for the 40 hosts, not 40 look-ups one after another
    finally:
        release.set()


@pytest.mark.parametrize("host,kind", [("0.0.0.0", "an unspecified"), ("169.254.169.254", "a link-local"),
                                       ("224.0.0.1", "a multicast")])
def test_the_kind_of_address_reads_as_english(s3_endpoint, host, kind):
    location = _set_in_s3(s3_endpoint, f"kind-{host}", {"a/0": [f"http://{host}/a.nc", 0, 10]})
    with pytest.raises(DataFileError, match=rf"is {re.escape(host)}, {kind} address"):
        _loaded(location, options(s3_endpoint))
