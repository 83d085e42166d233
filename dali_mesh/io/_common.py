"""What every reader shares: I/O counters, the errors readers raise and the checks of a window
read's arguments against the stored array."""
from __future__ import annotations

import errno
import fcntl
import os
import stat
import threading
from dataclasses import dataclass, fields
from typing import Mapping, Sequence

import numpy as np

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


class DataFileError(ValueError):
    """A data file cannot be read as asked. ``path`` names the file."""

    def __init__(self, path, message: str) -> None:
        self.path = str(path)
        super().__init__(f"{self.path}: {message}")

    def __reduce__(self):  # picklable across DALI worker processes
        return (_rebuild_error, (type(self), self.path, self.args[0]))


def _rebuild_error(cls, path, full_message):
    err = cls.__new__(cls)
    err.path = path
    ValueError.__init__(err, full_message)
    return err


class HeaderError(DataFileError):
    """The file's header is missing, corrupt, oversized or disagrees with the file size."""


class UnsupportedDtypeError(DataFileError):
    """The stored dtype is not a plain numeric type (object, structured, string ...)."""


class TruncatedFileError(DataFileError):
    """The file holds fewer bytes than its header promises."""


class FileChangedError(DataFileError):
    """The file was rewritten in place while it was read (its size, modification or change time or
    inode differ after the read): the window could mix two versions, so none is returned."""


def file_identity(st: os.stat_result) -> tuple:
    """What changes when a file is rewritten in place: inode, size, modification and change times
    (ns; since Linux 6.13 a time that was read is followed by a fine-grained one, so a write right
    after a stat is seen)."""
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def check_unchanged(fd: int, path, before: tuple) -> None:
    """:class:`FileChangedError` naming ``path`` if the open file ``fd`` is not as ``before``."""
    after = file_identity(os.fstat(fd))
    if after != before:
        what = [n for n, a, b in zip(("device", "inode", "size", "modification time", "change time"), before, after)
                if a != b]
        raise FileChangedError(str(path), f"changed while it was read ({', '.join(what)} differ after the read): it "
                                          "was rewritten in place; the window is not returned (write files to a new "
                                          "name and rename them over the old one)")


class ShapeMismatchError(DataFileError):
    """A file's sample shape or dtype differs from the first file's."""


class MissingArrayError(DataFileError):
    """The HDF5 dataset or Zarr array named does not exist in the file."""


class UnsupportedFilterError(DataFileError):
    """An HDF5 dataset needs a filter (compressor) that is not available in this process."""


class MissingFileError(DataFileError, FileNotFoundError):
    """The file (or store) does not exist. Also a :class:`FileNotFoundError`, so that code catching
    that keeps working."""


class NotRegularFileError(DataFileError):
    """The path is a directory, FIFO, socket or device, not a regular file: reading a FIFO would
    block for ever, a directory cannot hold an array."""


class ExternalStorageError(DataFileError):
    """An HDF5 dataset whose bytes live in another file (external raw storage, an external link, a
    virtual dataset): refused unless ``allow_external=True``."""


# ---- opening files -------------------------------------------------------------------------------
def _kind_of(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    return "not a regular file"


def _not_regular(path, mode: int, what: str) -> NotRegularFileError:
    return NotRegularFileError(
        path, f"is {_kind_of(mode)}, not a regular {what}; a data file list may name regular files only")


def check_regular_file(path, what: str = "file") -> os.stat_result:
    """``os.stat`` of ``path`` (symlinks followed); :class:`MissingFileError` when it does not exist,
    :class:`NotRegularFileError` unless it is a regular file. For readers that hand the path to a
    library (HDF5, zarr) that would block for ever opening a FIFO."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise MissingFileError(path, f"no such {what}; check the path and the file list") from None
    except OSError as e:
        raise DataFileError(path, f"cannot be read ({e.strerror or e}); check its permissions") from None
    if not stat.S_ISREG(st.st_mode):
        raise _not_regular(path, st.st_mode, what)
    return st


def open_regular_file(path, what: str = "file") -> int:
    """Open ``path`` read-only and return its descriptor; refuse anything but a regular file.

    The open is non-blocking (opening a FIFO with no writer would block for ever), the kind is taken
    from ``fstat`` of the descriptor itself (no race with a rename), then the descriptor is switched
    back to blocking reads.
    """
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise MissingFileError(path, f"no such {what}; check the path and the file list") from None
    except IsADirectoryError:
        raise NotRegularFileError(path, f"is a directory, not a regular {what}") from None
    except OSError as e:
        raise DataFileError(path, f"cannot be opened ({e.strerror or e}); check the path and its permissions") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _not_regular(path, mode, what)
        fl = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, fl & ~getattr(os, "O_NONBLOCK", 0))
    except BaseException:
        os.close(fd)
        raise
    return fd


def set_direct(fd: int, path) -> None:
    """Switch an open descriptor to ``O_DIRECT``; a clear error where the platform or the file
    system refuses it."""
    if not hasattr(os, "O_DIRECT"):
        raise DataFileError(path, "O_DIRECT is not available on this platform; use direct=False")
    try:
        fl = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, fl | os.O_DIRECT)
    except OSError as e:
        if e.errno == errno.EINVAL:  # the file system refuses O_DIRECT (tmpfs, some FUSE ...)
            raise DataFileError(path, "its file system does not support O_DIRECT; use direct=False") from None
        raise DataFileError(path, f"cannot switch to O_DIRECT ({e.strerror or e}); use direct=False") from None


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


def normalise_index_maps(
    index_maps: Mapping[int, Sequence[int]] | None, ndim: int, path: str | None = None
) -> dict[int, Sequence[int]]:
    """``index_maps`` with each axis in ``0..ndim-1`` (``-1`` is the last axis, as numpy counts).
    Every plan looks its maps up by non-negative axis: a negative key left as it is would be
    ignored and the window read without its channel subset. An axis out of range is an error
    naming it (a :class:`DataFileError` naming ``path`` when one is given)."""
    out: dict[int, Sequence[int]] = {}
    for a, m in (index_maps or {}).items():
        if isinstance(a, (bool, np.bool_)) or not isinstance(a, (int, np.integer)) or not -ndim <= a < ndim:
            msg = (f"channel axis {a!r} is out of range for a sample of {ndim} axes "
                   f"(use 0..{ndim - 1}, or -{ndim}..-1 counted from the end)")
            if path is not None:
                raise DataFileError(path, msg)
            raise ValueError(msg)
        a = int(a) % ndim
        if a in out:
            raise ValueError(f"index_maps names axis {a} twice (as {a} and {a - ndim}): give one map per axis")
        out[a] = m
    return out


def sample_shape(
    path: str,
    full_shape: Sequence[int],
    prefix: Sequence[int],
    index_maps: Mapping[int, Sequence[int]] | None,
    what: str,
) -> tuple[int, ...]:
    """Shape of the sample ``array[prefix]`` of an array of ``full_shape``, each axis of
    ``index_maps`` cut to its map's length; :class:`DataFileError` for a ``prefix`` out of range
    (the message names ``what``: the array and its shape) or a map index out of range."""
    if len(prefix) > len(full_shape) or any(not 0 <= p < s for p, s in zip(prefix, full_shape)):
        raise DataFileError(path, f"sample index {tuple(prefix)} is out of range for {what}")
    shape = list(full_shape[len(prefix) :])
    for a, m in normalise_index_maps(index_maps, len(shape), path).items():
        m = np.asarray(m)
        if m.size and (m.min() < 0 or m.max() >= shape[a]):
            raise DataFileError(path, f"indices {m.tolist()} of axis {a} are out of range for size {shape[a]}")
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
    if region.ndim != len(shape) or any(e > s for e, s in zip(region.domain_stop, shape)):
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


def apply_index_maps(shape: tuple[int, ...], maps, path) -> tuple[int, ...]:
    """The sample shape after ``maps`` (axis -> indices read, e.g. a channel subset), every index
    checked against the file's ``shape``."""
    shape = list(shape)
    for a, m in (maps or {}).items():
        if not -len(shape) <= a < len(shape):
            raise DataFileError(path, f"channel axis {a} is out of range for sample shape {tuple(shape)}")
        if m.min() < 0 or m.max() >= shape[a]:
            raise DataFileError(path, f"channels {m.tolist()} are out of range for axis {a} of size {shape[a]}")
        shape[a] = len(m)
    return tuple(shape)
