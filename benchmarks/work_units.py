"""The work units benchmarks hand to packer's pool: the conversion's work with its result dropped
(``benchmarks.core_scaling``'s "work alone") or written at its place in a file and nothing more
(its "work and write"), and ready-made samples (``benchmarks.one_writer``).
A module of its own, importing only the work unit, so a worker unpickling one does not import
what the benchmark's driver does (torch, through ``benchmarks.common``: about a second of every
worker's start on the 2-core VM, and more on a lent 16-core host, where one_writer's pools of 15
workers did not finish in 350 s while its work units lived in its own module)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from packer.placement import pwrite_all
from packer.preprocess.task import Encoded, ImageTask

SHAPE = (3, 224, 224)


@dataclass(frozen=True)
class Dropped:
    """``task`` run on one input; only the sample's payload size comes back (-1: not converted)."""

    task: ImageTask

    def __call__(self, item) -> int:
        result = self.task(item)
        return len(result.payload) if isinstance(result, Encoded) else -1


@dataclass
class WrittenAlone:
    """``task`` run on one ``(index, input)``; the sample written into the file ``path`` at
    ``index * nbytes`` with one ``pwrite`` and nothing else (no journal, no checksum booked, no
    write-out or sync: the page cache's buffered write, as the kernel does it for any writer);
    only its size comes back. What writing the samples the plain way costs, beside the work."""

    task: ImageTask
    path: str
    nbytes: int
    _fd: int = field(default=-1, repr=False)

    def __getstate__(self) -> dict:
        return {"task": self.task, "path": self.path, "nbytes": self.nbytes}

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __call__(self, entry: tuple) -> int:
        index, item = entry
        result = self.task(item)
        if not isinstance(result, Encoded):
            return -1
        if self._fd < 0:
            self._fd = os.open(self.path, os.O_WRONLY)
        pwrite_all(self._fd, result.payload, index * self.nbytes)  # (os.pwrite may write less)
        return len(result.payload)


class MakeSample:
    """A worker task that returns a ready 150 KB sample (no decoding: only the hand-over costs)."""

    def __init__(self) -> None:
        self.payload = np.random.default_rng(0).integers(0, 256, int(np.prod(SHAPE)), dtype=np.uint8).tobytes()

    def __call__(self, index: int) -> Encoded:
        return Encoded(index % 10, SHAPE, bytes(memoryview(self.payload)))  # a copy: each sample its own
