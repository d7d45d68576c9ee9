"""One conversion per destination at a time: an advisory lock file beside the unfinished output.

Without it, a second ``packer convert`` to the same DST (the same command in two terminals,
or a training script that converts on every DDP rank) would delete the first one's partial
output as a stale leftover, or carry on its resume journal, and one of them could publish a
mix of both. The lock is ``flock`` on ``DST.partial-lock`` (its name and the probe that readers
use too: readers/formats/inprogress.py): the kernel releases it when its process ends, however
it ends, so a killed conversion never leaves a stale lock behind (the empty file may stay; the
next conversion takes it over). Local filesystems only: ``flock`` on
NFS is emulated or unsupported, and two machines converting to one URL are not detected.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from readers.formats.inprogress import is_lock_text, lock_holder, lock_path, lock_pid, lock_text

from .destination import write_error
from .errors import OutputError

__all__ = ["DestinationLock", "lock_path", "lock_holder", "busy_error"]


def busy_error(what: str, holder: str) -> OutputError:
    """The one line for a destination another conversion (process ``holder``) is writing."""
    return OutputError(f"{what}: another packer conversion (pid {holder}) is writing it now; wait for it to finish, or choose another DST")


def _lock_soon(fd: int, tries: int = 5, pause: float = 0.02) -> None:
    """``flock`` ``fd`` exclusively, retrying for a moment: another process's :func:`lock_holder`
    probe holds a shared lock for microseconds, and a conversion meeting it must not take it for
    a running one. A real holder keeps it far longer: ``BlockingIOError`` then."""
    for attempt in range(tries):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if attempt == tries - 1:
                raise
            time.sleep(pause)


class DestinationLock:
    """An exclusive, non-blocking lock on ``path``; ``what`` names the destination in the error."""

    def __init__(self, path: Path, what: str) -> None:
        self.path, self.what = Path(path), what
        self._fd: int | None = None

    def acquire(self) -> "DestinationLock":
        """Take the lock, or raise :class:`OutputError` naming the process that holds it."""
        while True:
            try:  # the first file a conversion creates: /proc, /sys, a read-only or full disk fail here
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
            except OSError as exc:
                if self.path.is_symlink():  # never followed: the pid written into the file it points to
                    raise OutputError(f"{self.what}: {self.path} is a symbolic link, not packer's lock file; remove it") from None
                raise write_error(self.what, exc) from None
            try:
                _lock_soon(fd)
            except BlockingIOError:
                holder = lock_pid(os.read(fd, 64))
                os.close(fd)
                raise busy_error(self.what, holder) from None
            except OSError as exc:
                os.close(fd)
                raise write_error(self.what, exc) from None
            try:  # the holder before us may have removed the file after we opened it: lock the one at the path
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        try:
            held = os.pread(fd, 64, 0)
        except OSError:
            held = b""
        legacy = held.strip().isdigit() and self.path.with_name(self.path.name.removesuffix("-lock") + "-journal").is_dir()
        if not is_lock_text(held) and not legacy:  # never truncated: a file of the user's by this name
            # (legacy: the bare pid an older packer wrote, beside the journal of the run it was killed in)
            os.close(fd)
            raise OutputError(f"{self.what}: {self.path} holds something other than packer's lock ('packer-lock PID'); move it away")
        self._fd = fd
        try:
            os.ftruncate(fd, 0)
            os.write(fd, lock_text(os.getpid()))
        except OSError as exc:  # a full disk: the lock file goes again, and the error is one line
            self.release()
            raise write_error(self.what, exc) from None
        return self

    def release(self) -> None:
        """Remove the lock file and let go of the lock (idempotent)."""
        fd = self._fd
        if fd is None:
            return
        # Forgotten before it is closed: a Ctrl-C (or SIGTERM, raised as one) landing just after
        # the close must not leave it set, or the writer's __exit__ releases again and closes a
        # descriptor number that may belong to another file by then (EBADF here hid the
        # interruption: `packer bench` went on converting after a SIGTERM).
        self._fd = None
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)  # closing the descriptor releases the flock

    def __enter__(self) -> "DestinationLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
