"""Formats as objects: one registered object per storage format, with everything a source, the CLI
(``plan``, ``demo``, ``convert``, advice) and the native planner ask of a format, reading and writing.

The model is xarray's ``BackendEntrypoint`` (``open_dataset``, ``guess_can_open``): the sources and the
CLI ask the format; nobody switches on a file name's suffix. A format added here (an object with the
methods of :class:`ArrayFormat`, registered with :func:`register_format`) is read by
:class:`~dali_mesh.source.ArraySource`, planned natively if it plans, and found by the CLI.

Three formats today:

- ``npy``  one sample per ``.npy`` file (its header, byte ranges; :mod:`dali_mesh.formats.npy`)
- ``hdf5`` samples along axis 0 of an HDF5 dataset (NetCDF4 files are HDF5; :mod:`dali_mesh.formats.hdf5`)
- ``zarr`` samples along axis 0 of a Zarr array, v2 or v3, sharded or not (:mod:`dali_mesh.formats.zarr`)

HDF5 and Zarr are also written (:meth:`ArrayFormat.create`: chunked, uncompressed, what ``dali-mesh
convert`` writes); ``.npy`` is read only.
"""
from __future__ import annotations

import os
from typing import Mapping, NamedTuple

import numpy as np

from dali_mesh.io._common import ArrayWriter, DataFileError, NotWritableError, native_dtype

__all__ = ["ArrayFormat", "ArrayInfo", "ArrayWriter", "FORMATS", "HDF5", "NPY", "ZARR", "format_named", "format_of",
           "register_format", "written_suffixes"]


class ArrayInfo(NamedTuple):
    """What a format says of one stored array: its whole shape (the sample axes, after the steps axis
    of a time series), the dtype every reader fills (native byte order), its chunk shape (``None``:
    contiguous) and its codecs by name (``()``: stored raw)."""

    shape: tuple[int, ...]
    dtype: np.dtype
    chunks: tuple[int, ...] | None = None
    codecs: tuple[str, ...] = ()


class ArrayFormat:
    """One storage format. ``container`` is what a location is (``"file"``, ``"store"``), ``array_word``
    what holds the array inside it (``"dataset"``, ``"array"``: messages say "dataset 't2m'"),
    ``label`` a human name of one array, ``suffixes`` the names it is found by in a folder.

    A time series format (``steps=True``) holds samples along axis 0 of one named array per location;
    the others hold one sample per location."""

    name = ""
    label = ""
    container = "file"
    array_word = "array"
    suffixes: tuple[str, ...] = ()
    steps = True
    #: the names of an array's options this format takes (e.g. HDF5's ``h5_kwargs``)
    option_names: tuple[str, ...] = ()
    #: the names a copy written by :meth:`create` is given, for messages (``()``: not written)
    write_suffixes: tuple[str, ...] = ()

    # ---- finding ----------------------------------------------------------------------------------
    def probe(self, location) -> bool:
        """Whether ``location`` is of this format (by its name, as a folder listing finds it)."""
        return str(location).rstrip("/").lower().endswith(self.suffixes)

    def probe_names(self) -> tuple[str, ...]:
        """The names :meth:`probe` finds, for messages (``".h5"``, ...)."""
        return self.suffixes

    def default_name(self, location) -> str | None:
        """The array to read when none is named (``None``: the location is the array)."""
        return None

    # ---- describing and reading -------------------------------------------------------------------
    def info(self, location, name: str | None = None, **options) -> ArrayInfo:
        """The array's :class:`ArrayInfo` (metadata only)."""
        raise NotImplementedError

    def step_info(self, location, name: str | None = None, **options) -> tuple[int, tuple[int, ...], np.dtype]:
        """``(steps, step shape, dtype)`` of a time series array: refused, naming it, below two axes."""
        info = self.info(location, name, **options)
        if len(info.shape) < 2:
            raise DataFileError(location, f"{self.array_word} {name!r} has shape {info.shape}: need (step, ...) with "
                                          "at least 2 axes")
        return info.shape[0], tuple(info.shape[1:]), info.dtype

    def open(self, location, name: str | None = None, **options):
        """A handle for :meth:`read_window` (closed with :meth:`close`)."""
        raise NotImplementedError

    def close(self, handle) -> None:
        """Closes a handle of :meth:`open` (nothing by default)."""

    def read_window(self, handle, region, out, *, prefix=(), index_maps=None, expected_shape=None,
                    expected_dtype=None) -> None:
        """Fills ``out`` with the window ``region`` of ``array[prefix]`` (a step), reading only what it needs."""
        raise NotImplementedError

    def read_whole(self, handle, index=None) -> np.ndarray:
        """The whole array (or ``array[index]``, a step) by the format's own library: the oracle the
        demo checks windows against and what ``convert`` copies."""
        raise NotImplementedError

    # ---- writing ----------------------------------------------------------------------------------
    def create(self, location, name: str, shape, dtype, chunks, **options) -> ArrayWriter:
        """A new array ``name`` of ``shape`` and ``dtype`` at ``location`` (what is there is replaced),
        stored in ``chunks``, uncompressed: an :class:`ArrayWriter` (``write(index, values)`` from any
        thread, ``close()``; a ``with`` block discards the pending writes when it raises), or
        :class:`~dali_mesh.io.NotWritableError` for a format that is read only."""
        raise NotWritableError(location, f"the {self.name} format is read, not written: dali_mesh writes "
                                         f"{', '.join(written_suffixes())}")

    def is_store(self, location) -> bool:
        """Whether ``location`` is a folder holding a store of this format (``convert --overwrite``
        replaces a folder only then)."""
        return False

    # ---- the native reader ------------------------------------------------------------------------
    def plan_steps(self, location, name, steps, region, *, options: Mapping | None = None, **kw):
        """The native reads of ``steps`` (see :func:`dali_mesh.plan.chunks.plan_time_series`), or
        :class:`~dali_mesh.plan.NotNativeError`."""
        from dali_mesh.plan import NotNativeError  # noqa: PLC0415

        raise NotNativeError(f"{location}: the {self.name} format is not read natively")

    def __repr__(self) -> str:
        return f"<format {self.name}>"

    def __reduce__(self):  # a format pickles as its registered name (sources go to DALI's workers)
        return (format_named, (self.name,))


class _Npy(ArrayFormat):
    name, label, container, array_word, suffixes, steps = "npy", ".npy file", "file", "array", (".npy",), False

    def info(self, location, name=None, **options) -> ArrayInfo:
        from dali_mesh.formats.npy import read_npy_header  # noqa: PLC0415

        if name:
            raise DataFileError(location, "a .npy file holds one array: it has no named dataset or array")
        h = read_npy_header(location)
        return ArrayInfo(tuple(h.shape), h.native_dtype)

    def open(self, location, name=None, **options):
        return os.fspath(location)

    def read_window(self, handle, region, out, *, prefix=(), index_maps=None, expected_shape=None,
                    expected_dtype=None, **read_options) -> None:
        from dali_mesh.formats.npy import read_npy_window  # noqa: PLC0415

        read_npy_window(handle, region, out, prefix=prefix, index_maps=index_maps, expected_shape=expected_shape,
                        expected_dtype=expected_dtype, **read_options)

    def read_whole(self, handle, index=None) -> np.ndarray:
        arr = np.load(handle, allow_pickle=False)  # no mmap: a file rewritten meanwhile must not SIGBUS
        return arr if index is None else arr[index]


class _HDF5(ArrayFormat):
    name, label, container, array_word = "hdf5", "HDF5 dataset", "file", "dataset"
    suffixes = (".h5", ".hdf5", ".hdf", ".nc")
    option_names = ("h5_kwargs",)
    write_suffixes = (".h5", ".hdf5")

    def probe(self, location) -> bool:
        # NetCDF4 files are HDF5, but a folder of .nc files is a weather dataset: found by suffix only
        # where the CLI asks for arrays (see dali_mesh.cli.options.find_data)
        return str(location).rstrip("/").lower().endswith(self.probe_names())

    def probe_names(self) -> tuple[str, ...]:
        return self.suffixes[:3]

    def default_name(self, location) -> str:
        from dali_mesh.formats.hdf5 import only_dataset_name  # noqa: PLC0415

        return only_dataset_name(location)

    def info(self, location, name=None, h5_kwargs: Mapping | None = None, **options) -> ArrayInfo:
        from dali_mesh.formats.hdf5 import hdf5_filter_names  # noqa: PLC0415

        f, ds = self.open(location, name, h5_kwargs=h5_kwargs)
        with f:
            return ArrayInfo(tuple(ds.shape), native_dtype(ds.dtype), None if ds.chunks is None else tuple(ds.chunks),
                             hdf5_filter_names(ds))

    def open(self, location, name=None, h5_kwargs: Mapping | None = None, **options):
        from dali_mesh.formats.hdf5 import open_hdf5_dataset  # noqa: PLC0415

        return open_hdf5_dataset(location, name or self.default_name(location), **dict(h5_kwargs or {}))

    def close(self, handle) -> None:
        handle[0].close()

    def read_window(self, handle, region, out, *, prefix=(), index_maps=None, expected_shape=None,
                    expected_dtype=None) -> None:
        from dali_mesh.formats.hdf5 import read_hdf5_window  # noqa: PLC0415

        read_hdf5_window(handle[1], region, out, prefix=prefix, index_maps=index_maps, expected_shape=expected_shape,
                         expected_dtype=expected_dtype, path=handle[0].filename)

    def read_whole(self, handle, index=None) -> np.ndarray:
        return handle[1][()] if index is None else handle[1][index]

    def create(self, location, name, shape, dtype, chunks, **options) -> ArrayWriter:
        from dali_mesh.formats.hdf5 import create_hdf5_dataset  # noqa: PLC0415

        return create_hdf5_dataset(location, name, shape, dtype, chunks, **options)

    def plan_steps(self, location, name, steps, region, *, options: Mapping | None = None, **kw):
        from dali_mesh.formats.hdf5 import plan_hdf5_steps  # noqa: PLC0415

        return plan_hdf5_steps(location, name, steps, region, h5_kwargs=dict((options or {}).get("h5_kwargs") or {}),
                               **kw)


class _Zarr(ArrayFormat):
    name, label, container, array_word, suffixes = "zarr", "Zarr array", "store", "array", (".zarr",)
    write_suffixes = (".zarr",)

    def info(self, location, name=None, **options) -> ArrayInfo:
        from dali_mesh.formats.zarr import zarr_codec_names  # noqa: PLC0415

        arr = self.open(location, name)
        try:
            chunks = tuple(int(c) for c in arr.chunks)
        except Exception:  # noqa: BLE001 - sharded arrays describe their chunks otherwise
            chunks = None
        return ArrayInfo(tuple(arr.shape), native_dtype(arr.dtype), chunks, zarr_codec_names(arr))

    def open(self, location, name=None, **options):
        from dali_mesh.formats.zarr import open_zarr_array  # noqa: PLC0415

        return open_zarr_array(location, name)

    def read_window(self, handle, region, out, *, prefix=(), index_maps=None, expected_shape=None,
                    expected_dtype=None) -> None:
        from dali_mesh.formats.zarr import read_zarr_window  # noqa: PLC0415

        read_zarr_window(handle, region, out, prefix=prefix, index_maps=index_maps, expected_shape=expected_shape,
                         expected_dtype=expected_dtype)

    def read_whole(self, handle, index=None) -> np.ndarray:
        return np.asarray(handle[...] if index is None else handle[index])

    def create(self, location, name, shape, dtype, chunks, zarr_format: int = 3, **options) -> ArrayWriter:
        from dali_mesh.formats.zarr import create_zarr_array  # noqa: PLC0415

        return create_zarr_array(location, name, shape, dtype, chunks, zarr_format=zarr_format, **options)

    def is_store(self, location) -> bool:
        from dali_mesh.formats.zarr import is_zarr_store  # noqa: PLC0415

        return is_zarr_store(location)

    def plan_steps(self, location, name, steps, region, *, options: Mapping | None = None, **kw):
        from dali_mesh.formats.zarr import plan_zarr_steps  # noqa: PLC0415

        return plan_zarr_steps(location, name, steps, region, **kw)


NPY, HDF5, ZARR = _Npy(), _HDF5(), _Zarr()
#: the registered formats by name, in the order a folder is searched
FORMATS: dict[str, ArrayFormat] = {}


def register_format(fmt: ArrayFormat) -> ArrayFormat:
    """Registers ``fmt`` under its name (the sources, the CLI and pickling find it there)."""
    FORMATS[fmt.name] = fmt
    return fmt


for _fmt in (NPY, HDF5, ZARR):
    register_format(_fmt)


def format_named(name: str) -> ArrayFormat:
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"no format named {name!r} (formats: {', '.join(FORMATS)})") from None


def written_suffixes() -> tuple[str, ...]:
    """The names of the copies the registered formats write (``.h5``, ``.hdf5``, ``.zarr``), in the
    registry's order."""
    return tuple(s for fmt in FORMATS.values() for s in fmt.write_suffixes)


def format_of(location) -> ArrayFormat | None:
    """The format that says it reads ``location`` (by its name), or ``None``."""
    for fmt in FORMATS.values():
        if fmt.probe(location):
            return fmt
    return None
