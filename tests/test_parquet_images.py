"""Parquet files of images as SRC (packer/sources/parquet_images.py): a Hugging Face dataset as
the Hub stores it converts as its class folder does (the same pixels, labels and class names),
rows without images or labels are skipped and recorded, work is handed out by row group, and
``verify --source`` re-reads the rows. Before, such a folder was taken for a text corpus
("holds no images, only text files") and refused."""

from __future__ import annotations

import json
import os
from pathlib import Path

import lmdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from imagefiles import gradient, jpeg_bytes, write
from packer import ImageOptions, convert
from packer.cli import cli
from packer.errors import OptionError, SourceError
from packer.options import SourceOptions
from packer.jobs import image_job
from readers.formats import open_store

CLASSES = ["cat", "dog", "fox"]


def hf_metadata(names=CLASSES) -> dict:
    """The schema metadata the `datasets` library writes: an Image feature and a ClassLabel."""
    features = {"image": {"_type": "Image"}, "label": {"names": list(names), "_type": "ClassLabel"}}
    return {b"huggingface": json.dumps({"info": {"features": features}}).encode()}


def write_parquet(path: Path, rows: list[dict], metadata: dict | None = None, row_group_size: int = 4) -> Path:
    table = pa.Table.from_pylist(rows)
    if metadata is not None:
        table = table.replace_schema_metadata(metadata)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """A Hub-like dataset (two files of 7 and 5 rows, row groups of 4) and the same JPEGs in class folders."""
    root = tmp_path_factory.mktemp("hub")
    images = {}  # row name -> (class, jpeg)
    rows_of = {"train-00000-of-00002.parquet": 7, "train-00001-of-00002.parquet": 5}
    seed = 0
    for file, count in rows_of.items():
        rows = []
        for n in range(1, count + 1):
            label = seed % 3
            data = jpeg_bytes(gradient(20 + seed, 30, seed=seed))
            rows.append({"image": {"bytes": data, "path": f"img{seed}.jpg"}, "label": label})
            images[f"{file}:{n}"] = (CLASSES[label], data, f"img{seed:02d}.jpg")
            write(root / "folder" / CLASSES[label] / f"img{seed:02d}.jpg", data)
            seed += 1
        write_parquet(root / "data" / file, rows, hf_metadata())
    return root, images


def plain_read(path: Path) -> tuple[dict, dict[str, tuple[int, bytes]]]:
    """An LMDB dataset read with lmdb and json alone (docs/FORMATS.md): its metadata, and
    source name -> (label, payload) for every sample."""
    env = lmdb.open(str(path), subdir=True, readonly=True, lock=False)
    with env.begin() as txn:
        meta = json.loads(txn.get(b"__meta__"))
        names = json.loads(txn.get(b"__sources__"))
        out = {}
        for i in range(meta["count"]):
            record = txn.get(b"%010d" % i)
            label = int(np.frombuffer(record[:4], "<i4")[0])
            out[names[i]] = (label, bytes(record[16:]))
    env.close()
    return meta, out


def plain_samples(path: Path) -> dict[str, tuple[int, bytes]]:
    return plain_read(path)[1]


def test_a_hub_dataset_converts_as_its_class_folder_does(hub, tmp_path):
    root, images = hub
    options = ImageOptions(size=16)
    parquet = convert(root / "data", tmp_path / "p.lmdb", image=options, workers=2)
    convert(root / "folder", tmp_path / "f.lmdb", image=options, workers=1)
    assert parquet.written == len(images) == 12 and not parquet.skipped
    from_parquet, from_folder = plain_samples(tmp_path / "p.lmdb"), plain_samples(tmp_path / "f.lmdb")
    assert list(from_parquet) == list(images)  # file order, then row order, named FILE:N
    for name, (cls, _data, file_name) in images.items():
        assert from_parquet[name] == from_folder[f"{cls}/{file_name}"]
        assert from_parquet[name][0] == CLASSES.index(cls)
    meta = plain_read(tmp_path / "p.lmdb")[0]
    assert meta["classes"] == CLASSES and meta["labeled"] and meta["source"] == str((root / "data").resolve())


def test_work_is_handed_out_a_row_group_at_a_time(hub):
    root, _ = hub
    job = image_job(root / "data", ImageOptions(size=16))
    assert job.chunksize(2) == 4  # the files' row groups
    assert [item.group for item in job.items[:8]] == [0, 0, 0, 0, 1, 1, 1, 0]


def test_the_cli_takes_it_as_images_and_verify_rereads_it(hub, tmp_path):
    root, _ = hub
    run = CliRunner().invoke(cli, ["convert", str(root / "data"), str(tmp_path / "p.blob"), "--size", "16", "-q"])
    assert run.exit_code == 0, run.output
    checked = CliRunner().invoke(cli, ["verify", str(tmp_path / "p.blob"), "--source", str(root / "data")])
    assert checked.exit_code == 0 and "12 compared with the source" in checked.output, checked.output
    one_file = root / "data" / "train-00001-of-00002.parquet"
    run = CliRunner().invoke(cli, ["convert", str(one_file), str(tmp_path / "one.lmdb"), "--size", "16", "-q"])
    assert run.exit_code == 0, run.output
    assert list(plain_samples(tmp_path / "one.lmdb"))[:2] == ["train-00001-of-00002.parquet:1", "train-00001-of-00002.parquet:2"]


def test_rows_without_an_image_or_a_label_are_skipped_and_recorded(tmp_path):
    data = jpeg_bytes(gradient(12, 12))
    rows = [{"image": {"bytes": data, "path": None}, "label": 1},
            {"image": {"bytes": None, "path": "/elsewhere/a.jpg"}, "label": 0},
            {"image": {"bytes": b"not an image", "path": None}, "label": 0},
            {"image": {"bytes": data, "path": None}, "label": None},
            {"image": {"bytes": data, "path": None}, "label": 2},
            {"image": {"bytes": None, "path": None}, "label": 1},  # said 'only a path' too (an HF walkthrough)
            {"image": None, "label": 1}]
    write_parquet(tmp_path / "src" / "x.parquet", rows, hf_metadata())
    report = convert(tmp_path / "src", tmp_path / "o.lmdb", image=ImageOptions(size=8), workers=1)
    reasons = {s.path: s.reason for s in report.skipped}
    assert reasons["x.parquet:2"] == "the row holds no image bytes, only a path to the image, not embedded (/elsewhere/a.jpg)"
    assert reasons["x.parquet:4"] == "no label (column 'label' holds None)"
    assert reasons["x.parquet:6"] == reasons["x.parquet:7"] == "the row holds no image (null)"
    assert "x.parquet:3" in reasons and len(reasons) == 5
    assert [(name, label) for name, (label, _) in plain_samples(tmp_path / "o.lmdb").items()] == [("x.parquet:1", 1), ("x.parquet:5", 2)]


def test_plain_columns_string_labels_and_unlabeled_files(tmp_path):
    pictures = [jpeg_bytes(gradient(10, 10, seed=i)) for i in range(4)]
    write_parquet(tmp_path / "ints" / "a.parquet", [{"jpg": p, "label": i * 2} for i, p in enumerate(pictures)])
    write_parquet(tmp_path / "names" / "a.parquet", [{"img": p, "class": c} for p, c in zip(pictures, "zyzx")])
    write_parquet(tmp_path / "test" / "a.parquet", [{"image": p, "label": -1} for p in pictures])
    write_parquet(tmp_path / "none" / "a.parquet", [{"image": p, "caption": "a picture"} for p in pictures])
    for name in ("ints", "names", "test", "none"):
        convert(tmp_path / name, tmp_path / f"{name}.lmdb", image=ImageOptions(size=8), workers=1)
    (ints, int_samples), (names, name_samples) = plain_read(tmp_path / "ints.lmdb"), plain_read(tmp_path / "names.lmdb")
    assert ints["classes"] == [] and [label for label, _ in int_samples.values()] == [0, 2, 4, 6]  # (as a label file's integers)
    assert names["classes"] == ["x", "y", "z"] and [label for label, _ in name_samples.values()] == [2, 1, 2, 0]
    for unlabeled in ("test", "none"):
        meta, samples = plain_read(tmp_path / f"{unlabeled}.lmdb")
        assert not meta["labeled"] and meta["count"] == 4 and {label for label, _ in samples.values()} == {-1}


def test_what_is_not_a_parquet_image_source_or_cannot_be_one(hub, tmp_path):
    root, _ = hub
    write_parquet(tmp_path / "text" / "a.parquet", [{"text": "a document"}, {"text": "another"}])
    assert CliRunner().invoke(cli, ["convert", str(tmp_path / "text"), str(tmp_path / "t.blob"), "-q"]).exit_code == 0
    assert open_store(tmp_path / "t.blob").meta.kind == "text"  # Parquet without an image column is a corpus, as before
    with pytest.raises(OptionError, match="labels are their label column"):
        labels = write(tmp_path / "labels.csv", b"path,label\nx.jpg,1\n")
        convert(root / "data", tmp_path / "l.lmdb", image=ImageOptions(size=8), source=SourceOptions(labels=str(labels)))
    mixed = tmp_path / "mixed"
    write_parquet(mixed / "a.parquet", [{"image": jpeg_bytes(gradient(8, 8)), "label": 0}])
    write_parquet(mixed / "b.parquet", [{"picture": jpeg_bytes(gradient(8, 8)), "label": 0}])
    with pytest.raises(SourceError, match=r"b\.parquet has no column 'image', which a\.parquet has"):
        convert(mixed, tmp_path / "m.lmdb", image=ImageOptions(size=8))
    assert not (tmp_path / "m.lmdb").exists() and not (tmp_path / "l.lmdb").exists()


def test_several_splits_in_one_folder_are_said_and_split_picks_one(tmp_path, caplog):
    pictures = [jpeg_bytes(gradient(8, 8, seed=i)) for i in range(3)]
    for split, count in (("train", 2), ("validation", 1)):
        write_parquet(tmp_path / "data" / f"{split}-00000-of-00001.parquet", [{"image": p, "label": 0} for p in pictures[:count]])
    convert(tmp_path / "data", tmp_path / "o.lmdb", image=ImageOptions(size=8), workers=1)
    assert "its files are those of the splits train, validation, which are converted together into one dataset; to convert one split, " \
           "pass --split train" in caplog.text
    caplog.clear()
    run = CliRunner().invoke(cli, ["convert", str(tmp_path / "data"), str(tmp_path / "v.lmdb"), "--split", "validation", "--size", "8", "-q"])
    assert run.exit_code == 0 and "converted together" not in caplog.text, run.output
    assert list(plain_samples(tmp_path / "v.lmdb")) == ["validation-00000-of-00001.parquet:1"]
    run = CliRunner().invoke(cli, ["convert", str(tmp_path / "data"), str(tmp_path / "x.lmdb"), "--split", "test", "-q"])
    assert run.exit_code == 2 and run.stderr.strip() == (
        f"Error: --split: no file of {tmp_path / 'data'} is of the split 'test' (its splits: train, validation)"), run.output
    nested = tmp_path / "nested"
    for split in ("train", "test"):
        write_parquet(nested / split / "0000.parquet", [{"image": pictures[0], "label": 0}])
    assert convert(nested, tmp_path / "n.lmdb", image=ImageOptions(size=8), source=SourceOptions(split="test"), workers=1).written == 1


def test_the_columns_can_be_named_and_a_wrong_name_is_refused(tmp_path):
    pictures = [jpeg_bytes(gradient(10, 10, seed=i)) for i in range(3)]
    rows = [{"thumb": jpeg_bytes(gradient(4, 4)), "photo": p, "coarse": i % 2, "fine": 2 - i} for i, p in enumerate(pictures)]
    src = tmp_path / "src"
    write_parquet(src / "a.parquet", rows)
    run = CliRunner().invoke(cli, ["convert", str(src), str(tmp_path / "o.lmdb"), "--image-column", "photo", "--label-column", "fine",
                                   "--size", "8", "-q"])
    assert run.exit_code == 0, run.output
    meta, samples = plain_read(tmp_path / "o.lmdb")
    assert [label for label, _ in samples.values()] == [2, 1, 0] and meta["classes"] == [] and meta["preprocessing"]["parquet"] == {
        "image_column": "photo", "label_column": "fine", "split": ""}
    default = convert(src, tmp_path / "d.lmdb", image=ImageOptions(size=8), workers=1)  # the first binary column, no label column
    assert default.written == 3 and not plain_read(tmp_path / "d.lmdb")[0]["labeled"]
    checked = CliRunner().invoke(cli, ["verify", str(tmp_path / "o.lmdb"), "--source", str(src), "--image-column", "photo",
                                       "--label-column", "fine"])
    assert checked.exit_code == 0 and "3 compared with the source" in checked.output, checked.output
    for args, message in [
        (["--image-column", "nope"], "--image-column: a.parquet has no column 'nope' (its columns: thumb, photo, coarse, fine)"),
        (["--image-column", "fine"], "--image-column: column 'fine' of a.parquet holds no encoded images (it is int64; binary, or a "
                                     "struct with binary 'bytes', is needed)"),
        (["--label-column", "photo"], "--label-column: column 'photo' of a.parquet holds no labels (it is binary; integers or strings are needed)"),
        (["--path-column", "photo"], "--path-column: applies with --labels only; drop it"),
    ]:
        run = CliRunner().invoke(cli, ["convert", str(src), str(tmp_path / "x.lmdb"), *args, "-q"])
        assert run.exit_code == 2 and run.stderr.strip() == f"Error: {message}", run.output
    assert not (tmp_path / "x.lmdb").exists()
    folder = tmp_path / "folder"
    write(folder / "cat" / "a.jpg", pictures[0])
    run = CliRunner().invoke(cli, ["convert", str(folder), str(tmp_path / "y.lmdb"), "--image-column", "photo", "-q"])
    assert run.exit_code == 2 and "--image-column: applies to a Python dataset or Parquet files of images only; drop it" in run.stderr


def test_an_unreadable_file_is_recorded_and_fail_stops_at_it(tmp_path):
    picture = jpeg_bytes(gradient(8, 8))
    src = tmp_path / "data"
    for k in range(2):
        write_parquet(src / f"train-0000{k}-of-00002.parquet", [{"image": picture, "label": 0}, {"image": picture, "label": 1}])
    broken = src / "train-00001-of-00002.parquet"
    broken.write_bytes(broken.read_bytes()[:-40] + bytes(32) + b"PAR1")  # a broken footer (a download cut and patched)
    report = convert(src, tmp_path / "o.lmdb", image=ImageOptions(size=8), workers=1)
    assert report.written == 2 and [s.path for s in report.skipped] == ["train-00001-of-00002.parquet"]
    assert report.skipped[0].reason.startswith("cannot read it as a Parquet file (")
    run = CliRunner().invoke(cli, ["convert", str(src), str(tmp_path / "f.lmdb"), "--on-error", "fail", "-q"])
    assert run.exit_code == 1 and "train-00001-of-00002.parquet: cannot read it as a Parquet file" in run.stderr, run.output
    assert not (tmp_path / "f.lmdb").exists()


@pytest.mark.parametrize("command", ["bench", "doctor"])
def test_bench_and_doctor_say_they_take_a_folder_of_images(hub, command):
    root, _ = hub
    run = CliRunner().invoke(cli, [command, str(root / "data")])
    assert run.exit_code == 1 and run.stderr.strip() == (
        f"Error: {root / 'data'}: packer bench and packer doctor read a folder of images (they time a sample of its files); "
        "extract part of the Parquet files' images into a folder, or convert them and point packer doctor at the dataset"), run.output


def test_a_text_corpus_with_a_binary_column_stays_a_corpus(tmp_path):
    """A binary column of another name counts as images only when its values are images (a
    review: a corpus with a sha column was taken for images, 'none of the 50 images converted')."""
    write_parquet(tmp_path / "c" / "a.parquet", [{"text": f"document {i}", "sha": bytes([i]) * 20} for i in range(5)])
    assert convert(tmp_path / "c", tmp_path / "t.blob", workers=1).written == 5
    assert open_store(tmp_path / "t.blob").meta.kind == "text"
    pictures = [jpeg_bytes(gradient(8, 8, seed=i)) for i in range(3)]
    write_parquet(tmp_path / "i" / "a.parquet", [{"caption": "x", "photo": p} for p in pictures])  # (a name of its own)
    assert convert(tmp_path / "i", tmp_path / "i.lmdb", image=ImageOptions(size=8), workers=1).written == 3


def test_classes_keeps_the_row_order_and_labels_mixed_across_files_are_refused(tmp_path):
    pictures = [jpeg_bytes(gradient(8, 8, seed=i)) for i in range(6)]
    src = tmp_path / "src"
    write_parquet(src / "a.parquet", [{"image": p, "label": c} for p, c in zip(pictures, "abcabc")], row_group_size=2)
    (tmp_path / "classes.txt").write_text("c\nb\na\n")
    run = CliRunner().invoke(cli, ["convert", str(src), str(tmp_path / "o.lmdb"), "--classes", str(tmp_path / "classes.txt"), "-q"])
    assert run.exit_code == 0, run.output
    assert [(name, label) for name, (label, _) in plain_samples(tmp_path / "o.lmdb").items()] == [
        ("a.parquet:1", 2), ("a.parquet:2", 1), ("a.parquet:3", 0), ("a.parquet:4", 2), ("a.parquet:5", 1), ("a.parquet:6", 0)]
    write_parquet(src / "b.parquet", [{"image": pictures[0], "label": 1}])
    with pytest.raises(SourceError, match=r"the label column 'label' holds strings in some files and integers in others"):
        convert(src, tmp_path / "m.lmdb", image=ImageOptions(size=8), workers=1)


def test_resume_does_not_depend_on_how_src_is_spelled(hub, tmp_path, monkeypatch):
    root, _ = hub
    monkeypatch.chdir(root)
    relative = image_job("data", ImageOptions(size=8))
    absolute = image_job(root / "data", ImageOptions(size=8))
    assert [i.path for i in relative.items] == [i.path for i in absolute.items] and relative.folder.stamps == absolute.folder.stamps


def test_splits_are_named_as_the_hub_names_them(tmp_path, caplog):
    picture = jpeg_bytes(gradient(8, 8))
    for name in ("part0", "part1"):
        write_parquet(tmp_path / "flat" / f"{name}.parquet", [{"image": picture, "label": 0}])
    convert(tmp_path / "flat", tmp_path / "f.lmdb", image=ImageOptions(size=8), workers=1)
    assert "splits" not in caplog.text  # (part0 and part1 are no splits)
    with pytest.raises(OptionError, match=r"^--split: SRC is one file, named as no split; drop --split$"):
        convert(tmp_path / "flat" / "part0.parquet", tmp_path / "x.lmdb", image=ImageOptions(size=8),
                source=SourceOptions(split="train"))
    (tmp_path / "empty").mkdir()
    pq.write_table(pa.table({"image": pa.array([], pa.binary()), "label": pa.array([], pa.int64())}), tmp_path / "empty" / "a.parquet")
    with pytest.raises(SourceError, match=r"its Parquet files hold no rows$"):
        convert(tmp_path / "empty", tmp_path / "e.lmdb", image=ImageOptions(size=8), workers=1)


def test_a_large_row_group_is_streamed_by_each_worker(tmp_path, monkeypatch):
    """pyarrow's writer makes one row group of up to a million rows: workers read it a batch at a
    time (packer/sources/parquet_rows.py), never the whole column; the rows are the same."""
    pictures = [jpeg_bytes(gradient(10, 10, seed=i)) for i in range(300)]
    write_parquet(tmp_path / "big" / "a.parquet", [{"image": p, "label": i % 3} for i, p in enumerate(pictures)], row_group_size=10**6)
    for k, p in enumerate(pictures):
        write(tmp_path / "folder" / str(k % 3) / f"{k:04d}.jpg", p)
    convert(tmp_path / "big", tmp_path / "p.lmdb", image=ImageOptions(size=8), workers=2)
    convert(tmp_path / "folder", tmp_path / "f.lmdb", image=ImageOptions(size=8), workers=1)
    parquet, folder = plain_samples(tmp_path / "p.lmdb"), plain_samples(tmp_path / "f.lmdb")
    assert [parquet[f"a.parquet:{k + 1}"] for k in range(300)] == [folder[f"{k % 3}/{k:04d}.jpg"] for k in range(300)]


def features_metadata(**features) -> dict:
    return {b"huggingface": json.dumps({"info": {"features": features}}).encode()}


def test_what_lies_beside_the_parquet_files(tmp_path, caplog):
    """A Hub repository cloned: a banner image beside data/ converted the image alone, and a
    LICENSE.txt made the folder a text corpus (an HF walkthrough)."""
    picture = jpeg_bytes(gradient(8, 8))
    repo = tmp_path / "repo"
    write_parquet(repo / "data" / "train-00000-of-00001.parquet", [{"image": picture, "label": 0}] * 3)
    (repo / "LICENSE.txt").write_text("MIT\n")
    assert convert(repo, tmp_path / "o.lmdb", image=ImageOptions(size=8), workers=1).written == 3
    assert "1 text file (LICENSE.txt) is left out: the Parquet files' images are converted" in caplog.text
    write(repo / "assets" / "banner.png", picture)
    with pytest.raises(SourceError, match=r"holds Parquet files of images \(data/train-00000-of-00001\.parquet\) and image files "
                                          r"\(assets/banner\.png\); give the folder of the one to convert$"):
        convert(repo, tmp_path / "x.lmdb", image=ImageOptions(size=8), workers=1)


def test_a_first_file_cut_short_leaves_the_others_images(tmp_path):
    picture = jpeg_bytes(gradient(8, 8))
    src = tmp_path / "data"
    for k in range(2):
        write_parquet(src / f"train-0000{k}-of-00002.parquet", [{"image": picture, "label": k}] * 2)
    first = src / "train-00000-of-00002.parquet"
    first.write_bytes(first.read_bytes()[:100])  # a download cut short
    report = convert(src, tmp_path / "o.lmdb", image=ImageOptions(size=8), workers=1)
    assert report.written == 2 and [s.path for s in report.skipped] == ["train-00000-of-00002.parquet"]


def test_class_names_that_differ_between_files_are_refused(tmp_path):
    picture = jpeg_bytes(gradient(8, 8))
    for k, names in enumerate((["cat", "dog"], ["dog", "cat"])):
        write_parquet(tmp_path / "d" / f"train-0000{k}-of-00002.parquet", [{"image": picture, "label": 0}],
                      features_metadata(image={"_type": "Image"}, label={"_type": "ClassLabel", "names": names}))
    with pytest.raises(SourceError, match=r"train-00001-of-00002\.parquet: its class names in column 'label' differ from "
                                          r"train-00000-of-00002\.parquet's"):
        convert(tmp_path / "d", tmp_path / "o.lmdb", image=ImageOptions(size=8), workers=1)


@pytest.mark.parametrize("names, split, rows", [
    (["data/train.parquet", "data/test.parquet"], "test", 1),
    (["train.parquet", "test.parquet"], "test", 1),
    (["data/train-00000-of-00002-3f5a9c1e2b.parquet", "data/train-00001-of-00002-77aa.parquet", "data/test-00000-of-00001-0b.parquet"],
     "train", 2),
])
def test_the_hubs_other_split_layouts(tmp_path, caplog, names, split, rows):
    picture = jpeg_bytes(gradient(8, 8))
    for name in names:
        write_parquet(tmp_path / "repo" / name, [{"image": picture, "label": 0}])
    report = convert(tmp_path / "repo", tmp_path / "o.lmdb", image=ImageOptions(size=8), workers=1)
    assert report.written == len(names) and "pass --split train" in caplog.text  # (train: the likely one)
    one = convert(tmp_path / "repo", tmp_path / "s.lmdb", image=ImageOptions(size=8), source=SourceOptions(split=split), workers=1)
    assert one.written == rows


def test_label_columns_as_users_have_them(tmp_path, caplog):
    pictures = [jpeg_bytes(gradient(8, 8, seed=i)) for i in range(3)]
    write_parquet(tmp_path / "category" / "a.parquet", [{"image": p, "category": c} for p, c in zip(pictures, "xyx")])
    write_parquet(tmp_path / "floats" / "a.parquet", [{"image": p, "label": v} for p, v in zip(pictures, [1.0, float("nan"), 40_000_000.0])])
    write_parquet(tmp_path / "lists" / "a.parquet", [{"image": p, "labels": [1, 2]} for p in pictures])
    write_parquet(tmp_path / "two" / "a.parquet", [{"image": p, "fine_label": 5, "coarse_label": 1} for p in pictures])
    meta, samples = plain_read(convert(tmp_path / "category", tmp_path / "c.lmdb", image=ImageOptions(size=8), workers=1).dst)
    assert meta["classes"] == ["x", "y"] and [label for label, _ in samples.values()] == [0, 1, 0]
    report = convert(tmp_path / "floats", tmp_path / "f.lmdb", image=ImageOptions(size=8), workers=1)
    assert [label for label, _ in plain_samples(report.dst).values()] == [1, 40_000_000] and plain_read(report.dst)[0]["classes"] == []
    assert [s.reason for s in report.skipped] == ["no label (column 'label' holds nan)"]
    assert not plain_read(convert(tmp_path / "lists", tmp_path / "l.lmdb", image=ImageOptions(size=8), workers=1).dst)[0]["labeled"]
    assert "column 'labels' holds no single labels (it is list<element: int64>), so the images convert unlabeled" in caplog.text
    assert [label for label, _ in plain_samples(convert(tmp_path / "two", tmp_path / "t.lmdb", image=ImageOptions(size=8),
                                                        workers=1).dst).values()] == [5, 5, 5]
    assert "labels from column 'fine_label'; it also has the label columns 'coarse_label' (--label-column chooses)" in caplog.text


def test_an_image_column_is_chosen_over_a_mask_and_verify_reads_the_recorded_columns(tmp_path, caplog):
    pictures = [jpeg_bytes(gradient(8, 8, seed=i)) for i in range(2)]
    masks = [jpeg_bytes(np.zeros((8, 8, 3), np.uint8)) for _ in range(2)]
    rows = [{"mask": {"bytes": m, "path": None}, "image": {"bytes": p, "path": None}, "fine_label": 1, "coarse_label": 0}
            for m, p in zip(masks, pictures)]
    src = tmp_path / "src"
    write_parquet(src / "a.parquet", rows, features_metadata(mask={"_type": "Image"}, image={"_type": "Image"}))
    write(tmp_path / "folder" / "c" / "0.jpg", pictures[0])
    write(tmp_path / "folder" / "c" / "1.jpg", pictures[1])
    convert(src, tmp_path / "o.lmdb", image=ImageOptions(size=8), source=SourceOptions(label_column="coarse_label"), workers=1)
    convert(tmp_path / "folder", tmp_path / "f.lmdb", image=ImageOptions(size=8), workers=1)
    assert [payload for _, payload in plain_samples(tmp_path / "o.lmdb").values()] == [
        payload for _, payload in plain_samples(tmp_path / "f.lmdb").values()]
    assert "converting the images of column 'image'; it also has the image columns 'mask'" in caplog.text
    checked = CliRunner().invoke(cli, ["verify", str(tmp_path / "o.lmdb"), "--source", str(src)])  # (no column options: as recorded)
    assert checked.exit_code == 0 and "2 compared with the source" in checked.output, checked.output


def test_a_save_to_disk_folder_says_how_to_convert_it(tmp_path):
    folder = tmp_path / "saved"
    folder.mkdir()
    (folder / "data-00000-of-00001.arrow").write_bytes(b"arrow")
    (folder / "state.json").write_text("{}")
    (folder / "dataset_info.json").write_text("{}")
    run = CliRunner().invoke(cli, ["convert", str(folder), str(tmp_path / "o.lmdb")])
    assert run.exit_code == 1 and "holds .arrow files, a Hugging Face dataset saved with save_to_disk: convert it from Python, " \
        "packer.convert(datasets.load_from_disk(PATH), DST, ...), or write it as Parquet files (Dataset.to_parquet)" in run.stderr, run.output


def test_without_pyarrow_parquet_files_need_it_in_one_line(hub, tmp_path, monkeypatch):
    import sys

    root, _ = hub
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # (import pyarrow raises ImportError)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    run = CliRunner().invoke(cli, ["convert", str(root / "data"), str(tmp_path / "o.lmdb")])
    assert run.exit_code == 1 and "reading Parquet needs pyarrow: pip install pyarrow" in run.stderr, run.output
    assert len(run.stderr.strip().splitlines()) == 1


def test_files_whose_columns_differ_in_type_are_refused_in_one_line(tmp_path):
    """A struct image column in one file and a binary one in the next crashed a worker (a review)."""
    picture = jpeg_bytes(gradient(8, 8))
    write_parquet(tmp_path / "d" / "a.parquet", [{"image": {"bytes": picture, "path": None}, "label": 0}])
    write_parquet(tmp_path / "d" / "b.parquet", [{"image": picture, "label": 0}])
    with pytest.raises(SourceError, match=r"b\.parquet: its column 'image' is binary, not as in a\.parquet; give a folder"):
        convert(tmp_path / "d", tmp_path / "o.lmdb", image=ImageOptions(size=8), workers=1)
    write_parquet(tmp_path / "e" / "a.parquet", [{"image": picture, "label": 0}])
    write_parquet(tmp_path / "e" / "b.parquet", [{"image": picture, "label": [0, 1]}])
    with pytest.raises(SourceError, match=r"b\.parquet: its column 'label' is list<element: int64>, not as in a\.parquet"):
        convert(tmp_path / "e", tmp_path / "p.lmdb", image=ImageOptions(size=8), workers=1)


def test_categorical_labels_nested_splits_and_audio(tmp_path):
    import pyarrow as pa

    picture = jpeg_bytes(gradient(8, 8))
    table = pa.table({"image": [picture] * 3, "label": pa.array(["b", "a", "b"]).dictionary_encode()})  # pandas' Categorical
    (tmp_path / "cat").mkdir()
    pq.write_table(table, tmp_path / "cat" / "a.parquet")
    meta, samples = plain_read(convert(tmp_path / "cat", tmp_path / "c.lmdb", image=ImageOptions(size=8), workers=1).dst)
    assert meta["classes"] == ["a", "b"] and [label for label, _ in samples.values()] == [1, 0, 1]
    for split, count in (("train", 3), ("test", 2)):
        write_parquet(tmp_path / "g" / split / "2020" / "0000.parquet", [{"image": picture, "label": 0}] * count)
    assert convert(tmp_path / "g", tmp_path / "g.lmdb", image=ImageOptions(size=8), source=SourceOptions(split="test"),
                   workers=1).written == 2
    audio = [{"audio": {"bytes": b"RIFF\x00\x00\x00\x00WAVEfmt ", "path": None}, "label": 0}]
    write_parquet(tmp_path / "audio" / "a.parquet", audio, features_metadata(audio={"_type": "Audio"}))
    from packer.sources.parquet_images import parquet_image_source

    assert parquet_image_source(tmp_path / "audio") is None  # (an Audio struct of bytes is no image column)


def test_a_worker_never_reads_a_file_replaced_since_it_was_listed(tmp_path):
    """The worker's stream of a row group was keyed by path: a file rewritten at the same path
    (a Ray worker living on into another conversion) gave the old file's bytes (a review)."""
    from packer.sources.parquet_rows import read_row_image

    pictures = [jpeg_bytes(gradient(8, 8, seed=i)) for i in range(200)]
    path = write_parquet(tmp_path / "a.parquet", [{"image": p} for p in pictures], row_group_size=200)
    job = image_job(path, ImageOptions(size=8))
    assert read_row_image(job.items[0]) == pictures[0]
    write_parquet(path, [{"image": p} for p in reversed(pictures)], row_group_size=200)
    os.utime(path, ns=(1, 1))  # (a rewrite within the same mtime tick: the size or time differs)
    other = write_parquet(tmp_path / "b.parquet", [{"image": pictures[0]}])
    assert read_row_image(image_job(other, ImageOptions(size=8)).items[0]) == pictures[0]  # (the worker moved on to another file)
    with pytest.raises(ValueError, match=r"^the Parquet file changed since it was listed$"):
        read_row_image(job.items[150])  # (the stream opened again, on the new file: refused)
    fresh = image_job(path, ImageOptions(size=8))
    assert read_row_image(fresh.items[150]) == pictures[49] and read_row_image(fresh.items[10]) == pictures[189]
