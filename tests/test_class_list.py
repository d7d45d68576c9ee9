"""--classes: a validation set holding some of the training classes numbers them as training
does (an ImageNet user's walkthrough: n01443537 was label 1 in train and 0 in a val subset,
with no word). Labels checked against the training dataset's own class names."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from packer import ImageOptions, SourceOptions, convert
from packer.cli import cli
from packer.errors import OptionError
from packer.samples import make_image_folder
from readers import open_dataset


@pytest.fixture(scope="module")
def splits(tmp_path_factory) -> Path:
    """train/ with 3 classes; val/ with 2 of them (not the first); train.lmdb converted."""
    root = tmp_path_factory.mktemp("splits")
    make_image_folder(root / "train", classes=3, per_class=2, size=(24, 24))
    every = make_image_folder(root / "all_val", classes=3, per_class=2, size=(24, 24), seed=3)
    for name in ("class_01", "class_02"):
        shutil.copytree(Path(every) / name, root / "val" / name)
    convert(root / "train", root / "train.lmdb", image=ImageOptions(size=8), workers=1)
    return root


def labels_by_name(path: Path) -> list[str]:
    dataset = open_dataset(path)
    return [dataset.classes[dataset[i][1]] for i in range(len(dataset))]


def test_a_val_subset_is_numbered_as_train(splits, tmp_path):
    train = open_dataset(splits / "train.lmdb")
    plain = tmp_path / "plain.lmdb"
    convert(splits / "val", plain, image=ImageOptions(size=8), workers=1)
    assert open_dataset(plain).classes == ["class_01", "class_02"] and open_dataset(plain)[0][1] == 0  # numbered apart
    fixed = tmp_path / "fixed.lmdb"
    convert(splits / "val", fixed, image=ImageOptions(size=8), workers=1, source=SourceOptions(classes=str(splits / "train.lmdb")))
    val = open_dataset(fixed)
    assert val.classes == train.classes == ["class_00", "class_01", "class_02"]
    assert [val[i][1] for i in range(len(val))] == [1, 1, 2, 2]
    assert labels_by_name(fixed) == labels_by_name(plain)  # the same names, other numbers


def test_a_text_file_gives_the_order(splits, tmp_path):
    listed = tmp_path / "classes.txt"
    listed.write_text("class_02\n\n class_01 \nclass_00\n", encoding="utf-8")
    out = tmp_path / "v.blob"
    result = CliRunner().invoke(cli, ["convert", str(splits / "val"), str(out), "--size", "8", "--classes", str(listed), "-q"])
    assert result.exit_code == 0, result.output
    val = open_dataset(out)
    assert val.classes == ["class_02", "class_01", "class_00"] and [val[i][1] for i in range(len(val))] == [0, 0, 1, 1]  # class order
    verified = CliRunner().invoke(cli, ["verify", str(out), "--source", str(splits / "val"), "--classes", str(listed)])
    assert verified.exit_code == 0, verified.output
    unhinted = CliRunner().invoke(cli, ["verify", str(out), "--source", str(splits / "val")])
    assert unhinted.exit_code == 1 and "pass the same --classes to verify" in unhinted.output


def test_a_class_without_samples_the_list_lacks_is_left_out_with_a_warning(splits, tmp_path, caplog):
    """An empty class folder (or a label file's class of another split) has nothing to number: a
    warning, not a refusal (a review); a damaged dataset as the list says why, not 'not UTF-8'."""
    src = tmp_path / "val"
    shutil.copytree(splits / "val", src)
    (src / "zz_empty").mkdir()
    out = tmp_path / "v.lmdb"
    convert(src, out, image=ImageOptions(size=8), workers=1, source=SourceOptions(classes=str(splits / "train.lmdb")))
    assert open_dataset(out).classes == ["class_00", "class_01", "class_02"]
    assert "SRC's class 'zz_empty', which has no samples, is not in the list: left out" in caplog.text
    damaged = tmp_path / "damaged.blob"
    convert(splits / "train", damaged, image=ImageOptions(size=8), workers=1)
    damaged.write_bytes(damaged.read_bytes()[:-10])
    with pytest.raises(OptionError, match=r"^--classes .*damaged.blob: .*(truncated|did not finish|shorter)"):
        convert(src, tmp_path / "w.lmdb", image=ImageOptions(size=8), workers=1, source=SourceOptions(classes=str(damaged)))


def test_resume_names_a_changed_class_list(splits, tmp_path):
    """--classes given, then left out on --resume: the refusal names it, where it said the source
    folder had changed (a review)."""
    from packer.jobs import image_job
    from packer.writers.fingerprint import fingerprint_difference

    def fingerprint(source: SourceOptions) -> dict:
        return image_job(splits / "val", ImageOptions(size=8), source).fingerprint("lmdb", tmp_path / "r.lmdb", {}, "skip")

    given = fingerprint(SourceOptions(classes=str(splits / "train.lmdb")))
    said = fingerprint_difference(given, fingerprint(SourceOptions()))
    assert re.search(r"classes was .*train.lmdb \(3 classes, sha256 [0-9a-f]{12}\) in the interrupted run, now not set", said), said
    assert "source folder changed" not in said
    assert fingerprint_difference(given, fingerprint(SourceOptions(classes=str(splits / "train.lmdb")))) is None


@pytest.mark.parametrize("case, message", [
    ("missing class", r"--classes .*: SRC's class 'class_00' is not among its 2 classes"),
    ("no such file", r"--classes .*nothere.txt: no such file or dataset"),
    ("twice", r"--classes .*: lists 'class_01' twice"),
    ("unlabeled dataset", r"--classes .*: that dataset records no class names"),
])
def test_a_list_that_cannot_number_src_is_one_line(splits, tmp_path, case, message):
    src, listed = splits / "train", tmp_path / "list.txt"
    if case == "missing class":
        listed.write_text("class_01\nclass_02\n", encoding="utf-8")
    elif case == "twice":
        listed.write_text("class_01\nclass_01\n", encoding="utf-8")
    elif case == "no such file":
        listed = tmp_path / "nothere.txt"
    else:
        flat = tmp_path / "flat"
        flat.mkdir()
        shutil.copy(next((splits / "train" / "class_00").iterdir()), flat / "a.jpg")
        listed = tmp_path / "unlabeled.blob"
        convert(flat, listed, image=ImageOptions(size=8), workers=1)
    result = CliRunner().invoke(cli, ["convert", str(src), str(tmp_path / "o.lmdb"), "--size", "8", "--classes", str(listed)])
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1, result.output
    assert re.search(message, result.stderr), result.stderr
    assert not (tmp_path / "o.lmdb").exists()


def test_it_does_not_apply_to_a_python_dataset_or_text(splits, tmp_path):
    with pytest.raises(OptionError, match="--classes: does not apply to a Python dataset"):
        convert([(b"", 0)], tmp_path / "p.blob", source=SourceOptions(classes=str(splits / "train.lmdb")))
    corpus = tmp_path / "c"
    corpus.mkdir()
    (corpus / "a.txt").write_text("hello\n", encoding="utf-8")
    with pytest.raises(OptionError, match="--classes: applies to images only"):
        convert(corpus, tmp_path / "t.blob", source=SourceOptions(classes=str(splits / "train.lmdb")))


def test_a_bad_list_is_refused_before_verify_checks_anything(splits, tmp_path):
    """verify --source --classes with a missing list was a fault after every sample was checked
    (a review): an OptionError first; a list of names from Python is not taken for a path."""
    from packer.verify import verify

    with pytest.raises(OptionError, match=r"--classes .*nothere.txt: no such file or dataset"):
        verify(splits / "train.lmdb", source=splits / "train", source_options=SourceOptions(classes=str(tmp_path / "nothere.txt")))
    with pytest.raises(OptionError, match=r"^--classes: a path, got list"):
        SourceOptions(classes=["class_00", "class_01"])


def test_a_webdataset_list_is_taken_by_its_shard_pattern(splits, tmp_path):
    """--classes OUT/tr-%06d.tar, the DST exactly as converted, said 'no such file or dataset'
    (packer info and verify take the pattern)."""
    pattern = tmp_path / "shards" / "tr-%06d.tar"
    (tmp_path / "shards").mkdir()
    assert CliRunner().invoke(cli, ["convert", str(splits / "train"), str(pattern), "--size", "8", "-q"]).exit_code == 0
    out = tmp_path / "v.lmdb"
    result = CliRunner().invoke(cli, ["convert", str(splits / "val"), str(out), "--size", "8", "--classes", str(pattern), "-q"])
    assert result.exit_code == 0, result.output
    assert open_dataset(out).classes == ["class_00", "class_01", "class_02"]


def test_a_split_lacking_the_last_class_keeps_every_class_of_the_list(splits, tmp_path):
    """val without the list's last class: its classes are still the list's three (the first
    classes in order looked like no renumbering, and the shortcut dropped the last; a mutation sweep)."""
    src = tmp_path / "val"
    every = make_image_folder(tmp_path / "all", classes=3, per_class=2, size=(24, 24), seed=5)
    for name in ("class_00", "class_01"):
        shutil.copytree(Path(every) / name, src / name)
    out = tmp_path / "val.lmdb"
    convert(src, out, image=ImageOptions(size=8), workers=1, source=SourceOptions(classes=str(splits / "train.lmdb")))
    assert open_dataset(out).classes == open_dataset(splits / "train.lmdb").classes == ["class_00", "class_01", "class_02"]
    assert labels_by_name(out) == ["class_00", "class_00", "class_01", "class_01"]

