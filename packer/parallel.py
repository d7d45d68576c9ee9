"""The one process-pool wrapper: ordered results from picklable work units.

``workers=1`` runs in this process (no pool, easy to debug and profile). With more, a
``multiprocessing`` pool runs the units; results come back in input order, so the output is
identical whatever the worker count. Workers start from a clean fork server (never a fork of a
caller that may run threads: a progress bar, torch, a notebook) and ignore SIGINT: Ctrl-C
reaches only the parent, which stops the pool and cleans up.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator, Sequence, TypeVar

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


def ordered_map(fn: Callable[[T], R], items: Sequence[T], *, workers: int, chunksize: int | None = None) -> Iterator[R]:
    """Yield ``fn(item)`` for every item, in order, using ``workers`` processes."""
    if workers <= 1 or len(items) <= 1:
        with _single_threaded_opencv():
            yield from map(fn, items)
        return
    if chunksize is None:
        chunksize = max(1, min(16, len(items) // (workers * 8)))
    context = _context()
    pool = context.Pool(min(workers, len(items)), initializer=_init_worker)
    try:
        yield from pool.imap(fn, items, chunksize)
    except BaseException:
        pool.terminate()
        raise
    else:
        pool.close()
    finally:
        pool.join()


def _context() -> multiprocessing.context.BaseContext:
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["packer.preprocess.task"])
        return context
    return multiprocessing.get_context("spawn")  # pragma: no cover - Windows


def _init_worker() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    cv2.setNumThreads(1)  # parallelism is across processes


@contextmanager
def _single_threaded_opencv() -> Iterator[None]:
    """One worker means one core: OpenCV's own thread pool is paused meanwhile."""
    previous = cv2.getNumThreads()
    cv2.setNumThreads(1)
    try:
        yield
    finally:
        cv2.setNumThreads(previous)


def chunks(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """Consecutive lists of ``size`` items (the last may be shorter)."""
    batch: list[T] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch
