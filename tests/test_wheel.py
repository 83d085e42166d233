"""`make wheel` (issue 32): a wheel of the package with the plugin inside, built against the installed
DALI, installs with pip into a new venv that holds only DALI and numpy, runs a small CPU pipeline
there, and refuses another DALI version (tests/wheel_check.py). Slow (tests/conftest.py): it relinks
the plugin for the wheel (the build folder is shared with the editable install: no recompile) and
installs DALI into the new venv from pip's cache."""
import glob
import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT


@pytest.mark.timeout(600)
def test_the_wheel_installs_into_a_new_venv_and_runs_a_pipeline(tmp_path):
    if not os.path.exists(os.path.join(ROOT, "build", "cmake", "CMakeCache.txt")):
        pytest.skip("the plugin was not built here with setup.py (build/cmake)")
    dist = tmp_path / "dist"
    env = dict(os.environ, DALI_MESH_WHEEL="1")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps",
                    "-w", str(dist), ROOT], check=True, env=env, timeout=540)
    (wheel,) = glob.glob(str(dist / "dali_mesh-*.whl"))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "wheel_check.py"), wheel,
                           "--venv", str(tmp_path / "venv")], capture_output=True, text=True, timeout=540)
    out = proc.stdout + proc.stderr
    if proc.returncode and "No matching distribution" in out:
        pytest.skip("nvidia-dali-cuda120 cannot be installed here (offline)")
    assert proc.returncode == 0, out[-4000:]
    assert "wheel check passed" in out and "another DALI refused" in out, out
