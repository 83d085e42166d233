"""What a rank reads (OwnReads, GroupReads): the members of a read group read every batch of their
sample group's order exactly once between them, each its group window, which holds every member's
window; without share a rank reads its own window of the whole order."""
import itertools
import pickle

import numpy as np
import pytest

from dali_mesh import Layout, MeshInfo
from dali_mesh.partition.read_groups import GroupReads, OwnReads, group_cut, group_region

SHAPE = (3, 13, 10)


def _layout(coordinate):
    mesh = MeshInfo((2, 3, 2), ("dp", "mp", "tp"), coordinate)
    return Layout(mesh, shard={"mp": 1}, batch=["dp"], halo={1: 2, 2: 1},
                  boundary={1: "reflect", 2: "periodic"})


@pytest.mark.parametrize("batch_size,drop_last", [(1, False), (2, False), (3, True), (4, False)])
def test_the_members_read_each_batch_of_their_sample_group_once(batch_size, drop_last):
    reads = GroupReads(["mp", "tp"])
    for dp in range(2):
        whole = _layout((dp, 0, 0)).order(23, 1, seed=9, batch_size=batch_size, drop_last=drop_last)
        ids, pads = whole.arrays()
        batches = {}  # batch of the sample group's order -> the member that reads it
        for mp, tp in itertools.product(range(3), range(2)):
            layout = _layout((dp, mp, tp))
            mine = reads.order_of(layout, layout.order(23, 1, seed=9, batch_size=batch_size, drop_last=drop_last))
            got_ids, got_pads = mine.arrays()
            assert [mine[i] for i in range(len(mine))] == list(zip(got_ids.tolist(), got_pads.tolist()))
            member = mp * 2 + tp
            for k, b in enumerate(range(member, len(ids) // batch_size, 6)):
                rows = slice(k * batch_size, (k + 1) * batch_size)
                np.testing.assert_array_equal(got_ids[rows], ids[b * batch_size:(b + 1) * batch_size])
                np.testing.assert_array_equal(got_pads[rows], pads[b * batch_size:(b + 1) * batch_size])
                assert batches.setdefault(b, member) == member
            assert len(mine) == len(range(member, len(ids) // batch_size, 6)) * batch_size
        assert sorted(batches) == list(range(len(ids) // batch_size))


def test_a_member_reads_the_group_window_which_holds_every_members_window():
    reads = GroupReads(("mp", "tp"))
    for coordinate in itertools.product(range(2), range(3), range(2)):
        layout = _layout(coordinate)
        window = reads.region_of(layout, list(SHAPE))
        assert window == group_region(layout, SHAPE, ("mp", "tp"))
        assert window.window_start == (0, -2, -1) and window.window_stop == (3, 15, 11)
        for mp, tp in itertools.product(range(3), range(2)):
            assert group_cut(window, layout.region(SHAPE, (coordinate[0], mp, tp))) is not None


def test_own_reads_are_the_ranks_window_and_its_sample_groups_order():
    layout = _layout((1, 2, 1))
    order = layout.order(23, 0, batch_size=2)
    assert OwnReads().region_of(layout, SHAPE) == layout.region(SHAPE)
    assert OwnReads().order_of(layout, order) is order


def test_reads_are_plain_values():
    assert GroupReads(["mp"]) == GroupReads(("mp",)) != GroupReads(("mp", "tp"))
    assert OwnReads() == OwnReads() != GroupReads(("mp",))
    for reads in (OwnReads(), GroupReads(("mp", "tp"))):
        assert pickle.loads(pickle.dumps(reads)) == reads
        with pytest.raises(AttributeError):
            reads.dims = ("dp",)
