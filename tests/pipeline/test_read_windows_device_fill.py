"""The GPU read path's device-side halo fill, on the kernel's host emulation (no GPU needed).

read_windows(device="gpu") hands a plan's boundary program (copies and constant fills, done on the
host by FinishWindow) to the GPU strided-slice kernel when the program is one strided slice of the
cells read (DeviceFillProgram in csrc/reader/device_fill.cc). The test hook dali_mesh_check_device_fill
finishes a window of random bytes both ways, the kernel through its exact host emulation
(BuildGpuPlan + EmulateGpuPlan), and compares them byte for byte, for every plan of a plan file.
Plans the device cannot take (chained copies of halos wider than the axis) stay on the host.
"""
from __future__ import annotations

import numpy as np
import pytest

from dali_mesh import Layout
from dali_mesh.source import NumpySource

dali = pytest.importorskip("nvidia.dali")

from dali_mesh.plan import PlanSet  # noqa: E402
from dali_mesh.pipeline import native  # noqa: E402
from tests.helpers import SEED, random_array  # noqa: E402
from tests.helpers import check_gpu_epoch, dali_gpus, gpu_windows_pipeline, mesh_of  # noqa: E402


@pytest.fixture(scope="module")
def check():
    from dali_mesh import _kernels

    if not _kernels.library_path().exists():
        pytest.skip(f"{_kernels.library_path()} not built (pip install --no-build-isolation -e .)")

    def run(plan: PlanSet, directory) -> tuple[int, int]:
        # a mismatch or a refused plan raises KernelsError
        return _kernels.check_device_fill(plan.write(str(directory)), plan.dtype)

    return run


def _plan(tmp_path, shape, dtype, layout, *, fortran=False, n=1):
    rng = np.random.default_rng(SEED)
    files = []
    for i in range(n):
        a = random_array(rng, shape, dtype)
        files.append(str(tmp_path / f"s{i}.npy"))
        np.save(files[-1], np.asfortranarray(a) if fortran else a)
    return native.plan_source(NumpySource(files, layout, batch_size=1, shuffle=False))


MODES = ("constant", "reflect", "symmetric", "edge", "periodic")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("coord", [0, 1, 3])
def test_every_mode_at_every_band_is_filled_on_the_device(tmp_path, check, mode, coord):
    layout = Layout(mesh_of((1, 4), (0, coord)), shard={"m0": 1}, halo={1: 2, 2: 3}, boundary=mode, fill_value=-7)
    checked, host_only = check(_plan(tmp_path, (3, 12, 10), np.float32, layout), tmp_path / "p")
    assert (checked, host_only) == (1, 0)


@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.float16, np.int32, np.int64, np.uint64, np.float64, np.bool_])
def test_dtypes_and_fill_values(tmp_path, check, dtype):
    fill = 1 if dtype == np.bool_ else -3 if np.dtype(dtype).kind in "if" else 250
    layout = Layout(mesh_of((1, 2, 2), (0, 1, 0)), shard={"m0": 1, "m1": 2}, halo={0: 1, 1: 1, 2: 2},
                    boundary={0: "constant", 1: "symmetric", 2: "edge"}, fill_value=fill)
    checked, host_only = check(_plan(tmp_path, (4, 7, 6), dtype, layout), tmp_path / "p")
    assert (checked, host_only) == (1, 0)


def test_mixed_modes_crop_channels_and_fortran_order(tmp_path, check):
    layout = Layout(mesh_of((1, 3, 2), (0, 0, 1)), shard={"m0": 1, "m1": 2}, crop=(None, slice(1, 10), None),
                    halo={1: (3, 1), 2: 2}, boundary={1: "reflect", 2: "constant"}, split="even", fill_value=5)
    checked, host_only = check(_plan(tmp_path, (5, 11, 13), np.int32, layout, fortran=True), tmp_path / "p")
    assert (checked, host_only) == (1, 0)


@pytest.mark.parametrize("mode", MODES)
def test_halo_wider_than_the_axis_is_exact_where_the_device_takes_it(tmp_path, check, mode):
    # a halo of 9 on an axis of 4: the host program may chain copies (then it stays on the host);
    # whatever the device takes equals the host's result
    layout = Layout(mesh_of((1, 2), (0, 1)), shard={"m0": 1}, halo={0: 5, 1: 9}, boundary=mode, fill_value=3)
    checked, host_only = check(_plan(tmp_path, (3, 4), np.float32, layout), tmp_path / "p")
    assert checked + host_only == 1
    if mode in ("constant", "edge"):  # fills and edge copies never chain
        assert checked == 1


def test_empty_window_stays_on_the_host(tmp_path, check):
    layout = Layout(mesh_of((1, 3), (0, 2)), shard={"m0": 0}, halo={0: 1}, boundary="periodic")
    checked, host_only = check(_plan(tmp_path, (2, 5), np.float32, layout), tmp_path / "p")
    assert (checked, host_only) == (0, 1)


def test_many_layouts_against_the_host(tmp_path, check):
    rng = np.random.default_rng(SEED)
    total = 0
    for case in range(40):
        ndim = int(rng.integers(1, 4))
        shape = tuple(int(s) for s in rng.integers(1, 9, ndim))
        k = int(rng.integers(1, 4))
        axis = int(rng.integers(0, ndim))
        halo = {a: (int(rng.integers(0, 4)), int(rng.integers(0, 4))) for a in range(ndim)}
        boundary = {a: MODES[int(rng.integers(0, len(MODES)))] for a in range(ndim)}
        layout = Layout(mesh_of((1, k), (0, int(rng.integers(0, k)))), shard={"m0": axis}, halo=halo,
                        boundary=boundary, split=("chunk", "even", "physicsnemo")[case % 3], fill_value=-1)
        d = tmp_path / f"c{case}"
        d.mkdir()
        checked, host_only = check(_plan(d, shape, np.int16, layout), d / "p")
        assert checked + host_only == 1
        total += checked
    assert total >= 20  # most layouts take the device path


# ---- on a GPU: the mixed operator's windows (device fill, and host fill with DALI_MESH_DEVICE_FILL=0)
@pytest.mark.skipif(dali_gpus() == 0, reason="needs a CUDA GPU (DALI sees none)")
@pytest.mark.parametrize("device_fill", ["1", "0"])
@pytest.mark.parametrize("mode,dtype", [("constant", np.float32), ("reflect", np.int16), ("symmetric", np.float16),
                                        ("edge", np.uint8), ("periodic", np.float64)])
def test_gpu_windows_with_device_fill(tmp_path, monkeypatch, mode, dtype, device_fill):
    monkeypatch.setenv("DALI_MESH_DEVICE_FILL", device_fill)
    rng = np.random.default_rng(SEED)
    files = []
    for i in range(5):
        files.append(str(tmp_path / f"s{i}.npy"))
        np.save(files[-1], random_array(rng, (3, 17, 33), dtype))
    layout = Layout(mesh_of((1, 2, 2), (0, 0, 1)), shard={"m0": 1, "m1": 2}, halo={1: 3, 2: (2, 5)},
                    boundary={1: mode, 2: "edge" if mode == "periodic" else "periodic"}, fill_value=7)
    src = NumpySource(files, layout, batch_size=2, shuffle=True, seed=2)
    p = gpu_windows_pipeline(src, prefetch_queue_depth=2)
    for _ in range(2):  # two epochs: the scratch buffer and the launcher's ring are reused
        check_gpu_epoch(p, src, files)
        with pytest.raises(StopIteration):
            p.run()
        p.reset()
