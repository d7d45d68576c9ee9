"""The one process-pool wrapper: ordered results from picklable work units, crash- and hang-proof.

:func:`ordered_map` runs ``fn`` over items in ``workers`` worker processes (a single item runs in
this process) and yields the results in input order, so the output is identical whatever the
worker count, and this process is free to write them meanwhile.

Why not ``multiprocessing.Pool``: a worker killed by a signal (a decoder segfault on a hostile
file) makes ``Pool.imap`` wait forever for its result, a decoder stuck in a loop hangs it
forever too, and ``Pool.terminate()`` after Ctrl-C can deadlock (it takes the shared task
queue's reader lock, which an idle worker blocked in ``recv`` holds). Here each worker has its
own pair of pipes (nothing shared, no locks), and the parent waits on the result pipes and the
process sentinels together with a deadline. A worker that dies or overruns its deadline
(``item_timeout`` seconds per item of its chunk) is killed with SIGKILL and replaced, and its
chunk's items are retried one by one; the item that kills or hangs a worker on its own becomes
``on_crash(item, reason)`` (without ``on_crash``: a :class:`WorkerCrash` error). An exception
raised by ``fn`` is a bug, raised here as :class:`WorkerError` with the worker's traceback.

Workers ignore SIGINT (Ctrl-C reaches only the parent, which kills them), leave parallelism to
the pool (OpenCV runs single-threaded), and keep freed memory for reuse
(:func:`packer.memory.keep_freed_memory`); their side lives in :mod:`packer.pool_worker`.

Results come back through shared memory (``transport="shm"``, the default: the payloads in the
worker's slots, only the rest of the pickle through the pipe; :mod:`packer.result_slots`), or
the whole pickle through the pipe (``transport="pipe"``). Each worker has its running chunk and
one queued behind it when that pickles small enough to fit the pipe's buffer; a bigger chunk (a
WebDataset piece) goes only to an idle worker, and the worker that just answered is fed before
its answer is handed to the caller.

Start method: ``forkserver`` (``spawn`` where it does not exist). Workers are forked from a
clean single-threaded server process that has imported the decoders once, never from this
process: forking copies only the calling thread, and a lock held by another thread of this
process deadlocks the child. Python threads can be counted, native ones cannot be trusted:
OpenCV starts its thread pool on import, and a worker forked after this process had run OpenCV
code hung inside ``cv2.setNumThreads`` (seen in ``packer bench``). The server is started once
per conversion; the usual multiprocessing rule follows: a script that converts must be a file
(or guard its work with ``if __name__ == "__main__":``), not code piped to ``python -``. How
workers start lives in :mod:`packer.pool_start`. A worker that ends with an exit status before
it says it started (its first message) failed to start (its error is on stderr): the map raises
:class:`WorkerError` rather than blame every input on it.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Generic, Iterator, Sequence, TypeVar

from .interrupts import signals_deferred
from .memory import keep_freed_memory  # part of this module's interface (the CLI calls it; workers, in packer.pool_worker)
from .options import DEFAULT_ITEM_TIMEOUT
from .pool_start import main_not_reimported, pool_context
from .pool_worker import STARTED, encode, worker_main
from .result_slots import ResultSlots, decode_results

T = TypeVar("T")
R = TypeVar("R")

__all__ = ["keep_freed_memory", "ordered_map", "default_workers", "workers_within_cores", "WorkerError", "WorkerCrash", "DEFAULT_ITEM_TIMEOUT", "crash_reason", "timeout_reason", "is_timeout"]

#: A second chunk is queued behind the running one only if it pickles to at most this many
#: bytes: it then fits the pipe's buffer, so sending it never blocks on a busy worker.
_PREFETCH_BYTES = 16 << 10

#: Result transports (module docstring).
TRANSPORTS = ("shm", "pipe")


#: The longest single wait for a worker's answer, in seconds (a deadline further off is waited for again).
_LONGEST_WAIT = 86400.0


class WorkerError(RuntimeError):
    """``fn`` raised instead of returning a value: a bug, reported with the worker's traceback."""


class WorkerCrash(RuntimeError):
    """An item killed or hung its worker and no ``on_crash`` was given."""

    def __init__(self, item: Any, reason: str) -> None:
        super().__init__(f"{reason}: {item!r}")
        self.item, self.reason = item, reason


def default_workers() -> int:
    """The CPU cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not on Linux
        return max(1, os.cpu_count() or 1)


def workers_within_cores(workers: int | None) -> int:
    """``workers`` (default: the usable cores) capped at the usable cores, with a one-line warning
    (a conversion's pool and ``verify --source``'s alike)."""
    cores = default_workers()
    if workers is not None and workers > cores:
        logging.getLogger("packer").warning("--workers %d: this machine has %d usable cores; using %d (more processes only "
                                            "add memory and contention)", workers, cores, cores)
    return cores if workers is None else min(workers, cores)


@contextmanager
def ordered_map(
    fn: Callable[[T], R],
    items: Sequence[T],
    *,
    workers: int,
    chunksize: int | None = None,
    on_crash: Callable[[T, str], R] | None = None,
    item_timeout: float = DEFAULT_ITEM_TIMEOUT,
    transport: str = "shm",
) -> Iterator[Iterator[R]]:
    """Context giving an iterator of ``fn(item)`` for every item, in order, on ``workers`` processes.

    Workers start when the context is entered and are stopped when it exits: killed at once if
    the caller failed, broke off or was interrupted. An item that kills its worker (a signal)
    or runs longer than ``item_timeout`` seconds gives ``on_crash(item, reason)`` in its place,
    with ``reason`` like ``"crashed the decoder (SIGSEGV)"`` or ``"timed out after 120 s"``.
    A single item runs in a worker too: its timeout and crash isolation hold.
    A worker runs a chunk's items through ``fn.map(items)`` when ``fn`` is a
    :class:`~packer.work_unit.WorkUnit` (it must yield
    ``fn(item)`` for each, in order: :func:`packer.pool_worker.run_items`). ``transport``: how results come back
    (:data:`TRANSPORTS`; "shm" falls back to "pipe" where no shared memory can be reserved).
    """
    if not items:
        yield iter(())
        return
    if item_timeout <= 0:
        raise ValueError(f"item_timeout must be positive, got {item_timeout!r}")
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}, got {transport!r}")
    if chunksize is None:
        chunksize = max(1, min(16, len(items) // (workers * 8)))
    pool = _Pool(fn, items, max(1, min(workers, len(items))), chunksize, on_crash, item_timeout, transport)
    try:
        pool.start()
        yield pool.results()
    finally:
        pool.close()


# -- parent side ----------------------------------------------------------------------------
@dataclass
class _Chunk:
    id: int
    start: int  # index of the first item
    count: int
    isolated: bool = False  # a retry of a single item after its chunk was lost
    slot: int = 0  # the worker's shared-memory slot its results go to (set when dispatched)
    big: bool = False  # pickles to more than _PREFETCH_BYTES: sent to an idle worker only
    body: Any = None  # a big chunk's pickled id and items, kept until an idle worker takes it (pickled once)


@dataclass
class _Worker:
    process: Any
    tasks: Connection  # parent -> worker
    results: Connection  # worker -> parent
    in_flight: deque = field(default_factory=deque)  # chunks sent, oldest (running) first
    deadline: float = float("inf")  # for in_flight[0]
    ring: ResultSlots | None = None  # its result slots ("shm" transport)
    sent: int = 0  # chunks dispatched to it: their slots alternate
    briefed: bool = False  # its work unit was sent whole (until then only a kill stops it)
    started: bool = False  # it said it got through its start-up (pool_worker.STARTED)


class _Pool(Generic[T, R]):
    """Workers with private pipes; chunks dispatched in order, results reordered by chunk id."""

    def __init__(self, fn: Callable[[T], R], items: Sequence[T], workers: int, chunksize: int,
                 on_crash: Callable[[T, str], R] | None, item_timeout: float, transport: str = "shm") -> None:
        self.fn, self.items, self.on_crash, self.item_timeout = fn, items, on_crash, item_timeout
        # The work unit goes to each worker as its first message, pickled once here, not as an
        # argument of the process: start() writes those into the new worker's pipe, and one
        # larger than the pipe (64 KiB) made start() wait until that worker had imported what
        # unpickling it needs, so the workers started one after another. It is sent once every
        # worker has started, as sending it waits for the worker to begin reading it (after
        # re-importing the caller's script, where the work unit needs that). It is pickled for each
        # worker, as a DataLoader pickles its dataset for each: what ForkingPickler makes of a torch
        # tensor is a descriptor multiprocessing's resource sharer hands over once, so a second
        # worker given the same bytes failed (a TensorDataset with 2 workers). Pickled here first,
        # so an unpicklable work unit fails before any worker starts; that message briefs the first.
        self.fn_message: bytes | None = encode(fn)
        self.transport = transport
        if transport == "shm":
            ResultSlots.sweep_orphans()
        self.context = pool_context()
        self.todo: deque[_Chunk] = deque(
            _Chunk(i, start, min(chunksize, len(items) - start)) for i, start in enumerate(range(0, len(items), chunksize))
        )
        self.next_id = len(self.todo)
        self.order: deque[int] = deque(c.id for c in self.todo)  # chunk ids in output order
        self.done: dict[int, list[R]] = {}  # finished chunks waiting for their turn
        self.window = 4 * workers + 2  # chunks dispatched beyond the oldest unconsumed one
        self.size = workers
        self.workers: list[_Worker] = []

    def start(self) -> None:
        """Start the workers and send them the work unit (on an error or a Ctrl-C, the caller's
        :meth:`close` stops those started: the constructor starts none, so nothing is left
        running between it and the caller's ``try``)."""
        for _ in range(self.size):
            self._start_worker()
        for worker in self.workers:
            self._brief(worker)

    def _start_worker(self, ring: ResultSlots | None = None) -> _Worker:
        """Start a worker with ``ring`` (by default new result slots) and keep it in ``workers``.
        A Ctrl-C waits until it is kept, so :meth:`close` stops it and unlinks its slots wherever
        the Ctrl-C lands (between creating the slots and keeping the worker, it leaked them)."""
        with signals_deferred():
            if ring is None and self.transport == "shm":
                ring = ResultSlots.create()
            try:
                task_recv, task_send = self.context.Pipe(duplex=False)
                result_recv, result_send = self.context.Pipe(duplex=False)
                # A forked worker inherits the parent's ends too; it closes them, or it would keep its
                # own task pipe open and never see EOF (and exit) when the parent dies.
                inherited = (task_send, result_recv) if self.context.get_start_method() == "fork" else ()
                args = (task_recv, result_send, inherited, ring.name if ring else None)
                process = self.context.Process(target=worker_main, args=args, daemon=True)
                with main_not_reimported(self.fn):
                    process.start()
            except BaseException:
                if ring is not None:
                    ring.close()
                raise
            task_recv.close()  # the parent keeps only its own ends, so a dead worker reads as EOF / EPIPE
            result_send.close()
            worker = _Worker(process, task_send, result_recv, ring=ring)
            self.workers.append(worker)
            return worker

    def _brief(self, worker: _Worker) -> None:
        """Send ``worker`` its work unit (it unpickles it on its own time)."""
        message, self.fn_message = self.fn_message or encode(self.fn), None
        try:
            worker.tasks.send_bytes(message)
        except OSError:
            return  # a worker dead at birth: seen as any dead worker is, when its first chunk is sent
        worker.briefed = True

    def results(self) -> Iterator[R]:
        """The results in input order; dispatching and collecting happen as the caller asks."""
        while self.order:
            if self.order[0] in self.done:  # keep the workers fed while the caller consumes
                self._dispatch()
                self._collect(block=False)
            while self.order[0] not in self.done:  # (a lost chunk's retries replace it in the order)
                self._dispatch()
                self._collect(block=True)
                self._dispatch()  # the worker that answered is idle: fed before the caller consumes
            yield from self.done.pop(self.order.popleft())

    def _dispatch(self) -> None:
        limit = (self.order[0] + self.window) if self.order else 0
        for worker in self.workers:
            while self.todo and (self.todo[0].isolated or self.todo[0].id < limit):
                if len(worker.in_flight) >= 2:
                    break
                chunk = self.todo[0]
                if worker.in_flight and (chunk.big or chunk.isolated or worker.in_flight[0].isolated):
                    break  # big chunks go only to an idle worker (it is reading, so sending cannot block)
                # In flight: at most two consecutive dispatches, so alternating slots never collide,
                # and a slot is reused only after its chunk's results were copied out (_receive).
                chunk.slot = worker.sent % 2
                body = chunk.body if chunk.body is not None else encode((chunk.id, self.items[chunk.start : chunk.start + chunk.count]))
                if worker.in_flight and len(body) > _PREFETCH_BYTES:
                    chunk.big, chunk.body = True, body  # (not pickled again: its items may be read as they are pickled)
                    break
                message = bytes((chunk.slot,)) + body  # the slot first: it depends on the worker, the body does not
                chunk.body = None
                self.todo.popleft()
                worker.sent += 1
                if not worker.in_flight:
                    worker.deadline = time.monotonic() + self.item_timeout * chunk.count
                worker.in_flight.append(chunk)
                try:
                    worker.tasks.send_bytes(message)
                except OSError:  # it died; the sentinel reports it and its chunks are retried
                    break

    def _collect(self, *, block: bool) -> None:
        busy = [w for w in self.workers if w.in_flight]
        if not busy:
            assert not block, "internal error: waiting for a result with no work in flight"
            return
        # at most a day at a time (then waited again): --timeout times a WebDataset piece's inputs overflowed poll()'s int of ms
        timeout = min(_LONGEST_WAIT, max(0.0, min(w.deadline for w in busy) - time.monotonic())) if block else 0.0
        ready = set(wait([w.results for w in busy] + [w.process.sentinel for w in busy], timeout=timeout))
        now = time.monotonic()
        for worker in busy:
            if worker.results in ready or worker.process.sentinel in ready:
                try:  # a result sent just before dying is still a result
                    message = worker.results.recv_bytes() if worker.results.poll() else None
                except (EOFError, OSError):
                    message = None
                if message is None:
                    self._lost(worker)
                elif message == STARTED:
                    worker.started = True
                else:
                    self._receive(worker, message)
            elif now >= worker.deadline:
                self._replace(worker, timeout_reason(self.item_timeout))

    def _lost(self, worker: _Worker) -> None:
        """A worker ended without its result. Once started (:data:`~packer.pool_worker.STARTED`),
        its input is the culprit, whatever ended it (:meth:`_replace`). Ended with an exit status
        before it started: its start-up failed (its error is on stderr; a script without
        ``if __name__ == "__main__":`` run again in every worker, say), which each replacement
        would repeat, so the map stops there instead of blaming every input."""
        worker.process.join(1.0)  # the sentinel or EOF may come a moment before the exit status
        code = worker.process.exitcode
        if not worker.started and code is not None and code > 0:
            raise WorkerError(f"a worker process exited with status {code} before it converted anything (its error is printed above)")
        self._replace(worker, crash_reason(code))

    def _receive(self, worker: _Worker, message: bytes) -> None:
        chunk = worker.in_flight.popleft()
        kind, payload = decode_results(message, worker.ring.slots[chunk.slot] if worker.ring else None)
        if kind == "error":
            raise WorkerError(f"a worker failed on item {chunk.start + payload[0]}: {payload[1]}")
        self.done[chunk.id] = payload
        worker.deadline = time.monotonic() + self.item_timeout * worker.in_flight[0].count if worker.in_flight else float("inf")

    def _replace(self, worker: _Worker, reason: str) -> None:
        """A worker died or hung: kill it, start another, and retry its chunks item by item."""
        if worker.process.is_alive():
            worker.process.kill()
        worker.process.join()  # (a Ctrl-C may cut this wait: the worker is still listed, close() frees its slots)
        with signals_deferred():  # a Ctrl-C waits until the dead worker's slots are its successor's
            ring, worker.ring = worker.ring, None  # it is dead and joined: its slots serve its successor
            self.workers.remove(worker)
            try:
                _close_handles(worker)
            except BaseException:
                if ring is not None:
                    ring.close()
                raise
            successor = self._start_worker(ring)  # (which closes the ring if it fails)
        self._brief(successor)
        retries: list[_Chunk] = []
        for position, chunk in enumerate(worker.in_flight):
            if chunk.isolated or chunk.count == 1:
                if position == 0:  # it ran alone and was lost: it is the culprit
                    self.done[chunk.id] = [self._crashed(self.items[chunk.start], reason)]
                else:  # queued behind the culprit, never started
                    retries.append(_Chunk(chunk.id, chunk.start, 1, isolated=True))
                continue
            # Split into single-item chunks that take the lost chunk's place in the output order.
            where = self.order.index(chunk.id)
            self.order.remove(chunk.id)
            for i in range(chunk.count):
                retries.append(_Chunk(self.next_id, chunk.start + i, 1, isolated=True))
                self.order.insert(where + i, self.next_id)
                self.next_id += 1
        self.todo.extendleft(reversed(retries))

    def _crashed(self, item: T, reason: str) -> R:
        if self.on_crash is None:
            raise WorkerCrash(item, reason)
        return self.on_crash(item, reason)

    def close(self) -> None:
        """Stop the workers: ask idle ones to exit, kill the rest (SIGKILL; never a shared lock)."""
        idle = [not w.in_flight and w.briefed for w in self.workers]  # (an unbriefed one may not be reading)
        try:
            for worker, asked in zip(self.workers, idle):
                if asked:
                    try:
                        worker.tasks.send_bytes(b"")
                    except OSError:
                        pass
            deadline = time.monotonic() + 1.0
            for worker, asked in zip(self.workers, idle):
                if asked:
                    worker.process.join(max(0.0, deadline - time.monotonic()))
        finally:  # every worker killed and its slots unlinked, even if a Ctrl-C cuts a wait short
            try:
                with signals_deferred():  # (a Ctrl-C held here is raised as it ends: the finally below still runs)
                    for worker in self.workers:
                        if worker.process.is_alive():
                            worker.process.kill()
                # Not with signals held: a process stuck in the kernel (a hung network mount) does
                # not end even when killed, and another Ctrl-C must stop the wait.
                for worker in self.workers:
                    worker.process.join()
                    _close_handles(worker)
            finally:
                with signals_deferred():  # killed, if not yet ended: nobody writes to the slots again
                    try:
                        for worker in self.workers:
                            if worker.ring is not None:
                                worker.ring.close()
                                worker.ring = None
                    finally:
                        self.workers.clear()


def _close_handles(worker: _Worker) -> None:
    """Close the pipes and process object of a worker that has ended."""
    worker.tasks.close()
    worker.results.close()
    worker.process.close()


def timeout_reason(seconds: float) -> str:
    """The reason recorded for an input that ran past its time (every executor's wording)."""
    return f"timed out after {seconds:g} s"


def is_timeout(reason: str) -> bool:
    """Whether an ``on_crash`` reason is :func:`timeout_reason`'s (the input hung, not crashed)."""
    return reason.startswith("timed out after ")


def crash_reason(exitcode: int | None) -> str:
    """The skip reason for a worker that ended with ``exitcode`` (negative: killed by that signal)."""
    if exitcode is not None and exitcode < 0:
        try:
            return f"crashed the decoder ({signal.Signals(-exitcode).name})"
        except ValueError:  # pragma: no cover - a signal Python has no name for
            return f"crashed the decoder (signal {-exitcode})"
    return f"its worker process exited with status {exitcode} (an error there, printed above; not a decoder crash)"
