"""The errors of reading stored bytes: every one names the object (a file path or a URL) and survives
pickling across DALI's worker processes. The format readers (``dali_mesh.io``) raise these and their
own subclasses."""
from __future__ import annotations

__all__ = ["EXTRA", "DataFileError", "FileChangedError", "MissingFileError", "NotRegularFileError",
           "TruncatedFileError", "needed"]

#: what a user installs to read reference sets and Icechunk repositories (setup.py's extras_require)
EXTRA = "dali_mesh[virtual]"


def needed(what: str, load):
    """``load()``, which imports what a store needs, or an ImportError saying ``what`` needs it and the extra that
    installs it (the stores' one message for a package missing)."""
    try:
        return load()
    except ImportError as e:
        raise ImportError(f"{what}: pip install '{EXTRA}' ({e})") from None


class DataFileError(ValueError):
    """A data file cannot be read as asked. ``path`` names the file (or the object's URL)."""

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


class TruncatedFileError(DataFileError):
    """The file holds fewer bytes than its header promises."""


class FileChangedError(DataFileError):
    """The file was rewritten in place while it was read (its size, modification or change time or
    inode differ after the read): the window could mix two versions, so none is returned."""


class MissingFileError(DataFileError, FileNotFoundError):
    """The file (or store) does not exist. Also a :class:`FileNotFoundError`, so that code catching
    that keeps working."""


class NotRegularFileError(DataFileError):
    """The path is a directory, FIFO, socket or device, not a regular file: reading a FIFO would
    block for ever, a directory cannot hold an array."""
