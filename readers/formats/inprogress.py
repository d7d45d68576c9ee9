"""Whether a conversion is writing a destination now: the lock file convention packer's
conversions follow (``packer/locking.py`` takes the lock; readers only probe it).

A conversion to ``DST`` writes ``DST.partial`` and holds ``flock`` on ``DST.partial-lock``,
whose content is ``packer-lock PID`` (:func:`lock_text`), so that a file of the user's by that
name is never taken for one (:func:`is_lock_text`). The kernel releases the lock when that process ends, however it ends,
so a held lock means a running conversion, never a killed one.
"""

from __future__ import annotations

import os
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX (Windows): no probe, readers still import
    fcntl = None  # type: ignore[assignment]

__all__ = ["lock_path", "lock_holder", "lock_pid", "lock_text", "is_lock_text", "is_empty_folder"]

#: What a lock file holds before the pid of the conversion that holds it.
LOCK_PREFIX = b"packer-lock "


def lock_text(pid: int) -> bytes:
    """The content of a lock file held by process ``pid``."""
    return LOCK_PREFIX + f"{pid}\n".encode()


def lock_pid(content: bytes) -> str:
    """The pid a lock file's ``content`` names, as written (``"?"`` when it names none)."""
    held = content.strip(b"\0 \t\r\n")
    return (held[len(LOCK_PREFIX):] if held.startswith(LOCK_PREFIX) else held).decode(errors="replace") or "?"


def is_lock_text(content: bytes) -> bool:
    """Whether ``content`` is what a lock file of packer's can hold: a pid written by
    :func:`lock_text`, or nothing (a crash can leave the file empty, or zeros where the write
    did not reach the disk)."""
    content = content.strip(b"\0 \t\r\n")
    return not content or (content.startswith(LOCK_PREFIX) and content[len(LOCK_PREFIX):].isdigit())


def lock_path(partial: Path) -> Path:
    """The lock file of the unfinished output ``partial`` (``DST.partial`` -> ``DST.partial-lock``)."""
    return partial.with_name(partial.name + "-lock")


def lock_holder(path: Path) -> str | None:
    """The pid (as it wrote it; ``"?"`` if unreadable) of the process holding the lock at
    ``path``, or ``None`` when no process holds it. A probe for a clearer message only: a
    conversion itself takes the lock (``packer.locking.DestinationLock``); ``None`` where there is
    no ``flock`` to probe with."""
    if fcntl is None:  # pragma: no cover - not POSIX
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return lock_pid(os.read(fd, 64))
    except OSError:
        return None
    finally:
        os.close(fd)  # (closing it lets go of a lock the probe got)
    return None


def is_empty_folder(path: Path) -> bool:
    """Whether ``path`` is a folder (not a link to one) holding nothing: a DST made beforehand,
    which a conversion takes, and which says nothing of its own while one runs."""
    try:
        if not path.is_dir() or path.is_symlink():
            return False
        with os.scandir(path) as entries:
            return next(entries, None) is None
    except OSError:
        return False
