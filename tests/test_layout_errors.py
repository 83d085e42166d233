"""Every bad layout input gets one clear error naming the value."""
import pytest

from dali_mesh import Layout, MeshInfo
from dali_mesh.partition import LayoutError

MESH = MeshInfo((2, 4), ("data_parallel", "model_parallel"), (0, 1))


@pytest.mark.parametrize("kwargs,shape,match", [
    ({"shard": {"tensor_parallel": 1}}, (8, 16), r"unknown mesh dim 'tensor_parallel'; this mesh has \['data_parallel', 'model_parallel'\]"),
    ({"shard": {"model_parallel": 1}, "batch": "dp"}, (8, 16), "batch: unknown mesh dim 'dp'"),
    ({"shard": {"model_parallel": 1}, "batch": "model_parallel"}, (8, 16), "'model_parallel' is used twice"),
    ({"shard": {"model_parallel": 1}, "batch": ["data_parallel", "data_parallel"]}, (8, 16), "'data_parallel' is used twice"),
    ({"shard": {"model_parallel": 1, 1: 0}}, (8, 16), "'model_parallel' is used twice"),
    ({"shard": {"model_parallel": 2}}, (8, 16), "axis 2 is out of range for a sample of 2 dims"),
    ({"shard": {"model_parallel": -3}}, (8, 16), "axis -3 is out of range"),
    ({"shard": {"model_parallel": 1}, "halo": -1}, (8, 16), "negative halo -1"),
    ({"shard": {"model_parallel": 1}, "halo": {1: (1, -2)}}, (8, 16), r"negative halo \(1, -2\) on axis 1"),
    ({"shard": {"model_parallel": 1}, "halo": {5: 1}}, (8, 16), "halo: axis 5 is out of range"),
    ({"shard": {"model_parallel": 1}, "boundary": "wrap"}, (8, 16), "unknown boundary 'wrap'"),
    ({"shard": {"model_parallel": 1}, "boundary": {1: "mirror"}}, (8, 16), "unknown boundary 'mirror'"),
    ({"shard": {"model_parallel": 1}, "split": "ceil"}, (8, 16), "unknown split 'ceil'"),
    ({"shard": {"model_parallel": 1}}, (8, 0), r"sample shape \(8, 0\) has a size <= 0"),
    ({"shard": {"model_parallel": 1}}, (8, -2), "has a size <= 0"),
    ({"shard": {"model_parallel": 1}, "crop": [(0, 8), (4, 20)]}, (8, 16), "crop 4:20 of axis 1 lies outside the sample"),
    ({"shard": {"model_parallel": 1}, "crop": [(0, 8), (5, 5)]}, (8, 16), "crop 5:5 of axis 1 lies outside the sample .* or is empty"),
    ({"shard": {"model_parallel": 1}, "crop": [(0, 8)]}, (8, 16), "crop .* has 1 entries for a sample of shape"),
    ({"shard": {"model_parallel": 1}, "boundary": ["edge"]}, (8, 16), "boundary .* has 1 entries for a sample of 2 dims"),
])
def test_layout_errors(kwargs, shape, match):
    with pytest.raises(LayoutError, match=match):
        Layout(MESH, **kwargs).region(shape)


def test_batch_required_when_ambiguous():
    mesh = MeshInfo((2, 2, 2), ("dp", "tp", "mp"))
    with pytest.raises(LayoutError, match=r"batch is required: mesh dims \['dp', 'tp'\] shard no axis"):
        Layout(mesh, shard={"mp": 0})
    assert Layout(mesh, shard={"mp": 0}, batch="dp").replica_dims == ("tp",)


def test_coordinate_out_of_range():
    layout = Layout(MESH, shard={"model_parallel": 1})
    with pytest.raises(LayoutError, match=r"coordinate \(0, 4\) is out of range for mesh shape \(2, 4\)"):
        layout.region((8, 16), (0, 4))
    with pytest.raises(LayoutError, match="coordinate"):
        layout.region((8, 16), (0,))


def test_not_a_mesh():
    with pytest.raises(LayoutError, match="mesh must be a MeshInfo"):
        Layout((2, 4), shard={})


def test_fill_value_the_dtype_cannot_hold():
    import numpy as np

    from dali_mesh.partition import take_window

    region = Layout(MeshInfo((2,), ("mp",)), shard={"mp": 0}, halo=2, fill_value=-1).region((6,))
    with pytest.raises(LayoutError, match="fill_value -1 cannot be held by uint8"):
        take_window(np.arange(6, dtype=np.uint8), region)
    region = Layout(MeshInfo((2,), ("mp",)), shard={"mp": 0}, halo=2, fill_value=0.5).region((6,))
    with pytest.raises(LayoutError, match="fill_value 0.5 cannot be held by int32"):
        take_window(np.arange(6, dtype=np.int32), region)
    assert take_window(np.arange(6, dtype=np.float16), region)[0] == np.float16(0.5)
