"""Executors: who runs the map over a conversion's inputs (or WebDataset pieces).

An executor is a context manager with :func:`packer.parallel.ordered_map`'s contract:
``executor(fn, items, *, workers, chunksize=None, on_crash=None, item_timeout=...)`` yields
an iterator of ``fn(item)`` in input order; an item that crashes or hangs its worker becomes
``on_crash(item, reason)``; an exception raised by ``fn`` is a :class:`~packer.parallel.WorkerError`.

* ``"local"``: this machine's process pool (:mod:`packer.parallel`).
* ``"ray"``: Ray tasks on a cluster (:mod:`packer.executors.ray`; ``pip install 'packer[ray]'``).
"""

from __future__ import annotations

from typing import Any, Callable

from ..errors import OptionError
from ..options import EXECUTORS

__all__ = ["EXECUTORS", "get_executor"]



def get_executor(name: str, *, ray_address: str | None = None) -> Callable[..., Any]:
    """The ``ordered_map``-like context manager named ``name`` (``ray_address``: the cluster to join)."""
    if name == "local":
        if ray_address is not None:
            raise OptionError("--ray-address: only with --executor ray")
        from ..parallel import ordered_map

        return ordered_map
    if name == "ray":
        from .ray import RayExecutor

        return RayExecutor(ray_address)
    raise OptionError(f"--executor: must be one of {', '.join(EXECUTORS)}, got {name!r}")
