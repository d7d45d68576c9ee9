"""Archives that are damaged, cut short or laid out unusually (a walkthrough of archive sources):
one line for what cannot be read, a warning for what may be cut short or mislabelled, and label
files that name members as the user wrote them. Read back with lmdb itself."""

from __future__ import annotations

import tarfile
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from packer.cli import cli
from packer.sources import archives
from test_archives import class_files, tar_bytes
from test_labels import flat, lmdb_samples, reference, run, write_labels  # noqa: F401 - flat and reference are fixtures


def convert(src: Path, dst: Path, *more: str):
    return CliRunner().invoke(cli, ["convert", str(src), str(dst), "--size", "16", "-j", "2", *map(str, more)])


def one_line_error(result, *words: str) -> None:
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and all(w in lines[0] for w in words), result.output


@pytest.fixture(scope="module")
def train_tar(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tar") / "train.tar"
    path.write_bytes(tar_bytes([(f"train/{name}", data) for name, data in sorted(class_files(image_folder))]))
    return path


def test_damaged_tars_are_one_line_errors(train_tar, image_folder, tmp_path, monkeypatch):
    """A truncated tar, garbage named .tar and a zip named .tar ended in a BufferError traceback
    (the error's traceback held a slice of the memory map)."""
    data = train_tar.read_bytes()
    cut = tmp_path / "cut.tar"
    cut.write_bytes(data[: len(data) // 2 + 100])
    one_line_error(convert(cut, tmp_path / "a.lmdb"), "cannot read the archive", "truncated")
    garbage = tmp_path / "garbage.tar"
    garbage.write_bytes(bytes(range(256)) * 8)
    one_line_error(convert(garbage, tmp_path / "b.lmdb"), "cannot read the archive")
    zipped = tmp_path / "zipped.tar"
    with zipfile.ZipFile(zipped, "w") as zf:
        zf.writestr("class_00/a.jpg", data[:4000])
    one_line_error(convert(zipped, tmp_path / "c.lmdb"), "cannot read the archive")

    monkeypatch.setattr(archives, "PARALLEL_LISTING", 1)  # the inner archives listed by a pool
    inner = [(f"n{i:02d}.tar", tar_bytes([(f"x{i}.jpg", data[:3000])])) for i in range(4)]
    inner[2] = (inner[2][0], inner[2][1][:1500])  # cut inside its member
    one_line_error(convert(_tar(tmp_path / "tot.tar", inner), tmp_path / "d.lmdb"), "cannot read its inner archive n02.tar", "truncated")

    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "s-000.tar").write_bytes(tar_bytes([("k0.jpg", data[:3000]), ("k0.cls", b"0")])[:1000])
    one_line_error(convert(shards, tmp_path / "e.lmdb"), "cannot read the shard", "truncated")


def _tar(path: Path, files: list[tuple[str, bytes]]) -> Path:
    path.write_bytes(tar_bytes(files))
    return path


def test_a_tar_cut_in_a_members_padding_is_refused_as_tarfile_refuses_it(train_tar, tmp_path):
    """Cut after a member's bytes but inside its padding: it converted the members before it,
    whole classes missing, without a word."""
    with tarfile.open(train_tar) as tar:
        member = [m for m in tar.getmembers() if m.isfile()][5]
    cut = tmp_path / "padding.tar"
    cut.write_bytes(train_tar.read_bytes()[: member.offset_data + member.size + 10])
    with pytest.raises(tarfile.ReadError), tarfile.open(cut) as tar:  # the library's own answer
        tar.getmembers()
    one_line_error(convert(cut, tmp_path / "p.lmdb"), "cannot read the archive", "truncated")


def test_a_tar_cut_at_a_members_end_converts_with_a_warning(train_tar, tmp_path):
    """Cut exactly where a header would start, nothing says it is short (tarfile lists the
    members before the cut): converted, and a warning says it may have been cut."""
    with tarfile.open(train_tar) as tar:
        member = [m for m in tar.getmembers() if m.isfile()][5]
    end = member.offset_data + member.size + (-member.size % 512)
    cut = tmp_path / "boundary.tar"
    cut.write_bytes(train_tar.read_bytes()[:end])
    with tarfile.open(cut) as tar:
        listed = [m.name for m in tar.getmembers() if m.isfile()]
    result = convert(cut, tmp_path / "b.lmdb")
    assert result.exit_code == 0, result.output
    assert "ends without the two zero blocks that end a tar, so it may have been cut short" in result.stderr
    samples, meta = lmdb_samples(tmp_path / "b.lmdb")
    assert len(samples) == len(listed) == 6
    whole = convert(train_tar, tmp_path / "w.lmdb")
    assert whole.exit_code == 0 and "cut short" not in whole.stderr


def test_label_paths_relative_to_the_archive_or_its_top_folder(flat, reference, tmp_path):  # noqa: F811
    """`tar cf val.tar val` and a file naming val/x.png: it said 'no images found in the archive'."""
    root, pairs = flat
    archive = _tar(tmp_path / "val.tar", [(f"val/{name}", (root / name).read_bytes()) for name, _ in pairs])
    for prefix in ("val/", ""):
        labels = write_labels(tmp_path / f"labels{len(prefix)}.csv", [{"image": prefix + name, "label": label} for name, label in pairs])
        dst = tmp_path / f"out{len(prefix)}.lmdb"
        result = run(archive, dst, "--labels", labels)
        assert result.exit_code == 0, result.output
        samples, meta = lmdb_samples(dst)
        assert samples == reference[0] and meta["classes"] == reference[1]["classes"] and meta["skipped"] == []
    labels = write_labels(tmp_path / "none.csv", [{"image": "other/" + name, "label": label} for name, label in pairs])
    one_line_error(run(archive, tmp_path / "none.lmdb", "--labels", labels), "no image of it is named by a usable row of", "none.csv")


def test_archive_images_no_row_names_are_warned_of(flat, tmp_path):  # noqa: F811
    root, pairs = flat
    archive = _tar(tmp_path / "flat.tar", [(name, (root / name).read_bytes()) for name, _ in pairs])
    labels = write_labels(tmp_path / "half.csv", [{"image": name, "label": label} for name, label in pairs[:5]])
    result = CliRunner().invoke(cli, ["convert", str(archive), str(tmp_path / "h.lmdb"), "--labels", str(labels), "--size", "16", "-j", "1"])
    assert result.exit_code == 0, result.output
    assert f"{len(pairs) - 5:,} images in {archive} are not in" in result.stderr, result.stderr


def test_an_archive_one_level_too_high_is_warned_of(image_folder, tmp_path):
    files = class_files(image_folder)
    high = _tar(tmp_path / "imagenet.tar", [(f"imagenet/train/{name}", data) for name, data in files])
    result = convert(high, tmp_path / "one.lmdb")
    assert result.exit_code == 0, result.output
    assert "every image of" in result.stderr and "is in one class folder, 'train'" in result.stderr
    assert "(class_00, class_01, class_02)" in result.stderr, result.stderr
    right = _tar(tmp_path / "train.tar", [(f"train/{name}", data) for name, data in files])
    assert "one class folder" not in convert(right, tmp_path / "three.lmdb").stderr


def test_a_tar_among_class_folders_is_a_file_not_a_tar_of_tars(image_folder, reference, tmp_path):  # noqa: F811
    """One backup.tar in a class folder made the whole archive a tar of tars: one class, 'backup'."""
    files = class_files(image_folder)
    stray = _tar(tmp_path / "mixed.tar", [*((f"train/{n}", d) for n, d in files), ("train/class_00/backup.tar", tar_bytes([("a.jpg", files[0][1])]))])
    dst = tmp_path / "mixed.lmdb"
    assert run(stray, dst).exit_code == 0
    samples, meta = lmdb_samples(dst)
    assert samples == reference[0] and meta["classes"] == reference[1]["classes"]


def test_inner_archives_that_would_share_a_class_name_are_refused(tmp_path, image_folder):
    jpeg = class_files(image_folder)[0][1]
    twice = _tar(tmp_path / "twice.tar", [("a/x.tar", tar_bytes([("1.jpg", jpeg)])), ("b/x.tar", tar_bytes([("2.jpg", jpeg)]))])
    one_line_error(convert(twice, tmp_path / "t.lmdb"), "a/x.tar and b/x.tar would both be class 'x'")


def test_label_values_pandas_floats_odd_digits_and_out_of_range(flat, tmp_path):  # noqa: F811
    """'3.0' (pandas' integers beside an empty cell) is 3, as JSON's 3.0 was; '²' made int()
    raise; a label over int32 broke LMDB's header in a traceback."""
    root, pairs = flat
    names = [name for name, _ in pairs]
    floats = write_labels(tmp_path / "floats.csv", [{"image": n, "label": f"{i % 11}.0"} for i, n in enumerate(names)])
    assert run(root, tmp_path / "f.lmdb", "--labels", floats).exit_code == 0
    as_json = write_labels(tmp_path / "floats.json", [{"image": n, "label": float(i % 11)} for i, n in enumerate(names)])
    assert run(root, tmp_path / "j.lmdb", "--labels", as_json).exit_code == 0
    (from_csv, csv_meta), (from_json, json_meta) = lmdb_samples(tmp_path / "f.lmdb"), lmdb_samples(tmp_path / "j.lmdb")
    assert from_csv == from_json and csv_meta["classes"] == json_meta["classes"] == []  # labels 0..10, no names '10.0' < '2.0'

    odd = write_labels(tmp_path / "odd.csv", [{"image": n, "label": "²" if i == 0 else str(i)} for i, n in enumerate(names)])
    result = run(root, tmp_path / "o.lmdb", "--labels", odd)
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    assert "²" in lmdb_samples(tmp_path / "o.lmdb")[1]["classes"]  # not digits: every label a name

    huge = write_labels(tmp_path / "huge.csv", [{"image": n, "label": 2**31 if i == 0 else 1} for i, n in enumerate(names)])
    for suffix in (".lmdb", ".h5"):
        result = run(root, tmp_path / f"h{suffix}", "--labels", huge)
        assert result.exit_code == 0, result.output
    skipped = lmdb_samples(tmp_path / "h.lmdb")[1]["skipped"]
    assert [(s["path"], s["reason"][:60]) for s in skipped] == [(names[0], "unknown label 2147483648 (not a class index from 0 to 2,147,")]


def test_shard_labels_of_odd_digits_are_skipped_not_raised(tmp_path, image_folder):
    jpeg = class_files(image_folder)[0][1]
    shards = tmp_path / "shards"
    shards.mkdir()
    _tar(shards / "s-000.tar", [("a.jpg", jpeg), ("a.cls", "²".encode()), ("b.jpg", jpeg), ("b.cls", b"2147483648"), ("c.jpg", jpeg), ("c.cls", b"1")])
    result = run(shards, tmp_path / "s.lmdb")
    assert result.exit_code == 0, result.output
    samples, meta = lmdb_samples(tmp_path / "s.lmdb")
    assert len(samples) == 1 and [s["path"] for s in meta["skipped"]] == ["s-000.tar/a", "s-000.tar/b"]

