"""--labels FILE: a flat folder (or archive) plus a CSV/TSV/JSON/JSONL gives what the class folder gives.

Outputs are compared with the class-folder conversion through the lmdb library itself: every
sample key and value (label header and pixels), and the metadata's classes.
"""

from __future__ import annotations

import csv
import json
import shutil
import zipfile
from pathlib import Path

import lmdb
import pytest
from click.testing import CliRunner

from packer.cli import cli
from readers.formats.lmdb import SOURCES_KEY


def lmdb_samples(path: Path) -> tuple[dict[bytes, bytes], dict]:
    """Every sample key -> value, and the metadata record, read with lmdb itself."""
    env = lmdb.open(str(path), readonly=True, lock=False, subdir=path.is_dir())
    try:
        with env.begin() as txn:
            rows = dict(txn.cursor())
    finally:
        env.close()
    meta = json.loads(rows.pop(b"__meta__"))
    rows.pop(b"__crc32__", None)
    rows.pop(SOURCES_KEY, None)  # each sample's source name: a file's path, an archive member's, dataset[i]
    return rows, meta


def run(*args: str) -> object:
    return CliRunner().invoke(cli, ["convert", *map(str, args), "--size", "16", "-j", "1", "-q"])


@pytest.fixture(scope="module")
def flat(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tuple[str, str]]]:
    """The class folder's images in one flat folder (renamed CLASS_NAME), and (file, class) pairs."""
    root = tmp_path_factory.mktemp("flat") / "images"
    root.mkdir()
    pairs = []
    for path in sorted(image_folder.rglob("*.jpg")):
        name = f"{path.parent.name}_{path.name}"
        shutil.copy(path, root / name)
        pairs.append((name, path.parent.name))
    return root, pairs


@pytest.fixture(scope="module")
def reference(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[bytes, bytes], dict]:
    dst = tmp_path_factory.mktemp("ref") / "ref.lmdb"
    assert run(image_folder, dst).exit_code == 0
    return lmdb_samples(dst)


def write_labels(path: Path, rows: list[dict]) -> Path:
    """``rows`` in the format of ``path``'s suffix."""
    if path.suffix in (".csv", ".tsv"):
        with open(path, "w", newline="") as handle:
            writer = csv.DictWriter(handle, list(rows[0]), delimiter="," if path.suffix == ".csv" else "\t")
            writer.writeheader()
            writer.writerows(rows)
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    else:
        path.write_text(json.dumps(rows))
    return path


def test_csv_with_a_missing_file_a_duplicate_and_an_unknown_label_gives_the_class_folder(flat, reference, tmp_path):
    root, pairs = flat
    rows = [{"filename": name, "class": label} for name, label in reversed(pairs)]  # row order does not matter
    rows.insert(2, {"filename": "not_there.jpg", "class": "class_00"})
    rows.append({"filename": pairs[0][0], "class": "class_02"})  # listed again with another label: the first row wins
    rows.append({"filename": "unlabeled.jpg", "class": ""})
    shutil.copy(root / pairs[0][0], root.parent / "unlabeled.jpg")
    labels = write_labels(tmp_path / "train.csv", rows)
    dst = tmp_path / "out.lmdb"
    result = run(root, dst, "--labels", labels)
    assert result.exit_code == 0, result.output
    samples, meta = lmdb_samples(dst)
    ref_samples, ref_meta = reference
    assert samples == ref_samples
    assert meta["classes"] == ref_meta["classes"] == ["class_00", "class_01", "class_02"]
    reasons = {entry["path"]: entry["reason"] for entry in meta["skipped"]}
    assert set(reasons) == {"not_there.jpg", pairs[0][0], "unlabeled.jpg"}
    assert reasons["not_there.jpg"].startswith("no such image in")
    assert "listed again at train.csv:" in reasons[pairs[0][0]]
    assert reasons["unlabeled.jpg"].startswith("no 'class' value")


@pytest.mark.parametrize("suffix", [".tsv", ".json", ".jsonl"])
def test_every_label_format_reads_alike(flat, reference, tmp_path, suffix):
    root, pairs = flat
    labels = write_labels(tmp_path / f"labels{suffix}", [{"path": name, "label": label} for name, label in pairs])
    dst = tmp_path / "out.lmdb"
    assert run(root, dst, "--labels", labels).exit_code == 0
    assert lmdb_samples(dst)[0] == reference[0]


def test_integer_labels_ids_without_extension_and_a_split(flat, tmp_path):
    root, pairs = flat
    rows = [{"id": Path(name).stem, "target": str(int(label[-1]) * 2), "fold": "val" if i % 3 == 0 else "train"}
            for i, (name, label) in enumerate(pairs)]
    rows[3]["target"] = "-1"  # an unknown label (not a class index), in the val split
    labels = write_labels(tmp_path / "labels.csv", rows)
    dst = tmp_path / "val.lmdb"
    result = run(root, dst, "--labels", labels, "--split-column", "fold", "--split", "val")
    assert result.exit_code == 0, result.output
    samples, meta = lmdb_samples(dst)
    wanted = sorted((int(r["target"]), r["id"]) for r in rows if r["fold"] == "val" and r["target"] != "-1")
    assert len(samples) == len(wanted)
    got = [int.from_bytes(value[:4], "little", signed=True) for _, value in sorted(samples.items())]
    assert got == [label for label, _ in wanted]
    assert meta["classes"] == [] and meta["labeled"] is True
    assert [s["reason"][:16] for s in meta["skipped"]] == ["unknown label -1"]


def test_columns_match_their_aliases_without_underscores(flat, reference, tmp_path):
    """Kaggle's ImageId was not taken for image_id (a walkthrough): case, '_', '-' and spaces aside."""
    root, pairs = flat
    labels = write_labels(tmp_path / "labels.csv", [{"ImageId": name, "Class-Name": label} for name, label in pairs])
    result = run(root, tmp_path / "k.lmdb", "--labels", labels)
    assert result.exit_code == 0, result.output
    assert lmdb_samples(tmp_path / "k.lmdb")[1]["classes"] == reference[1]["classes"]


def test_only_images_no_row_names_are_called_unlisted(flat, tmp_path):
    """With --split, the images of the other splits are left out as asked, not reported as
    missing from the file (they were: '15 images ... are not in all.csv'); an image no row names is."""
    root, pairs = flat
    rows = [{"image": name, "label": label, "split": "val" if i % 3 == 0 else "train"} for i, (name, label) in enumerate(pairs[:-1])]
    labels = write_labels(tmp_path / "all.csv", rows)
    result = CliRunner().invoke(cli, ["convert", str(root), str(tmp_path / "val.lmdb"), "--labels", str(labels), "--split", "val",
                                      "--size", "16", "-j", "1"])
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if "not in" in line]
    assert len(warnings) == 1 and f"1 image in {root} is not in" in warnings[0], result.stderr


def test_a_flat_zip_with_a_label_file(flat, reference, tmp_path):
    root, pairs = flat
    archive = tmp_path / "train.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, _ in pairs:
            zf.write(root / name, f"train/{name}")  # one top folder: label paths are relative to it
    labels = write_labels(tmp_path / "train.csv", [{"image": name, "label": label} for name, label in pairs])
    dst = tmp_path / "out.lmdb"
    result = run(archive, dst, "--labels", labels)
    assert result.exit_code == 0, result.output
    samples, meta = lmdb_samples(dst)
    assert samples == reference[0] and meta["classes"] == reference[1]["classes"]


def test_bad_label_options_are_one_line_errors(flat, tmp_path):
    root, pairs = flat
    labels = write_labels(tmp_path / "l.csv", [{"file": name, "what": label} for name, label in pairs])
    result = run(root, tmp_path / "a.lmdb", "--labels", labels)
    assert result.exit_code == 2 and "no label column" in result.output and "--label-column" in result.output
    result = run(root, tmp_path / "b.lmdb", "--labels", labels, "--label-column", "nope")
    assert result.exit_code == 2 and "--label-column nope: " in result.output
    result = run(root, tmp_path / "c.lmdb", "--path-column", "file")
    assert result.exit_code == 2 and "--path-column: applies with --labels only" in result.output
    result = run(root, tmp_path / "d.lmdb", "--labels", labels, "--label-column", "what", "--split", "val")
    assert result.exit_code == 2 and "no split column" in result.output
    result = run(root, tmp_path / "e.lmdb", "--labels", tmp_path / "l.xlsx")
    assert result.exit_code == 2 and "cannot tell the format" in result.output
    assert not any(tmp_path.glob("*.lmdb"))


def test_a_csv_separated_by_semicolons_says_so(flat, tmp_path):
    """'no path column (... it has: file;label); pass --path-column NAME', which could not help (a newcomer walkthrough)."""
    root, pairs = flat
    labels = tmp_path / "semi.csv"
    labels.write_text("file;label\n" + "".join(f"{name};{cls}\n" for name, cls in pairs))
    result = CliRunner().invoke(cli, ["convert", str(root), str(tmp_path / "o.blob"), "--labels", str(labels), "--size", "8"])
    assert result.exit_code != 0
    assert "its columns are separated by ';' (file;label); packer reads a .csv by commas and a .tsv by tabs" in result.output, result.output


def _label_table(tmp_path, text):
    from packer.options import SourceOptions
    from packer.sources.labels import read_label_rows

    (tmp_path / "l.csv").write_text(text)
    return read_label_rows(SourceOptions(labels=str(tmp_path / "l.csv")))


def test_a_fractional_label_makes_every_label_a_name(tmp_path):
    """1.5 is no class index: every label is then a class name (a mutation sweep)."""
    table = _label_table(tmp_path, "path,label\nz.jpg,1.5\ny.jpg,2\nx.jpg,3.0\n")
    assert table.classes == ["1.5", "2", "3.0"]


def test_label_file_samples_are_ordered_by_label_then_path(tmp_path):
    """Paths whose order disagrees with their labels (a mutation sweep: the fixture's names sorted as their labels)."""
    from packer.sources.labels import match_rows

    table = _label_table(tmp_path, "path,label\na.jpg,1\nb.jpg,0\nc.jpg,0\n")
    matched = match_rows(table, {"a.jpg": "A", "b.jpg": "B", "c.jpg": "C"}, lambda item, label: (item, label), "src")
    assert matched.items == [("B", 0), ("C", 0), ("A", 1)]


def test_the_largest_label_is_kept_one_more_is_skipped(tmp_path):
    """Both sides of MAX_LABEL (a mutation sweep)."""
    from readers.schema import MAX_LABEL

    table = _label_table(tmp_path, f"path,label\na.jpg,{MAX_LABEL}\nb.jpg,{MAX_LABEL + 1}\n")
    assert [(r.path, r.label) for r in table.rows] == [("a.jpg", MAX_LABEL)]
    assert [s.path for s in table.skipped] == ["b.jpg"]
