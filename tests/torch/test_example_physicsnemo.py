"""examples/physicsnemo_era5_shardtensor.py on 4 gloo processes (torchrun): a small conv stack trained
on ShardTensors from the ERA5 drop-in has, at every step, the loss and the gradients of the same model
run on the whole fields (its --check), and the loss falls."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("h5py")
pytest.importorskip("physicsnemo.domain_parallel", reason="PhysicsNeMo is not installed (make test installs it)")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LINE = re.compile(r"step (\d+): loss ([\d.]+) .*whole-field model: loss ([\d.]+), largest gradient difference "
                  r"([\d.e+-]+)")


@pytest.mark.timeout(300)
def test_example_trains_on_shard_tensors_like_the_whole_field_model(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4",
                           "--standalone", os.path.join(ROOT, "examples", "physicsnemo_era5_shardtensor.py"),
                           "--data", str(tmp_path / "era5"), "--steps", "3", "--check"],
                          capture_output=True, text=True, timeout=280, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    steps = [LINE.search(line) for line in proc.stdout.splitlines() if line.startswith("step ")]
    assert len(steps) == 3 and all(steps), proc.stdout
    losses = [float(m.group(2)) for m in steps]
    for m in steps:
        assert abs(float(m.group(2)) - float(m.group(3))) <= 1e-6 * max(1.0, float(m.group(3))), m.group(0)
        assert float(m.group(4)) < 1e-5, m.group(0)
    assert losses[0] > losses[1] > losses[2], losses
    assert "local band (2, 3, 8, 64), global (2, 3, 32, 64)" in proc.stdout
