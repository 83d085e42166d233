"""MeshLoader and sources refuse what would give wrong data: a device mesh that is not the layout's
mesh, outputs named in the wrong order, a checkpoint from another source/layout/batch size, and
silently coerced arguments (seed, sample shape, channels, 0-d or empty samples)."""
from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("nvidia.dali")

from dali_mesh import Layout, MeshInfo  # noqa: E402
from dali_mesh.io import DataFileError  # noqa: E402
from dali_mesh.partition import LayoutError  # noqa: E402
from dali_mesh.source import NumpySource  # noqa: E402
from dali_mesh.torch import MeshLoader  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def _workers_find_the_package(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))


def _files(tmp_path, n=6, shape=(4, 6)):
    files = []
    for i in range(n):
        f = str(tmp_path / f"s{i}.npy")
        np.save(f, np.arange(np.prod(shape), dtype=np.float32).reshape(shape) + 100 * i)
        files.append(f)
    return files


def _make(source, batch_size=None):
    from nvidia.dali import pipeline_def

    from dali_mesh.pipeline.external import partitioned_source

    def make(checkpoint=None):
        @pipeline_def(batch_size=batch_size or source.batch_size, num_threads=1, device_id=None, py_num_workers=1,
                      py_start_method="spawn", enable_checkpointing=True, prefetch_queue_depth=1)
        def pipe():
            return partitioned_source(source)

        return pipe(checkpoint=checkpoint)

    return make


# ---- the device mesh must be the layout's mesh -------------------------------------------------------
def _device_mesh(ranks, names):
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh("cpu", torch.tensor(ranks), mesh_dim_names=names, _init_backend=False)


@pytest.mark.parametrize("ranks,names,mesh,says", [
    ([0], ("mp",), MeshInfo((2,), ("mp",), (0,)), r"device mesh has shape \(1,\).*layout's mesh has shape \(2,\)"),
    ([[0]], ("dp", "mp"), MeshInfo((1, 1), ("data", "model")),
     r"names \('dp', 'mp'\).*names \('data', 'model'\)"),
    ([1, 0], ("mp",), MeshInfo((2,), ("mp",), (0,)), r"this rank at \(1,\); .*this rank at \(0,\)"),
])
def test_device_mesh_that_is_not_the_layouts_is_refused(process_group, ranks, names, mesh, says):
    layout = Layout(mesh, shard={"mp" if "mp" in mesh.names else "model": 0})
    with pytest.raises(LayoutError, match="device_mesh disagrees with layout.mesh: the .*" + says):
        MeshLoader(object(), layout, output="dtensor", device_mesh=_device_mesh(ranks, names), sample_shape=(8, 4))
    with pytest.raises(LayoutError, match="device_mesh disagrees"):  # with local output too
        MeshLoader(object(), layout, device_mesh=_device_mesh(ranks, names))


def test_device_mesh_of_the_wrong_type_is_refused_at_construction():
    layout = Layout(MeshInfo((2,), ("mp",), (0,)), shard={"mp": 0})
    with pytest.raises(TypeError, match="device_mesh must be a torch DeviceMesh .*got object"):
        MeshLoader(object(), layout, output="dtensor", device_mesh=object(), sample_shape=(8, 4))


# ---- outputs -----------------------------------------------------------------------------------------
def _layout():
    return Layout(MeshInfo((1, 2), ("dp", "mp"), (0, 1)), shard={"mp": 1})


def test_output_map_swapping_sample_id_and_is_pad_is_refused(tmp_path):
    source = NumpySource(_files(tmp_path, n=4), _layout(), batch_size=2, shuffle=False)
    loader = MeshLoader(_make(source), source.layout, output_map=("window", "is_pad", "sample_id"))
    with pytest.raises(ValueError, match=r"output 'sample_id' has dtype torch.bool, expected torch.int64: output_map "
                                         r"\['window', 'is_pad', 'sample_id'\] does not follow"):
        next(loader)
    right = MeshLoader(_make(source), source.layout, output_map=source.output_names)
    batch = next(right)
    assert batch["sample_id"].tolist() == [0, 1] and batch["is_pad"].tolist() == [False, False]


def test_undeclared_dtypes_are_checked_on_the_first_batch():
    """A pipeline that declares no dtypes: the swap shows only in the data."""
    from nvidia.dali import fn, pipeline_def

    def sample(info):
        return np.full((2, 3), info.idx_in_epoch, np.float32), np.array(False), np.array(info.idx_in_epoch, np.int64)

    @pipeline_def(batch_size=2, num_threads=1, device_id=None)
    def pipe():
        window, pad, sid = fn.external_source(source=sample, num_outputs=3, batch=False)
        return window, pad, sid

    loader = MeshLoader(pipe(), _layout(), timeout=None)
    with pytest.raises(ValueError, match="output 'sample_id' has dtype torch.bool, expected torch.int64"):
        next(loader)


@pytest.mark.parametrize("kwargs,error,match", [
    ({"output_map": ("window", "sample_id")}, ValueError, r"names 2 outputs but the pipeline has 3"),
    ({"output_map": ("window", "sample_id", "is_pad", "extra")}, ValueError, "names 4 outputs but the pipeline has 3"),
])
def test_output_map_of_the_wrong_length_is_refused(tmp_path, kwargs, error, match):
    source = NumpySource(_files(tmp_path, n=4), _layout(), batch_size=2)
    with pytest.raises(error, match=match):
        MeshLoader(_make(source), source.layout, **kwargs)


@pytest.mark.parametrize("kwargs,error,match", [
    ({"window_outputs": ("windw",)}, ValueError, r"window_outputs names \['windw'\] which output_map"),
    ({"window_outputs": ("is_pad",)}, ValueError, "names 'is_pad', which is the sample id / pad flag"),
    ({"output_map": "window"}, TypeError, "output_map must be a sequence of output names, got one string"),
    ({"output_map": ("window", "window", "is_pad")}, ValueError, r"output_map names \['window'\] more than once"),
    ({"sample_shape": (8.5, 4)}, ValueError, r"sample_shape must be .*\(8.5 is not one\)"),
    ({"sample_shape": (True, 4)}, ValueError, r"\(True is not one\)"),
    ({"sample_shape": "84"}, ValueError, "sample_shape must be a sequence of positive integers, got '84'"),
])
def test_loader_arguments_refused_before_any_pipeline(kwargs, error, match):
    with pytest.raises(error, match=match):
        MeshLoader(object(), _layout(), **kwargs)


# ---- checkpoints -------------------------------------------------------------------------------------
def test_load_state_dict_refuses_what_is_not_a_state(tmp_path):
    source = NumpySource(_files(tmp_path, n=4), _layout(), batch_size=2)
    loader = MeshLoader(_make(source), source.layout)
    with pytest.raises(ValueError, match=r"load_state_dict\(state\): state must be a dict .* with "
                                         r"'dali_checkpoints', got \[\]"):
        loader.load_state_dict({})
    with pytest.raises(ValueError, match=r"expected one DALI checkpoint in state\['dali_checkpoints'\]"):
        loader.load_state_dict({"dali_checkpoints": []})


def test_checkpoint_of_another_source_or_batch_size_is_refused_and_the_same_resumes(tmp_path):
    files = _files(tmp_path, n=8)
    source = NumpySource(files, _layout(), batch_size=2, seed=1)
    first = MeshLoader(_make(source), source.layout)
    next(first)
    state = first.state_dict()
    expected = next(first)["sample_id"].tolist()
    assert state["fingerprint"]["batch_size"] == 2 and state["fingerprint"]["sources"][0]["seed"] == 1

    other_seed = NumpySource(files, _layout(), batch_size=2, seed=2)
    loader = MeshLoader(_make(other_seed), other_seed.layout)
    with pytest.raises(ValueError, match=r"would resume at another position: sources\[0\].seed: checkpoint 1, "
                                         r"this loader 2"):
        loader.load_state_dict(state)
    other_batch = NumpySource(files, _layout(), batch_size=1, seed=1)
    loader = MeshLoader(_make(other_batch), other_batch.layout)
    with pytest.raises(ValueError, match="batch_size: checkpoint 2, this loader 1"):
        loader.load_state_dict(state)
    other_files = NumpySource(files[:4] + files[5:] + files[4:5], _layout(), batch_size=2, seed=1)
    loader = MeshLoader(_make(other_files), other_files.layout)
    with pytest.raises(ValueError, match=r"sources\[0\].files\[4\]: checkpoint '.*s4.npy', this loader '.*s5.npy'"):
        loader.load_state_dict(state)

    same = MeshLoader(_make(NumpySource(files, _layout(), batch_size=2, seed=1)), source.layout)
    same.load_state_dict(state)
    assert next(same)["sample_id"].tolist() == expected
    assert expected == source.order(0)[0][2:4].tolist()


# ---- sources: values that used to be coerced silently -------------------------------------------------
@pytest.mark.parametrize("seed", [2 ** 64, -1, 1.9, True, "3"])
def test_seed_outside_0_to_2_64_or_not_an_integer_is_refused(tmp_path, seed):
    with pytest.raises(ValueError, match=r"seed must be an integer in \[0, 2\*\*64\), got " + repr(seed).replace(".", r"\.")):
        NumpySource(_files(tmp_path, n=2), _layout(), seed=seed)


def test_largest_seed_and_numpy_integer_seeds_are_taken(tmp_path):
    from dali_mesh import sample_order

    files = _files(tmp_path, n=5)
    big = NumpySource(files, _layout(), seed=2 ** 64 - 1)
    ids = big.order(0)[0]
    assert sorted(ids.tolist()) == list(range(5))
    np.testing.assert_array_equal(ids, sample_order(5, 0, seed=2 ** 64 - 1)[0])
    assert NumpySource(files, _layout(), seed=np.uint64(7)).order(3)[0].tolist() == \
        NumpySource(files, _layout(), seed=7).order(3)[0].tolist()


@pytest.mark.parametrize("shape,says", [((), r"0-d array \(shape \(\)\)"), ((3, 0), r"empty array \(shape \(3, 0\)\)")])
def test_zero_d_or_empty_sample_names_the_file(tmp_path, shape, says):
    good = _files(tmp_path, n=1)
    bad = str(tmp_path / "bad.npy")
    np.save(bad, np.zeros(shape, np.float32))
    with pytest.raises(DataFileError, match=f"{bad}: holds an {says}" if shape else f"{bad}: holds a {says}"):
        NumpySource([bad] + good, _layout())
    with pytest.raises(DataFileError, match=bad):
        NumpySource(good + [bad], _layout(), check_files=True)


@pytest.mark.parametrize("kwargs,match", [
    ({"channels": [0, 1.5]}, r"channels must be integers, got 1.5"),
    ({"channels": [0], "channel_axis": 0.0}, "channel_axis must be an integer, got 0.0"),
    ({"merge_gap": 4096.0}, "merge_gap must be an integer >= 0"),
    ({"batch_size": True}, "batch_size must be a positive integer, got True"),
])
def test_numpy_source_refuses_non_integers(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        NumpySource(_files(tmp_path, n=2), _layout(), **kwargs)


def test_one_path_instead_of_a_list_is_refused(tmp_path):
    f = _files(tmp_path, n=1)[0]
    with pytest.raises(TypeError, match="takes a list of files, got one path"):
        NumpySource(f, _layout())


def test_rows_come_out_as_local_tensors_and_never_as_dtensors(process_group, tmp_path):
    """A source with rows= (an index-set window) through MeshLoader: local tensors holding each sample's
    rows in the partition's order (the Python reader of partitioned_source, as the native one); a
    DTensor would call the rows' axis replicated, so output="dtensor" is refused before any batch."""
    from dali_mesh import Rows

    files = _files(tmp_path, n=4, shape=(10, 3))
    layout = Layout(MeshInfo((1, 2), ("dp", "graph"), (0, 1)), batch="dp")
    ids = np.array([9, 2, 3, 4, 0])
    source = NumpySource(files, layout, batch_size=2, shuffle=False, rows=Rows(ids))
    loader = MeshLoader(_make(source), layout)
    seen = []
    for batch in loader:
        for k, sid in enumerate(batch["sample_id"].tolist()):
            want = np.load(files[sid])[ids]
            np.testing.assert_array_equal(batch["window"][k].numpy(), want)
            seen.append(sid)
    assert sorted(seen) == [0, 1, 2, 3]
    with pytest.raises(LayoutError, match=r"reads rows= \(an index-set window\): its tensors are local"):
        one = Layout(MeshInfo((1, 1), ("dp", "graph"), (0, 0)), batch="dp")
        src = NumpySource(files, one, batch_size=2, shuffle=False, rows=Rows(ids))
        iter(MeshLoader(_make(src), one, output="dtensor", device_mesh=_device_mesh([[0]], ("dp", "graph")),
                        sample_shape=(5, 3)))


def test_shared_sources_with_other_rows_are_refused(process_group, tmp_path):
    """A read group's exchange cuts every output as the first shared source's windows: two shared
    sources of one pipeline with other rows= would hand a member another member's rows in the second
    output. Refused at the start, before any exchange."""
    from nvidia.dali import pipeline_def

    from dali_mesh import Rows
    from dali_mesh.fn import read_windows

    files = _files(tmp_path, n=4, shape=(10, 3))
    layout = Layout(MeshInfo((2,), ("graph",), (0,)), batch=())
    a = NumpySource(files, layout, batch_size=1, shuffle=False, share="group",
                    rows={(0,): Rows([1, 2]), (1,): Rows([3, 4])})
    b = NumpySource(files, layout, batch_size=1, shuffle=False, share="group",
                    rows={(0,): Rows([7, 8]), (1,): Rows([5, 6])})

    def make(checkpoint=None):
        @pipeline_def(batch_size=1, num_threads=1, device_id=None, prefetch_queue_depth=1)
        def pipe():
            wa, ids, pads = read_windows(a, fallback=False)
            wb, _, _ = read_windows(b, fallback=False)
            return wa, wb, ids, pads
        return pipe(checkpoint=checkpoint)

    with pytest.raises(ValueError, match="the pipeline's sources read different rows="):
        MeshLoader(make, layout, device_mesh=_device_mesh([0, 1], ("graph",)),
                   output_map=("a", "b", "sample_id", "is_pad"))
