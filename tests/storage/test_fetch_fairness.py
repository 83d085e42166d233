"""Issue 40, finding 14 ("unfair stall"), the requests one read sends together: a read of a Blosc
chunk in parts sends its blocks' ranges at once (``HttpStore::GetMany``), the extra ones through the
process's 32 fetch threads. With those threads all held by other pipelines' requests stuck on a server
that never answers, and more such requests queued behind them, a healthy read of another server still
completes within seconds: it takes back its own requests that no fetch thread has started and sends
them itself, never waiting on work that has not started."""
from __future__ import annotations

import time

import numpy as np
import pytest

from dali_mesh.storage.remote import have_native_http
from tests.helpers import ReadBeside
from tests.storage.fault_proxy import Fault, FaultProxy
from tests.storage.s3_server import options, s3_endpoint, upload  # noqa: F401

pytestmark = [pytest.mark.skipif(not have_native_http(), reason="this build has no libcurl"),
              pytest.mark.timeout(120)]

FETCH_THREADS = 32  # KeptThreads::Fetch()'s bound


class _PartsHang(FaultProxy):
    """A proxy whose GETs of a range that does not start at byte 0 never get an answer (until the
    proxy stops): a chunk's header and block index come back, the blocks' parts hang."""

    def _take(self, method, path, range_header):
        with self._lock:
            hang = method == "GET" and range_header is not None and not range_header.startswith("bytes=0-")
            self.requests.append((method, path, range_header, "hang" if hang else None))
            return Fault("hang") if hang else None


def test_a_read_in_parts_never_waits_behind_other_pipelines_stuck_requests(s3_endpoint, tmp_path):
    import zarr
    from numcodecs import Blosc

    from dali_mesh import Layout, MeshInfo, ZarrSource, _kernels
    from dali_mesh.partition import take_window
    from dali_mesh.pipeline import native

    # one whole-field chunk of 8 levels of 256 KiB in 16 KiB Blosc blocks; rank 0 of 4 along the rows
    # needs a band of each level, the bands far enough apart to be sent as 8 ranges together
    a = np.round(np.random.default_rng(14).normal(size=(1, 8, 64, 1024)), 1).astype("f4")
    z = zarr.create_array(tmp_path / "f.zarr", shape=a.shape, chunks=a.shape, dtype="f4", zarr_format=2,
                          compressors=[Blosc("lz4", 5, Blosc.SHUFFLE, blocksize=16384)])
    z[:] = a
    oracle = zarr.open_array(str(tmp_path / "f.zarr"), mode="r")[:]
    location = upload(s3_endpoint, tmp_path / "f.zarr", "data", "fair/f.zarr")
    layout = Layout(MeshInfo((1, 4), ("dp", "mp"), (0, 0)), shard={"mp": 1}, halo={1: 2}, boundary="reflect")
    n_stuck = 10
    with _PartsHang(s3_endpoint) as dead:
        stuck_src = ZarrSource([location], None, layout, shuffle=False,
                               storage_options=options(dead.endpoint, retries=0, stall=60, timeout=60))
        stuck_path = native.plan_windows(stuck_src)[0].write(str(tmp_path / "stuck"))
        healthy_src = ZarrSource([location], None, layout, shuffle=False,
                                 storage_options=options(s3_endpoint, retries=0, stall=10, timeout=10))
        healthy_path = native.plan_windows(healthy_src)[0].write(str(tmp_path / "healthy"))
        dead.reset_counts()
        stuck = [_kernels.PlanReader(stuck_path, "f4") for _ in range(n_stuck)]
        try:
            for r in stuck:  # each one's read of the chunk's parts: 1 range on its thread, 7 handed on
                assert r.read_ahead([0])
            hanging = lambda: sum(1 for m, _, _, kind in dead.requests if kind == "hang")  # noqa: E731
            deadline = time.monotonic() + 10
            while hanging() < FETCH_THREADS + n_stuck and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(0.3)  # more would come now, were a fetch thread free
            # every fetch thread holds a stuck request, and the others wait in its queue
            assert hanging() == FETCH_THREADS + n_stuck, hanging()

            def read_healthy(r, got):
                (w,), = r.read([0])
                got.append((w, time.monotonic()))

            healthy = ReadBeside(healthy_path, read_healthy)
            healthy.join(5)
            # the stuck requests still hang: none answered, none more sent
            assert hanging() == FETCH_THREADS + n_stuck == len(dead.requests) - n_stuck  # + the headers
        finally:
            for r in stuck:  # their reads are cancelled: the fetch threads come back
                r.close()
        healthy.join(30)
    assert not healthy.errors, healthy.errors
    assert healthy.got, "the healthy read never ended"
    w, ended = healthy.got[0]
    np.testing.assert_array_equal(w, take_window(oracle[0], healthy_src.region))
    # not after the stuck readers were closed (5 s on): it waited behind no other pipeline's request
    assert ended - healthy.t0 < 5, f"the healthy read took {ended - healthy.t0:.1f} s: it waited for the stuck requests"
