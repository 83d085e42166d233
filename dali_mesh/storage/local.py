"""The local POSIX store: keys are file paths of this machine. Files are opened read-only and
non-blocking (a FIFO never blocks the open), refused unless regular, read with ``preadv`` without
readahead (``POSIX_FADV_RANDOM``: the kernel reads only the pages asked for), optionally with
``O_DIRECT``; a file's version is its device, inode, size and modification and change times, checked
after the reads (a file rewritten in place is an error, never a window of two versions)."""
from __future__ import annotations

import errno
import fcntl
import os
import stat
from typing import Sequence

from dali_mesh.storage.byte_store import ByteStore, StoredObject, Version
from dali_mesh.storage.errors import DataFileError, FileChangedError, MissingFileError, NotRegularFileError

__all__ = ["LocalObject", "LocalStore", "LOCAL", "check_regular_file", "file_identity",
           "open_regular_file", "set_direct"]

_WILLNEED_CHUNK = 512 << 10  # the kernel caps one POSIX_FADV_WILLNEED at the readahead size


def file_identity(st: os.stat_result) -> tuple:
    """What changes when a file is rewritten in place: inode, size, modification and change times (ns; since
    Linux 6.13 a time that was read is followed by a fine-grained one, so a write right after a stat is seen)."""
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


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
    """Open ``path`` read-only and return its descriptor; refuse anything but a regular file. Non-blocking
    (a FIFO with no writer would block for ever), the kind from ``fstat`` of the descriptor (no race with a
    rename), then switched back to blocking reads."""
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


class LocalObject(StoredObject):
    """A regular file opened read-only (see :func:`open_regular_file`), without readahead."""

    def __init__(self, store: "LocalStore", key: str, what: str = "file", direct: bool = False) -> None:
        self.store, self.key = store, key
        self._fd = -1
        fd = open_regular_file(key, what)
        try:
            # the kind of file is checked before O_DIRECT is asked for, so that a directory or FIFO
            # is named as such rather than as a file system without O_DIRECT
            if direct:
                set_direct(fd, key)
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # the kernel reads only the pages asked for
            st = os.fstat(fd)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self.identity = file_identity(st)
        self._version = Version(st.st_size, st.st_mtime_ns)

    @property
    def name(self) -> str:
        return str(self.key)

    @property
    def version(self) -> Version:
        return self._version

    def fileno(self) -> int:
        """The descriptor (local fast paths only: ``mmap``, O_DIRECT bounce reads)."""
        return self._fd

    def readv(self, buffers: Sequence, offset: int) -> int:
        return os.preadv(self._fd, buffers, offset)

    def pread(self, n: int, offset: int) -> bytes:
        return os.pread(self._fd, n, offset)

    def current_size(self) -> int:
        """The file's size now (it may have changed since the open)."""
        return os.fstat(self._fd).st_size

    def check_unchanged(self) -> None:
        after = file_identity(os.fstat(self._fd))
        if after != self.identity:
            what = [n for n, a, b in zip(("device", "inode", "size", "modification time", "change time"),
                                         self.identity, after) if a != b]
            raise FileChangedError(self.key, f"changed while it was read ({', '.join(what)} differ after the read): "
                                             "it was rewritten in place; the window is not returned (write files to a "
                                             "new name and rename them over the old one)")

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        self.close()


class LocalStore(ByteStore):
    """Files of this machine; a key is a path (absolute, or relative to the working folder)."""

    spec = "file"
    native = True

    def open(self, key: str, what: str = "file", *, direct: bool = False) -> LocalObject:
        return LocalObject(self, os.fspath(key), what, direct)

    def stat(self, key: str) -> Version | None:
        try:
            st = check_regular_file(key)
        except MissingFileError:
            return None
        return Version(st.st_size, st.st_mtime_ns)

    def prefetch(self, key: str, ranges) -> None:
        if not hasattr(os, "posix_fadvise"):
            return
        try:
            fd = os.open(key, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return  # the read reports it
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return
            for offset, size in ranges:
                # only what lies inside the file (the read itself reports the rest)
                lo, hi = max(0, offset), min(st.st_size, offset + size)
                for a in range(lo, hi, _WILLNEED_CHUNK):
                    os.posix_fadvise(fd, a, min(_WILLNEED_CHUNK, hi - a), os.POSIX_FADV_WILLNEED)
        finally:
            os.close(fd)

    def local_path(self, key: str) -> str:
        return os.fspath(key)

    def zarr_store(self, key: str):
        from zarr.storage import LocalStore as ZarrLocalStore  # noqa: PLC0415

        return ZarrLocalStore(key, read_only=True)

    def __reduce__(self):
        return (_local_store, ())

    def __repr__(self) -> str:
        return "LocalStore()"


#: the one local store (a store holds no state: every reader shares it)
LOCAL = LocalStore()


def _local_store() -> LocalStore:
    return LOCAL
