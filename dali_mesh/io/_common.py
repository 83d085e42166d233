"""What every reader shares: I/O counters and the errors readers raise."""
from __future__ import annotations

import threading
from dataclasses import dataclass, fields

__all__ = [
    "IOStats",
    "DataFileError",
    "HeaderError",
    "UnsupportedDtypeError",
    "TruncatedFileError",
    "ShapeMismatchError",
    "MissingArrayError",
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


class ShapeMismatchError(DataFileError):
    """A file's sample shape or dtype differs from the first file's."""


class MissingArrayError(DataFileError):
    """The HDF5 dataset or Zarr array named does not exist in the file."""
