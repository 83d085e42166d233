"""What an epoch of the native reader fetches, counted without reading (csrc/reader/fetch_epoch.h, through
``dali_mesh._kernels.fetch_api.epoch_fetches``), against the requests and body bytes a real epoch of
``_kernels.PlanReader`` sends to a moto S3 server on 127.0.0.1 (the kernels library's fetch counters), per
batch: shuffled sample ids, batch sizes that leave a shorter last batch, Zarr v2 Zstd chunks, v3 shards
whose inner chunks are fetched together, and .npy samples read as raw byte ranges."""
from __future__ import annotations

import numpy as np
import pytest

from dali_mesh import Layout, MeshInfo, NumpySource, ZarrSource, _kernels
from dali_mesh._kernels import KernelsError
from dali_mesh._kernels.fetch_api import epoch_batches, epoch_fetches
from dali_mesh.pipeline.native import plan_source
from dali_mesh.storage.remote import fetch_counters, have_native_http
from tests.storage.s3_server import s3_endpoint, s3_env, upload  # noqa: F401

pytestmark = pytest.mark.skipif(not have_native_http(), reason="this build has no libcurl")


def _layout(rank: int) -> Layout:
    return Layout(MeshInfo((2,), ("mp",)).with_rank(rank), shard={"mp": 1}, halo={1: 2})


@pytest.fixture(scope="module")
def stores(s3_endpoint, tmp_path_factory):  # noqa: F811
    import zarr
    from numcodecs import Zstd

    tmp = tmp_path_factory.mktemp("epoch")
    a = np.round(np.random.default_rng(3).normal(size=(7, 30, 20)), 2).astype("f4")
    made = {
        "v2-zstd": dict(chunks=(1, 10, 20), zarr_format=2, compressors=[Zstd(3)]),
        "v3-sharded": dict(chunks=(1, 5, 20), shards=(2, 30, 20), zarr_format=3,
                           compressors=[zarr.codecs.ZstdCodec(level=3)]),
    }
    out = {}
    for name, kw in made.items():
        z = zarr.create_array(tmp / f"{name}.zarr", shape=a.shape, dtype="f4", **kw)
        z[:] = a
        out[name] = upload(s3_endpoint, tmp / f"{name}.zarr", "data", f"epoch/{name}.zarr")
    folder = tmp / "npy"
    folder.mkdir()
    for i in range(3):
        np.save(folder / f"{i}.npy", np.random.default_rng(i).normal(size=(300, 64)).astype("f4"))
    out["npy"] = upload(s3_endpoint, folder, "data", "epoch/npy")
    return out


def _source(stores, name, rank):
    if name == "npy":
        return NumpySource([f"{stores['npy']}/{i}.npy" for i in range(3)], _layout(rank), shuffle=False)
    return ZarrSource([stores[name]], None, _layout(rank), shuffle=False)


@pytest.mark.parametrize("name", ["v2-zstd", "v3-sharded", "npy"])
@pytest.mark.parametrize("batch_size", [1, 2, 3])
@pytest.mark.usefixtures("s3_env")
def test_each_batch_counted_is_what_the_reader_fetches(stores, name, batch_size):
    for rank in (0, 1):
        plans = plan_source(_source(stores, name, rank).group_reader())
        path = plans.write()
        ids = np.random.default_rng(batch_size + rank).permutation(plans.num_items)
        counted = epoch_batches(path, ids, batch_size)
        assert counted.shape == (-(-len(ids) // batch_size), 4)
        with _kernels.PlanReader(path, plans.dtype) as r:
            for b, i in enumerate(range(0, len(ids), batch_size)):
                before = fetch_counters()
                r.read(ids[i:i + batch_size])
                after = fetch_counters()
                assert tuple(counted[b, :2]) == (after[0] - before[0], after[1] - before[1]), (name, rank, b)
        assert (counted[:, 3] == 0).all()  # nothing read in parts: no estimate
        total = epoch_fetches(path, ids, batch_size)
        assert (total.requests, total.bytes, total.batches) == (counted[:, 0].sum(), counted[:, 1].sum(), len(counted))


@pytest.mark.usefixtures("s3_env")
def test_bad_ids_and_batch_sizes_are_refused_naming_them(stores):
    path = plan_source(_source(stores, "v2-zstd", 0).group_reader()).write()
    with pytest.raises(KernelsError, match="sample id 7 is out of range for the 7 samples"):
        epoch_fetches(path, [0, 7])
    with pytest.raises(ValueError, match="batch_size must be at least 1"):
        epoch_fetches(path, [0], 0)
    with pytest.raises(KernelsError, match="latency_s and bytes_per_s must be >= 0"):
        epoch_fetches(path, [0], costs=[(-1.0, 0.0)])
    assert epoch_fetches(path, []) == (0, 0, 0, 0, 0, 0)
