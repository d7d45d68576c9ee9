"""StreamingShards gives every rank the same number of batches per epoch (padded, or truncated
with ``drop_last``), over ranks, DataLoader workers, batch sizes and shuffle buffers, and a
resumed epoch yields exactly the rest of the padded one.

Ranks read whole shards, so the shards' sizes decide their natural counts: 18 samples in shards
of 2 (9 shards), 5 (5, 5, 5, 3) and 7 (7, 7, 4). Most checks run the DataLoader's workers in this
process (``run``: each worker's stream cut into batches, taken in the DataLoader's in-order round
robin); ``test_the_in_process_workers_match_a_real_dataloader`` checks that against torch.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

import readers.webdataset as webdataset_module
from packer import ImageOptions, StorageOptions, convert
from readers import ResumeError, ShardDataset, StreamingShards
from readers.shard_plan import equal_batches

SIZES = (2, 5, 7)


@pytest.fixture(scope="module")
def folders(image_folder, tmp_path_factory) -> dict[int, Path]:
    base = tmp_path_factory.mktemp("equal")
    for size in SIZES:
        convert(image_folder, base / f"s{size}", format="webdataset", image=ImageOptions(size=16),
                storage=StorageOptions(shard_size=size), workers=1)
    return {size: base / f"s{size}" for size in SIZES}


@pytest.fixture(scope="module")
def table(folders) -> dict[bytes, int]:
    ds = ShardDataset(folders[2])
    return {ds[i][0].numpy().tobytes(): i for i in range(len(ds))}


def run(stream: StreamingShards, table, batch_size: int | None, num_workers: int) -> list[list[int]]:
    """The batches (sample ids) ``DataLoader(stream, batch_size, num_workers)`` yields, its workers run here."""
    size, parts = batch_size or 1, []
    for w in range(max(1, num_workers)):
        info = SimpleNamespace(id=w, num_workers=num_workers) if num_workers else None
        with mock.patch.object(webdataset_module, "get_worker_info", return_value=info):
            ids = [table[x.numpy().tobytes()] for x, _ in stream]
        parts.append([ids[i : i + size] for i in range(0, len(ids), size)])
    out = []
    while any(parts):  # in-order round robin, an exhausted worker skipped
        out += [part.pop(0) for part in parts if part]
    return out


def natural_counts(stream: StreamingShards, num_workers: int) -> list[int]:
    """Samples of the shards each worker of this rank reads (the metadata's per-shard counts)."""
    counts = dict(zip(stream.meta.extra["shards"], stream.meta.extra["shard_counts"]))
    workers = max(1, num_workers)
    return [sum(counts[Path(url).name] for url in stream.shards_for(w, workers)) for w in range(workers)]


@settings(max_examples=40, deadline=None)
@given(
    size=st.sampled_from(SIZES),
    world_size=st.integers(1, 3),
    num_workers=st.sampled_from([0, 2, 3]),
    batch_size=st.sampled_from([None, 1, 2, 4]),
    drop_last=st.booleans(),
    shuffle=st.booleans(),
    buffer=st.sampled_from([1, 3, 100]),
    epoch=st.integers(0, 3),
)
# epoch 0 has no batch on rank 1 (refused at construction), epoch 3 has one: found by a full-suite run
@example(size=5, world_size=3, num_workers=0, batch_size=4, drop_last=True, shuffle=True, buffer=1, epoch=3)
def test_every_rank_yields_the_same_number_of_batches(folders, table, size, world_size, num_workers, batch_size,
                                                      drop_last, shuffle, buffer, epoch):
    def make(rank: int, drop_last: bool, at: int = epoch) -> StreamingShards:
        stream = StreamingShards(folders[size], shuffle=shuffle, buffer=buffer, seed=3, rank=rank, world_size=world_size,
                                 batch_size=batch_size, drop_last=drop_last, num_workers=num_workers)
        stream.set_epoch(at)
        return stream

    b = batch_size or 1

    def without_a_batch(at: int) -> bool:
        return min(sum(c // b for c in natural_counts(make(r, False, at), num_workers if batch_size else 0)) for r in range(world_size)) == 0

    # an epoch without a batch is refused: epoch 0 at construction, this one at set_epoch
    if drop_last and (without_a_batch(0) or without_a_batch(epoch)):
        with pytest.raises(ValueError, match="every rank would get no batch"):
            make(0, True)
        return
    ranks, naturals = [], []
    for rank in range(world_size):
        stream = make(rank, drop_last)
        batches = run(stream, table, batch_size, num_workers)
        assert len(DataLoader(stream, batch_size=batch_size, num_workers=num_workers)) == len(batches)
        assert len(stream) == sum(map(len, batches)) and {len(b) for b in batches} <= {batch_size or 1}  # all full
        ranks.append(batches)
        naturals.append(natural_counts(stream, num_workers if batch_size else 0))
    steps = {len(batches) for batches in ranks}
    assert len(steps) == 1, f"ranks yield {[len(b) for b in ranks]} batches"
    if drop_last:  # the shortest rank's whole batches; nothing twice
        assert steps == {min(sum(c // b for c in n) for n in naturals)}
        seen = [i for batches in ranks for batch in batches for i in batch]
        assert len(seen) == len(set(seen))
    else:  # the longest rank's batches (each worker rounded up); every sample, repeats only of a rank's own
        assert steps == {max(sum(math.ceil(c / b) for c in n) for n in naturals)}
        sets = [{i for batch in batches for i in batch} for batches in ranks]
        assert set().union(*sets) == set(range(18)) and sum(map(len, sets)) == 18


@settings(max_examples=30, deadline=None)
@given(
    size=st.sampled_from(SIZES),
    rank=st.integers(0, 1),
    num_workers=st.sampled_from([0, 2]),
    batch_size=st.sampled_from([None, 2, 3]),
    drop_last=st.booleans(),
    shuffle=st.booleans(),
    stop=st.floats(0, 1),
)
def test_a_resumed_epoch_yields_the_rest_of_the_padded_epoch_exactly(folders, table, size, rank, num_workers, batch_size,
                                                                     drop_last, shuffle, stop):
    def make() -> StreamingShards:
        stream = StreamingShards(folders[size], shuffle=shuffle, buffer=3, seed=8, rank=rank, world_size=2,
                                 batch_size=batch_size, drop_last=drop_last, num_workers=num_workers)
        stream.set_epoch(1)
        return stream

    whole = run(make(), table, batch_size, num_workers)
    k = round(stop * len(whole))
    state = json.loads(json.dumps(make().state_dict(k)))
    resumed = make()
    resumed.load_state_dict(state)
    rest = run(resumed, table, batch_size, num_workers)
    if k == len(whole) and k:  # saved at the epoch's last batch: the next epoch, whole (as Loader.state_dict says)
        assert (state["epoch"], set(state["skip"])) == (2, {0})
        following = make()
        following.set_epoch(2)
        assert rest == run(following, table, batch_size, num_workers)
    else:
        assert whole[:k] + rest == whole
    assert len(resumed) == sum(len(batch) for batch in rest)  # the rest, as len(DataLoader) needs (it said the whole epoch)
    assert run(resumed, table, batch_size, num_workers) == rest  # every iteration of the epoch: the workers cannot clear it
    resumed.set_epoch(2)  # the next epoch is whole again
    again = make()
    again.set_epoch(2)
    assert run(resumed, table, batch_size, num_workers) == run(again, table, batch_size, num_workers)


@pytest.mark.parametrize("drop_last", [False, True])
def test_the_in_process_workers_match_a_real_dataloader(folders, table, drop_last):
    """Shards of 5, 5, 5, 3 over 2 ranks, a shard per worker, batches of 2: the rank with the
    3 is padded from 5 to 6 batches, or the other truncated from 4 to 3; a real DataLoader,
    then resumed."""
    def make(rank: int) -> StreamingShards:
        return StreamingShards(folders[5], shuffle=True, buffer=3, seed=1, rank=rank, world_size=2,
                               batch_size=2, drop_last=drop_last, num_workers=2)

    for rank in range(2):
        loader = DataLoader(make(rank), batch_size=2, num_workers=2)
        got = [[table[x.numpy().tobytes()] for x in images] for images, _ in loader]
        assert got == run(make(rank), table, 2, 2) and len(got) == len(loader) == (3 if drop_last else 6)
    stream = make(1)
    stream.load_state_dict(json.loads(json.dumps(make(1).state_dict(2))))
    tail = [[table[x.numpy().tobytes()] for x in images] for images, _ in DataLoader(stream, batch_size=2, num_workers=2)]
    assert tail == got[2:]


def test_a_state_of_another_worker_count_is_refused_when_loaded(folders):
    """A state saved with 2 DataLoader workers, loaded where the constructor names 1 (or none): refused
    at load_state_dict in one line naming both, as another world_size is, where it was accepted and
    refused only inside a worker once the DataLoader ran (a walkthrough); the position stays as it was."""
    state = json.loads(json.dumps(StreamingShards(folders[5], shuffle=True, seed=1, batch_size=2, num_workers=2).state_dict(2)))
    for workers in (1, 0):
        stream = StreamingShards(folders[5], shuffle=True, seed=1, batch_size=2, num_workers=workers)
        whole = len(stream)
        with pytest.raises(ResumeError, match=rf"saved with num_workers=2, this StreamingShards has num_workers={workers}: .*map-style"):
            stream.load_state_dict(state)
        assert len(stream) == whole and stream.state_dict(0)["skip"] == [0]


@given(
    counts=st.lists(st.lists(st.integers(0, 12), min_size=1, max_size=4), min_size=1, max_size=5).filter(
        lambda c: len({len(r) for r in c}) == 1),
    batch_size=st.integers(1, 5),
    drop_last=st.booleans(),
)
def test_equal_batches_rule(counts, batch_size, drop_last):
    """The rule on its own: equal whole batches per rank; pads only workers with samples, by
    whole batches; truncation keeps the first batches of the DataLoader's round robin."""
    if not drop_last and any(sum(r) == 0 for r in counts) and any(sum(r) for r in counts):
        with pytest.raises(ValueError, match="reads no samples.*drop_last=True"):
            equal_batches(counts, batch_size, drop_last)
        return
    out = equal_batches(counts, batch_size, drop_last)
    assert all(n % batch_size == 0 for rank in out for n in rank)
    assert len({sum(rank) for rank in out}) == 1
    for natural, share in zip(counts, out):
        if drop_last:
            whole, taken, left = [c // batch_size for c in natural], [0] * len(natural), sum(share) // batch_size
            while left:  # the round robin, one batch at a time
                for w in range(len(natural)):
                    if left and taken[w] < whole[w]:
                        taken[w], left = taken[w] + 1, left - 1
            assert share == [batch_size * t for t in taken]
        else:
            rounded = [batch_size * math.ceil(c / batch_size) for c in natural]
            assert all(s >= r and (s == r or c > 0) for s, r, c in zip(share, rounded, natural))


def test_settings_that_cannot_be_kept_are_refused(folders, small_shards_without_meta):
    with pytest.raises(ValueError, match="rank 3 of 4 reads no samples.*drop_last=True"):
        StreamingShards(folders[7], rank=0, world_size=4)  # 3 shards
    with pytest.raises(ValueError, match="rank 3 of 4 reads no samples.*give every rank a shard"):  # drop_last: no way out
        StreamingShards(folders[7], rank=0, world_size=4, drop_last=True)
    stream = StreamingShards(folders[5], batch_size=2, num_workers=2)
    with pytest.raises(ValueError, match="computed for num_workers=2, this DataLoader has 0 workers"):
        list(DataLoader(stream, batch_size=2))
    with pytest.raises(ValueError, match="batch_size=3.*equalises batches of batch_size=2"):
        stream.state_dict(1, batch_size=3)
    with pytest.raises(ValueError, match="no packer metadata"):
        StreamingShards(small_shards_without_meta, batch_size=2)
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        StreamingShards(folders[5], batch_size=0)


@pytest.fixture
def small_shards_without_meta(folders, tmp_path) -> list[str]:
    """Two shards copied without the metadata beside them."""
    import shutil

    for name in ("shard-000000.tar", "shard-000001.tar"):
        shutil.copy(folders[5] / name, tmp_path / name)
    return [str(tmp_path / "shard-000000.tar"), str(tmp_path / "shard-000001.tar")]


@pytest.mark.parametrize("shuffle", [False, True])
def test_the_split_of_every_rank_is_what_each_rank_reads(shuffle):
    """``ShardPlan.split`` (every rank's shares at once, one shuffle) agrees with each rank's ``shards``."""
    from readers.shard_plan import ShardPlan

    items = [f"shard-{i}" for i in range(11)]
    for world_size, num_workers, epoch in [(1, 1, 0), (2, 3, 1), (3, 2, 2), (4, 1, 5)]:
        split = ShardPlan(shuffle, 5, 0, world_size).split(items, epoch, num_workers)
        assert split == [[ShardPlan(shuffle, 5, r, world_size).shards(items, epoch, w, num_workers) for w in range(num_workers)]
                         for r in range(world_size)]
        assert sorted(s for rank in split for part in rank for s in part) == sorted(items)


@settings(max_examples=20, deadline=None)
@given(size=st.sampled_from(SIZES), num_workers=st.sampled_from([0, 2]), batch_size=st.sampled_from([1, 2, 4]),
       drop_last=st.booleans(), shuffle=st.booleans(), stop=st.floats(0, 1))
def test_one_ranks_state_resumes_every_rank_with_equal_batches(folders, table, size, num_workers, batch_size, drop_last, shuffle, stop):
    """Rank 0 saves (the usual DDP checkpoint); every rank loads it and yields the rest of its
    own epoch: equal batches keep the ranks in step. It was refused on every rank but 0 (a
    Streaming user's walkthrough)."""
    def make(rank: int) -> StreamingShards:
        stream = StreamingShards(folders[size], shuffle=shuffle, buffer=3, seed=8, rank=rank, world_size=3,
                                 batch_size=batch_size, drop_last=drop_last, num_workers=num_workers)
        stream.set_epoch(1)
        return stream

    try:
        wholes = [run(make(rank), table, batch_size, num_workers) for rank in range(3)]
    except ValueError:  # an epoch with no batch on some rank: refused at construction (tested above)
        assume(False)
    assert len({len(whole) for whole in wholes}) == 1
    k = round(stop * len(wholes[0]))
    state = json.loads(json.dumps(make(0).state_dict(k)))
    for rank, whole in enumerate(wholes):
        resumed = make(rank)
        resumed.load_state_dict(state)
        if k == len(whole) and k:  # saved at the epoch's last batch: every rank goes on with the next epoch, whole
            following = make(rank)
            following.set_epoch(2)
            assert run(resumed, table, batch_size, num_workers) == run(following, table, batch_size, num_workers), rank
        else:
            assert whole[:k] + run(resumed, table, batch_size, num_workers) == whole, rank


def test_without_batch_size_another_ranks_state_is_refused_saying_why(folders):
    state = StreamingShards(folders[2], rank=0, world_size=2).state_dict(3)
    with pytest.raises(ResumeError, match=r"saved by rank 0, this StreamingShards is rank 1; without batch_size, ranks are not in step"):
        StreamingShards(folders[2], rank=1, world_size=2).load_state_dict(state)
    old = StreamingShards(folders[2], rank=0, world_size=2, batch_size=2).state_dict(1)
    del old["batches"]  # a state saved before states recorded their batch count
    with pytest.raises(ResumeError, match=r"by a packer that did not record its batch count: resume each rank from its own state"):
        StreamingShards(folders[2], rank=1, world_size=2, batch_size=2).load_state_dict(old)


@pytest.mark.parametrize("option, value", [("buffer", 2.5), ("buffer", 0), ("shuffle", "false"), ("drop_last", "yes")])
def test_streaming_options_of_the_wrong_kind_are_refused(folders, option, value):
    """buffer=2.5 was kept as 2.5 and shuffle="false" shuffled (a walkthrough): one line naming the option."""
    with pytest.raises((TypeError, ValueError), match=rf"^{option} must be .*, got {value!r}$"):
        StreamingShards(folders[5], batch_size=2, **{option: value})


def test_few_shards_per_stream_warn_how_much_an_epoch_repeats(folders, recwarn):
    """Shards of 5, 5, 5, 3 over 2 ranks x 2 workers, batches of 2: each stream one shard, padded
    to 6 samples: 24 yielded for 18 (a walkthrough found +18% to +36% with no word): rank 0 warns,
    naming the share and what to do; one stream over every shard does not."""
    import warnings

    with pytest.warns(UserWarning, match=r"4 shards over 4 streams \(2 ranks x 2 DataLoader workers\): .* 6 repeated of 18 samples "
                                         r"\(33%; split by sample, 2\); use about 10 shards per stream"):
        StreamingShards(folders[5], batch_size=2, num_workers=2, rank=0, world_size=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        StreamingShards(folders[5], batch_size=2, num_workers=2, rank=1, world_size=2)  # rank 0 says it
        StreamingShards(folders[5], batch_size=2)
        StreamingShards(folders[5], batch_size=8, drop_last=True)  # 16 of 18: whole batches cost it whatever the shards (a review)
    with pytest.warns(UserWarning, match=r"^StreamingShards: 1 stream \(1 rank x 1 DataLoader worker\) yields whole batches of 8, "
                                         r"which leave epoch 0 with 6 repeated of 18 samples \(33%\) however the 4 shards are split; "
                                         r"use a smaller batch_size"):
        StreamingShards(folders[5], batch_size=8)  # 24 for 18: the same whatever the shards, but repeats (a migrant's walkthrough)
    # split by sample, each of 6 streams would hold 3 < batch_size: the comparison must not refuse what the shards allow
    StreamingShards(folders[2], batch_size=4, drop_last=True, num_workers=3, rank=0, world_size=2)


def test_persistent_workers_follow_set_epoch_and_a_state_saved_then_resumes_exactly(folders, table):
    """The epoch lives in shared memory: a persistent DataLoader worker's copy follows set_epoch
    (it kept epoch 0's order, while state_dict said epoch 1, so a resume from such a state skipped
    and repeated samples: a DDP walkthrough saw 22 of 97 missing and 29 repeated)."""
    def make() -> StreamingShards:
        return StreamingShards(folders[2], shuffle=True, buffer=4, seed=5, rank=0, world_size=2, batch_size=2, num_workers=2)

    def ids(batches) -> list[list[int]]:
        return [[table[x.numpy().tobytes()] for x in images] for images, _ in batches]

    expected = []
    for epoch in (0, 1, 2):
        fresh = make()
        fresh.set_epoch(epoch)
        expected.append(ids(DataLoader(fresh, batch_size=2, num_workers=2)))
    assert expected[0] != expected[1] != expected[2]
    stream = make()
    loader = DataLoader(stream, batch_size=2, num_workers=2, persistent_workers=True)
    assert ids(loader) == expected[0]
    stream.set_epoch(1)
    assert ids(loader) == expected[1]
    stream.set_epoch(2)
    it = iter(loader)
    head = ids(next(it) for _ in range(2))
    state = json.loads(json.dumps(stream.state_dict(2)))
    del it
    resumed = make()
    resumed.load_state_dict(state)
    assert state["epoch"] == 2 and head + ids(DataLoader(resumed, batch_size=2, num_workers=2)) == expected[2]
    # a state loaded into the stream whose persistent workers are running: they resume from it too (only the
    # epoch was shared, and they read the whole epoch again: a review)
    stream.load_state_dict(state)
    assert ids(loader) == expected[2][2:]


def test_without_batch_size_rank_zero_warns_when_several_workers_may_unbalance_the_ranks(folders, table):
    """The ranks' sample counts are equal, their batch counts over several workers not always:
    DDP waited forever at an epoch's end, silently (a DDP walkthrough)."""
    with pytest.warns(UserWarning, match="without batch_size, ranks yield the same number of samples"):
        run(StreamingShards(folders[5], shuffle=True, seed=2, rank=0, world_size=2), table, 2, 2)
    import warnings

    quiet = [
        (StreamingShards(folders[5], shuffle=True, seed=2, rank=0, world_size=2, batch_size=2, num_workers=2), 2),
        (StreamingShards(folders[5], shuffle=True, seed=2, rank=1, world_size=2), 2),  # rank 0 says it
        (StreamingShards(folders[5], shuffle=True, seed=2, rank=0, world_size=2), 1),  # one worker: equal
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for stream, workers in quiet:
            run(stream, table, 2, workers)


def test_a_copied_or_unpickled_stream_shares_its_cursor_again(folders):
    """copy.deepcopy and plain pickle brought the shared tensor back private, so persistent
    forked workers of the copy kept its first epoch (a review)."""
    import copy
    import pickle

    stream = StreamingShards(folders[5], shuffle=True, seed=1, batch_size=2, num_workers=2)
    for twin in (copy.deepcopy(stream), pickle.loads(pickle.dumps(stream))):
        assert twin._shared.tensor.is_shared()


def test_a_whole_shard_split_better_than_by_sample_is_not_warned_of():
    """One shard of 40 over 2 workers, batches of 8: the shards lose nothing, a split by sample
    would repeat 8; it warned of '0 dropped of 40 samples (0%)' (a newcomer walkthrough)."""
    from readers.shard_plan import rank_shares, uneven_split

    assert uneven_split(1, [[40, 0]], rank_shares([[40, 0]], 8, False), 8, False) is None
    assert "6 repeated of 18" in uneven_split(4, [[5, 5], [5, 3]], rank_shares([[5, 5], [5, 3]], 2, False), 2, False)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_job_resumed_twice_in_one_epoch_counts_batches_as_the_sampler_does(folders, table, num_workers):
    """state_dict(batches) counts the batches of the current iteration (after a resume, from the
    resume position: enumerate's count), as ResumableSampler.state_dict does. StreamingShards
    counted from the epoch's start, the sampler from the resume, so a job resumed twice in one
    epoch repeated or skipped samples with one of them (a DDP walkthrough)."""
    def make() -> StreamingShards:
        stream = StreamingShards(folders[5], shuffle=True, buffer=3, seed=8, batch_size=2, num_workers=num_workers)
        stream.set_epoch(1)
        return stream

    whole = run(make(), table, 2, num_workers)
    first = make()
    state = json.loads(json.dumps(first.state_dict(3)))  # job 1 read 3 batches
    second = make()
    second.load_state_dict(state)
    assert run(second, table, 2, num_workers)[:2] == whole[3:5]
    state = json.loads(json.dumps(second.state_dict(2)))  # job 2 read 2 more: enumerate's count since its resume
    assert state["batches"] == 5
    third = make()
    third.load_state_dict(state)
    assert whole[:5] + run(third, table, 2, num_workers) == whole
    with pytest.raises(ValueError, match=r"is more than this rank's"):
        third.state_dict(len(whole))  # (the whole epoch again, counted from its resume: too many)


def test_a_state_saved_at_the_epochs_last_batch_is_the_next_epoch_as_the_loaders(folders, table):
    stream = StreamingShards(folders[5], batch_size=2)
    stream.set_epoch(1)
    batches = len(run(stream, table, 2, 0))
    state = stream.state_dict(batches)
    assert (state["epoch"], state["batches"], set(state["skip"])) == (2, 0, {0})
    resumed = StreamingShards(folders[5], batch_size=2)
    resumed.load_state_dict(state)
    assert len(run(resumed, table, 2, 0)) == batches  # the next epoch, whole (it yielded none: a loop ran an empty epoch)


def test_a_state_without_a_batch_count_and_a_refused_load_keep_the_position(folders):
    """A state saved before states recorded their batch count: state_dict(0) after loading it
    gave the epoch's start (a rewind), and a refused load left its batch count behind (a review)."""
    stream = StreamingShards(folders[5], batch_size=2)
    state = stream.state_dict(2)
    old = {k: v for k, v in state.items() if k != "batches"}
    resumed = StreamingShards(folders[5], batch_size=2)
    resumed.load_state_dict(old)
    again = resumed.state_dict(0)
    assert (again["skip"], again["first"], "batches" in again) == (old["skip"], old["first"], False)
    with pytest.raises(ValueError, match=r"did not record its batch count"):
        resumed.state_dict(1)
    resumed.load_state_dict(state)
    with pytest.raises(ResumeError):
        resumed.load_state_dict({**state, "world_size": 2})
    assert resumed.state_dict(0)["batches"] == 2
