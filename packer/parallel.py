"""The one process-pool wrapper: ordered results from picklable work units.

Units run in ``workers`` worker processes (a single unit runs in this process); results come
back in input order, so the output is identical whatever the worker count, and this process is
free to write them meanwhile. Workers ignore SIGINT (Ctrl-C reaches only the parent, which
stops the pool and cleans up), leave parallelism to the pool (OpenCV runs single-threaded), and
keep freed memory for reuse: glibc's default returns each large temporary (a decoded photo is
~0.5 MB) to the kernel, and zeroing fresh pages for the next one cost ~0.85 ms of kernel time
per image here, a quarter of the whole conversion (`benchmarks/RESULTS.md`).

Start method: ``fork`` when this process runs no other Python thread (fast: nothing is
re-imported), otherwise ``forkserver``: forking copies only the calling thread, and a lock held
by another (a progress bar's monitor, a data loader's threads) could deadlock the child. Native
pools are safe here: OpenBLAS re-initialises after fork and workers pin OpenCV to one thread.
:func:`packer.convert` opens the pool before it starts its progress bar.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import threading
from contextlib import contextmanager
from typing import Callable, Iterator, Sequence, TypeVar

import cv2

T = TypeVar("T")
R = TypeVar("R")

__all__ = ["ordered_map", "default_workers"]


def default_workers() -> int:
    """The CPU cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not on Linux
        return max(1, os.cpu_count() or 1)


@contextmanager
def ordered_map(fn: Callable[[T], R], items: Sequence[T], *, workers: int, chunksize: int | None = None) -> Iterator[Iterator[R]]:
    """Context giving an iterator of ``fn(item)`` for every item, in order, on ``workers`` processes.

    The pool starts when the context is entered and is stopped (terminated if the caller
    failed or was interrupted) when it exits.
    """
    if len(items) <= 1:
        yield map(fn, items)
        return
    if chunksize is None:
        chunksize = max(1, min(16, len(items) // (workers * 8)))
    pool = _context().Pool(min(workers, len(items)), initializer=_init_worker)
    try:
        yield pool.imap(fn, items, chunksize)
    except BaseException:
        pool.terminate()
        raise
    else:
        pool.close()
    finally:
        pool.join()


def _context() -> multiprocessing.context.BaseContext:
    methods = multiprocessing.get_all_start_methods()
    if "fork" in methods and threading.active_count() == 1:
        return multiprocessing.get_context("fork")
    if "forkserver" in methods:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["packer.preprocess.task"])
        return context
    return multiprocessing.get_context("spawn")  # pragma: no cover - Windows


def _init_worker() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    cv2.setNumThreads(1)  # parallelism is across processes
    _keep_freed_memory()


_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def _keep_freed_memory() -> None:
    """glibc: serve large temporaries from a heap that is not trimmed back (worker processes only)."""
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # pragma: no cover - not glibc
        return
    mallopt(_M_MMAP_THRESHOLD, 32 << 20)
    mallopt(_M_TRIM_THRESHOLD, 256 << 20)
