"""Run PhysicsNeMo's own ERA5HDF5Datapipe and save every batch of a few epochs (the oracle of
test_physicsnemo_era5.py): ``python physicsnemo_era5_reference.py CONFIGS.json OUT_DIR``.

A script, not a test: PhysicsNeMo's datapipe starts DALI worker processes (``spawn``) that re-run this
file's top level, where the import workaround below must run too.

The import of PhysicsNeMo's datapipe goes around its package ``__init__``s: see _physicsnemo_stub.py.
"""
from __future__ import annotations

import json
import sys

from _physicsnemo_stub import era5_datapipe_class

ERA5HDF5Datapipe = era5_datapipe_class()  # also in DALI's spawned workers, which re-run this file


def main(configs_path: str, out_dir: str) -> None:
    import numpy as np

    configs = json.load(open(configs_path))
    for name, cfg in configs.items():
        epochs = cfg.pop("epochs", 2)
        pipe = ERA5HDF5Datapipe(**cfg)
        arrays = {"len": np.array(len(pipe))}
        for e in range(epochs):
            for b, batch in enumerate(pipe):
                for k, v in batch[0].items():
                    arrays[f"{e}/{b}/{k}"] = v.numpy().copy()
        np.savez(f"{out_dir}/{name}.npz", **arrays)
        del pipe


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
