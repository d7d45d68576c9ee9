"""readers.epoch: the epoch plan shared by Loader and StreamingShards, checked on its own.

Every index (shard) exactly once per epoch over ranks (and workers), equal counts per rank,
the same order for the same (seed, epoch) and a different one otherwise, refusal of a bad
rank/world size, rank/world size from torch.distributed, and the resume bookkeeping.
"""

from __future__ import annotations

import collections
import json

import pytest
import torch

from readers import Loader
from readers.epoch import EpochCursor, EpochPlan, ResumeError, check_settings, position_state, read_position_state, resolve_rank
from readers.shard_plan import ShardPlan


def rank_indices(plan: EpochPlan, epoch: int = 0) -> list[int]:
    return [int(i) for batch in plan.batches(epoch) for i in batch]


def plans(length: int, world_size: int, **kwargs) -> list[EpochPlan]:
    return [EpochPlan(length, world_size=world_size, rank=r, **kwargs) for r in range(world_size)]


# -- the split across ranks ------------------------------------------------------------------
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("length, world_size, batch_size", [(18, 4, 2), (17, 3, 5), (12, 4, 3), (5, 8, 2), (1, 2, 1), (0, 3, 2)])
def test_without_drop_last_every_index_at_least_once_and_only_the_padding_twice(shuffle, length, world_size, batch_size):
    for epoch in (0, 1):
        union = [i for p in plans(length, world_size, batch_size=batch_size, shuffle=shuffle, seed=3) for i in rank_indices(p, epoch)]
        assert set(union) == set(range(length))
        per_rank = -(-length // world_size)
        assert len(union) == per_rank * world_size
        # the padding repeats the epoch's first samples, each at most once more
        extra = [i for i, n in collections.Counter(union).items() for _ in range(n - 1)]
        first = plans(length, world_size, batch_size=batch_size, shuffle=shuffle, seed=3)[0].order(epoch)[: len(extra)]
        assert sorted(extra) == sorted(int(i) for i in first)


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("length, world_size, batch_size", [(18, 4, 2), (17, 3, 5), (19, 2, 4), (22, 3, 4), (5, 8, 2), (0, 3, 2)])
def test_with_drop_last_every_index_at_most_once_and_only_the_uneven_tail_dropped(shuffle, length, world_size, batch_size):
    group = plans(length, world_size, batch_size=batch_size, shuffle=shuffle, seed=3, drop_last=True)
    union = [i for p in group for i in rank_indices(p)]
    assert len(union) == len(set(union))
    kept_per_rank = (length // world_size) // batch_size * batch_size
    assert len(union) == kept_per_rank * world_size
    assert all(len(batch) == batch_size for p in group for batch in p.batches(0))


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("length, world_size, batch_size", [(18, 4, 2), (17, 3, 5), (19, 4, 4), (5, 8, 2)])
def test_every_rank_has_the_same_samples_and_batches(drop_last, length, world_size, batch_size):
    group = plans(length, world_size, batch_size=batch_size, seed=1, drop_last=drop_last)
    assert len({len(p) for p in group}) == 1
    assert len({len(p.batches(0)) for p in group}) == 1 and len(group[0].batches(0)) == len(group[0])
    assert len({len(rank_indices(p)) for p in group}) == 1
    assert [len(b) for b in group[0].batches(0)] == [len(b) for b in group[-1].batches(0)]


def test_ranks_take_every_world_size_th_sample_of_the_epoch_order():
    group = plans(12, 3, batch_size=2, seed=5)
    order = group[0].order(4).tolist()
    for r, p in enumerate(group):
        assert rank_indices(p, 4) == order[r::3]


# -- order -----------------------------------------------------------------------------------
def test_same_seed_and_epoch_same_order_otherwise_different():
    a, b = EpochPlan(50, 4, seed=7), EpochPlan(50, 4, seed=7)
    assert rank_indices(a, 2) == rank_indices(b, 2)
    assert sorted(a.order(2).tolist()) == list(range(50))
    assert rank_indices(a, 2) != rank_indices(a, 3)
    assert rank_indices(a, 2) != rank_indices(EpochPlan(50, 4, seed=8), 2)
    assert EpochPlan(50, 4, shuffle=False).order(9).tolist() == list(range(50))


def test_orders_are_pinned():
    """The orders are part of the contract: a saved resume position must mean the same samples
    after an upgrade. These are the orders packer has always produced for seed 0."""
    assert EpochPlan(10, 3, seed=0).order(0).tolist() == [4, 6, 2, 7, 3, 5, 9, 0, 8, 1]
    assert EpochPlan(10, 3, seed=0).order(1).tolist() == [9, 1, 3, 8, 7, 6, 0, 4, 2, 5]
    assert ShardPlan(shuffle=True, seed=0).shards(list(range(10)), 0) == [0, 6, 5, 3, 8, 7, 9, 2, 1, 4]
    assert ShardPlan(shuffle=True, seed=0).sample_rng(0, 0).random() == 0.5718559439203801


def test_loader_follows_the_plan():
    loader = Loader(torch.utils.data.TensorDataset(torch.zeros(11, 1), torch.arange(11)), 3, seed=2, rank=1, world_size=2)
    loader.set_epoch(5)
    plan = EpochPlan(11, 3, seed=2, rank=1, world_size=2)
    assert [b.tolist() for b in loader.batch_indices()] == [b.tolist() for b in plan.batches(5)]
    assert [labels.tolist() for _images, labels in loader] == [b.tolist() for b in plan.batches(5)]


# -- shards ----------------------------------------------------------------------------------
@pytest.mark.parametrize("shuffle", [False, True])
def test_shards_once_over_ranks_and_workers(shuffle):
    shards = [f"s{k}" for k in range(23)]
    for epoch in (0, 1):
        parts = [
            ShardPlan(shuffle, 4, rank, 3).shards(shards, epoch, worker, 2) for rank in range(3) for worker in range(2)
        ]
        union = [s for part in parts for s in part]
        assert sorted(union) == sorted(shards) and len(union) == len(shards)
    plan = ShardPlan(shuffle, 4, 1, 3)
    assert plan.shards(shards, 0) == ShardPlan(shuffle, 4, 1, 3).shards(shards, 0)
    assert (plan.shards(shards, 0) != plan.shards(shards, 1)) == shuffle
    assert plan.sample_rng(0, 1).random() == ShardPlan(shuffle, 4, 1, 3).sample_rng(0, 1).random()
    assert plan.sample_rng(0, 1).random() != plan.sample_rng(0, 0).random() != plan.sample_rng(1, 0).random()


# -- rank and world size ---------------------------------------------------------------------
@pytest.mark.parametrize("rank, world_size", [(2, 2), (-1, 2), (0, 0), (3, 1)])
def test_bad_rank_or_world_size_is_refused(rank, world_size):
    with pytest.raises(ValueError, match=f"rank={rank} and world_size={world_size}"):
        resolve_rank(rank, world_size)
    with pytest.raises(ValueError, match="rank"):
        EpochPlan(10, 2, rank=rank, world_size=world_size)
    with pytest.raises(ValueError, match="rank"):
        ShardPlan(rank=rank, world_size=world_size)


def test_a_rank_without_world_size_says_where_its_world_size_came_from():
    """Loader(ds, 4, rank=1) said 'rank=1 and world_size=1' as if both were given (a walkthrough)."""
    with pytest.raises(ValueError, match=r"^rank=1 and world_size=1 \(world_size not given: torch\.distributed's, or 1 without "
                                         r"a process group\): need"):
        resolve_rank(1, None)


@pytest.mark.parametrize("batch_size", [0, -1, 2.0, True])
def test_bad_batch_size_is_refused(batch_size):
    with pytest.raises(ValueError, match="batch_size"):
        EpochPlan(10, batch_size)


def test_rank_and_world_size_come_from_torch_distributed(monkeypatch):
    assert resolve_rank(None, None) == (0, 1)  # not initialised: one process
    monkeypatch.setattr(torch.distributed, "is_available", lambda: True)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 3)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 4)
    assert resolve_rank(None, None) == (3, 4)
    assert resolve_rank(1, None) == (1, 4)  # a given value wins
    assert resolve_rank(None, 8) == (3, 8)
    with pytest.raises(ValueError, match="rank=3 and world_size=2"):
        resolve_rank(None, 2)
    loader = Loader(torch.utils.data.TensorDataset(torch.zeros(9, 1), torch.arange(9)), 2)
    assert (loader.rank, loader.world_size) == (3, 4)


# -- resume bookkeeping ----------------------------------------------------------------------
def test_cursor_keeps_a_position_only_for_its_epoch():
    cursor = EpochCursor()
    cursor.resume(2, 5)
    cursor.set_epoch(2)
    assert (cursor.epoch, cursor.position) == (2, 5)
    cursor.set_epoch(3)
    assert (cursor.epoch, cursor.position) == (3, None)


def test_check_settings_names_the_setting_that_differs():
    state = json.loads(json.dumps({"epoch": 0, "seed": 1, "shuffle": True}))
    check_settings(state, {"seed": 1, "shuffle": True}, "loader")
    check_settings({"epoch": 0}, {"seed": 1}, "loader")  # keys the state lacks are not checked
    with pytest.raises(ResumeError, match="saved with seed=1, this loader has seed=2"):
        check_settings(state, {"seed": 2, "shuffle": True}, "loader")
    with pytest.raises(ValueError, match="shuffle=True, this sampler has shuffle=False"):  # a ValueError too
        check_settings(state, {"seed": 1, "shuffle": False}, "sampler")


# -- the global plan: positions, steps, resume -----------------------------------------------
def test_a_step_is_batch_size_times_world_size_positions_of_the_global_order():
    group = plans(23, 3, batch_size=2, seed=4)
    order = group[0].order(1)
    for step in range(len(group[0])):
        positions = order[step * 6 : (step + 1) * 6]
        assert sorted(int(i) for p in group for i in p.batches(1)[step]) == sorted(int(i) for i in positions) or step == 3
    # from a position: the rest, split the same way, whatever the settings that read the head
    rest = [EpochPlan(23, 4, seed=4, rank=r, world_size=2).batches(1, 9) for r in range(2)]
    assert [b.tolist() for b in rest[0]] == [order[9:17][0::2].tolist(), order[17:23][0::2].tolist()]
    assert [b.tolist() for b in rest[1]] == [order[9:17][1::2].tolist(), order[17:23][1::2].tolist()]


@pytest.mark.parametrize("drop_last", [False, True])
def test_steps_samples_and_position_agree_with_the_batches(drop_last):
    for start in range(0, 24):
        group = plans(23, 3, batch_size=2, seed=1, drop_last=drop_last)
        steps = group[0].steps(start)
        assert all(len(p.batches(0, start)) == steps for p in group)  # equal steps on every rank
        assert all(len(p.rank_indices(0, start)) == p.samples(start) for p in group)
        assert group[0].position(start, steps) == (23 if steps else start)  # the last step completes the epoch
        assert all(group[0].position(start, k) == start + 6 * k for k in range(steps))
    with pytest.raises(ResumeError, match="samples_consumed=24 is outside 0..23"):
        EpochPlan(23, 2).batches(0, 24)


def test_position_state_round_trips_and_refuses_what_differs():
    plan = EpochPlan(10, 2, seed=1, world_size=2)
    fingerprint = {"samples": 10, "source": "/data/a", "created": "2026-01-01T00:00:00Z"}
    state = json.loads(json.dumps(position_state(plan, 3, 4, fingerprint)))
    assert state == {"epoch": 3, "samples_consumed": 4, "seed": 1, "shuffle": True, "dataset": fingerprint}
    other = EpochPlan(10, 5, seed=1, drop_last=True)  # another batch size, world size, drop_last
    assert read_position_state(state, other, fingerprint, "loader") == (3, 4)
    with pytest.raises(ResumeError, match="another dataset: it was saved over source='/data/a', this loader reads source='/data/b'"):
        read_position_state(state, other, {**fingerprint, "source": "/data/b"}, "loader")
    with pytest.raises(ResumeError, match="saved over samples=10, this loader reads samples=11"):
        read_position_state(state, EpochPlan(11, 2, seed=1), {"samples": 11}, "loader")
    with pytest.raises(ResumeError, match="seed=1, this loader has seed=2"):
        read_position_state(state, EpochPlan(10, 2, seed=2), fingerprint, "loader")
    with pytest.raises(ResumeError, match="samples_consumed=11 is outside 0..10"):
        read_position_state({**state, "samples_consumed": 11}, plan, fingerprint, "loader")
    with pytest.raises(ResumeError, match="not a saved loader state"):
        read_position_state({"epoch": 1, "seed": 1}, plan, fingerprint, "loader")
    with pytest.raises(ResumeError, match="list is not a saved loader state"):
        read_position_state([1, 2], plan, fingerprint, "loader")


@pytest.mark.parametrize("world_size", [2, 3])
def test_a_state_of_the_format_before_the_global_plan_converts_exactly(world_size):
    """The old per-rank state (``batches`` of this rank with the settings) names the same samples."""
    old = {"epoch": 2, "batches": 3, "seed": 5, "shuffle": True, "drop_last": False, "batch_size": 2,
           "rank": 1, "world_size": 2, "length": 17}
    head = [int(i) for r in range(2) for b in EpochPlan(17, 2, seed=5, rank=r, world_size=2).batches(2)[:3] for i in b]
    epoch, start = read_position_state(old, EpochPlan(17, 4, seed=5, world_size=world_size), {"samples": 17}, "loader")
    assert (epoch, start) == (2, 12)
    rest = [int(i) for r in range(world_size) for i in EpochPlan(17, 4, seed=5, rank=r, world_size=world_size).rank_indices(2, start)]
    order = EpochPlan(17, 2, seed=5).order(2).tolist()
    assert sorted(head) == sorted(order[:12])
    extra = collections.Counter(rest) - collections.Counter(order[12:])  # only the padding of the short last step
    assert sum(extra.values()) == -5 % world_size and set(extra) <= set(order[: world_size - 1])
    assert set(order[12:]) <= set(rest)
    with pytest.raises(ResumeError, match="saved over samples=17, this loader reads samples=18"):
        read_position_state(old, EpochPlan(18, 4, seed=5), {"samples": 18}, "loader")
    done = read_position_state({**old, "batches": 5}, EpochPlan(17, 4, seed=5), {"samples": 17}, "loader")
    assert done == (2, 17)  # the whole epoch (5 batches of 2 on 2 ranks, padded)
