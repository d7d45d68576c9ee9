"""Tests for behaviour a fifth mutation sweep found untested on the reading side: a third-party
shard cut inside a member header, ustar's long-name prefix field, a text member with fewer token
ids than its header says, a tar shard named without .tar, a resume that skips whole shards, a
persistent worker following a loaded position whose next batch is worker 1's, and the edge of
the 10% repeat warning. Each was seen failing under its mutant."""

from __future__ import annotations

import io
import tarfile
import warnings

import numpy as np
import pytest
from PIL import Image

import packer
from imagefiles import gradient, png_bytes
from packer import StorageOptions
from readers import PackedFormatError, StreamingShards


def write_tar(path, members) -> bytes:
    """A plain ustar tar of ``(name, bytes)`` members, as a third-party tool writes one; its bytes."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path.read_bytes()


def labeled_members(keys, png) -> list[tuple[str, bytes]]:
    return [member for i, key in enumerate(keys) for member in ((f"{key}.png", png), (f"{key}.cls", str(i).encode()))]


@pytest.fixture(scope="module")
def png() -> bytes:
    return png_bytes(Image.fromarray(gradient(6, 6)))


def test_a_third_party_shard_cut_inside_a_member_header_is_an_error_not_its_end(tmp_path, png):
    """Mutant (tar._read_exact: ``if allow_eof:``, without ``done == 0``): a copy cut 100 bytes
    into its third sample's header, with no metadata to count samples by, read as a shard of two:
    tarfile and webdataset drop the third sample without a word, StreamingShards must not."""
    import webdataset as wds

    data = write_tar(tmp_path / "whole.tar", labeled_members(["k0", "k1", "k2"], png))
    with tarfile.open(tmp_path / "whole.tar") as tar:
        third = tar.getmembers()[4].offset  # k2.png's header
    cut = tmp_path / "cut.tar"
    cut.write_bytes(data[: third + 100])
    assert [s["__key__"] for s in wds.WebDataset(str(cut), shardshuffle=False)] == ["k0", "k1"]  # theirs: silently shorter
    with pytest.raises(PackedFormatError, match=r"cut\.tar: the shard is truncated \(ends inside a tar member\)"):
        list(StreamingShards(str(cut)))
    cut.write_bytes(data[:third])  # cut at a header's start: a tar without its end blocks, its members all there
    assert [label for _, label in StreamingShards(str(cut))] == [0, 1]


def test_long_member_names_split_into_ustars_prefix_field_are_read_whole(tmp_path, png):
    """Mutant (read_header without the prefix field): names over 100 characters, which ustar splits
    into prefix and name, lost their folders; two samples named k in two folders became one (a
    second image, its label the last's). Against tarfile and webdataset."""
    import webdataset as wds

    from readers.formats.tar import tar_members

    keys = [f"{'a' * 120}/k", f"{'b' * 120}/k"]
    data = write_tar(tmp_path / "long.tar", labeled_members(keys, png))
    assert data[345:346] == b"a" and len(data[:100].split(b"\0")[0]) < 100  # tarfile used the prefix field
    with tarfile.open(tmp_path / "long.tar") as tar:
        assert [name for name, _, _ in tar_members(data)] == tar.getnames()
    theirs = [(s["__key__"], int(s["cls"])) for s in wds.WebDataset(str(tmp_path / "long.tar"), shardshuffle=False)]
    assert theirs == [(keys[0], 0), (keys[1], 1)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (not "a second image of the sample k")
        assert [label for _, label in StreamingShards(str(tmp_path / "long.tar"))] == [0, 1]


def test_a_text_member_with_fewer_token_ids_than_its_header_says_is_an_error(tmp_path):
    """Mutant (token_ids without the shape check): a .npy document cut by one token id (its header
    says 5) read as 4 tokens, silently. numpy refuses the same member."""
    buffer = io.BytesIO()
    np.save(buffer, np.array([10, 11, 12, 13, 14], np.uint16))
    member = buffer.getvalue()[:-2]  # the last id's two bytes gone
    with pytest.raises(ValueError):
        np.load(io.BytesIO(member))
    write_tar(tmp_path / "t.tar", [("doc0.npy", member)])
    with pytest.raises(PackedFormatError, match=r"t\.tar: member doc0\.npy: 4 token ids after the header, expected 5"):
        list(StreamingShards(str(tmp_path / "t.tar")))


def test_a_tar_shard_named_without_dot_tar_is_read_as_webdataset_reads_it(tmp_path, png):
    """Mutant (_check_local without ``tarfile.is_tarfile``): a shard named ``train-0`` was refused
    as no dataset; webdataset reads it."""
    import webdataset as wds

    write_tar(tmp_path / "train-0", labeled_members(["k0", "k1"], png))
    theirs = [int(s["cls"]) for s in wds.WebDataset(str(tmp_path / "train-0"), shardshuffle=False)]
    assert theirs == [0, 1] and [label for _, label in StreamingShards([str(tmp_path / "train-0")])] == theirs
    (tmp_path / "notes").write_bytes(b"not a tar at all" * 64)
    with pytest.raises(PackedFormatError, match=r"notes: not a folder of WebDataset shards"):  # no tar: still refused, named
        StreamingShards([str(tmp_path / "notes")])


@pytest.fixture(scope="module")
def sixteen(tmp_path_factory):
    """16 samples (pixel value = index) in 4 shards of 4."""
    dst = tmp_path_factory.mktemp("sixteen") / "s"
    samples = [(np.full((2, 2, 3), i, np.uint8), i % 3) for i in range(16)]
    packer.convert(samples, dst, format="webdataset", storage=StorageOptions(shard_size=4), workers=1)
    return dst


def test_a_resume_past_whole_shards_does_not_open_them(sixteen, monkeypatch):
    """Mutant (``n + count < skip``): a position exactly at a shard's end opened and read that
    shard again, to skip all of it."""
    import readers.shard_stream as module  # (ShardSamples.read, StreamingShards' samples, calls it there)

    opened = []
    real = module.shard_samples

    def spy(urls, *args, **kwargs):
        opened.append([url.rsplit("/", 1)[-1] for url in urls])
        return real(urls, *args, **kwargs)

    monkeypatch.setattr(module, "shard_samples", spy)
    state = StreamingShards(sixteen).state_dict(4)
    assert state["skip"] == [4]
    resumed = StreamingShards(sixteen)
    resumed.load_state_dict(state)
    assert [int(x[0, 0, 0]) for x, _ in resumed] == list(range(4, 16))
    assert opened == [["shard-000001.tar", "shard-000002.tar", "shard-000003.tar"]]


def test_persistent_workers_follow_a_loaded_position_whose_next_batch_is_worker_ones(sixteen):
    """Mutant (SharedCursor.follow taking ``first`` as 0): after 3 batches over 2 workers the next
    is worker 1's; persistent workers given that state began with worker 0's."""
    from torch.utils.data import DataLoader

    def make() -> StreamingShards:
        return StreamingShards(sixteen, batch_size=2, num_workers=2)

    def ids(loader) -> list[list[int]]:
        return [[int(x[0, 0, 0]) for x in images] for images, _ in loader]

    expected = ids(DataLoader(make(), batch_size=2, num_workers=2))
    stream = make()
    loader = DataLoader(stream, batch_size=2, num_workers=2, persistent_workers=True)
    assert ids(loader) == expected  # the workers are started, and kept
    state = stream.state_dict(3)
    assert state["first"] == 1 and state["skip"] == [4, 2]
    stream.load_state_dict(state)
    assert ids(loader) == expected[3:]


def test_exactly_a_tenth_repeated_is_not_warned_of_and_more_is(tmp_path):
    """Mutant (``abs(yielded - total) < total / 10``): 20 samples in whole batches of 11 (22, a
    tenth repeated, the threshold) were warned of as an uneven split."""
    samples = [(np.full((2, 2, 3), i, np.uint8), 0) for i in range(20)]
    packer.convert(samples, tmp_path / "twenty", format="webdataset", workers=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        exact = StreamingShards(tmp_path / "twenty", batch_size=11)
    assert len(list(exact)) == 22
    with pytest.warns(UserWarning, match=r"whole batches of 8, which leave epoch 0 with 4 repeated of 20 samples \(20%\)"):
        StreamingShards(tmp_path / "twenty", batch_size=8)
