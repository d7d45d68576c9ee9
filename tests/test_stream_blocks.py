"""``StreamingShards(..., block_size=N)``: a text dataset's WebDataset shards streamed as training
blocks ``(x, y)``, cut within each shard.

The expected blocks are worked out here without packer's readers: each shard tar is read with
Python's ``tarfile`` and each document's ``.npy`` with ``numpy.load``; a shard's documents are
concatenated and cut into windows of ``N + 1`` every ``N`` tokens, its tail dropped.
"""

from __future__ import annotations

import io
import json
import random
import shutil
import tarfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from torch.utils.data import DataLoader

import packer
from packer import ImageOptions, StorageOptions
from packer.cli import cli
from readers import PackedFormatError, StreamingShards
from corpora import write_texts
from loopback import served

BLOCK = 8
META = "packer.json"
#: 11 shards over 2 ranks x 2 workers repeat more than a tenth of an epoch: said, and meant here.
pytestmark = pytest.mark.filterwarnings("ignore:StreamingShards. 11 shards over 4 streams.* of [0-9]+ blocks of 8 tokens:UserWarning")


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """31 documents of 2 to 70 letters (3 to 71 tokens with the EOS), 3 per shard: 11 shards of
    unequal token counts, one of exactly 8 + 1 tokens, one of 8."""
    rng = random.Random(5)
    lengths = [rng.randrange(2, 71) for _ in range(31)]
    lengths[27:30] = [2, 2, 2]  # shard 9: 9 tokens, exactly one window; shard 10: one document of 8 tokens, none (8 // 8
    lengths[30] = 7  # would count one: a block needs its next-token target)
    texts = {f"d{i:03d}.txt": "".join(chr(97 + rng.randrange(26)) for _ in range(n)) for i, n in enumerate(lengths)}
    root = tmp_path_factory.mktemp("blocks")
    (root / "corpus").mkdir()
    write_texts(root / "corpus", texts)
    dst = root / "shards"
    packer.convert(root / "corpus", dst, format="webdataset", storage=StorageOptions(shard_size=3), workers=1)
    return dst


def shard_documents(folder: Path) -> dict[str, list[np.ndarray]]:
    """Each shard's documents, in order, read with tarfile and numpy.load."""
    out = {}
    for path in sorted(folder.glob("*.tar")):
        with tarfile.open(path) as tar:
            out[path.name] = [np.load(io.BytesIO(tar.extractfile(m).read()), allow_pickle=False)
                              for m in tar.getmembers() if m.name.endswith(".npy")]
    return out


def expected_blocks(folder: Path, n: int = BLOCK) -> list[tuple[int, ...]]:
    """Every window of ``n + 1`` tokens, shard by shard, in stored order."""
    blocks = []
    for docs in shard_documents(folder).values():
        stream = np.concatenate(docs)
        blocks += [tuple(stream[j : j + n + 1].tolist()) for j in range(0, len(stream) - n, n)]
    return blocks


def windows(items) -> list[tuple[int, ...]]:
    """``(x, y)`` items or batches back to windows, checking that y is x shifted by one."""
    out = []
    for x, y in items:
        x, y = x.reshape(-1, x.shape[-1]), y.reshape(-1, y.shape[-1])
        assert torch.equal(x[:, 1:], y[:, :-1])
        out += [tuple(row) for row in torch.cat([x, y[:, -1:]], 1).tolist()]
    return out


def test_the_shards_hold_blocks_of_unequal_counts(shards):
    """The fixture is what the tests need: shards with 0, 1 and many blocks."""
    tokens = [len(np.concatenate(d)) for d in shard_documents(shards).values()]
    per_shard = [(n - 1) // BLOCK for n in tokens]
    assert len(per_shard) == 11 and 0 in per_shard and 1 in per_shard and max(per_shard) > 5 and BLOCK in tokens


def test_the_metadata_records_each_shards_tokens(shards):
    meta = json.loads((shards / META).read_text())
    tokens = [sum(len(d) for d in docs) for docs in shard_documents(shards).values()]
    assert meta["extra"]["shard_tokens"] == tokens and sum(tokens) == meta["tokens"]
    index = np.load(shards / "packer-index.npy", allow_pickle=False)  # docs/FORMATS.md's recipe for older datasets
    shard_count = len(meta["extra"]["shards"])
    assert np.bincount(index[:, 0], weights=index[:, 6], minlength=shard_count).astype(np.int64).tolist() == tokens


def test_one_stream_yields_every_block_in_order(shards):
    stream = StreamingShards(shards, block_size=BLOCK)
    items = list(stream)
    assert windows(items) == expected_blocks(shards) and len(stream) == len(items)
    x, y = items[0]
    assert x.dtype == y.dtype == torch.uint16 and x.shape == y.shape == (BLOCK,)


def test_a_shuffled_stream_yields_the_same_blocks(shards):
    got = windows(StreamingShards(shards, block_size=BLOCK, shuffle=True, buffer=5, seed=3))
    assert Counter(got) == Counter(expected_blocks(shards)) and got != expected_blocks(shards)


def loader_epoch(shards: Path, rank: int, **options) -> tuple[StreamingShards, list[list[tuple[int, ...]]]]:
    stream = StreamingShards(shards, block_size=BLOCK, rank=rank, world_size=2, batch_size=2, num_workers=2, **options)
    loader = DataLoader(stream, batch_size=2, num_workers=2)
    batches = [windows([batch]) for batch in loader]
    assert len(loader) == len(batches) and len(stream) == 2 * len(batches)  # len() is the real count
    return stream, batches


@pytest.mark.parametrize("shuffle", [False, True])
def test_two_ranks_of_two_workers_read_every_block_once_plus_padding(shards, shuffle):
    expected = Counter(expected_blocks(shards))
    epochs = [loader_epoch(shards, rank, shuffle=shuffle, buffer=4)[1] for rank in (0, 1)]
    assert len(epochs[0]) == len(epochs[1])  # equal batches on every rank
    got = Counter(w for epoch in epochs for batch in epoch for w in batch)
    assert not expected - got  # every block
    padding = got - expected  # repeats only (each worker pads with its own blocks), fewer than a batch per stream and rank
    assert set(padding) <= set(expected) and sum(padding.values()) < sum(expected.values()) // 2
    assert all(len(batch) == 2 for epoch in epochs for batch in epoch)


def test_with_drop_last_no_block_is_read_twice(shards):
    epochs = [loader_epoch(shards, rank, shuffle=True, drop_last=True)[1] for rank in (0, 1)]
    got = Counter(w for epoch in epochs for batch in epoch for w in batch)
    assert len(epochs[0]) == len(epochs[1]) > 0 and not got - Counter(expected_blocks(shards))


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_resume_mid_epoch_yields_exactly_the_rest(shards, shuffle):
    options = dict(shuffle=shuffle, buffer=4, seed=1)
    stream, whole = loader_epoch(shards, 0, **options)
    for stop in (1, len(whole) // 2, len(whole) - 1):
        state = json.loads(json.dumps(stream.state_dict(stop)))
        again = StreamingShards(shards, block_size=BLOCK, rank=0, world_size=2, batch_size=2, num_workers=2, **options)
        again.load_state_dict(state)
        rest = [windows([batch]) for batch in DataLoader(again, batch_size=2, num_workers=2)]
        assert whole[:stop] + rest == whole and len(again) == 2 * len(rest)


def test_a_state_of_documents_is_refused_by_blocks(shards):
    state = StreamingShards(shards).state_dict(1)
    with pytest.raises(ValueError, match="saved with block_size=None, this dataset has block_size=8"):
        StreamingShards(shards, block_size=BLOCK).load_state_dict(state)


@pytest.fixture()
def without_tokens(shards, tmp_path) -> Path:
    """``shards`` as a packer before ``shard_tokens`` wrote them."""
    old = tmp_path / "old"
    shutil.copytree(shards, old)
    meta = json.loads((old / META).read_text())
    del meta["extra"]["shard_tokens"]
    (old / META).write_text(json.dumps(meta))
    return old


def test_a_local_dataset_without_shard_tokens_counts_them_from_its_index(without_tokens, shards):
    stream = StreamingShards(without_tokens, block_size=BLOCK)
    assert windows(stream) == expected_blocks(shards) and len(stream) == len(expected_blocks(shards))


def test_a_shard_whose_tokens_are_not_the_metadatas_is_an_error(shards, tmp_path):
    wrong = tmp_path / "wrong"
    shutil.copytree(shards, wrong)
    meta = json.loads((wrong / META).read_text())
    tokens = meta["extra"]["shard_tokens"]
    tokens[0], tokens[1] = tokens[0] + 8, tokens[1] - 8  # (the sum stays the metadata's)
    (wrong / META).write_text(json.dumps(meta))
    with pytest.raises(PackedFormatError, match=rf"shard-000000\.tar: holds {tokens[0] - 8} token ids, the metadata counts {tokens[0]}"):
        list(StreamingShards(wrong, block_size=BLOCK))
    result = CliRunner().invoke(cli, ["verify", str(wrong)])
    assert result.exit_code != 0 and f"the metadata says it holds {tokens[0]} tokens, the index {tokens[0] - 8}" in result.output


@pytest.mark.parametrize("tokens, error", [
    (lambda t: t[:-1], r"metadata 'shard_tokens' is not a text dataset's token count of each of its 11 shards"),
    (lambda t: [t[0] + 1, *t[1:]], r"metadata 'tokens' is \d+, its shards' token counts add up to \d+"),
])
def test_shard_tokens_that_do_not_fit_the_metadata_are_refused(shards, tmp_path, tokens, error):
    bad = tmp_path / "bad"
    shutil.copytree(shards, bad)
    meta = json.loads((bad / META).read_text())
    meta["extra"]["shard_tokens"] = tokens(meta["extra"]["shard_tokens"])
    (bad / META).write_text(json.dumps(meta))
    for read in (lambda: StreamingShards(bad), lambda: StreamingShards(bad, block_size=BLOCK)):
        with pytest.raises(PackedFormatError, match=rf"^{bad}: {error}$"):
            read()


def test_refusals_are_one_line(shards, image_folder, tmp_path):
    for bad, error in ((0, ValueError), (-2, ValueError), (2.5, TypeError), (True, TypeError), ("8", TypeError)):
        with pytest.raises(error, match=r"^StreamingShards: block_size must be a positive integer, got"):
            StreamingShards(shards, block_size=bad)
    with pytest.raises(ValueError, match=r"^StreamingShards: transform takes one sample's tensor, and with block_size"):
        StreamingShards(shards, block_size=BLOCK, transform=lambda t: t)
    with pytest.raises(ValueError, match=r"^StreamingShards: block_size=1000 needs 1,001 token ids in a shard .* largest shard holds"):
        StreamingShards(shards, block_size=1000)
    images = tmp_path / "images"
    packer.convert(image_folder, images, format="webdataset", image=ImageOptions(size=8), workers=1)
    with pytest.raises(ValueError, match=r"^StreamingShards: block_size is for a text dataset .* hold a image dataset"):
        StreamingShards(images, block_size=BLOCK)
    bare = tmp_path / "bare"
    bare.mkdir()
    for tar in shards.glob("*.tar"):
        shutil.copy(tar, bare)
    with pytest.raises(ValueError, match=r"^StreamingShards: block_size cuts .* no packer metadata beside them"):
        StreamingShards(str(bare / "shard-{000000..000010}.tar"), block_size=BLOCK)
    assert len(list(StreamingShards(str(bare / "shard-{000000..000010}.tar")))) == 31  # (documents still stream)


def test_without_block_size_documents_stream_as_before(shards):
    docs = [d for docs in shard_documents(shards).values() for d in docs]
    got = list(StreamingShards(shards))
    assert [x.tolist() for x, _ in got] == [d.tolist() for d in docs] and {y for _, y in got} == {-1}


# -- over HTTP ----------------------------------------------------------------------------------
def test_blocks_stream_over_http_and_old_remote_metadata_is_refused(shards, without_tokens, tmp_path):
    with served(shards.parent) as root:
        stream = StreamingShards(f"{root}/shards/", block_size=BLOCK, cache_dir=tmp_path / "cache")
        assert windows(stream) == expected_blocks(shards) and len(stream) == len(expected_blocks(shards))
    with served(without_tokens.parent) as root:
        with pytest.raises(ValueError, match=r"^StreamingShards: block_size needs each shard's token count, .* convert the corpus again"):
            StreamingShards(f"{root}/old/", block_size=BLOCK)
