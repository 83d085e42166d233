"""A store's spec is written once, in Python (dali_mesh/storage/byte_store.py write_spec), and read once,
in C++ (csrc/storage/http_spec.cc ParseHttpSpec): the settings C++ gives back (dali_mesh_store_settings,
what Python's HTTP client of builds without libcurl uses) are those the spec was written with; specs
that cannot be written or read are refused with the reason. No server is needed."""
from __future__ import annotations

import hashlib

import pytest

from dali_mesh.storage import store_of
from dali_mesh.storage.byte_store import write_spec
from dali_mesh.storage.memory import MemoryStore
from dali_mesh.storage.remote import store_settings

_DEFAULTS = {"region": "us-east-1", "path_style": True, "anonymous": False, "retries": 8, "retry_seconds": 60,
             "timeout": 300, "stall": 30, "connect": 10, "query_hash": "", "cache": "", "cache_bytes": 8 << 30}


@pytest.mark.parametrize("location, options, want", [
    ("s3://data/k", {"endpoint_url": "http://127.0.0.1:9000/", "key": "K", "secret": "S", "retries": 3,
                     "timeout": 2.5, "stall": 0.25, "connect": 1, "retry_seconds": 7},
     {"kind": "s3", "endpoint": "http://127.0.0.1:9000", "retries": 3, "timeout": 2.5, "stall": 0.25,
      "connect": 1, "retry_seconds": 7}),
    ("s3://data/k", {"anon": True, "client_kwargs": {"region_name": "eu-west-1"}},
     {"kind": "s3", "endpoint": "https://s3.eu-west-1.amazonaws.com", "region": "eu-west-1", "path_style": False,
      "anonymous": True}),
    ("gs://bucket/k", {"token": "anon", "cache_dir": "/tmp/dm cache \"q\"", "cache_bytes": 12345},
     {"kind": "s3", "endpoint": "https://storage.googleapis.com", "region": "auto", "anonymous": True,
      "cache": "/tmp/dm cache \"q\"", "cache_bytes": 12345}),
    ("https://example.org/d/a.npy?X-Amz-Signature=abc", {"retries": 0},
     {"kind": "http", "endpoint": "", "retries": 0,
      "query_hash": hashlib.sha256(b"X-Amz-Signature=abc").hexdigest()[:32]}),
])
def test_the_settings_cpp_reads_are_those_the_spec_was_written_with(location, options, want):
    store, _ = store_of(location, options)
    assert store_settings(store.spec) == {**_DEFAULTS, **want}


def test_write_spec_writes_settings_in_order_and_refuses_what_a_spec_cannot_hold():
    assert write_spec("s3", {"endpoint": "http://h:1", "anon": True, "retries": 2}) == \
        "s3;endpoint=http://h:1;anon=1;retries=2"
    assert MemoryStore("m-1").spec == "memory;name=m-1"
    for name, value in (("endpoint", "http://h;retries=0"), ("region", "eu\nwest"), ("a=b", "1")):
        with pytest.raises(ValueError, match="cannot be written into the store's spec"):
            write_spec("s3", {name: value})
    # a location's options that would break its spec are refused before any store is made
    with pytest.raises(ValueError, match="cannot be written into the store's spec"):
        store_of("s3://data/k", {"endpoint_url": "http://h:1/x;anon=1", "anon": True})


@pytest.mark.parametrize("spec, why", [
    ("s3;region=x", "an s3 store needs an endpoint"),
    ("s3;endpoint=ftp://h", "bad value for endpoint"),
    ("http;retries=101", "bad value for retries"),
    ("http;colour=blue", "unknown setting colour"),
    ("http;retries", "setting without a value"),
    ("memory;name=m", 'a store of kind "memory" has no settings to read (the kinds that have: http, s3)'),
])
def test_specs_cpp_refuses_are_errors_naming_the_spec_and_why(spec, why):
    with pytest.raises(ValueError) as info:
        store_settings(spec)
    assert f'byte store "{spec}"' in str(info.value) and why in str(info.value)
