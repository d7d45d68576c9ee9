"""Reading beyond one machine: nodes x GPUs x workers splits, deterministic epochs, mid-epoch resume."""

from __future__ import annotations

import json

import pytest
from torch.utils.data import DataLoader

from readers import LMDBDataset, Loader
from readers.webdataset import StreamingShards

NODES, GPUS = 2, 2  # world_size 4, rank = node * GPUS + gpu


@pytest.fixture
def ds(lmdb_32):
    return LMDBDataset(lmdb_32)


def indices(loader: Loader) -> list[int]:
    return [int(i) for batch in loader.batch_indices() for i in batch]


def pixels(batches) -> list[bytes]:
    return [image.numpy().tobytes() for images, _labels in batches for image in images]


# -- Loader ----------------------------------------------------------------------------------
@pytest.mark.parametrize("drop_last", [False, True])
def test_loader_nodes_x_gpus_cover_the_epoch_once(ds, drop_last):
    for epoch in (0, 1):
        union = []
        for node in range(NODES):
            for gpu in range(GPUS):
                loader = Loader(ds, 2, seed=7, rank=node * GPUS + gpu, world_size=NODES * GPUS, drop_last=drop_last, threads=1)
                loader.set_epoch(epoch)
                assert len(loader) == len(list(loader))
                union += indices(loader)
        if drop_last:  # 18 = 4 x 4 + 2 dropped
            assert len(union) == len(set(union)) == 16
        else:  # padded to 20: every sample, 2 repeated
            assert set(union) == set(range(18)) and len(union) == 20


def test_epochs_are_deterministic_across_processes(ds):
    a, b = Loader(ds, 4, seed=5, rank=1, world_size=4), Loader(ds, 4, seed=5, rank=1, world_size=4)
    for epoch in (0, 3):
        a.set_epoch(epoch), b.set_epoch(epoch)
        assert pixels(a) == pixels(b)
    a.set_epoch(0)
    b.set_epoch(1)
    assert indices(a) != indices(b)


@pytest.mark.parametrize("k", [0, 1, 3, 5])
def test_resume_mid_epoch_yields_exactly_the_rest(ds, k):
    ref = Loader(ds, 2, seed=11, rank=1, world_size=2, threads=2)
    ref.set_epoch(2)
    whole = pixels(ref)
    first = Loader(ds, 2, seed=11, rank=1, world_size=2, threads=2)
    first.set_epoch(2)
    it = iter(first)
    head = pixels(next(it) for _ in range(k))
    state = json.loads(json.dumps(first.state_dict()))  # JSON-safe
    assert state["epoch"] == 2 and state["batches"] == k
    first.close()

    resumed = Loader(ds, 2, seed=11, rank=1, world_size=2, threads=2)
    resumed.load_state_dict(state)
    tail = pixels(resumed)
    assert head + tail == whole
    assert resumed.state_dict()["batches"] == len(resumed)
    # across set_epoch: the next epoch is whole and identical to an uninterrupted run's
    resumed.set_epoch(3)
    ref.set_epoch(3)
    assert pixels(resumed) == pixels(ref)


def test_state_after_set_epoch_and_mismatches(ds):
    loader = Loader(ds, 4, seed=1)
    list(loader)
    assert loader.state_dict()["batches"] == len(loader)
    loader.set_epoch(1)
    assert loader.state_dict()["epoch"] == 1 and loader.state_dict()["batches"] == 0
    with pytest.raises(ValueError, match="world_size"):
        Loader(ds, 4, seed=1, rank=0, world_size=2).load_state_dict(loader.state_dict())
    with pytest.raises(ValueError, match="seed"):
        Loader(ds, 4, seed=2).load_state_dict(loader.state_dict())
    loader.load_state_dict({**loader.state_dict(), "batches": 2})
    loader.set_epoch(2)  # a resume position for another epoch is dropped
    assert len(list(loader)) == len(loader)


# -- StreamingShards -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def shards(image_folder, tmp_path_factory):
    """18 samples of 16x16 in 9 shards of 2."""
    from packer import ImageOptions, StorageOptions, convert

    dst = tmp_path_factory.mktemp("dist") / "shards"
    convert(image_folder, dst, format="webdataset", image=ImageOptions(size=16), storage=StorageOptions(shard_size=2), workers=1)
    return dst


@pytest.fixture(scope="module")
def table(shards):
    from readers import ShardDataset

    ds = ShardDataset(shards)
    return {ds[i][0].numpy().tobytes(): i for i in range(len(ds))}


def stream_ids(loader, table) -> list[int]:
    return [table[x.numpy().tobytes()] for images, _ in loader for x in (images if images.dim() == 4 else [images])]


@pytest.mark.parametrize("shuffle", [False, True])
def test_streaming_nodes_x_gpus_x_workers_read_each_sample_once(shards, table, shuffle):
    for epoch in (0, 1):
        union = []
        for node in range(NODES):
            for gpu in range(GPUS):
                stream = StreamingShards(shards, shuffle=shuffle, buffer=3, seed=4, rank=node * GPUS + gpu, world_size=NODES * GPUS)
                stream.set_epoch(epoch)
                got = stream_ids(DataLoader(stream, batch_size=None, num_workers=2), table)
                assert len(got) == len(stream)
                union += got
        assert sorted(union) == list(range(18))


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_streaming_resume_mid_epoch(shards, table, shuffle, k):
    def make():
        stream = StreamingShards(shards, shuffle=shuffle, buffer=3, seed=9, rank=0, world_size=2)
        return stream

    ref = make()
    ref.set_epoch(1)
    whole = stream_ids(DataLoader(ref, batch_size=2, num_workers=2), table)
    first = make()
    first.set_epoch(1)
    loader = DataLoader(first, batch_size=2, num_workers=2)
    it = iter(loader)
    head = stream_ids([next(it) for _ in range(k)], table)
    state = json.loads(json.dumps(first.state_dict(k, batch_size=2, num_workers=2)))
    del it
    resumed = make()
    resumed.load_state_dict(state)
    tail = stream_ids(DataLoader(resumed, batch_size=2, num_workers=2), table)
    assert head + tail == whole
    resumed.set_epoch(2)  # the next epoch is whole again
    ref.set_epoch(2)
    assert stream_ids(DataLoader(resumed, batch_size=2, num_workers=2), table) == stream_ids(DataLoader(ref, batch_size=2, num_workers=2), table)
    with pytest.raises(ValueError, match="num_workers"):
        again = make()
        again.load_state_dict(state)
        list(again)
