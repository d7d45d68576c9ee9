"""A :class:`~readers.loader.Loader`'s iterations: which epoch each follows, the batches it has
handed out, whether it ended, and when it moves the loader on to the next epoch (a pass that
handed out every batch: when its iterator runs out, or when the next iteration begins).
"""

from __future__ import annotations

import weakref
from typing import Any, Iterator

from .epoch import EpochCursor
from .filling import Progress

__all__ = ["Pass", "UntilEnded"]


class Pass(Progress):
    """The latest iteration: its epoch, the position it started from, the batches it handed
    out, and whether it has ended (its iterator ran out; not on a ``break``): what ``len`` reports.
    Once it has handed out all ``total`` batches, :meth:`move_on` moves the loader on to the
    next epoch: when its iterator runs out, else when the next iteration begins (a loop that
    stops at the count, ``zip(range(len(loader)), loader)``)."""

    __slots__ = ("start", "ended", "total", "moved_on", "restarts", "_cursor", "_iterator")

    def __init__(self, epoch: int, start: int, cursor: EpochCursor | None = None, total: int = -1, restarts: int = 0) -> None:
        super().__init__(epoch, 0)
        self.start, self.ended, self.total, self.moved_on, self._cursor = start, False, total, False, cursor
        #: Passes before this one that began its epoch at its start and were cut short (:meth:`cut_short`).
        self.restarts = restarts
        self._iterator: Any = None

    def cut_short(self) -> bool:
        """Whether this pass began its epoch at its start and stopped after some of its batches
        (a loop broken off), its epoch not chosen since: the next pass begins the epoch again."""
        return self.start == 0 and 0 < self.batches < self.total and not self.ended and not self.moved_on

    def follow(self, iterator: Any) -> Any:
        """Keep track of the pass's iterator (not keep it alive) and return it."""
        self._iterator = weakref.ref(iterator)
        return iterator

    def under_way(self) -> bool:
        """Whether the pass can still hand out batches: not ended, short of its last batch, its
        iterator still held somewhere (a loop broken off drops it: abandoned, the next iteration
        starts the epoch again)."""
        alive = self._iterator is not None and self._iterator() is not None
        return alive and not self.ended and self.batches != self.total

    def moving_on(self) -> bool:
        """Whether :meth:`move_on` would move the loader on now."""
        cursor = self._cursor
        return (not self.moved_on and cursor is not None and self.batches == self.total
                and cursor.epoch == self.epoch and cursor.position is None)

    def move_on(self) -> None:
        """The next iteration follows the next epoch, once, if this pass handed out every batch
        (not one closed early, failed or abandoned), unless the loader was moved to another
        epoch (or this one again: ``set_epoch`` sets :attr:`moved_on`) or given a position since."""
        if self.moving_on():
            self._cursor.epoch = self.epoch + 1  # type: ignore[union-attr]
        if self.batches == self.total:
            self.moved_on = True

    def end(self) -> None:
        """Its iterator ran out."""
        self.ended = True
        self.move_on()


class UntilEnded:
    """A device path's iteration (GPU gather, GPU decode), marking its pass ended when it runs
    out; ``close()`` is the iteration's own."""

    def __init__(self, batches: Iterator[Any], progress: Pass) -> None:
        self._batches, self._pass = batches, progress

    def __iter__(self) -> "UntilEnded":
        return self

    def __next__(self) -> Any:
        try:
            return next(self._batches)
        except StopIteration:
            self._pass.end()
            raise

    def __len__(self) -> int:
        """Batches left to hand out (as a filling iteration's ``len``; the device paths' are generators)."""
        return max(0, self._pass.total - self._pass.batches)

    def close(self) -> None:
        self._batches.close()  # type: ignore[attr-defined]
