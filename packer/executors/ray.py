"""The map over a conversion's inputs as Ray tasks: :func:`packer.parallel.ordered_map`'s contract on a cluster.

Items are cut into chunks; each chunk is one Ray task (``num_cpus=1``) running the same
picklable work unit as the local pool (``ImageTask`` for single-file formats, ``PieceTask``
for WebDataset pieces). At most ``2 * workers`` tasks are in flight (``workers`` defaults to
the cluster's CPUs), so the driver's memory holds a bounded number of results, and results are
yielded in input order: the output is the same as a local run's.

Failure handling mirrors the local pool. Tasks are never retried by Ray (``max_retries=0``):
a chunk whose worker process dies (a decoder segfault) or overruns its deadline
(``item_timeout`` seconds per item, counted from when the chunk became the oldest one in
flight, as queued tasks have not started) is cancelled and its items are run again one task
each; an item that kills or hangs a task on its own becomes ``on_crash(item, reason)``. An
exception raised by the work unit is a bug, raised here as :class:`~packer.parallel.WorkerError`.
A chunk lost with its node (``NodeDiedError``) is not the input's fault: it is run again, up to
twice, before it is treated like a crash.

Assumptions (docs/SCALING.md): every node sees SRC and DST at the same absolute paths (a
shared filesystem), since tasks open inputs and WebDataset tasks write their shards into
``DST.partial`` themselves; the driver only gathers results (samples for LMDB/HDF5/blob,
shard descriptions for WebDataset) and writes the metadata. A URL DST needs no shared path:
WebDataset tasks then return their shards' bytes (``PieceTask(folder=None)``) and the driver
uploads them (packer/remote.py).
"""

from __future__ import annotations

import collections
import logging
import os
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence, TypeVar

from ..errors import OptionError
from ..parallel import DEFAULT_ITEM_TIMEOUT, WorkerCrash, WorkerError, timeout_reason
from ..pool_worker import run_items

__all__ = ["ray_ordered_map", "RayExecutor", "RAY_CRASH_REASON"]

#: How long a cluster address may take to accept a connection before it is refused.
CONNECT_SECONDS = 10

T = TypeVar("T")
R = TypeVar("R")

#: The skip reason of an input whose Ray worker process died (Ray does not report the signal).
RAY_CRASH_REASON = "crashed the decoder (Ray worker died)"
#: Largest default chunk: a Ray task's scheduling costs about as much as converting a photo or two.
_MAX_CHUNK = 64

#: Times a chunk lost with its node (``NodeDiedError``) is run again before it counts as a crash.
_NODE_RETRIES = 2

_remote_chunk: Any = None  # the Ray remote function, made on first use (importing does nothing)
#: How packer starts (or joins) Ray: no dashboard, workers' output not forwarded, and Ray's own
#: driver messages ("Started a local Ray instance", its token-authentication notice) at ERROR
#: only: packer's summary says what ran, so ``--quiet`` stays quiet (errors still show).
RAY_INIT: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.ERROR}
_worker_ready = False


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        from readers.extras import install_hint

        raise OptionError(f"--executor ray needs Ray: {install_hint('ray')}") from None
    return ray


def _run_chunk(fn: Callable[[Any], Any], items: list[Any]) -> tuple[str, Any]:
    """A Ray task: ``("ok", [fn(item) ...])`` or ``("error", (position, traceback))`` for a bug in fn."""
    import traceback

    global _worker_ready
    if not _worker_ready:  # once per Ray worker process: what the local pool's workers do
        import cv2

        from ..parallel import keep_freed_memory

        cv2.setNumThreads(1)
        keep_freed_memory()
        _worker_ready = True
    values: list[Any] = []
    try:
        for value in run_items(fn, items):
            values.append(value)
    except Exception:  # noqa: BLE001 - reported to the driver, which raises it
        return "error", (len(values), traceback.format_exc())
    return "ok", values


@contextmanager
def ray_ordered_map(
    fn: Callable[[T], R],
    items: Sequence[T],
    *,
    workers: int | None = None,
    chunksize: int | None = None,
    on_crash: Callable[[T, str], R] | None = None,
    item_timeout: float = DEFAULT_ITEM_TIMEOUT,
    address: str | None = None,
    on_workers: Callable[[int], None] | None = None,
) -> Iterator[Iterator[R]]:
    """Context giving ``fn(item)`` for every item, in order, computed by Ray tasks.

    Joins the cluster at ``address`` (``None``: the one ``ray.init()`` finds, or a new local
    instance) unless Ray is already initialised in this process; a Ray instance started here
    is shut down when the context exits. ``workers``: tasks running at once (default: the
    cluster's CPUs). Unfinished tasks are cancelled when the context exits early.
    """
    global _remote_chunk
    ray = _import_ray()
    if item_timeout <= 0:
        raise ValueError(f"item_timeout must be positive, got {item_timeout!r}")
    started_here = not ray.is_initialized()
    if started_here:
        _join(ray, address)
    elif address not in (None, "auto"):  # ("auto": the cluster this process joined, as a pipeline's configuration may say)
        raise OptionError(f"--ray-address {address}: Ray is already initialised in this process (pass no address, or auto)")
    if _remote_chunk is None:
        _remote_chunk = ray.remote(num_cpus=1, max_retries=0)(_run_chunk)
    if workers is None:
        workers = max(1, int(ray.cluster_resources().get("CPU", 1)))
    if chunksize is None:
        chunksize = max(1, min(_MAX_CHUNK, len(items) // (workers * 8)))
    if on_workers is not None:
        on_workers(workers)
    run = _RayRun(ray, _remote_chunk, fn, items, workers, chunksize, on_crash, item_timeout)
    try:
        yield run.results()
    finally:
        run.close()
        if started_here:
            ray.shutdown()


def _join(ray: Any, address: str | None) -> None:
    """``ray.init`` at ``address`` (``None``: ``RAY_ADDRESS``, a running instance, else a new
    one), its refusals in one line naming the address: an address Ray cannot parse, no cluster
    there, or Ray Client without its extra were 60-line tracebacks (a walkthrough). An address
    where nothing answers is refused before: ``ray.init`` waited on it for good, logging retries."""
    given = address if address is not None else os.environ.get("RAY_ADDRESS")
    where = f"--ray-address {given}" if address is not None else (f"RAY_ADDRESS={given}" if given else "--executor ray")
    _check_reachable(given, where)
    try:
        ray.init(address=address, **RAY_INIT)
    except (ValueError, ConnectionError, RuntimeError, OSError, _authentication_error(ray)) as exc:
        said = ' '.join(str(exc).split())
        hint = ("; the cluster asks for its authentication token (Ray's token authentication: give this process the "
                "token and RAY_AUTH_MODE the head has, or run on the head node with --ray-address auto)"
                if "authtoken" in said.lower().replace(" ", "") or "authenticat" in said.lower() else "")
        raise OptionError(f"{where}: Ray could not join or start a cluster there ({said[:300]}){hint}") from None


def _authentication_error(ray: Any) -> type[BaseException]:
    """Ray's ``AuthenticationError`` (2.60's token authentication: no token in this process), where it has one."""
    return getattr(getattr(ray, "exceptions", None), "AuthenticationError", OSError)


def _check_reachable(address: str | None, where: str) -> None:
    """Refuse a ``HOST:PORT`` address where nothing accepts a connection within
    :data:`CONNECT_SECONDS`; ``auto``, ``local``, no address and Ray Client's ``ray://`` (its
    own connection gives up, and says when its extra is missing) are Ray's to resolve."""
    import socket

    if not address or address in ("auto", "local") or "://" in address:
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return  # (Ray's own message says what it cannot parse)
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_SECONDS).close()
    except OSError as exc:
        why = "no answer" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc)).lower()
        raise OptionError(f"{where}: nothing accepts connections at {host}:{port} ({why}); start the cluster there "
                          "(ray start --head) or give the address `ray status` prints on its head node") from None


class RayExecutor:
    """:func:`ray_ordered_map` bound to a cluster address; remembers the task count it used
    (``workers``: the cluster's CPUs unless given), for the conversion's report."""

    def __init__(self, address: str | None = None) -> None:
        self.address = address
        self.workers: int | None = None
        self._started = False  # Ray was initialised by planned_workers(), for the next map

    def planned_workers(self) -> int:
        """The tasks a map runs at once without ``workers``: the cluster's CPUs. Joins the
        cluster now if needed (WebDataset cuts its pieces by this before the map starts); the
        next map then leaves it, as it would have left a cluster it joined itself."""
        ray = _import_ray()
        if not ray.is_initialized():
            _join(ray, self.address)
            self._started = True
        elif self.address not in (None, "auto") and not self._started:
            raise OptionError(f"--ray-address {self.address}: Ray is already initialised in this process (pass no address, or auto)")
        try:
            return max(1, int(ray.cluster_resources().get("CPU", 1)))
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Leave the cluster :meth:`planned_workers` joined, if no map did (a failure between them)."""
        if self._started:
            self._started = False
            _import_ray().shutdown()

    @contextmanager
    def __call__(self, fn: Callable[[T], R], items: Sequence[T], **options: Any) -> Iterator[Iterator[R]]:
        address = None if self._started else self.address
        try:
            with ray_ordered_map(fn, items, address=address, on_workers=self._note, **options) as results:
                yield results
        finally:
            self.release()

    def _note(self, workers: int) -> None:
        self.workers = workers


class _RayRun:
    """Chunks submitted in order, at most ``2 * workers`` in flight; results yielded in order."""

    def __init__(self, ray: Any, remote: Any, fn: Callable, items: Sequence[Any], workers: int, chunksize: int,
                 on_crash: Callable | None, item_timeout: float) -> None:
        self.ray, self.remote, self.items = ray, remote, items
        self.fn_ref = ray.put(fn)  # once in the object store, not once per task
        self.on_crash, self.item_timeout = on_crash, item_timeout
        self.window = 2 * workers
        self.todo = collections.deque((start, min(chunksize, len(items) - start)) for start in range(0, len(items), chunksize))
        self.flight: collections.deque[list[Any]] = collections.deque()  # [start, count, ref, head_since]

    def _submit(self) -> None:
        while self.todo and len(self.flight) < self.window:
            start, count = self.todo.popleft()
            ref = self.remote.remote(self.fn_ref, list(self.items[start : start + count]))
            self.flight.append([start, count, ref, None, 0])

    def results(self) -> Iterator[Any]:
        ray = self.ray
        while self.todo or self.flight:
            self._submit()
            head = self.flight[0]
            if head[3] is None:
                head[3] = time.monotonic()
            deadline = head[3] + self.item_timeout * head[1]
            ready, _ = ray.wait([head[2]], timeout=max(0.0, deadline - time.monotonic()))
            self.flight.popleft()
            start, count, ref, _since, lost = head
            if not ready:
                ray.cancel(ref, force=True)
                yield from self._isolated(start, count, timeout_reason(self.item_timeout))
                continue
            try:
                kind, payload = ray.get(ref)
            except ray.exceptions.NodeDiedError:
                if lost < _NODE_RETRIES:  # the machine went away, not the input's fault: run it again
                    retry = self.remote.remote(self.fn_ref, list(self.items[start : start + count]))
                    self.flight.appendleft([start, count, retry, None, lost + 1])
                    continue
                yield from self._isolated(start, count, RAY_CRASH_REASON)
                continue
            except (ray.exceptions.WorkerCrashedError, ray.exceptions.TaskCancelledError, ray.exceptions.OutOfMemoryError):
                yield from self._isolated(start, count, RAY_CRASH_REASON)
                continue
            if kind == "error":
                raise WorkerError(f"a Ray task failed on item {start + payload[0]}: {payload[1]}")
            yield from payload

    def _isolated(self, start: int, count: int, reason: str) -> Iterator[Any]:
        """A lost chunk: run its items one task each, in order; one that is lost alone is the culprit.
        A chunk of one item (a WebDataset piece) that timed out ran alone already; one whose worker
        died runs once more alone (a worker killed by a node's OOM killer or a preemption is not the
        input's fault: it failed a whole WebDataset conversion, naming a healthy image)."""
        if count == 1 and reason != RAY_CRASH_REASON:
            yield self._crashed(self.items[start], reason)
            return
        for i in range(start, start + count):
            ref = self.remote.remote(self.fn_ref, [self.items[i]])
            ready, _ = self.ray.wait([ref], timeout=self.item_timeout)
            if not ready:
                self.ray.cancel(ref, force=True)
                yield self._crashed(self.items[i], timeout_reason(self.item_timeout))
                continue
            try:
                kind, payload = self.ray.get(ref)
            except (self.ray.exceptions.WorkerCrashedError, self.ray.exceptions.TaskCancelledError,
                    self.ray.exceptions.NodeDiedError, self.ray.exceptions.OutOfMemoryError):
                yield self._crashed(self.items[i], RAY_CRASH_REASON)
                continue
            if kind == "error":
                raise WorkerError(f"a Ray task failed on item {i}: {payload[1]}")
            yield from payload

    def _crashed(self, item: Any, reason: str) -> Any:
        if self.on_crash is None:
            raise WorkerCrash(item, reason)
        return self.on_crash(item, reason)

    def close(self) -> None:
        """Cancel what is still in flight (the caller failed or broke off)."""
        for entry in self.flight:
            try:
                self.ray.cancel(entry[2], force=True)
            except Exception:  # noqa: BLE001 - already finished or gone: nothing to cancel
                pass
        self.flight.clear()
        self.todo.clear()
