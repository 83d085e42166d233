"""The tests every format passes (as :class:`tests.storage.store_tests.StoreTests` for byte stores, and
zarr-python's ``testing/store.py``): a new format subclasses :class:`FormatTests`, says how to write an
array with the format's OWN library (numpy, h5py, zarr-python) and how that library describes it, and
inherits the tests, not a copy of them. The oracle is the array the test wrote, sliced by numpy."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

from dali_mesh.formats import ArrayFormat, format_named, format_of
from dali_mesh.io import DataFileError
from dali_mesh.partition import BOUNDARIES, Region, take_window
from tests.helpers import random_array, random_region

#: (shape, chunks) of the arrays written: a leading steps axis for formats of samples along axis 0;
#: odd sizes, chunks that do not divide them, and a chunk as large as the array
CASES = [((5, 7, 9), (2, 3, 4)), ((3, 4, 6, 5), (1, 4, 6, 5))]
DTYPES = ["<f4", ">i2", "u1"]


class FormatTests:
    """Subclasses set ``format`` (the registered :class:`ArrayFormat`) and define :meth:`write` and
    :meth:`library_info`; ``dtypes`` narrows the dtypes the format stores."""

    format: ArrayFormat
    dtypes = DTYPES

    def write(self, directory, data: np.ndarray, chunks: tuple[int, ...]) -> tuple[str, str | None]:
        """Writes ``data`` (one sample for a format of one array per location, else samples along axis
        0) chunked ``chunks`` where the format chunks, with the format's own library; returns
        ``(location, array name or None)``."""
        raise NotImplementedError

    def library_info(self, location: str, name: str | None) -> tuple[tuple[int, ...], np.dtype, tuple | None]:
        """``(shape, dtype, chunks)`` as the format's own library reads them back."""
        raise NotImplementedError

    def missing_location(self, directory) -> str:
        return str(directory / f"missing{self.format.suffixes[0]}")

    # ---- fixtures -------------------------------------------------------------------------------
    @pytest.fixture(params=[(c, d) for c in range(len(CASES)) for d in DTYPES],
                    ids=lambda p: f"{'x'.join(map(str, CASES[p[0]][0]))}-{p[1]}")
    def stored(self, request, tmp_path):
        """``(location, name, data, chunks)``: an array the library wrote."""
        case, dtype = request.param
        if dtype not in self.dtypes:
            pytest.skip(f"the {self.format.name} format does not store {dtype}")
        shape, chunks = CASES[case]
        if not self.format.steps:  # one sample per location: no steps axis
            shape, chunks = shape[1:], chunks[1:]
        data = random_array(np.random.default_rng(case * 31 + len(dtype)), shape,
                            np.dtype(dtype).newbyteorder("=")).astype(dtype)
        location, name = self.write(tmp_path, data, chunks)
        return location, name, data, chunks

    def _samples(self, data):
        """``(prefix, sample)`` of every sample of ``data``."""
        if not self.format.steps:
            return [((), data)]
        return [((t,), data[t]) for t in range(data.shape[0])]

    # ---- finding --------------------------------------------------------------------------------
    def test_probe_and_format_of_find_it(self, stored):
        location = stored[0]
        assert self.format.probe(location)
        assert format_of(location) is self.format

    def test_the_format_pickles_as_the_registered_one(self):
        assert format_named(self.format.name) is self.format
        assert pickle.loads(pickle.dumps(self.format)) is self.format

    # ---- describing and reading -----------------------------------------------------------------
    def test_info_equals_the_library(self, stored):
        location, name, data, _ = stored
        info = self.format.info(location, name)
        shape, dtype, chunks = self.library_info(location, name)
        assert info.shape == shape == data.shape
        assert info.dtype == np.dtype(dtype).newbyteorder("=") == data.dtype.newbyteorder("=")
        assert info.dtype.isnative
        assert info.chunks == chunks

    @pytest.mark.parametrize("mode", BOUNDARIES)
    def test_read_window_of_random_regions_equals_numpy(self, stored, mode):
        location, name, data, _ = stored
        rng = np.random.default_rng(BOUNDARIES.index(mode))
        handle = self.format.open(location, name)
        try:
            for prefix, sample in self._samples(data):
                native = sample.astype(sample.dtype.newbyteorder("="))
                regions = [random_region(rng, sample.shape, mode, dtype=sample.dtype) for _ in range(3)]
                # the whole sample, and a window of its last cell on every axis (the edges)
                whole = Region([0] * sample.ndim, sample.shape, [0] * sample.ndim, sample.shape,
                               [0] * sample.ndim, sample.shape, mode, fill_value=0)
                last = [n - 1 for n in sample.shape]
                edge = Region(last, sample.shape, last, sample.shape, last, [n + (mode != "trim") for n in sample.shape],
                              mode, fill_value=0)
                for region in regions + [whole, edge]:
                    out = np.empty(region.window_shape, native.dtype)
                    out.view(np.uint8)[...] = 0xA5  # a format that says it fills every element (fills_window) must
                    self.format.fill_window(handle, region, out, prefix=prefix)
                    np.testing.assert_array_equal(out, take_window(native, region), err_msg=f"{prefix} {region}")
        finally:
            self.format.close(handle)

    def test_read_whole_equals_what_was_written(self, stored):
        location, name, data, _ = stored
        handle = self.format.open(location, name)
        try:
            np.testing.assert_array_equal(self.format.read_whole(handle), data)
            for prefix, sample in self._samples(data)[-1:]:
                if prefix:
                    np.testing.assert_array_equal(self.format.read_whole(handle, prefix[0]), sample)
        finally:
            self.format.close(handle)

    def test_a_missing_location_is_a_data_file_error_naming_it(self, tmp_path):
        location = self.missing_location(tmp_path)
        name = "x" if self.format.steps else None

        def read():  # a format may open lazily (.npy: at the first read)
            handle = self.format.open(location, name)
            try:
                region = Region((0,), (1,), (0,), (1,), (0,), (1,), "constant")
                self.format.read_window(handle, region, np.empty(1), prefix=(0,) * self.format.steps)
            finally:
                self.format.close(handle)

        for call in (lambda: self.format.info(location, name), read):
            with pytest.raises(DataFileError) as info:
                call()
            assert location in str(info.value)

    # ---- the native reader ----------------------------------------------------------------------
    def test_the_native_read_equals_read_window(self, tmp_path):
        """Where the format plans natively, the plugin's read of every sample's window equals the
        format's own :meth:`read_window` (and numpy's slicing of what was written)."""
        from tests.helpers import native_batches, needs_read_windows

        needs_read_windows()
        from dali_mesh import Layout, MeshInfo
        from dali_mesh.plan import NotNativeError
        from dali_mesh.source import array_source, file_source

        shape, chunks = CASES[0]
        if not self.format.steps:
            shape, chunks = shape[1:], chunks[1:]
        data = random_array(np.random.default_rng(5), shape, np.dtype("<f4"))
        location, name = self.write(tmp_path, data, chunks)
        layout = Layout(MeshInfo((2,), ("mp",), (1,)), shard={"mp": len(shape) - 1 - self.format.steps}, halo=1,
                        boundary="periodic")
        kw = dict(batch_size=1, shuffle=False)
        if self.format.steps:
            src = array_source([location], name, layout, format=self.format, **kw)
        else:
            src = file_source([location], layout, format=self.format, **kw)
        try:
            src.native_plans()
        except NotNativeError as e:
            pytest.skip(f"the {self.format.name} format does not plan this array natively: {e}")
        handle = self.format.open(location, name)
        try:
            for sample_id, window in native_batches(src, len(src)):
                prefix = (src.step_of(sample_id),) if self.format.steps else ()
                want = np.empty(src.region.window_shape, np.float32)
                self.format.read_window(handle, src.region, want, prefix=prefix)
                np.testing.assert_array_equal(window, want)
                sample = data[prefix] if prefix else data
                np.testing.assert_array_equal(window, take_window(sample, src.region))
        finally:
            self.format.close(handle)
