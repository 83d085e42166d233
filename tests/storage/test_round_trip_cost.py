"""What a request to a store costs (``ByteStore.round_trip``), which the policies outside dali_mesh/storage/ ask
instead of whether a location "is local": a store of this machine's files costs no round trip, another its
latency as the native reader measured it (csrc/storage/byte_store.h RoundTripMeter), or 20 ms before any."""
from __future__ import annotations

import numpy as np
import pytest

from dali_mesh.storage import LOCAL, store_of

KIB, MIB = 1 << 10, 1 << 20


def test_local_files_cost_no_round_trip(tmp_path):
    path = tmp_path / "x.bin"
    path.write_bytes(b"x" * 10)
    store, key = store_of(str(path))
    assert store is LOCAL and store.round_trip == (0.0, 0.0)
    assert store_of(f"file://{path}")[0].round_trip == (0.0, 0.0)


def test_a_store_of_objects_elsewhere_costs_a_round_trip_before_it_measured_any():
    """The memory store stands for an object store in the tests; so does an S3 location nothing was read
    from: a request costs the default latency, bandwidth not known."""
    from dali_mesh.storage.memory import MemoryStore

    assert MemoryStore("round-trip-cost").round_trip == (0.02, 0.0)
    store, _ = store_of("s3://round-trip-cost/x.bin", {"endpoint_url": "http://127.0.0.1:9", "anon": True})
    assert store.round_trip[0] > 0


def test_a_remote_store_costs_what_its_own_requests_measured(tmp_path):
    """The benchmarks' parallel S3 server sleeps 50 ms before each answer's first byte: after a few reads the
    store's round trip is the native reader's measure (at least 50 ms, a rate), as the fetch plan weighs it."""
    from dali_mesh._kernels import store_round_trip
    from dali_mesh.storage.remote import have_native_http
    from tests.storage.request_log import LoggingS3Server
    from tests.storage.s3_server import options

    if not have_native_http():
        pytest.skip("this build has no libcurl")
    (tmp_path / "bench").mkdir()
    data = np.random.default_rng(0).integers(0, 256, 4 * MIB, np.uint8).tobytes()
    (tmp_path / "bench" / "obj.bin").write_bytes(data)
    with LoggingS3Server(root=str(tmp_path), latency=0.05) as server:
        store, _ = store_of("s3://bench/obj.bin", options(server.endpoint))
        assert store.round_trip == (0.02, 0.0)  # nothing measured yet: the default
        for k in range(3):
            assert store.read_range("bench/obj.bin", k * KIB, 300) == data[k * KIB:k * KIB + 300]
        assert store.read_range("bench/obj.bin", 0, MIB) == data[:MIB]
        latency, rate = store.round_trip
        assert (latency, rate) == store_round_trip(store.spec)
    assert 0.05 <= latency < 5 and rate > 0
