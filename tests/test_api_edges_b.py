"""Edges of the reading API found by a Python-API walkthrough (readers.Loader, ResumableSampler,
StreamingShards and their shared plan, readers/epoch.py):

1. A reader made under ``torchrun`` before ``init_process_group`` (``WORLD_SIZE=2`` in the
   environment, no process group) read as rank 0 of 1, the whole dataset on every rank, silently:
   now one warning says so and what to do (checked with real gloo ranks too).
2. Settings whose epoch has no batch on a rank (``drop_last`` dropping every sample, no samples,
   a rank without shards) are refused at construction (``StreamingShards``: also at ``set_epoch``),
   and following the advice of the refusal gives batches on every rank.
3. ``len(Loader)`` after ``load_state_dict`` mid-epoch is the rest of the epoch, before and
   during the resumed iteration, and the whole epoch once it ended.
4. A path instead of a dataset, a negative or fractional seed, epoch, saved epoch or count is
   refused at the API boundary in one line naming the argument.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import packer
from loopback import LOOPBACK, free_port
from packer import StorageOptions
from readers import Loader, ResumableSampler, ResumeError, StreamingShards
from readers.epoch import EpochPlan
from readers.shard_plan import ShardPlan, rank_shares

ROOT = Path(__file__).resolve().parents[1]


def tensors(n: int) -> TensorDataset:
    """``n`` one-pixel samples whose labels are their indices."""
    return TensorDataset(torch.zeros(n, 1, 1, 1, dtype=torch.uint8), torch.arange(n))


def labels(batches) -> list[int]:
    return [int(i) for _images, batch_labels in batches for i in batch_labels]


def shards(folder: Path, count: int, shard_size: int) -> Path:
    """``count`` 4x4 samples written as WebDataset shards of ``shard_size`` (the last one shorter)."""
    rng = np.random.default_rng(count)
    samples = [(rng.integers(0, 256, (4, 4, 3), dtype=np.uint8), i % 3) for i in range(count)]
    packer.convert(samples, folder, format="webdataset", storage=StorageOptions(shard_size=shard_size), workers=1)
    return folder


@pytest.fixture(scope="module")
def four_shards(tmp_path_factory) -> Path:
    """8 samples in 4 shards of 2."""
    return shards(tmp_path_factory.mktemp("edges") / "four", 8, 2)


# -- 1. a reader made before init_process_group under a launcher ------------------------------
@pytest.fixture
def launched(monkeypatch):
    """The environment torchrun gives rank 1 of 2, and no process group."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert not torch.distributed.is_initialized()


def test_a_loader_made_before_init_process_group_warns(launched):
    with pytest.warns(UserWarning, match=r"Loader: the environment says WORLD_SIZE=2 \(RANK=1\), but no torch.distributed "
                      r"process group is initialised, so it reads as rank 0 of 1 \(the whole dataset.*init_process_group\(\) "
                      r"before creating it, or pass rank= and world_size="):
        loader = Loader(tensors(10), 2)
    assert (loader.rank, loader.world_size) == (0, 1)  # still what it did: a warning, not a guess from the environment
    with pytest.raises(ValueError, match=r"^world_size=2 without rank= and no torch.distributed process group: every process "
                                         r"would read as rank 0"):  # world_size alone: rank 0 everywhere (was a warning here, silent without WORLD_SIZE)
        Loader(tensors(10), 2, world_size=2)


def test_rank_and_world_size_are_integers_and_come_together(monkeypatch, four_shards):
    """rank=0.5 read as rank 0, world_size=2.5 as 2, rank='1' was a TypeError, and world_size=2
    alone read rank 0's share on every process without a word (an FFCV user's walkthrough)."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    for rank, world_size, said in ((0.5, 2, "rank must be an integer, got 0.5"), (1, 2.5, "world_size must be an integer, got 2.5"),
                                   ("1", 2, "rank must be an integer, got '1'"), (True, 2, "rank must be an integer, got True"),
                                   (None, 2, "world_size=2 without rank= and no torch.distributed process group")):
        for make in (lambda: Loader(tensors(10), 2, rank=rank, world_size=world_size),
                     lambda: ResumableSampler(10, 2, rank=rank, world_size=world_size),
                     lambda: StreamingShards(four_shards, rank=rank, world_size=world_size)):
            with pytest.raises(ValueError, match="^" + re.escape(said)):
                make()
    assert (Loader(tensors(10), 2, rank=np.int64(1), world_size=np.int64(2)).rank, Loader(tensors(10), 2, world_size=1).rank) == (1, 0)


def test_the_sampler_and_the_stream_resolve_rank_alike_and_warn_too(launched, four_shards):
    with pytest.warns(UserWarning, match="ResumableSampler: the environment says WORLD_SIZE=2"):
        ResumableSampler(10, 2)
    with pytest.warns(UserWarning, match="StreamingShards: the environment says WORLD_SIZE=2.*pass rank= and world_size="):
        StreamingShards(four_shards)


def test_no_warning_when_rank_and_world_size_are_known(monkeypatch, four_shards):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        monkeypatch.setenv("WORLD_SIZE", "2")
        Loader(tensors(10), 2, rank=1, world_size=2)  # given: nothing to guess
        ResumableSampler(10, 2, rank=1, world_size=2)
        StreamingShards(four_shards, rank=1, world_size=2)
        for single in ("1", "", "two"):  # one process, or nothing a launcher set
            monkeypatch.setenv("WORLD_SIZE", single)
            Loader(tensors(10), 2)
        monkeypatch.setenv("WORLD_SIZE", "2")  # a process group: its rank and world size
        monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
        monkeypatch.setattr(torch.distributed, "get_rank", lambda: 1)
        monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 2)
        assert (Loader(tensors(10), 2).rank, StreamingShards(four_shards).rank) == (1, 1)


JOB = r"""
import datetime, json, sys, warnings
import torch, torch.distributed as dist
from torch.utils.data import TensorDataset
from readers import Loader

ds = TensorDataset(torch.zeros(10, 1, 1, 1, dtype=torch.uint8), torch.arange(10))
for _ in range(3):
    early = Loader(ds, 2)  # made before init_process_group: warned once (Python's default filter)
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{sys.argv[1]}", rank=int(sys.argv[2]), world_size=2,
                        timeout=datetime.timedelta(seconds=30))
late = Loader(ds, 2)  # after: torch.distributed's rank, no warning
print(json.dumps({"early": [early.rank, early.world_size, len(early)], "late": [late.rank, late.world_size, len(late)]}))
dist.destroy_process_group()
"""


def test_real_ranks_warn_once_before_init_process_group_and_not_after():
    port = str(free_port())
    ranks = []
    for r in range(2):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MASTER_ADDR": LOOPBACK,
               "RANK": str(r), "WORLD_SIZE": "2", "PYTHONWARNINGS": ""}
        ranks.append(subprocess.Popen([sys.executable, "-c", JOB, port, str(r)], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    for r, p in enumerate(ranks):
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-3000:]
        assert err.count("UserWarning") == 1 and f"WORLD_SIZE=2 (RANK={r})" in err and "init_process_group()" in err, err
        got = json.loads(out)
        assert got == {"early": [0, 1, 5], "late": [r, 2, 3]}  # the whole dataset before, its half after


# -- 2. epochs that would be empty --------------------------------------------------------------
def test_drop_last_dropping_every_sample_is_refused_and_the_advice_works():
    ds = tensors(200)
    with pytest.raises(ValueError, match=r"^Loader: drop_last=True drops all 200 samples, fewer than one step of batch_size x "
                       r"world_size = 500 x 1, so every rank would get no batch; make batch_size x world_size at most 200 "
                       r"\(here batch_size=200 or less\), or drop_last=False$"):
        Loader(ds, 500, drop_last=True)
    assert [len(b) for b, _ in Loader(ds, 200, drop_last=True)] == [200]  # the advice: batch_size=200
    assert [len(b) for b, _ in Loader(ds, 500)] == [200]  # or drop_last=False: one shorter batch


def test_more_ranks_than_samples_with_drop_last_is_refused_on_every_rank():
    ds = tensors(3)
    for rank in range(5):
        with pytest.raises(ValueError, match="drops all 3 samples.*2 x 5.*batch_size x world_size at most 3, or drop_last=False"):
            Loader(ds, 2, world_size=5, rank=rank, drop_last=True)
        with pytest.raises(ValueError, match="ResumableSampler: drop_last=True drops all 3 samples"):
            ResumableSampler(ds, 2, world_size=5, rank=rank, drop_last=True)
    # the advice, each way: a step of at most 3 samples, or padding
    assert [labels(Loader(ds, 1, world_size=3, rank=r, drop_last=True, shuffle=False)) for r in range(3)] == [[0], [1], [2]]
    assert all(len(Loader(ds, 2, world_size=5, rank=r)) == 1 for r in range(5))
    assert all(len(list(ResumableSampler(ds, 1, world_size=3, rank=r, drop_last=True))) == 1 for r in range(3))


def test_a_dataset_without_samples_is_refused():
    with pytest.raises(ValueError, match="^Loader: the dataset has no samples, so every epoch would yield no batch$"):
        Loader(tensors(0), 4)
    with pytest.raises(ValueError, match="^ResumableSampler: the dataset has no samples"):
        ResumableSampler(0, 4)


def test_a_resume_that_leaves_nothing_of_its_epoch_is_not_refused():
    """Only settings whose whole epoch is empty are refused: the end of a resumed epoch is not."""
    done = Loader(tensors(10), 4, seed=1)
    state = {**done.state_dict(), "epoch": 0, "samples_consumed": 10}  # the end of epoch 0 (a state saved before its last batch was counted so)
    loader = Loader(tensors(10), 4, seed=1)
    loader.load_state_dict(state)  # the epoch is complete
    assert len(loader) == 0 and list(loader) == []
    loader.set_epoch(1)
    assert len(loader) == 3 and len(list(loader)) == 3


def test_a_stream_rank_without_shards_is_refused_and_drop_last_is_no_way_out(four_shards):
    with pytest.raises(ValueError, match="rank 4 of 5 reads no samples.*give every rank a shard") as padded:
        StreamingShards(four_shards, rank=0, world_size=5)
    assert not str(padded.value).endswith("drop_last=True")  # the old advice, which led to an empty epoch
    assert "drop_last=True would not help" in str(padded.value)
    with pytest.raises(ValueError, match=r"^StreamingShards: rank 4 of 5 reads no samples .*so with drop_last=True every rank "
                       r"would stop at its 0 batches: give every rank a shard \(fewer ranks or more shards\)$"):
        StreamingShards(four_shards, rank=0, world_size=5, drop_last=True)
    for drop_last in (False, True):  # the advice: as many ranks as shards
        assert [len(StreamingShards(four_shards, rank=r, world_size=4, drop_last=drop_last)) for r in range(4)] == [2] * 4


def test_a_stream_whose_ranks_have_no_whole_batch_is_refused_and_the_advice_works(four_shards):
    # 2 ranks x 2 workers, a shard of 2 each, batches of 3: drop_last leaves no batch anywhere
    with pytest.raises(ValueError, match=r"drop_last=True stops every rank at the shortest rank's whole batches, and rank 0 of 2 "
                       r"has none: its DataLoader workers read \[2, 2\] samples this epoch, each fewer than batch_size=3.*"
                       r"smaller batch_size or fewer DataLoader workers, or drop_last=False"):
        StreamingShards(four_shards, rank=0, world_size=2, batch_size=3, num_workers=2, drop_last=True)
    for kwargs in ({"batch_size": 2}, {"batch_size": 3, "num_workers": 0}, {"batch_size": 3, "drop_last": False}):
        options = {"batch_size": 3, "num_workers": 2, "drop_last": True, **kwargs}
        assert all(len(StreamingShards(four_shards, rank=r, world_size=2, **options)) > 0 for r in range(2)), kwargs


def test_a_shuffled_epoch_with_no_batch_is_refused_at_set_epoch(tmp_path):
    """Shards of 3, 3 and 1 over 2 ranks: rank 1 reads one shard, so with batches of 2 and
    ``drop_last`` an epoch whose order gives it the 1-sample shard has no batch on any rank."""
    folder = shards(tmp_path / "uneven", 7, 3)
    urls = StreamingShards(folder).urls
    counts = [3, 3, 1]

    def empty(seed: int, epoch: int) -> bool:
        split = ShardPlan(True, seed, 0, 2).split(list(range(3)), epoch)
        return min(sum(counts[i] for i in rank[0]) // 2 for rank in split) == 0

    seed = next(s for s in range(100) if not empty(s, 0))
    bad = next(e for e in range(1, 100) if empty(seed, e))
    good = next(e for e in range(1, 100) if not empty(seed, e))
    stream = StreamingShards(folder, shuffle=True, seed=seed, rank=0, world_size=2, batch_size=2, drop_last=True)
    assert len(urls) == 3 and len(stream) > 0
    whole = list(stream)
    # a resume position in epoch 0 (its one batch is its last: a state after it is epoch 1's, so
    # the position is the start): the refusal keeps it
    stream.load_state_dict(stream.state_dict(0))
    with pytest.raises(ValueError, match=r"rank 1 of 2 has none: its DataLoader workers read \[1\] samples"):
        stream.set_epoch(bad)
    assert stream.epoch == 0 and stream._cursor.position is not None and len(stream) == len(whole)
    assert [label for _, label in stream] == [label for _, label in whole]
    stream.set_epoch(good)
    assert len(stream) > 0


def test_the_shares_rule_refuses_only_epochs_without_a_batch():
    assert rank_shares([[3], [2]], 2, drop_last=True) == [[2], [2]]
    assert rank_shares([[3], [1]], 2) == [[4], [4]]  # rank 1 padded up to rank 0's 2 batches
    with pytest.raises(ValueError, match="rank 1 of 2 reads no samples.*drop_last=True would not help"):
        rank_shares([[3], [0]], 2)
    with pytest.raises(ValueError, match="the shards hold no samples"):
        rank_shares([[0], [0]], 2)
    with pytest.raises(ValueError, match=r"rank 1 of 2 has none: its DataLoader workers read \[1, 1\]"):
        rank_shares([[4, 4], [1, 1]], 2, drop_last=True)


# -- 3. len after a resume ------------------------------------------------------------------------
def resumed(ds, consumed_batches: int = 5) -> tuple[Loader, dict]:
    """A Loader (batches of 4) given the state after ``consumed_batches`` batches of epoch 0."""
    first = Loader(ds, 4, seed=2, threads=1)
    it = iter(first)
    for _ in range(consumed_batches):
        next(it)
    state = first.state_dict()
    first.close()
    loader = Loader(ds, 4, seed=2, threads=1)
    loader.load_state_dict(state)
    return loader, state


def test_len_after_a_resume_is_the_rest_until_that_epoch_is_done():
    ds = tensors(50)  # 13 batches of 4; 5 read, 30 samples (8 batches) left
    loader, state = resumed(ds)
    assert state["samples_consumed"] == 20 and len(Loader(ds, 4)) == 13
    assert len(loader) == 8  # what the next iteration yields
    lens = [len(loader) for _batch in loader]  # during the resumed iteration; from its last batch on, the next one's
    assert lens == [8] * 7 + [13]  # (a counted loop, zip(range(len(loader)), loader), stops there and asks len() again)
    assert len(loader) == 13 == len(list(loader))  # that epoch is done: the next iteration is whole
    loader.set_epoch(1)
    assert len(loader) == 13 == len(list(loader))


def test_len_after_a_resumed_loop_broke_off_is_the_whole_epoch_the_next_loop_reads():
    """A resumed pass broken off is abandoned: the next ``for`` starts the epoch again, whole, and
    len() said the rest (8 of 13), so a counted loop read 8 of the restarted 13 batches and did
    not finish the epoch (a DDP walkthrough). While the iteration is held, it is the rest."""
    ds = tensors(50)
    loader, _ = resumed(ds)
    it = iter(loader)
    next(it)
    assert len(loader) == 8  # under way
    del it  # (a `for` broken off drops its iterator)
    assert len(loader) == 13
    counted = [labels for _, (_images, labels) in zip(range(len(loader)), loader)]
    assert len(counted) == 13 and loader.state_dict()["epoch"] == 1  # the whole epoch 0, then on to epoch 1
    for _batch in loader:
        break
    assert len(loader) == 13


def test_len_after_a_resume_and_set_epoch_to_another_epoch_is_whole():
    loader, _ = resumed(tensors(50))
    loader.set_epoch(0)  # the same epoch: the position is kept
    assert len(loader) == 8
    loader.set_epoch(3)  # another: dropped
    assert len(loader) == 13 == len(list(loader))


def test_len_of_a_resumed_loader_matches_the_sampler_and_its_dataloader():
    ds = tensors(50)
    loader, state = resumed(ds)
    sampler = ResumableSampler(ds, 4, seed=2)
    sampler.load_state_dict(state)
    assert len(sampler) == 30 and len(DataLoader(ds, batch_size=4, sampler=sampler)) == len(loader) == 8
    assert list(sampler) == labels(loader)  # the same rest, in the same order


def test_len_after_a_resume_on_another_world_size():
    ds = tensors(50)
    _, state = resumed(ds)
    for rank in range(3):
        loader = Loader(ds, 3, seed=2, rank=rank, world_size=3)  # steps of 9: 30 left make 4 (the last padded)
        loader.load_state_dict(state)
        assert len(loader) == 4 == len(list(loader))


def test_len_during_a_device_path_iteration(monkeypatch):
    """The device paths (GPU gather, GPU decode) hand their iterations to the same bookkeeping:
    a stand-in for one (no GPU needed) shows ``len`` through a resumed iteration and after it."""
    loader, _ = resumed(tensors(50))

    class StandIn:
        def iterate(self, batches, progress):
            for batch in batches:
                progress.batches += 1
                yield torch.zeros(len(batch), 1, 1, 1, dtype=torch.uint8), torch.as_tensor(batch)

        def close(self):
            pass

    monkeypatch.setattr(loader, "_gather", StandIn())
    assert [len(loader) for _ in loader] == [8] * 7 + [13]  # from the last batch on: the next iteration's, the whole next epoch
    assert len(loader) == 13
    it = iter(loader)  # a whole pass, closed early (as diagnose does): close() is the iteration's own
    assert len(it) == 13  # the batches left, as a filling iteration's (len() of the device path's generator raised)
    next(it)
    assert len(it) == 12
    it.close()
    assert list(it) == [] and len(loader) == 13


# -- 4. bad arguments ------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["data/a.blob", Path("data/a.blob"), b"data/a.blob"])
def test_a_path_instead_of_a_dataset_says_to_open_it(path):
    with pytest.raises(TypeError, match=r"^Loader takes a dataset, not a path: got .*data/a.blob'\)?; open it first, e.g. "
                       r"Loader\(readers.open_dataset\('data/a.blob'\), batch_size\)$"):
        Loader(path, 8)


def test_something_that_is_not_a_map_style_dataset_is_refused(four_shards):
    for thing in (iter(range(3)), 42):
        with pytest.raises(TypeError, match="Loader takes a map-style dataset.*got (range_iterator|int)"):
            Loader(thing, 8)
    with pytest.raises(TypeError, match="got StreamingShards; stream an IterableDataset with a torch DataLoader"):
        Loader(StreamingShards(four_shards), 8)


@pytest.mark.parametrize("seed, error", [(-1, ValueError), (1.5, TypeError), ("3", TypeError), (True, TypeError), (None, TypeError)])
def test_a_bad_seed_is_refused_naming_it(seed, error, four_shards):
    for make in (lambda: Loader(tensors(10), 4, seed=seed), lambda: ResumableSampler(10, 4, seed=seed),
                 lambda: StreamingShards(four_shards, seed=seed)):
        with pytest.raises(error, match="^" + re.escape(f"seed must be an integer >= 0, got {seed!r}") + "$"):
            make()


def test_a_numpy_seed_and_epoch_work_and_states_stay_json():
    loader = Loader(tensors(10), 4, seed=np.int64(3))
    loader.set_epoch(np.int64(2))
    assert (loader.seed, loader.epoch) == (3, 2) and type(loader.seed) is int and type(loader.epoch) is int
    json.dumps(loader.state_dict())


@pytest.mark.parametrize("epoch, error", [(-1, ValueError), (1.5, TypeError), ("2", TypeError), (None, TypeError)])
def test_a_bad_epoch_is_refused_naming_it(epoch, error, four_shards):
    readers = [Loader(tensors(10), 4), ResumableSampler(10, 4), StreamingShards(four_shards)]
    for reader in readers:
        reader.set_epoch(4)
        with pytest.raises(error, match=f"^set_epoch: epoch must be an integer >= 0, got {epoch!r}"):
            reader.set_epoch(epoch)
        assert reader.epoch == 4  # unchanged
    assert len(list(readers[0])) == 3  # and it still reads


@pytest.mark.parametrize("epoch", [-1, 1.5, "0", None])
def test_a_saved_state_with_a_bad_epoch_is_refused(epoch, four_shards):
    for reader in (Loader(tensors(10), 4), ResumableSampler(10, 4)):
        state = {**(reader.state_dict() if isinstance(reader, Loader) else reader.state_dict(0, batch_size=4)), "epoch": epoch}
        with pytest.raises(ResumeError, match=f"^load_state_dict: the state's epoch must be an integer >= 0, got {epoch!r}$"):
            reader.load_state_dict(state)
    stream = StreamingShards(four_shards)
    with pytest.raises(ResumeError, match="the state's epoch must be an integer >= 0"):
        stream.load_state_dict({**stream.state_dict(0), "epoch": epoch})


@pytest.mark.parametrize("consumed", [3.5, "3", None])
def test_a_saved_count_that_is_not_a_count_says_so(consumed):
    loader = Loader(tensors(10), 4)
    with pytest.raises(ResumeError, match=f"samples_consumed={consumed!r} is not a count of samples"):
        loader.load_state_dict({**loader.state_dict(), "samples_consumed": consumed})
    with pytest.raises(ResumeError, match="samples_consumed=11 is outside 0..10"):  # a count, out of range: as before
        loader.load_state_dict({**loader.state_dict(), "samples_consumed": 11})


@pytest.mark.parametrize("batches, error", [("3", TypeError), (1.5, TypeError), (-1, ValueError), (True, TypeError)])
def test_stream_state_dict_checks_its_count(batches, error, four_shards):
    stream = StreamingShards(four_shards, batch_size=2)
    with pytest.raises(error, match="^" + re.escape(f"state_dict: batches must be a count of batches (an int >= 0), got {batches!r}") + "$"):
        stream.state_dict(batches)
    with pytest.raises(error, match="state_dict: batches must be a count of batches"):
        ResumableSampler(10, 2).state_dict(batches)
    with pytest.raises(ValueError, match="batch_size must be a positive integer, got '2'"):
        StreamingShards(four_shards).state_dict(1, batch_size="2")
    assert stream.state_dict(3)["skip"] == [6]


def test_plans_refuse_a_bad_seed_too():
    with pytest.raises(ValueError, match="seed must be an integer >= 0"):
        EpochPlan(10, 2, seed=-5)
    with pytest.raises(TypeError, match="seed must be an integer >= 0"):
        ShardPlan(seed=0.5)


def test_a_dataset_whose_items_are_not_pairs_is_named():
    """A plain dataset giving an image alone, or a triple: one line naming the item (it was
    'too many values to unpack (expected 2)')."""
    import torch

    from readers import Loader

    class Images:
        def __len__(self):
            return 8

        def __getitem__(self, i):
            return torch.zeros(3, 4, 4, dtype=torch.uint8) if self.alone else ((torch.zeros(3, 4, 4, dtype=torch.uint8), i) if i == 0 else (1, 2, 3))

    alone, triple = Images(), Images()
    alone.alone, triple.alone = True, False
    with pytest.raises(TypeError, match=r"^Loader: dataset\[0\] must be an \(image, label\) pair, got a Tensor$"):
        next(iter(Loader(alone, 4)))
    with pytest.raises(TypeError, match=r"^Loader: dataset\[1\] must be an \(image, label\) pair, got a tuple of 3$"):
        next(iter(Loader(triple, 4, shuffle=False)))


def test_resumable_sampler_refuses_a_flag_that_is_a_string():
    """ResumableSampler took bool("false") (True) before its plan could check it, where Loader and
    StreamingShards refuse it (a review): one check, in EpochPlan, for all."""
    with pytest.raises(TypeError, match=r"^shuffle must be True or False, got 'false'$"):
        ResumableSampler(10, batch_size=2, shuffle="false")
    with pytest.raises(TypeError, match=r"^drop_last must be True or False, got 'yes'$"):
        ResumableSampler(10, batch_size=2, drop_last="yes")
    assert ResumableSampler(10, batch_size=2, shuffle=0).shuffle is False


def test_a_numpy_batch_size_is_taken_as_seed_and_set_epoch_are(four_shards):
    """np.int64(8) was refused as 'not a positive integer' where seed and set_epoch took numpy
    integers (a newcomer walkthrough); a numpy bool or float still is not."""
    import numpy as np

    stream = StreamingShards(four_shards, batch_size=np.int64(2))
    assert stream.batch_size == 2 and type(stream.batch_size) is int
    assert EpochPlan(10, np.int32(4)).batch_size == 4 and type(EpochPlan(10, np.int32(4)).batch_size) is int
    for bad in (np.float64(2.0), np.bool_(True), 0):
        with pytest.raises(ValueError, match="batch_size must be a positive integer"):
            EpochPlan(10, bad)


@pytest.mark.parametrize("shuffle", [True, False])
def test_a_streaming_state_given_to_the_map_style_readers_says_so(four_shards, shuffle):
    """A StreamingShards state loaded into Loader or ResumableSampler was 'no samples_consumed
    (nor an older state's batches)', or with another shuffle, advice to change the shuffle (a
    walkthrough)."""
    from readers import ShardDataset

    stream = StreamingShards(four_shards, shuffle=False, batch_size=2, rank=0, world_size=1)
    state = stream.state_dict(1)
    dataset = ShardDataset(four_shards)
    for reader, owner in ((Loader(dataset, 2, shuffle=shuffle), "loader"), (ResumableSampler(dataset, 2, shuffle=shuffle), "sampler")):
        with pytest.raises(ResumeError, match=rf"^load_state_dict: a StreamingShards state \(its 'skip'\), not a {owner} state"):
            reader.load_state_dict(state)


def test_the_sampler_checks_the_dataloaders_batch_size_and_drop_last():
    """A DataLoader batch_size other than the sampler's made the resume skip samples without a
    word (a walkthrough: 20 of 100 never seen); it is checked. Left out, it was not (a migrant's
    walkthrough: 18 skipped): it is required. So is the DataLoader's drop_last refused, which
    left the epoch's short last batch to a resume that read it as the same epoch's."""
    data = TensorDataset(torch.zeros(100, 1, 1, 1, dtype=torch.uint8), torch.arange(100))
    sampler = ResumableSampler(data, 8, shuffle=False, rank=0, world_size=1)
    loader = DataLoader(data, batch_size=4, sampler=sampler)
    taken = [batch for _, batch in zip(range(5), loader)]
    with pytest.raises(ValueError, match=r"^state_dict: the DataLoader's batch_size=4, but this sampler's is 8: give ResumableSampler"):
        sampler.state_dict(len(taken), batch_size=loader.batch_size)
    with pytest.raises(ValueError, match=r"^state_dict: the DataLoader's batch_size=4, but this sampler's is 8"):
        sampler.state_dict(len(taken), loader=loader)
    with pytest.raises(ValueError, match=r"^state_dict: pass the DataLoader, state_dict\(batches, loader=loader\)"):
        sampler.state_dict(len(taken))
    short = ResumableSampler(data, 16, shuffle=False, rank=0, world_size=1)  # 100 = 6 x 16 + 4
    dropping = DataLoader(data, batch_size=16, sampler=short, drop_last=True)
    assert len(list(dropping)) == 6
    with pytest.raises(ValueError, match=r"^state_dict: the DataLoader has drop_last=True, which the sampler cannot see: give "
                                         r"ResumableSampler drop_last=True instead"):
        short.state_dict(6, loader=dropping)
    whole = ResumableSampler(data, 16, shuffle=False, rank=0, world_size=1, drop_last=True)
    assert len(list(DataLoader(data, batch_size=16, sampler=whole))) == 6
    assert whole.state_dict(6, loader=DataLoader(data, batch_size=16, sampler=whole, drop_last=True))["epoch"] == 1  # (moot there)
    right = ResumableSampler(data, 4, shuffle=False, rank=0, world_size=1)
    loader = DataLoader(data, batch_size=4, sampler=right)
    seen = [int(i) for _, batch in zip(range(5), loader) for i in batch[1]]
    state = right.state_dict(5, loader=loader)
    resumed = ResumableSampler(data, 4, shuffle=False, rank=0, world_size=1)
    resumed.load_state_dict(state)
    assert sorted(seen + [int(i) for _, labels in DataLoader(data, batch_size=4, sampler=resumed) for i in labels]) == list(range(100))
