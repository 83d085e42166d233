"""anemoi-datasets stores (``data`` of (dates, variables, ensembles, cells), variables named in the
group's attributes), written as anemoi writes them (Zarr v2, Blosc, one date per chunk with the whole
grid) and read per grid shard and per graph partition's rows, against ``anemoi.datasets.open_dataset``
(pinned in the Makefile: 0.5.47), and against zarr-python where it is not installed."""
from __future__ import annotations

import numpy as np
import pytest

from dali_mesh import Layout, Rows
from dali_mesh.datasets import AnemoiDatasetSource
from dali_mesh.io._common import DataFileError
from tests.helpers import mesh_of, native_epoch

zarr = pytest.importorskip("zarr")
numcodecs = pytest.importorskip("numcodecs")

T, V, E, C = 8, 5, 2, 20_000
NAMES = ["2t", "10u", "10v", "msl", "z_500"]


@pytest.fixture(scope="module", autouse=True)
def _plugin():
    from dali_mesh.pipeline.plugin import load_plugin

    load_plugin()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A store as anemoi-datasets writes it: Zarr v2, ``data`` chunked one date x every variable and
    member x the whole grid, NaN fill; ``dates``, ``latitudes``, ``longitudes``; ``variables``."""
    path = str(tmp_path_factory.mktemp("anemoi") / "era5-o96.zarr")
    rng = np.random.default_rng(0)
    g = zarr.open_group(path, mode="w", zarr_format=2)
    data = g.create_array("data", shape=(T, V, E, C), chunks=(1, V, E, C), dtype="f4", fill_value=np.nan,
                          compressors=numcodecs.Blosc("lz4", 5, numcodecs.Blosc.SHUFFLE, blocksize=1 << 14))
    x = (np.cumsum(rng.standard_normal((T, V, E, C)), axis=-1) * 0.1).astype(np.float32)
    data[:] = x
    dates = np.arange(np.datetime64("2020-01-01T00:00:00"), np.datetime64("2020-01-03T00:00:00"),
                      np.timedelta64(6, "h")).astype("<M8[s]")
    for name, values in (("dates", dates), ("latitudes", rng.uniform(-90, 90, C)),
                         ("longitudes", rng.uniform(0, 360, C))):
        g.create_array(name, shape=values.shape, dtype=values.dtype, chunks=values.shape)[:] = values
    g.attrs.update(variables=NAMES, frequency="6h", start_date=str(dates[0]), end_date=str(dates[-1]),
                   resolution="o96", field_shape=[C], missing_dates=[], ensemble_dimension=E,
                   dimensions=["dates", "variables", "ensembles", "values"])
    return path, x


def _oracle(path, x, select=None, start=None, end=None):
    """anemoi's own reader where it is installed, else zarr-python's array with the same selection."""
    try:
        from anemoi.datasets import open_dataset
    except ImportError:
        idx = list(range(V)) if select is None else [NAMES.index(s) for s in select]
        dates = zarr.open_array(f"{path}/dates", mode="r")[:]
        lo = 0 if start is None else int(np.searchsorted(dates, np.datetime64(start)))
        hi = T if end is None else int(np.searchsorted(dates, np.datetime64(end), side="right"))
        return zarr.open_array(f"{path}/data", mode="r")[lo:hi][:, idx]
    kw = {k: v for k, v in (("select", select), ("start", start), ("end", end)) if v is not None}
    return np.asarray(open_dataset(path, **kw)[:])


def _epoch(src):
    """Windows by date index from ``start``."""
    return native_epoch(src, key=lambda sid: src.step_of(sid) - int(src.time_start))


@pytest.mark.parametrize("ranks,split", [(4, "even"), (3, "chunk")])
def test_grid_shards_equal_open_dataset(store, ranks, split):
    path, x = store
    want = _oracle(path, x, select=["msl", "2t"], start="2020-01-01T06:00:00", end="2020-01-02T12:00:00")
    assert want.shape == (6, 2, E, C)
    cells = []
    for r in range(ranks):
        lay = Layout(mesh_of((ranks,), (r,)), shard={"data_parallel": 2}, batch=(), split=split)
        src = AnemoiDatasetSource(path, lay, variables=["msl", "2t"], start="2020-01-01T06:00:00",
                                  end="2020-01-02T12:00:00", batch_size=2, shuffle=False)
        assert src.variables == ("msl", "2t") and len(src.dates) == 6
        sl = slice(src.region.start[2], src.region.stop[2])
        cells.append(sl.stop - sl.start)
        got = _epoch(src)
        assert sorted(got) == list(range(6))
        for t, w in got.items():
            np.testing.assert_array_equal(w, want[t][..., sl], err_msg=f"rank {r}, date {t}")
    assert sum(cells) == C


def test_graph_rows_of_the_grid_equal_open_dataset(store):
    path, x = store
    want = _oracle(path, x)
    ids = np.concatenate((np.arange(5000, 5300), np.random.default_rng(1).choice(C, 200, replace=False)))
    ids = np.unique(ids)
    src = AnemoiDatasetSource(path, Layout(mesh_of((2,), (1,)), batch=()), rows=Rows(ids, axis=2), batch_size=2,
                              shuffle=False)
    for t, w in _epoch(src).items():
        np.testing.assert_array_equal(w, want[t][..., ids])


def test_bad_selections_are_refused_naming_them(store):
    path, _ = store
    lay = Layout(mesh_of((1,), (0,)), batch=())
    with pytest.raises(DataFileError, match="has no variable 'tp' \\(it has 2t, 10u, 10v, msl, z_500\\)"):
        AnemoiDatasetSource(path, lay, variables=["2t", "tp"])
    with pytest.raises(DataFileError, match="holds no date from 2021-01-01T00:00:00 to None"):
        AnemoiDatasetSource(path, lay, start="2021-01-01T00:00:00")
    for bad in ("2020-01-01", 2020, "2020"):  # a whole period to open_dataset: refused, not read as an instant
        with pytest.raises(ValueError, match="give a full date and time"):
            AnemoiDatasetSource(path, lay, end=bad)
    src = AnemoiDatasetSource(path, lay, start=np.datetime64("2020-01-01T06:00:00"), end="2020-01-01 18:00:00")
    assert len(src.dates) == 3
    with pytest.raises(ValueError, match="rows index the cells, axis 2"):
        AnemoiDatasetSource(path, lay, rows=Rows([1], axis=0))
    with pytest.raises(DataFileError, match="not an anemoi-datasets store"):
        AnemoiDatasetSource(f"{path}/dates", lay)
