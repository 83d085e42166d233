"""Pure index math: split rules, ``Layout``, ``Region`` and the sample order (one module each).

Nothing here knows of files, processes, torch or DALI; numpy at most. Every function takes tuples
and returns tuples, so that readers, DALI worker processes and the C++ ``mesh_roi`` operator can all
follow the same rules (a test holds the C++ side to this one).

Example: an ERA5 field ``(8, 721, 1440)`` on a ``data_parallel=2 x model_parallel=4`` mesh, latitude
sharded, one cell of halo, periodic in longitude::

    >>> mesh = MeshInfo((2, 4), ("data_parallel", "model_parallel"), (0, 1))
    >>> layout = Layout(mesh, shard={"model_parallel": 1}, halo={1: 1, 2: 1},
    ...                 boundary={1: "constant", 2: "periodic"})
    >>> layout.region((8, 721, 1440)).window_start
    (0, 180, -1)

    every rank (split "chunk", 721 over 4 = 181, 181, 181, 178):
    rank0 -- coordinate (0, 0) owned [0:8, 0:181, 0:1440]   window [0:8, -1:182, -1:1441]
    rank1 -- coordinate (0, 1) owned [0:8, 181:362, 0:1440] window [0:8, 180:363, -1:1441]
    rank2 -- coordinate (0, 2) owned [0:8, 362:543, 0:1440] window [0:8, 361:544, -1:1441]
    rank3 -- coordinate (0, 3) owned [0:8, 543:721, 0:1440] window [0:8, 542:722, -1:1441]
    ranks 4..7 (data_parallel=1) have the same regions and the other half of the samples.

The layout can also come from the model: ``Layout.from_placements(mesh, placements)`` (the inverse
of ``dtensor_placements``), ``Layout.from_dtensor(t)``, ``Layout.from_shard_tensor(t)`` (PhysicsNeMo
sharding shapes become explicit sizes, ``split={mesh dim: [sizes...]}``, or the rule they equal).
The sample order (``SampleOrder``) is computed per index in O(1): no table of the epoch is needed.
"""
from __future__ import annotations
from dali_mesh.partition.checks import LayoutError
from dali_mesh.partition.layout import Layout
from dali_mesh.partition.order import GroupOrder, SampleOrder, sample_order
from dali_mesh.partition.region import Region, check_fill_value, take_window
from dali_mesh.partition.curves import curve_order, renumber_graph
from dali_mesh.partition.rows import Rows, graph_halo
from dali_mesh.partition.rules import BOUNDARIES, SPLITS, boundary_index, shard_extent, split_sizes

__all__ = [
    "BOUNDARIES",
    "SPLITS",
    "LayoutError",
    "Layout",
    "Region",
    "Rows",
    "GroupOrder",
    "SampleOrder",
    "boundary_index",
    "check_fill_value",
    "curve_order",
    "graph_halo",
    "renumber_graph",
    "sample_order",
    "shard_extent",
    "split_sizes",
    "take_window",
]
