"""The Makefile's build entry points for machines without DALI (issue 8 item 4): `make kernels`
builds only the DALI-free library, `make gpu-check` runs the check with the given Python and
installs nothing. Dry runs (`make -n`): the real build is checked by hand and in CI."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

if shutil.which("make") is None:
    pytest.skip("make is not installed", allow_module_level=True)


def _dry(*args: str) -> list[str]:
    out = subprocess.run(["make", "-n", "-C", str(ROOT), *args], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    return [line for line in out.splitlines() if not line.startswith("make")]


def test_make_kernels_builds_only_the_dali_free_library():
    lines = _dry("kernels", "CMAKE=/usr/bin/cmake", "KERNELS_BUILD=/tmp/kb", "KERNELS_DEST=/tmp/kd",
                 "DALI_MESH_CUDA_ARCHS=native")
    text = "\n".join(lines)
    assert lines[0].startswith("/usr/bin/cmake -S . -B /tmp/kb"), text
    assert "-DDALI_MESH_KERNELS_ONLY=ON" in text and "-DCMAKE_CUDA_ARCHITECTURES=native" in text
    assert "--target dali_mesh_kernels" in text and "/tmp/kd/libdali_mesh_kernels.so" in text
    assert "pip" not in text and ".venv" not in text


def test_make_gpu_check_uses_the_given_python_and_installs_nothing():
    assert _dry("gpu-check") == ["python3 benchmarks/gpu_check.py"]
    assert _dry("gpu-check", "PYTHON=/opt/py/bin/python3") == ["/opt/py/bin/python3 benchmarks/gpu_check.py"]
