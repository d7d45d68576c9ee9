"""Resume checkpoints committed beside the writing, not in its way.

A checkpoint has two halves (``packer/writers/base.py``, :meth:`Writer.progress`): the writer's
own buffers handed to the operating system (cheap, in the writing thread, so the checkpoint
describes exactly what was added so far), then ``fsync`` of the output and the journal's commit
(slow: the disk writes every byte since the last checkpoint). For a writer that declares it can
(:attr:`Writer.durable_in_background`: its durability is an ``fsync`` of a file it does not
otherwise touch from that thread), the slow half runs in a :class:`Committer` thread while the
writing goes on: an ``fsync`` makes durable everything written before it started, so a
checkpoint committed late still holds all it claims (and some bytes after, which a resume cuts).

One checkpoint is in flight at a time: a checkpoint that falls due meanwhile waits for the next
chance. The thread's error (a full disk, say) is raised in the writing thread at its next call,
and every way out of the writer (finish, abort, suspend) waits for the commit first, so the
journal read after an interruption is the one a whole commit left.
"""

from __future__ import annotations

import threading
from typing import Callable

__all__ = ["Committer"]


class Committer:
    """Runs one commit at a time in a background thread; its error comes back in :meth:`check`."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @property
    def busy(self) -> bool:
        """Whether a commit is still running."""
        return self._thread is not None and self._thread.is_alive()

    def start(self, commit: Callable[[], None]) -> None:
        """Run ``commit`` in the background (the previous one must be done: :attr:`busy` false)."""
        assert not self.busy, "internal error: a checkpoint commit is already running"
        self.check()

        def run() -> None:
            try:
                commit()
            except BaseException as exc:  # noqa: BLE001 - handed to the writing thread, raised there
                self._error = exc

        self._thread = threading.Thread(target=run, name="packer-checkpoint", daemon=True)
        self._thread.start()

    def wait(self) -> None:
        """Wait for the running commit, if any, then raise its error, if any."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.check()

    def check(self) -> None:
        """Raise the error of the last finished commit (once)."""
        error, self._error = self._error, None
        if error is not None:
            raise error
