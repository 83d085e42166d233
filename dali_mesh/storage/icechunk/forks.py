"""Processes forked from one that used the icechunk library, where its first call would wait for ever (its
runtime's threads are not in the child): a store there refuses at its first read with
:class:`ForkedProcessError` (docs/remote-storage.md, "Icechunk repositories": worker processes)."""
from __future__ import annotations

import os
import sys

from dali_mesh.storage.errors import DataFileError

__all__ = ["ForkedProcessError", "check_process"]

#: the id of the process whose icechunk library started its runtime (this module's first call of the library
#: there, or threads of the runtime found when the process forked), else None. A forked child inherits the
#: parent's id: there the library's calls would wait for ever, and :func:`check_process` refuses them.
_library_pid: int | None = None

#: the advice of every refusal in a forked process
_ADVICE = ('start the processes that read by spawning: py_start_method="spawn" in DALI\'s pipeline '
           '(pipeline_def / Pipeline), multiprocessing_context="spawn" (or "forkserver") in torch\'s DataLoader')


class ForkedProcessError(DataFileError):
    """An Icechunk repository read in a process forked from one that used the icechunk library: refused, as
    the library would wait for ever there. ``path`` names the repository."""


def check_process(name: str) -> None:
    """Refuses (:class:`ForkedProcessError` naming ``name``) to call the library in a process forked from
    one that used it; else notes that this process uses it (from here on its forked children are refused)."""
    global _library_pid
    pid = os.getpid()
    if _library_pid is None:
        _library_pid = pid
    elif _library_pid != pid:
        raise ForkedProcessError(name, f"cannot be read in this process (pid {pid}): it was forked from a process "
                                       f"(pid {_library_pid}) that had used the icechunk library, whose runtime "
                                       f"threads a forked process lacks, so the library's first call here would "
                                       f"wait for ever; {_ADVICE}")


def _runtime_threads() -> bool:
    """Whether the icechunk library's runtime (tokio: threads named ``tokio-runtime-worker``, 15 characters
    of it in ``comm``) runs in this process. Linux only (``/proc``); elsewhere False."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return False
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm", "rb") as f:
                if f.read().startswith(b"tokio-runtime"):
                    return True
        except OSError:  # the thread ended meanwhile
            continue
    return False


def _before_fork() -> None:
    """Notes, in a process about to fork, that the library runs here when it was used without this module
    (the user's own ``icechunk`` calls: a repository written before the loader's workers fork), so that the
    child refuses rather than waits. Only an imported library can have started its runtime."""
    global _library_pid
    if _library_pid is None and "icechunk" in sys.modules and _runtime_threads():
        _library_pid = os.getpid()


os.register_at_fork(before=_before_fork)
