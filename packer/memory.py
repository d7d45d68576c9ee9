"""Memory: how much this machine has, and has free (the one place that reads it: the worker cap
in packer/engine.py, the compressed-tar buffer in packer/sources/archives.py, the blob
recommendation in packer/bench_report.py), and how a
conversion process keeps what it frees (:func:`keep_freed_memory`)."""

from __future__ import annotations

import ctypes
import os

from readers.machine import available_memory

__all__ = ["available_memory", "total_memory", "keep_freed_memory"]


def total_memory() -> int | None:
    """Bytes of this machine's physical memory (``sysconf``), or ``None`` where it is not known."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def keep_freed_memory() -> None:
    """glibc: serve large temporaries from a heap that is not trimmed back (process-wide).

    Workers always call it. The ``packer`` command calls it for its own process too, which
    receives and writes every sample (a faster conversion on 2 cores in an A/B run of
    2026-11-22 whose output was not committed: no figure is claimed). A program calling :func:`packer.convert` may call it,
    accepting that its process then keeps up to 256 MB of freed memory for reuse.
    """
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # pragma: no cover - not glibc
        return
    mallopt(_M_MMAP_THRESHOLD, 32 << 20)
    mallopt(_M_TRIM_THRESHOLD, 256 << 20)
