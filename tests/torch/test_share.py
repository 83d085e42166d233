"""Read once per group (share="group", issue 17) on real processes over gloo: every member reads its
batches' group window and the windows are exchanged; each rank's batches equal independent reading
and numpy's take_window of the whole sample, over two epochs, for whole-field and band Zarr chunks
(Blosc), .npy files, gzip HDF5, a forecast, a dataset of variables, halos under every boundary rule, the windows moved through shared memory (one host) and by all_to_all_single (gloo); a
checkpoint taken inside a group step resumes exactly; a corrupt chunk in one member's
share raises on every member, naming the rank and the file; a killed member makes the others raise
within the process group's timeout."""
from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("nvidia.dali")
pytest.importorskip("zarr")
h5py = pytest.importorskip("h5py")

from dali_mesh.cli.launch import RankFailure, run_ranks  # noqa: E402
from tests.storage.s3_server import s3_endpoint, s3_env  # noqa: E402, F401

T, C, H, W = 10, 2, 13, 16
BATCH = 2


def _data(root):
    """The same float32 samples (T, C, H, W) as Zarr v2 with whole-field and band Blosc chunks, .npy
    files and a gzip-chunked HDF5 dataset."""
    import zarr
    from numcodecs import Blosc

    rng = np.random.default_rng(0)
    data = np.round(rng.standard_normal((T, C, H, W)), 2).astype("f4")
    paths = {}
    for kind, chunks in (("whole", (1, C, H, W)), ("band", (1, C, 4, W))):
        path = os.path.join(root, f"{kind}.zarr")
        z = zarr.create_array(path, shape=data.shape, chunks=chunks, dtype="f4", zarr_format=2,
                              compressors=[Blosc("lz4", 5, Blosc.SHUFFLE)])
        z[:] = data
        paths[kind] = path
    npy = []
    for t in range(T):
        npy.append(os.path.join(root, f"s{t}.npy"))
        np.save(npy[-1], data[t])
    paths["npy"] = npy
    paths["h5"] = os.path.join(root, "d.h5")
    with h5py.File(paths["h5"], "w") as f:
        f.create_dataset("fields", data=data, chunks=(1, 1, 7, W), compression="gzip", shuffle=True)
    np.save(os.path.join(root, "all.npy"), data)
    return paths


def _source(kind, paths, layout, batch_size=BATCH, **kw):
    from dali_mesh import HDF5Source, NumpySource, ZarrSource

    if kind == "npy":
        return NumpySource(paths["npy"], layout, batch_size=batch_size, **kw)
    if kind == "h5":
        return HDF5Source([paths["h5"]], "fields", layout, batch_size=batch_size, **kw)
    return ZarrSource([paths[kind]], None, layout, batch_size=batch_size, **kw)


def _make(source):
    from nvidia.dali import pipeline_def

    from dali_mesh.fn import read_windows

    def make(checkpoint=None):
        @pipeline_def(batch_size=source.batch_size, num_threads=1, device_id=None, enable_checkpointing=True,
                      prefetch_queue_depth=1)
        def pipe():
            return read_windows(source, fallback=False)

        return pipe(checkpoint=checkpoint)

    return make


def _epoch(loader, names):
    out = []
    for batch in loader:
        out.append({n: batch[n].clone() for n in names + ("sample_id", "is_pad")})
    loader.reset()
    return out


def _equal(a, b, what):
    assert len(a) == len(b) > 0, (what, len(a), len(b))
    for i, (x, y) in enumerate(zip(a, b)):
        for n in x:
            assert x[n].dtype == y[n].dtype and x[n].shape == y[n].shape, (what, i, n, x[n].shape, y[n].shape)
            assert bool((x[n] == y[n]).all()), (what, i, n)


def _oracle(batches, data, source):
    from dali_mesh.partition import take_window

    fc, region = getattr(source, "forecast", None), source.region
    for b in batches:
        for j, sid in enumerate(b["sample_id"].tolist()):
            t = source.step_of(sid) if fc is not None else sid
            if fc is None:
                np.testing.assert_array_equal(b["window"][j].numpy(), take_window(data[t], region))
            else:
                want = np.stack([take_window(data[t + d], region) for d in range(-fc.history, 1)])
                np.testing.assert_array_equal(b["input"][j].numpy(), want)
                np.testing.assert_array_equal(b["target"][j].numpy(), take_window(data[t + 1], region)[None])


def _group_rank(rank, world_size, root, paths, mesh_shape, names, shard, batch, batch_size, transport, full=None):
    os.environ["DALI_MESH_SHARE_SHM"] = "1" if transport == "shm" else "0"
    from torch.distributed.device_mesh import init_device_mesh

    from dali_mesh import ForecastSpec, Layout, MeshInfo
    from dali_mesh.torch import MeshLoader

    data = np.load(os.path.join(root, "all.npy"))
    mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)
    info = MeshInfo.from_device_mesh(mesh)
    # every boundary rule on the split axis (halo 2: it crosses the member that reads the sample)
    rules = {"whole": ("reflect", "periodic"), "band": ("constant", "edge"), "npy": ("symmetric", "periodic"),
             "h5": ("periodic", "reflect")}
    full = world_size == 4 if full is None else full  # every source, forecasts, a dataset, a corrupt chunk
    kinds = ("whole", "band", "npy", "h5") if full else ("whole",)
    for kind in kinds:
        layout = Layout(info, shard=shard, batch=batch, halo={1: 2, 2: 1}, boundary=dict(zip((1, 2), rules[kind])),
                        fill_value=-3)
        forecasts = (None, ForecastSpec(1, 1)) if kind in ("whole", "h5") and full else (None,)
        for fc in forecasts:
            kw = {} if fc is None else {"forecast": fc}
            names_out = ("window",) if fc is None else ("input", "target")
            shared = _source(kind, paths, layout, batch_size, share="group", seed=3, **kw)
            plain = _source(kind, paths, layout, batch_size, seed=3, **kw)
            assert shared.group[0] == 4 and len(shared) == len(plain), (shared.group, len(shared), len(plain))
            maps = names_out + ("sample_id", "is_pad")
            lg = MeshLoader(_make(shared), layout, device_mesh=mesh, output_map=maps)
            li = MeshLoader(_make(plain), layout, device_mesh=mesh, output_map=maps)
            for epoch in range(2):
                got, want = _epoch(lg, names_out), _epoch(li, names_out)
                assert lg._exchange.stats["transport"] == transport, lg._exchange.stats
                _equal(got, want, f"{kind} forecast {fc} epoch {epoch} rank {rank}")
                _oracle(got, data, plain)
            if kind == "whole" and fc is None and full:
                # a checkpoint inside a group step (batch 3 of 5: step 0 holds batches 0..3) resumes exactly
                everything = _epoch(li, names_out)  # epoch 2, read independently
                first = [{n: b[n].clone() for n in maps} for b in (next(lg), next(lg), next(lg))]
                state = lg.state_dict()
                assert state["group_step"] == 0 and state["group_skip"] == 3, state
                rest = [{n: b[n].clone() for n in maps} for b in lg]
                _equal(first + rest, everything, "epoch 2")
                lg.load_state_dict(state)
                again = [{n: b[n].clone() for n in maps} for b in lg]
                _equal(again, rest, "resumed")
                # a checkpoint after the epoch's last batch: the resumed loader ends the epoch, then
                # reads the next one as independent reading does
                lg.reset()
                li_next = _epoch(li, names_out)  # epoch 3
                taken = [{n: b[n].clone() for n in maps} for b in (next(lg) for _ in range(len(li_next)))]
                state = lg.state_dict()
                lg.load_state_dict(state)
                with pytest.raises(StopIteration):
                    next(lg)
                lg.reset()
                _equal(taken, li_next, "epoch 3")
                _equal(_epoch(lg, names_out), _epoch(li, names_out), "epoch 4 after a resume at an epoch's end")
            lg.close()
            li.close()
    if not full:
        return
    # a dataset of variables (read_dataset: one operator, normalised) in group mode
    _dataset_case(rank, root, mesh, layout)
    # a corrupt chunk in batch 2 (samples 4, 5 without shuffle), read by member 2 only: every member
    # raises, naming rank 2 and the chunk's file
    from dali_mesh.torch.group_exchange import GroupReadError

    bad = _source("band", {"band": os.path.join(root, "bad.zarr")}, layout, share="group", shuffle=False)
    loader = MeshLoader(_make(bad), layout, device_mesh=mesh)
    try:
        next(loader)
    except GroupReadError as e:
        assert "rank 2 of the read group [0, 1, 2, 3] failed to read batch 2" in str(e), e
        assert "bad.zarr" in str(e) and "4.0.1.0" in str(e), e
    else:
        raise AssertionError("a corrupt chunk in member 2's share was read without an error")
    loader.close()


def _dataset_case(rank, root, mesh, layout):
    import xarray as xr

    from nvidia.dali import pipeline_def

    from dali_mesh import Layout
    from dali_mesh import ZarrDatasetSource
    from dali_mesh.fn import read_dataset
    from dali_mesh.partition import take_window
    from dali_mesh.torch import MeshLoader

    ds = xr.open_zarr(os.path.join(root, "ds.zarr"), consolidated=False)
    dl = Layout(layout.mesh, shard={"mp": 1}, halo={1: 1, 2: 2}, boundary={2: "periodic"})
    mean, std = np.array([0.5, -1.0, 2.0]), np.array([2.0, 1.5, 0.5])
    out = {}
    for share in (None, "group"):
        src = ZarrDatasetSource(os.path.join(root, "ds.zarr"), ["t2m", ("z", [850, 500])], dl, batch_size=BATCH,
                                share=share, mean=mean, std=std, seed=1)

        def make(checkpoint=None, src=src):
            @pipeline_def(batch_size=BATCH, num_threads=1, device_id=None, enable_checkpointing=True)
            def pipe():
                return read_dataset(src, fallback=False)

            return pipe(checkpoint=checkpoint)

        loader = MeshLoader(make, dl, device_mesh=mesh)
        out[share] = _epoch(loader, ("window",))
        loader.close()
    _equal(out["group"], out[None], f"dataset rank {rank}")
    # DTensor output of a read group: the halo stripped after the exchange, the global batch gathered
    loader = MeshLoader(make, dl, device_mesh=mesh, output="dtensor", sample_shape=src.sample_shape)
    batch = next(loader)
    full = batch["window"].full_tensor().numpy()
    for j, t in enumerate(batch["sample_id"].tolist()):
        fields = np.stack([ds["t2m"].values[t], ds["z"].sel(level=850).values[t], ds["z"].sel(level=500).values[t]])
        np.testing.assert_allclose(full[j], (fields - mean[:, None, None]) / std[:, None, None], rtol=2e-6, atol=2e-6)
    loader.close()
    for b in out["group"]:
        for j, t in enumerate(b["sample_id"].tolist()):
            full = np.stack([ds["t2m"].values[t], ds["z"].sel(level=850).values[t], ds["z"].sel(level=500).values[t]])
            want = (take_window(full.astype("f8"), src.region) - mean[:, None, None]) / std[:, None, None]
            np.testing.assert_allclose(b["window"][j].numpy(), want, rtol=2e-6, atol=2e-6)


def _write_dataset(root):
    import pandas as pd
    import xarray as xr

    rng = np.random.default_rng(1)
    ds = xr.Dataset({"t2m": (("time", "lat", "lon"), rng.standard_normal((T, H, W)).astype("f4")),
                     "z": (("time", "level", "lat", "lon"), rng.standard_normal((T, 2, H, W)).astype("f4"))},
                    coords={"time": pd.date_range("2020-01-01", periods=T, freq="6h"), "level": [500, 850]})
    ds.to_zarr(os.path.join(root, "ds.zarr"), zarr_format=2, mode="w", consolidated=False,
               encoding={"t2m": {"chunks": (1, H, W)}, "z": {"chunks": (1, 2, H, W)}})


def _corrupt_copy(paths, root):
    import shutil

    bad = os.path.join(root, "bad.zarr")
    shutil.copytree(paths["band"], bad)
    chunk = os.path.join(bad, "4.0.1.0")  # sample 4, rows 4..7: read by member 2 (batch 2) only
    raw = open(chunk, "rb").read()
    open(chunk, "wb").write(raw[:10])  # shorter than a Blosc header: a corrupt stream


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_group_reads_equal_independent_reads_on_4_ranks(tmp_path):
    pytest.importorskip("xarray")
    root = str(tmp_path)
    paths = _data(root)
    _write_dataset(root)
    _corrupt_copy(paths, root)
    run_ranks(_group_rank, 4, tmp_path, root, paths, (4,), ("mp",), {"mp": 1}, None, BATCH, "shm", timeout_s=360)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_group_reads_with_a_batch_dim_and_a_replica_dim_on_8_ranks(tmp_path):
    """(dp, mp, tp) = (2, 2, 2): dp splits the batch, mp the latitude, tp replicates: groups of 4; the
    windows moved by all_to_all_single over gloo (shared memory off), as between hosts."""
    root = str(tmp_path)
    paths = _data(root)
    run_ranks(_group_rank, 8, tmp_path, root, paths, (2, 2, 2), ("dp", "mp", "tp"), {"mp": 1}, "dp", 1,
              "collective", timeout_s=260)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_group_reads_with_a_replica_dim_on_a_2x2_mesh(tmp_path):
    """(mp, tp) = (2, 2), batch=(): mp splits the latitude, tp replicates it (two members take each
    window): one group of 4 reading each sample once, windows through shared memory; two epochs equal
    independent reading and the numpy oracle."""
    root = str(tmp_path)
    paths = _data(root)
    run_ranks(_group_rank, 4, tmp_path, root, paths, (2, 2), ("mp", "tp"), {"mp": 1}, (), BATCH, "shm", False,
              timeout_s=260)


def _lost_member_rank(rank, world_size, root, paths, how="kill", within=15):
    """Group step 0 read by all; then member 3 is killed (SIGKILL) or stopped (SIGSTOP): the others
    must raise at group step 1 within ``within`` seconds. A stopped member is then killed by rank 0
    (the launcher's leaving barrier would wait the process group's timeout for it again)."""
    from torch.distributed.device_mesh import init_device_mesh

    from dali_mesh import Layout, MeshInfo
    from dali_mesh.torch import MeshLoader

    mesh = init_device_mesh("cpu", (4,), mesh_dim_names=("mp",))
    layout = Layout(MeshInfo.from_device_mesh(mesh), shard={"mp": 1})
    src = _source("whole", paths, layout, share="group")
    loader = MeshLoader(_make(src), layout, device_mesh=mesh, timeout=60)
    for _ in range(4):  # group step 0 (one collective, then the rest of the step's batches)
        next(loader)
    pid_file = os.path.join(root, "lost.pid")
    if rank == 3:
        with open(pid_file, "w") as f:
            f.write(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL if how == "kill" else signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        next(loader)  # group step 1: member 3 is gone or stopped
    except Exception as e:  # noqa: BLE001 - the backend's error
        elapsed = time.monotonic() - t0
        assert elapsed < within, f"raised after {elapsed:.1f} s: {e}"
    else:
        raise AssertionError("a group step went on without member 3")
    if rank == 0 and how == "stop":
        os.kill(int(open(pid_file).read()), signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_killed_member_makes_the_others_raise_within_the_timeout(tmp_path):
    paths = _data(str(tmp_path))
    with pytest.raises(RankFailure) as info:  # rank 3's own death; the others raised and reported ok
        run_ranks(_lost_member_rank, 4, tmp_path, str(tmp_path), paths, timeout_s=20, grace_s=15)
    text = str(info.value)
    assert "--- rank 3 ---" in text and "exit code -9" in text, text
    assert "--- rank 0 ---" not in text and "--- rank 1 ---" not in text and "--- rank 2 ---" not in text, text


def test_shared_slots_are_private_and_refuse_what_does_not_fit():
    """The shared-memory buffers of a read group: this user's, mode 0600, gone from /dev/shm once
    unlinked (the mappings stay); one larger than /dev/shm can hold fails with OSError when it is made
    (the group then moves the windows by collectives), not with SIGBUS at a later write, and leaves
    no file behind."""
    import stat

    import torch

    from dali_mesh.torch.group_exchange import _SharedSlots

    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    token = os.urandom(8).hex()
    slots = _SharedSlots(token, 0, 1, 4096)
    st = os.stat(slots.paths[0])
    assert st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o600 and st.st_size == 8192
    batch = {"window": torch.arange(1024, dtype=torch.float32).reshape(1, 32, 32)}
    layout = {"window": (0, (1, 32, 32))}  # (offset, shape) in elements
    slots.write(1, batch, layout, torch.float32)
    _SharedSlots.unlink_all(token, 1)
    assert not os.path.exists(slots.paths[0])
    view = slots.view(0, 1, *layout["window"], torch.float32)
    assert torch.equal(view, batch["window"])  # the mapping outlives the name
    free = os.statvfs("/dev/shm")
    too_big = free.f_bavail * free.f_frsize + (1 << 30)
    with pytest.raises(OSError):
        _SharedSlots(token + "x", 0, 1, too_big)
    assert not os.path.exists(f"/dev/shm/dali_mesh_share_{os.getuid()}_{token}x_0")


def test_group_reader_reads_the_group_window_of_its_members_batches(tmp_path):
    """What a member's pipeline reads, without DALI (the path partitioned_source's workers take): the
    group reader's epoch is the batches b = index, index + G, ... of the group's order, and each sample
    is take_window of the whole sample over the group window; every member's window lies in it."""
    from dali_mesh import ForecastSpec, Layout, MeshInfo
    from dali_mesh.partition import take_window
    from dali_mesh.partition.read_groups import group_cut, group_region

    paths = _data(str(tmp_path))
    data = np.load(tmp_path / "all.npy")
    for kind, fc in (("npy", None), ("whole", ForecastSpec(1, 1)), ("h5", None)):
        for g in range(4):
            layout = Layout(MeshInfo((4,), ("mp",), (g,)), shard={"mp": 1}, halo={1: 3, 2: 1},
                            boundary={1: "symmetric", 2: "periodic"})
            kw = {} if fc is None else {"forecast": fc}
            src = _source(kind, paths, layout, share="group", seed=5, **kw)
            reader = src.group_reader()
            assert reader is not src and reader.group_reader() is reader and src.group == (4, g)
            full_ids, full_pads = src.order(1)
            ids, pads = reader.order(1)
            nb = len(full_ids) // BATCH
            want = np.concatenate([full_ids[b * BATCH:(b + 1) * BATCH] for b in range(g, nb, 4)])
            np.testing.assert_array_equal(ids, want)
            assert [reader.sample_order(1)[i][0] for i in range(len(ids))] == ids.tolist()
            gw = group_region(layout, src.sample_shape, ("mp",))
            assert reader.region == gw
            for m in range(4):  # every member's window is a box of the group window
                cut = group_cut(gw, layout.region(src.sample_shape, (m,)))
                assert cut is not None
            sid = int(ids[0])
            got = reader.read_sample(sid)[0]
            t = src.step_of(sid) if fc is not None else sid
            expect = take_window(data[t], gw) if fc is None else np.stack([take_window(data[t + d], gw)
                                                                             for d in (-1, 0)])
            np.testing.assert_array_equal(got, expect)
            own = src.read_sample(sid)[0]  # the source itself still reads this rank's window
            assert own.shape[-3:] == layout.region(src.sample_shape).window_shape


# ---- members that disagree, a stopped member, a member dying during set-up (issue 29 items 6, 9, 10, 13)
def _mismatch_rank(rank, world_size, root, paths):
    """Each case builds rank 3 otherwise than the others: every rank must raise GroupReadError naming
    rank 3 and the field at its first batch, before any data moves (no rank may finish its epoch, none
    may die in gloo on mismatched sizes)."""
    from torch.distributed.device_mesh import init_device_mesh

    from dali_mesh import Layout, MeshInfo
    from dali_mesh.torch import MeshLoader
    from dali_mesh.torch.group_exchange import GroupReadError

    mesh = init_device_mesh("cpu", (4,), mesh_dim_names=("mp",))
    info = MeshInfo.from_device_mesh(mesh)
    odd = rank == 3
    base = dict(shard={"mp": 1}, halo={1: 1})
    cases = {  # name -> (source kind, layout kwargs, source kwargs, what the message names)
        "seed": ("whole", base, {"seed": 4 if odd else 3}, "seed"),
        "shuffle": ("whole", base, {"shuffle": not odd}, "shuffle"),
        "store": ("band" if odd else "whole", base, {}, "files"),
        "batch size": ("whole", base, {"batch_size": 1 if odd else BATCH}, "batch_size"),
        "halo": ("whole", dict(base, halo={1: 2 if odd else 1}), {}, "halo"),
    }
    for name, (kind, lkw, skw, field) in cases.items():
        layout = Layout(info, **lkw)
        src = _source(kind, paths, layout, share="group", **skw)
        loader = MeshLoader(_make(src), layout, device_mesh=mesh)
        try:
            next(loader)
        except GroupReadError as e:
            assert "rank 3 differs from rank 0" in str(e) and field in str(e), (name, str(e))
        else:
            raise AssertionError(f"{name}: members built otherwise were read together")
        finally:
            loader.close()
    # a member resumed from a later group step than the others (batches of 1: steps 0..2 of 4, 4, 2)
    layout = Layout(info, **base)
    src = _source("whole", paths, layout, share="group", batch_size=1)
    loader = MeshLoader(_make(src), layout, device_mesh=mesh)
    for _ in range(4):  # group step 0
        next(loader)
    early = loader.state_dict()
    for _ in range(4):  # group step 1
        next(loader)
    late = loader.state_dict()
    assert (early["group_step"], late["group_step"]) == (1, 2)
    loader.load_state_dict(late if odd else early)
    try:
        next(loader)
    except GroupReadError as e:
        assert "group_step: rank 0 1, rank 3 2" in str(e), str(e)
    else:
        raise AssertionError("members resumed at different group steps were read together")
    finally:
        loader.close()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_members_that_would_read_otherwise_raise_on_every_member(tmp_path):
    paths = _data(str(tmp_path))
    run_ranks(_mismatch_rank, 4, tmp_path, str(tmp_path), paths, timeout_s=60)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_stopped_member_makes_the_others_raise_within_the_process_groups_timeout(tmp_path):
    """Item 9: the read group's process group takes init_process_group's timeout (20 s here: the
    launcher's half): the members of a group with a stopped member raise within it, not after torch's
    30 minutes; the stopped member is killed at the launcher's deadline."""
    paths = _data(str(tmp_path))
    with pytest.raises(RankFailure) as info:  # rank 3 is stopped until the launcher's deadline kills it
        run_ranks(_lost_member_rank, 4, tmp_path, str(tmp_path), paths, "stop", 30, timeout_s=40, grace_s=20)
    text = str(info.value)
    assert "--- rank 3 ---" in text and "exit code -9" in text, text
    assert "--- rank 0 ---" not in text and "--- rank 1 ---" not in text and "--- rank 2 ---" not in text, text


def _dies_in_setup_rank(rank, world_size, root, paths, token_file):
    from torch.distributed.device_mesh import init_device_mesh

    from dali_mesh import Layout, MeshInfo
    from dali_mesh.torch import MeshLoader
    from dali_mesh.torch import group_exchange

    mesh = init_device_mesh("cpu", (4,), mesh_dim_names=("mp",))
    layout = Layout(MeshInfo.from_device_mesh(mesh), shard={"mp": 1})
    src = _source("whole", paths, layout, share="group")
    made = group_exchange._SharedSlots.__init__

    def make_then_die(self, token, index, size, slot_bytes):
        made(self, token, index, size, slot_bytes)
        with open(token_file, "w") as f:
            f.write(token)
        if rank == 3:
            os.kill(os.getpid(), signal.SIGKILL)  # its buffer made, before the members have mapped it

    group_exchange._SharedSlots.__init__ = make_then_die
    loader = MeshLoader(_make(src), layout, device_mesh=mesh)
    try:
        next(loader)
    except Exception:  # noqa: BLE001, S110 - the backend's error: member 3 is gone
        pass
    else:
        raise AssertionError("the first group step went on without member 3")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_no_shared_memory_is_left_when_a_member_dies_during_set_up(tmp_path):
    """Item 13: a member killed between making its shared-memory buffer and the first exchange: the
    others raise, and no member's buffer is left in /dev/shm (the survivors unlink every member's)."""
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    paths = _data(str(tmp_path))
    token_file = str(tmp_path / "token")
    with pytest.raises(RankFailure) as info:
        run_ranks(_dies_in_setup_rank, 4, tmp_path, str(tmp_path), paths, token_file, timeout_s=20, grace_s=15)
    assert "--- rank 3 ---" in str(info.value) and "--- rank 0 ---" not in str(info.value), str(info.value)
    token = open(token_file).read().strip()
    left = [n for n in os.listdir("/dev/shm") if token in n]
    assert not left, left


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_group_reads_from_s3_equal_independent_reads_on_4_ranks(tmp_path, s3_env):
    """share="group" over S3 (a moto server on 127.0.0.1): each whole-field Blosc chunk is fetched once
    per group, and every member's windows equal the local oracle's, under two boundary rules."""
    from tests.storage.s3_server import upload

    root = str(tmp_path)
    paths = _data(root)
    remote = {"whole": upload(s3_env, paths["whole"], "data", "share/whole.zarr")}
    run_ranks(_group_rank, 4, tmp_path, root, remote, (4,), ("mp",), {"mp": 1}, None, BATCH, "shm", False,
              timeout_s=240)


def _read_only_shm_rank(rank, world_size, root, paths):
    """A member whose /dev/shm is read-only: making a group buffer there and unlinking one both fail with
    EROFS, as the kernel answers on a read-only mount (root ignores modes, so the test cannot make one)."""
    import errno

    from torch.distributed.device_mesh import init_device_mesh

    from dali_mesh import Layout, MeshInfo
    from dali_mesh.torch import MeshLoader

    real_open, real_unlink = os.open, os.unlink

    def refuse(call):
        def wrapped(path, *args, **kw):
            if str(path).startswith("/dev/shm/dali_mesh_share_"):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
            return call(path, *args, **kw)
        return wrapped

    os.open, os.unlink = refuse(real_open), refuse(real_unlink)
    os.environ["DALI_MESH_SHARE_SHM"] = "1"
    data = np.load(os.path.join(root, "all.npy"))
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("mp",))
    layout = Layout(MeshInfo.from_device_mesh(mesh), shard={"mp": 1}, halo={1: 1}, boundary="periodic")
    shared = _source("whole", paths, layout, share="group", seed=1)
    loader = MeshLoader(_make(shared), layout, device_mesh=mesh)
    got = _epoch(loader, ("window",))
    assert loader._exchange.stats["transport"] == "collective", loader._exchange.stats
    _oracle(got, data, _source("whole", paths, layout, seed=1))
    loader.close()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_read_only_dev_shm_falls_back_to_the_collectives(tmp_path):
    """Issue 40, finding 12: with /dev/shm read-only (EROFS at every create and unlink) a read group's
    first step neither fails nor hangs: the members exchange through the collectives, windows right."""
    paths = _data(str(tmp_path))
    run_ranks(_read_only_shm_rank, 2, tmp_path, str(tmp_path), paths, timeout_s=90)


def _slot_turns_rank(rank, world_size, root, paths, flag):
    """Two members, one group step per epoch (two batches of 5): member 0 reads epoch 1's first batch
    into its shared-memory slot while member 1 is still to copy epoch 0's out of it (member 1's copy
    waits until member 0's second write is done). Each rank's two epochs must equal numpy's windows of
    the samples named: the step counts from 0 again each epoch, so a slot chosen by the step would be
    written twice in a row and member 1 would get epoch 1's windows for epoch 0's samples."""
    from torch.distributed.device_mesh import init_device_mesh

    from dali_mesh import Layout, MeshInfo
    from dali_mesh.torch import MeshLoader, group_exchange

    os.environ["DALI_MESH_SHARE_SHM"] = "1"
    data = np.load(os.path.join(root, "all.npy"))
    if rank == 0:
        write = group_exchange._SharedSlots.write
        writes = []

        def write_then_flag(self, *a, **k):
            write(self, *a, **k)
            writes.append(1)
            if len(writes) == 2:
                open(flag, "w").close()

        group_exchange._SharedSlots.write = write_then_flag
    else:
        read = group_exchange.GroupExchange._read_shm
        reads = []

        def wait_then_read(self, *a, **k):
            reads.append(1)
            deadline = time.monotonic() + 30
            while len(reads) == 1 and not os.path.exists(flag) and time.monotonic() < deadline:
                time.sleep(0.01)
            return read(self, *a, **k)

        group_exchange.GroupExchange._read_shm = wait_then_read
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("mp",))
    layout = Layout(MeshInfo.from_device_mesh(mesh), shard={"mp": 1}, halo={1: 1})
    src = _source("npy", paths, layout, batch_size=5, share="group", seed=3)
    plain = _source("npy", paths, layout, batch_size=5, seed=3)
    loader = MeshLoader(_make(src), layout, device_mesh=mesh, output_map=("window", "sample_id", "is_pad"))
    epochs = [_epoch(loader, ("window",)) for _ in range(2)]
    assert loader._exchange.stats["transport"] == "shm", loader._exchange.stats
    assert os.path.exists(flag), "member 0 never wrote epoch 1's batch"
    firsts = [e[0]["sample_id"].tolist() for e in epochs]
    assert firsts[0] != firsts[1], firsts  # else epoch 1's windows would equal epoch 0's and prove nothing
    for batches in epochs:
        _oracle(batches, data, plain)


@pytest.mark.timeout(200)
def test_a_member_copying_out_late_gets_its_epochs_windows_not_the_next_ones(tmp_path):
    root = str(tmp_path)
    paths = _data(root)
    run_ranks(_slot_turns_rank, 2, tmp_path, root, paths, os.path.join(root, "written"), timeout_s=150)


def _rows_rank(rank, world_size, root, paths, transport):
    """rows= in read groups on a (graph=2, tp=2) mesh whose rows depend on the graph coordinate:
    - shared over tp, given this rank's rows (the members read the same rows), or over both dims given
      every member's rows (``rows={coordinate: Rows}``: the group reads the union once), each rank's
      batches equal independent reading and numpy's ``x[t][:, ids]``, in its own rows' order, each
      member reading its share of the batches;
    - shared over both dims given only this rank's rows (members with other rows), every rank raises
      before any data moves, naming the rows."""
    os.environ["DALI_MESH_SHARE_SHM"] = "1" if transport == "shm" else "0"
    from torch.distributed.device_mesh import init_device_mesh

    from dali_mesh import Layout, MeshInfo, Rows
    from dali_mesh.torch import MeshLoader
    from dali_mesh.torch.group_exchange import GroupReadError

    data = np.load(os.path.join(root, "all.npy"))
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("graph", "tp"))
    info = MeshInfo.from_device_mesh(mesh)
    layout = Layout(info, batch=())
    by_graph = {0: np.array([12, 3, 4, 5, 0, 7]), 1: np.array([1, 2, 6, 8, 9, 10, 3])}  # 3: in both (a halo)
    table = {(g, t): Rows(by_graph[g], axis=1) for g in range(2) for t in range(2)}
    ids = by_graph[info.coordinate[0]]
    own = table[tuple(info.coordinate)]
    for kind, share, rows in (("whole", ["tp"], own), ("npy", ["tp"], own), ("whole", "group", table),
                              ("npy", "group", table), ("h5", "group", table)):
        shared = _source(kind, paths, layout, share=share, seed=3, rows=rows)
        plain = _source(kind, paths, layout, seed=3, rows=own)
        # the group reader reads the union of the members' rows (12 of 13: row 11 is nobody's), else its own
        assert shared.group_reader().sample_shape[1] == (12 if rows is table else len(ids))
        lg = MeshLoader(_make(shared), layout, device_mesh=mesh)
        li = MeshLoader(_make(plain), layout, device_mesh=mesh)
        for epoch in range(2):
            got, want = _epoch(lg, ("window",)), _epoch(li, ("window",))
            _equal(got, want, f"{kind} rows shared over {share}, epoch {epoch}")
            for b in got:
                for j, sid in enumerate(b["sample_id"].tolist()):
                    np.testing.assert_array_equal(b["window"][j].numpy(), data[sid][:, ids])
        stats = lg._group.exchange.stats  # each member read its share of the batches, then exchanged
        assert stats["steps"] > 0 and stats["bytes_received"] > 0, stats
        lg.close()
        li.close()
    bad = _source("whole", paths, layout, share="group", rows=own)
    loader = MeshLoader(_make(bad), layout, device_mesh=mesh)
    try:
        next(loader)
    except GroupReadError as e:
        assert "differs from rank" in str(e) and "rows" in str(e), str(e)
    else:
        raise AssertionError("members with other rows were read together")
    finally:
        loader.close()


@pytest.mark.timeout(400)
@pytest.mark.parametrize("transport", ["shm", "collective"])
def test_rows_in_read_groups(tmp_path, transport):
    root, paths = str(tmp_path), _data(str(tmp_path))
    run_ranks(_rows_rank, 4, tmp_path, root, paths, transport, timeout_s=360)
