"""Every registered format passes :class:`~tests.formats.format_tests.FormatTests`, its arrays written by
its own library; and a format of another package, named by an entry point of the ``dali_mesh.formats``
group, is found without editing dali_mesh."""
from __future__ import annotations

from importlib import metadata

import numpy as np
import pytest

from dali_mesh.formats import (ENTRY_POINT_GROUP, FORMATS, HDF5, NPY, ZARR, ArrayFormat, ArrayInfo, FormatPluginError,
                               format_named, format_of)
from dali_mesh.formats import format_registry
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
    monkeypatch.setattr(FORMATS, "_formats", dict(FORMATS._formats))
    monkeypatch.setattr(FORMATS, "_plugins_loaded", False)

    def plugins(entry_points):
        monkeypatch.setattr(format_registry.metadata, "entry_points",
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


@pytest.mark.parametrize("value,match", [
    ("tests.formats.no_such_module:Format", r"entry point 'csv' = 'tests.formats.no_such_module:Format' .* cannot be "
                                            r"loaded \(ModuleNotFoundError"),
    (f"{__name__}:_entry_point", "is neither an ArrayFormat nor a subclass of one"),
])
def test_a_broken_plugin_is_an_error_naming_it_at_every_lookup(fresh_registry, value, match):
    fresh_registry([_entry_point("csv", value)])
    for _ in range(2):  # not loaded half: the next lookup says it again
        with pytest.raises(FormatPluginError, match=match):
            format_named("npy")


def test_a_plugin_may_not_take_a_registered_name_or_another_name_than_its_own(fresh_registry):
    fresh_registry([_entry_point("npy", f"{__name__}:CsvFormat")])
    with pytest.raises(FormatPluginError, match="must be the format's name"):
        format_of("a.npy")
    CsvFormat.name = "npy"
    try:
        with pytest.raises(FormatPluginError, match="format 'npy' is already NpyFormat"):
            format_of("a.npy")
    finally:
        CsvFormat.name = "csv"
