"""What a :class:`~readers.webdataset.StreamingShards` and the copies of it in DataLoader
workers share: the epoch and resume position its main process chose (:meth:`SharedCursor.publish`,
which persistent workers follow) and which workers handed out the last sample of their share
since (:meth:`SharedCursor.finished`), so that a pass that repeats a whole one without a word
from ``set_epoch`` is said (:meth:`SharedCursor.repeats`)."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["SharedCursor"]


class SharedCursor:
    """A worker-split dataset's epoch and resume position (``(skips per worker, first)``), also
    in shared memory: a DataLoader's persistent workers keep their copy of the dataset from
    epoch to epoch and take, at each iteration, what :meth:`publish` gave since (torch shares
    the tensor with them, forked or spawned; a plain pickle copies it). A position for more
    than :data:`SLOTS` workers is not shared: such workers keep the one they started with.
    Beside it, the workers of the latest pass and which of them ran to the end of their share."""

    SLOTS = 1024
    #: Where the pass record starts: the latest pass's worker count, then a flag per worker.
    PASS = 5 + SLOTS
    __slots__ = ("tensor", "seen")

    def __getstate__(self) -> tuple[torch.Tensor, int]:
        return self.tensor, self.seen

    def __setstate__(self, state: tuple[torch.Tensor, int]) -> None:
        tensor, self.seen = state
        # torch's own pickling (a DataLoader starting workers) shares the memory; a plain pickle
        # or a deepcopy brings a private copy: shared again, between this copy and its workers
        self.tensor = tensor if tensor.is_shared() else tensor.share_memory_()

    def __init__(self) -> None:
        # generation, epoch, position (0: none, 1: here, 2: too large to share), first worker, worker count, skips...,
        # then the pass record: its worker count (0: no pass since the last publish), a flag per worker
        self.tensor = torch.zeros(self.PASS + 1 + self.SLOTS, dtype=torch.int64).share_memory_()
        self.seen = 0

    def publish(self, cursor: Any) -> None:
        """Make ``cursor``'s epoch and position what every copy follows from its next iteration
        (a choice: no pass since repeats another)."""
        t, position = self.tensor, cursor.position
        t[1] = cursor.epoch
        shared = position is not None and len(position[0]) <= self.SLOTS
        t[2] = 0 if position is None else 1 if shared else 2
        if shared:
            skips, first = position
            t[3], t[4] = int(first), len(skips)
            t[5 : 5 + len(skips)] = torch.as_tensor(list(skips), dtype=torch.int64)
        t[self.PASS :] = 0
        t[0] += 1  # last: a copy that sees the new generation sees the fields before it
        self.seen = int(t[0])

    def follow(self, cursor: Any) -> None:
        """In a copy (a persistent worker's): take the epoch and position published since it was made."""
        t = self.tensor
        generation = int(t[0])
        if generation == self.seen:
            return
        self.seen = generation
        kind, count = int(t[2]), int(t[4])
        if kind == 2:  # (not shared: the copy's own)
            cursor.resume(int(t[1]), cursor.position)
        else:
            cursor.resume(int(t[1]), ([int(n) for n in t[5 : 5 + count]], int(t[3])) if kind else None)

    def repeats(self, num_workers: int) -> bool:
        """At the start of a pass, in its first worker (or the process, without workers): whether
        the latest pass since the last :meth:`publish` ran to its end in every worker (this one
        then follows the same epoch and position again). Starts the record of this pass."""
        t, start = self.tensor, self.PASS + 1
        workers = int(t[self.PASS])
        ran = 0 < workers <= self.SLOTS and bool((t[start : start + workers] == 1).all())
        t[start:] = 0
        t[self.PASS] = num_workers
        return ran

    def finished(self, worker: int) -> None:
        """Worker ``worker`` of this pass handed out the last sample of its share."""
        if worker < self.SLOTS:
            self.tensor[self.PASS + 1 + worker] = 1
