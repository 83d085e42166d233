"""What a DALI worker process is reading, for the watchdog of the main process."""
from __future__ import annotations

import logging
import os

__all__ = ["STATUS_BYTES", "WorkerStatus"]

log = logging.getLogger(__name__)

#: the size of one worker's status record
STATUS_BYTES = 1024


class WorkerStatus:
    """Writes what this worker process is doing to its status file (``<folder>/<pid>``), so that a
    watchdog in the main process can name the file a dead or stuck worker was reading
    (:mod:`dali_mesh.pipeline.watchdog`). One ``pwrite`` to ``/dev/shm`` per note; a forked worker
    opens its own file, never its parent's."""

    def __init__(self, folder: str) -> None:
        self.folder: str | None = folder
        self._pid = -1
        self._fd = -1

    def note(self, text: str) -> None:
        if self.folder is None:
            return
        pid = os.getpid()
        if pid != self._pid:
            try:
                self._fd = os.open(os.path.join(self.folder, str(pid)), os.O_WRONLY | os.O_CREAT, 0o600)
            except OSError as e:  # diagnostics only: never fail a read for them
                log.debug("no worker status file in %s: %s", self.folder, e)
                self.folder = None
                return
            self._pid = pid
        data = text.encode("utf-8", "replace")[:STATUS_BYTES - 1]
        os.pwrite(self._fd, data + b"\0" * (STATUS_BYTES - len(data)), 0)
