"""Text corpora as the Hugging Face Hub lays them out (an LLM-pretraining user's walkthrough):
train and validation files in one folder were tokenised together without a word and --split was
refused ('applies with --labels only'); a LICENSE.txt beside the data was document 0; a missing
SRC with text options was told to drop them."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from packer import convert
from packer.cli import cli
from packer.errors import OptionError
from packer.options import SourceOptions, TextOptions
from readers import TokenDataset


@pytest.fixture
def hub(tmp_path):
    data = tmp_path / "repo" / "data"
    data.mkdir(parents=True)
    for split, docs in (("train", ["one", "two", "three"]), ("validation", ["four"])):
        (data / f"{split}-00000-of-00001.jsonl").write_text("".join(f'{{"text": "{d}"}}\n' for d in docs))
    (tmp_path / "repo" / "LICENSE.txt").write_text("Open Data Commons Attribution License\n")
    return tmp_path / "repo"


def documents(path) -> list[str]:
    ds = TokenDataset(path)
    return [ds.decode(ds[i]).rstrip("\n") for i in range(len(ds))]


def test_split_picks_a_splits_files_and_several_are_said(hub, tmp_path, caplog):
    convert(hub, tmp_path / "all.blob", workers=1)
    assert documents(tmp_path / "all.blob") == ["one", "two", "three", "four"]  # (the LICENSE left out)
    assert "LICENSE.txt left out: a folder's notes, not documents" in caplog.text
    assert "its files are those of the splits train, validation, which are converted together" in caplog.text
    run = CliRunner().invoke(cli, ["convert", str(hub), str(tmp_path / "v.blob"), "--split", "validation", "-q"])
    assert run.exit_code == 0, run.output
    assert documents(tmp_path / "v.blob") == ["four"]
    checked = CliRunner().invoke(cli, ["verify", str(tmp_path / "v.blob"), "--source", str(hub)])  # (the recorded split)
    assert checked.exit_code == 0 and "1 compared with the source" in checked.output, checked.output
    # --split on a text verify: the help says it applies; it was refused as "--labels, --classes and their options"
    agreed = CliRunner().invoke(cli, ["verify", str(tmp_path / "v.blob"), "--source", str(hub), "--split", "validation"])
    assert agreed.exit_code == 0 and "1 compared with the source" in agreed.output, agreed.output
    for dataset, split, read in (("v.blob", "train", "its files of the split 'validation'"), ("all.blob", "train", "every file of its corpus")):
        other = CliRunner().invoke(cli, ["verify", str(tmp_path / dataset), "--source", str(hub), "--split", split])
        assert other.exit_code == 2 and other.stderr.strip() == (
            f"Error: --split {split}: {tmp_path / dataset} was converted from {read}, which --source reads as recorded; drop --split")
    with pytest.raises(OptionError, match=r"^--split: no file of .* is of the split 'test' \(its splits: train, validation\)$"):
        convert(hub, tmp_path / "t.blob", text=TextOptions(), source=SourceOptions(split="test"), workers=1)


def test_a_missing_src_with_text_options_is_no_such_folder(tmp_path):
    run = CliRunner().invoke(cli, ["convert", str(tmp_path / "nosuch"), str(tmp_path / "o.blob"), "--tokenizer", "bytes"])
    assert run.exit_code == 1 and run.stderr.strip() == f"Error: {tmp_path / 'nosuch'}: no such folder or file", run.output


def test_a_datasets_metadata_json_is_no_json_lines(hub, tmp_path, caplog):
    """dataset_infos.json beside a Hub corpus drew 'rename them to .jsonl' advice: it is metadata."""
    (hub / "dataset_infos.json").write_text("{}")
    convert(hub, tmp_path / "o.blob", source=SourceOptions(split="train"), workers=1)
    assert ".json" not in caplog.text.replace(".jsonl", "")


def test_a_corpus_laid_out_by_source_is_not_warned_of_as_splits(tmp_path, caplog):
    """Folders named by source (arxiv/, github/, as a pre-training mix is laid out) were warned of
    as splits converted together, with advice (--split arxiv) that drops most of the corpus (a
    text walkthrough). Folders named as splits still are; --split still picks a folder."""
    mix = tmp_path / "mix"
    for name in ("arxiv", "github", "books"):
        (mix / name).mkdir(parents=True)
        (mix / name / "part-0.jsonl").write_text(f'{{"text": "{name} doc"}}\n')
    convert(mix, tmp_path / "mix.blob", workers=1)
    assert "splits" not in caplog.text and len(documents(tmp_path / "mix.blob")) == 3
    convert(mix, tmp_path / "arxiv.blob", source=SourceOptions(split="arxiv"), workers=1)
    assert documents(tmp_path / "arxiv.blob") == ["arxiv doc"]
    (mix / "validation").mkdir()
    (mix / "validation" / "part-0.jsonl").write_text('{"text": "held out"}\n')
    convert(mix, tmp_path / "with-val.blob", workers=1)
    assert "its files are those of the splits validation and of the folders arxiv, books, github, which" in caplog.text


def test_whitespace_and_blank_line_corpora_say_what_they_are(tmp_path):
    """A whitespace-only document was 'empty document' though it has tokens, and a corpus of
    blank lines 'none of the 0 documents could be converted' with no reason (a text walkthrough)."""
    blank = tmp_path / "blank"
    blank.mkdir()
    (blank / "a.jsonl").write_text("\n\n  \n")
    with pytest.raises(Exception, match=r"blank: no documents to convert \(its files are empty or hold blank lines only\)$"):
        convert(blank, tmp_path / "b.blob", workers=1)
    spaces = tmp_path / "spaces"
    spaces.mkdir()
    (spaces / "a.txt").write_text("\n\n   \n")
    (spaces / "b.txt").write_text("hello\n")
    report = convert(spaces, tmp_path / "s.blob", workers=1)
    assert [(s.path, s.reason) for s in report.skipped] == [("a.txt", "empty document (whitespace only)")]


def test_compressed_data_under_a_plain_name_is_skipped_whole_saying_so(tmp_path):
    """Gzip data named .jsonl was read line by line: thousands of 'invalid UTF-8' skips (a text walkthrough)."""
    import gzip

    corpus = tmp_path / "c"
    corpus.mkdir()
    (corpus / "a.jsonl").write_bytes(gzip.compress(b'{"text": "hello"}\n{"text": "world"}\n' * 200))
    (corpus / "b.jsonl").write_text('{"text": "ok"}\n')
    report = convert(corpus, tmp_path / "o.blob", workers=1)
    assert [(s.path, s.reason) for s in report.skipped] == [
        ("a.jsonl", "gzip-compressed data under a plain name: name it a.jsonl.gz to have it read")]
    assert documents(tmp_path / "o.blob") == ["ok"]
