"""What this machine has: the memory available to new allocations (the readers' in-memory blob
checks it before it loads one; ``packer/memory.py`` uses it for the conversion's budgets)."""

from __future__ import annotations

import os

__all__ = ["available_memory"]


def available_memory() -> int | None:
    """Bytes of memory available to new processes: Linux ``MemAvailable``, else the free pages
    (``sysconf``), or ``None`` where neither is known."""
    try:
        with open("/proc/meminfo", encoding="ascii") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None
