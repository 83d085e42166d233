"""The DALI side on a GPU: the plugin's GPU operators, the GPU source path, nvJPEG tiles and the torch
loader on CUDA, against the CPU operators and numpy.

Skipped without DALI, without a CUDA GPU visible to DALI, or without a plugin built with CUDA
(``pip install --no-build-isolation -e .`` with nvcc on PATH); run by ``benchmarks/gpu_check.py``.
Random data each run; the seed is in failure messages (DALI_MESH_TEST_SEED replays).
"""
from __future__ import annotations

import base64
import os

import numpy as np
import pytest

pytest.importorskip("nvidia.dali")

from nvidia.dali import backend as dali_backend  # noqa: E402
from nvidia.dali import fn, pipeline_def, types  # noqa: E402

from dali_mesh import Layout, MeshInfo  # noqa: E402
from dali_mesh._kernels import reference_strided_slice  # noqa: E402
from dali_mesh.partition import take_window  # noqa: E402
from tests.helpers import DTYPES, MODES, SEED, random_array, write_era5_folder  # noqa: E402

if dali_backend.GetCUDADeviceCount() < 1:
    pytest.skip("no CUDA GPU visible to DALI", allow_module_level=True)

import dali_mesh.fn as dfn  # noqa: E402

if not dfn.PLUGIN_PATH.exists():
    pytest.skip(f"{dfn.PLUGIN_PATH} is not built (pip install --no-build-isolation -e .)", allow_module_level=True)
try:
    from dali_mesh import _build_info  # noqa: E402
except ImportError:
    _build_info = None
if not getattr(_build_info, "WITH_CUDA", False):
    pytest.skip(f"{dfn.PLUGIN_PATH} was built without CUDA (no nvcc at build time): no GPU operator",
                allow_module_level=True)

pytestmark = pytest.mark.gpu
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def _workers_find_the_package(monkeypatch):
    """DALI's spawn workers import dali_mesh from the checkout."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))


def _np(out) -> list[np.ndarray]:
    """A DALI output (CPU or GPU) as a list of numpy arrays, copied."""
    if hasattr(out, "as_cpu"):
        out = out.as_cpu()
    return [np.array(out[i]) for i in range(len(out))]


def _build(pipe):
    p = pipe()
    p.build()
    return p


# ---- strided_slice: GPU equals CPU -----------------------------------------------------------------------
BATCH = 4
CHANNELS = 4  # axis 0: the channel axis of the normalised variant


def _batch(dtype, iteration):
    """Inputs of one iteration: samples of different shapes and per-sample start/shape/step."""
    rng = np.random.default_rng([SEED, DTYPES.index(dtype), iteration])
    xs, starts, shapes, steps = [], [], [], []
    for _ in range(BATCH):
        sh = [CHANNELS, int(rng.integers(1, 40)), int(rng.integers(1, 70))]
        xs.append(random_array(rng, sh, dtype))
        starts.append(np.array([rng.integers(-2 * n - 2, 2 * n + 2) for n in sh], np.int64))
        shapes.append(np.array([rng.integers(0 if rng.random() < 0.05 else 1, 2 * n + 4) for n in sh], np.int64))
        steps.append(np.array([rng.integers(1, 4) for _ in sh], np.int64))
    return xs, starts, shapes, steps


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_gpu_strided_slice_equals_cpu_every_mode(dtype):
    """One pipeline per dtype, three iterations with prefetching: every boundary mode on every axis,
    mixed modes with a cast, and mixed modes normalised to float16 -- the GPU operator's output
    equals the CPU operator's on the same inputs, and both equal numpy."""
    out_dtype = DTYPES[(DTYPES.index(dtype) + 5) % len(DTYPES)]
    mixed = [MODES[(DTYPES.index(dtype) + a) % len(MODES)] for a in range(3)]
    mean, std = [0.5, -1.0, 3.0, 7.0], [2.0, 0.5, 1.5, 0.25]
    fill = 1
    variants = [dict(boundary=m) for m in MODES] + [dict(boundary=mixed, dtype=out_dtype)]
    norm = dict(boundary=mixed, dtype=np.float16, channel_axis=0, mean=mean, std=std)

    def per_iteration(k):
        return lambda iteration: _batch(dtype, iteration)[k]

    @pipeline_def(batch_size=BATCH, num_threads=2, device_id=0, prefetch_queue_depth=2)
    def pipe():
        x, start, shape, step = (fn.external_source(source=per_iteration(k), batch=True) for k in range(4))
        xg = x.gpu()
        outs = []
        for v in variants + [norm]:
            kw = {k: (types.to_dali_type(v) if k == "dtype" else v) for k, v in v.items()}
            outs += [dfn.strided_slice(x, start, shape, step, fill_value=fill, **kw),
                     dfn.strided_slice(xg, start, shape, step, fill_value=fill, **kw)]
        return tuple(outs)

    p = _build(pipe)
    for iteration in range(3):
        outs = p.run()
        xs, starts, shapes, steps = _batch(dtype, iteration)
        for j, v in enumerate(variants + [norm]):
            cpu, gpu = _np(outs[2 * j]), _np(outs[2 * j + 1])
            for i, x in enumerate(xs):
                msg = (f"seed {SEED} {np.dtype(dtype)} iteration {iteration} sample {i} {x.shape} {v} "
                       f"start={starts[i]} shape={shapes[i]} step={steps[i]}")
                np.testing.assert_array_equal(gpu[i], cpu[i], err_msg=f"GPU vs CPU: {msg}")
                assert gpu[i].dtype == cpu[i].dtype, msg
                kw = {k: val for k, val in v.items() if k != "boundary"}
                ref = reference_strided_slice(x, starts[i], shapes[i], steps[i], v["boundary"], fill_value=fill, **kw)
                np.testing.assert_array_equal(gpu[i], ref, err_msg=f"GPU vs numpy: {msg}")


# ---- checkpointing ----------------------------------------------------------------------------------------
def _int_files(tmp_path, n, shape):
    files = []
    for i in range(n):
        f = str(tmp_path / f"s{i}.npy")
        np.save(f, np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape) + 1000 * i)
        files.append(f)
    return files


def test_checkpointed_gpu_pipeline_resumes_exactly(tmp_path):
    """strided_slice and mesh_slice on the GPU, mesh_roi on the CPU, in a pipeline built with
    enable_checkpointing: it builds, checkpoints mid-epoch, and a pipeline restored from the
    checkpoint continues with the same outputs; every output equals numpy."""
    files = _int_files(tmp_path, 10, (3, 11, 14))
    layout = Layout(MeshInfo((2, 2), ("h", "w"), (1, 0)), shard={"h": 1, "w": 2}, halo={1: 2, 2: 1},
                    boundary={1: "symmetric", 2: "periodic"})

    def make(checkpoint=None):
        @pipeline_def(batch_size=2, num_threads=2, device_id=0, seed=7, enable_checkpointing=True)
        def pipe():
            x = fn.readers.numpy(files=files, random_shuffle=True, initial_fill=4, name="reader")
            xg = x.gpu()
            roi = dfn.mesh_roi(x.shape(), **dfn.mesh_roi_args(layout, 3))
            sl = dfn.strided_slice(xg, [-1, 3, -4], [5, 7, 20], [1, 2, 1], boundary=["reflect", "edge", "periodic"],
                                   fill_value=-5)
            return x, roi[0], roi[1], sl, dfn.mesh_slice(xg, layout, ndim=3)

        p = pipe(checkpoint=checkpoint)
        p.build()
        return p

    p = make()
    for _ in range(3):
        p.run()
    checkpoint = p.checkpoint()
    expected = [[_np(o) for o in p.run()] for _ in range(4)]  # crosses the epoch boundary
    del p
    restored = make(checkpoint)
    got = [[_np(o) for o in restored.run()] for _ in range(4)]
    region = layout.region((3, 11, 14))
    for it, (e, g) in enumerate(zip(expected, got)):
        for k in range(len(e)):
            for i in range(2):
                np.testing.assert_array_equal(g[k][i], e[k][i], err_msg=f"iteration {it} output {k} sample {i}")
        for i, x in enumerate(g[0]):
            assert tuple(g[1][i]) == region.window_start and tuple(g[2][i]) == region.window_shape
            np.testing.assert_array_equal(
                g[3][i], reference_strided_slice(x, [-1, 3, -4], [5, 7, 20], [1, 2, 1], ["reflect", "edge", "periodic"],
                                                 fill_value=-5))
            np.testing.assert_array_equal(g[4][i], take_window(x, region))
    assert len({int(g[0][i].reshape(-1)[0]) for g in got for i in range(2)}) > 1  # different samples


# ---- mesh_slice on the GPU --------------------------------------------------------------------------------
MESH_SLICE_LAYOUTS = [
    # (mesh shape, names, layout kwargs)
    ((2, 3), ("h", "w"), dict(shard={"h": 0, "w": 1}, halo={0: 1, 1: (2, 3)}, boundary={0: "reflect", 1: "periodic"})),
    ((4,), ("mp",), dict(shard={"mp": 1}, halo=2, boundary="symmetric", split="even")),
    ((3,), ("mp",), dict(shard={"mp": 1}, halo={1: 2}, boundary={1: "constant"}, fill_value=-7, split="physicsnemo")),
    ((2, 2), ("dp", "mp"), dict(shard={"mp": 0}, batch=["dp"], crop=[(1, 6), None, (0, 5)], halo={0: 1, 2: 2},
                                boundary={0: "trim", 2: "edge"})),
]


@pytest.mark.parametrize("case", range(len(MESH_SLICE_LAYOUTS)))
def test_mesh_slice_on_gpu_every_rank(case):
    mesh_shape, names, kw = MESH_SLICE_LAYOUTS[case]
    rng = np.random.default_rng(SEED)
    xs = [rng.integers(-1000, 1000, s).astype(np.float32) for s in ((7, 9, 6), (6, 13, 5), (8, 7, 7))]
    mesh = MeshInfo(mesh_shape, names)
    layouts = [Layout(mesh.with_coordinate(c), **kw) for c in mesh.coordinates()]

    @pipeline_def(batch_size=len(xs), num_threads=2, device_id=0)
    def pipe():
        x = fn.external_source(source=lambda: xs, batch=True).gpu()
        return tuple(dfn.mesh_slice(x, lay, ndim=3) for lay in layouts)

    outs = _build(pipe).run()
    for lay, out in zip(layouts, outs):
        assert isinstance(out, dali_backend.TensorListGPU)
        for i, got in enumerate(_np(out)):
            want = take_window(xs[i], lay.region(xs[i].shape))
            np.testing.assert_array_equal(got, want, err_msg=f"seed {SEED} {lay!r} sample {i} {xs[i].shape}")


# ---- partitioned_source(device="gpu") and the native reader read_windows(device="gpu") ------------------
@pytest.mark.parametrize("reader", ["partitioned_source", "read_windows"])
@pytest.mark.parametrize("boundary", ["periodic", "reflect", "constant"])
def test_window_sources_on_gpu_two_epochs(tmp_path, reader, boundary):
    from dali_mesh.source import NumpySource

    files = _int_files(tmp_path, 7, (3, 10, 16))
    layout = Layout(MeshInfo((2, 2), ("dp", "mp"), (1, 1)), shard={"mp": 2}, halo={1: 1, 2: 3},
                    boundary={1: "edge", 2: boundary})
    source = NumpySource(files, layout, batch_size=2, seed=3)

    @pipeline_def(batch_size=2, num_threads=2, device_id=0, py_num_workers=1, py_start_method="spawn")
    def pipe():
        if reader == "read_windows":
            window, sample_id, is_pad = dfn.read_windows(source, device="gpu", fallback=False)
        else:
            window, sample_id, is_pad = dfn.partitioned_source(source, device="gpu")
        return window, sample_id, is_pad, dfn.strided_slice(window, [0, 1, 3], [3, 10, 8], dtype=types.FLOAT)

    p = _build(pipe)
    for epoch in range(2):
        ids, pads = source.order(epoch)
        seen = []
        while True:
            try:
                window, sample_id, is_pad, owned = p.run()
            except StopIteration:
                break
            assert isinstance(window, dali_backend.TensorListGPU) and isinstance(owned, dali_backend.TensorListGPU)
            for w, sid, pad, o in zip(_np(window), _np(sample_id), _np(is_pad), _np(owned)):
                x = np.load(files[int(sid)])
                np.testing.assert_array_equal(w, take_window(x, source.region), err_msg=f"epoch {epoch} sample {sid}")
                owned_region = layout.region(x.shape)
                np.testing.assert_array_equal(o, x[:, :, owned_region.start[2]:owned_region.stop[2]].astype(np.float32))
                seen.append((int(sid), bool(pad)))
        assert seen == list(zip(ids.tolist(), pads.tolist())), f"epoch {epoch}"
        p.reset()


def _read_windows_pipe(source, device, **kw):
    """A built pipeline of batch 2, 2 threads, of ``read_windows(source, device, **kw)`` (native only)."""
    @pipeline_def(batch_size=2, num_threads=2, device_id=0)
    def pipe():
        return dfn.read_windows(source, device=device, fallback=False, **kw)

    return _build(pipe)


@pytest.mark.parametrize("read_ahead", [None, True], ids=["", "read_ahead"])
@pytest.mark.parametrize("kind", ["hdf5_deflate_shuffle", "zarr_blosc", "zarr_zstd_sharded"])
def test_read_windows_compressed_on_gpu(tmp_path, kind, read_ahead):
    """Compressed chunks decoded on the CPU threads into the pinned staging, then copied once: the GPU
    output equals the CPU operator's and the oracle's (h5py, zarr-python), halos filled on the device;
    with ``read_ahead=True`` the mixed operator's batches come from those it read ahead."""
    from dali_mesh import _kernels
    from dali_mesh.pipeline.plugin import plugin_read_ahead_counts
    from dali_mesh.plan import CODECS
    from dali_mesh.source import HDF5Source, ZarrSource

    codec = {"hdf5_deflate_shuffle": "zlib", "zarr_blosc": "blosc", "zarr_zstd_sharded": "zstd"}[kind]
    if not _kernels.codec_available(CODECS[codec]):
        pytest.skip(f"this build has no {codec} decoder")
    rng = np.random.default_rng(SEED)
    arr = random_array(rng, (6, 2, 33, 40), "f4")
    layout = Layout(MeshInfo((1, 2), ("dp", "mp"), (0, 1)), shard={"mp": 1}, halo={1: 2, 2: 3},
                    boundary={1: "reflect", 2: "periodic"})
    if kind.startswith("hdf5"):
        h5py = pytest.importorskip("h5py")
        path = str(tmp_path / "x.h5")
        with h5py.File(path, "w") as f:
            f.create_dataset("fields", data=arr, chunks=(1, 2, 17, 40), compression="gzip", shuffle=True)
        source = HDF5Source([path], "fields", layout, batch_size=2, shuffle=False)
    else:
        zarr = pytest.importorskip("zarr")
        path = str(tmp_path / "x.zarr")
        if kind == "zarr_blosc":
            import numcodecs

            z = zarr.create_array(path, shape=arr.shape, chunks=(2, 2, 17, 20), dtype="f4", zarr_format=2,
                                  compressors=numcodecs.Blosc("lz4", 5, 1))
        else:
            z = zarr.create_array(path, shape=arr.shape, chunks=(1, 1, 17, 20), shards=(2, 2, 34, 40), dtype="f4",
                                  compressors=zarr.codecs.ZstdCodec())
        z[:] = arr
        source = ZarrSource([path], None, layout, batch_size=2, shuffle=False)

    gpu, cpu = _read_windows_pipe(source, "gpu", read_ahead=read_ahead), _read_windows_pipe(source, "cpu")
    used = plugin_read_ahead_counts()[0]
    for _ in range(3):
        (gw, gid, _), (cw, cid, _) = gpu.run(), cpu.run()
        for w, c, sid in zip(_np(gw), _np(cw), _np(gid)):
            np.testing.assert_array_equal(w, c)
            np.testing.assert_array_equal(w, take_window(arr[source.step_of(int(sid))], source.region))
        np.testing.assert_array_equal(np.concatenate(_np(gid)), np.concatenate(_np(cid)))
    assert plugin_read_ahead_counts()[0] - used == (2 if read_ahead else 0)  # batches 2 and 3 of the epoch


def test_forecast_of_compressed_chunks_on_gpu(tmp_path):
    """A forecast's input and target from one mixed operator (outputs=2): chunks of two steps, so
    that a sample's input and target share chunks, decoded once into the pinned staging; both
    outputs equal the CPU operator's and zarr-python's, halos filled on the device."""
    import numcodecs

    from dali_mesh import _kernels
    from dali_mesh.plan import CODECS
    from dali_mesh.source import ForecastSpec, ZarrSource

    if not _kernels.codec_available(CODECS["blosc"]):
        pytest.skip("this build has no blosc decoder")
    zarr = pytest.importorskip("zarr")
    rng = np.random.default_rng(SEED)
    arr = random_array(rng, (7, 2, 33, 40), "f4")
    path = str(tmp_path / "f.zarr")
    z = zarr.create_array(path, shape=arr.shape, chunks=(2, 2, 17, 20), dtype="f4", zarr_format=2,
                          compressors=numcodecs.Blosc("lz4", 5, 1))
    z[:] = arr
    layout = Layout(MeshInfo((1, 2), ("dp", "mp"), (0, 1)), shard={"mp": 1}, halo={1: 2, 2: 3},
                    boundary={1: "reflect", 2: "periodic"})
    source = ZarrSource([path], None, layout, batch_size=2, shuffle=False, forecast=ForecastSpec(1, 1))

    gpu, cpu = _read_windows_pipe(source, "gpu"), _read_windows_pipe(source, "cpu")
    for _ in range(len(source) // 2):
        (gi, gt, gid, _), (ci, ct, _, _) = gpu.run(), cpu.run()
        for a, b, c, sid in zip(_np(gi), _np(gt), _np(ci), _np(gid)):
            t = source.step_of(int(sid))
            np.testing.assert_array_equal(a, c)
            np.testing.assert_array_equal(a, np.stack([take_window(arr[t + k], source.region) for k in (-1, 0)]))
            np.testing.assert_array_equal(b, take_window(arr[t + 1], source.region)[None])
        for b, c in zip(_np(gt), _np(ct)):
            np.testing.assert_array_equal(b, c)


# ---- decode_tile(device="mixed") --------------------------------------------------------------------------
@pytest.mark.parametrize("subsampling", [0, 2], ids=["444", "420"])
@pytest.mark.parametrize("boundaries", [("constant", "edge"), ("reflect", "symmetric"), ("trim", "trim")])
def test_decode_tile_mixed_equals_tile_of_mixed_full_decode(tmp_path, subsampling, boundaries):
    """nvJPEG on both sides (hw_decoder_load=0: the CUDA decoder for the full image and the tile)."""
    from dali_mesh.pipeline.image_tiles import decode_tile

    files = []
    for (h, w, sub), b64 in _JPEG_B64.items():
        if sub == subsampling:
            f = tmp_path / f"img_{h}x{w}.jpg"
            f.write_bytes(base64.b64decode("".join(b64)))
            files.append(str(f))
    mesh = MeshInfo((2, 3), ("h", "w"))
    layouts = [Layout(mesh.with_coordinate(c), shard={"h": 0, "w": 1}, halo={0: 3, 1: (2, 9)},
                      boundary={0: boundaries[0], 1: boundaries[1]}, fill_value=7) for c in mesh.coordinates()]

    @pipeline_def(batch_size=len(files), num_threads=2, device_id=0)
    def pipe():
        jpegs, _ = fn.readers.file(files=files)
        full = fn.decoders.image(jpegs, device="mixed", hw_decoder_load=0)
        return (full,) + tuple(decode_tile(jpegs, lay, device="mixed", hw_decoder_load=0) for lay in layouts)

    full, *tiles = _build(pipe).run()
    full = _np(full)
    for lay, out in zip(layouts, tiles):
        assert isinstance(out, dali_backend.TensorListGPU)
        for img, tile, path in zip(full, _np(out), files):
            want = take_window(img, lay.region(img.shape))
            np.testing.assert_array_equal(tile, want, err_msg=f"{path} at {lay.mesh.coordinate} {boundaries}")


# ---- MeshLoader on CUDA -----------------------------------------------------------------------------------
def test_mesh_loader_on_cuda_local_and_dtensor(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here (the loader's tensors would be on the CPU)")
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from dali_mesh.source import NumpySource
    from dali_mesh.torch import MeshLoader

    files = _int_files(tmp_path, 6, (2, 12, 8))

    def loader_for(layout, **kw):
        source = NumpySource(files, layout, batch_size=2, shuffle=False)

        def make_pipeline(checkpoint=None):
            @pipeline_def(batch_size=2, num_threads=1, device_id=torch.cuda.current_device(), py_num_workers=1,
                          py_start_method="spawn", enable_checkpointing=True)
            def pipe():
                return dfn.partitioned_source(source, device="gpu")

            return pipe(checkpoint=checkpoint)

        return source, MeshLoader(make_pipeline, layout, sample_shape=source.sample_shape, **kw)

    # local windows of rank 1 of 4 (no process group needed), halo kept; then resume from a checkpoint
    layout = Layout(MeshInfo((4,), ("mp",), (1,)), shard={"mp": 1}, halo={1: 1}, boundary={1: "reflect"})
    source, loader = loader_for(layout)
    first = next(loader)
    assert first["window"].is_cuda and first["window"].dtype == torch.int32
    for sid, w in zip(first["sample_id"].tolist(), first["window"].cpu().numpy()):
        np.testing.assert_array_equal(w, take_window(np.load(files[sid]), source.region))
    state = loader.state_dict()
    expected = [b["sample_id"].tolist() for b in loader]
    loader.load_state_dict(state)
    assert [b["sample_id"].tolist() for b in loader] == expected == [[2, 3], [4, 5]]

    # a DTensor on a 1-rank CUDA mesh (NCCL)
    dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        device_mesh = init_device_mesh("cuda", (1, 1), mesh_dim_names=("data_parallel", "model_parallel"))
        layout = Layout(MeshInfo.from_device_mesh(device_mesh), shard={"model_parallel": 1})
        source, loader = loader_for(layout, output="dtensor", device_mesh=device_mesh)
        batches = list(loader)
        assert len(batches) == 3
        for b in batches:
            dt = b["window"]
            assert isinstance(dt, DTensor) and dt.device.type == "cuda" and tuple(dt.shape) == (2, 2, 12, 8)
            want = np.stack([np.load(files[s]) for s in b["sample_id"].tolist()])
            np.testing.assert_array_equal(dt.full_tensor().cpu().numpy(), want)
    finally:
        dist.destroy_process_group()


def test_era5_drop_in_on_cuda(tmp_path):
    """dali_mesh.physicsnemo.ERA5HDF5Datapipe with device="cuda": the band read natively into GPU memory,
    squeezed and normalised there; equal to h5py's fields (no stats) and to the CPU datapipe (stats).
    Cos zenith needs PhysicsNeMo (not on the GPU machine): left to the CPU tests."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("h5py")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    from dali_mesh.physicsnemo import ERA5HDF5Datapipe

    rng = np.random.default_rng(SEED)
    years = write_era5_folder(tmp_path, rng, (9, 3, 20, 16), (1, 3, 5, 16))
    for history in (0, 1):
        layout = Layout(MeshInfo((4,), ("mp",), (2,)), shard={"mp": 1}, split="physicsnemo", halo={1: 1},
                        boundary={1: "reflect"})
        kw = dict(channels=[0, 2], batch_size=2, num_history=history, num_steps=2, stride=2, layout=layout,
                  use_time_of_year_index=True, order="dali_mesh", seed=SEED)
        raw = ERA5HDF5Datapipe(str(tmp_path / "data"), None, device="cuda", **kw)
        region = raw.region
        for (b,) in raw:
            assert b["invar"].is_cuda and b["outvar"].is_cuda
            for i, doy in enumerate(b["time_of_year_idx"].reshape(-1).tolist()):
                # which year: compare with both (the sample is from one of them)
                inv = b["invar"][i].cpu().numpy()
                hits = []
                for a in years.values():
                    steps = [doy + 2 * j for j in range(history + 1)]
                    want = np.stack([take_window(a[t, [0, 2]], region) for t in steps])
                    hits.append(np.array_equal(inv, want if history else want[0]))
                assert any(hits), (SEED, history, doy)
        raw.close()
        gpu = ERA5HDF5Datapipe(str(tmp_path / "data"), str(tmp_path / "stats"), device="cuda", **kw)
        cpu = ERA5HDF5Datapipe(str(tmp_path / "data"), str(tmp_path / "stats"), device="cpu", **kw)
        for (g,), (c,) in zip(gpu, cpu):
            for k in ("invar", "outvar"):
                np.testing.assert_allclose(g[k].cpu().numpy(), c[k].numpy(), rtol=1e-6, atol=1e-6,
                                           err_msg=f"seed {SEED} history {history} {k}")
            assert torch.equal(g["time_of_year_idx"].cpu(), c["time_of_year_idx"])
        gpu.close()
        cpu.close()


def _netcdf_like(path, rng, steps=6, levels=(500, 850), shape=(13, 16)):
    """A NetCDF4-style HDF5 file written with h5py alone (dimension scales attached as netCDF does):
    the GPU machine has h5py but no xarray or zarr."""
    h5py = pytest.importorskip("h5py")
    with h5py.File(path, "w") as f:
        f["time"] = np.arange(steps, dtype=np.int64) * 6
        f["time"].attrs["units"] = "hours since 2020-01-01"
        f["time"].attrs["calendar"] = "proleptic_gregorian"
        f["level"] = np.array(levels, np.int64)
        f["latitude"] = np.linspace(90, -90, shape[0])
        f["longitude"] = np.linspace(0, 360, shape[1], endpoint=False)
        for name in ("time", "level", "latitude", "longitude"):
            f[name].make_scale(name)
        f.create_dataset("t2m", data=rng.standard_normal((steps,) + shape).astype("f4"), chunks=(1, 7, 16),
                         compression="gzip", shuffle=True)
        f.create_dataset("z", data=rng.standard_normal((steps, len(levels)) + shape).astype("f4"))
        for name, dims in (("t2m", ("time", "latitude", "longitude")), ("z", ("time", "level", "latitude", "longitude"))):
            for i, d in enumerate(dims):
                f[name].dims[i].attach_scale(f[d])


def test_read_dataset_on_gpu_equals_cpu(tmp_path):
    """read_dataset(device="gpu"): the float32 variables read natively by one operator into GPU memory
    (or, stack=False, one per variable, concatenated on the GPU), normalised on the GPU; equal to the
    CPU pipeline (whose operator normalises in place; normalised: to float32 rounding)."""
    from dali_mesh import ForecastSpec
    from dali_mesh import NetCDFDatasetSource

    rng = np.random.default_rng(SEED)
    path = str(tmp_path / "era5.nc")
    _netcdf_like(path, rng)
    for normalise, stack in ((False, True), (True, True), (True, False)):
        layout = Layout(MeshInfo((3,), ("mp",), (1,)), shard={"mp": 1}, halo={1: 1, 2: 2},
                        boundary={1: "reflect", 2: "periodic"})
        stats = dict(mean=[0.5, -1.0, 2.0], std=[1.5, 2.0, 0.5]) if normalise else {}
        src = NetCDFDatasetSource(path, ["t2m", ("z", [850, 500])], layout, batch_size=2, shuffle=False,
                                  forecast=ForecastSpec(1, 1), dtype="f4", **stats)
        outs = {}
        for device in ("cpu", "gpu"):
            @pipeline_def(batch_size=2, num_threads=2, device_id=0)
            def pipe():
                return dfn.read_dataset(src, device, fallback=False, stack=stack)

            p = _build(pipe)
            outs[device] = [[_np(o) for o in p.run()[:2]] for _ in range(len(src) // 2)]
        for b, (c, g) in enumerate(zip(outs["cpu"], outs["gpu"])):
            for w in range(2):
                for j in range(2):
                    if normalise:
                        np.testing.assert_allclose(g[w][j], c[w][j], rtol=1e-6, atol=1e-6,
                                                   err_msg=f"seed {SEED} b {b} stack {stack}")
                    else:
                        np.testing.assert_array_equal(g[w][j], c[w][j], err_msg=f"seed {SEED} batch {b}")


# JPEGs of odd sizes, 4:4:4 (subsampling 0) and 4:2:0 (2), written by Pillow (quality 90) from RGB =
# (255 x / w, 255 y / h, x y mod 256); embedded because GPU machines often have no Pillow.
# (h, w, subsampling) -> base64
_JPEG_B64 = {
    (37, 53, 0): (
        "/9j/4AAQSkZJRgABAQAAAQABAAD/2wBDAAMCAgMCAgMDAwMEAwMEBQgFBQQEBQoHBwYIDAoMDAsKCwsNDhIQDQ4RDgsLEBYQ"
        "ERMUFRUVDA8XGBYUGBIUFRT/2wBDAQMEBAUEBQkFBQkUDQsNFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQU"
        "FBQUFBQUFBQUFBQUFBT/wAARCAAlADUDAREAAhEBAxEB/8QAHwAAAQUBAQEBAQEAAAAAAAAAAAECAwQFBgcICQoL/8QAtRAA"
        "AgEDAwIEAwUFBAQAAAF9AQIDAAQRBRIhMUEGE1FhByJxFDKBkaEII0KxwRVS0fAkM2JyggkKFhcYGRolJicoKSo0NTY3ODk6"
        "Q0RFRkdISUpTVFVWV1hZWmNkZWZnaGlqc3R1dnd4eXqDhIWGh4iJipKTlJWWl5iZmqKjpKWmp6ipqrKztLW2t7i5usLDxMXG"
        "x8jJytLT1NXW19jZ2uHi4+Tl5ufo6erx8vP09fb3+Pn6/8QAHwEAAwEBAQEBAQEBAQAAAAAAAAECAwQFBgcICQoL/8QAtREA"
        "AgECBAQDBAcFBAQAAQJ3AAECAxEEBSExBhJBUQdhcRMiMoEIFEKRobHBCSMzUvAVYnLRChYkNOEl8RcYGRomJygpKjU2Nzg5"
        "OkNERUZHSElKU1RVVldYWVpjZGVmZ2hpanN0dXZ3eHl6goOEhYaHiImKkpOUlZaXmJmaoqOkpaanqKmqsrO0tba3uLm6wsPE"
        "xcbHyMnK0tPU1dbX2Nna4uPk5ebn6Onq8vP09fb3+Pn6/9oADAMBAAIRAxEAPwD839O8Lb8fJXHTl7UwwuPt1Oo07wdux8le"
        "pTy/2vQ+twuY2tqdPp3gbdj93+lepT4d9r9k+twuaW6nT6d8Pd2P3f6V6lPgv2v2T67C5va2p0dp8PYoUVpgkSk43OQBn8a0"
        "xPBOCwVNVsdONKLdk5tRV9Xa7aV7J6eTPr8HnEpaR1Ny08GafEyq0iEkZ+QFh+YBr57E5VwrhKipVsVFtq/uKVRdVvTjJJ6b"
        "Xvs7WaPtsHmVeSul+n5m0nhGwjjXZHJNn+5HjH54rzMZhOF8OoujGda978lNq22/tOTfpa+zvbS/1+HzGs46tL5/5XPD9G8L"
        "7tvyfpXkZRL2tj/J+hjrdTu9G8HFtvyfpX7TlGX+1tofQUMxt1OmTR4NNZY/JM0+Adi8AfU9q7864myzhiosJ7N1sRZPkTSU"
        "b2tzy15W020lGT2uoqSb+twGJnWXNeyNSw8P396RljEuQQsQ24/Hr+tfnrzbifPZa13ShdNRpe5ayt8S99p7tObV+mit95hc"
        "XRpW6+uv/AN6y8E2tls+0FYycYXGT9cDnt1rzqmRZLkXIs0rRpuVrRs5Ss768sU5cujXNa19L3Ps8JmdSr8Gp0GnaAhwLexZ"
        "srw0nGD9BnI/GuOnm+Gn7uV5dKV46SqNRtLX7MebmitH8cW9VpufZ4XFvTnn9x0CeGrlYUMjQWmc4+UDd/31n/JozDGZxRp0"
        "nia1HCXvbSK59r/xXO/L/dtvrfS31mGxtNp2vL+vI8L8PeF9235P0r5rhaXteU/yhhjrdTuRorabax+Wg8+U4XI6Duf5fnX7"
        "Jn/EFThjLaawaX1is2oXV+VJe9PZpuN4pJtayTtJRaf0GAxKrT956I1NA8EgIGZAqgZJPAAr8+4cyKnCn7as1GMVdt6JJatt"
        "vRJLVt7H3dLM3okzobPR5rmTyrRPLh6eZt+Zv8B+tYYjifHZnWlg8g/d0NvaW/eS0abV/gi7+7ZKorKXNFtxX2ODxEIJSqu7"
        "7dP6/A3LHwrbacQjRmWfA/dqOnpk9v589K8OUMn4al9WqxdXEJJ+zitrptc0npFOyvvNKSkoNM+1wmPqVtU7LudJZ+Hbhk3y"
        "MtnAegXg+vXqT9OuOlaYjMM0qUZYjE144PDvRKOj0bkkp/xJTsrNQtzJaQ1af2GDxkE0l7z/AK+VvU1bTwxAkOILJ5hnBZvl"
        "HsR1/pXyNOeWUqfLl2AlWSbTcmqa02cdJtp6v3lBrTS7aX2lHHTcffnb8Txvwr4X3bPkr3+BJe15D/JZY63U6a38Mm91Z/kO"
        "2M+WoIxjHX9c134/ESz3ieu9eWk/ZRTSVuTSW26c+dpvWzW2y+uwWN9lRjrvr9//AADof+Eca5uFs4l/cpjfj+JvT6D+eaw4"
        "gx1bM8cshwc/3FO3tLW96pvZtN3jDRcrtaopcybjFr7HL8YoQ9rLd7en9fgdBb+H/Kxa2qfvekkg/h9h7/y+vTjx2a/VL5Jk"
        "j/fbVKi+x3jF/wA/80vsbL37uH2eCxfNapUenRf10/P033bHwsunbIoYVluTgkEcKPf39v8AJ8mfseGvZ4HA041cW7Np3cYL"
        "f3rNNykvhimnZ8zsuVT+0wmPdb3pO0fzN6z8LLDKDMrXV1x+79AeeuMAe3v0ryK7o4LEc2YSlisbp7l37qk3LWVnGEVdtQSv"
        "70bRUZcy+0wePckuR8se/wDW5vJ4dZYwLi4+zsOkcAIxwOuOfz/CscdmFWHLDM8w+ryW1Ojzrl0j8Sp809dJL2je75NLo+uw"
        "2MTj7kb+b/4P6Hivg7RoDs/wr6zwzk58l/I/yZliZnQeG9Ihgs5JVALRxlgCOMgZrh4PqPAZVXx1JJypU5zV9rxi2r2adrrX"
        "Vep9nDETlUjF9Wb2kaPDZ6ZJNFgSKBglc4yQP615eWTnknDtfMcHZVYKKTavbmnGN7bXSldXurpXTV0/tKGIlUqxhLY6DTtJ"
        "g06wjkiUeY7BAxH3cgnPv0rmo1/9WckhisHFe1qSVNN/ZvGT5rbNpR0T0u03dJxf2WFxE61XllstTdtdGgsbe3jh+V5sgyAc"
        "qBjp789a8XGSeQYHC4TAe7PEcyc+sVHlvy9pS5viveKTt7zUo/aYLEzqycpdOhv2mkQ2ckVtCAm+MMZMfMMnHHp06+/auHEV"
        "Hklejk2XpQ9pTUnU+2uaTjaGqUXaLvLV+97vK4pv7PB4mdRe0nrZ7GzHp9vYFreGCM7MZaQZzkA9ARjrXiYrNKeQYmplWAw0"
        "P3fLeU05c3NCMlZRcOW12ndyvo9Ov2OHrVKtNTnJ6n//2Q=="
    ),
    (37, 53, 2): (
        "/9j/4AAQSkZJRgABAQAAAQABAAD/2wBDAAMCAgMCAgMDAwMEAwMEBQgFBQQEBQoHBwYIDAoMDAsKCwsNDhIQDQ4RDgsLEBYQ"
        "ERMUFRUVDA8XGBYUGBIUFRT/2wBDAQMEBAUEBQkFBQkUDQsNFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQU"
        "FBQUFBQUFBQUFBQUFBT/wAARCAAlADUDASIAAhEBAxEB/8QAHwAAAQUBAQEBAQEAAAAAAAAAAAECAwQFBgcICQoL/8QAtRAA"
        "AgEDAwIEAwUFBAQAAAF9AQIDAAQRBRIhMUEGE1FhByJxFDKBkaEII0KxwRVS0fAkM2JyggkKFhcYGRolJicoKSo0NTY3ODk6"
        "Q0RFRkdISUpTVFVWV1hZWmNkZWZnaGlqc3R1dnd4eXqDhIWGh4iJipKTlJWWl5iZmqKjpKWmp6ipqrKztLW2t7i5usLDxMXG"
        "x8jJytLT1NXW19jZ2uHi4+Tl5ufo6erx8vP09fb3+Pn6/8QAHwEAAwEBAQEBAQEBAQAAAAAAAAECAwQFBgcICQoL/8QAtREA"
        "AgECBAQDBAcFBAQAAQJ3AAECAxEEBSExBhJBUQdhcRMiMoEIFEKRobHBCSMzUvAVYnLRChYkNOEl8RcYGRomJygpKjU2Nzg5"
        "OkNERUZHSElKU1RVVldYWVpjZGVmZ2hpanN0dXZ3eHl6goOEhYaHiImKkpOUlZaXmJmaoqOkpaanqKmqsrO0tba3uLm6wsPE"
        "xcbHyMnK0tPU1dbX2Nna4uPk5ebn6Onq8vP09fb3+Pn6/9oADAMBAAIRAxEAPwD839O8Lb8fJXUad4O3Y+Su30bwvu2/J+ld"
        "3o3g4tt+T9K7skwX9q20vc8nL+IPZ2948007wNux+7/Sun074e7sfu/0r0pNHg01lj8kzT4B2LwB9T2rUsPD9/ekZYxLkELE"
        "NuPx6/rX0uKwmRYGr9VlF1qy0cYJPlf96Tsl5pXae6R+t5TxBVklLmsjhLT4exQorTBIlJxucgDP41uWngzT4mVWkQkjPyAs"
        "PzANd7ZeCbWy2faCsZOMLjJ+uBz2610GnaAhwLexZsrw0nGD9BnI/GvCxMsDRlyTwtKnP+VuVWXzjBRav0ukvU/Zspz2Ts+d"
        "v8PzPPE8I2Eca7I5Js/3I8Y/PFFexp4auVhQyNBaZzj5QN3/AH1n/Jor5/FVcNCs4vDqO2ipwS2XSdXm+/5aWP02jnsuRe/+"
        "L/RHhfh7wvu2/J+ldyNFbTbWPy0HnynC5HQdz/L866bwr4X3bPkrprfwyb3Vn+Q7Yz5agjGMdf1zU5Pm9XAZFCWFdq1ZqEWt"
        "431lL5JWT3TafQ/xqy7OlKquZ6I4fQPBICBmQKoGSTwAK6Gz0ea5k8q0Ty4enmbfmb/AfrXcf8I41zcLZxL+5TG/H8Ten0H8"
        "810Fv4f8rFrap+96SSD+H2Hv/L69OOrmVLBUnhcLJ06dN8spR+OpP+SHZLq9L2bbUU7/ALHlOduTUpO7f4ebODsfCttpxCNG"
        "ZZ8D92o6emT2/nz0rpLPw7cMm+Rls4D0C8H169Sfp1x0rtbHwsunbIoYVluTgkEcKPf39v8AJ3rPwssMoMytdXXH7v0B564w"
        "B7e/SvnauZyw0XRSVOMdHGLajH+7KaXPUnbeELX1Vk9D9nynOr2fNf8Ar8PU4G08MQJDiCyeYZwWb5R7Edf6UV64nh1ljAuL"
        "j7Ow6RwAjHA645/P8KK+cqZjToydNThC32X9Xjb/ALdmpSX/AG87+my/TqWdtwTvf7zxXwdo0B2f4V0HhvSIYLOSVQC0cZYA"
        "jjIGaKK9zK5OOByyoviUKzT80qZ/kTltWfNJX7fqb2kaPDZ6ZJNFgSKBglc4yQP610GnaTBp1hHJEo8x2CBiPu5BOffpRRXz"
        "tacsLShKi+Vww6lH+7KU5KTXZtJa76Lsj9mymrOTV3uzdtdGgsbe3jh+V5sgyAcqBjp789a37TSIbOSK2hATfGGMmPmGTjj0"
        "6dfftRRXzePk6FWrCl7qg6MI205YzhGUkuzk3q1r0vZI/Z8oqzajd73/ADNmPT7ewLW8MEZ2Yy0gznIB6AjHWiiivh8VmeLo"
        "YqtQpT5YQnOKSSSSjJpLRdkvN7u7P1KjKTpxbfRH/9k="
    ),
    (17, 91, 0): (
        "/9j/4AAQSkZJRgABAQAAAQABAAD/2wBDAAMCAgMCAgMDAwMEAwMEBQgFBQQEBQoHBwYIDAoMDAsKCwsNDhIQDQ4RDgsLEBYQ"
        "ERMUFRUVDA8XGBYUGBIUFRT/2wBDAQMEBAUEBQkFBQkUDQsNFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQU"
        "FBQUFBQUFBQUFBQUFBT/wAARCAARAFsDAREAAhEBAxEB/8QAHwAAAQUBAQEBAQEAAAAAAAAAAAECAwQFBgcICQoL/8QAtRAA"
        "AgEDAwIEAwUFBAQAAAF9AQIDAAQRBRIhMUEGE1FhByJxFDKBkaEII0KxwRVS0fAkM2JyggkKFhcYGRolJicoKSo0NTY3ODk6"
        "Q0RFRkdISUpTVFVWV1hZWmNkZWZnaGlqc3R1dnd4eXqDhIWGh4iJipKTlJWWl5iZmqKjpKWmp6ipqrKztLW2t7i5usLDxMXG"
        "x8jJytLT1NXW19jZ2uHi4+Tl5ufo6erx8vP09fb3+Pn6/8QAHwEAAwEBAQEBAQEBAQAAAAAAAAECAwQFBgcICQoL/8QAtREA"
        "AgECBAQDBAcFBAQAAQJ3AAECAxEEBSExBhJBUQdhcRMiMoEIFEKRobHBCSMzUvAVYnLRChYkNOEl8RcYGRomJygpKjU2Nzg5"
        "OkNERUZHSElKU1RVVldYWVpjZGVmZ2hpanN0dXZ3eHl6goOEhYaHiImKkpOUlZaXmJmaoqOkpaanqKmqsrO0tba3uLm6wsPE"
        "xcbHyMnK0tPU1dbX2Nna4uPk5ebn6Onq8vP09fb3+Pn6/9oADAMBAAIRAxEAPwD4HtPhXux+5/SvnKOP9r1PjqWfW6m1Z/CP"
        "dj9z+le5Rp+1PYpcQ26m3afBvdj9x+le5Ryn2vQ9ilxJb7RtWnwS3Y/0f9K9ujwv7X7J7FLie32jXi+CUUKhpY0iUnG58AZ/"
        "GuvEcLYLBU1Wx1SNKLdk5yUVfe120r2TdvJntUOJ5Sdou5ei+EOnxMFYoSRn5FLD8wDXiV8NwrhaipVsXFtq/uKVRffTUknp"
        "te+ztZo+gocRV5K6/wAvzNKL4SWCbdsEk2f7kfT88VzYn/Vehy+xU61735KbVrW39pyb9LX2d7aX96hxBXe8kvn/AJXNW0+E"
        "Vk2P9An/AO/a/wCNbUaPD1X/AJg63/gEP/lh7lLiGqvtr73/AJGjafB7dj/iUf8Aj/8A9jXn0cB7X/mT/wDlX/7ke9S4jt/y"
        "9/D/AIJpwfCS1jfZJYRI46q0wBH6VlV/sbDVnh8Xg6VOorXjLEQi1dXV04Jq6afoe7Q4gqNJxqNr0/4Jpr8JbRYGZLSBWGOf"
        "M39/QDJrPHf2HTwc61GhRUlaz9r7Xql/DpxU5fJ6fE9Ez3cPxBVcknN/db8WSr8KIto/0eD/AMB5K+UWIwLV+Sj/AOCMR/me"
        "6s/lb4n96MzS/hXux+5/Svz/ACfHe1tqf4hRz63U67S/hHu2/uP0r9xyeHtbHVHiG32jZb4dwaawi+zGafGdi8AfU9q9bOOM"
        "ss4YqLB+zdbEWT5E0lG9rc8teVtNtJRk9rqKkm/ZwucTrLm5rIntvhpf3pHBiXIO2JduOPXr+tfCf6xcT57LXEOlG6ajS9y1"
        "lb4l77T1bTm1fporfS0c7o0vP11/4BpQfB21stnnqsZPRduT9cDnHFcs8uyXIuRZpWjTcrWjZylZ315Ypy5dGua1r6Xue9R4"
        "jqVfg1NO0+GiHiDTWbI4aTjB+gzkfjWdLiPDz93K8vlK8dJVGo2lrvGPNzRWj+OLeq03PdpZ2/t1PuNeP4Y3ESo0iw2gwTwg"
        "y34HOfw9a68XnebYWnTq4utRwiSk9Iq87WbsqjqOTj0UFd81rNtHt4fPKcnaN5fP/K34l61+GS7gwe6mLEk+UCoH4HH6V4tP"
        "P6XtFVp47E1nNtv2fPFR67SdNJO+igrK1rJWPoKWdu1mkrd/6ZetvhIIoQx06KAkgB5X+XP5D3714lqeEwvtJ4CnQbaSlVq+"
        "5fe1uWndtJ2Sku+qTR9DR4gcpWVRv0X/AA5qw/C8YKBIVdecwQlt3HTJyKdXOIKEqFOrSjUhr+5pSm5aX5VKXtKTvddVZqzk"
        "veR7lDPHo23bzdv8masPwwk+ysWhmUccsiRjr/eHIrevnWK/s2pOp7WK93WUaNBfEt6sLyj8vifuvRs9uhnkedWa/F/gXY/h"
        "flB8v/k5/wDWrlpZveCft/8Ay+/4B7H9u/1yniOj/wANfDcO/ZP8g0dzo/8ADX9Q8O/ZKRk6P/DX8l8O/ZPuTutH6iv6g4d+"
        "yWZOjdFr+SuHPsn3KO50foK/qHh37JRlaP8Aw1/JXDn2T7o7nR/4a/qHh37JSMrR/wCGv5J4d+yfco7nR/4a/qLh37JRk6P/"
        "AA1/JPDv2T7pHVxf6tfpX73h/wCFEtH/2Q=="
    ),
    (17, 91, 2): (
        "/9j/4AAQSkZJRgABAQAAAQABAAD/2wBDAAMCAgMCAgMDAwMEAwMEBQgFBQQEBQoHBwYIDAoMDAsKCwsNDhIQDQ4RDgsLEBYQ"
        "ERMUFRUVDA8XGBYUGBIUFRT/2wBDAQMEBAUEBQkFBQkUDQsNFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQU"
        "FBQUFBQUFBQUFBQUFBT/wAARCAARAFsDASIAAhEBAxEB/8QAHwAAAQUBAQEBAQEAAAAAAAAAAAECAwQFBgcICQoL/8QAtRAA"
        "AgEDAwIEAwUFBAQAAAF9AQIDAAQRBRIhMUEGE1FhByJxFDKBkaEII0KxwRVS0fAkM2JyggkKFhcYGRolJicoKSo0NTY3ODk6"
        "Q0RFRkdISUpTVFVWV1hZWmNkZWZnaGlqc3R1dnd4eXqDhIWGh4iJipKTlJWWl5iZmqKjpKWmp6ipqrKztLW2t7i5usLDxMXG"
        "x8jJytLT1NXW19jZ2uHi4+Tl5ufo6erx8vP09fb3+Pn6/8QAHwEAAwEBAQEBAQEBAQAAAAAAAAECAwQFBgcICQoL/8QAtREA"
        "AgECBAQDBAcFBAQAAQJ3AAECAxEEBSExBhJBUQdhcRMiMoEIFEKRobHBCSMzUvAVYnLRChYkNOEl8RcYGRomJygpKjU2Nzg5"
        "OkNERUZHSElKU1RVVldYWVpjZGVmZ2hpanN0dXZ3eHl6goOEhYaHiImKkpOUlZaXmJmaoqOkpaanqKmqsrO0tba3uLm6wsPE"
        "xcbHyMnK0tPU1dbX2Nna4uPk5ebn6Onq8vP09fb3+Pn6/9oADAMBAAIRAxEAPwD4HtPhXux+5/Stqz+Ee7H7n9K+qtL+Fe7H"
        "7n9K67S/hHu2/uP0r53IcX/attb3PxChx/yfbPkK0+De7H7j9K2rT4Jbsf6P+lfXjfDuDTWEX2YzT4zsXgD6ntU9t8NL+9I4"
        "MS5B2xLtxx69f1r7SvjsiwFX6rJOtWWjjBX5X/ek7Jdmldp7pH2OC4+qySlz2XqfKcXwSihUNLGkSk43PgDP41ei+EOnxMFY"
        "oSRn5FLD8wDX1hB8HbWy2eeqxk9F25P1wOccVp2nw0Q8QaazZHDScYP0Gcj8a4K2dYGi+SeHpU5/ytyqy+cYKLV+l0kfd4Lj"
        "yTs/aN/h+Z8nRfCSwTbtgkmz/cj6fnitW0+EVk2P9An/AO/a/wCNfWcfwxuIlRpFhtBgnhBlvwOc/h61etfhku4MHupixJPl"
        "AqB+Bx+lcdXPsFTrcs6MIvT3XCEdGltGU5VHvrdeex91guPJNK1R/f8A0j5PtPg9ux/xKP8Ax/8A+xrTg+ElrG+ySwiRx1Vp"
        "gCP0r6rtvhIIoQx06KAkgB5X+XP5D371qw/C8YKBIVdecwQlt3HTJyK8R8Q0aUFzQino9Y09d9Ep0aTvpda2t36fe4Pjtt/H"
        "+L/zZ8pL8JbRYGZLSBWGOfM39/QDJqVfhRFtH+jwf+A8lfXsPwwk+ysWhmUccsiRjr/eHIq7H8L8oPl/8nP/AK1cWLz3D1q0"
        "bQjH3U7OnZ7vX937v36/Kx9vhOPGofH+P+Z4jo/8Ndzo/wDDRRXH4dfYP8SkZOj/AMNd1o/UUUV5fh39g+7Rk6N0Wu50foKK"
        "K8rw6+wfeIytH/hrudH/AIaKK8vw6+wfeIytH/hrudH/AIaKK8vw6+wfdoydH/hrq4v9Wv0oor5jgz/dfkfeo//Z"
    ),
}


# ---- read once per group on CUDA ----------------------------------------------------------------------------
def _share_on_cuda_rank(rank, world_size, files, backend):
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    from dali_mesh.source import NumpySource
    from dali_mesh.torch import MeshLoader

    device = rank if backend == "nccl" else 0  # one GPU: both ranks on it, gloo staged through the host
    torch.cuda.set_device(device)
    mesh = init_device_mesh("cuda", (world_size,), mesh_dim_names=("mp",))
    layout = Layout(MeshInfo.from_device_mesh(mesh), shard={"mp": 1}, halo={1: 2}, boundary={1: "periodic"})
    out = {}
    for share in (None, "group"):
        src = NumpySource(files, layout, batch_size=1, shuffle=True, seed=2, share=share)

        @pipeline_def(batch_size=1, num_threads=1, device_id=device)
        def pipe():
            return dfn.read_windows(src, device="gpu", fallback=False)

        loader = MeshLoader(pipe(), layout, device_mesh=mesh)
        batches = []
        for b in loader:
            assert b["window"].is_cuda, b["window"].device
            batches.append((b["window"].cpu().numpy(), b["sample_id"].tolist()))
        if share:
            assert loader._exchange.stats["transport"] == "collective", loader._exchange.stats
        loader.close()
        out[share] = batches
    assert len(out[None]) == len(out["group"]) == len(files)
    region = layout.region(np.load(files[0]).shape)
    for (wi, ii), (wg, ig) in zip(out[None], out["group"]):
        assert ii == ig
        np.testing.assert_array_equal(wg, wi)
        np.testing.assert_array_equal(wg[0], take_window(np.load(files[ig[0]]), region))


def test_share_group_on_cuda(tmp_path):
    """share="group" with the windows in GPU memory: 2 ranks, NCCL with a GPU each (2 GPUs or more), else
    both on the one GPU over gloo (the exchange staged through the host); equal to independent reading
    and to numpy."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    from dali_mesh.cli.launch import run_ranks

    files = _int_files(tmp_path, 6, (2, 12, 8))
    backend = "nccl" if torch.cuda.device_count() >= 2 else "gloo"
    run_ranks(_share_on_cuda_rank, 2, tmp_path, files, backend, timeout_s=240, backend=backend)
