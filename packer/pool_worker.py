"""The worker side of :mod:`packer.parallel`'s pool: what runs in each worker process.

:func:`worker_main` is a worker's whole life: it ignores Ctrl-C (the parent stops the workers),
runs OpenCV single-threaded (parallelism is across processes), keeps freed memory for reuse
(:func:`packer.memory.keep_freed_memory`), receives its work unit as the first message (so the
parent starts every worker without waiting for any to unpickle it), attaches its shared-memory
result slots, and runs chunks until an empty message or EOF. Results (or the first error, with
its traceback) go back as one message each (:func:`encode`), their large byte strings through the slots
(:mod:`packer.result_slots`). :func:`run_items` is the rule for running a chunk's items, which
the Ray executor and the placing work units follow too.
"""

from __future__ import annotations

import faulthandler
import signal
import traceback
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler  # multiprocessing's own message encoding: between our processes only, never in a file
from typing import Any, Callable, Iterator, Sequence, TypeVar

import cv2

from .memory import keep_freed_memory
from .result_slots import attach_slots, detach_slots, encode_results
from .work_unit import run_all

T = TypeVar("T")
R = TypeVar("R")

__all__ = ["worker_main", "run_items", "encode", "STARTED"]

#: A worker's first message: it got through its start-up (imports, the caller's script where the
#: work unit needs it, the work unit itself); an empty message, as no result is.
STARTED = b""


def encode(message: Any) -> memoryview:
    """A message between the pool's processes, encoded as multiprocessing encodes its own."""
    return ForkingPickler.dumps(message, -1)


def run_items(fn: Callable[[T], R], items: Sequence[T]) -> Iterator[R]:
    """``fn(item)`` for each item, in order: through ``fn.map(items)`` for a
    :class:`~packer.work_unit.WorkUnit` (``ImageTask`` reads remote inputs ahead:
    packer/preprocess/task.py), checked to give exactly one result per item."""
    count = 0
    for count, value in enumerate(run_all(fn, items), 1):
        if count > len(items):
            break
        yield value
    if count != len(items):
        raise RuntimeError(f"{type(fn).__name__}.map gave {'more' if count > len(items) else count} results for {len(items)} items")


def worker_main(tasks: Connection, results: Connection, inherited: tuple[Connection, ...], ring: str | None = None) -> None:
    """Receive the work unit (the first message), then run chunks until an empty message or EOF;
    results (or the first error) go back pickled, their large byte strings through the
    shared-memory slots of the block named ``ring``."""
    for connection in inherited:
        connection.close()
    _init_worker()
    try:
        message = tasks.recv_bytes()
    except (EOFError, OSError):
        return  # the parent is gone before the work began
    try:
        fn = ForkingPickler.loads(message)
    except Exception:  # noqa: BLE001 - reported for each chunk, which the parent raises
        fn = _Unloadable(traceback.format_exc())
    block, slots = attach_slots(ring)
    try:
        results.send_bytes(STARTED)  # from here on, an exit is an input's doing, not the start-up's (packer.parallel)
        _serve(fn, tasks, results, slots)
    except OSError:  # the parent is gone
        return
    finally:
        detach_slots(block, slots)


class _Unloadable:
    """Stands for a work unit this worker could not unpickle (a module missing here, say): each
    item fails with why, so the parent raises a :class:`~packer.parallel.WorkerError` (a worker
    that exited instead looked like a decoder crash on every item)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __call__(self, item: Any) -> Any:
        raise RuntimeError(f"the work unit could not be loaded in the worker:\n{self.reason}")


def _serve(fn: Callable, tasks: Connection, results: Connection, slots: list) -> None:
    """A worker's loop: chunks until an empty message or EOF, each chunk's results sent back."""
    while True:
        try:
            message = tasks.recv_bytes()
        except (EOFError, OSError):
            return
        if not message:
            return
        slot = message[0]  # then the chunk's id and items (packer.parallel._Pool._dispatch)
        _chunk_id, items = ForkingPickler.loads(memoryview(message)[1:])
        values: list = []
        try:
            for value in run_items(fn, items):
                values.append(value)
            reply = encode_results(("ok", values), slots[slot])
        except Exception:  # noqa: BLE001 - a bug in fn, reported to the parent, which raises it
            reply = encode(("error", (len(values), traceback.format_exc())))
        try:
            results.send_bytes(reply)
        except OSError:  # the parent is gone
            return


def _init_worker() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    faulthandler.disable()  # a crash here is reported by the parent, as a skipped input
    cv2.setNumThreads(1)  # parallelism is across processes
    keep_freed_memory()
