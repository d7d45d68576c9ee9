"""Text corpora: tokenise, pack in every format, read back as documents and training blocks.

Round trips are checked against the tokenizer libraries themselves (``tokenizers``,
``sentencepiece``, UTF-8 bytes), never through packer's own wrapper around them, and the stored
ids are read back with each format's plain library too (tests/roundtrip_checks.py).
"""

from __future__ import annotations

import hashlib
import json
import re
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import packer
from packer.cli import cli
from packer.errors import InputError, OptionError
from packer.options import TextOptions
from readers import Loader, TokenDataset, WidenTokens
from readers.tokenizer import TokenizerError
from roundtrip_checks import check_tokens
from corpora import write_texts

#: The end-of-document token the BPE fixture is trained with.
BPE_EOS = "<|endoftext|>"

WORDS = "alpha beta gamma delta epsilon zeta theta kappa lambda omicron sigma omega".split()
TARGETS = {"lmdb": "c.lmdb", "hdf5": "c.h5", "blob": "c.blob", "webdataset": "wds"}


def _docs(n: int = 24, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 40))) + " ünï" for _ in range(n)]


@pytest.fixture(scope="module")
def bpe(tmp_path_factory) -> Path:
    """A small BPE tokenizer trained here on generated text (nothing downloaded)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(_docs(200, 1), trainers.BpeTrainer(vocab_size=120, special_tokens=["[UNK]", BPE_EOS]))
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_texts(tmp_path_factory.mktemp("corpus"), {f"doc{i:03d}.txt": text for i, text in enumerate(_docs())})


def _convert(src: Path, dst: Path, fmt: str, **text) -> packer.api.ConversionReport:
    storage = packer.options.StorageOptions(shard_size=7) if fmt == "webdataset" else None  # options of other formats are refused
    return packer.convert(src, dst, format=fmt, text=TextOptions(**text), workers=2, storage=storage)


def bytes_ids(docs: list[str]) -> list[list[int]]:
    """The ``bytes`` tokenizer's documents, from the definition: UTF-8 bytes, then EOS 256."""
    return [[*text.encode("utf-8"), 256] for text in docs]


@pytest.mark.parametrize("fmt", list(TARGETS))
def test_round_trip_every_format(fmt: str, corpus: Path, bpe: Path, tmp_path: Path) -> None:
    """Each document is the ``tokenizers`` library's encoding of it, then the tokenizer's EOS:
    read by the format's plain library (lmdb, h5py, numpy, tarfile) and by ``readers``."""
    from tokenizers import Tokenizer

    dst = tmp_path / TARGETS[fmt]
    report = _convert(corpus, dst, fmt, tokenizer=str(bpe))
    library = Tokenizer.from_file(str(bpe))
    eos = library.token_to_id(BPE_EOS)
    want = [library.encode(text).ids + [eos] for text in _docs()]
    assert eos is not None and min(map(len, want)) > 3  # documents of several tokens: dropping one shows
    check_tokens(dst, want, expect_tokenizer=bpe)
    ds = TokenDataset(dst)
    assert ds.meta.dtype == "uint16" and ds[0].dtype == torch.uint16
    assert report.written == len(want) and report.tokens == sum(map(len, want))
    assert [ds.decode(ds[i][:-1]) for i in range(len(ds))] == [library.decode(ids[:-1]) for ids in want]
    assert ds.meta.tokenizer["sha256"] == hashlib.sha256(bpe.read_bytes()).hexdigest()
    assert ds.meta.tokenizer["eos_id"] == eos and ds.meta.tokenizer["vocab_size"] == library.get_vocab_size()


def test_a_save_pretrained_folder_is_its_tokenizer_json(bpe: Path, tmp_path: Path) -> None:
    """A folder holding tokenizer.json (what save_pretrained writes) was 'tokenizer file not
    found', sending the user after a path problem (a text walkthrough)."""
    import shutil

    from readers.tokenizer import TokenizerError, load_tokenizer

    folder = tmp_path / "tok"
    folder.mkdir()
    shutil.copy(bpe, folder / "tokenizer.json")
    assert load_tokenizer(folder).identity() == load_tokenizer(bpe).identity()
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(TokenizerError, match=r"a folder without a tokenizer.json or a SentencePiece .model: pass a tokenizer file$"):
        load_tokenizer(empty)


def test_bytes_tokenizer_blocks_cover_stream(corpus: Path, tmp_path: Path) -> None:
    dst = tmp_path / "c.blob"
    _convert(corpus, dst, "blob")
    want = bytes_ids(_docs())
    check_tokens(dst, want)  # numpy on the blob, and readers
    ds = TokenDataset(dst, block_size=32)
    stream = np.concatenate(want)
    assert ds.meta.tokenizer["vocab_size"] == 257
    assert len(ds) == (len(stream) - 1) // 32
    for i in range(len(ds)):
        x, y = ds[i]
        assert x.tolist() == stream[i * 32 : i * 32 + 32].tolist() and y.tolist() == stream[i * 32 + 1 : i * 32 + 33].tolist()
    rnd = TokenDataset(dst, block_size=32, random_windows=True, seed=3)
    starts = [rnd.window_start(i) for i in range(len(rnd))]
    assert starts == [TokenDataset(dst, block_size=32, random_windows=True, seed=3).window_start(i) for i in range(len(rnd))]
    assert max(starts) + 33 <= len(stream)
    assert WidenTokens()(x).dtype == torch.int64
    with pytest.raises(TokenizerError):
        TokenDataset(dst, expect_tokenizer="0" * 64)


@pytest.mark.parametrize("fmt", ["lmdb", "webdataset"])
def test_blocks_match_blob(fmt: str, corpus: Path, tmp_path: Path) -> None:
    _convert(corpus, tmp_path / "ref.blob", "blob")
    _convert(corpus, tmp_path / TARGETS[fmt], fmt)
    ref, other = TokenDataset(tmp_path / "ref.blob", block_size=50), TokenDataset(tmp_path / TARGETS[fmt], block_size=50)
    assert len(ref) == len(other)
    for i in range(len(ref)):
        assert torch.equal(ref[i][0], other[i][0])


def test_uint32_for_large_vocab(corpus: Path, tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(WORDS)} | {"ünï": 70000, "[UNK]": 70001, "</s>": 70002}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "wl.json"
    tok.save(str(path))
    dst = tmp_path / "c.h5"
    _convert(corpus, dst, "hdf5", tokenizer=str(path))
    ds = TokenDataset(dst)
    assert ds.meta.dtype == "uint32" and ds[0].dtype == torch.uint32
    check_tokens(dst, [tok.encode(text).ids + [70002] for text in _docs()])  # h5py, and readers
    assert int(ds[0][-2]) == 70000 and int(ds[0][-1]) == 70002


def test_loader_and_dataloader_workers(corpus: Path, tmp_path: Path) -> None:
    dst = tmp_path / "c.lmdb"
    _convert(corpus, dst, "lmdb")
    ds = TokenDataset(dst, block_size=16)
    seen = 0
    for windows, starts in Loader(ds, batch_size=8, shuffle=False):
        assert windows.dtype == torch.uint16 and windows.shape[1] == 17
        for w, s in zip(windows, starts.tolist()):
            assert torch.equal(w[:-1], ds[s // 16][0])
        seen += len(windows)
    assert seen == len(ds)
    dl = torch.utils.data.DataLoader(ds, batch_size=8, num_workers=2, multiprocessing_context="fork")
    xs = torch.cat([x for x, _y in dl])
    assert torch.equal(xs, torch.stack([ds[i][0] for i in range(len(ds))]))


def test_bad_inputs_skipped_and_recorded(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "good.txt").write_text("hello world", encoding="utf-8")
    (src / "binary.txt").write_bytes(b"\x00\x01\x02binary")
    (src / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (src / "empty.txt").write_text("  \n")
    (src / "data.jsonl").write_text('{"text": "one"}\nnot json\n{"other": 1}\n{"text": "two"}\n', encoding="utf-8")
    (src / "lines.txt").write_text("", encoding="utf-8")
    report = packer.convert(src, tmp_path / "o.blob", workers=1)
    ds = TokenDataset(tmp_path / "o.blob")
    assert [ds.decode(ds[i][:-1]) for i in range(len(ds))] == ["one", "two", "hello world"]
    reasons = {s.path: s.reason for s in ds.meta.skipped}
    assert set(reasons) == {"binary.txt", "latin1.txt", "empty.txt", "lines.txt", "data.jsonl:2", "data.jsonl:3"}
    assert "binary" in reasons["binary.txt"] and "UTF-8" in reasons["latin1.txt"] and "JSON" in reasons["data.jsonl:2"]
    assert len(report.skipped) == 6
    with pytest.raises(InputError):
        packer.convert(src, tmp_path / "f.blob", workers=1, on_error="fail")


def test_cli_convert_info_head_and_errors(corpus: Path, bpe: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    dst = tmp_path / "c.blob"
    result = runner.invoke(cli, ["convert", str(corpus), str(dst), "--tokenizer", str(bpe), "-q", "-j", "1", "--max-tokens", "5"])
    assert result.exit_code == 0, result.output
    assert "tokens/s" in result.output
    assert all(len(TokenDataset(dst)[i]) <= 6 for i in range(3))
    info = runner.invoke(cli, ["info", str(dst)])
    assert "tokenizer" in info.output and "huggingface" in info.output
    head = runner.invoke(cli, ["head", str(dst), "-n", "2"])
    assert head.exit_code == 0 and head.output.count("--- document") == 2
    moved = tmp_path / "moved.json"  # the tokenizer file moved: the error says how to give it (it said only "pass the file")
    moved.write_bytes(bpe.read_bytes())
    import shutil

    shutil.move(str(bpe), str(tmp_path / "away.json"))
    try:
        lost = runner.invoke(cli, ["head", str(dst), "-n", "1"])
        assert lost.exit_code == 1 and "packer head --tokenizer PATH" in lost.output, lost.output
        assert runner.invoke(cli, ["head", str(dst), "-n", "1", "--tokenizer", str(moved)]).exit_code == 0
    finally:
        shutil.move(str(tmp_path / "away.json"), str(bpe))
    missing = runner.invoke(cli, ["convert", str(corpus), str(tmp_path / "m.blob"), "--tokenizer", str(tmp_path / "nope.json")])
    assert missing.exit_code != 0 and "nope.json" in missing.output and len(missing.output.strip().splitlines()) == 1
    lines = runner.invoke(cli, ["convert", str(corpus), str(tmp_path / "l.lmdb"), "--lines", "--eos", "none", "-q"])
    assert lines.exit_code == 0, lines.output
    assert TokenDataset(tmp_path / "l.lmdb").meta.tokenizer["eos_id"] is None
    shown = runner.invoke(cli, ["info", str(tmp_path / "l.lmdb")]).output
    assert "per document, no EOS)" in shown and "EOS included" not in shown, shown  # (it said "EOS included" of --eos none)


def test_jsonl_field(tmp_path: Path) -> None:
    src = tmp_path / "j"
    src.mkdir()
    (src / "a.jsonl").write_text("\n".join(json.dumps({"body": t}) for t in ["x y", "z"]), encoding="utf-8")
    packer.convert(src, tmp_path / "j.blob", text=TextOptions(text_field="body"), workers=1)
    ds = TokenDataset(tmp_path / "j.blob")
    assert ds.decode(ds[1]) == "z\n" and ds.meta.kind == "text"


def test_sentencepiece_model_round_trip(corpus: Path, tmp_path: Path) -> None:
    """A SentencePiece ``.model`` trained here: ids match its own encoding, its EOS ends documents
    (``sentencepiece`` is in the test extra: its absence fails, it does not skip)."""
    import sentencepiece as spm

    prefix = tmp_path / "sp"
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_docs(200, 2)), model_prefix=str(prefix), vocab_size=60, model_type="bpe",
        character_coverage=1.0, minloglevel=2,
    )
    model = Path(f"{prefix}.model")
    dst = tmp_path / "sp.lmdb"
    _convert(corpus, dst, "lmdb", tokenizer=str(model))
    processor = spm.SentencePieceProcessor(model_file=str(model))
    check_tokens(dst, [processor.encode(text) + [processor.eos_id()] for text in _docs()], expect_tokenizer=model)
    ds = TokenDataset(dst)
    assert ds.meta.tokenizer["vocab_size"] == 60 and ds.meta.dtype == "uint16"
    from readers.tokenizer import load_tokenizer  # --eos of an ordinary piece is said (test_an_eos_that_is_an_ordinary_token_is_said)

    loaded = load_tokenizer(model)
    assert [loaded.text_token(i) for i in range(60)] == [
        None if processor.IsControl(i) or processor.IsUnknown(i) else processor.IdToPiece(i) for i in range(60)]
    assert loaded.text_token(processor.eos_id()) is None and loaded.text_token(processor.unk_id()) is None
    assert loaded.bos_id == processor.bos_id() >= 0  # (--bos auto)


def test_parquet_text_column(tmp_path: Path) -> None:
    """Parquet rows are documents; a null row and a file without the column are skipped and recorded."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    src = tmp_path / "pq"
    src.mkdir()
    pq.write_table(pa.table({"body": ["first row", None, "third"]}), src / "a.parquet")
    pq.write_table(pa.table({"other": ["no body here"]}), src / "b.parquet")
    report = packer.convert(src, tmp_path / "p.blob", text=TextOptions(text_field="body"), workers=1)
    ds = TokenDataset(tmp_path / "p.blob")
    assert [ds.decode(ds[i]) for i in range(len(ds))] == ["first row\n", "third\n"]
    reasons = {entry.path: entry.reason for entry in ds.meta.skipped}
    assert reasons["a.parquet:2"] == "field 'body' is null, not a string"  # the second row: counted from 1, as lines are
    assert reasons["b.parquet"] == "no Parquet column 'body' (its columns: other); pass --text-field"
    assert report.written == 2 and len(report.skipped) == 2
    bad = tmp_path / "bad"
    bad.mkdir()
    pq.write_table(pa.table({"body": ["x"]}), bad / "c.parquet")
    (bad / "c.parquet").write_bytes((bad / "c.parquet").read_bytes()[:-40] + bytes(32) + b"PAR1")  # a broken footer
    result = CliRunner().invoke(cli, ["convert", str(bad), str(tmp_path / "q.blob"), "--text-field", "body", "-q"])
    assert result.exit_code == 1 and "c.parquet: cannot read Parquet column 'body' (" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    # two files skipped whole were "none of the 2 documents" (a text walkthrough): inputs
    for name in ("d", "e"):
        pq.write_table(pa.table({"other": ["a", "b", "c"]}), bad / f"{name}.parquet")
    (bad / "c.parquet").unlink()
    result = CliRunner().invoke(cli, ["convert", str(bad), str(tmp_path / "r.blob"), "--text-field", "body", "-q"])
    assert result.exit_code == 1 and "none of the 2 inputs could be converted (first: d.parquet: no Parquet column 'body'" in result.stderr


def test_lines_split_at_newlines_only(tmp_path: Path) -> None:
    """A JSON Lines record may hold U+2028 or a form feed unescaped (json.dumps(ensure_ascii=False)
    writes them so), and prose may too: lines end at \\n (or \\r\\n) only, as wc -l and JSON Lines
    count them. str.splitlines also split at those, losing every such record."""
    src = tmp_path / "c"
    src.mkdir()
    records = ["one\u2028line", "page\x0cbreak", "plain"]
    (src / "r.jsonl").write_text("".join(json.dumps({"text": r}, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    (src / "t.txt").write_text("line one\u2028still one\r\nline two\x0cstill two\n\nthree", encoding="utf-8")
    packer.convert(src, tmp_path / "l.blob", text=TextOptions(lines=True), workers=1)
    ds = TokenDataset(tmp_path / "l.blob")
    assert [ds.decode(ds[i]) for i in range(len(ds))] == [r + "\n" for r in records] + [
        "line one\u2028still one\n", "line two\x0cstill two\n", "three\n"]
    assert ds.meta.skipped == ()


def test_a_record_without_the_field_names_the_string_fields_it_has(tmp_path: Path) -> None:
    src = tmp_path / "c"
    src.mkdir()
    (src / "r.jsonl").write_text('{"id": 1, "content": "one", "lang": "en"}\n{"text": 5}\n', encoding="utf-8")
    with pytest.raises(InputError):
        packer.convert(src, tmp_path / "o.blob", workers=1)
    report = packer.convert(src, tmp_path / "o.blob", workers=1, text=TextOptions(text_field="content"))
    assert report.written == 1 and [(s.path, s.reason) for s in report.skipped] == [("r.jsonl:2", "no string field 'content'")]
    (src / "r.jsonl").write_text('{"id": 1, "content": "one", "lang": "en"}\n{"text": "two"}\n', encoding="utf-8")
    report = packer.convert(src, tmp_path / "t.blob", workers=1)
    assert [(s.path, s.reason) for s in report.skipped] == [
        ("r.jsonl:1", "no string field 'text' (its string fields: 'content', 'lang'; pass --text-field)")]


def test_a_line_that_is_not_utf8_is_skipped_alone(tmp_path: Path) -> None:
    """One bad byte dropped the whole file, every good line with it (an LLM user's walkthrough);
    a document a line, the line alone is skipped and recorded, as a line that is not JSON is.
    (Those files are read a line at a time, never whole.)"""
    src = tmp_path / "c"
    src.mkdir()
    (src / "r.jsonl").write_bytes(b'{"text": "one"}\n{"text": "bad \xff"}\n{"text": "two"}\n')
    (src / "t.txt").write_bytes(b"good\nbad \xff\r\nalso good\r\n")
    packer.convert(src, tmp_path / "l.blob", text=TextOptions(lines=True), workers=1)
    ds = TokenDataset(tmp_path / "l.blob")
    assert [ds.decode(ds[i]) for i in range(len(ds))] == ["one\n", "two\n", "good\n", "also good\n"]
    assert [(s.path, s.reason) for s in ds.meta.skipped] == [("r.jsonl:2", "invalid UTF-8 at byte 14 of the line"),
                                                              ("t.txt:2", "invalid UTF-8 at byte 4 of the line")]


def test_a_file_that_fails_partway_is_skipped_whole(tmp_path: Path, monkeypatch) -> None:
    """A read error after some lines (EIO on a bad sector) recorded the file as unreadable and
    converted the lines read before it anyway (a review of the line-at-a-time reading). The scan
    reads a file a block at a time: here the first block holds a line, the next read fails."""
    import builtins

    from packer.sources.text_docs import document_texts

    src = tmp_path / "c"
    src.mkdir()
    (src / "a.jsonl").write_text('{"text": "kept"}\n', encoding="utf-8")
    (src / "b.jsonl").write_text('{"text": "one"}\n{"text": "two"}\n', encoding="utf-8")
    real_open = builtins.open

    class Failing:
        def __init__(self, handle):
            self.handle, self.reads = handle, 0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

        def read(self, *args):
            self.reads += 1
            if self.reads > 1:
                raise OSError(5, "Input/output error")
            return self.handle.readline()

    monkeypatch.setattr(builtins, "open", lambda path, *a, **k: Failing(real_open(path, *a, **k)) if str(path).endswith("b.jsonl") else real_open(path, *a, **k))
    from packer.sources.text import scan_text

    corpus = scan_text(src)
    assert document_texts(corpus.docs) == ["kept"]
    assert [(s.path, s.reason) for s in corpus.skipped] == [("b.jsonl", "cannot read (Input/output error)")]


def test_text_options_no_file_uses_are_refused(tmp_path: Path) -> None:
    """--lines on a corpus without .txt files, --text-field on one without .jsonl or Parquet: each
    was dropped, and recorded in the metadata as if used."""
    jsonl, txt = tmp_path / "jsonl", tmp_path / "txt"
    jsonl.mkdir(), txt.mkdir()
    (jsonl / "r.jsonl").write_text('{"text": "a"}\n')
    (txt / "a.txt").write_text("a")
    for src, option, message in ((jsonl, ["--lines"], "--lines: applies to .txt files, and"),
                                 (txt, ["--text-field", "body"], "--text-field: applies to JSON Lines and Parquet files, and")):
        result = CliRunner().invoke(cli, ["convert", str(src), str(tmp_path / "x.blob"), *option])
        assert result.exit_code == 2 and message in result.stderr and len(result.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "x.blob").exists()
    both = tmp_path / "both"
    both.mkdir()
    (both / "a.txt").write_text("a\nb")
    (both / "r.jsonl").write_text('{"body": "c"}\n')
    report = packer.convert(both, tmp_path / "y.blob", text=TextOptions(lines=True, text_field="body"), workers=1)
    assert report.written == 3


def test_a_mixed_folder_says_what_it_leaves_out(tmp_path: Path, caplog) -> None:
    """Images and text files side by side: the kind converted is said, and the files left out."""
    from PIL import Image

    src = tmp_path / "mixed"
    src.mkdir()
    Image.new("RGB", (20, 10)).save(src / "a.jpg")
    (src / "b.txt").write_text("some text")
    (src / "c.jsonl").write_text('{"text": "c"}\n')
    assert packer.convert(src, tmp_path / "i.blob", image=packer.ImageOptions(size=8), workers=1).written == 1
    assert [r.getMessage() for r in caplog.records if "left out" in r.getMessage()] == [
        f"{src}: 2 text files (.txt, .jsonl, .ndjson, .parquet) are left out: it holds images, which are converted; "
        "to convert the text instead, pass --kind text"]
    caplog.clear()
    assert packer.convert(src, tmp_path / "t.blob", kind="text", workers=1).written == 2
    assert [r.getMessage() for r in caplog.records if "left out" in r.getMessage()] == [
        f"{src}: 1 image is left out: a text corpus converts its .txt, .jsonl, .ndjson and .parquet files only"]


def test_a_named_pipe_named_like_a_text_file_is_skipped_not_read(tmp_path: Path) -> None:
    """A FIFO called pipe.txt blocked the scan (in the driver, outside any worker's --timeout)
    forever (an LLM user's walkthrough): it is recorded as skipped, never opened."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "good.txt").write_text("hello world", encoding="utf-8")
    os.mkfifo(src / "pipe.txt")
    report = packer.convert(src, tmp_path / "o.blob", workers=1)
    assert report.written == 1
    assert [(s.path, s.reason) for s in report.skipped] == [("pipe.txt", "not a regular file (a named pipe, socket or device): not read")]


def test_special_token_text_in_a_document_is_text_not_the_eos_id(bpe: Path, tmp_path: Path) -> None:
    """``<|endoftext|>`` written in a document (code, web pages) was stored as the EOS id in the
    middle of the document, splitting it for every reader (an LLM user's walkthrough)."""
    from tokenizers import Tokenizer

    text = 'print("<|endoftext|>") alpha beta'
    (tmp_path / "src").mkdir()
    src = write_texts(tmp_path / "src", {"a.txt": text})
    packer.convert(src, tmp_path / "o.blob", text=TextOptions(tokenizer=str(bpe)), workers=1)
    ds = TokenDataset(tmp_path / "o.blob")
    reference = Tokenizer.from_file(str(bpe))
    eos = reference.token_to_id(BPE_EOS)
    [doc] = [list(map(int, ds[i])) for i in range(len(ds))]
    assert doc.count(eos) == 1 and doc[-1] == eos  # the EOS packer appends, only
    reference.encode_special_tokens = True  # the library's own switch: special tokens' text as text
    assert doc[:-1] == reference.encode(text, add_special_tokens=False).ids


def test_an_eos_name_that_is_not_a_special_token_is_not_taken(tmp_path: Path) -> None:
    """An added '<|endoftext|>' not marked special was taken as the EOS, and the text in a document
    became that id mid-document (encode_special_tokens covers special tokens only: a walkthrough)."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(_docs(50, 1), trainers.BpeTrainer(vocab_size=80, special_tokens=["[UNK]"]))
    tok.add_tokens([AddedToken(BPE_EOS, special=False)])
    path = tmp_path / "plain.json"
    tok.save(str(path))
    (tmp_path / "src").mkdir()
    src = write_texts(tmp_path / "src", {"a.txt": f"code {BPE_EOS} more"})
    with pytest.raises(OptionError, match=rf"^--eos: the tokenizer .*plain.json has no end-of-document token \('{re.escape(BPE_EOS)}' "
                                          "is an added token not marked special"):
        packer.convert(src, tmp_path / "o.blob", text=TextOptions(tokenizer=str(path)), workers=1)


def test_the_eos_token_a_tokenizer_config_names_is_taken(tmp_path: Path) -> None:
    """A save_pretrained folder's tokenizer_config.json names the model's end-of-document token;
    it was ignored for the first name of a fixed list ('<|endoftext|>' in a vocabulary whose model
    ends documents with '<|eot|>'; a walkthrough), as transformers' AutoTokenizer does not."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from readers.tokenizer import load_tokenizer

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(_docs(50, 1), trainers.BpeTrainer(vocab_size=80, special_tokens=["[UNK]", BPE_EOS, "<|eot|>"]))
    folder = tmp_path / "model"
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    assert load_tokenizer(folder).eos_id == tok.token_to_id(BPE_EOS)  # no config: the list's first
    for written in ("<|eot|>", {"content": "<|eot|>", "special": True, "__type": "AddedToken"}):
        (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": written}), encoding="utf-8")
        assert load_tokenizer(folder).eos_id == load_tokenizer(folder / "tokenizer.json").eos_id == tok.token_to_id("<|eot|>")
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|not in it|>"}), encoding="utf-8")
    assert load_tokenizer(folder).eos_id == tok.token_to_id(BPE_EOS)
    (tmp_path / "src").mkdir()
    src = write_texts(tmp_path / "src", {"a.txt": "alpha beta"})
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|eot|>"}), encoding="utf-8")
    report = packer.convert(src, tmp_path / "o.blob", text=TextOptions(tokenizer=str(folder)), workers=1)
    assert list(TokenDataset(report.dst)[0])[-1] == tok.token_to_id("<|eot|>")


def test_an_eos_that_is_an_ordinary_token_is_said(tmp_path: Path, caplog) -> None:
    """--eos 10 with the bytes tokenizer (the newline byte) was taken without a word: every line
    end then looked like a document's end (a walkthrough). A special token is taken silently."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    (tmp_path / "src").mkdir()
    src = write_texts(tmp_path / "src", {"a.txt": "alpha beta"})
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(_docs(50, 1), trainers.BpeTrainer(vocab_size=80, special_tokens=["[UNK]", BPE_EOS]))
    tok.save(str(tmp_path / "t.json"))
    word = next(i for t, i in tok.get_vocab().items() if t.isalpha() and len(t) > 1)
    cases = [("bytes", 10, "--eos 10 is an ordinary token of the tokenizer (the text '\\n')"), ("bytes", 256, None),
             (str(tmp_path / "t.json"), word, f"the text {tok.id_to_token(word)!r}"), (str(tmp_path / "t.json"), tok.token_to_id(BPE_EOS), None)]
    for n, (spec, eos, said) in enumerate(cases):
        caplog.clear()
        packer.convert(src, tmp_path / f"o{n}.blob", text=TextOptions(tokenizer=spec, eos=eos), workers=1)
        warned = [r.getMessage() for r in caplog.records if "is an ordinary token" in r.getMessage()]
        assert (warned == [] if said is None else len(warned) == 1 and said in warned[0]), (spec, eos, warned)


def test_an_expected_tokenizer_of_another_kind_is_named_plainly(bpe: Path, corpus: Path, tmp_path: Path) -> None:
    """expect_tokenizer='bytes' over a BPE dataset said 'not bytes (sha256 bytes)' (a walkthrough)."""
    dst = _convert(corpus, tmp_path / "b.blob", "blob", tokenizer=str(bpe)).dst
    with pytest.raises(TokenizerError, match=r"huggingface tokenizer 'tokenizer.json' \(sha256 [0-9a-f]{64}\), not the bytes tokenizer: use the tokenizer"):
        TokenDataset(dst, expect_tokenizer="bytes")
    other = tmp_path / "other.json"
    other.write_text("{}")
    digest = hashlib.sha256(b"{}").hexdigest()
    with pytest.raises(TokenizerError, match=rf"not {re.escape(str(other))} \(sha256 {digest}\): use"):
        TokenDataset(dst, expect_tokenizer=other)


def test_bos_puts_the_tokenizers_own_or_a_given_id_before_every_document(corpus: Path, tmp_path: Path, caplog) -> None:
    """--bos (Llama-style pretraining puts <s> first; only an EOS could be stored: a walkthrough):
    'auto' takes the tokenizer's own (its tokenizer_config.json's bos_token, else a special <s>),
    --max-tokens still counts the text's ids only, verify checks it, head does not print it."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from packer.verify import verify

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(_docs(200, 1), trainers.BpeTrainer(vocab_size=120, special_tokens=["[UNK]", "<s>", BPE_EOS]))
    folder = tmp_path / "model"
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id(BPE_EOS)
    want = [[bos, *tok.encode(text, add_special_tokens=False).ids, eos] for text in _docs()]
    dst = tmp_path / "b.lmdb"
    done = CliRunner().invoke(cli, ["convert", str(corpus), str(dst), "--tokenizer", str(folder), "--bos", "auto", "-q"])
    assert done.exit_code == 0, done.output
    check_tokens(dst, want)  # the plain lmdb library's view, and TokenDataset's
    assert TokenDataset(dst).meta.tokenizer["bos_id"] == bos and TokenDataset(dst).meta.preprocessing["bos"] == "auto"
    report = verify(dst, source=corpus)
    assert report.ok and report.compared == len(want), report.faults
    info = CliRunner().invoke(cli, ["info", str(dst)])
    assert "EOS included, BOS too)" in info.output and f"eos {eos}, bos {bos}" in info.output, info.output
    head = CliRunner().invoke(cli, ["head", str(dst), "-n", "1"])
    assert head.exit_code == 0 and "<s>" not in head.output and tok.decode(want[0][1:-1]) in head.output
    short = packer.convert(corpus, tmp_path / "s.blob", text=TextOptions(tokenizer=str(folder), bos=bos, max_tokens=3), workers=1).dst
    check_tokens(short, [[bos, *ids[1:-1][:3], eos] for ids in want])
    stored = np.array([bos, *want[1][1:-1][:3], eos], "<u2").tobytes()  # document 1 made to begin with another id
    data = bytearray(short.read_bytes())
    assert data.count(stored) == 1
    at = data.find(stored)
    data[at : at + 2] = np.array([eos], "<u2").tobytes()
    short.write_bytes(bytes(data))
    said = [fault.message for fault in verify(short).faults]
    assert len(said) == 2 and "checksum" in said[0] and said[1] == f"does not begin with the beginning-of-document id {bos}", said
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "[UNK]"}), encoding="utf-8")  # (a model's own choice)
    from readers.tokenizer import load_tokenizer

    assert load_tokenizer(folder).bos_id == tok.token_to_id("[UNK]")
    none = CliRunner().invoke(cli, ["convert", str(corpus), str(tmp_path / "n.blob"), "--bos", "auto", "-q"])
    assert none.exit_code == 2 and "--bos auto: the tokenizer bytes has no beginning-of-document token" in none.output
    bad = CliRunner().invoke(cli, ["convert", str(corpus), str(tmp_path / "x.blob"), "--bos", "first", "-q"])
    assert bad.exit_code == 2 and "--bos: must be a token id >= 0 or 'auto', got 'first'" in bad.output
    caplog.clear()
    packer.convert(corpus, tmp_path / "o.blob", text=TextOptions(bos=10), workers=1)
    assert any("--bos 10 is an ordinary token of the tokenizer (the text '\\n')" in r.getMessage() for r in caplog.records)


def test_compressed_text_is_read_and_other_compression_is_said(tmp_path: Path, caplog) -> None:
    """A folder of .jsonl.gz was called an image folder and .gz files beside plain ones were
    dropped without a word (an LLM user's walkthrough); gzip, bzip2, xz and zstd text files are
    now read (tests/test_text_scan.py), and files of another compression are said, never dropped."""
    import gzip

    only = tmp_path / "only"
    only.mkdir()
    (only / "c.jsonl.gz").write_bytes(gzip.compress(b'{"body": "x"}\n'))
    report = packer.convert(only, tmp_path / "o.blob", text=TextOptions(text_field="body"), workers=1)
    assert report.written == 1 and [TokenDataset(report.dst).decode(x) for x in TokenDataset(report.dst)] == ["x\n"]
    lz4 = tmp_path / "lz4"
    lz4.mkdir()
    (lz4 / "c.jsonl.lz4").write_bytes(b"(not read)")
    for args in (["--text-field", "body"], []):
        result = CliRunner().invoke(cli, ["convert", str(lz4), str(tmp_path / "l.blob"), *args])
        assert result.exit_code == 1 and "holds compressed files" in result.output and "decompress others first" in result.output, result.output
    beside = tmp_path / "beside"
    beside.mkdir()
    (beside / "d.jsonl").write_text('{"body": "y"}\n', encoding="utf-8")
    (beside / "e.txt.lz4").write_bytes(b"(not read)")
    (beside / "f.parquet.gz").write_bytes(b"(not read)")
    report = packer.convert(beside, tmp_path / "b.blob", text=TextOptions(text_field="body"), workers=1)
    assert report.written == 1
    assert [r.getMessage() for r in caplog.records if "compressed" in r.getMessage()] == [
        f"{beside}: 2 compressed files are left out: packer reads .txt, .jsonl and .ndjson files compressed with gzip, bzip2, xz "
        "or zstd (Parquet compresses inside the file); decompress others first (lz4 -d, gunzip...)"]


def test_a_text_field_no_record_has_is_refused_before_converting(tmp_path):
    """A typo in --text-field was a skipped document and a warning per record, then 'none of the
    documents could be converted' (a newcomer walkthrough); a field only some records lack still
    converts, those records skipped."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.jsonl").write_text("".join(json.dumps({"text": f"document {i}", "id": i}) + "\n" for i in range(50)))
    result = CliRunner().invoke(cli, ["convert", str(corpus), str(tmp_path / "t.blob"), "--text-field", "txt"])
    assert result.exit_code == 2 and result.output.strip().splitlines() == [
        "Error: --text-field 'txt': none of the 50 records read (the first of each file, then some spread over the corpus) "
        "has it as a string (a.jsonl:1: no string field 'txt' (its string fields: 'text'; pass --text-field))"], result.output
    assert not list(tmp_path.glob("t.blob*"))
    (corpus / "a.jsonl").write_text(json.dumps({"id": 0}) + "\n" + "".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(5)))
    report = packer.convert(corpus, tmp_path / "u.blob", workers=1)
    assert report.written == 5 and [s.path for s in report.skipped] == ["a.jsonl:1"]
    # a first file without the field, a second with it: converts, the first's records skipped (the probe read the
    # first file only and refused it: a review)
    (corpus / "a.jsonl").write_text("".join(json.dumps({"title": f"t {i}"}) + "\n" for i in range(25)))
    (corpus / "b.jsonl").write_text("".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(30)))
    report = packer.convert(corpus, tmp_path / "v.blob", workers=1)
    assert report.written == 30 and len(report.skipped) == 25


def test_the_text_field_probe_counts_each_record_once(tmp_path):
    """Short files: each file's probe window ran into the next files, and 3 records were '9'."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("a", "b", "d"):
        (corpus / f"{name}.txt").write_text(f"text {name}\n")
    (corpus / "c.jsonl").write_text("".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(3)))
    result = CliRunner().invoke(cli, ["convert", str(corpus), str(tmp_path / "t.blob"), "--text-field", "body"])
    assert result.exit_code == 2 and "none of the 3 records read (" in result.output, result.output


def test_records_without_the_field_first_do_not_refuse_the_corpus(tmp_path):
    """Five header records without 'text', then 1,000 documents: the probe of the first five
    refused it all, blaming --text-field (a walkthrough); a spread probe finds the documents. A
    JSON array on one line says so, not 'no string field'."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.jsonl").write_text("".join(json.dumps({"id": i, "title": "t"}) + "\n" for i in range(5))
                                    + "".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(1000)))
    report = packer.convert(corpus, tmp_path / "h.blob", workers=1)
    assert report.written == 1000 and [s.path for s in report.skipped] == [f"a.jsonl:{i}" for i in range(1, 6)]
    (corpus / "a.jsonl").write_text(json.dumps([{"text": "a"}, {"text": "b"}]) + "\n" + json.dumps({"text": "c"}) + "\n")
    report = packer.convert(corpus, tmp_path / "a.blob", workers=1)
    assert report.written == 1 and [(s.path, s.reason) for s in report.skipped] == [
        ("a.jsonl:1", "a JSON array, not an object: JSON Lines hold one object a line")]
    # a bare string or number said 'no string field' too (a text walkthrough)
    (corpus / "a.jsonl").write_text('"just a string"\n7\nnull\n' + json.dumps({"text": "c"}) + "\n")
    report = packer.convert(corpus, tmp_path / "s.blob", workers=1)
    assert report.written == 1 and [(s.path, s.reason.split(",")[0]) for s in report.skipped] == [
        ("a.jsonl:1", "a JSON string"), ("a.jsonl:2", "a JSON number"), ("a.jsonl:3", "a JSON null")]


def test_shard_bytes_alone_sizes_text_shards(tmp_path):
    """--shard-bytes on a corpus: pieces were always 1,000 documents, so no shard held more,
    whatever the bytes allowed; each now holds about what --shard-bytes does."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.jsonl").write_text("".join(json.dumps({"text": f"document number {i}"}) + "\n" for i in range(3000)))
    report = packer.convert(corpus, tmp_path / "s" / "p-%06d.tar", storage=packer.StorageOptions(shard_bytes=1 << 30), workers=2)
    meta = json.loads((tmp_path / "s" / "packer.json").read_text())
    assert report.written == 3000 and meta["extra"]["shard_counts"] == [3000]
    small = packer.convert(corpus, tmp_path / "t" / "p-%06d.tar", storage=packer.StorageOptions(shard_bytes=20_000), workers=2)
    counts = json.loads((tmp_path / "t" / "packer.json").read_text())["extra"]["shard_counts"]
    assert small.written == 3000 and len(counts) > 3 and max(counts) > 1 and sum(counts) == 3000


def test_shard_bytes_fills_text_shards_whatever_else_the_records_hold(tmp_path):
    """Documents were sized from the files' bytes: records holding other fields (a URL, a
    language, scores) made each look several times its text, and --shard-bytes shards came out
    a third full (a walkthrough). Documents spread over the corpus are tokenised to size them."""
    import tarfile

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    meta = {"url": "https://example.com/" + "x" * 200, "lang": "en", "score": 0.5}
    (corpus / "a.jsonl").write_text("".join(json.dumps({"text": f"document number {i} " * 4, **meta}) + "\n" for i in range(3000)))
    limit = 40_000
    packer.convert(corpus, tmp_path / "s" / "p-%06d.tar", storage=packer.StorageOptions(shard_bytes=limit), workers=2)
    shards = sorted((tmp_path / "s").glob("p-*.tar"))
    members = [sum(m.size for m in tarfile.open(shard).getmembers()) for shard in shards]  # the tar library's account
    # (each worker's piece ends in a smaller shard, README's --shard-bytes: the median is a full one)
    assert len(shards) > 3 and max(members) <= limit and sorted(members)[len(members) // 2] >= 0.8 * limit, members


def test_random_windows_reach_the_last_start_and_work_with_exactly_one_block(tmp_path):
    """The last start is drawn too, and a stream of exactly one block reads (a mutation sweep)."""
    import packer
    from packer.options import TextOptions
    from readers import TokenDataset

    (tmp_path / "a.txt").write_text("abcdefghi")  # 9 bytes + EOS: 10 tokens
    packer.convert(tmp_path / "a.txt", tmp_path / "o.blob", text=TextOptions(tokenizer="bytes"))
    one = TokenDataset(tmp_path / "o.blob", block_size=9, random_windows=True)  # 10 = 9 + 1: one block
    x, y = one[0]
    assert len(x) == len(y) == 9
    starts = {TokenDataset(tmp_path / "o.blob", block_size=8, random_windows=True, seed=s).window_start(0) for s in range(64)}
    assert starts == {0, 1}
