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


def test_names_that_are_not_utf8_print_escaped_under_a_strict_utf8_terminal(tmp_path):
    """A skipped file named b'bad\\xff.jpg' (its name kept with a lone surrogate, FORMATS.md) made
    `packer info` and `packer verify --source` end in a UnicodeEncodeError traceback wherever
    stdout encodes strictly (an ordinary en_US.UTF-8 terminal; a plain-library walkthrough)."""
    import os
    import subprocess
    import sys

    src = tmp_path / "flat"
    src.mkdir()
    for i in range(3):
        Image.new("RGB", (8, 8), (i, 0, 0)).save(src / f"ok{i}.png")
    open(os.fsencode(src) + b"/bad\xff.jpg", "wb").close()  # empty: skipped, and recorded by its name
    dst = tmp_path / "out.blob"
    env = {**os.environ, "PYTHONIOENCODING": "utf-8:strict"}
    run = lambda *args: subprocess.run([sys.executable, "-m", "packer", *args], capture_output=True, text=True, env=env, errors="replace")  # noqa: E731
    assert run("convert", str(src), str(dst), "-q").returncode == 0
    shown = run("info", str(dst))
    assert shown.returncode == 0, shown.stderr
    assert "bad\\udcff.jpg" in shown.stdout and "Traceback" not in shown.stderr
    Image.new("RGB", (8, 8), (9, 9, 9)).save(src / "ok0.png")  # changed since: verify --source names it
    os.rename(os.fsencode(src / "ok1.png"), os.fsencode(src) + b"/ok1\xfe.png")  # and one gone, one new, not UTF-8
    checked = run("verify", str(dst), "--source", str(src))
    assert "Traceback" not in checked.stderr, checked.stderr
    assert "ok1\\udcfe.png" in checked.stdout + checked.stderr
