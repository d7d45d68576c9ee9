"""Work units that fail the way a broken decoder does, for the pool and Ray executor tests."""

from __future__ import annotations

import ctypes
import os
import time


def crash_on_13(x: int) -> int:
    """``x``, except that item 13 kills its process with a segfault."""
    if x == 13:
        ctypes.string_at(0)
    return x


def hang_on_5(x: int) -> int:
    """``x``, except that item 5 hangs for a minute."""
    if x == 5:
        time.sleep(60)
    return x


class FaultyTokenize:
    """A text work unit (``TokenizeTask``'s contract) that segfaults on a document containing
    "CRASH", hangs on one containing "HANG", and otherwise tokenises as ``task`` does."""

    def __init__(self, task) -> None:
        self.task = task

    def __call__(self, doc):
        if "CRASH" in doc.text:
            ctypes.string_at(0)
        if "HANG" in doc.text:
            time.sleep(60)
        return self.task(doc)


def _ignored_signals() -> int:
    """This process's mask of ignored signals (Linux)."""
    try:
        with open(f"/proc/{os.getpid()}/status") as status:
            return int(next(line for line in status if line.startswith("SigIgn:")).split()[1], 16)
    except OSError:  # pragma: no cover - not Linux
        return -1


#: The signals ignored when this module was imported: in a pool worker that is while it unpickles
#: its work unit, before the pool's own worker set-up runs.
IGNORED_AT_IMPORT = _ignored_signals()


def ignored_at_import(_x: object) -> int:
    return IGNORED_AT_IMPORT
