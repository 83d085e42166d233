"""What a dataset is made of, whatever stores it: :class:`Variable` (one named array with its dims),
and :class:`DatasetFormat`, the base of the kinds of datasets (a Zarr group, NetCDF4 files) with the
registry that finds them by name.

A dataset format is to :class:`~dali_mesh.datasets.variables_source.VariablesSource` what a format is
to an array source (xarray's ``BackendEntrypoint``): the source asks it for the variables, the
coordinates and the time axis, and for the array source of each variable it reads; it never asks
which kind it holds.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dali_mesh.datasets.cf_time import decode_cf_time
from dali_mesh.partition import Layout
from dali_mesh.source import WindowSource

__all__ = ["DATASET_FORMATS", "DatasetFormat", "Variable", "dataset_format_named", "register_dataset_format"]


@dataclass(frozen=True)
class Variable:
    """One array of a dataset: where it is stored (``locations``: the group, or the files it runs
    across in time order), its ``name`` there, its dims (names), whole shape (the steps of every
    location), dtype and attributes."""

    name: str
    dims: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: np.dtype
    attrs: dict
    #: the CF fill value xarray masks to NaN (Zarr v2: the array's fill_value; v3 and NetCDF: the
    #: ``_FillValue`` attribute), None if there is none
    cf_fill: object = None
    locations: tuple = ()

    def cf_decoding(self) -> str | None:
        """What xarray would change in the stored values of this variable (CF decoding), or None: a
        reader of raw values would return other numbers than ``xarray.open_dataset``."""
        packed = [a for a in ("scale_factor", "add_offset") if a in self.attrs]
        if packed:
            return f"it is packed ({', '.join(packed)}): xarray unpacks it to floats"
        # xarray's UnsignedIntegerCoder: "_Unsigned": "true" on signed integers reads them unsigned,
        # "false" on unsigned ones signed (the bytes are the same, the values not: int8 -34 is 222)
        unsigned = self.attrs.get("_Unsigned")
        if unsigned is not None and self.dtype.kind in "iu":
            flip = {"i": ("true", "u"), "u": ("false", "i")}[self.dtype.kind]
            if str(unsigned) == flip[0]:
                other = np.dtype(f"{flip[1]}{self.dtype.itemsize}")
                return f"its _Unsigned attribute {unsigned!r} makes xarray read its {self.dtype} values as {other}"
        for what, value in (("_FillValue", self.cf_fill), ("missing_value", self.attrs.get("missing_value"))):
            if value is None:
                continue
            values = np.atleast_1d(np.asarray(value))
            if values.dtype.kind == "f" and np.all(np.isnan(values)):
                continue  # NaN stays NaN
            return f"its {what} {values.tolist()} is masked to NaN by xarray"
        return None


class DatasetFormat:
    """A dataset of one kind at its location(s), opened: its variables, coordinates and time axis, and
    the array source of each variable. A subclass is one kind (``name``, the registry's key, and
    ``label``, the source class messages name); it is registered with :func:`register_dataset_format`.

    Args:
        locations: the location(s) as the user gives them (a kind says how many it takes), each
            resolved once with ``storage_options`` (:func:`~dali_mesh.storage.resolve_locations`)
            before anything is read.
        storage_options: for ``s3://``, ``gs://`` and ``https://`` locations, already checked by the
            source that keeps them.
        time_dim: the dim along which the dataset's samples (time steps) run.

    Attributes: ``store`` (the location messages name), ``files`` (every location, in time order
    once :meth:`in_time_order` has run), ``variables`` (``{name: Variable}``).
    """

    name = ""
    label = ""
    store: str
    files: list
    variables: dict[str, Variable]

    def __init__(self, locations, storage_options: dict | None = None, time_dim: str = "time") -> None:
        self.time_dim = time_dim

    def coordinate(self, name: str) -> np.ndarray:
        """The stored values of the 1-D variable ``name`` (a coordinate), read whole."""
        raise NotImplementedError

    def in_time_order(self) -> tuple["DatasetFormat", np.ndarray]:
        """``(dataset, times)``: this dataset with its locations in time order (one location: itself)
        and its time coordinate decoded as CF (``datetime64[ns]``)."""
        var = self.variables[self.time_dim]
        return self, decode_cf_time(self.coordinate(self.time_dim), var.attrs, f"{self.store}: {self.time_dim!r}")

    def where_step(self, step: int) -> str:
        """Where time step ``step`` is stored, for messages (``" in <file>"`` of several; else ``""``)."""
        return ""

    def array_source(self, variable: str, layout: Layout, **options) -> WindowSource:
        """The source of ``variable``'s samples along its time dim (``options`` as
        :class:`~dali_mesh.source.ArraySource`'s)."""
        raise NotImplementedError


#: the kinds of datasets, by name
DATASET_FORMATS: dict[str, type[DatasetFormat]] = {}


def register_dataset_format(kind: type[DatasetFormat]) -> type[DatasetFormat]:
    """Registers a kind of dataset under its ``name`` (usable as a class decorator)."""
    if not (isinstance(kind, type) and issubclass(kind, DatasetFormat)) or not kind.name:
        raise TypeError(f"a dataset format is a DatasetFormat subclass with a name, got {kind!r}")
    DATASET_FORMATS[kind.name] = kind
    return kind


def dataset_format_named(kind) -> type[DatasetFormat]:
    """The kind of dataset ``kind`` names (a registered name, or the class itself)."""
    if isinstance(kind, type) and issubclass(kind, DatasetFormat):
        return kind
    found = DATASET_FORMATS.get(kind) if isinstance(kind, str) else None
    if found is None:
        raise ValueError(f"dataset format {kind!r} is not one of {sorted(DATASET_FORMATS)} (register it with "
                         "dali_mesh.datasets.register_dataset_format)")
    return found
