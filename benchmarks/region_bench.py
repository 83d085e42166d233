"""Computing one rank's region does not grow with the world size.

    python benchmarks/region_bench.py [--quick]

Times ``Layout.region`` for one rank of meshes from 8 to 1,048,576 ranks (median of many calls).
"""
import argparse
import statistics
import time

from dali_mesh import Layout, MeshInfo


def median_us(fn, repeats=2000):
    samples = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1e6


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="50 calls per mesh instead of 2000 (a smoke test)")
    args = ap.parse_args(argv)
    repeats = 50 if args.quick else 2000
    shape = (8, 721, 1440)
    print(f"{'mesh':>28} {'ranks':>9} {'region() median':>16}")
    for mesh_shape in [(2, 4), (16, 64), (64, 4096), (256, 4096), (16, 256, 256)]:
        names = ("dp", "h", "w")[: len(mesh_shape)] if len(mesh_shape) == 3 else ("dp", "h")
        mesh = MeshInfo(mesh_shape, names)
        mesh = mesh.with_rank(mesh.size - 3)
        shard = {"h": 1, "w": 2} if len(mesh_shape) == 3 else {"h": 1}
        layout = Layout(mesh, shard=shard, halo={1: 1, 2: 1}, boundary={2: "periodic"})
        us = median_us(lambda: layout.region(shape), repeats)
        print(f"{str(dict(zip(names, mesh_shape))):>28} {mesh.size:>9} {us:>13.1f} us")


if __name__ == "__main__":
    main()
