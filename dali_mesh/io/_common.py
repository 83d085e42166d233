"""What every reader shares: I/O counters, the errors readers raise and the checks of a window
read's arguments against the stored array; and what every writer is (:class:`ArrayWriter`)."""
from __future__ import annotations

import threading
from dataclasses import dataclass, fields
from typing import Callable, Mapping, Sequence

import numpy as np

from dali_mesh.partition import Region
from dali_mesh.plan.window import WindowPlan, normalise_index_maps, plan_window
from dali_mesh.storage.errors import (DataFileError, FileChangedError, MissingFileError, NotRegularFileError,
                                      TruncatedFileError)

__all__ = [
    "IOStats",
    "DataFileError",
    "HeaderError",
    "UnsupportedDtypeError",
    "TruncatedFileError",
    "FileChangedError",
    "ShapeMismatchError",
    "MissingArrayError",
    "MissingFileError",
    "NotRegularFileError",
    "ExternalStorageError",
    "UnsupportedFilterError",
    "NotWritableError",
    "ArrayWriter",
    "global_stats",
    "reset_global_stats",
]


@dataclass
class IOStats:
    """I/O counters of one or more window reads.

    Attributes:
        window_bytes: bytes of the windows filled (halo included).
        bytes_read: bytes requested from storage (merged gaps, headers and alignment included; for
            HDF5 the stored bytes of the chunks touched, or the hyperslab bytes when contiguous; for
            Zarr the bytes the store returned).
        read_calls: read system calls (``preadv``/``pread``), HDF5 ``read_direct`` calls, or Zarr store
            ``get`` calls.
        files_opened: files (or stores, or datasets) opened.
    """

    window_bytes: int = 0
    bytes_read: int = 0
    read_calls: int = 0
    files_opened: int = 0

    def add(self, other: "IOStats") -> "IOStats":
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self

    def __iadd__(self, other: "IOStats") -> "IOStats":
        return self.add(other)

    def copy(self) -> "IOStats":
        return IOStats(**{f.name: getattr(self, f.name) for f in fields(self)})

    @property
    def amplification(self) -> float:
        """``bytes_read / window_bytes`` (0 for no window bytes)."""
        return self.bytes_read / self.window_bytes if self.window_bytes else 0.0


_GLOBAL = IOStats()
_GLOBAL_LOCK = threading.Lock()


def _account(stats: IOStats | None, delta: IOStats) -> None:
    """Add ``delta`` to the process-wide counter and to ``stats`` when given."""
    with _GLOBAL_LOCK:
        _GLOBAL.add(delta)
    if stats is not None:
        stats.add(delta)


def global_stats() -> IOStats:
    """A copy of this process's counters (every read of every reader since the last reset)."""
    with _GLOBAL_LOCK:
        return _GLOBAL.copy()


def reset_global_stats() -> None:
    with _GLOBAL_LOCK:
        for f in fields(_GLOBAL):
            setattr(_GLOBAL, f.name, 0)


class HeaderError(DataFileError):
    """The file's header is missing, corrupt, oversized or disagrees with the file size."""


class UnsupportedDtypeError(DataFileError):
    """The stored dtype is not a plain numeric type (object, structured, string ...)."""


class ShapeMismatchError(DataFileError):
    """A file's sample shape or dtype differs from the first file's."""


class MissingArrayError(DataFileError):
    """The HDF5 dataset or Zarr array named does not exist in the file."""


class UnsupportedFilterError(DataFileError):
    """An HDF5 dataset needs a filter (compressor) that is not available in this process."""


class ExternalStorageError(DataFileError):
    """An HDF5 dataset whose bytes live in another file (external raw storage, an external link, a
    virtual dataset): refused unless ``allow_external=True``."""


class NotWritableError(DataFileError):
    """A copy was asked of a format that dali_mesh reads but does not write (``.npy``)."""


# ---- what a format's create() returns ---------------------------------------------------------------
class ArrayWriter:
    """An array being written, from :meth:`ArrayFormat.create <dali_mesh.formats.ArrayFormat.create>`.

    ``write(index, values)`` stores ``array[index] = values`` and may be called from several threads;
    ``close()`` returns once every write has reached storage (a write that fails, a full disk say,
    raises here at the latest, after discarding); ``discard(error)`` ends a copy that ``error`` (a
    failed write, an interrupt) stopped; the caller removes ``location``. In a ``with`` block the
    writer closes, or discards when the block raised.
    """

    location = ""

    def write(self, index, values) -> None:
        raise NotImplementedError

    def add_array(self, name: str, values) -> None:
        """Stores ``values`` whole as another array ``name`` beside the one being written (what
        ``dali-mesh convert --renumber`` writes with the features: the permutation, the graph)."""
        raise NotImplementedError(f"{type(self).__name__} writes one array only")

    def close(self) -> None:
        """Every write has reached storage (nothing is pending by default)."""

    def discard(self, error: BaseException | None = None) -> None:
        """Ends a copy that ``error`` stopped (nothing to undo by default)."""

    def __enter__(self) -> "ArrayWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            self.close()
        else:
            self.discard(exc)
        return False


# ---- argument checks shared by the readers (npy, HDF5, Zarr) -------------------------------------
def check_dtype(path, dtype, label: str = "") -> np.dtype:
    """``dtype`` if the pipeline can carry it, else :class:`UnsupportedDtypeError` naming the file.

    DALI tensors hold bool, integers up to 64 bits and float16/32/64; complex, datetime64,
    timedelta64 and long double (float96/float128) would be read here only to fail later at
    pipeline build, naming no file. ``label`` starts the message (e.g. the dataset's name)."""
    dtype = np.dtype(dtype)
    what = None
    if dtype.fields is not None or dtype.subdtype is not None:
        what = "a structured or subarray dtype"
    elif dtype.kind == "c":
        what = "complex"
    elif dtype.kind in "mM":
        what = "a datetime64/timedelta64 dtype"
    elif dtype.kind == "f" and dtype.itemsize > 8:
        what = "long double (wider than float64)"
    elif dtype.kind not in "biuf":
        what = "not a plain numeric dtype"
    if what is not None:
        raise UnsupportedDtypeError(
            path, f"{label}dtype {dtype} is {what}, which the pipeline cannot carry; store bool, "
            "integers or float16/32/64 (e.g. real and imaginary parts as two channels, times as int64)")
    return dtype


def native_dtype(dtype) -> np.dtype:
    """``dtype`` in native byte order (the dtype every reader fills its output with)."""
    dtype = np.dtype(dtype)
    return dtype.newbyteorder("=") if dtype.byteorder not in "=|" else dtype


def sample_shape(
    path: str,
    full_shape: Sequence[int],
    prefix: Sequence[int] = (),
    index_maps: Mapping[int, Sequence[int]] | None = None,
    what: str = "",
) -> tuple[int, ...]:
    """Shape of the sample ``array[prefix]`` of an array of ``full_shape``, each axis of
    ``index_maps`` (e.g. a channel subset) cut to its map's length; :class:`DataFileError` for a
    ``prefix`` out of range (the message names ``what``: the array and its shape), an axis out of range
    or a map index out of range."""
    if len(prefix) > len(full_shape) or any(not 0 <= p < s for p, s in zip(prefix, full_shape)):
        raise DataFileError(path, f"sample index {tuple(prefix)} is out of range for {what}")
    shape = list(full_shape[len(prefix) :])
    for a, m in normalise_index_maps(index_maps, len(shape), path).items():
        m = np.asarray(m)
        if m.size and (m.min() < 0 or m.max() >= shape[a]):
            i = int(np.argmax((m < 0) | (m >= shape[a])))
            raise DataFileError(path, f"index {int(m[i])} (position {i} of {m.size}) of axis {a} is out of range "
                                      f"for size {shape[a]}")
        shape[a] = len(m)
    return tuple(shape)


def check_expected(
    path: str,
    shape: tuple[int, ...],
    dtype: np.dtype,
    expected_shape: Sequence[int] | None,
    expected_dtype,
    *,
    label: str = "",
    unit: str = "file",
) -> None:
    """:class:`ShapeMismatchError` when the sample's shape or dtype differs from the expected one.
    ``label`` starts the message (e.g. the dataset's name); ``unit`` is what the caller reads
    (``"file"`` or ``"store"``)."""
    if expected_shape is not None and tuple(expected_shape) != shape:
        raise ShapeMismatchError(
            path, f"{label}sample shape {shape} differs from the expected {tuple(expected_shape)} "
            f"(the first {unit}'s); make every {unit} the same shape, or ask for per-sample shapes")
    if expected_dtype is not None and np.dtype(expected_dtype) != dtype:
        raise ShapeMismatchError(path, f"{label}dtype {dtype} differs from the expected {np.dtype(expected_dtype)}")


def check_region_fits(path: str, region, shape: tuple[int, ...]) -> None:
    """:class:`DataFileError` unless ``region``'s domain lies within a sample of ``shape``."""
    if region.ndim != len(shape) or any(e > s for e, s in zip(region.domain_stop, shape)) or \
            any(d < 0 for d in region.domain_start):
        raise DataFileError(path, f"region {region.domain_start}..{region.domain_stop} does not fit the sample shape {shape}")


def window_out(path: str, region, out: np.ndarray | None, dtype: np.dtype) -> np.ndarray:
    """``out`` checked against ``region.window_shape`` and ``dtype``, or a new array when ``None``."""
    if out is None:
        return np.empty(region.window_shape, dtype)
    if tuple(out.shape) != region.window_shape or out.dtype != dtype:
        raise ValueError(f"{path}: out has shape {out.shape} and dtype {out.dtype}; expected {region.window_shape} {dtype}")
    return out


def check_frame(shape, path) -> None:
    """A sample needs at least one axis and one cell: a 0-d or empty array is no sample."""
    if len(shape) == 0:
        raise DataFileError(path, "holds a 0-d array (shape ()): a sample needs at least one axis")
    if any(s == 0 for s in shape):
        raise DataFileError(path, f"holds an empty array (shape {tuple(shape)}): a sample needs at least one cell")


def fill_window(path: str, region: Region, out: np.ndarray | None, dtype: np.dtype, shape: tuple[int, ...],
                read_box: Callable[[np.ndarray, tuple, tuple], None], local: IOStats, *,
                prefix: Sequence[int] = (), index_maps: Mapping[int, Sequence[int]] | None = None,
                expected_shape: Sequence[int] | None = None, expected_dtype=None, label: str = "",
                unit: str = "file", contiguous: bool = False) -> tuple[np.ndarray, WindowPlan | None]:
    """What every reader of a sample ``array[prefix]`` of ``shape`` (``dtype`` native) does around its
    reads: check the sample against what is expected and the region against the sample, make (or
    check) ``out``, call ``read_box(buffer, window index, array index)`` for each box of the plan,
    then run the boundary program. ``contiguous``: the reads need a C-contiguous buffer (one is
    staged when ``out`` is not). Returns ``(out, plan)``; ``plan`` is None for an empty window."""
    check_expected(path, shape, dtype, expected_shape, expected_dtype, label=label, unit=unit)
    check_region_fits(path, region, shape)
    out = window_out(path, region, out, dtype)
    local.window_bytes += out.nbytes
    if out.size == 0:
        return out, None
    plan = plan_window(region, index_maps)
    buf = out if not contiguous or out.flags.c_contiguous else np.empty(out.shape, dtype)
    for dst, src in plan.slices(prefix):
        read_box(buf, dst, src)
    if buf is not out:
        out[...] = buf
    plan.finish(out)
    return out, plan
