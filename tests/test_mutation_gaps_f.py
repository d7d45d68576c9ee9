"""Tests for behaviour a fifth mutation sweep found untested on the converting side: a compressed
document shorter than the scan found it, a packer shard's label equal to its class count, the
warning of a shard folder's unended shard, --split rows in two splits, a label row's id
matching two files, the next line for a file:// DST, and info's EOS id 0 and lists of exactly
MAX_LISTED. Each was seen failing under its mutant."""

from __future__ import annotations

import csv
import dataclasses
import gzip
import io
import logging
import os
import pickle
import tarfile

import numpy as np
from PIL import Image

import packer
from imagefiles import gradient, png_bytes
from packer import SourceOptions, TextOptions


def gzip_bytes(data: bytes, name_length: int) -> bytes:
    """``data`` gzipped with a stored file name of ``name_length`` characters (a length to pad by)."""
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="n" * name_length, mode="wb", fileobj=buffer, mtime=0) as handle:
        handle.write(data)
    return buffer.getvalue()


def test_a_compressed_file_shorter_than_scanned_at_the_same_size_and_time_is_not_read(tmp_path):
    """Mutant (_Streams._read without the length check): a .gz replaced by a shorter text of the
    same compressed size and modification time (``rsync -t``, ``touch -r``) gave its documents past
    the new end as empty or cut text, not as a file changed since the scan."""
    from packer.sources.text import scan_text
    from packer.sources.text_docs import document_texts
    from readers.schema import Skipped

    lines = [b'{"text": "line %d"}\n' % i for i in range(50)]
    before = gzip_bytes(b"".join(lines), 1)
    path = tmp_path / "c.jsonl.gz"
    path.write_bytes(before)
    corpus = scan_text(tmp_path)
    assert len(corpus.docs) == 50
    after = gzip_bytes(b"".join(lines[:20]) + b'{"text": "li', 1)  # cut inside line 21
    after = gzip_bytes(b"".join(lines[:20]) + b'{"text": "li', 1 + len(before) - len(after))
    assert len(after) == len(before) and gzip.decompress(after) == b"".join(lines[:20]) + b'{"text": "li'
    mtime = path.stat().st_mtime_ns
    path.write_bytes(after)
    os.utime(path, ns=(mtime, mtime))
    texts = document_texts(pickle.loads(pickle.dumps(corpus.docs)))
    assert texts[:20] == [f"line {i}" for i in range(20)]
    assert [t.reason if isinstance(t, Skipped) else t for t in texts[20:]] == ["the file changed since it was scanned (shorter): not read"] * 30


def test_a_packer_shards_label_equal_to_its_class_count_is_skipped(tmp_path):
    """Mutant (``<= len(classes)``): a shard of packer's given as SRC, one .cls edited to 3 of its
    3 classes, was converted with a label no class has."""
    from packer.samples import make_image_folder

    make_image_folder(tmp_path / "imgs", classes=3, per_class=2, size=(8, 8))
    packer.convert(tmp_path / "imgs", tmp_path / "w", format="webdataset", workers=1)
    shard = tmp_path / "w" / "shard-000000.tar"
    with tarfile.open(shard) as tar:
        label = next(m for m in tar.getmembers() if m.name.endswith(".cls") and tar.extractfile(m).read() == b"2")
    data = bytearray(shard.read_bytes())
    data[label.offset_data] = ord("3")
    shard.write_bytes(bytes(data))
    report = packer.convert(shard, tmp_path / "o.lmdb", workers=1)
    stem = label.name.split(".")[0]
    assert report.written == 5 and [(s.path, s.reason) for s in report.skipped] == [(stem, f"unknown label '3' in {stem}.cls")]
    assert list(packer.info.read_metadata(tmp_path / "o.lmdb").classes) == ["class_00", "class_01", "class_02"]


def third_party_shards(folder, count: int) -> None:
    """``count`` shards of 3 labeled PNG samples each, as tarfile writes them, in ``folder``."""
    png = png_bytes(Image.fromarray(gradient(6, 6)))
    folder.mkdir(exist_ok=True)
    for s in range(count):
        with tarfile.open(folder / f"{s}.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
            for k in range(3):
                for name, data in ((f"k{s}{k}.png", png), (f"k{s}{k}.cls", str(k).encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))


def test_a_shard_folders_shard_without_its_end_blocks_is_warned_of_and_converted(tmp_path, caplog):
    """Mutant (scan_shards without warn_unended): a shard cut at a member's end, a copy that may
    have stopped early, was converted without a word."""
    third_party_shards(tmp_path / "s", 2)
    with tarfile.open(tmp_path / "s" / "1.tar") as tar:
        last = tar.getmembers()[-1]
        end = last.offset_data + -(-last.size // 512) * 512  # where its last member ends
    cut = tmp_path / "s" / "1.tar"
    cut.write_bytes(cut.read_bytes()[:end])
    with tarfile.open(cut) as tar:
        assert len(tar.getnames()) == 6  # every member there: only its end is missing
    with caplog.at_level(logging.WARNING, logger="packer"):
        report = packer.convert(tmp_path / "s", tmp_path / "o.lmdb", workers=1)
    said = [r.getMessage() for r in caplog.records if "ends without the two zero blocks" in r.getMessage()]
    assert report.written == 6 and len(said) == 1 and said[0].startswith(f"{cut} ends without")


def flat_images(root, names) -> None:
    root.mkdir()
    for i, name in enumerate(names):
        Image.fromarray(gradient(8, 8, seed=i)).save(root / name)


def write_csv(path, rows) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def test_a_row_in_two_splits_is_listed_and_an_image_no_row_names_is_still_said(tmp_path, caplog):
    """Mutant (match_rows counting images of this split also named by another as left out): a.png,
    in val and in train, was taken off the unlisted count a second time, and d.png, which no row
    names, went unsaid."""
    flat_images(tmp_path / "i", ["a.png", "b.png", "c.png", "d.png"])
    write_csv(tmp_path / "l.csv", [{"path": "a.png", "label": "x", "split": "val"}, {"path": "a.png", "label": "x", "split": "train"},
                                   {"path": "b.png", "label": "y", "split": "val"}, {"path": "c.png", "label": "y", "split": "train"}])
    with caplog.at_level(logging.WARNING, logger="packer"):
        report = packer.convert(tmp_path / "i", tmp_path / "o.lmdb", source=SourceOptions(labels=str(tmp_path / "l.csv"), split="val"),
                                workers=1)
    said = [r.getMessage() for r in caplog.records if "not in" in r.getMessage()]
    assert report.written == 2 and said == [f"1 image in {tmp_path / 'i'} is not in {tmp_path / 'l.csv'} (not converted)"]


def test_an_id_without_extension_matching_two_files_is_not_given_either(tmp_path):
    """Mutant (``len(stems[name]) >= 1``): the id ``cat1`` beside cat1.jpg and cat1.png labelled
    whichever came first; which file the row means is not known. It is skipped, naming both (the
    reason said 'no such image', of an id two images have)."""
    flat_images(tmp_path / "i", ["cat1.jpg", "cat1.png", "dog.png"])
    write_csv(tmp_path / "l.csv", [{"path": "cat1", "label": "cat"}, {"path": "dog", "label": "dog"}])
    report = packer.convert(tmp_path / "i", tmp_path / "o.lmdb", source=SourceOptions(labels=str(tmp_path / "l.csv")), workers=1)
    assert report.written == 1
    [cat] = [s for s in report.skipped if s.path == "cat1"]
    assert cat.reason == "names 2 images (cat1.jpg, cat1.png): give the file name with its extension (l.csv:2)"


def test_the_line_after_a_conversion_to_a_file_url_names_a_reader_that_opens_it(tmp_path):
    """Mutant (report._is_url taking file:// for a remote URL): the line after writing to
    file:///.../d.blob said to copy it to a local disk first; it is local, and the reader named opens it."""
    from click.testing import CliRunner

    from packer.cli import cli
    from readers import RAMDataset

    url = f"file://{tmp_path}/d.blob"
    report = packer.convert([(np.zeros((4, 4, 3), np.uint8), 0)] * 2, url, workers=1)
    assert report.dst == url and report.next_steps() == f"read it: readers.RAMDataset({url!r}); see it: packer preview {url}"
    assert len(RAMDataset(url)) == 2
    assert CliRunner().invoke(cli, ["info", url]).exit_code == 0


def test_info_says_an_eos_id_of_0_is_included(tmp_path):
    """Mutant (``if tok.get('eos_id')``): a corpus tokenised with EOS id 0 was described as 'no EOS'."""
    from packer.info import describe, read_metadata

    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "a.txt").write_text("hello", encoding="utf-8")
    packer.convert(tmp_path / "c", tmp_path / "t.blob", text=TextOptions(eos=0), workers=1)
    meta = read_metadata(tmp_path / "t.blob")
    assert meta.tokenizer["eos_id"] == 0 and meta.tokens == 6  # h e l l o, then the EOS
    text = describe(tmp_path / "t.blob", meta)
    assert "6 (6.0 per document, EOS included)" in text and "eos 0" in text


def test_info_lists_of_exactly_max_listed_say_no_more(lmdb_32):
    """Mutants (``more >= 0``, ``len(skipped) >= MAX_LISTED``): 20 classes read ', ... (0 more)',
    20 skipped inputs '... 0 more (see --json)'."""
    from packer.info import describe, read_metadata
    from packer.report import MAX_LISTED
    from readers.schema import Skipped

    meta = read_metadata(lmdb_32)
    names = [f"c{i:02d}" for i in range(MAX_LISTED + 1)]
    skips = [Skipped(f"x{i}.jpg", "not an image") for i in range(MAX_LISTED + 1)]
    exact = describe(lmdb_32, dataclasses.replace(meta, classes=names[:MAX_LISTED], skipped=skips[:MAX_LISTED]))
    assert f"classes    {MAX_LISTED}: {', '.join(names[:MAX_LISTED])}\n" in exact and "more" not in exact
    assert exact.count("not an image") == MAX_LISTED
    over = describe(lmdb_32, dataclasses.replace(meta, classes=names, skipped=skips))
    assert ", ... (1 more)" in over and over.endswith("    ... 1 more (see --json)")


def test_shards_beside_class_folders_and_images_beside_shards_are_recorded_not_dropped(tmp_path):
    """A folder of shards with a class folder in it is a folder of images (is_shard_folder, under
    its mutant taken for shards, the class folder then dropped): its shards' 6 samples were left
    out without a word, as were an image and a .tgz beside a folder of shards. Each is skipped and
    recorded, saying what converts it."""
    third_party_shards(tmp_path / "mixed", 2)
    flat_images(tmp_path / "mixed" / "cats", ["a.png"])
    report = packer.convert(tmp_path / "mixed", tmp_path / "o.lmdb", workers=1)
    assert report.written == 1 and [(s.path, s.reason) for s in report.skipped] == [
        (name, f"an archive in a folder of images is not opened: convert it on its own (packer convert {name} DST)")
        for name in ("0.tar", "1.tar")]
    third_party_shards(tmp_path / "shards", 2)
    Image.fromarray(gradient(6, 6)).save(tmp_path / "shards" / "stray.png")
    (tmp_path / "shards" / "more.tgz").write_bytes(gzip.compress(b""))
    report = packer.convert(tmp_path / "shards", tmp_path / "s.lmdb", workers=1)
    assert report.written == 6 and [s.path for s in report.skipped] == ["more.tgz", "stray.png"]
    assert report.skipped[0].reason.startswith("an archive (not a .tar shard) beside the shards")
    assert report.skipped[1].reason.startswith("an image beside the shards")
