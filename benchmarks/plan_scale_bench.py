"""What planning a window costs as it grows (issue 19 item 12): the plan's size, the time to define it
and the peak memory, for a (rows, 4) float32 ``.npy`` split on its last axis over 4 ranks (rank 1:
one cell of every row, 16 bytes apart in the file), and for the same file split on its rows.

    python benchmarks/plan_scale_bench.py [--rows 16777216]

The file is sparse (nothing stored: planning reads only its header). Each case runs in a fresh
interpreter, so that its peak resident memory (``ru_maxrss``) is its own.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CASE = r"""
import json, resource, sys, time
sys.path.insert(0, {root!r})
from dali_mesh import Layout, MeshInfo
from dali_mesh.pipeline import native
from dali_mesh.source import NumpySource
lay = Layout(MeshInfo((4,), ("mp",), (1,)), shard={{"mp": {axis}}})
t = time.perf_counter()
src = NumpySource([{path!r}], lay, batch_size=1, shuffle=False)
(plan,) = native.plan_windows(src)
size = len(plan.to_bytes())
seconds = time.perf_counter() - t
units = sum(len(p.file_off) for p in plan.plans)
runs = sum(int(p.unit_count.sum()) if getattr(p, "unit_count", None) is not None else len(p.file_off)
           for p in plan.plans)  # (plans before repeated units: one run per unit)
print(json.dumps({{"bytes": size, "seconds": seconds, "units": units, "runs": runs,
                  "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}))
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1 << 24)
    args = ap.parse_args()
    import numpy as np

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "rows.npy")
        header = np.lib.format.header_data_from_array_1_0(np.zeros((1, 4), np.float32))
        header["shape"] = (args.rows, 4)
        with open(path, "wb") as f:
            np.lib.format.write_array_header_1_0(f, header)
            f.truncate(f.tell() + args.rows * 16)
        print(f"float32 ({args.rows}, 4) .npy (sparse), 4 ranks, rank 1; {os.cpu_count()} CPUs")
        print()
        print("| split | window | plan bytes | units (runs) | define s | peak MiB |")
        print("|---|---|---|---|---|---|")
        for axis, name in ((1, "last axis (one cell per row)"), (0, "rows")):
            out = subprocess.run([sys.executable, "-c", CASE.format(root=ROOT, axis=axis, path=path)],
                                 capture_output=True, text=True, check=True).stdout
            r = json.loads(out.strip().splitlines()[-1])
            window = args.rows * 4  # bytes: a quarter of the sample either way
            print(f"| {name} | {window / 2**20:.0f} MiB | {r['bytes']} | {r['units']} ({r['runs']}) | "
                  f"{r['seconds']:.3f} | {r['peak_mib']:.0f} |")


if __name__ == "__main__":
    main()
