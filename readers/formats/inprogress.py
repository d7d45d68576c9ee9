"""Whether a conversion is writing a destination now: the lock file convention packer's
conversions follow (``packer/locking.py`` takes the lock; readers only probe it).

A conversion to ``DST`` writes ``DST.partial`` and holds ``flock`` on ``DST.partial-lock``,
whose content is its pid. The kernel releases the lock when that process ends, however it ends,
so a held lock means a running conversion, never a killed one.
"""

from __future__ import annotations

import os
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX (Windows): no probe, readers still import
    fcntl = None  # type: ignore[assignment]

__all__ = ["lock_path", "lock_holder"]


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
        return os.read(fd, 32).decode(errors="replace").strip() or "?"
    except OSError:
        return None
    finally:
        os.close(fd)  # (closing it lets go of a lock the probe got)
    return None
