"""The streaming plan of :class:`~readers.webdataset.StreamingShards`: which shards each rank and
DataLoader worker reads in each epoch, and how many samples each yields.

* :class:`ShardPlan`: the shard order drawn from ``(seed, epoch)``, every ``world_size``-th
  shard from ``rank``, then every ``num_workers``-th of those per DataLoader worker, and the
  seed of each worker's sample shuffle buffer.
* :func:`equal_batches`: how many samples each DataLoader worker of each rank yields so that
  every rank yields the same number of batches (padded or truncated); :func:`rank_shares`
  refuses an epoch with no batch on a rank.

The map-style plan and the checks both use are :mod:`readers.epoch`. Every plan is a pure
function of its settings and the epoch: the same on every process.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence, TypeVar

from .epoch import check_batch_size, flag, mix_seed, resolve_rank, whole_number

__all__ = ["ShardPlan", "equal_batches", "rank_shares", "worker_position"]

T = TypeVar("T")


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
        object.__setattr__(self, "seed", whole_number(self.seed, "seed"))  # a plain int: states are JSON
        object.__setattr__(self, "shuffle", flag(self.shuffle, "shuffle"))
        resolve_rank(self.rank, self.world_size)

    def shards(self, items: Sequence[T], epoch: int, worker: int = 0, num_workers: int = 1) -> list[T]:
        """The part of ``items`` (shards, in their stored order) that ``worker`` reads in ``epoch``."""
        return self._order(items, epoch)[self.rank :: self.world_size][worker::num_workers]

    def split(self, items: Sequence[T], epoch: int, num_workers: int = 1) -> list[list[list[T]]]:
        """Every rank's parts of ``items`` in ``epoch``, per worker: ``split(...)[r][w]`` is what
        :meth:`shards` gives worker ``w`` of rank ``r`` (one shuffle for all)."""
        order = self._order(items, epoch)
        return [[order[r :: self.world_size][w::num_workers] for w in range(num_workers)] for r in range(self.world_size)]

    def _order(self, items: Sequence[T], epoch: int) -> list[T]:
        order = list(items)
        if self.shuffle:
            random.Random(mix_seed(self.seed, epoch)).shuffle(order)
        return order

    def sample_rng(self, epoch: int, worker: int) -> random.Random:
        """The generator of ``worker``'s sample shuffle buffer in ``epoch`` (seeded by seed, epoch, rank, worker)."""
        return random.Random(mix_seed(self.seed, epoch, self.rank, worker))


def equal_batches(counts: Sequence[Sequence[int]], batch_size: int, drop_last: bool = False) -> list[list[int]]:
    """How many samples worker ``w`` of rank ``r`` yields, ``out[r][w]``, so that every rank yields
    the same number of whole batches of ``batch_size``, given ``counts[r][w]``: the samples of the
    shards that worker reads. Every ``out[r][w]`` is a multiple of ``batch_size``.

    * Pad (``drop_last=False``): each worker's samples are padded up to whole batches, then a
      rank with fewer batches than the longest gets whole batches more, spread over its workers
      that have samples (evenly, the lowest worker ids first for the remainder). What pads is a
      repeat of the worker's own samples (the caller's part); only padding is read twice.
    * Drop (``drop_last=True``): each rank keeps the first ``N`` whole batches of the DataLoader's
      round robin over its workers (an exhausted worker skipped), ``N`` the shortest rank's
      number of whole batches: each worker's tail past that is not read, nothing is read twice.

    The result depends only on ``counts``: every process computes every rank's share alike.
    Raises ``ValueError`` when padding is needed on a rank without samples."""
    batch_size = check_batch_size(batch_size)
    if drop_last:
        whole = [[int(c) // batch_size for c in rank] for rank in counts]
        steps = min((sum(rank) for rank in whole), default=0)
        return [[batch_size * n for n in _round_robin_first(rank, steps)] for rank in whole]
    batches = [[-(-int(c) // batch_size) for c in rank] for rank in counts]
    steps = max((sum(rank) for rank in batches), default=0)
    out = []
    for r, (rank, natural) in enumerate(zip(counts, batches)):
        extra, owners = steps - sum(natural), [w for w, c in enumerate(rank) if c > 0]
        if extra and not owners:
            raise ValueError(
                f"rank {r} of {len(counts)} reads no samples (fewer shards than ranks, or empty ones), so it cannot repeat any "
                f"up to the other ranks' {steps} batches: give every rank a shard (fewer ranks or more shards); drop_last=True "
                "would not help, every rank would stop at this rank's 0 batches"
            )
        share, rest = divmod(extra, max(1, len(owners)))
        more = {w: share + (i < rest) for i, w in enumerate(owners)}
        out.append([batch_size * (n + more.get(w, 0)) for w, n in enumerate(natural)])
    return out


def rank_shares(counts: Sequence[Sequence[int]], batch_size: int, drop_last: bool = False) -> list[list[int]]:
    """:func:`equal_batches`, refusing shares that give every rank no batch (no samples, or
    ``drop_last`` at a rank without a whole batch): a ``ValueError`` says why and what would work."""
    shares = equal_batches(counts, batch_size, drop_last)
    if any(sum(rank) for rank in shares):
        return shares
    if not any(sum(rank) for rank in counts):
        raise ValueError("StreamingShards: the shards hold no samples (their metadata counts 0), so every epoch would yield no batch")
    r = min(range(len(counts)), key=lambda k: sum(int(c) // batch_size for c in counts[k]))
    if not sum(counts[r]):
        raise ValueError(
            f"StreamingShards: rank {r} of {len(counts)} reads no samples (fewer shards than ranks, or empty ones), so with "
            "drop_last=True every rank would stop at its 0 batches: give every rank a shard (fewer ranks or more shards)"
        )
    raise ValueError(
        f"StreamingShards: drop_last=True stops every rank at the shortest rank's whole batches, and rank {r} of {len(counts)} "
        f"has none: its DataLoader workers read {[int(c) for c in counts[r]]} samples this epoch, each fewer than "
        f"batch_size={batch_size}, so every rank would get no batch; use a smaller batch_size or fewer DataLoader workers, "
        "or drop_last=False (shorter ranks are then padded)"
    )


def uneven_split(shards: int, natural: Sequence[Sequence[int]], shares: Sequence[Sequence[int]], batch_size: int,
                 drop_last: bool, unit: str = "samples") -> str | None:
    """Why equal batches from whole shards are a poor split, or ``None``: where they repeat or
    drop more than a tenth of an epoch's samples. Beyond what the same streams split by sample
    would, too few shards per stream are the cause; else whole batches per stream are, said where
    they repeat samples (a migrant's walkthrough: such repeats went unsaid where a split by sample
    repeated as many), not where ``drop_last`` asked for short batches to be dropped.
    ``natural``/``shares``: ``[rank][worker]`` samples read and yielded (:func:`rank_shares`);
    ``unit``: what they count, as the message names it (a text dataset's ``"blocks"``)."""
    world_size, workers = len(natural), len(natural[0]) if natural else 1
    streams = world_size * workers
    total, yielded = sum(map(sum, natural)), sum(map(sum, shares))
    even = [[total // streams + (w * world_size + r < total % streams) for w in range(workers)] for r in range(world_size)]
    try:
        baseline = sum(map(sum, rank_shares(even, batch_size, drop_last))) if total else 0
    except ValueError:  # split by sample, some rank would have no whole batch: the batch size is the matter, not the shards
        return None
    if not total or abs(yielded - total) <= total / 10:  # (it warned of "0 dropped" where the whole-shard split lost
        return None  # nothing and a split by sample would have repeated 8)
    what = f"{yielded - total:,} repeated" if yielded > total else f"{total - yielded:,} dropped"
    streams_are = (f"{streams} stream{'s' if streams != 1 else ''} ({world_size} rank{'s' if world_size != 1 else ''} "
                   f"x {workers} DataLoader worker{'s' if workers > 1 else ''})")
    if abs(yielded - total) - abs(baseline - total) <= total / 10:  # (drop_last asked for a stream's short batch to go)
        return None if drop_last else (
            f"{streams_are} {'each yield' if streams > 1 else 'yields'} whole batches of {batch_size}, which leave epoch 0 with {what} of {total:,} {unit} "
            f"({abs(yielded - total) / total:.0%}) however the {shards} shards are split; use a smaller batch_size or fewer "
            "DataLoader workers (drop_last=True drops a stream's short batch instead), or read them map-style (Loader(ShardDataset(folder)))")
    return (f"{shards} shards over {streams_are}: equal batches from whole shards leave epoch 0 with "
            f"{what} of {total:,} {unit} ({abs(yielded - total) / total:.0%}; split by sample, {abs(baseline - total):,}); use "
            "about 10 shards per stream (a smaller --shard-size), or read them map-style (Loader(ShardDataset(folder)))")


def _round_robin_first(batches: Sequence[int], steps: int) -> list[int]:
    """How many of the first ``steps`` batches of an in-order round robin over workers holding
    ``batches[w]`` batches (an exhausted worker skipped) come from each worker."""
    low, high = 0, max(batches, default=0)  # the largest full round `level` with sum(min(b, level)) <= steps
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if sum(min(b, mid) for b in batches) <= steps else (low, mid - 1)
    taken = [min(b, low) for b in batches]
    left = steps - sum(taken)
    for w, b in enumerate(batches):
        if left and b > low:
            taken[w] += 1
            left -= 1
    return taken


def worker_position(counts: list[int], batches: int, batch_size: int | None) -> tuple[list[int], int]:
    """Where a rank's DataLoader workers, yielding ``counts`` samples each this epoch, are after
    ``batches`` batches of ``batch_size`` (``None``: samples) handed out by the DataLoader's
    in-order round robin (an exhausted worker skipped): the samples each has handed out, and the
    worker whose batch comes next. More batches than the epoch has: a ``ValueError``."""
    size = 1 if batch_size is None else batch_size
    per_worker = [-(-n // size) for n in counts]
    taken = [0] * len(counts)
    left, following = int(batches), 0
    while left > 0 and any(t < b for t, b in zip(taken, per_worker)):
        for w in range(len(counts)):
            if left and taken[w] < per_worker[w]:
                taken[w] += 1
                left -= 1
                following = (w + 1) % len(counts)
    if left:
        raise ValueError(f"state_dict: batches={batches} is more than this rank's {sum(per_worker)} batches per epoch")
    return [min(n, t * size) for n, t in zip(counts, taken)], following
