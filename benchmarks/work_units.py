"""The work units benchmarks hand to packer's pool: the conversion's work with its result dropped
(``benchmarks.core_scaling``'s "work alone") and ready-made samples (``benchmarks.one_writer``).
A module of its own, importing only the work unit, so a worker unpickling one does not import
what the benchmark's driver does (torch, through ``benchmarks.common``: about a second of every
worker's start on the 2-core VM, and more on a lent 16-core host, where one_writer's pools of 15
workers did not finish in 350 s while its work units lived in its own module)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from packer.preprocess.task import Encoded, ImageTask

SHAPE = (3, 224, 224)


@dataclass(frozen=True)
class Dropped:
    """``task`` run on one input; only the sample's payload size comes back (-1: not converted)."""

    task: ImageTask

    def __call__(self, item) -> int:
        result = self.task(item)
        return len(result.payload) if isinstance(result, Encoded) else -1


class MakeSample:
    """A worker task that returns a ready 150 KB sample (no decoding: only the hand-over costs)."""

    def __init__(self) -> None:
        self.payload = np.random.default_rng(0).integers(0, 256, int(np.prod(SHAPE)), dtype=np.uint8).tobytes()

    def __call__(self, index: int) -> Encoded:
        return Encoded(index % 10, SHAPE, bytes(memoryview(self.payload)))  # a copy: each sample its own
