"""The progress bar: tqdm on stderr, or nothing."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Iterator, Protocol

__all__ = ["progress_bar"]


class Bar(Protocol):
    def update(self, n: int = 1) -> object: ...


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass


@contextmanager
def progress_bar(total: int, *, enabled: bool, unit: str = "img") -> Iterator[Bar]:
    """A bar counting ``total`` items on stderr when ``enabled``."""
    if not enabled:
        yield _NoBar()
        return
    from tqdm import tqdm

    with tqdm(total=total, unit=unit, file=sys.stderr, dynamic_ncols=True, smoothing=0.1, leave=False) as bar:
        yield bar
