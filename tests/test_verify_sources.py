"""`packer verify --source` against every SRC the command line converts: archives (.tar, .tar.gz,
.zip, a tar of tars), WebDataset shards, and a flat folder with its label file. An unchanged
source is OK; a changed, removed or added input is reported by its own name; a changed label in
the label file is reported as a label difference; a Python dataset is refused in one line."""

from __future__ import annotations

import re

import io
import shutil
import tarfile

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from packer.cli import cli
from packer.errors import OptionError
from packer.options import ImageOptions, SourceOptions, TextOptions
from packer.verify import verify
from readers.formats.blob import LABEL_DTYPE, BlobStore
from test_archives import make_archives, tar_bytes
from test_labels import flat, run, write_labels  # noqa: F401 - flat: a fixture


def verify_cli(*args: str) -> object:
    return CliRunner().invoke(cli, ["verify", *map(str, args), "-j", "1"])


def flipped(data: bytes) -> bytes:
    """The JPEG ``data`` mirrored left-right: same size, other pixels."""
    out = io.BytesIO()
    Image.open(io.BytesIO(data)).transpose(Image.Transpose.FLIP_LEFT_RIGHT).save(out, "JPEG", quality=95)
    return out.getvalue()


@pytest.mark.parametrize("kind", ["tar", "tar.gz", "zip", "tar of tars"])
def test_an_unchanged_archive_verifies_and_every_sample_is_compared(image_folder, tmp_path, kind):
    archive = make_archives(image_folder, tmp_path)[kind]
    dst = tmp_path / "out.lmdb"
    assert run(archive, dst).exit_code == 0
    result = verify_cli(dst, "--source", archive)
    assert result.exit_code == 0, result.output
    assert "18 compared with the source" in result.output


def test_integer_labels_verify_with_and_without_their_source(flat, tmp_path):
    """Labels that are all integers are stored as class indices with no class names (classes []):
    a valid dataset, which verify passed as faulty ('labeled, but lists no classes', every label
    'not a class index (0..-1)'). A negative stored label is still a fault."""
    root, pairs = flat
    csv = write_labels(tmp_path / "ints.csv", [{"file": name, "label": 2 * int(cls[-1])} for name, cls in pairs])
    dst = tmp_path / "ints.blob"
    assert run(root, dst, "--labels", csv, "--path-column", "file").exit_code == 0
    plain = CliRunner().invoke(cli, ["verify", str(dst)])
    assert plain.exit_code == 0 and "OK" in plain.output, plain.output
    against = verify_cli(dst, "--source", root, "--labels", csv, "--path-column", "file")
    assert against.exit_code == 0 and f"{len(pairs)} compared with the source" in against.output, against.output
    store = BlobStore(dst)  # one stored label made negative: the sample is a fault (its checksum too)
    offset, _ = store.header.sections["labels"]
    with open(dst, "r+b") as handle:
        handle.seek(offset)
        handle.write(np.array([-3], dtype=LABEL_DTYPE).tobytes())
    broken = CliRunner().invoke(cli, ["verify", str(dst)])
    assert broken.exit_code == 1 and "label -3 is negative in a labeled dataset" in broken.output, broken.output


def test_a_changed_and_a_removed_member_are_named(image_folder, tmp_path):
    archive = make_archives(image_folder, tmp_path)["tar"]
    dst = tmp_path / "out.lmdb"
    assert run(archive, dst).exit_code == 0
    with tarfile.open(archive) as tar:
        members = [(m.name, tar.extractfile(m).read()) for m in tar.getmembers() if m.isfile()]
    edited = [(name, flipped(data) if name == "train/class_01/img_00002.jpg" else data)
              for name, data in members if name != "train/class_02/img_00004.jpg"]
    edited.append(("train/class_00/new.jpg", members[0][1]))
    archive.write_bytes(tar_bytes(edited))
    result = verify_cli(dst, "--source", archive)
    assert result.exit_code == 1
    faults = [line for line in result.output.splitlines() if line.startswith("fault:")]
    assert len(faults) == 3, result.output
    assert any("<- train/class_01/img_00002.jpg: changed: raw pixels differ" in f for f in faults)
    assert any("removed from the source: train/class_02/img_00004.jpg is no longer among its inputs" in f for f in faults)
    assert any("source train/class_00/new.jpg: added" in f for f in faults)


def test_webdataset_shards_as_the_source(image_folder, tmp_path):
    shards = tmp_path / "shards"
    assert CliRunner().invoke(cli, ["convert", str(image_folder), str(shards), "--format", "webdataset", "--encoding", "png",
                                    "--shard-size", "5", "-j", "1", "-q"]).exit_code == 0
    dst = tmp_path / "repacked.lmdb"
    assert run(shards, dst).exit_code == 0
    result = verify_cli(dst, "--source", shards)
    assert result.exit_code == 0, result.output
    assert "18 compared with the source" in result.output


def test_a_label_file_source_verifies_with_its_options_and_names_a_changed_label(flat, tmp_path):
    root, pairs = flat
    csv = write_labels(tmp_path / "train.csv", [{"file": name, "class": cls} for name, cls in pairs])
    dst = tmp_path / "out.lmdb"
    assert run(root, dst, "--labels", csv, "--path-column", "file").exit_code == 0
    result = verify_cli(dst, "--source", root, "--labels", csv, "--path-column", "file")
    assert result.exit_code == 0, result.output
    assert f"{len(pairs)} compared with the source" in result.output

    without = verify_cli(dst, "--source", root)  # a flat folder: no class folders, so no classes
    assert without.exit_code == 1 and "has classes" in without.output
    assert "gives no labels (no class folders), the dataset has them: if they came from a labels file, pass the same --labels" in without.output

    moved = pairs[0][0]
    rows = [{"file": name, "class": "class_02" if name == moved else cls} for name, cls in pairs]
    write_labels(csv, rows)
    changed = verify_cli(dst, "--source", root, "--labels", csv, "--path-column", "file")
    assert changed.exit_code == 1
    faults = [line for line in changed.output.splitlines() if line.startswith("fault:")]
    assert len(faults) == 1 and f"<- {moved}: changed: label 0, the source gives 2" in faults[0], changed.output


@pytest.mark.parametrize("fmt, suffix", [("lmdb", ".lmdb"), ("blob", ".blob")])
def test_a_labels_file_listing_an_image_twice_verifies_unchanged(flat, tmp_path, fmt, suffix):
    """The second row of a path is recorded as skipped under that path, which verify took for a
    skipped input: "removed from the source" and "converts now" for an unchanged dataset (a data
    engineer's walkthrough). A row of a missing file is still a skipped input, and still fine."""
    root, pairs = flat
    rows = [{"file": name, "class": cls} for name, cls in pairs]
    rows += [{"file": pairs[0][0], "class": pairs[-1][1]}, {"file": "missing.jpg", "class": pairs[0][1]}]
    csv = write_labels(tmp_path / "twice.csv", rows)
    dst = tmp_path / f"out{suffix}"
    assert run(root, dst, "--labels", csv, "--path-column", "file").exit_code == 0
    result = verify_cli(dst, "--source", root, "--labels", csv, "--path-column", "file")
    assert result.exit_code == 0, result.output
    assert f"{len(pairs)} compared with the source" in result.output


def test_label_options_without_source_are_refused(lmdb_32, tmp_path):
    result = verify_cli(lmdb_32, "--labels", tmp_path / "x.csv")
    assert result.exit_code == 2
    assert "--labels: only with --source" in result.output


def test_a_python_dataset_is_refused_in_one_line(lmdb_32):
    report = verify(lmdb_32, source=[(Image.new("RGB", (8, 8)), 0)], workers=1)
    assert not report.ok and len(report.faults) == 1
    assert "not a Python dataset" in str(report.faults[0])


def test_source_options_reach_the_api(flat, tmp_path):
    root, pairs = flat
    csv = write_labels(tmp_path / "t.jsonl", [{"path": name, "label": cls} for name, cls in pairs])
    dst = tmp_path / "out.lmdb"
    assert run(root, dst, "--labels", csv).exit_code == 0
    assert verify(dst, source=root, source_options=SourceOptions(labels=str(csv)), workers=1).ok
    assert not verify(dst, source=root, workers=1).ok


def test_label_options_that_do_not_apply_are_refused(lmdb_32, image_folder):
    result = verify_cli(lmdb_32, "--source", image_folder, "--split", "val")
    assert result.exit_code != 0 and "--split: applies with --labels only" in result.output
    with pytest.raises(OptionError, match="--path-column: applies with --labels only"):
        verify(lmdb_32, source=image_folder, source_options=SourceOptions(path_column="file"))


def test_a_skipped_input_that_converts_now_is_named(image_folder, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(image_folder, src)
    (src / "class_01" / "broken.jpg").write_bytes(b"not a jpeg")
    dst = tmp_path / "out.lmdb"
    assert run(src, dst).exit_code == 0
    assert verify_cli(dst, "--source", src).exit_code == 0  # still broken: still skipped, as recorded
    shutil.copy(src / "class_01" / "img_00000.jpg", src / "class_01" / "broken.jpg")  # repaired
    result = verify_cli(dst, "--source", src)
    faults = [line for line in result.output.splitlines() if line.startswith("fault:")]
    assert result.exit_code == 1 and len(faults) == 1, result.output
    assert "source class_01/broken.jpg: skipped when converted (" in faults[0] and "converts now: not in the dataset" in faults[0]


def test_a_label_moved_to_a_class_the_dataset_lacks_says_so(flat, tmp_path):
    root, pairs = flat
    csv = write_labels(tmp_path / "train.csv", [{"path": name, "label": cls} for name, cls in pairs])
    dst = tmp_path / "out.lmdb"
    assert run(root, dst, "--labels", csv).exit_code == 0
    write_labels(csv, [{"path": name, "label": "zebra" if i == 0 else cls} for i, (name, cls) in enumerate(pairs)])
    result = verify_cli(dst, "--source", root, "--labels", csv)
    assert result.exit_code == 1
    assert f"<- {pairs[0][0]}: changed: label 0, the source gives a class the dataset does not have" in result.output
    assert not re.search(r"(?<![\w/.-])-2\b", result.output)  # no internal code (-2) for the missing class (paths like pytest-206 aside)


@pytest.mark.parametrize("image", [
    ImageOptions(), ImageOptions(size=32), ImageOptions(size=(24, 32), resize_mode="pad", grayscale=True),
    ImageOptions(size=224, resize=256, encoding="jpeg", quality=80, max_pixels=10**6), ImageOptions(resize_mode="shorter", size=64),
    ImageOptions(encoding="png"), ImageOptions(size=64, decode_device="cuda"),
])
def test_recorded_image_options_read_back_as_given(image):
    """What verify --source redoes is what the metadata recorded: one reader beside the writer
    (it was rebuilt field by field in verify_source, and dropped decode_device)."""
    assert ImageOptions.from_record(image.describe()) == image


@pytest.mark.parametrize("text", [TextOptions(), TextOptions(lines=True, max_tokens=7), TextOptions(text_field="body", eos="none")])
def test_recorded_text_options_read_back_as_given(text):
    tokenizer = {"path": "", "eos_id": None if text.eos == "none" else 256}
    back = TextOptions.from_record(text.describe(), tokenizer)
    assert (back.lines, back.text_field, back.max_tokens, back.eos == "none") == (text.lines, text.text_field, text.max_tokens, text.eos == "none")
