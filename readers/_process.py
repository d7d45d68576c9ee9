"""Per-process handles: storage is opened lazily in the process that reads it.

File handles (an LMDB environment, an h5py file) must never be used across a fork, and
h5py objects do not pickle at all. Datasets therefore keep their handle in a :class:`PerProcess`
slot: it opens on first use, re-opens when the process id changes (a forked DataLoader worker),
and pickles as its opener only (a spawned worker opens its own).
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from typing import Callable, Generic, Protocol, TypeVar

T = TypeVar("T")

__all__ = ["PerProcess", "HandleCache", "file_key", "opened_key", "check_unreplaced", "replaced_error", "rerunning_parent_script"]


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


def rerunning_parent_script() -> bool:
    """Whether the caller runs inside a spawned (or forkserver) child's re-run of its parent's
    script: such a child first runs the script's module level again, as ``__mp_main__``, and only
    then the work it was sent (a DataLoader worker: the dataset its parent pickled). A dataset
    made at that module level is usually never read there."""
    frame = sys._getframe(1)  # (``multiprocessing.parent_process()`` is still None at that point)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == "__mp_main__":
            return True
        frame = frame.f_back
    return False


def file_key(path: str | os.PathLike[str]) -> tuple[int, ...]:
    """Identity of a file's current contents: a replaced file may reuse the inode, not its mtime."""
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def opened_key(path: str | os.PathLike[str]) -> tuple[int, ...] | None:
    """:func:`file_key` of the file that identifies a dataset as a reader opens it (``None``
    where there is none: the opening says why)."""
    try:
        return file_key(path)
    except OSError:
        return None


def check_unreplaced(path: str | os.PathLike[str], expected: tuple[int, ...] | None, dataset: str) -> None:
    """Raise :class:`~readers.schema.DatasetReplacedError` when the file at ``path`` is not the
    one ``expected`` (:func:`opened_key`) was taken of: a process (a DataLoader worker of a
    later epoch) or a shard opened after a conversion's ``--overwrite`` replaced the dataset
    would read the new one, mixed with the old (as a walkthrough's epoch did). Datasets never
    change once written, so any other file means another dataset."""
    if expected is not None and opened_key(path) != expected:
        raise replaced_error(dataset)


def replaced_error(dataset: str) -> Exception:
    """The :class:`~readers.schema.DatasetReplacedError` of ``dataset``."""
    from .schema import DatasetReplacedError

    return DatasetReplacedError(f"{dataset}: replaced since this reader opened it (a conversion's --overwrite?); a reader "
                                "reads one dataset, never two mixed: open it again to read the new one")


class Handle(Protocol):
    """An open storage handle: the process that opened it, and how to close it."""

    pid: int

    def close(self) -> None: ...


H = TypeVar("H", bound=Handle)


class HandleCache(Generic[H]):
    """One open handle per file per process, shared by every store over that file.

    LMDB refuses to open one file twice in a process, and HDF5 shares library state between
    opens of one file, so stores over the same file (train/val views, a loader made anew each
    epoch) share one handle, kept while any store holds it. A handle inherited through fork is
    closed in the child (closing our copy only) and opened afresh.
    """

    def __init__(self) -> None:
        self._handles: weakref.WeakValueDictionary[tuple[int, ...], H] = weakref.WeakValueDictionary()
        self._lock = threading.Lock()
        self._lock_pid = os.getpid()

    def get(self, key: tuple[int, ...], open_handle: Callable[[], H]) -> H:
        pid = os.getpid()
        if self._lock_pid != pid:  # a lock inherited through fork may be held by a vanished thread
            self._lock, self._lock_pid = threading.Lock(), pid
        with self._lock:
            handle = self._handles.get(key)
            if handle is not None and handle.pid == pid:
                return handle
            if handle is not None:
                handle.close()
                del self._handles[key]
            handle = open_handle()
            self._handles[key] = handle
            return handle
