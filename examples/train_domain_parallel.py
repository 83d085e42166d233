"""Train a tiny domain-parallel conv net for a few steps on windows that dali_mesh loads.

    torchrun --nproc-per-node 4 examples/train_domain_parallel.py [--data demo_data] [--steps 5]
             [--periodic-lon] [--mesh data_parallel=-1,model_parallel=2]

Each rank reads only its band of latitude rows plus a halo of ``kernel // 2`` rows and columns, so
a *valid* convolution on the window gives exactly the owned rows of the global *same*-padded
convolution (zeros beyond the poles; circular in longitude with ``--periodic-lon``): no halo
exchange inside the model. The weights are replicated; gradients are summed over the mesh.
"""
from __future__ import annotations

import argparse
import os

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from nvidia.dali import pipeline_def
from torch.distributed.device_mesh import init_device_mesh

from dali_mesh import Layout, MeshInfo
from dali_mesh.fn import partitioned_source
from dali_mesh.mesh import parse_mesh_shape, resolve_mesh_shape
from dali_mesh.source import NumpySource
from dali_mesh.torch import MeshLoader


class TinyNet(torch.nn.Module):
    """One *valid* ``kernel x kernel`` convolution, which eats ``kernel // 2`` cells of halo per
    side, then pointwise (1x1) layers, which need none. (A second wide layer would need the halo of
    the first layer's zero-padded output, not of the input: with a ``constant`` boundary that is
    not the same thing, so deeper nets exchange halos between layers.)"""

    def __init__(self, channels: int, kernel: int = 3, hidden: int = 16, pointwise: int = 1) -> None:
        super().__init__()
        self.halo = kernel // 2
        self.wide = torch.nn.Conv2d(channels, hidden, kernel, padding=0)
        widths = [hidden] * pointwise + [channels]
        self.pointwise = torch.nn.ModuleList(torch.nn.Conv2d(a, b, 1) for a, b in zip(widths[:-1], widths[1:]))

    def forward(self, window: torch.Tensor) -> torch.Tensor:
        x = self.wide(window)
        for conv in self.pointwise:
            x = conv(torch.relu(x))
        return x


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="demo_data", help="folder of .npy samples (C, H, W); written if missing")
    p.add_argument("--mesh", default="data_parallel=-1,model_parallel=2")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--periodic-lon", action="store_true", help="circular padding in longitude")
    args = p.parse_args()

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    try:
        rank = dist.get_rank()
        shape, names = parse_mesh_shape(args.mesh)
        shape = resolve_mesh_shape(shape, dist.get_world_size())
        device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if backend == "nccl" else "cpu")
        device_mesh = init_device_mesh(device.type, shape, mesh_dim_names=names)
        files = sorted(os.path.join(args.data, f) for f in os.listdir(args.data) if f.endswith(".npy")) \
            if os.path.isdir(args.data) else []
        if not files:
            if rank == 0:
                from dali_mesh.cli.demo import write_synthetic

                write_synthetic(args.data, 16, (4, 64, 128))
            dist.barrier()
            files = sorted(os.path.join(args.data, f) for f in os.listdir(args.data) if f.endswith(".npy"))

        model = TinyNet(channels=int(np.load(files[0], mmap_mode="r").shape[0])).to(device)
        h = model.halo
        layout = Layout(MeshInfo.from_device_mesh(device_mesh), shard={"model_parallel": 1},
                        batch="data_parallel", halo={1: h, 2: h},
                        boundary={1: "constant", 2: "periodic" if args.periodic_lon else "constant"})
        source = NumpySource(files, layout, batch_size=args.batch_size)
        region = layout.region(source.sample_shape)

        @pipeline_def(batch_size=args.batch_size, num_threads=2, device_id=device.index if device.type == "cuda" else None,
                      py_num_workers=1, py_start_method="spawn")
        def pipe():
            return partitioned_source(source, device="gpu" if device.type == "cuda" else "cpu")

        loader = MeshLoader(pipe(), layout, sample_shape=source.sample_shape)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
        owned = (slice(None),) + region.owned_in_window
        for step, batch in enumerate(loader):
            if step == args.steps:
                break
            window = batch["window"].to(device)
            target = window[owned]  # toy task: denoise the owned cells
            out = model(window + 0.1 * torch.randn_like(window))
            assert out.shape == target.shape, (out.shape, target.shape)
            # the loss of the whole domain is the sum of the ranks' partial sums
            loss = F.mse_loss(out, target, reduction="sum")
            optimizer.zero_grad()
            loss.backward()
            for param in model.parameters():
                dist.all_reduce(param.grad)
                param.grad /= source.sample_shape[-1] * source.sample_shape[-2] * len(window) * layout.num_batch_groups
            optimizer.step()
            total = loss.detach().clone()
            dist.all_reduce(total)
            if rank == 0:
                print(f"step {step}: loss {total.item() / (source.sample_shape[-1] * source.sample_shape[-2]):.4f} "
                      f"(window {tuple(window.shape)}, owned {tuple(out.shape)})", flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
