"""Tests for behaviour a fourth mutation sweep (97 mutants over the streaming, shard, label, text
and info modules) found untested, the most harmful first: a user's shards at a URL taken for an
unfinished upload of packer's (``--overwrite`` deleted them), a shard cut short by exactly its
last sample, a worker given more samples than it reads under ``drop_last``, TokenDataset's size
checks and block count, PAX headers in a third-party shard, a shuffle buffer holding a whole shard,
a tar of dated photos and a sidecar, info's size of a file, and the next line's quoting. Each was
seen failing under its mutant."""

from __future__ import annotations

import io
import tarfile

import numpy as np
import pytest

import packer
from packer import StorageOptions
from readers import PackedFormatError, StreamingShards, TokenDataset


def test_a_remote_folder_of_a_users_shards_is_not_packers_without_this_machines_staging():
    """Mutant (destination.is_ours without ``staged and``): --overwrite took s3://b/theirs, tars
    and nothing else, for an unfinished upload of packer's and deleted it."""
    import fsspec

    from packer.writers.webdataset.destination import RemoteShards

    fs = fsspec.filesystem("memory")
    for name in ("part-00000.tar", "part-00001.tar"):
        fs.pipe(f"/theirs/{name}", b"x")
    assert not RemoteShards.is_ours(fs, "/theirs", staged=False)
    assert RemoteShards.is_ours(fs, "/theirs", staged=True)  # this machine's interrupted upload: packer's
    fs.rm("/theirs", recursive=True)


def test_a_shard_cut_short_by_its_last_sample_is_an_error_not_a_shorter_epoch(tmp_path):
    """Mutant (``n < count - 1``): one sample missing at a shard's end went unsaid, len() then
    counting one more than the iteration gave (ranks' batches unequal: DDP waits)."""
    rng = np.random.default_rng(4)
    samples = [(rng.integers(0, 256, (4, 4, 3), dtype=np.uint8), i % 3) for i in range(10)]
    packer.convert(samples, tmp_path / "d", format="webdataset", storage=StorageOptions(shard_size=4), workers=1)
    shard = tmp_path / "d" / "shard-000001.tar"
    with tarfile.open(shard) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()][:-2]  # its last sample's two members gone
    with tarfile.open(shard, "w", format=tarfile.USTAR_FORMAT) as tar:
        for member, data in members:
            tar.addfile(member, io.BytesIO(data))
    with pytest.raises(PackedFormatError, match=r"shard-000001\.tar: ends after 3 of its 4 samples"):
        list(StreamingShards(str(tmp_path / "d" / "shard-{000000..000002}.tar")))


def test_with_drop_last_no_worker_is_given_more_samples_than_it_reads():
    """Mutant (``b >= low``): worker 0, reading 2 samples, was given 3 (a sample read twice)."""
    from readers.shard_plan import equal_batches

    natural = [[2, 3, 3], [3, 2, 2]]
    shares = equal_batches(natural, 1, drop_last=True)
    assert all(s <= n for rank, counts in zip(shares, natural) for s, n in zip(rank, counts)), shares
    assert len({sum(rank) for rank in shares}) == 1 and shares == [[2, 3, 2], [3, 2, 2]]


@pytest.fixture(scope="module")
def tokens_256(tmp_path_factory):
    """255 bytes of text, then EOS: 256 tokens with the bytes tokenizer."""
    corpus = tmp_path_factory.mktemp("tokens") / "c"  # (README: the bytes tokenizer's ids are the bytes)
    corpus.mkdir()
    (corpus / "a.txt").write_bytes(bytes(range(32, 127)) * 2 + bytes(range(32, 97)))
    dst = corpus.parent / "t.blob"
    packer.convert(corpus, dst, workers=1)
    return dst


def test_token_blocks_count_and_size_checks(tokens_256):
    """Mutants: len n // bs (the last block then ran past the stream), a block of every token
    accepted (len 0), random_windows without block_size accepted and ignored."""
    blocks = TokenDataset(tokens_256, block_size=2)
    assert blocks.tokens.num_tokens == 256 and len(blocks) == 127  # each block needs its next-token target
    stream = list(bytes(range(32, 127)) * 2 + bytes(range(32, 97))) + [256]  # (the text's bytes, then EOS)
    x, y = blocks[126]
    assert x.tolist() == stream[252:254] and y.tolist() == stream[253:255]
    with pytest.raises(ValueError, match="256 tokens is too few for one block of 256"):
        TokenDataset(tokens_256, block_size=256)
    with pytest.raises(ValueError, match="random_windows needs a block_size"):
        TokenDataset(tokens_256, random_windows=True)


def test_pax_headers_in_a_third_party_shard_keep_its_samples_labels(tmp_path):
    """Mutant (every member type taken as a file): a PAX header (Python's tarfile default format,
    GNU tar --format=posix) split its sample, and the labels were lost. Against webdataset."""
    import webdataset as wds

    from imagefiles import gradient, png_bytes
    from PIL import Image

    path = tmp_path / "s" / "00000.tar"
    path.parent.mkdir()
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for key, label in (("a", b"0"), ("b", b"1")):
            for name, data in ((f"{key}.png", png_bytes(Image.fromarray(gradient(6, 6)))), (f"{key}.cls", label)):
                info = tarfile.TarInfo(name)
                info.size, info.pax_headers = len(data), {"comment": f"made by a tool ({name})"}
                tar.addfile(info, io.BytesIO(data))
    theirs = [int(s["cls"]) for s in wds.WebDataset(str(path), shardshuffle=False)]
    assert theirs == [0, 1] and [label for _, label in StreamingShards(str(path))] == theirs


def test_one_shard_in_a_buffer_larger_than_it_is_still_shuffled(tmp_path):
    """Mutant (the buffer's last pool left in order): with every sample of a worker in the buffer,
    a shuffled stream came out in stored order."""
    samples = [(np.full((2, 2, 3), i, np.uint8), 0) for i in range(18)]
    packer.convert(samples, tmp_path / "one", format="webdataset", workers=1)
    order = [int(image[0, 0, 0]) for image, _ in StreamingShards(tmp_path / "one", shuffle=True, buffer=1000, seed=1)]
    assert sorted(order) == list(range(18)) and order != list(range(18))


def test_a_tar_of_photos_and_a_sidecar_is_images_not_a_shard():
    """Mutant (``sum(kinds) >= 1``): photos named by date (one key, '2019') and a Takeout .json
    sidecar were taken for one WebDataset sample, as is_shard's docstring says they must not be."""
    from packer.sources.shards import is_shard
    from packer.sources.tarstream import Entry

    names = ["2019.05.01 beach.jpg", "2019.05.02 sea.jpg", "2019.05.02 sea.jpg.json"]
    assert not is_shard([Entry(name, 512 * i, 10) for i, name in enumerate(names)])
    assert is_shard([Entry(name, 512 * i, 10) for i, name in enumerate(["k1.jpg", "k1.json", "k2.jpg", "k2.json"])])


def test_info_counts_a_files_bytes_and_the_next_line_quotes_a_path_with_a_space(tmp_path):
    """Mutants: disk_usage of a file (a blob) was 0 bytes; 'see it: packer preview my data.blob'
    could not be pasted without shlex.quote."""
    from packer.info import disk_usage
    from packer.report import ConversionReport

    report = packer.convert([(np.zeros((4, 4, 3), np.uint8), 0)] * 2, tmp_path / "my data.blob", workers=1)
    assert disk_usage(tmp_path / "my data.blob") == (tmp_path / "my data.blob").stat().st_size > 0
    assert isinstance(report, ConversionReport) and report.next_steps().endswith(f"packer preview '{tmp_path}/my data.blob'")
