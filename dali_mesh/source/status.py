"""What a DALI worker process is reading, for the watchdog of the main process: :class:`WorkerStatus`
writes it, :class:`StatusReader` (what ``partitioned_source`` gives DALI) says it around each read."""
from __future__ import annotations

import logging
import os

__all__ = ["STATUS_BYTES", "StatusReader", "WorkerStatus"]

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

    def __getstate__(self):
        # the open file is this process's: a copy (a worker's) opens its own
        return {"folder": self.folder, "_pid": -1, "_fd": -1}

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


class StatusReader:
    """``source`` as DALI's parallel external source calls it (``reader(sample_info)``), writing to
    ``<status_dir>/<pid>`` what this worker reads, before and after each read: the watchdog names the
    sample and file(s) of a worker that died or hangs. ``status_dir`` is given when the external
    source is made (``partitioned_source``: the pipeline's status folder), and pickles into the workers
    with the reader; ``source`` itself writes nothing. Any source with the sources' sample order
    (``sample_order``, ``_files_of``) is read through its own ``__call__`` (a wrapper that fails its
    reads, say)."""

    def __init__(self, source, *, status_dir: str) -> None:
        self.source = source
        self.status = WorkerStatus(status_dir)

    def __call__(self, sample_info):
        order = self.source.sample_order(int(sample_info.epoch_idx))
        i = int(sample_info.idx_in_epoch)
        read = None
        if i < len(order):  # past the end: the source's own StopIteration
            sample_id = order[i][0]
            read = f"sample {sample_id} from {self.source._files_of(sample_id)}"
            self.status.note(f"reading {read}")
        out = self.source(sample_info)
        self.status.note(f"idle (last read {read})")
        return out
