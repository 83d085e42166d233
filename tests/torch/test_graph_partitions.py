"""Graph partitions from PhysicsNeMo's own functions (issue 55): on a mesh of 102,400 nodes numbered in
no spatial order, partitioned by ``partition_graph_by_coordinate_bbox`` over 2, 4 and 8 ranks, every
rank's ``src`` rows read natively from ``.npy``, HDF5 and Zarr (Blosc whole-grid, sharded Zstd), local,
and Zarr Blosc from S3 (moto), equal numpy's ``x[t][ids]``; on gloo ranks, ``local_src`` read from storage equals
``get_src_node_features_in_local_graph(get_src_node_features_in_partition(x))`` of a real
``DistributedGraph``, and ``dst`` and ``edges`` its other getters."""
from __future__ import annotations

import functools

import numpy as np
import pytest

from dali_mesh import Layout, ZarrSource
from dali_mesh.cli.launch import run_ranks
from dali_mesh.physicsnemo.graph import partition_rows
from dali_mesh.partition import LayoutError, Rows
from tests.graph_mesh import bbox_partition, build_mesh, distributed_graph
from tests.helpers import mesh_of, native_pipeline, row_stores
from tests.storage.s3_server import options, s3_endpoint, upload  # noqa: F401 - s3_endpoint: a fixture

torch = pytest.importorskip("torch")
pytest.importorskip("physicsnemo.distributed", reason="PhysicsNeMo is not installed (make test installs it)")
zarr = pytest.importorskip("zarr")
h5py = pytest.importorskip("h5py")
numcodecs = pytest.importorskip("numcodecs")

pytestmark = pytest.mark.slow
NX = NY = 320  # 102,400 nodes
STEPS, F = 2, 4


@pytest.fixture(scope="module")
def mesh():
    return build_mesh(NX, NY, seed=5)


@pytest.fixture(scope="module")
def stores(mesh, tmp_path_factory):
    from dali_mesh.pipeline.plugin import load_plugin

    load_plugin()
    n = len(mesh[0])
    x = np.random.default_rng(1).standard_normal((STEPS, n, F), dtype=np.float32)
    makers, blosc = row_stores(str(tmp_path_factory.mktemp("graph")), x, blocksize=1 << 16, inner=8192,
                               shard=(1, 8192 * 4), h5_chunk=16384)
    kinds = ("npy", "zarr_blosc", "zarr_sharded_zstd", "hdf5_chunked")
    return x, blosc, {k: functools.partial(makers[k], batch_size=STEPS, shuffle=False) for k in kinds}


def _read(src) -> dict[int, np.ndarray]:
    w, ids, _ = native_pipeline(src).run()
    return {int(np.array(ids[i])): np.array(w[i]) for i in range(len(w))}


def _read_all(sources: dict) -> dict[str, dict[int, np.ndarray]]:
    """``{name: {sample id: window}}`` of one batch of every source, read by one pipeline (a DALI
    pipeline's build costs more than these reads: one per rank, not one per format)."""
    from nvidia.dali import pipeline_def

    from dali_mesh.pipeline import native

    names = list(sources)

    @pipeline_def(batch_size=STEPS, num_threads=2, device_id=None, prefetch_queue_depth=1)
    def pipe():
        outs = []
        for n in names:
            w, ids, _ = native.read_windows(sources[n], fallback=False)
            outs += [w, ids]
        return tuple(outs)

    p = pipe()
    p.build()
    out = p.run()
    return {n: {int(np.array(out[2 * k + 1][i])): np.array(out[2 * k][i]) for i in range(STEPS)}
            for k, n in enumerate(names)}


_PARTITIONS: dict = {}


def _partition(mesh, p, r):
    """PhysicsNeMo's bbox partition of rank ``r`` of ``p`` (each call takes ~5 s: made once per process)."""
    if (p, r) not in _PARTITIONS:
        _PARTITIONS[(p, r)] = bbox_partition(*mesh, p, r, (NX, NY))
    return _PARTITIONS[(p, r)]


@pytest.fixture(scope="module")
def s3_blosc(stores, s3_endpoint):
    """The Blosc whole-grid store uploaded to moto (on 127.0.0.1)."""
    return upload(s3_endpoint, stores[1], "data", "graph/blosc.zarr"), options(s3_endpoint)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("p", [2, 4, 8])
def test_every_ranks_partition_rows_equal_numpy_on_every_format(mesh, stores, s3_blosc, p):
    coords, offsets, indices = mesh
    x, _, make = stores
    location, storage_options = s3_blosc
    make = {**make, "s3_zarr_blosc": lambda lay, rows: ZarrSource([location], None, lay, rows=rows, batch_size=STEPS,
                                                                  shuffle=False, storage_options=storage_options)}
    covered = np.zeros(len(coords), int)
    for r in range(p):
        part = _partition(mesh, p, r)
        rows = partition_rows(part, "src", axis=0)
        ids = part.map_partitioned_src_ids_to_global.numpy()
        assert rows.ids.tolist() == ids.tolist()
        assert rows.runs() > len(ids) // 4  # ids in no spatial order: mostly runs of one
        covered[ids] += 1
        lay = Layout(mesh_of((p,), (r,)), batch=())
        got = _read_all({kind: mk(lay, rows) for kind, mk in make.items()})
        assert sorted(got) == sorted(make)
        for kind, windows in got.items():
            assert sorted(windows) == list(range(STEPS))
            for t, w in windows.items():
                np.testing.assert_array_equal(w, x[t][ids], err_msg=f"{kind}, rank {r} of {p}, step {t}")
    assert (covered == 1).all()  # the partitions tile the nodes


def test_partition_rows_refuse_what_they_cannot_read(mesh):
    coords, offsets, indices = mesh
    part = _partition(mesh, 2, 0)
    with pytest.raises(LayoutError, match="nodes must be one of 'src', 'dst', 'edges', 'local_src'"):
        partition_rows(part, "halo")
    with pytest.raises(LayoutError, match="needs indices="):
        partition_rows(part, "local_src")
    with pytest.raises(LayoutError, match="names edge .* but indices has 10 edges"):
        partition_rows(part, "local_src", indices=indices[:10])
    with pytest.raises(LayoutError, match="only for nodes='local_src'"):
        partition_rows(part, "src", indices=indices)
    with pytest.raises(TypeError, match="GraphPartition or a DistributedGraph"):
        partition_rows(object())


def _local_graph_rank(rank, world_size, nx, ny, store, features_shape):
    """A real DistributedGraph on gloo ranks: the rows read from storage equal its getters' tensors."""
    import torch.distributed as dist
    from physicsnemo.distributed import DistributedManager

    from tests.torch.test_physicsnemo_real import _manager

    _manager(rank, world_size)
    _gloo_uneven_all_to_all()
    coords, offsets, indices = build_mesh(nx, ny, seed=7)
    part = bbox_partition(coords, offsets, indices, world_size, rank, (nx, ny))
    graph = distributed_graph().DistributedGraph(None, None, world_size, graph_partition=part)
    full = zarr.open_array(store, mode="r")[:]
    lay = Layout(mesh_of((world_size,), (rank,)), batch=())
    for nodes, kw in (("src", {}), ("dst", {}), ("local_src", {"indices": indices})):
        src = ZarrSource([store], None, lay, rows=partition_rows(graph, nodes, **kw), batch_size=STEPS, shuffle=False)
        for t, w in _read(src).items():
            x = torch.from_numpy(full[t])
            if nodes == "local_src":
                want = graph.get_src_node_features_in_local_graph(graph.get_src_node_features_in_partition(x))
            elif nodes == "src":
                want = graph.get_src_node_features_in_partition(x)
            else:
                want = graph.get_dst_node_features_in_partition(x)
            assert torch.equal(torch.from_numpy(w), want), (nodes, rank, t)
    edges = partition_rows(graph, "edges")
    e = torch.arange(len(indices), dtype=torch.float32)[:, None] * torch.tensor([1.0, -1.0])
    assert torch.equal(e[torch.from_numpy(edges.ids)], graph.get_edge_features_in_partition(e))
    dist.barrier()
    del DistributedManager


def _gloo_uneven_all_to_all():
    """gloo's list-form ``all_to_all`` refuses tensors of unequal sizes ("ProcessGroupGloo::alltoall:
    invalid tensor size"), and PhysicsNeMo's ``indexed_all_to_all_v`` sends unequal ones (NCCL takes
    them): the same exchange (``out[i]`` from rank ``i``'s ``in[this rank]``) through
    ``all_to_all_single`` with split sizes, which gloo supports. torch's collective only; PhysicsNeMo's
    functions run as they are."""
    import torch.distributed as dist

    def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op=False):
        assert not async_op
        send = torch.cat([t.reshape(-1) for t in input_tensor_list])
        recv = torch.empty(sum(t.numel() for t in output_tensor_list), dtype=output_tensor_list[0].dtype)
        dist.all_to_all_single(recv, send, [t.numel() for t in output_tensor_list],
                               [t.numel() for t in input_tensor_list], group=group)
        for t, chunk in zip(output_tensor_list, torch.split(recv, [t.numel() for t in output_tensor_list])):
            t.copy_(chunk.view(t.shape))

    dist.all_to_all = all_to_all


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [2, 4])
def test_local_graph_rows_equal_physicsnemos_getters_on_gloo_ranks(tmp_path, world):
    nx = ny = 60
    n = nx * ny
    x = np.random.default_rng(2).standard_normal((STEPS, n, F), dtype=np.float32)
    store = str(tmp_path / "x.zarr")
    z = zarr.create_array(store, shape=x.shape, chunks=(1, n, F), dtype="f4", zarr_format=2,
                          compressors=numcodecs.Blosc("lz4", 5, numcodecs.Blosc.SHUFFLE, blocksize=4096))
    z[:] = x
    run_ranks(_local_graph_rank, world, tmp_path, nx, ny, store, x.shape, timeout_s=280)


def test_local_src_rows_come_grouped_by_owning_rank(mesh):
    """The local graph's source list as PhysicsNeMo orders it: grouped by owning rank, ascending within
    each group, the rank's halo on both sides of its own rows (so ``owned`` is no prefix)."""
    coords, offsets, indices = mesh
    p = 4
    owner = np.empty(len(coords), np.int64)
    parts = [_partition(mesh, p, r) for r in range(p)]
    for r, part in enumerate(parts):
        owner[part.map_partitioned_src_ids_to_global.numpy()] = r
    for r, part in enumerate(parts):
        rows = partition_rows(part, "local_src", indices=indices)
        assert isinstance(rows, Rows) and len(rows) == part.num_local_src_nodes
        o = owner[rows.ids]
        assert (np.diff(o) >= 0).all() and r in o
        for q in np.unique(o):
            assert (np.diff(rows.ids[o == q]) > 0).all()
