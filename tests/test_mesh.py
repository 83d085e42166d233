"""MeshInfo from every source, row-major ranks, and its errors."""
import types

import pytest

from dali_mesh import MeshInfo
from dali_mesh.mesh import MeshError, parse_mesh_shape, resolve_mesh_shape


def test_row_major_ranks_match_init_device_mesh():
    mesh = MeshInfo((2, 3, 4), ("a", "b", "c"))
    coords = list(mesh.coordinates())
    assert coords[0] == (0, 0, 0) and coords[1] == (0, 0, 1) and coords[4] == (0, 1, 0) and coords[-1] == (1, 2, 3)
    # torch.arange(world).reshape(mesh_shape) is how init_device_mesh lays ranks out
    import numpy as np

    grid = np.arange(24).reshape(2, 3, 4)
    for r, c in enumerate(coords):
        assert grid[c] == r == mesh.rank_of(c) == mesh.with_coordinate(c).rank
        assert mesh.coordinate_of(r) == c


def test_unnamed_and_direct():
    m = MeshInfo((4,))
    assert m.names == ("dim0",) and m.coordinate == (0,) and m.size == 4
    m = MeshInfo([2, 2], ["x", "y"], [1, 0])
    assert m.shape == (2, 2) and m.rank == 2 and m.dim_index("y") == 1 and m.dim_index(-1) == 1
    with pytest.raises(AttributeError):
        m.shape = (4,)


class FakeDeviceMesh:
    """Stands for torch's DeviceMesh: the three attributes MeshInfo reads (a real one is used in
    tests/test_distributed.py)."""

    def __init__(self, shape, names, coordinate):
        self.shape, self.mesh_dim_names, self._c = shape, names, coordinate

    def get_coordinate(self):
        return self._c


def test_from_device_mesh_named_and_unnamed():
    assert MeshInfo.from_device_mesh(FakeDeviceMesh((2, 4), ("dp", "mp"), [1, 3])) == MeshInfo((2, 4), ("dp", "mp"), (1, 3))
    assert MeshInfo.from_device_mesh(FakeDeviceMesh((8,), None, [5])).names == ("dim0",)
    with pytest.raises(MeshError, match="not part of the device mesh"):
        MeshInfo.from_device_mesh(FakeDeviceMesh((2,), None, None))


def test_from_physicsnemo_manager():
    manager = types.SimpleNamespace(global_mesh=FakeDeviceMesh((2, 2), ("ddp", "spatial"), [0, 1]))
    assert MeshInfo.from_physicsnemo(manager) == MeshInfo((2, 2), ("ddp", "spatial"), (0, 1))
    with pytest.raises(MeshError, match="initialize_mesh"):
        MeshInfo.from_physicsnemo(types.SimpleNamespace(global_mesh=None))


def test_from_physicsnemo_without_the_package(monkeypatch):
    import sys

    # as if PhysicsNeMo were not installed (None in sys.modules makes its import fail)
    for name in ("physicsnemo", "physicsnemo.distributed"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ImportError, match="needs PhysicsNeMo"):
        MeshInfo.from_physicsnemo()


def test_from_env():
    m = MeshInfo.from_env((-1, 4), ("dp", "mp"), env={"RANK": "6", "WORLD_SIZE": "8"})
    assert m == MeshInfo((2, 4), ("dp", "mp"), (1, 2))
    assert MeshInfo.from_env((2, 2), env={"RANK": "3", "WORLD_SIZE": "4"}).coordinate == (1, 1)


@pytest.mark.parametrize("shape,env,match", [
    ((2, 4), {"RANK": "0", "WORLD_SIZE": "6"}, r"mesh shape \(2, 4\) has 8 ranks but WORLD_SIZE=6"),
    ((-1, -1), {"RANK": "0", "WORLD_SIZE": "4"}, "more than one -1"),
    ((-1, 3), {"RANK": "0", "WORLD_SIZE": "4"}, "does not divide WORLD_SIZE=4"),
    ((2, 0), {"RANK": "0", "WORLD_SIZE": "4"}, "has a size 0"),
    ((4,), {"RANK": "4", "WORLD_SIZE": "4"}, "RANK=4 is out of range"),
    ((4,), {"WORLD_SIZE": "4"}, "RANK is not set"),
    ((4,), {"RANK": "x", "WORLD_SIZE": "4"}, "must be integers"),
])
def test_from_env_errors(shape, env, match):
    with pytest.raises(MeshError, match=match):
        MeshInfo.from_env(shape, env=env)


@pytest.mark.parametrize("args,match", [
    (((2, -3),), "has a size -3"),
    (((2, 2), ("a",)), "one name per dim"),
    (((2, 2), ("a", "a")), "repeat a name"),
    (((2, 2), ("a", "b"), (0, 2)), r"coordinate \(0, 2\) is out of range on mesh dim 'b' of size 2"),
    (((2, 2), ("a", "b"), (0,)), "has 1 entries"),
    (((),), "mesh shape is empty"),
])
def test_meshinfo_errors(args, match):
    with pytest.raises(MeshError, match=match):
        MeshInfo(*args)


def test_parse_mesh_shape():
    assert parse_mesh_shape("data_parallel=2,model_parallel=4") == ((2, 4), ("data_parallel", "model_parallel"))
    assert parse_mesh_shape("2, -1") == ((2, -1), ())
    for bad, match in [("dp=2,4", "name every dim or none"), ("dp=x", "'x' is not an integer"),
                       ("", "empty mesh"), ("=2", "no name")]:
        with pytest.raises(MeshError, match=match):
            parse_mesh_shape(bad)
    assert resolve_mesh_shape((-1, 2), 8) == (4, 2)


def test_non_integer_sizes_are_refused():
    for args in [((2.5, 2),), ((True, 2),), ((2, 2), ("a", "b"), (0.0, 1))]:
        with pytest.raises(MeshError, match="expected integers"):
            MeshInfo(*args)


@pytest.mark.parametrize("args,match", [
    (((2, 4), ("a", "b"), (0, 1.5)), r"mesh coordinate \(0, 1.5\) holds 1.5: expected integers"),
    (((2, 4), ("a", "b"), (0, "1")), "holds '1': expected integers"),
    ((("2", 4),), "holds '2': expected integers"),
    (("24",), "mesh shape '24' is a string"),
    (((2,), "a"), r"mesh names 'a' is one string: give one name per dim, e.g. \('a',\)"),
    (((2, 2), ("a", 3)), "mesh dim names must be non-empty strings, got 3"),
])
def test_no_silent_coercions(args, match):
    with pytest.raises(MeshError, match=match):
        MeshInfo(*args)


def test_numpy_integers_are_integers_and_queries_are_strict():
    import numpy as np

    m = MeshInfo((np.int64(2), np.uint8(4)), ("a", "b"), (np.int32(1), np.int64(3)))
    assert m == MeshInfo((2, 4), ("a", "b"), (1, 3)) and type(m.shape[0]) is int
    assert m.dim_index(np.int64(1)) == 1 and m.coordinate_of(np.int64(5)) == (1, 1)
    assert m.rank_of((np.int8(1), 1)) == 5
    with pytest.raises(MeshError, match="rank 1.5 is not an integer"):
        m.coordinate_of(1.5)
    with pytest.raises(MeshError, match=r"coordinate \(0, 1.5\) is out of range"):
        m.rank_of((0, 1.5))
    with pytest.raises(MeshError, match=r"mesh dim 1.0 is neither a name nor an index"):
        m.dim_index(1.0)
    with pytest.raises(MeshError, match=r"mesh shape \(2.5, -1\) holds 2.5"):
        resolve_mesh_shape((2.5, -1), 8)
    with pytest.raises(MeshError, match="mesh shape '2,4' is a string"):
        MeshInfo.from_env("2,4", env={"RANK": "0", "WORLD_SIZE": "8"})
