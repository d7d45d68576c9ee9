"""WebDataset shards packer did not write (img2dataset's, a user's own), as a SRC and through
StreamingShards (a webdataset user's walkthrough): the sample's own image is taken over masks
and maps, an img2dataset folder (shards with .parquet and _stats.json beside them) is shards,
not a text corpus, samples without a label among labeled ones are skipped and recorded (a
labeled dataset with -1 labels failed packer verify), and StreamingShards reads what the
conversion reads, with a label that is no class index said in one line."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from imagefiles import gradient, jpeg_bytes, png_bytes
from packer import ImageOptions, convert
from packer.cli import cli
from readers.schema import PackedFormatError
from readers.webdataset import StreamingShards


def shard(path: Path, members: list[tuple[str, bytes]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


PICTURES = [jpeg_bytes(gradient(12, 16, seed=i)) for i in range(4)]


def test_the_samples_own_image_is_taken_over_a_mask_or_a_map(tmp_path):
    from PIL import Image

    mask = png_bytes(Image.new("L", (16, 12)))
    src = tmp_path / "shards"
    shard(src / "00000.tar", [("a.depth.npy", npy(np.zeros((12, 16), np.float32))), ("a.jpg", PICTURES[0]),
                              ("b.emb.npy", npy(np.zeros(512, np.float32))), ("b.jpg", PICTURES[1]),
                              ("c.seg.png", mask), ("c.JPG", PICTURES[2]), ("c.txt", b"a caption")])
    report = convert(src, tmp_path / "o.lmdb", image=ImageOptions(size=8), workers=1)
    assert report.written == 3 and not report.skipped
    from readers.formats import open_store

    assert open_store(tmp_path / "o.lmdb").source_names() == ["00000.tar/a.jpg", "00000.tar/b.jpg", "00000.tar/c.JPG"]
    streamed = list(StreamingShards(str(src / "00000.tar")))
    assert len(streamed) == 3 and all(image.shape == (3, 12, 16) for image, _ in streamed)


def test_the_label_is_webdatasets_cls_field_as_streaming_reads_it(tmp_path):
    """k.orig.cls before k.cls: the conversion took the first member ending in .cls (label 2),
    where webdataset's cls field, and StreamingShards, say 0 (a webdataset walkthrough)."""
    import webdataset as wds
    from readers import open_dataset

    src = shard(tmp_path / "s" / "00000.tar", [("k.jpg", PICTURES[0]), ("k.orig.cls", b"2"), ("k.cls", b"0"),
                                              ("m.jpg", PICTURES[1]), ("m.cls", b"1")])
    theirs = [int(label) for label in wds.WebDataset(str(src), shardshuffle=False).to_tuple("cls").map(lambda t: t[0])]
    assert theirs == [0, 1]
    assert [label for _, label in StreamingShards(str(src))] == theirs
    convert(tmp_path / "s", tmp_path / "o.lmdb", image=ImageOptions(size=8), workers=1)
    assert [label for _, label in open_dataset(tmp_path / "o.lmdb")] == theirs


def test_an_img2dataset_folder_is_shards_and_labels_are_all_or_none(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = tmp_path / "i2d"
    shard(src / "00000.tar", [("000000000.jpg", PICTURES[0]), ("000000000.txt", b"x"), ("000000000.cls", b"1"),
                              ("000000001.jpg", PICTURES[1]), ("000000001.cls", b"0")])
    shard(src / "00001.tar", [("000000002.jpg", PICTURES[2]), ("000000002.json", b"{}")])
    pq.write_table(pa.table({"key": ["000000000"], "caption": ["x"]}), src / "00000.parquet")
    (src / "00000_stats.json").write_text("{}")
    run = CliRunner().invoke(cli, ["convert", str(src), str(tmp_path / "o.lmdb"), "--size", "8", "-q"])
    assert run.exit_code == 0, run.output
    info = CliRunner().invoke(cli, ["info", str(tmp_path / "o.lmdb")])
    assert "00001.tar/000000002.jpg: no .cls label, where other samples of the shards have one" in info.output, info.output
    assert CliRunner().invoke(cli, ["verify", str(tmp_path / "o.lmdb"), "--source", str(src)]).exit_code == 0


def test_streaming_a_label_that_is_no_class_index_is_one_line(tmp_path):
    path = shard(tmp_path / "s.tar", [("a.jpg", PICTURES[0]), ("a.cls", b"dog")])
    with pytest.raises(PackedFormatError, match=r"s\.tar: member a\.cls: label 'dog' is not a class index \(-1 to 2,147,483,647\)$"):
        list(StreamingShards(str(path)))
    path = shard(tmp_path / "t.tar", [("a.b.webp", PICTURES[0]), ("c.jpeg", PICTURES[1]), ("c.cls", b" 2\n")])
    assert [label for _, label in StreamingShards(str(path))] == [-1, 2]  # (a key with a dot, .webp/.jpeg: samples too)


def test_reading_shards_packer_did_not_write_says_how(tmp_path):
    """It said 'the conversion did not finish ... convert again', though nothing was converted."""
    from readers import ShardDataset
    from readers.schema import IncompleteDatasetError

    shard(tmp_path / "s" / "00000.tar", [("a.jpg", PICTURES[0])])
    with pytest.raises(IncompleteDatasetError, match=r"or these are shards packer did not write \(stream them by name, "
                                                     r"StreamingShards\('.*/s/\{00000\.\.00009\}\.tar'\), or convert them"):
        ShardDataset(tmp_path / "s")
    assert len(list(StreamingShards(str(tmp_path / "s" / "{00000..00000}.tar")))) == 1


def test_one_shard_as_src_is_read_as_shards_are(tmp_path):
    """A single .tar shard was read as a flat archive: its .cls labels dropped without a word
    (an unlabeled dataset) and its masks converted as images of their own."""
    from PIL import Image

    from readers import LMDBDataset, ShardDataset

    mask = png_bytes(Image.new("L", (16, 12)))
    one = shard(tmp_path / "00000.tar", [("a.jpg", PICTURES[0]), ("a.cls", b"2"), ("a.seg.png", mask),
                                         ("b.jpg", PICTURES[1]), ("b.cls", b"0"), ("b.json", b"{}")])
    report = convert(one, tmp_path / "o.lmdb", image=ImageOptions(size=8), workers=1)
    assert report.written == 2 and not report.skipped
    read = LMDBDataset(tmp_path / "o.lmdb")
    assert [read[i][1] for i in range(2)] == [2, 0] and read.classes == [] and read.meta.labeled
    flat = shard(tmp_path / "flat.tar", [("000.jpg", PICTURES[0]), ("000.json", b"{}"), ("001.jpg", PICTURES[1]), ("001.json", b"{}")])
    assert convert(flat, tmp_path / "flat.lmdb", image=ImageOptions(size=8), workers=1).written == 2  # (img2dataset's, unlabeled)
    photos = shard(tmp_path / "photos.tar", [("2019.05.01 beach.jpg", PICTURES[0]), ("2019.05.01 beach.jpg.json", b"{}"),
                                             ("2019.05.02 sea.jpg", PICTURES[1]), ("2019.06.01 park.jpg", PICTURES[2]), ("cat.jpg", PICTURES[3])])
    report = convert(photos, tmp_path / "photos.lmdb", image=ImageOptions(size=8), workers=1)  # a tar of photos (one key, 2019)
    assert report.written == 4 and not report.skipped
    classes = shard(tmp_path / "classes.tar", [("cat/a.jpg", PICTURES[0]), ("cat/a.json", b"{}"), ("dog/b.jpg", PICTURES[1])])
    assert LMDBDataset(convert(classes, tmp_path / "c.lmdb", image=ImageOptions(size=8), workers=1).dst).classes == ["cat", "dog"]
    ours = tmp_path / "ours"  # packer's own raw shards: class names, and (C, H, W) .npy payloads
    src = tmp_path / "imgs"
    for name, data in (("x/1.jpg", PICTURES[0]), ("y/2.jpg", PICTURES[1]), ("y/3.jpg", PICTURES[2])):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(data)
    convert(src, ours, format="webdataset", image=ImageOptions(size=8), workers=1)
    again = LMDBDataset(convert(next(ours.glob("*.tar")), tmp_path / "again.lmdb", workers=1).dst)
    packed = ShardDataset(ours)
    assert again.classes == ["x", "y"] and len(again) == len(packed) == 3
    assert all(np.array_equal(again[i][0], packed[i][0]) and again[i][1] == packed[i][1] for i in range(3))


def test_a_second_image_of_a_key_is_recorded_and_warned_not_lost(tmp_path):
    """Stems with a dot (a.b.png, a.c.png) are one sample to webdataset, whose key ends at the file
    name's first dot: the conversion kept a.b.png and StreamingShards read it, and a.c.png was
    neither converted nor recorded (a webdataset walkthrough). A mask beside the sample's own
    image (k.jpg, k.seg.png) is no second image: nothing said."""
    import webdataset as wds
    from PIL import Image

    src = shard(tmp_path / "s" / "00000.tar", [("a.b.png", png_bytes(Image.fromarray(gradient(12, 16, seed=5)))), ("a.b.cls", b"0"),
                                              ("a.c.png", png_bytes(Image.fromarray(gradient(12, 16, seed=6)))), ("a.c.cls", b"1"),
                                              ("k.jpg", PICTURES[0]), ("k.seg.png", png_bytes(Image.new("L", (16, 12))))])
    theirs = list(wds.WebDataset(str(src), shardshuffle=False))
    assert [sorted(k for k in sample if not k.startswith("__")) for sample in theirs] == [
        ["b.cls", "b.png", "c.cls", "c.png"], ["jpg", "seg.png"]]
    report = convert(tmp_path / "s", tmp_path / "o.lmdb", image=ImageOptions(size=8), workers=1)
    assert report.written == 2
    assert [(s.path, "second image of the sample a (beside a.b.png)" in s.reason) for s in report.skipped] == [
        ("00000.tar/a.c.png", True)]
    with pytest.warns(UserWarning, match=r"member a\.c\.png is a second image of the sample a \(beside a\.b\.png\)") as said:
        streamed = list(StreamingShards(str(src)))
    assert len(streamed) == 2 and len([w for w in said if "second image" in str(w.message)]) == 1


def test_the_length_of_shards_of_two_datasets_says_why_it_is_unknown(tmp_path):
    """Shards of two packer folders said "no packer metadata beside these shards", where each had
    its own (last session's left-alone list): the message names the folders; foreign shards keep it."""
    import packer

    for name in ("one", "two"):
        packer.convert([(np.full((4, 4, 3), 9, np.uint8), 0)] * 2, tmp_path / name, format="webdataset", workers=1)
    both = StreamingShards([str(tmp_path / "one" / "shard-000000.tar"), str(tmp_path / "two" / "shard-000000.tar")])
    assert len(list(both)) == 4
    with pytest.raises(TypeError, match=rf"shards of 2 folders \({tmp_path}/one, {tmp_path}/two\.\.\.\), each folder's metadata"):
        len(both)
    foreign = shard(tmp_path / "f" / "00000.tar", [("a.jpg", PICTURES[0])])
    with pytest.raises(TypeError, match="no packer metadata beside these shards"):
        len(StreamingShards(str(foreign)))
