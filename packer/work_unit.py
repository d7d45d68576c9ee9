"""What a conversion's pool runs: :class:`WorkUnit`, the base of every work unit packer sends to
its workers (an image, a document, a dataset sample, a WebDataset piece, a placed sample).

The pools (packer/parallel.py, packer/pool_worker.py, packer/pool_start.py) also take a plain
function; what a work unit adds is declared here, so that a wrapper passing another unit on
(``PieceTask``, ``PlaceTask``) cannot drop it without a type checker and a test seeing it.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Sequence

__all__ = ["WorkUnit", "needs_main", "run_all"]


class WorkUnit:
    """Picklable (data and options, never handles); called once per input in a worker."""

    #: It carries something of the program's ``__main__`` (a Python dataset whose class the
    #: script defines): workers must import the script to unpickle it (packer/pool_start.py).
    #: A unit that wraps another passes the wrapped unit's on.
    needs_main: bool = False

    def __call__(self, item: Any) -> Any:
        raise NotImplementedError

    def map(self, items: Sequence[Any]) -> Iterable[Any]:
        """``self(item)`` for each item, in order: a unit overrides it to work on the batch at once
        (reading remote inputs ahead, tokenising in batches)."""
        return map(self, items)


def needs_main(fn: Any) -> bool:
    """Whether a pool's workers must import ``__main__`` to unpickle ``fn``: a function or class
    defined there, or a :class:`WorkUnit` that says so."""
    if getattr(fn, "__module__", None) == "__main__" or type(fn).__module__ == "__main__":
        return True
    return isinstance(fn, WorkUnit) and fn.needs_main


def run_all(fn: Any, items: Sequence[Any]) -> Iterator[Any]:
    """``fn(item)`` for each item, through :meth:`WorkUnit.map` for a work unit."""
    return iter(fn.map(items) if isinstance(fn, WorkUnit) else map(fn, items))
