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


# ---- no silent coercions: integers are integers, numbers are numbers (issue 9, item 15) -------------
import numpy as np  # noqa: E402


@pytest.mark.parametrize("shape,match", [
    ((8.5, 16), r"sample shape \(8.5, 16\) holds 8.5 \(float\): sizes must be integers"),
    ((True, 16), r"sample shape \(True, 16\) holds True \(bool\)"),
    (("8", 16), r"sample shape \('8', 16\) holds '8' \(str\)"),
    ("816", "sample shape '816' is not a sequence of integers"),
    (8, "sample shape 8 is not a sequence of integers"),
])
def test_sample_shape_must_be_integers(shape, match):
    with pytest.raises(LayoutError, match=match):
        Layout(MESH, shard={"model_parallel": 1}).region(shape)


def test_numpy_integers_are_integers():
    layout = Layout(MESH, shard={"model_parallel": np.int64(1)}, halo={np.int32(1): np.uint8(2)},
                    crop=[None, (np.int64(1), np.int16(15))])
    region = layout.region(tuple(np.array([8, 16])), (np.int64(1), np.int8(2)))
    # crop 1:15 is 14 cells, chunk over 4: 4, 4, 4, 2; shard 2 owns 9:13, halo 2
    assert region.start == (0, 9) and region.stop == (8, 13) and region.window_start == (0, 7)
    assert all(type(v) is int for v in region.start + region.window_stop)


@pytest.mark.parametrize("coordinate", [(0, 1.5), (True, 1), (0, "1"), (0, np.float64(1.0))])
def test_coordinate_must_be_integers(coordinate):
    with pytest.raises(LayoutError, match=r"coordinate .* is out of range for mesh shape \(2, 4\): one integer per mesh dim"):
        Layout(MESH, shard={"model_parallel": 1}).region((8, 16), coordinate)


@pytest.mark.parametrize("crop,match", [
    ([None, (0.5, 10)], "crop of axis 1: start 0.5 is not an integer"),
    ([None, (0, 10.0)], "crop of axis 1: stop 10.0 is not an integer"),
    ([None, slice(True, 10)], "crop of axis 1: start True is not an integer"),
    ([(0, 8), "ab"], "crop of axis 1: start 'a' is not an integer"),
    ("0:8", "crop must be None or one"),
])
def test_crop_must_be_integers(crop, match):
    with pytest.raises(LayoutError, match=match):
        Layout(MESH, shard={"model_parallel": 1}, crop=crop)


@pytest.mark.parametrize("fill_value", ["abc", None, [0], 1 + 2j])
def test_fill_value_must_be_a_number(fill_value):
    with pytest.raises(LayoutError, match=r"fill_value must be a real number, got "):
        Layout(MESH, shard={"model_parallel": 1}, fill_value=fill_value)


@pytest.mark.parametrize("boundary,match", [
    (None, r"boundary must be a rule name \(constant, periodic, reflect, symmetric, edge, trim\), one per axis or "
           r"\{axis: rule\}, got None"),
    (3, "boundary must be a rule name"),
    ({1: None}, "unknown boundary None"),
    ({1.0: "edge"}, "boundary: axis 1.0 is not an integer"),
    (["edge", None], "unknown boundary None"),
])
def test_boundary_is_checked_when_the_layout_is_made(boundary, match):
    with pytest.raises(LayoutError, match=match):
        Layout(MESH, shard={"model_parallel": 1}, boundary=boundary)


@pytest.mark.parametrize("halo,match", [
    (1.5, r"halo must be an int, one entry per axis or \{axis: int \| \(low, high\)\}, got 1.5"),
    (None, "halo must be an int"),
    (True, "halo must be an int"),
    ({1: 1.5}, "halo of axis 1 must be integers, got 1.5"),
    ({1.0: 1}, "halo: axis 1.0 is not an integer"),
    ([0, (1, 2, 3)], r"halo of axis 1 must be an int or \(low, high\)"),
])
def test_halo_is_checked_when_the_layout_is_made(halo, match):
    with pytest.raises(LayoutError, match=match):
        Layout(MESH, shard={"model_parallel": 1}, halo=halo)


def test_shard_and_split_types():
    with pytest.raises(LayoutError, match=r"shard: axis 1.0 of mesh dim 'model_parallel' is not an integer"):
        Layout(MESH, shard={"model_parallel": 1.0})
    with pytest.raises(LayoutError, match="shard must be a mapping"):
        Layout(MESH, shard=[("model_parallel", 1)])
    with pytest.raises(LayoutError, match="split must be a rule"):
        Layout(MESH, shard={"model_parallel": 1}, split=None)
