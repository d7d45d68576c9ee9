"""Reading beyond one machine: nodes x GPUs x workers splits, deterministic epochs, mid-epoch resume."""

from __future__ import annotations

import json

import pytest
import torch
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
                union += indices(loader)
                assert len(loader) == len(list(loader))
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
    if k == 5:  # the epoch's last batch handed out: the state is the next epoch's start
        assert state["epoch"] == 3 and state["samples_consumed"] == 0
        state = {**state, "epoch": 2, "samples_consumed": 18}  # (the same place, as an older state says it)
    assert state["epoch"] == 2 and state["samples_consumed"] == min(4 * k, 18)  # 2 ranks x batches of 2
    first.close()

    resumed = Loader(ds, 2, seed=11, rank=1, world_size=2, threads=2)
    resumed.load_state_dict(state)
    tail = pixels(resumed)
    assert head + tail == whole
    assert resumed.state_dict()["epoch"] == 3 and resumed.state_dict()["samples_consumed"] == 0  # moved on, whole
    # the next epoch is whole and identical to an uninterrupted run's
    assert resumed.epoch == ref.epoch == 3
    assert pixels(resumed) == pixels(ref)


def test_state_after_set_epoch_and_mismatches(ds):
    loader = Loader(ds, 4, seed=1)
    list(loader)  # a whole pass: the next one follows epoch 1, from its start
    assert loader.state_dict()["epoch"] == 1 and loader.state_dict()["samples_consumed"] == 0
    loader.set_epoch(1)
    assert loader.state_dict()["epoch"] == 1 and loader.state_dict()["samples_consumed"] == 0
    Loader(ds, 4, seed=1, rank=0, world_size=2).load_state_dict(loader.state_dict())  # any world size
    with pytest.raises(ValueError, match="seed"):
        Loader(ds, 4, seed=2).load_state_dict(loader.state_dict())
    loader.load_state_dict({**loader.state_dict(), "samples_consumed": 8})
    assert len(list(loader)) == 3  # the rest of epoch 1: 10 samples in batches of 4
    loader.load_state_dict({**loader.state_dict(), "epoch": 1, "samples_consumed": 8})
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
def test_streaming_nodes_x_gpus_x_workers_read_each_sample_once_plus_padding(shards, table, shuffle):
    """9 shards of 2 over 4 ranks (3, 2, 2, 2 shards): every sample on one rank, the shorter
    ranks padded with repeats of their own samples up to the longest rank's 6."""
    for epoch in (0, 1):
        parts = []
        for node in range(NODES):
            for gpu in range(GPUS):
                stream = StreamingShards(shards, shuffle=shuffle, buffer=3, seed=4, rank=node * GPUS + gpu, world_size=NODES * GPUS)
                stream.set_epoch(epoch)
                got = stream_ids(DataLoader(stream, batch_size=None, num_workers=2), table)
                assert len(got) == len(stream) == 6
                parts.append(set(got))
        assert set().union(*parts) == set(range(18)) and sum(map(len, parts)) == 18  # disjoint: repeats stay on their rank


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


def test_streaming_resume_with_another_batch_size_is_exact_and_a_resplit_is_refused(shards, table):
    """Same world size and workers, batch size 2 then 3: the rest is each unread sample once.
    Another world size or worker count, or another dataset, is refused in one line naming it."""
    from readers import ResumeError

    def make(rank=0, world_size=2):
        return StreamingShards(shards, shuffle=True, buffer=3, seed=2, rank=rank, world_size=world_size)

    first = make()
    it = iter(DataLoader(first, batch_size=2, num_workers=2))
    head = stream_ids([next(it) for _ in range(3)], table)
    del it
    state = json.loads(json.dumps(first.state_dict(3, batch_size=2, num_workers=2)))
    assert state["dataset"]["samples"] == 18 and state["num_workers"] == 2
    resumed = make()
    resumed.load_state_dict(state)
    tail = stream_ids(DataLoader(resumed, batch_size=3, num_workers=2), table)
    assert sorted(head + tail) == sorted(stream_ids(DataLoader(make(), batch_size=None), table))
    with pytest.raises(ResumeError, match="saved with world_size=2, this StreamingShards has world_size=3.*ResumableSampler"):
        make(0, 3).load_state_dict(state)
    with pytest.raises(ResumeError, match="another dataset: it was saved over samples=17, this dataset reads samples=18"):
        make().load_state_dict({**state, "dataset": {**state["dataset"], "samples": 17}})
    with pytest.raises(ResumeError, match="not a StreamingShards state"):
        make().load_state_dict({"epoch": 0, "samples_consumed": 4})


# -- StreamingShards over a text corpus ------------------------------------------------------
#: Documents of a small corpus (sorted file order = document order); several shards of 2.
DOCS = {
    "a.txt": "hello world\n",
    "b.txt": "h\u00e9llo w\u00f6rld, \u00fcn\u00efcode \u2713 \U0001f600\n",
    "c.txt": "x" * 300,
    "d/e.txt": "nested \u00e6\u00f8\u00e5\nsecond line\n",
    "f.txt": "\u4e2d\u6587\u6587\u672c",
}


@pytest.fixture(scope="module")
def text_shards(tmp_path_factory):
    """``DOCS`` converted by the real converter to a WebDataset (default "bytes" tokenizer)."""
    from packer import StorageOptions, convert

    corpus = tmp_path_factory.mktemp("corpus")
    for name, text in DOCS.items():
        (corpus / name).parent.mkdir(parents=True, exist_ok=True)
        (corpus / name).write_bytes(text.encode("utf-8"))
    dst = tmp_path_factory.mktemp("text") / "shards"
    convert(corpus, dst, format="webdataset", storage=StorageOptions(shard_size=2), workers=1)
    return dst


def expected_ids() -> list[list[int]]:
    """The "bytes" tokenizer computed directly: a document's UTF-8 bytes, then EOS (256)."""
    return [list(text.encode("utf-8")) + [256] for _name, text in sorted(DOCS.items())]


def test_streaming_a_text_dataset_yields_each_documents_token_ids(text_shards):
    stream = StreamingShards(text_shards)
    samples = list(stream)
    assert len(samples) == len(stream) == len(DOCS)
    for ids, label in samples:
        assert ids.dim() == 1 and ids.dtype == torch.uint16 and label == -1
    assert [ids.tolist() for ids, _ in samples] == expected_ids()
    # the same through DataLoader workers (samples of different lengths: batch_size=None)
    got = sorted(ids.tolist() for ids, _ in DataLoader(StreamingShards(text_shards), batch_size=None, num_workers=2))
    assert got == sorted(expected_ids())


@pytest.mark.parametrize("shuffle", [False, True])
def test_streaming_text_over_ranks_reads_each_document_once(text_shards, shuffle):
    union = []
    for rank in range(2):
        stream = StreamingShards(text_shards, shuffle=shuffle, buffer=2, seed=3, rank=rank, world_size=2)
        stream.set_epoch(1)
        part = [tuple(ids.tolist()) for ids, _ in stream]
        assert len(part) == len(stream) == 3  # shards of 2, 2, 1 documents: the rank with 2 repeats one
        union.append(set(part))
    assert union[0] | union[1] == {tuple(ids) for ids in expected_ids()} and len(union[0]) + len(union[1]) == len(DOCS)


def test_streaming_text_refuses_a_member_that_is_not_token_ids(text_shards, tmp_path):
    """A text dataset whose shard holds another dtype is refused, naming the member."""
    import shutil

    from readers import PackedFormatError
    from readers.formats.webdataset import META_FILE

    broken = tmp_path / "broken"
    shutil.copytree(text_shards, broken)
    meta = json.loads((broken / META_FILE).read_text())
    meta["dtype"] = "uint32"  # the members are uint16
    meta["tokenizer"]["vocab_size"] = 257
    (broken / META_FILE).write_text(json.dumps(meta))
    with pytest.raises(PackedFormatError, match=r"0000000000\.npy.*expected a 1-D uint32 array of token ids"):
        list(StreamingShards(broken))
