"""Executors: who runs the map over a conversion's inputs (or WebDataset pieces).

An executor is a context manager with :func:`packer.parallel.ordered_map`'s contract:
``executor(fn, items, *, workers, chunksize=None, on_crash=None, item_timeout=...)`` yields
an iterator of ``fn(item)`` in input order; an item that crashes or hangs its worker becomes
``on_crash(item, reason)``; an exception raised by ``fn`` is a :class:`~packer.parallel.WorkerError`.

* ``"local"``: this machine's process pool (:mod:`packer.parallel`).
* ``"ray"``: Ray tasks on a cluster (:mod:`packer.executors.ray`; ``pip install 'packer[ray]'``).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Callable, Iterator, Protocol, Sequence

from ..errors import OptionError
from ..options import EXECUTORS

__all__ = ["EXECUTORS", "Executor", "LocalExecutor", "get_executor"]


class Executor(Protocol):
    """What the driver (packer/engine.py) asks of an executor."""

    #: The worker (or task) count the latest map ran with; ``None`` before one, or where the
    #: caller chose it.
    workers: int | None

    def __call__(self, fn: Callable[[Any], Any], items: Sequence[Any], *, workers: int | None,
                 **options: Any) -> AbstractContextManager[Iterator[Any]]:
        """``ordered_map``'s contract (the module docstring)."""
        ...

    def planned_workers(self) -> int:
        """How many workers a map without ``workers`` would run (WebDataset cuts its pieces by it)."""
        ...

    def release(self) -> None:
        """Let go of what :meth:`planned_workers` took, if no map did (a failure between them)."""
        ...


class LocalExecutor:
    """This machine's process pool (:func:`packer.parallel.ordered_map`)."""

    workers: int | None = None

    def __call__(self, fn: Callable[[Any], Any], items: Sequence[Any], *, workers: int | None,
                 **options: Any) -> AbstractContextManager[Iterator[Any]]:
        from ..parallel import ordered_map

        return ordered_map(fn, items, workers=workers, **options)

    def planned_workers(self) -> int:
        from ..parallel import default_workers

        return default_workers()

    def release(self) -> None:
        """Nothing to let go of: the pool starts and stops with each map."""


def get_executor(name: str, *, ray_address: str | None = None) -> Executor:
    """The executor named ``name`` (``ray_address``: the cluster to join)."""
    if name == "local":
        if ray_address is not None:
            raise OptionError("--ray-address: only with --executor ray")
        return LocalExecutor()
    if name == "ray":
        from .ray import RayExecutor  # (Ray itself is imported when a map starts)

        return RayExecutor(ray_address)
    raise OptionError(f"--executor: must be one of {', '.join(EXECUTORS)}, got {name!r}")
