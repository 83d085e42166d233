"""The example's premise: a valid convolution on each rank's window (halo = kernel // 2), then
pointwise layers, gives exactly the owned cells of the global same-padded (zeros) or circular-padded
convolution."""
import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from dali_mesh import Layout, MeshInfo  # noqa: E402
from dali_mesh.partition import take_window  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))


def wide_then_pointwise(x, wide, pointwise):
    x = F.conv2d(x, wide)
    for w in pointwise:
        x = F.conv2d(torch.relu(x), w)
    return x


def global_conv(x, wide, pointwise, periodic_lon):
    """Same-size network on the whole sample: zeros in latitude, zeros or circular in longitude."""
    k = wide.shape[-1] // 2
    x = F.pad(x, (k, k, 0, 0), mode="circular" if periodic_lon else "constant")
    x = F.pad(x, (0, 0, k, k), mode="constant")
    return wide_then_pointwise(x, wide, pointwise)


@pytest.mark.parametrize("periodic_lon", [False, True])
@pytest.mark.parametrize("mp,split", [(2, "chunk"), (3, "even"), (4, "physicsnemo"), (5, "chunk")])
@pytest.mark.parametrize("kernel", [3, 5, 7])
def test_valid_conv_on_windows_equals_global_conv(periodic_lon, mp, split, kernel):
    torch.manual_seed(kernel)
    c, h, w = 3, 13, 16
    sample = torch.randn(c, h, w, dtype=torch.float64)
    wide = torch.randn(8, c, kernel, kernel, dtype=torch.float64)
    pointwise = [torch.randn(8, 8, 1, 1, dtype=torch.float64), torch.randn(c, 8, 1, 1, dtype=torch.float64)]
    expected = global_conv(sample[None], wide, pointwise, periodic_lon)[0]
    halo = kernel // 2
    mesh = MeshInfo((mp,), ("model_parallel",))
    layout = Layout(mesh, shard={"model_parallel": 1}, halo={1: halo, 2: halo},
                    boundary={1: "constant", 2: "periodic" if periodic_lon else "constant"}, split=split)
    covered = 0
    for region in layout.regions((c, h, w)):
        if 0 in region.shape:
            continue
        window = torch.from_numpy(take_window(sample.numpy(), region))
        out = wide_then_pointwise(window[None], wide, pointwise)[0]
        owned = expected[:, region.start[1]:region.stop[1], :]
        torch.testing.assert_close(out, owned, rtol=0, atol=1e-9)
        covered += region.shape[1]
    assert covered == h


def test_example_model_eats_its_halo():
    from train_domain_parallel import TinyNet

    net = TinyNet(channels=4, kernel=5)
    assert net.halo == 2
    x = torch.randn(2, 4, 10 + 2 * net.halo, 20 + 2 * net.halo)
    assert net(x).shape == (2, 4, 10, 20)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_example_trains_under_torchrun(tmp_path):
    import re
    import subprocess

    script = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "train_domain_parallel.py")
    import signal

    # in a session of its own: on a timeout torchrun and both ranks are stopped together (killing torchrun
    # alone would leave the ranks running), and what they printed so far is in the failure
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                             "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", script,
                             "--data", str(tmp_path / "data"), "--steps", "3", "--mesh",
                             "data_parallel=1,model_parallel=2", "--periodic-lon"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=170)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"torchrun did not finish in 170 s\nstdout:\n{out[-3000:]}\nstderr:\n{err[-3000:]}")
    assert proc.returncode == 0, err[-3000:]
    losses = [float(v) for v in re.findall(r"step \d: loss ([0-9.]+)", out)]
    assert len(losses) == 3 and all(np.isfinite(losses))
    assert "owned (2, 4, 32, 128)" in out  # 64 rows over 2 ranks; the halo is eaten by the conv
