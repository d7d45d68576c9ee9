"""verify --source of a text dataset whose tokenizer file moved: it said 'cannot redo the
recorded tokenisation: ... tokenizer file not found (pass ... a tokenizer.json)' as a dataset
fault (exit 1), and verify had no option to pass one (an LLM-pretraining user's walkthrough)."""

from __future__ import annotations

import shutil

from click.testing import CliRunner

from packer import convert
from packer.cli import cli
from packer.options import TextOptions


def tokenizer_file(path, words):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["[UNK]", "</s>", *words])}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(["</s>"])
    tokenizer.save(str(path))
    return path


def test_a_moved_tokenizer_is_passed_with_tokenizer(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("the cat sat\n")
    moved = tokenizer_file(tmp_path / "tok.json", ["the", "cat", "sat"])
    convert(corpus, tmp_path / "t.blob", text=TextOptions(tokenizer=str(moved)), workers=1)
    kept = shutil.copy(moved, tmp_path / "kept.json")
    moved.unlink()
    run = CliRunner().invoke(cli, ["verify", str(tmp_path / "t.blob"), "--source", str(corpus)])
    assert run.exit_code == 2 and run.stderr.strip() == (
        f"Error: {tmp_path / 't.blob'}: its tokenizer {moved} is gone (moved?); pass the same file with --tokenizer FILE"), run.output
    run = CliRunner().invoke(cli, ["verify", str(tmp_path / "t.blob"), "--source", str(corpus), "--tokenizer", str(kept)])
    assert run.exit_code == 0 and "1 compared with the source" in run.output, run.output
    other = tokenizer_file(tmp_path / "other.json", ["sat", "cat", "the"])
    run = CliRunner().invoke(cli, ["verify", str(tmp_path / "t.blob"), "--source", str(corpus), "--tokenizer", str(other)])
    assert run.exit_code == 1 and "is not the file the conversion used (its sha256 differs)" in run.output, run.output
    run = CliRunner().invoke(cli, ["verify", str(tmp_path / "t.blob"), "--tokenizer", str(kept)])
    assert run.exit_code == 2 and "--tokenizer: only with --source" in run.stderr
