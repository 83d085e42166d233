"""Plan files where the reader opens them: a sealed memfd of this process, or a file in a private
folder of this user (see :meth:`dali_mesh.plan.PlanSet.write`); and the plan-time reads of a
location's bytes."""
from __future__ import annotations

import atexit
import hashlib
import os
import stat
import tempfile
import threading

from dali_mesh.storage import store_of
from dali_mesh.storage.errors import DataFileError

__all__ = ["PlanFolderError", "read_file_at", "write_plan_file"]

_written: set[str] = set()
_written_lock = threading.Lock()


def write_plan_file(data: bytes, directory: str | None = None) -> str:
    """Stores the plan file ``data`` and returns its path (see :meth:`dali_mesh.plan.PlanSet.write`)."""
    if directory is None:
        path = _sealed_plan(data)
        if path is not None:
            return path
        directory = _default_plan_folder()
    directory = os.fspath(directory)
    _check_private_folder(directory, create=True)
    path = os.path.join(directory, f"{hashlib.sha256(data).hexdigest()[:32]}.{os.getpid()}.dmplan")
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC,
                     0o600)
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, path)  # atomic: a reader never sees half a plan
    with _written_lock:
        if not _written:
            atexit.register(_remove_written)
        _written.add(path)
    return path


class PlanFolderError(DataFileError):
    """A folder for plan files that another user could write into (or not a folder of this user)."""


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


_sealed: dict[bytes, str] = {}


def _sealed_plan(data: bytes) -> str | None:
    """``data`` in a sealed memfd of this process, as ``/proc/self/fd/N`` (kept open until exit), or
    None where there are no memfds (then a private folder is used)."""
    import fcntl

    memfd_create = getattr(os, "memfd_create", None)
    seals = [getattr(fcntl, n, None) for n in ("F_ADD_SEALS", "F_SEAL_SHRINK", "F_SEAL_GROW", "F_SEAL_WRITE",
                                               "F_SEAL_SEAL")]
    if memfd_create is None or None in seals or not os.path.isdir("/proc/self/fd"):
        return None
    key = hashlib.sha256(data).digest()
    with _written_lock:
        path = _sealed.get(key)
        if path is not None:
            return path
        try:
            fd = memfd_create("dali_mesh_plan", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        except OSError:  # a kernel without memfds
            return None
        try:
            _write_all(fd, data)
            fcntl.fcntl(fd, seals[0], seals[1] | seals[2] | seals[3] | seals[4])
        except BaseException:
            os.close(fd)
            raise
        path = _sealed[key] = f"/proc/self/fd/{fd}"
        return path


def _default_plan_folder() -> str:
    """``<tmp>/dali_mesh_plans_<uid>`` if it is this user's private folder (made so if absent), else a
    new private folder (``mkdtemp``): a folder someone else made first is never used."""
    folder = os.path.join(tempfile.gettempdir(), f"dali_mesh_plans_{os.getuid()}")
    try:
        _check_private_folder(folder, create=True)
        return folder
    except PlanFolderError:
        return tempfile.mkdtemp(prefix=f"dali_mesh_plans_{os.getuid()}_")


def _check_private_folder(folder: str, *, create: bool) -> None:
    """A real folder (not a link) owned by this user, writable by no one else; made (0700) if
    absent and ``create``."""
    if create:
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass
        except OSError as e:
            raise PlanFolderError(folder, f"cannot be made as a folder for plan files ({e.strerror or e})") from None
    try:
        st = os.lstat(folder)
    except OSError as e:
        raise PlanFolderError(folder, f"is no folder for plan files ({e.strerror or e})") from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise PlanFolderError(folder, "is not a folder (a link or a file): plan files are written only into a "
                              "folder of this user's own")
    if st.st_uid != os.getuid():
        raise PlanFolderError(folder, f"belongs to uid {st.st_uid}, not to this user ({os.getuid()}): its owner "
                              "could replace a plan with one that reads any file you can read; use a folder "
                              "of your own (plan_dir=...)")
    if st.st_mode & 0o022:
        raise PlanFolderError(folder, f"is writable by others (mode {stat.S_IMODE(st.st_mode):o}): they could "
                              "replace a plan with one that reads any file you can read; chmod go-w it or use "
                              "another folder (plan_dir=...)")


def _remove_written() -> None:
    for p in list(_written):
        try:
            os.unlink(p)
        except OSError:
            pass


def read_file_at(path: str, offset: int, size: int) -> bytes:
    """``size`` bytes of ``path`` (a location: a path or a URL) at ``offset`` (fewer at the end), for
    plan-time checks, read through its byte store."""
    store, key = store_of(path)
    return store.read_range(key, offset, size)
