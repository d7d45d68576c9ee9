"""``packer preview`` on a text dataset prints its first documents; the options that only draw a
contact sheet (``-o``, ``--seed``, ``--tile``) are refused in one line (exit 2, as other option
errors), never dropped: ``-o p.png`` exited 0 and wrote nothing. ``--count`` is used."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

import packer
from packer.cli import cli
from packer.preview import SHEET_OPTIONS, document_preview
from corpora import write_texts

TEXTS = {"a.txt": "first document\n", "b.txt": "second document\n", "c.txt": "third document\n", "d.txt": "fourth document\n"}


@pytest.fixture(scope="module")
def corpus_blob(tmp_path_factory) -> Path:
    src = write_texts(tmp_path_factory.mktemp("txt"), TEXTS)
    dst = tmp_path_factory.mktemp("blob") / "corpus.blob"
    packer.convert(src, dst, workers=1)
    return dst


@pytest.mark.parametrize(
    "args, named",
    [
        (["-o", "{out}", "--tile", "50"], "-o/--output, --tile"),
        (["--output", "{out}"], "-o/--output"),
        (["--tile", "50"], "--tile"),
        (["--seed", "1"], "--seed"),
        (["--seed", "0", "-n", "2"], "--seed"),  # the default value, given: still refused
    ],
)
def test_sheet_options_on_a_text_dataset_are_refused_in_one_line(corpus_blob: Path, tmp_path: Path, args, named: str) -> None:
    out = tmp_path / "p.png"
    result = CliRunner().invoke(cli, ["preview", str(corpus_blob), *[a.format(out=out) for a in args]])
    assert result.exit_code == 2, result.output
    assert result.stdout == "" and result.stderr.count("\n") == 1 and "Traceback" not in result.output
    assert result.stderr.startswith(f"Error: {named}: {corpus_blob} is a text dataset, with no images to draw; "), result.stderr
    assert "--count: how many" in result.stderr
    assert not out.exists()


def test_a_text_dataset_preview_uses_count_and_writes_no_file(corpus_blob: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # -o's default, preview.png, would land here
    plain = CliRunner().invoke(cli, ["preview", str(corpus_blob)])
    assert plain.exit_code == 0 and plain.output == document_preview(corpus_blob, count=3) + "\n"
    two = CliRunner().invoke(cli, ["preview", str(corpus_blob), "--count", "2"])
    assert two.exit_code == 0 and two.output == document_preview(corpus_blob, count=2) + "\n"
    assert list(tmp_path.iterdir()) == []


def test_every_preview_option_is_used_or_refused_for_text() -> None:
    """Each option of the command either serves a text dataset (--count) or is in SHEET_OPTIONS."""
    names = {param.name for param in cli.commands["preview"].params} - {"path"}
    assert names - set(SHEET_OPTIONS) == {"count"}


def test_an_image_dataset_still_takes_the_sheet_options(lmdb_32: Path, tmp_path: Path) -> None:
    out = tmp_path / "grid.png"
    result = CliRunner().invoke(cli, ["preview", str(lmdb_32), "-o", str(out), "--tile", "50", "--seed", "1", "-n", "4"])
    assert result.exit_code == 0 and result.output == f"wrote {out}\n"
    from PIL import Image

    with Image.open(out) as sheet:
        assert sheet.size == (2 * 54 + 4, 2 * (50 + 14 + 4) + 4)


def test_head_cuts_a_long_document_and_says_how_much_is_left(tmp_path: Path) -> None:
    """A 5 MB document was printed whole (a walkthrough): each is cut after --chars characters
    (2,000 by default), with a line giving the rest; --chars 0 prints it whole."""
    src = write_texts(tmp_path, {"book.txt": "x" * 5000 + "END", "short.txt": "short one"})
    dst = tmp_path.parent / f"{tmp_path.name}-book.blob"
    packer.convert(src, dst, workers=1)
    result = CliRunner().invoke(cli, ["head", str(dst)])
    assert result.exit_code == 0, result.output
    assert "x" * 2000 + "\n[... 3,003 more characters; --chars 0 prints whole documents]" in result.output  # (its EOS was counted too)
    assert "END" not in result.output and "short one" in result.output
    whole = CliRunner().invoke(cli, ["head", str(dst), "--chars", "0"])
    assert "x" * 5000 + "END" in whole.output and "more characters" not in whole.output


def test_head_names_a_missing_tokenizer_file(corpus_blob: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["head", str(corpus_blob), "--tokenizer", str(tmp_path / "nope.json")])
    assert result.exit_code == 2 and result.stderr.startswith(f"Error: --tokenizer {tmp_path / 'nope.json'}: no such file"), result.output
