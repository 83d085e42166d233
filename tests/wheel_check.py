"""Installs a dali_mesh wheel (``make wheel``) into a new virtual environment that holds only the
pinned DALI and numpy (no system site-packages; pip's cache makes it cheap), then, from that
environment and outside the repository:

* the plugin loads and a small CPU pipeline runs: ``read_windows`` (the native reader) over a .npy
  file and over a .npy object written from Python into the memory store, and ``strided_slice`` over an
  external source, all checked against numpy;
* one native core: the plugin links the kernels library (its NEEDED entry, found beside it by RUNPATH
  ``$ORIGIN``) and defines none of the core's symbols itself, and in the process that ran the pipeline
  (DALI's plugin and ctypes) the kernels library is mapped once, from the installed package;
* the C libraries it links resolve inside the new environment (``dali_mesh/_libs``) or the system's
  base libraries, never the build's virtualenv;
* the plugin refuses another DALI version with a message naming both versions.

    python tests/wheel_check.py dist/dali_mesh-*.whl [--venv DIR] [--keep]

Exit status 0 when every check passed. Used by ``make wheel-check`` and tests/test_wheel.py."""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

PINS = ["nvidia-dali-cuda120==2.4.0", "numpy==2.4.6"]

CHECK = r'''
import os, subprocess, sys, tempfile
import numpy as np
import dali_mesh
from pathlib import Path
pkg = Path(dali_mesh.__file__).parent
assert str(pkg).startswith(sys.prefix), (pkg, sys.prefix)
build_venv = os.environ["BUILD_PREFIX"]
for lib in ("libdali_mesh.so", "libdali_mesh_kernels.so"):
    out = subprocess.run(["ldd", str(pkg / lib)], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        assert "not found" not in line or "libdali.so" in line, line
        assert build_venv not in line, ("resolved in the build's venv", line)
from dali_mesh import _kernels, Layout, MeshInfo
from dali_mesh.plan import CODECS
native = [c for c in ("blosc", "zstd", "lz4", "zlib", "lzf", "szip", "crc32c") if _kernels.codec_available(CODECS[c])]
print("codecs decoded natively:", " ".join(native))
from nvidia.dali import pipeline_def, fn
import dali_mesh.fn as dfn
from dali_mesh.source import NumpySource
from dali_mesh.pipeline import native as nat
import io
from dali_mesh.storage.memory import MemoryStore
d = tempfile.mkdtemp()
x = np.arange(2 * 8 * 6, dtype=np.float32).reshape(2, 8, 6)
np.save(f"{d}/s.npy", x)
buf = io.BytesIO()
np.save(buf, x + 1)
MemoryStore("wheel-check").put("s.npy", buf.getvalue())  # written through ctypes, read by the plugin
layout = Layout(MeshInfo((1, 2), ("dp", "mp"), (0, 1)), shard={"mp": 1})
src = NumpySource([f"{d}/s.npy"], layout, batch_size=1, shuffle=False)
mem = NumpySource(["memory://wheel-check/s.npy"], layout, batch_size=1, shuffle=False)
@pipeline_def(batch_size=1, num_threads=1, device_id=None)
def pipe():
    outs = nat.read_windows(src, fallback=False)  # the windows first, then the sample ids and flags
    m = nat.read_windows(mem, fallback=False)
    s = dfn.strided_slice(fn.external_source(source=lambda: [x], batch=True), start=[1, 0], shape=[3, 6], step=[2, 1], axes=[1, 2])
    return (outs[0], m[0], s, *outs[1:], *m[1:])  # every output used (the sample ids and flags too)
p = pipe(); p.build()
out = p.run()
w, m, s = out[0], out[1], out[2]
assert np.array_equal(np.array(w[0]), x[:, 4:8, :]), np.array(w[0])
assert np.array_equal(np.array(m[0]), x[:, 4:8, :] + 1), np.array(m[0])
assert np.array_equal(np.array(s[0]), x[:, 1:7:2, :])
print("pipeline from the installed wheel: read_windows (a file, a memory object) and strided_slice match numpy")
plugin, kernels = pkg / "libdali_mesh.so", pkg / "libdali_mesh_kernels.so"
dyn = subprocess.run(["readelf", "-d", str(plugin)], capture_output=True, text=True, check=True).stdout
assert "[libdali_mesh_kernels.so]" in dyn and "$ORIGIN" in dyn, dyn
own = subprocess.run(["nm", "-DC", "--defined-only", str(plugin)], capture_output=True, text=True, check=True).stdout
assert not [line for line in own.splitlines() if "dali_mesh::" in line], "the plugin defines core symbols itself"
mapped = {line.split()[-1] for line in open("/proc/self/maps") if "libdali_mesh" in line}
assert {os.path.realpath(m) for m in mapped} == {os.path.realpath(plugin), os.path.realpath(kernels)}, mapped
print("one native core: the plugin links", kernels.name, "and it is loaded once:", sorted(mapped))
'''

REFUSE = r'''
import nvidia.dali as dali
dali.__version__ = "2.3.0"
from dali_mesh.pipeline.plugin import load_plugin
try:
    load_plugin()
except ImportError as e:
    msg = str(e)
    assert "2.3.0" in msg and "2.4.0" in msg, msg
    print("another DALI refused:", msg[:160])
else:
    raise SystemExit("the plugin loaded under another DALI version")
'''


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("wheel")
    ap.add_argument("--venv", help="the new environment's folder (default: a temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep the environment")
    a = ap.parse_args()
    wheel = os.path.abspath(a.wheel)
    venv = a.venv or tempfile.mkdtemp(prefix="dali_mesh_wheel_")
    t0 = time.monotonic()
    try:
        subprocess.run([sys.executable, "-m", "venv", "--clear", venv], check=True)
        py = os.path.join(venv, "bin", "python")
        pip = [py, "-m", "pip", "install", "-q", "--no-compile", "--disable-pip-version-check"]
        subprocess.run(pip + PINS, check=True)
        t_dali = time.monotonic()
        subprocess.run(pip + ["--no-deps", wheel], check=True)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LD_LIBRARY_PATH")}
        env["BUILD_PREFIX"] = sys.prefix
        work = tempfile.mkdtemp(prefix="dali_mesh_wheel_cwd_")  # not the repository: its dali_mesh/
        for script in (CHECK, REFUSE):
            subprocess.run([py, "-c", script], check=True, cwd=work, env=env)
        shutil.rmtree(work, ignore_errors=True)
        print(f"wheel check passed: {os.path.basename(wheel)} in a new venv "
              f"(venv + DALI {t_dali - t0:.0f} s, wheel + checks {time.monotonic() - t_dali:.0f} s)")
        return 0
    finally:
        if not a.keep and not a.venv:
            shutil.rmtree(venv, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
