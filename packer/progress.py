"""The progress bar: tqdm on a terminal, a line now and then in a log, or nothing."""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from typing import Iterator, Protocol, TextIO

__all__ = ["progress_bar", "LOG_LINE_SECONDS"]

#: Seconds between two progress lines when stderr is not a terminal (a log file, a CI job).
LOG_LINE_SECONDS = 30.0


class Bar(Protocol):
    def update(self, n: int = 1) -> object: ...


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass


class _LogLines:
    """Progress for a log: one whole line every :data:`LOG_LINE_SECONDS` (a bar's ``\\r`` frames
    would pile up in the file), with the rate and the time left."""

    def __init__(self, total: int, unit: str, stream: TextIO) -> None:
        self.total, self.unit, self.stream = total, unit, stream
        self.done = 0
        self.started = self.last = time.monotonic()

    def update(self, n: int = 1) -> None:
        self.done += n
        now = time.monotonic()
        if now - self.last < LOG_LINE_SECONDS or self.done >= self.total:
            return
        self.last = now
        rate = self.done / max(now - self.started, 1e-9)
        left = (self.total - self.done) / rate if rate else 0.0
        self.stream.write(f"progress: {self.done:,} of {self.total:,} {self.unit} ({100 * self.done / max(self.total, 1):.0f}%), "
                          f"{rate:,.0f} {self.unit}/s, about {_duration(left)} left\n")
        self.stream.flush()


def _duration(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


@contextmanager
def progress_bar(total: int, *, enabled: bool, unit: str = "img", stream: TextIO | None = None) -> Iterator[Bar]:
    """A bar counting ``total`` items on ``stream`` (stderr) when ``enabled``: tqdm's on a
    terminal, else a progress line every :data:`LOG_LINE_SECONDS`."""
    stream = stream if stream is not None else sys.stderr
    if not enabled:
        yield _NoBar()
        return
    if not _is_terminal(stream):
        yield _LogLines(total, unit, stream)
        return
    from tqdm import tqdm

    with tqdm(total=total, unit=unit, file=stream, dynamic_ncols=True, smoothing=0.1, leave=False) as bar:
        yield bar


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # (a closed or file-less stream)
        return False
