"""Train a small conv stack on PhysicsNeMo ShardTensors fed by dali_mesh's ERA5 drop-in.

    torchrun --nproc-per-node 4 examples/physicsnemo_era5_shardtensor.py [--data era5_demo] [--steps 4]
             [--check]

Each rank reads only its band of latitude rows of PhysicsNeMo-style ERA5 year files
(``dali_mesh.physicsnemo.ERA5HDF5Datapipe``, the same arguments as PhysicsNeMo's own) as ShardTensors;
PhysicsNeMo's domain-parallel convolution exchanges the halos between the bands and sums the weight
gradients over the mesh, so every rank ends each step with the same weights. With ``--check`` every
rank also gathers the whole fields and runs a copy of the model on them: the loss and the gradients
must be those of the domain-parallel model (they are printed side by side).

Written to run on the CPU (gloo) as well as on GPUs (NCCL, one per rank). Two PhysicsNeMo 2.2.2
limits shape it, both reported where they bite:

- ``physicsnemo.domain_parallel.shard_utils.register_shard_wrappers()`` imports every patch, among
  them ``knn`` -> ``physicsnemo.nn`` -> ``timm`` -> ``torchvision`` (not installable beside a CPU-only
  torch): only the convolution's patch is imported here
  (``physicsnemo.domain_parallel.shard_utils.conv_patches``, which registers itself).
- A loss reduced on the ShardTensor (``((y - t) ** 2).mean()``) computes forward, but its backward
  fails with torch 2.13 in ``physicsnemo/domain_parallel/shard_tensor.py`` (``_ShardTensorToDTensor.
  backward`` -> ``dataclasses.replace(spec)`` -> torch's ``DTensorSpec._verify_shard_order``:
  "placement[0] doesn't have a matching shard in shard_order"). So the loss is each rank's sum of
  squared errors over its band (``to_local()``) divided by the global count: the ranks' losses add up
  to the global mean, and the convolution's backward sums the weight gradients over the ranks.
"""
from __future__ import annotations

import argparse
import copy
import os

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from dali_mesh.physicsnemo import ERA5HDF5Datapipe


def write_demo(folder: str, years=(2000, 2001), steps: int = 9, shape=(3, 32, 64)) -> None:
    """PhysicsNeMo-style year files and stats (smooth fields, so the model has something to learn)."""
    import h5py

    os.makedirs(os.path.join(folder, "data"), exist_ok=True)
    os.makedirs(os.path.join(folder, "stats"), exist_ok=True)
    lat = np.linspace(-1, 1, shape[1], dtype=np.float32)[:, None]
    lon = np.linspace(0, 2 * np.pi, shape[2], endpoint=False, dtype=np.float32)[None, :]
    for y in years:
        f = np.stack([np.stack([np.cos(lon + 0.3 * t + c) * (1 - lat ** 2) + 0.1 * c for c in range(shape[0])])
                      for t in range(steps)]).astype(np.float32)
        with h5py.File(os.path.join(folder, "data", f"{y}.h5"), "w") as h:
            h["fields"] = f
    np.save(os.path.join(folder, "stats", "global_means.npy"), np.zeros((1, shape[0], 1, 1), np.float32))
    np.save(os.path.join(folder, "stats", "global_stds.npy"), np.ones((1, shape[0], 1, 1), np.float32))


def make_model(channels: int) -> torch.nn.Module:
    torch.manual_seed(0)  # the same weights on every rank
    return torch.nn.Sequential(torch.nn.Conv2d(channels, 16, 3, padding=1), torch.nn.GELU(),
                               torch.nn.Conv2d(16, channels, 3, padding=1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="era5_demo", help="folder with data/????.h5 and stats/; written if missing")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--check", action="store_true", help="compare with a whole-field copy of the model")
    args = p.parse_args()

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if backend == "nccl" else "cpu")
        mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("spatial",))
        if not os.path.isdir(os.path.join(args.data, "data")):
            if rank == 0:
                write_demo(args.data)
            dist.barrier()
        # the domain-parallel convolution (halo exchange between bands); see the module's docstring
        import physicsnemo.domain_parallel.shard_utils.conv_patches  # noqa: F401

        pipe = ERA5HDF5Datapipe(os.path.join(args.data, "data"), os.path.join(args.data, "stats"), batch_size=2,
                                num_steps=1, device=device, device_mesh=mesh, shard={"spatial": "lat"},
                                output="shard_tensor")
        channels = len(pipe.channels)
        model = make_model(channels).to(device)
        whole = copy.deepcopy(model) if args.check else None
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        opt_whole = torch.optim.SGD(whole.parameters(), lr=0.05) if whole is not None else None
        step = 0
        while step < args.steps:
            for (data,) in pipe:
                if step == args.steps:
                    break
                x, target = data["invar"], data["outvar"]  # ShardTensors (B, C, H, W) and (B, 1, C, H, W)
                count = target.numel()  # global
                y = model(x)
                loss = ((y.to_local() - target.to_local()[:, 0]) ** 2).sum() / count
                opt.zero_grad()
                loss.backward()  # PhysicsNeMo's conv backward sums the weight gradients over the mesh
                total = loss.detach().clone()
                dist.all_reduce(total)
                line = f"step {step}: loss {total.item():.6f} (local band {tuple(x.to_local().shape)}, " \
                       f"global {tuple(x.shape)})"
                if whole is not None:
                    xf, tf = x.full_tensor(), target.full_tensor()[:, 0]
                    ref = ((whole(xf) - tf) ** 2).mean()
                    opt_whole.zero_grad()
                    ref.backward()
                    worst = max(float((a.grad - b.grad).abs().max()) for a, b in
                                zip(model.parameters(), whole.parameters()))
                    line += f"; whole-field model: loss {ref.item():.6f}, largest gradient difference {worst:.2e}"
                    opt_whole.step()
                opt.step()
                if rank == 0:
                    print(line, flush=True)
                step += 1
        pipe.close()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
