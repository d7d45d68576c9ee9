"""Arguments from Python as a Python user writes them (a walkthrough of the API): numpy and torch
integers are taken wherever an integer is (they were refused for some options and taken for
others), booleans and strings are never taken as numbers or flags ("no" is truthy; True is 1),
and an argument that does not apply is refused in one line, never a TypeError deep inside."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from imagefiles import gradient, jpeg_bytes, write
from packer import ImageOptions, StorageOptions, convert
from packer.errors import OptionError
from packer.options import RunOptions, TextOptions
from readers import LMDBDataset, RAMDataset, ShardDataset
from readers.schema import PackedFormatError
from readers.webdataset import StreamingShards


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    root = tmp_path_factory.mktemp("args") / "src"
    for i in range(4):
        write(root / f"c{i % 2}" / f"{i}.jpg", jpeg_bytes(gradient(12, 16, seed=i)))
    return root


@pytest.mark.parametrize("size", [np.int64(8), torch.tensor(8), (np.int32(8), np.int64(8)), np.array([8, 8]), torch.tensor([8, 8])])
def test_numpy_and_torch_integers_are_sizes(size):
    assert ImageOptions(size=size).size == (8, 8)


def test_numpy_integers_are_taken_as_python_ints_everywhere(src, tmp_path):
    image = ImageOptions(size=8, encoding="jpeg", quality=np.int64(80), max_pixels=np.int32(10_000), resize=np.int16(9))
    storage = StorageOptions(shard_size=np.int64(2), shard_bytes=np.uint32(1 << 20))
    run = RunOptions(workers=np.int64(2), timeout=np.float32(5))
    values = (image.quality, image.max_pixels, image.resize, storage.shard_size, storage.shard_bytes, run.workers)
    assert values == (80, 10_000, 9, 2, 1 << 20, 2) and all(type(v) is int for v in values)
    assert run.timeout == 5.0 and type(run.timeout) is float
    assert TextOptions(max_tokens=torch.tensor(4)).max_tokens == 4
    report = convert(src, tmp_path / "o.shards", format="webdataset", image=image, storage=storage, workers=np.int64(2))
    assert report.written == 4 and len(ShardDataset(tmp_path / "o.shards")) == 4  # (the metadata is JSON: plain ints in it)


@pytest.mark.parametrize("fields, message", [
    ({"size": 8, "encoding": "jpeg", "quality": True}, "--quality: must be an integer from 1 to 100, got True"),
    ({"max_pixels": True}, "--max-pixels: must be a positive integer, got True"),
    ({"size": np.bool_(True)}, "--size: expected N or HxW, got np.True_"),
    ({"size": np.int64(-3)}, "--size: sides must be between 1 and 65535 pixels, got -3x-3"),
    ({"size": np.array([8, 8, 8])}, "--size: expected (height, width) integers, got (8, 8, 8)"),
    ({"size": 8, "resize": True}, "--resize: must be a whole number of pixels (1 to 65535), got True"),
])
def test_booleans_and_wrong_shapes_are_not_numbers(fields, message):
    """quality=True was taken as quality 1 and max_pixels=True as 1 pixel: every image then
    skipped as 'cannot decode' or over --max-pixels, as if the files were damaged."""
    with pytest.raises(OptionError) as caught:
        ImageOptions(**fields)
    assert str(caught.value) == message


def test_an_array_is_no_token_id():
    with pytest.raises(OptionError, match=r"^--eos: must be a token id >= 0 or 'none', got array\(\[1, 2\]\)$"):
        TextOptions(eos=np.array([1, 2]))  # (numpy's "truth value of an array is ambiguous" came out)


def test_storage_and_run_options_refuse_booleans():
    with pytest.raises(OptionError, match=r"^--shard-size: must be a positive integer, got True$"):
        StorageOptions(shard_size=True)
    with pytest.raises(OptionError, match=r"^--workers: must be a positive integer, got True$"):
        RunOptions(workers=True)


def test_shard_bytes_takes_the_spellings_of_sizes(src, tmp_path):
    """'64MB' was refused ('not a valid integer range'), LitData's chunk_bytes spelling (a
    Streaming/LitData user's walkthrough): decimal and binary units, from Python and the command."""
    from click.testing import CliRunner

    from packer.cli import cli

    assert [StorageOptions(shard_bytes=v).shard_bytes for v in ("64MB", "1.5 GB", "512KiB", "1GiB", "1e6", 7, np.int64(9))] == [
        64_000_000, 1_500_000_000, 524_288, 2**30, 1_000_000, 7, 9]
    for wrong in ("64 parsecs", "0MB", True, "-1", "1.5", "1e400"):  # (a fraction of a byte, an OverflowError: a review)
        with pytest.raises(OptionError, match=r"^--shard-bytes: must be a positive number of bytes \(as 1000000, 64MB or 1GiB\), got "):
            StorageOptions(shard_bytes=wrong)
    for name, bound in (("s", "1KB"), ("n", "1000")):
        result = CliRunner().invoke(cli, ["convert", str(src), str(tmp_path / name), "-f", "webdataset", "--size", "8", "--shard-bytes", bound, "-q"])
        assert result.exit_code == 0, result.output
    shards = lambda name: sorted(p.read_bytes() for p in (tmp_path / name).glob("*.tar"))  # noqa: E731
    assert len(shards("s")) > 1 and shards("s") == shards("n")


@pytest.mark.parametrize("dst", ["w.lmdb", "w.h5"])
def test_a_sink_for_a_format_that_takes_none_is_refused(src, tmp_path, dst):
    with pytest.raises(OptionError, match=r"^sink: applies to blob and webdataset output only, not (lmdb|hdf5); drop it$"):
        convert(src, tmp_path / dst, sink=object(), workers=1)
    assert not list(tmp_path.iterdir())


def test_reader_flags_and_transforms_are_checked(src, tmp_path):
    """RAMDataset(in_memory="no") loaded the whole file and verify="no" turned checking on."""
    convert(src, tmp_path / "o.blob", image=ImageOptions(size=8), workers=1)
    convert(src, tmp_path / "o.lmdb", image=ImageOptions(size=8), workers=1)
    with pytest.raises(TypeError, match=r"^in_memory must be True or False, got 'no'$"):
        RAMDataset(tmp_path / "o.blob", in_memory="no")
    with pytest.raises(TypeError, match=r"^verify must be True, False or None, got 'no'$"):
        LMDBDataset(tmp_path / "o.lmdb", verify="no")
    with pytest.raises(TypeError, match=r"^transform must be a callable \(image -> image\) or None, got 1$"):
        RAMDataset(tmp_path / "o.blob", transform=1)
    assert not RAMDataset(tmp_path / "o.blob", in_memory=np.bool_(False)).in_memory


def test_a_shard_pattern_that_names_none_of_the_shards_is_refused(src, tmp_path):
    """ShardDataset('out/bogus-%06d.tar') read every shard of out/ as if the pattern named them."""
    convert(src, tmp_path / "out" / "train-%06d.tar", image=ImageOptions(size=8), workers=1)
    assert len(ShardDataset(tmp_path / "out" / "train-%06d.tar")) == len(StreamingShards(str(tmp_path / "out" / "train-%06d.tar"))) == 4
    for reader in (ShardDataset, StreamingShards):
        with pytest.raises(PackedFormatError, match=r"bogus-%06d\.tar: names no shard of the dataset in .*out \(its shards: "
                                                     r"train-000000\.tar to train-000000\.tar\); give the folder"):
            reader(str(tmp_path / "out" / "bogus-%06d.tar"))
