"""Integer labels without class names (a label file of integers, a WebDataset source's ``.cls``):
``packer info`` calls such a dataset labelled, and every format reads them back as stored."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from packer.cli import cli
from packer.info import describe
from readers import open_dataset
from readers.schema import Metadata

from conftest import SUFFIX, cached_conversions

LABELS = [0, 2, 4, 2, 0, 4]  # the largest is 4: five classes, two of them without samples


def classes_row(meta: Metadata, tmp_path: Path) -> str:
    text = describe(tmp_path, meta)
    return next(line for line in text.splitlines() if line.strip().startswith("classes"))


def test_info_calls_integer_labels_labelled(tmp_path):
    meta = Metadata(format="blob", count=6, channels=3, shape=(3, 8, 8), classes=(), labeled=True)
    row = classes_row(meta, tmp_path)
    assert "unlabeled" not in row and "integer labels without names (each label is its own class index)" in row


def test_info_names_classes_and_unlabeled_as_before(tmp_path):
    named = Metadata(format="blob", count=6, channels=3, shape=(3, 8, 8), classes=tuple(f"c{i}" for i in range(25)))
    assert classes_row(named, tmp_path).endswith("25: c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13, c14, c15, c16, c17, c18, c19, ... (5 more)")
    unlabeled = Metadata(format="blob", count=6, channels=3, shape=(3, 8, 8), labeled=False)
    assert classes_row(unlabeled, tmp_path).endswith("none (unlabeled)")


@pytest.fixture(scope="module")
def integer_packed(tmp_path_factory: pytest.TempPathFactory):
    """``fmt -> path``: six 8x8 images labelled LABELS (a Python dataset: integers, no names)."""
    rng = np.random.default_rng(0)
    samples = [(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8), label) for label in LABELS]
    return cached_conversions(samples, tmp_path_factory, "ints", 8)


@pytest.mark.parametrize("fmt", sorted(SUFFIX))
def test_integer_labels_read_back_as_stored(integer_packed, fmt):
    ds = open_dataset(integer_packed(fmt))
    assert ds.meta.labeled and ds.classes == []
    assert [ds[i][1] for i in range(len(ds))] == LABELS
    assert "classes=unnamed" in repr(ds)


def test_cli_label_file_and_shard_cls_source_are_described_as_labelled(integer_packed, tmp_path):
    """The tester's repro (a CSV of integer labels via --labels), and shards' ``.cls`` as a source."""
    src = tmp_path / "lab"
    src.mkdir()
    for i in range(len(LABELS)):
        Image.fromarray(np.full((10, 12, 3), 40 * i, np.uint8)).save(src / f"img{i}.png")
    (tmp_path / "lab.csv").write_text("path,label\n" + "".join(f"img{i}.png,{label}\n" for i, label in enumerate(LABELS)))
    runner = CliRunner()
    for source, dst, extra in [
        (src, tmp_path / "ilab.blob", ["--labels", str(tmp_path / "lab.csv")]),
        (integer_packed("webdataset"), tmp_path / "from-shards.blob", []),
    ]:
        made = runner.invoke(cli, ["convert", str(source), str(dst), "--size", "8", "-j", "1", "-q", *extra])
        assert made.exit_code == 0, made.output
        info = runner.invoke(cli, ["info", str(dst)])
        assert info.exit_code == 0 and "integer labels without names" in info.stdout and "unlabeled" not in info.stdout
        assert sorted({label for _, label in open_dataset(dst)}) == [0, 2, 4]
