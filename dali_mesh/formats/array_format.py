"""The format object: everything a source, the CLI (``plan``, ``demo``, ``convert``, advice) and the native
planner ask of one storage format, reading and writing.

The model is xarray's ``BackendEntrypoint`` (``open_dataset``, ``guess_can_open``): the sources and the
CLI ask the format; nobody switches on a file name's suffix or a format's name. A format is a subclass
of :class:`ArrayFormat` registered with :func:`~dali_mesh.formats.register_format` (the built-in ones in
their own folders, :mod:`dali_mesh.formats.npy`, ``.hdf5``, ``.zarr``), or named by an entry point of the
``dali_mesh.formats`` group of another package.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, NamedTuple

import numpy as np

from dali_mesh.io._common import ArrayWriter, DataFileError, NotWritableError

if TYPE_CHECKING:
    from dali_mesh.formats.cold_reads import ColdReads

__all__ = ["ArrayFormat", "ArrayInfo", "ArrayWriter"]


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
    #: whether windows of one array may be read from several threads at once (h5py serialises its
    #: calls: a copy of many threads then takes a lock around each read)
    reads_in_parallel = True
    #: the names a copy written by :meth:`create` is given, for messages (``()``: not written)
    write_suffixes: tuple[str, ...] = ()
    #: whether :meth:`read_window` writes every element of ``out`` (the built-in formats do, and their
    #: tests check it). A format that does not say so gets ``out`` zeroed first (:meth:`fill_window`): the
    #: sources hand out recycled buffers, and a reader that leaves elements unwritten would otherwise
    #: return another window's values or uninitialised memory
    fills_window = False

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

    def trust_options(self, allow_external: bool = False) -> dict:
        """The options of :meth:`info` and :meth:`open` that let an array whose bytes live in other
        files be read (``allow_external``; the CLI's ``--allow-external``), or ``{}`` for a format
        whose arrays cannot point elsewhere."""
        return {}

    def close(self, handle) -> None:
        """Closes a handle of :meth:`open` (nothing by default)."""

    def read_window(self, handle, region, out, *, prefix=(), index_maps=None, expected_shape=None,
                    expected_dtype=None) -> None:
        """Fills ``out`` with the window ``region`` of ``array[prefix]`` (a step), reading only what it needs."""
        raise NotImplementedError

    def fill_window(self, handle, region, out, **kwargs) -> None:
        """:meth:`read_window` into ``out``, zeroed first unless the format says it writes every element
        (:attr:`fills_window`): what the sources call."""
        if not self.fills_window:
            out[...] = 0
        self.read_window(handle, region, out, **kwargs)

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
        from dali_mesh.formats import written_suffixes  # noqa: PLC0415 - the registry imports this module

        raise NotWritableError(location, f"the {self.name} format is read, not written: dali_mesh writes "
                                         f"{', '.join(written_suffixes())}")

    def is_store(self, location) -> bool:
        """Whether ``location`` is a folder holding a store of this format (``convert --overwrite``
        replaces a folder only then)."""
        return False

    # ---- layout advice ----------------------------------------------------------------------------
    def advice_target(self, location, name: str | None = None, **options) -> ColdReads:
        """What a cold read of a window of the first sample of ``location`` pulls from storage, from its
        metadata (:class:`~dali_mesh.formats.cold_reads.ColdReads`: ``dali-mesh plan --data``)."""
        from dali_mesh.partition import LayoutError  # noqa: PLC0415

        raise LayoutError(f"{location}: the {self.name} format gives no layout advice")

    # ---- the native reader ------------------------------------------------------------------------
    def plan_files(self, files, *, region_of, index_maps=None, sample_shape=None, dtype=None, sample_ndim: int,
                   merge_gap: int):
        """The native plan of one sample per file of a format of one sample per location
        (``steps=False``; see :func:`dali_mesh.formats.npy.plan_npy_files`), or
        :class:`~dali_mesh.plan.NotNativeError`."""
        from dali_mesh.plan import NotNativeError  # noqa: PLC0415

        raise NotNativeError(f"{files[0]}: the {self.name} format is not read natively")

    def plan_steps(self, location, name, steps, region, *, plans, max_parts: int, options: Mapping | None = None,
                   index_maps=None, merge_gap: int = 0):
        """The native reads of the steps ``[first, stop)`` (``steps``) of the array ``name`` of
        ``location``, each step's window ``region``: a :class:`~dali_mesh.plan.chunks.StepReads` (data: the
        parts of each step, its finishing plan and window plan), its plans and files added to ``plans``
        (the series' :class:`~dali_mesh.plan.PlanSet`), at most ``max_parts`` parts
        (:func:`~dali_mesh.plan.chunks.too_many_parts`, asked before they are made); or
        :class:`~dali_mesh.plan.NotNativeError`. :func:`dali_mesh.plan.chunks.plan_time_series` calls it."""
        from dali_mesh.plan import NotNativeError  # noqa: PLC0415

        raise NotNativeError(f"{location}: the {self.name} format is not read natively")

    def __repr__(self) -> str:
        return f"<format {self.name}>"

    def __reduce__(self):  # a format pickles as its registered name (sources go to DALI's workers)
        from dali_mesh.formats import format_named  # noqa: PLC0415 - the registry imports this module

        return (format_named, (self.name,))
