"""The conversion work unit with its result dropped in the worker (``benchmarks.core_scaling``'s
"work alone"). A module of its own, importing only the work unit, so a worker unpickling it does
not import what the benchmark's driver does (torch, through ``benchmarks.common``)."""

from __future__ import annotations

from dataclasses import dataclass

from packer.preprocess.task import Encoded, ImageTask


@dataclass(frozen=True)
class Dropped:
    """``task`` run on one input; only the sample's payload size comes back (-1: not converted)."""

    task: ImageTask

    def __call__(self, item) -> int:
        result = self.task(item)
        return len(result.payload) if isinstance(result, Encoded) else -1
