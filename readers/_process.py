"""Per-process handles: storage is opened lazily in the process that reads it.

File handles (an LMDB environment, an h5py file) must never be used across a fork, and
h5py objects do not pickle at all. Datasets therefore keep their handle in a :class:`PerProcess`
slot: it opens on first use, re-opens when the process id changes (a forked DataLoader worker),
and pickles as its opener only (a spawned worker opens its own).
"""

from __future__ import annotations

import os
import threading
from typing import Callable, Generic, TypeVar

T = TypeVar("T")

__all__ = ["PerProcess"]


class PerProcess(Generic[T]):
    """A value built by ``opener()`` at most once per process."""

    def __init__(self, opener: Callable[[], T]) -> None:
        self._opener = opener
        self._pid: int | None = None
        self._value: T | None = None
        self._lock = threading.Lock()
        self._lock_pid = os.getpid()

    def get(self) -> T:
        pid = os.getpid()
        if self._pid != pid:
            if self._lock_pid != pid:
                # A lock inherited through fork may be held by a thread that does not exist here.
                self._lock, self._lock_pid = threading.Lock(), pid
            with self._lock:
                if self._pid != pid:
                    self._value = self._opener()
                    self._pid = pid
        return self._value  # type: ignore[return-value]

    def __getstate__(self) -> dict:
        return {"_opener": self._opener}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["_opener"])  # type: ignore[misc]
