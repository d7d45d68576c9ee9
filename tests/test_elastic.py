"""Elastic, exact resume of reading (issue 17), as properties over the settings before and after.

A job reads part of an epoch with some world size, batch size and thread/worker count, saves
the state, and continues (possibly several times) with other settings: over all ranks, the
samples read are the epoch, each once (plus only the padding of a short last step, or minus
only the dropped tail with ``drop_last``), and the next epoch is an uninterrupted run's.
Checked on the plan alone (many examples), through ``Loader`` (threads) and through
``ResumableSampler`` in a plain ``DataLoader`` (workers).
"""

from __future__ import annotations

import collections
import json
from types import SimpleNamespace

import pytest
import torch
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from readers import Loader, ResumableSampler, ResumeError
from readers.epoch import EpochPlan

SEED = 7


def segment():
    """One run of the job: its world size, batch size, threads or workers, and where it stops
    (a fraction of the steps it has left; the last run always reads to the end)."""
    return st.tuples(st.integers(1, 4), st.integers(1, 6), st.integers(1, 2), st.floats(0, 1))


def check_epoch(seen: list[int], order: list[int], last: tuple[int, int, int], drop_last: bool) -> None:
    """``seen`` (every rank of every run) is the epoch, each sample once, apart from the padding
    (repeats of the epoch's first samples) or the dropped tail of ``last``: the run (its start,
    world size and batch size) that read the epoch's last step."""
    n, (start, world, batch) = len(order), last
    rest = n - start
    counts = collections.Counter(seen)
    if drop_last:
        kept = n - rest % (world * batch)
        assert sorted(seen) == sorted(order[:kept])  # nothing twice, only the tail short of a step missing
    else:
        assert set(seen) == set(order)  # everything
        extra = counts - collections.Counter(order)
        assert sum(extra.values()) == -rest % world  # padding of the last step only, at most world - 1
        assert set(extra) <= set(order[: world - 1])


def finisher(last, start: int, world: int, batch: int, k: int, n: int):
    """The run that read the epoch's last step so far: this one if it read anything or is not past the end."""
    return (start, world, batch) if k > 0 or start < n or last is None else last


def plan_runs(n: int, runs, drop_last: bool, shuffle: bool, epoch: int = 3):
    """Read ``epoch`` through ``runs`` on the plan alone; returns (seen, the run that finished it)."""
    state: dict | None = None
    seen: list[int] = []
    last = None
    for j, (world, batch, _threads, stop) in enumerate(runs):
        group = [EpochPlan(n, batch, shuffle, SEED, drop_last, r, world) for r in range(world)]
        start = 0 if state is None else state["samples_consumed"]
        steps = group[0].steps(start)
        k = steps if j == len(runs) - 1 else int(stop * steps)
        seen += [int(i) for p in group for b in p.batches(epoch, start)[:k] for i in b]
        state = json.loads(json.dumps({"samples_consumed": group[0].position(start, k)}))
        last = finisher(last, start, world, batch, k, n)
    return seen, last


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 70), st.lists(segment(), min_size=1, max_size=4), st.booleans(), st.booleans())
def test_plan_any_settings_before_and_after_read_the_epoch_once(n, runs, drop_last, shuffle):
    seen, last = plan_runs(n, runs, drop_last, shuffle)
    order = EpochPlan(n, 1, shuffle, SEED).order(3).tolist()
    check_epoch(seen, order, last, drop_last)


def labels_of(batches) -> list[int]:
    return [int(i) for _images, labels in batches for i in labels]


def tensors(n: int) -> TensorDataset:
    return TensorDataset(torch.zeros(n, 1, 1, 1, dtype=torch.uint8), torch.arange(n))


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 40), st.lists(segment(), min_size=1, max_size=3), st.booleans())
@example(1, [(1, 1, 1, 1.0), (1, 1, 1, 0.0)], True)  # a run reads the whole epoch, the next resumes from its state
def test_loader_any_settings_before_and_after_read_the_epoch_once(n, runs, drop_last):
    """Through real Loaders (threads fill the batches); the labels are the indices."""
    assume(all(len(EpochPlan(n, batch, True, SEED, drop_last, 0, world)) for world, batch, _, _ in runs))  # else refused
    ds, epoch = tensors(n), 2
    state: dict | None = None
    seen: list[int] = []
    last = None
    for j, (world, batch, threads, stop) in enumerate(runs):
        if state is not None and state["epoch"] != epoch:  # saved at the epoch's last step: it says the next one
            assert state["epoch"] == epoch + 1 and state["samples_consumed"] == 0
            break
        loaders = [Loader(ds, batch, seed=SEED, drop_last=drop_last, rank=r, world_size=world, threads=threads) for r in range(world)]
        for loader in loaders:
            loader.set_epoch(epoch)
            if state is not None:
                loader.load_state_dict(state)
        start = 0 if state is None else state["samples_consumed"]
        steps = loaders[0].plan.steps(start)
        k = steps if j == len(runs) - 1 else int(stop * steps)
        states = []
        for loader in loaders:
            it = iter(loader)
            seen += labels_of(next(it) for _ in range(k))
            states.append(json.loads(json.dumps(loader.state_dict())))
            loader.close()
        assert all(s == states[0] for s in states)  # rank-independent: any rank's state will do
        state = states[0]
        last = finisher(last, start, world, batch, k, n)
    order = EpochPlan(n, 1, True, SEED).order(epoch).tolist()
    check_epoch(seen, order, last, drop_last)
    # the next epoch is an uninterrupted run's with the last settings
    world, batch, threads, _ = runs[-1]
    resumed = Loader(ds, batch, seed=SEED, drop_last=drop_last, rank=world - 1, world_size=world, threads=threads)
    resumed.load_state_dict(state)
    fresh = Loader(ds, batch, seed=SEED, drop_last=drop_last, rank=world - 1, world_size=world)
    resumed.set_epoch(epoch + 1), fresh.set_epoch(epoch + 1)
    assert labels_of(resumed) == labels_of(fresh)


@settings(max_examples=8, deadline=None)
@given(st.integers(1, 30), st.lists(st.tuples(st.integers(1, 3), st.integers(1, 5), st.sampled_from([0, 2]), st.floats(0, 1)), min_size=2, max_size=2), st.booleans())
def test_sampler_in_a_dataloader_with_workers_resumes_elastically(n, runs, drop_last):
    """``ResumableSampler`` in plain DataLoaders with 0 or 2 worker processes, stopped and resumed."""
    assume(all(len(EpochPlan(n, batch, True, SEED, drop_last, 0, world)) for world, batch, _, _ in runs))  # else refused
    ds, epoch = tensors(n), 1
    state: dict | None = None
    seen: list[int] = []
    last = None
    for j, (world, batch, workers, stop) in enumerate(runs):
        if state is not None and state["epoch"] != epoch:  # saved at the epoch's last step: it says the next one, as the Loader's
            assert state["epoch"] == epoch + 1 and state["samples_consumed"] == 0
            break
        samplers = [ResumableSampler(ds, batch, seed=SEED, drop_last=drop_last, rank=r, world_size=world) for r in range(world)]
        start = 0 if state is None else state["samples_consumed"]
        k = None
        states = []
        for sampler in samplers:
            sampler.set_epoch(epoch)
            if state is not None:
                sampler.load_state_dict(state)
            loader = DataLoader(ds, batch_size=batch, sampler=sampler, num_workers=workers)
            k = len(loader) if j == len(runs) - 1 else int(stop * len(loader))
            it = iter(loader)
            seen += labels_of(next(it) for _ in range(k))
            del it
            states.append(json.loads(json.dumps(sampler.state_dict(k, loader=loader))))
        assert all(s == states[0] for s in states)
        state = states[0]
        last = finisher(last, start, world, batch, k, n)
    order = EpochPlan(n, 1, True, SEED).order(epoch).tolist()
    check_epoch(seen, order, last, drop_last)


# -- the sampler: a DistributedSampler replacement, the Loader's plan ------------------------
@pytest.mark.parametrize("n, world", [(17, 3), (18, 2), (5, 8)])
def test_unshuffled_sampler_is_distributed_samplers_split(n, world):
    for rank in range(world):
        ours = ResumableSampler(n, 4, shuffle=False, rank=rank, world_size=world)
        theirs = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=False)
        assert list(ours) == list(theirs) and len(ours) == len(theirs)
        assert (ours.rank, ours.num_replicas) == (rank, world)


def test_sampler_yields_the_loaders_batches_and_their_states_are_interchangeable():
    ds = tensors(23)
    loader = Loader(ds, 4, seed=3, rank=1, world_size=2, threads=1)
    sampler = ResumableSampler(ds, 4, seed=3, rank=1, world_size=2)
    loader.set_epoch(5), sampler.set_epoch(5)
    assert list(sampler) == labels_of(loader)
    it = iter(DataLoader(ds, batch_size=4, sampler=sampler))
    head = labels_of([next(it), next(it)])
    state = sampler.state_dict(2, batch_size=4)
    assert state["samples_consumed"] == 16 and state["epoch"] == 5
    other = Loader(ds, 3, seed=3, threads=2)  # one rank, another batch size
    other.load_state_dict(state)
    rest = labels_of(other)
    whole = EpochPlan(23, 1, seed=3).order(5).tolist()
    assert sorted(head) == sorted(whole[1:16:2]) and rest == whole[16:]


def test_sampler_state_before_an_iteration_and_bad_counts():
    sampler = ResumableSampler(10, 2, seed=1)
    assert sampler.state_dict(0, batch_size=2)["samples_consumed"] == 0
    with pytest.raises(ValueError, match="no iteration of epoch 0 has started"):
        sampler.state_dict(1, batch_size=2)
    list(sampler)
    with pytest.raises(ValueError, match="batches=6 is more than the 5 batches"):
        sampler.state_dict(6, batch_size=2)
    with pytest.raises(ValueError, match="batches must be a count"):
        sampler.state_dict(-1, batch_size=2)
    assert {k: sampler.state_dict(5, batch_size=2)[k] for k in ("epoch", "samples_consumed")} == {"epoch": 1, "samples_consumed": 0}  # as Loader's
    sampler.load_state_dict(sampler.state_dict(2, batch_size=2))
    assert len(sampler) == 6 and sampler.state_dict(0, batch_size=2)["samples_consumed"] == 4  # loaded, not yet iterated
    sampler.set_epoch(1)  # another epoch: the position is dropped
    assert len(sampler) == 10
    with pytest.raises(TypeError, match="sized dataset or its length"):
        ResumableSampler(iter(range(3)), 2)


def test_sampler_and_loader_states_after_an_epochs_last_batch_are_the_same():
    """A checkpoint at an epoch's last step resumes with the next epoch, from either; the
    sampler's said the epoch was whole instead, and a loop starting at its epoch ran it again."""
    data = TensorDataset(torch.zeros(61, 1, 1, 1, dtype=torch.uint8), torch.arange(61))
    sampler = ResumableSampler(data, 4, seed=3, rank=0, world_size=2)
    batches = len(list(DataLoader(data, batch_size=4, sampler=sampler)))
    loader = Loader(data, 4, seed=3, rank=0, world_size=2)
    for _ in loader:
        pass
    assert sampler.state_dict(batches, batch_size=4) == loader.state_dict()
    assert sampler.state_dict(batches, batch_size=4)["epoch"] == 1 and sampler.state_dict(batches, batch_size=4)["samples_consumed"] == 0


def test_an_iterable_dataset_is_refused_by_the_sampler():
    class Stream(torch.utils.data.IterableDataset):
        def __len__(self):
            return 36

        def __iter__(self):
            return iter(range(36))

    with pytest.raises(TypeError, match="Stream is an IterableDataset, which splits itself"):
        ResumableSampler(Stream(), 4)


# -- refusals --------------------------------------------------------------------------------
class Packed(TensorDataset):
    """A dataset with packer-like metadata (``source``, ``created``)."""

    def __init__(self, n: int, source: str, created: str) -> None:
        super().__init__(torch.zeros(n, 1, 1, 1, dtype=torch.uint8), torch.arange(n))
        self.meta = SimpleNamespace(source=source, created=created)


def test_a_state_of_another_dataset_is_refused_naming_what_differs():
    state = Loader(Packed(12, "/src/a", "2026-01-01"), 4).state_dict()
    assert state["dataset"] == {"samples": 12, "source": "/src/a", "created": "2026-01-01"}
    Loader(Packed(12, "/src/a", "2026-01-01"), 3, world_size=2, rank=1).load_state_dict(state)
    ResumableSampler(Packed(12, "/src/a", "2026-01-01"), 3).load_state_dict(state)
    with pytest.raises(ResumeError, match="another dataset: it was saved over samples=12, this loader reads samples=13"):
        Loader(Packed(13, "/src/a", "2026-01-01"), 4).load_state_dict(state)
    with pytest.raises(ResumeError, match="saved over source='/src/a', this sampler reads source='/src/b'"):
        ResumableSampler(Packed(12, "/src/b", "2026-01-01"), 4).load_state_dict(state)
    with pytest.raises(ResumeError, match="saved over created='2026-01-01', this loader reads created='2026-02-02'"):
        Loader(Packed(12, "/src/a", "2026-02-02"), 4).load_state_dict(state)
    with pytest.raises(ResumeError, match="saved with seed=0, this loader has seed=1"):
        Loader(Packed(12, "/src/a", "2026-01-01"), 4, seed=1).load_state_dict(state)


def test_a_state_continues_over_the_same_samples_converted_again_and_not_over_others(image_folder, tmp_path):
    """A state named its dataset by the conversion's 'created' time: the same source converted
    again (on each node's own disk, or to another format) refused it (a migrant's walkthrough).
    The fingerprint is now the digest of the samples' checksums: the same samples, labels and
    order continue; other samples (another --size) are refused naming it."""
    from packer import ImageOptions, convert
    from readers import open_dataset

    paths = {}
    for name, size in [("a.blob", 16), ("b.lmdb", 16), ("c.blob", 24)]:
        paths[name] = convert(image_folder, tmp_path / name, image=ImageOptions(size=size), workers=1).dst
    first = Loader(open_dataset(paths["a.blob"]), 4, shuffle=True, seed=3)
    batches = iter(first)
    seen = [int(i) for _ in range(2) for i in next(batches)[1]]
    state = first.state_dict()
    assert set(state["dataset"]) == {"samples", "checksums_sha256"}
    again = Loader(open_dataset(paths["b.lmdb"]), 4, shuffle=True, seed=3)
    again.load_state_dict(state)
    rest = [int(i) for _, labels in again for i in labels]
    assert sorted(seen + rest) == sorted(int(label) for _, label in open_dataset(paths["a.blob"]))  # the epoch's labels, once
    with pytest.raises(ResumeError, match="another dataset: it was saved over checksums_sha256='[0-9a-f]{64}', this loader reads"):
        Loader(open_dataset(paths["c.blob"]), 4, shuffle=True, seed=3).load_state_dict(state)


def test_a_loader_state_of_the_old_format_loads_exactly():
    """A state saved by the Loader before the global plan (``batches`` per rank): same world size
    or not, the rest is exactly the samples the old run had not read."""
    ds = tensors(18)
    old_run = [Loader(ds, 2, seed=4, rank=r, world_size=2) for r in range(2)]
    head = []
    for loader in old_run:
        it = iter(loader)
        head += labels_of([next(it), next(it)])
    old = {"epoch": 0, "batches": 2, "seed": 4, "shuffle": True, "drop_last": False, "batch_size": 2, "rank": 0,
           "world_size": 2, "length": 18}
    for world in (2, 5):  # 10 left: no padding
        rest = []
        for r in range(world):
            loader = Loader(ds, 2, seed=4, rank=r, world_size=world)
            loader.load_state_dict(old)
            rest += labels_of(loader)
        assert sorted(head + rest) == list(range(18))
    with pytest.raises(ResumeError, match="no 'samples_consumed'"):
        Loader(ds, 2, seed=4).load_state_dict({"epoch": 0, "seed": 4, "batches": 2})


def test_a_state_saved_with_another_shuffle_is_refused():
    """Only a seed mismatch was tested through load_state_dict (a mutation sweep)."""
    state = Loader(tensors(12), 4, shuffle=True).state_dict()
    for reader, owner in ((Loader(tensors(12), 4, shuffle=False), "loader"), (ResumableSampler(tensors(12), 4, shuffle=False), "sampler")):
        with pytest.raises(ResumeError, match=f"saved with shuffle=True, this {owner} has shuffle=False"):
            reader.load_state_dict(state)
