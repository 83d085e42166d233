"""Every registered format passes :class:`~tests.formats.format_tests.FormatTests`, its arrays written by
its own library; and a format of another package, named by an entry point of the ``dali_mesh.formats``
group, is found without editing dali_mesh."""
from __future__ import annotations

import pickle
import sys
import types
from importlib import metadata

import numpy as np
import pytest

from dali_mesh.formats import (ENTRY_POINT_GROUP, FORMATS, HDF5, NPY, ZARR, ArrayFormat, ArrayInfo, FormatPluginError,
                               format_named, format_of, register_format)
from dali_mesh import plugin_registry
from dali_mesh.mesh import MeshInfo
from dali_mesh.partition import Layout
from dali_mesh.source.file_source import FileSource
from tests.formats.format_tests import FormatTests

h5py = pytest.importorskip("h5py")
zarr = pytest.importorskip("zarr")


class TestNpy(FormatTests):
    format = NPY

    def write(self, directory, data, chunks):
        path = str(directory / "a.npy")
        np.save(path, data)
        return path, None

    def library_info(self, location, name):
        arr = np.load(location, mmap_mode="r")
        return arr.shape, arr.dtype, None


class TestHDF5(FormatTests):
    format = HDF5

    def write(self, directory, data, chunks):
        path = str(directory / "a.h5")
        with h5py.File(path, "w") as f:
            f.create_dataset("grp/x", data=data, chunks=chunks)
        return path, "grp/x"

    def library_info(self, location, name):
        with h5py.File(location, "r") as f:
            ds = f[name]
            return ds.shape, ds.dtype, ds.chunks


class TestZarrV3(FormatTests):
    format = ZARR
    zarr_format = 3

    def write(self, directory, data, chunks):
        path = str(directory / "a.zarr")
        group = zarr.open_group(path, mode="w", zarr_format=self.zarr_format)
        arr = group.create_array("x", shape=data.shape, chunks=chunks, dtype=data.dtype)
        arr[...] = data
        return path, "x"

    def library_info(self, location, name):
        arr = zarr.open_array(location, path=name, mode="r")
        return arr.shape, arr.dtype, tuple(arr.chunks)


class TestZarrV2(TestZarrV3):
    zarr_format = 2


# ---- a format of another package, found through the entry-point group --------------------------------
class CsvFormat(ArrayFormat):
    """A format of another package (here, in a test): one 2-D sample per ``.csv`` file of numbers."""

    name, label, suffixes, steps = "csv", ".csv file", (".csv",), False

    def info(self, location, name=None, **options):
        return ArrayInfo(np.loadtxt(location, delimiter=",", ndmin=2).shape, np.dtype(np.float64))

    def open(self, location, name=None, **options):
        return str(location)

    def read_whole(self, handle, index=None):
        return np.loadtxt(handle, delimiter=",", ndmin=2)


def _entry_point(name, value):
    return metadata.EntryPoint(name, value, ENTRY_POINT_GROUP)


@pytest.fixture
def fresh_registry(monkeypatch):
    """The registry as before its entry points were loaded (restored after the test)."""
    monkeypatch.setattr(FORMATS, "_entries", dict(FORMATS._entries))
    monkeypatch.setattr(FORMATS, "_plugins_loaded", False)
    monkeypatch.setattr(FORMATS, "_refused", {}, raising=False)

    def plugins(entry_points):
        monkeypatch.setattr(plugin_registry.metadata, "entry_points",
                            lambda group: [ep for ep in entry_points if group == ENTRY_POINT_GROUP])

    return plugins


def test_a_format_named_by_an_entry_point_is_found_without_editing_dali_mesh(fresh_registry, tmp_path):
    fresh_registry([_entry_point("csv", f"{__name__}:CsvFormat")])
    fmt = format_named("csv")
    assert isinstance(fmt, CsvFormat) and list(FORMATS) == ["npy", "hdf5", "zarr", "csv"]
    path = tmp_path / "a.csv"
    np.savetxt(path, np.arange(6.0).reshape(2, 3), delimiter=",")
    assert format_of(str(path)) is fmt and fmt.info(str(path)).shape == (2, 3)
    # the CLI finds it by name too (a folder holding only such files)
    from dali_mesh.cli.options import find_data

    assert find_data(str(tmp_path)) == (fmt, [str(path)])


def test_an_entry_point_may_name_an_instance(fresh_registry):
    fresh_registry([_entry_point("csv", f"{__name__}:CSV_INSTANCE")])
    assert format_named("csv") is CSV_INSTANCE


CSV_INSTANCE = CsvFormat()


def _entry_point_of(name, value, package):
    """An entry point declared by the installed distribution ``package`` (what metadata gives for one)."""
    return _entry_point(name, value)._for(types.SimpleNamespace(name=package))


@pytest.mark.parametrize("value,match", [
    ("tests.formats.no_such_module:Format", r"entry point 'csv' = 'tests.formats.no_such_module:Format' .*"
                                            r"\(package 'broken-pkg'\) cannot be loaded \(ModuleNotFoundError"),
    (f"{__name__}:_entry_point", "is neither an ArrayFormat nor a subclass of one"),
])
def test_a_broken_plugin_is_skipped_with_a_warning_and_the_other_formats_work(fresh_registry, tmp_path, value, match):
    # issue 52: one broken plugin made every lookup fail, the built-in .npy source's in DALI's workers too
    fresh_registry([_entry_point_of("csv", value, "broken-pkg")])
    with pytest.warns(RuntimeWarning, match=match):
        assert format_named("npy") is NPY
    np.save(tmp_path / "a.npy", np.arange(3))
    assert format_of(str(tmp_path / "a.npy")) is NPY and list(FORMATS) == ["npy", "hdf5", "zarr"]
    for _ in range(2):  # its own name says why, at every lookup
        with pytest.raises(FormatPluginError, match=match):
            format_named("csv")


def test_a_plugin_named_otherwise_than_its_format_is_skipped(fresh_registry):
    fresh_registry([_entry_point_of("tsv", f"{__name__}:CsvFormat", "pkg-a")])
    with pytest.warns(RuntimeWarning, match="must be the format's name"):
        assert format_named("npy") is NPY
    with pytest.raises(FormatPluginError, match="must be the format's name"):
        format_named("tsv")


class EvilNpy(CsvFormat):
    """A plugin's format that takes a built-in's name."""

    name = "npy"


def test_an_entry_point_may_not_swap_a_built_in_format(fresh_registry):
    # issue 52: the parent read with the built-in, DALI's workers (the format by name) with the plugin
    fresh_registry([_entry_point_of("npy", f"{__name__}:EvilNpy", "evil-pkg")])
    with pytest.warns(RuntimeWarning, match=r"entry point 'npy' .* of package 'evil-pkg' \(EvilNpy\) is not used: "
                                            r"format 'npy' is dali_mesh's built-in NpyFormat"):
        assert format_named("npy") is NPY
    assert format_of("a.npy") is NPY
    assert pickle.loads(pickle.dumps(NPY)) is NPY  # what a worker gets: the same reader


def test_register_format_may_not_take_a_name_another_format_holds(fresh_registry):
    fresh_registry([])
    with pytest.raises(FormatPluginError, match=r"format 'npy' is already dali_mesh's built-in NpyFormat: "
                                                r"tests\.formats\.test_formats\.EvilNpy may not take its name"):
        register_format(EvilNpy())
    assert format_named("npy") is NPY
    register_format(NPY.__class__())  # the same class again: kept as it was
    assert format_named("npy") is NPY


def test_a_module_that_registers_a_built_in_name_on_import_is_a_skipped_plugin(fresh_registry, tmp_path,
                                                                               monkeypatch):
    (tmp_path / "evil_plugin.py").write_text(
        "from dali_mesh.formats import register_format\n"
        "from tests.formats.test_formats import CsvFormat, EvilNpy\n"
        "register_format(EvilNpy())  # at import, as a hostile plugin module would\n"
        "class Evil(CsvFormat):\n    name = 'evil'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    fresh_registry([_entry_point_of("evil", "evil_plugin:Evil", "evil-pkg")])
    with pytest.warns(RuntimeWarning, match=r"'evil-pkg'\) cannot be loaded \(FormatPluginError: format 'npy' is "
                                            "already dali_mesh's built-in NpyFormat"):
        assert format_named("npy") is NPY
    monkeypatch.delitem(sys.modules, "evil_plugin", raising=False)


def test_two_packages_declaring_one_name_are_refused_naming_both(fresh_registry):
    # issue 52: one of them was dropped silently
    fresh_registry([_entry_point_of("csv", f"{__name__}:CsvFormat", "pkg-a"),
                    _entry_point_of("csv", f"{__name__}:OtherCsv", "pkg-b")])
    both = r"format 'csv' is declared by package 'pkg-a' \(.*:CsvFormat\) and package 'pkg-b' \(.*:OtherCsv\)"
    with pytest.warns(RuntimeWarning, match=both):
        assert format_named("zarr") is ZARR
    with pytest.raises(FormatPluginError, match=both):
        format_named("csv")
    assert "csv" not in FORMATS and format_of("a.csv") is None


class OtherCsv(CsvFormat):
    """Another package's format of the same name."""


class PartialCsv(CsvFormat):
    """A plugin whose ``read_window`` writes the window's first element only (a bug of its own)."""

    def read_window(self, handle, region, out, **kwargs):
        out.flat[0] = -1.0


def test_a_plugin_that_leaves_elements_of_its_window_unwritten_gives_zeros_not_another_window(tmp_path):
    # issue 52: the sources recycle their output buffers; a plugin's read_window that does not fill `out`
    # returned the previous sample's values (or uninitialised memory)
    files = []
    for i in range(2):
        files.append(str(tmp_path / f"{i}.csv"))
        np.savetxt(files[-1], np.full((4, 6), 7.0 + i), delimiter=",")
    layout = Layout(MeshInfo((2,), ("mp",), (1,)), shard={"mp": 0}, batch=())
    source = FileSource(files, layout, format=PartialCsv())
    for sample_id in (0, 1, 0):
        (out,) = source._read(sample_id)
        want = np.zeros((2, 6))
        want.flat[0] = -1.0
        np.testing.assert_array_equal(out, want)
        del out


@pytest.mark.parametrize("fails_with", ["RuntimeError('broken')", "SystemExit(3)"])
def test_a_plugin_that_fails_after_registering_leaves_no_format_behind(fresh_registry, tmp_path, monkeypatch,
                                                                       fails_with):
    # review of issue 52: the format its module registered before failing stayed (listed and found), and a
    # SystemExit at its import escaped the lookup and left the other entry points never loaded
    (tmp_path / "halfway_plugin.py").write_text(
        "from dali_mesh.formats import register_format\n"
        "from tests.formats.test_formats import CsvFormat\n"
        "class Halfway(CsvFormat):\n    name = 'halfway'\n"
        "register_format(Halfway())\n"
        f"raise {fails_with}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    fresh_registry([_entry_point_of("halfway", "halfway_plugin:Halfway", "half-pkg"),
                    _entry_point_of("csv", f"{__name__}:CsvFormat", "csv-pkg")])
    with pytest.warns(RuntimeWarning, match=r"'half-pkg'\) cannot be loaded"):
        assert list(FORMATS) == ["npy", "hdf5", "zarr", "csv"]
    with pytest.raises(FormatPluginError, match="cannot be loaded"):
        format_named("halfway")
    monkeypatch.delitem(sys.modules, "halfway_plugin", raising=False)


def test_a_first_lookup_from_two_threads_sees_every_plugin(fresh_registry):
    # review of issue 52: the loader said "loaded" before it had loaded them, so a second thread's first lookup
    # could find only the built-ins ("no format named 'csv'")
    import threading as th
    import time

    started = th.Event()

    class SlowCsv(CsvFormat):
        def __init__(self):
            started.set()
            time.sleep(0.3)  # a plugin whose import takes a while

    globals()["SlowCsv"] = SlowCsv
    fresh_registry([_entry_point_of("csv", f"{__name__}:SlowCsv", "slow-pkg")])
    first = th.Thread(target=format_named, args=("npy",))
    first.start()
    assert started.wait(10)
    assert isinstance(format_named("csv"), SlowCsv)  # waits for the loading thread, never half the registry
    first.join()
