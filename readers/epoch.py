"""The epoch plan: which samples (or shards) each distributed rank reads in each epoch, in what order.

One owner for what :class:`~readers.loader.Loader` and
:class:`~readers.webdataset.StreamingShards` both need:

* :func:`resolve_rank`: ``rank``/``world_size`` from the arguments, else from
  ``torch.distributed`` when it is initialised, else one process; validated.
* :class:`EpochPlan` (map-style, for ``Loader``): a permutation drawn from ``(seed, epoch)``,
  split across ranks so that every rank gets the same number of samples and batches (padded by
  repeating the order's first samples, or the uneven tail dropped with ``drop_last``).
* :class:`ShardPlan` (streaming, for ``StreamingShards``): the shard order drawn from
  ``(seed, epoch)``, every ``world_size``-th shard from ``rank``, then every ``num_workers``-th
  of those per DataLoader worker, and the seed of each worker's sample shuffle buffer.
* :class:`EpochCursor` and :func:`check_settings`: the resume bookkeeping both share (the
  epoch the next iteration follows, a resume position that ``set_epoch`` to another epoch
  drops, and the refusal of a saved state whose plan-deciding settings differ).

Every plan is a pure function of its settings and the epoch: the same on every process.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Mapping, Sequence, TypeVar

import numpy as np
import torch

__all__ = ["EpochPlan", "ShardPlan", "EpochCursor", "resolve_rank", "distributed_rank", "check_settings", "check_batch_size", "mix_seed"]

T = TypeVar("T")


def distributed_rank() -> tuple[int, int]:
    """``(rank, world_size)`` of ``torch.distributed`` when it is initialised, else ``(0, 1)``."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``(rank, world_size)``: each given one as is, a missing one from :func:`distributed_rank`.

    Raises ``ValueError`` unless ``world_size >= 1`` and ``0 <= rank < world_size``."""
    if rank is None or world_size is None:
        dist_rank, dist_size = distributed_rank()
        rank = dist_rank if rank is None else rank
        world_size = dist_size if world_size is None else world_size
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} and world_size={world_size}: need world_size >= 1 and 0 <= rank < world_size")
    return int(rank), int(world_size)


def check_batch_size(batch_size: Any) -> None:
    """Raise ``ValueError`` unless ``batch_size`` is a positive integer."""
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")


def mix_seed(*values: int) -> int:
    """One 63-bit seed from several integers (seed, epoch, rank, worker), the same on every process."""
    seed = 0x9E3779B97F4A7C15
    for value in values:
        seed = (seed * 1_000_003 + int(value)) % (1 << 63)
    return seed


def check_settings(state: Mapping[str, Any], mine: Mapping[str, Any], owner: str) -> None:
    """Refuse a saved ``state`` whose plan-deciding settings differ from ``mine`` (keys the
    state lacks are not checked): a ``ValueError`` names the first one that differs."""
    for key, value in mine.items():
        if key in state and state[key] != value:
            raise ValueError(
                f"load_state_dict: the state was saved with {key}={state[key]!r}, this {owner} has {key}={value!r}; "
                "resume with the same dataset and settings"
            )


class EpochCursor:
    """The epoch the next iteration follows, and a resume position inside it (``None``: whole).

    ``set_epoch`` to another epoch drops the position (the next iteration is whole); a loaded
    state (its settings checked by :func:`check_settings`) sets both through :meth:`resume`."""

    __slots__ = ("epoch", "position")

    def __init__(self) -> None:
        self.epoch = 0
        self.position: Any = None

    def set_epoch(self, epoch: int) -> None:
        epoch = int(epoch)
        if epoch != self.epoch:
            self.position = None
        self.epoch = epoch

    def resume(self, epoch: int, position: Any) -> None:
        """Make the next iteration follow ``epoch`` from ``position`` (a loaded state, already checked)."""
        self.epoch = int(epoch)
        self.position = position


@dataclass(frozen=True)
class EpochPlan:
    """The batches of dataset indices rank ``rank`` of ``world_size`` reads in each epoch.

    The epoch's order is a permutation drawn from ``(seed, epoch)`` when ``shuffle``, else index
    order; rank ``r`` takes every ``world_size``-th sample from ``r``. Every rank gets the same
    number of samples and batches: without ``drop_last`` the order is padded by repeating its
    first samples (at most ``world_size - 1``) and a shorter last batch is kept; with
    ``drop_last`` the tail that does not divide evenly is dropped, and so is a shorter last batch.
    """

    length: int
    batch_size: int
    shuffle: bool = True
    seed: int = 0
    drop_last: bool = False
    rank: int = 0
    world_size: int = 1

    def __post_init__(self) -> None:
        check_batch_size(self.batch_size)
        if self.length < 0:
            raise ValueError(f"length must be at least 0, got {self.length!r}")
        resolve_rank(self.rank, self.world_size)

    def settings(self) -> dict[str, Any]:
        """The settings that decide the plan, as a saved state records them."""
        return {
            "seed": self.seed,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "batch_size": self.batch_size,
            "rank": self.rank,
            "world_size": self.world_size,
            "length": self.length,
        }

    @property
    def samples_per_rank(self) -> int:
        n, w = self.length, self.world_size
        return n // w if self.drop_last else -(-n // w)

    def __len__(self) -> int:
        """Batches per epoch on this rank (the same on every rank)."""
        per_rank = self.samples_per_rank
        return per_rank // self.batch_size if self.drop_last else -(-per_rank // self.batch_size)

    def order(self, epoch: int) -> np.ndarray:
        """The whole epoch's order (every rank's samples, before the split): a permutation of ``length``."""
        if self.shuffle:
            return np.random.default_rng([self.seed, epoch]).permutation(self.length)
        return np.arange(self.length, dtype=np.int64)

    def indices(self, epoch: int) -> np.ndarray:
        """This rank's samples of ``epoch``, in order (``samples_per_rank`` of them)."""
        order, n = self.order(epoch), self.length
        total = self.samples_per_rank * self.world_size
        if total > n:  # pad by repeating from the start (every rank the same count)
            order = np.concatenate([order, np.resize(order, total - n)]) if n else order
        return order[:total][self.rank :: self.world_size]

    def batches(self, epoch: int) -> list[np.ndarray]:
        """This rank's batches of ``epoch``: ``len(self)`` arrays of indices."""
        order, size = self.indices(epoch), self.batch_size
        return [order[k * size : (k + 1) * size] for k in range(len(self))]


@dataclass(frozen=True)
class ShardPlan:
    """Which shards rank ``rank`` of ``world_size`` and each of its DataLoader workers read in an epoch.

    The shard order is drawn from ``(seed, epoch)`` when ``shuffle``; rank ``r`` takes every
    ``world_size``-th shard from ``r``, worker ``w`` every ``num_workers``-th of those from
    ``w``: each shard is read exactly once per epoch over all ranks and workers."""

    shuffle: bool = False
    seed: int = 0
    rank: int = 0
    world_size: int = 1

    def __post_init__(self) -> None:
        resolve_rank(self.rank, self.world_size)

    def shards(self, items: Sequence[T], epoch: int, worker: int = 0, num_workers: int = 1) -> list[T]:
        """The part of ``items`` (shards, in their stored order) that ``worker`` reads in ``epoch``."""
        order = list(items)
        if self.shuffle:
            random.Random(mix_seed(self.seed, epoch)).shuffle(order)
        return order[self.rank :: self.world_size][worker::num_workers]

    def sample_rng(self, epoch: int, worker: int) -> random.Random:
        """The generator of ``worker``'s sample shuffle buffer in ``epoch`` (seeded by seed, epoch, rank, worker)."""
        return random.Random(mix_seed(self.seed, epoch, self.rank, worker))
