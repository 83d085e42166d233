"""The loader's side of a read group (``MeshLoader`` over a source built with ``share=``): the group
steps (one exchange of :class:`~dali_mesh.torch.group_exchange.GroupExchange` each), the batches of
the step being yielded, and where a checkpoint resumes: at the start of a group step (every member
the same step), less the batches of it already taken."""
from __future__ import annotations

from typing import Any, Callable

__all__ = ["GroupSteps"]


class GroupSteps:
    """The group steps of one member of a read group, over its ``exchange``."""

    def __init__(self, exchange) -> None:
        self.exchange = exchange
        self.pending: list[dict] = []  # the batches of the group step being yielded
        self.pending_ckpt = None  # the pipeline's checkpoint before that step's read
        self.skip = 0  # batches of the next group step already taken before a checkpoint
        self.deferred: BaseException | None = None  # the first batch's error, told at the first step

    def next(self, read: Callable[[], dict], checkpoint: Callable[[], Any], fingerprint: Callable[[], dict],
             started: bool) -> dict[str, Any]:
        """The next batch: from the group step being yielded, or the next step (this member's
        ``read()``, then the status and data exchange). ``checkpoint()``: the pipeline's checkpoint
        before the read (or ``None``); ``fingerprint()``: what the members agree on before any data
        moves; ``started``: the pipeline's iterator exists (its first batch did not fail)."""
        ex = self.exchange
        while not self.pending:
            step = ex.step
            if step * ex.size >= ex.num_batches:  # the epoch's last step is done: this member's epoch ends too
                if not started:
                    raise StopIteration
                try:
                    read()
                except StopIteration:
                    raise StopIteration from None
                raise RuntimeError("share=: this member's pipeline has more batches than its share of the epoch")
            batch = error = None
            self.pending_ckpt = checkpoint() if started else None
            if ex.mine(step) and self.deferred is not None:
                error, self.deferred = self.deferred, None
            elif ex.mine(step):
                try:
                    batch = read()
                except StopIteration:
                    error = RuntimeError("this member's pipeline ended its epoch before its share of it")
                except Exception as e:  # noqa: BLE001 - every member must hear of it (GroupExchange.exchange)
                    error = e
            if not ex.agreed:  # the members' fingerprints, before any data moves
                ex.agree(fingerprint())
            self.pending = ex.exchange(batch, error)
            del self.pending[:self.skip]  # taken before the checkpoint this loader resumed from
            self.skip = 0
        return self.pending.pop(0)

    def state(self, checkpoint: Callable[[], Any]) -> tuple[Any, int, int]:
        """``(pipeline checkpoint, group step, batches of it taken)`` to resume from: the start of the
        step being yielded (its checkpoint was taken before its read), else the next step."""
        ex = self.exchange
        if self.pending:
            step = ex.step - 1
            return self.pending_ckpt, step, ex.batches_of(step) - len(self.pending)
        return checkpoint(), ex.step, 0

    def resume(self, step: int, skip: int) -> None:
        """Continue at group step ``step``, dropping its first ``skip`` batches; the members compare
        their resumed steps before the next exchange."""
        self.exchange.step, self.pending, self.skip = int(step), [], int(skip)
        self.exchange.agreed = False

    def reset(self) -> None:
        """The next epoch starts at its first group step."""
        self.exchange.step, self.pending, self.skip = 0, [], 0
