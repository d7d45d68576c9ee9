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


def crash_once(marker: str) -> str:
    """``marker``, after its process died once on it (a segfault, the first time: ``marker`` made)."""
    if not os.path.exists(marker):
        open(marker, "w").close()
        ctypes.string_at(0)
    return marker


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
        from packer.sources.text_docs import document_texts

        text = str(document_texts([doc])[0])
        if "CRASH" in text:
            ctypes.string_at(0)
        if "HANG" in text:
            time.sleep(60)
        return self.task(doc)


def _wait_for(path: str) -> bool:
    """Called while a worker unpickles :class:`LargeSlowToUnpickle`: wait (up to 5 s) for ``path``
    to exist; True if the wait gave up."""
    deadline = time.monotonic() + 5
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return True
        time.sleep(0.01)
    return False


class _Waits:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return _wait_for, (self.path,)


class LargeSlowToUnpickle:
    """A work unit larger than a pipe holds (300 KB) whose unpickling in a worker waits for
    ``path`` to exist before the rest of it is read; each item's result says whether that wait
    gave up."""

    def __init__(self, path: str) -> None:
        self.gave_up = _Waits(path)  # first in the pickle, before the payload
        self.payload = bytes(300_000)

    def __call__(self, x: int) -> bool:
        return self.gave_up


def _refuse_to_load() -> None:
    raise ImportError("No module named 'only_on_the_parent'")


class LoadsOnlyInTheParent:
    """A work unit whose unpickling fails in a worker (as one whose module the worker cannot
    import does)."""

    def __reduce__(self):
        return _refuse_to_load, ()

    def __call__(self, x: int) -> int:  # pragma: no cover - never loaded in a worker
        return x
