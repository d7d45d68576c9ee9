"""Scanning a text corpus records where each document is, never its text; the workers read it
(packer/sources/text_docs.py). Checked against a plain Python reading of the same files: the
documents, their line numbers and the reasons for skipped lines are the same, whatever the
scan's block size (lines cut across blocks, ``\\r\\n`` endings, blank lines, no final newline)."""

from __future__ import annotations

import io
import os
import pickle
import random
from pathlib import Path

import pytest

import packer
import packer.sources.text as text_module
from packer.options import TextOptions
from packer.sources.text import scan_text
from packer.sources.text_docs import DOC_ROW, DocSpan, ParquetRow, TextDoc, document_texts
from readers import TokenDataset
from readers.schema import Skipped

def test_a_null_text_field_is_named_as_there_but_not_a_string(tmp_path: Path) -> None:
    """{"text": null} said "no string field 'text'" of a field that is there (a walkthrough)."""
    (tmp_path / "r.jsonl").write_text('{"text": null}\n{"text": 7}\n{"text": "ok"}\n', encoding="utf-8")
    assert scanned(tmp_path) == [("r.jsonl:1", "field 'text' is null, not a string"), ("r.jsonl:2", "field 'text' is 7, not a string"),
                                 ("r.jsonl:3", "ok")]


def test_a_lone_surrogate_is_named_whatever_the_tokenizer(tmp_path: Path) -> None:
    """JSON's "\\ud800" makes a str no UTF-8 tokenizer takes; each worded it its own way (HF:
    "TextInputSequence must be str"): the reason names the character and where it is."""
    (tmp_path / "r.jsonl").write_text('{"text": "bad \\ud800 surrogate"}\n{"text": "good"}\n', encoding="utf-8")
    report = packer.convert(tmp_path, tmp_path.parent / f"{tmp_path.name}.blob", workers=1)
    assert report.written == 1
    assert [(s.path, s.reason) for s in report.skipped] == [("r.jsonl:1", "not valid Unicode: a lone surrogate '\\ud800' at character 4")]


PIECES = [b"a", b"bc d", b"\n", b"\n", b"\r\n", b"\r", b" ", b"\t", b"\x0c", b"\x0b", b"\x1c", "\u00e9".encode(), b"\xff",
          "\u2028".encode(), "\u3000".encode(), "\u00a0".encode(), "\u3053".encode(), b"\xe3", b"\xc2", b'{"text": "x"}']


def plain_reading(data: bytes, name: str) -> list[tuple[str, str]]:
    """What a document a line means, read the plain way (a line at a time, as Python's binary
    file iteration splits them): each non-blank line's text, or why it is skipped."""
    found = []
    for number, raw in enumerate(io.BytesIO(data), 1):
        try:
            line = raw.decode("utf-8").removesuffix("\n").removesuffix("\r")
        except UnicodeDecodeError as exc:
            found.append((f"{name}:{number}", f"invalid UTF-8 at byte {exc.start} of the line"))
            continue
        if line.strip():
            found.append((f"{name}:{number}", line))
    return found


def scanned(root: Path, **options) -> list[tuple[str, str]]:
    corpus = scan_text(root, **options)
    return [(doc.source, text.reason if isinstance(text, Skipped) else text)
            for doc, text in zip(corpus.docs, document_texts(corpus.docs))]


@pytest.mark.parametrize("seed", range(40))
def test_lines_found_by_blocks_are_the_lines_python_reads(tmp_path: Path, monkeypatch, seed: int) -> None:
    rng = random.Random(seed)
    data = b"".join(rng.choice(PIECES) for _ in range(rng.randint(0, 80)))
    (tmp_path / "t.txt").write_bytes(data)
    monkeypatch.setattr(text_module, "_BLOCK", rng.randint(1, 12))
    if not plain_reading(data, "t.txt"):
        return  # (no documents: nothing to compare; the driver says none could be converted)
    assert scanned(tmp_path, lines=True) == plain_reading(data, "t.txt")


def test_json_lines_are_read_by_the_workers_with_the_reasons_of_a_plain_reading(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "r.jsonl").write_bytes(b'{"text": "one"}\r\n\n  \nnot json\n{"text": ""}\n{"body": "b"}\n{"text": "two \xff"}\n{"text": "last"}')
    monkeypatch.setattr(text_module, "_BLOCK", 5)
    assert scanned(tmp_path) == [
        ("r.jsonl:1", "one"), ("r.jsonl:4", "not JSON (Expecting value: column 1)"), ("r.jsonl:5", "empty document"),
        ("r.jsonl:6", "no string field 'text' (its string fields: 'body'; pass --text-field)"),
        ("r.jsonl:7", "invalid UTF-8 at byte 14 of the line"), ("r.jsonl:8", "last")]


def test_the_driver_holds_and_sends_places_not_text(tmp_path: Path) -> None:
    """The corpus's documents are rows of 28 bytes, and what is sent to a worker names where a
    document is, not its text (which used to be read, held and sent by the driver)."""
    text = "zebra " * 2000
    (tmp_path / "r.jsonl").write_text("".join(f'{{"text": "{text}{i}"}}\n' for i in range(50)), encoding="utf-8")
    corpus = scan_text(tmp_path)
    assert corpus.docs.rows.dtype == DOC_ROW and DOC_ROW.itemsize == 28 and len(corpus.docs) == 50
    sent = pickle.dumps(corpus.docs[10:20])
    assert b"zebra" not in sent and len(sent) < 2000
    assert all(isinstance(doc, DocSpan) for doc in pickle.loads(sent))
    assert document_texts(pickle.loads(sent)) == [f"{text}{i}" for i in range(10, 20)]


def test_a_file_changed_after_the_scan_is_not_read_at_the_old_places(tmp_path: Path) -> None:
    (tmp_path / "r.jsonl").write_text('{"text": "one"}\n{"text": "two"}\n', encoding="utf-8")
    corpus = scan_text(tmp_path)
    (tmp_path / "r.jsonl").write_text('{"text": "a longer first line"}\n{"text": "two"}\n', encoding="utf-8")
    texts = document_texts(corpus.docs)
    assert [t.reason for t in texts] == ["the file changed since it was scanned (32 bytes then, 48 now): not read"] * 2
    (tmp_path / "r.jsonl").write_text('{"text": "ONE"}\n{"text": "TWO"}\n', encoding="utf-8")  # the same size
    os.utime(tmp_path / "r.jsonl", ns=(0, corpus.docs[0].file.mtime_ns + 1))
    assert document_texts(corpus.docs)[1].reason == "the file changed since it was scanned (modified since, same size): not read"
    (tmp_path / "r.jsonl").unlink()
    assert document_texts(corpus.docs)[0].reason == "the file changed since it was scanned (it is gone): not read"


def test_a_line_of_unicode_blanks_is_no_document(tmp_path: Path) -> None:
    """A line that str.strip empties is no document, Unicode blanks too (U+3000, U+00A0, U+2028;
    a review found them recorded as empty documents, which --on-error fail stopped at), while a
    line of Japanese, which starts and ends with the same kind of bytes, is one."""
    (tmp_path / "t.txt").write_text("one\n\u3000\u00a0\n \t\x1c\n\u2028\r\n\u3053\u3093\u306b\u3061\u306f\n\u00a0x\n", encoding="utf-8")
    assert scanned(tmp_path, lines=True) == [("t.txt:1", "one"), ("t.txt:5", "\u3053\u3093\u306b\u3061\u306f"), ("t.txt:6", "\u00a0x")]


def test_parquet_rows_are_read_a_row_group_at_a_time_in_order(tmp_path: Path, monkeypatch) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    values = [f"row {i}" if i % 5 != 3 else None for i in range(23)]
    src = tmp_path / "src"
    src.mkdir()
    pq.write_table(pa.table({"body": values, "n": list(range(23))}), src / "a.parquet", row_group_size=4)
    corpus = scan_text(src, text_field="body")
    docs = corpus.docs
    assert pq.ParquetFile(src / "a.parquet").metadata.num_row_groups == 6
    sent = pickle.loads(pickle.dumps(docs))  # what a worker gets: each row with its text
    assert all(isinstance(d, TextDoc) for d in sent) and all(isinstance(d, ParquetRow) for d in docs)
    assert [d.text for d in sent] == values and [d.source for d in sent] == [d.source for d in docs] == [f"a.parquet:{i + 1}" for i in range(23)]
    assert [d.text for d in pickle.loads(pickle.dumps(docs[::-1]))] == values[::-1]  # (out of order too: a crashed chunk's retry)
    assert sent[3].problem == "field 'body' is null, not a string" and [d.text for d in pickle.loads(pickle.dumps(docs[20:]))] == values[20:]
    read = []  # booking outcomes by name reads nothing; sending reads each row group once
    monkeypatch.setattr(pq.ParquetFile, "read_row_group", lambda self, *a, _real=pq.ParquetFile.read_row_group, **k: read.append(a[0]) or _real(self, *a, **k))
    fresh = scan_text(src, text_field="body").docs
    for start in range(0, 23, 3):
        pickle.dumps(fresh[start : start + 3])
        [d.source for d in fresh[max(0, start - 9) : start]]
    assert read == [0, 1, 2, 3, 4, 5]
    packer.convert(src, tmp_path / "p.blob", text=TextOptions(text_field="body", tokenizer="bytes"), workers=2)
    ds = TokenDataset(tmp_path / "p.blob")
    assert [ds.decode(ds[i]) for i in range(len(ds))] == [f"{v}\n" for v in values if v is not None]
    assert [s.path for s in ds.meta.skipped] == [f"a.parquet:{i + 1}" for i, v in enumerate(values) if v is None]


def test_a_parquet_file_changed_after_the_scan_is_not_read(tmp_path: Path) -> None:
    """Its rows' places are the scan's row groups: rewritten with other groups, reading them
    raised IndexError in the driver, and rewritten alike, it was read as the new file (a review)."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": [f"old {i}" for i in range(8)]}), tmp_path / "a.parquet", row_group_size=4)
    docs = scan_text(tmp_path).docs
    pq.write_table(pa.table({"text": [f"new {i}" for i in range(8)]}), tmp_path / "a.parquet", row_group_size=2)
    assert {d.problem for d in pickle.loads(pickle.dumps(docs))} == {"the file changed since it was scanned: not read"}


def test_a_source_changed_under_a_conversion_stops_it(tmp_path: Path) -> None:
    """An append to a corpus file while it converted skipped every document of the file (by the
    thousand, each recorded) and reported success (an LLM user's walkthrough): the conversion
    stops with one line naming the file, and leaves nothing a reader accepts."""
    from packer.engine import run
    from packer.errors import InputError
    from packer.options import RunOptions
    from packer.text import text_job

    src = tmp_path / "c"
    src.mkdir()
    (src / "a.jsonl").write_text("".join(f'{{"text": "doc {i}"}}\n' for i in range(50)), encoding="utf-8")
    job = text_job(src, TextOptions())
    with open(src / "a.jsonl", "a", encoding="utf-8") as more:
        more.write('{"text": "late"}\n')
    with pytest.raises(InputError, match=r"a.jsonl:1: the file changed since it was scanned \(.* bytes then, .* now\): not read; "
                                         "the conversion stopped"):
        run(job, "blob", tmp_path / "o.blob", storage=None, options=RunOptions(workers=2))
    assert not (tmp_path / "o.blob").exists()
    # after a checkpoint too, nothing is kept: a --resume would be refused, the source not being the one converted (a review)
    import packer.writers.journal as journal

    (src / "b.jsonl").write_text("".join(f'{{"text": "doc {i}"}}\n' for i in range(50)), encoding="utf-8")
    (src / "a.jsonl").write_text("".join(f'{{"text": "doc {i}"}}\n' for i in range(50)), encoding="utf-8")
    job = text_job(src, TextOptions())
    with open(src / "b.jsonl", "a", encoding="utf-8") as more:
        more.write('{"text": "late"}\n')
    saved, journal.CHECKPOINT_SECONDS = journal.CHECKPOINT_SECONDS, 0.0
    try:
        with pytest.raises(InputError, match=r"b.jsonl:1: the file changed since it was scanned .*the conversion stopped: run it again "
                                             r"once the source is no longer written to$"):
            run(job, "blob", tmp_path / "p.blob", storage=None, options=RunOptions(workers=1))
    finally:
        journal.CHECKPOINT_SECONDS = saved
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]


def test_files_no_rule_reads_are_named_not_dropped(tmp_path: Path, caplog) -> None:
    """A .md or .csv beside the .txt documents was left out without a word (a text walkthrough);
    it is named, by extension, with the rename that has it read. A folder's notes (README.md at
    its top) are no documents and go unsaid, as do images and .json files (their own warnings)."""
    import logging

    src = tmp_path / "c"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_text("kept", encoding="utf-8")
    (src / "README.md").write_text("# notes", encoding="utf-8")
    (src / "sub" / "b.md").write_text("left", encoding="utf-8")
    (src / "sub" / "c.md").write_text("left", encoding="utf-8")
    (src / "rows.csv").write_text("x,y", encoding="utf-8")
    (src / "dataset_info.json").write_text("{}", encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="packer"):
        assert scanned(src) == [("a.txt", "kept")]
    said = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert said == [f"{src}: 3 files are left out (2 .md, 1 .csv; e.g. rows.csv): packer reads .txt, .jsonl, .ndjson and "
                    ".parquet files (compressed too); rename plain-text documents to .txt to convert them"]


def test_ndjson_is_read_and_json_files_are_named_not_dropped(tmp_path: Path, caplog) -> None:
    """.ndjson files are JSON Lines; .json files (Hugging Face's to_json writes JSON Lines under
    that name, and a corpus folder may hold a configuration) were left out without a word."""
    from packer.errors import SourceError
    from packer.sources.text import is_text_corpus

    src = tmp_path / "c"
    src.mkdir()
    (src / "a.ndjson").write_text('{"text": "from ndjson"}\n', encoding="utf-8")
    (src / "b.json").write_text('{"text": "from json"}\n', encoding="utf-8")
    assert scanned(src) == [("a.ndjson:1", "from ndjson")]
    assert "1 .json file is left out: packer reads JSON Lines from .jsonl and .ndjson files (compressed too); if they hold a record" in caplog.text
    (src / "a.ndjson").unlink()
    with pytest.raises(SourceError, match="holds .json files .* and nothing else packer reads: .* rename them to .jsonl"):
        is_text_corpus(src)
    with pytest.raises(SourceError, match="b.json: a .json file, which packer does not read"):
        is_text_corpus(src / "b.json")


def test_symlinked_folders_are_followed_and_each_real_folder_read_once(tmp_path: Path, caplog) -> None:
    """A corpus of links to folders elsewhere (shards on another disk) was read as empty, or with
    the linked folders' files dropped without a word (a walkthrough): they are followed; a link to
    a folder already read (a second name, a loop back) or to a folder holding the corpus (which
    would read what lies beside it: a review) is left out with a warning."""
    from packer.sources.text import is_text_corpus

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "x.txt").write_text("linked\n", encoding="utf-8")
    src = tmp_path / "c"
    src.mkdir()
    (src / "en").symlink_to(elsewhere, target_is_directory=True)
    assert is_text_corpus(src) and scanned(src) == [("en/x.txt", "linked\n")]
    (src / "a.txt").write_text("real\n", encoding="utf-8")
    (src / "zz").symlink_to(elsewhere, target_is_directory=True)  # the same folder again
    (elsewhere / "loop").symlink_to(src, target_is_directory=True)  # and a loop back
    (tmp_path / "beside.txt").write_text("not the corpus\n", encoding="utf-8")
    (src / "up").symlink_to(tmp_path, target_is_directory=True)  # the corpus's parent
    assert scanned(src) == [("a.txt", "real\n"), ("en/x.txt", "linked\n")]
    assert "zz: left out: the same folder as one already read" in caplog.text
    assert "up: left out: a link to the corpus or a folder holding it" in caplog.text
    assert "loop: left out: a link to the corpus or a folder holding it" in caplog.text


def test_a_byte_order_mark_at_the_start_of_a_file_is_no_text(tmp_path: Path) -> None:
    bom = b"\xef\xbb\xbf"
    (tmp_path / "a.jsonl").write_bytes(bom + b'{"text": "one"}\r\n{"text": "two"}\n')
    (tmp_path / "b.txt").write_bytes(bom + b"first\nsecond\n")
    assert scanned(tmp_path, lines=True) == [("a.jsonl:1", "one"), ("a.jsonl:2", "two"), ("b.txt:1", "first"), ("b.txt:2", "second")]
    assert scanned(tmp_path / "b.txt") == [("b.txt", "first\nsecond\n")]


def test_a_parquet_column_of_numbers_is_one_skip_for_the_file(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": list(range(100))}), tmp_path / "n.parquet")
    pq.write_table(pa.table({"text": pa.array(["a", "b", "a"]).dictionary_encode()}), tmp_path / "s.parquet")
    corpus = scan_text(tmp_path)
    assert [(s.path, s.reason) for s in corpus.skipped] == [
        ("n.parquet", "the Parquet column 'text' holds int64, not text; pass --text-field for a column of strings")]
    assert [d.text for d in pickle.loads(pickle.dumps(corpus.docs))] == ["a", "b", "a"]


CODEC_WRITERS = {"gz": "gzip", "bz2": "bz2", "xz": "lzma", "zst": "zstandard"}


def compress(data: bytes, suffix: str) -> bytes:
    import importlib

    module = importlib.import_module(CODEC_WRITERS[suffix]) if suffix != "zst" else pytest.importorskip("zstandard")
    return module.ZstdCompressor().compress(data) if suffix == "zst" else module.compress(data)


@pytest.mark.parametrize("suffix", ["gz", "bz2", "xz", "zst"])
@pytest.mark.parametrize("seed", range(6))
def test_compressed_lines_are_the_lines_python_reads(tmp_path: Path, monkeypatch, seed: int, suffix: str) -> None:
    """A compressed corpus file's documents are those of its decompressed bytes: found by the
    scan in the decompressed stream, read by the converting process when they are sent."""
    rng = random.Random(seed)
    data = b"".join(rng.choice(PIECES) for _ in range(rng.randint(1, 80))) + b"\nend"
    (tmp_path / f"t.txt.{suffix}").write_bytes(compress(data, suffix))
    monkeypatch.setattr(text_module, "_BLOCK", rng.randint(1, 12))
    corpus = scan_text(tmp_path, lines=True)
    sent = pickle.loads(pickle.dumps(corpus.docs))  # what the workers get: each document's bytes
    found = [(doc.source, text.reason if isinstance(text, Skipped) else text) for doc, text in zip(sent, document_texts(sent))]
    assert found == plain_reading(data, f"t.txt.{suffix}")
    backwards = pickle.loads(pickle.dumps(corpus.docs[::-1]))  # (a crashed work unit sent again: the file reopened)
    assert [doc.source for doc in backwards] == [name for name, _ in found[::-1]]
    assert document_texts(backwards) == document_texts(sent)[::-1]


def test_a_compressed_corpus_converts_as_its_decompressed_copy(tmp_path: Path) -> None:
    import gzip

    records = [f'{{"text": "record {i}"}}\n' if i % 9 else "not json\n" for i in range(300)]
    plain, packed = tmp_path / "plain", tmp_path / "packed"
    plain.mkdir(), packed.mkdir()
    (plain / "a.jsonl").write_text("".join(records[:150]), encoding="utf-8")
    (plain / "b.jsonl").write_text("".join(records[150:]), encoding="utf-8")
    (plain / "c.txt").write_text("a whole document\nof two lines\n", encoding="utf-8")
    (packed / "a.jsonl.gz").write_bytes(gzip.compress((plain / "a.jsonl").read_bytes()))
    (packed / "b.jsonl.xz").write_bytes(compress((plain / "b.jsonl").read_bytes(), "xz"))
    (packed / "c.txt.bz2").write_bytes(compress((plain / "c.txt").read_bytes(), "bz2"))
    ours = packer.convert(packed, tmp_path / "packed.blob", workers=2)
    theirs = packer.convert(plain, tmp_path / "plain.blob", workers=2)
    documents = lambda report: [TokenDataset(report.dst).decode(x) for x in TokenDataset(report.dst)]  # noqa: E731
    assert documents(ours) == documents(theirs) and len(documents(ours)) == 300 - 34 + 1
    assert [s.path for s in ours.skipped] == [s.path.replace("a.jsonl", "a.jsonl.gz").replace("b.jsonl", "b.jsonl.xz") for s in theirs.skipped]


def test_a_damaged_or_changed_compressed_file(tmp_path: Path, monkeypatch) -> None:
    import gzip
    import sys

    from packer.errors import SourceError
    from packer.sources.compressed import open_decompressed
    from packer.sources.text_docs import Changed

    whole = gzip.compress(b"".join(b'{"text": "line %d"}\n' % i for i in range(2000)))
    (tmp_path / "cut.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    (tmp_path / "ok.jsonl.gz").write_bytes(whole)
    corpus = scan_text(tmp_path)
    assert [(s.path, s.reason.split(" (")[0]) for s in corpus.skipped] == [("cut.jsonl.gz", "cannot decompress")]
    assert len(corpus.docs) == 2000
    (tmp_path / "ok.jsonl.gz").write_bytes(whole + gzip.compress(b'{"text": "more"}\n'))
    assert all(isinstance(t, Changed) for t in document_texts(pickle.loads(pickle.dumps(corpus.docs[:3]))))
    monkeypatch.setitem(sys.modules, "zstandard", None)
    with pytest.raises(SourceError, match=r"a.zst: reading zstd needs the zstandard package: pip install zstandard"):
        open_decompressed(tmp_path / "a.zst", "zstd")


def test_a_cut_zstd_file_is_damaged_not_shorter(tmp_path: Path) -> None:
    """zstandard's stream reader stops where a cut .zst file ends, without a word: half a corpus
    was converted and the run succeeded (a review). A frame cut short is a decompression error."""
    zstandard = pytest.importorskip("zstandard")
    import struct

    data = b"".join(b'{"text": "line %d"}\n' % i for i in range(30000))
    whole = zstandard.ZstdCompressor().compress(data[:300000]) + struct.pack("<II", 0x184D2A50, 3) + b"abc"
    whole += zstandard.ZstdCompressor().compress(data[300000:])  # two frames, a skippable one between
    (tmp_path / "cut.jsonl.zst").write_bytes(whole[: len(whole) - 100])
    (tmp_path / "whole.jsonl.zst").write_bytes(whole)
    corpus = scan_text(tmp_path)
    assert [(s.path, s.reason) for s in corpus.skipped] == [("cut.jsonl.zst", "cannot decompress (the file ends inside a frame (cut short))")]
    assert len(corpus.docs) == 30000 and document_texts(pickle.loads(pickle.dumps(corpus.docs[29998:]))) == ["line 29998", "line 29999"]


def test_a_retried_work_unit_does_not_decompress_the_file_again(tmp_path: Path, monkeypatch) -> None:
    """A work unit sent again after its worker crashed reads documents already read: they were
    decompressed again from the file's start, once per crash (a review: 10x the file for 19
    crashes)."""
    import gzip

    import packer.sources.text_docs as docs_module

    (tmp_path / "a.txt.gz").write_bytes(gzip.compress(b"".join(b"document %d\n" % i for i in range(5000))))
    docs = scan_text(tmp_path, lines=True).docs
    opened = []
    real = docs_module.open_decompressed
    monkeypatch.setattr(docs_module, "open_decompressed", lambda *a: opened.append(a) or real(*a))
    first = pickle.loads(pickle.dumps(docs[:4000]))
    again = [pickle.loads(pickle.dumps(docs[i])) for i in range(3000, 3064)]  # a chunk's inputs, one by one
    assert document_texts(again) == document_texts(first[3000:3064]) and len(opened) == 1


def test_a_file_and_its_compressed_copy_are_read_once(tmp_path: Path, caplog) -> None:
    import gzip

    (tmp_path / "train.jsonl").write_text('{"text": "one"}\n', encoding="utf-8")
    (tmp_path / "train.jsonl.gz").write_bytes(gzip.compress(b'{"text": "one"}\n'))
    (tmp_path / "other.jsonl.gz").write_bytes(gzip.compress(b'{"text": "two"}\n'))
    (tmp_path / "empty.jsonl.gz").write_bytes(b"")
    corpus = scan_text(tmp_path)
    assert [d.source for d in corpus.docs] == ["other.jsonl.gz:1", "train.jsonl:1"]
    assert "train.jsonl.gz is left out: the same file uncompressed lies beside it (gzip -k keeps both)" in caplog.text
    assert [(s.path, s.reason) for s in corpus.skipped] == [("empty.jsonl.gz", "an empty file, not a compressed one (0 bytes: an interrupted write?)")]


@pytest.mark.parametrize("names", [["c4-train.00000-of-01024.json.gz"], ["a.json", "README.md"]])
def test_a_folder_of_json_files_is_told_to_rename_them(tmp_path: Path, names: list[str]) -> None:
    from click.testing import CliRunner

    from packer.cli import cli

    for name in names:
        (tmp_path / name).write_bytes(b"x")
    result = CliRunner().invoke(cli, ["convert", str(tmp_path), str(tmp_path.parent / "o.blob")])
    assert result.exit_code == 1 and "rename them to .jsonl (a.json.gz to a.jsonl.gz)" in result.output, result.output


def _converted(src: Path, dst: Path, **text) -> tuple[list[str], list[tuple[str, str]]]:
    """The documents of ``src`` converted with the bytes tokenizer, and the skipped (path, reason)."""
    report = packer.convert(src, dst, workers=1, text=TextOptions(**text), on_error="skip")
    docs = TokenDataset(dst)
    return [bytes(docs[i].tolist()[:-1]).decode() for i in range(len(docs))], [(s.path, s.reason) for s in report.skipped]


def test_a_first_line_of_only_a_byte_order_mark_is_blank(tmp_path: Path) -> None:
    """README: the mark is no text and a blank line no document; the line was 'not JSON' or an
    'empty document', and --on-error fail stopped at it (a walkthrough)."""
    (tmp_path / "j").mkdir()
    (tmp_path / "j" / "a.jsonl").write_bytes(b'\xef\xbb\xbf\n{"text": "a"}\n')
    assert _converted(tmp_path / "j", tmp_path / "j.blob") == (["a"], [])
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "n.txt").write_bytes(b"\xef\xbb\xbf \r\nreal\n\xef\xbb\xbf\n")  # (a mark later in the file is text)
    assert _converted(tmp_path / "t", tmp_path / "t.blob", lines=True) == (["real", "\ufeff"], [])


def test_a_nul_byte_skips_its_line_or_document_wherever_it_is(tmp_path: Path) -> None:
    """A NUL in a JSONL's first 8 KB skipped the whole file ('binary file'), 1,999 good records
    with it; after them, one line. In --lines text after 8 KB it was stored as a token (a walkthrough)."""
    (tmp_path / "j").mkdir()
    records = [b'{"text": "d%d"}' % i for i in range(5)]
    records[1] = b'{"text": "d\x001"}'
    (tmp_path / "j" / "a.jsonl").write_bytes(b"\n".join(records) + b"\n")
    docs, skipped = _converted(tmp_path / "j", tmp_path / "j.blob")
    assert docs == ["d0", "d2", "d3", "d4"] and [path for path, _ in skipped] == ["a.jsonl:2"]
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "l.txt").write_bytes(b"one\n" + b"x" * 9000 + b"\nnul\x00here\nlast\n")
    docs, skipped = _converted(tmp_path / "t", tmp_path / "t.blob", lines=True)
    assert docs == ["one", "x" * 9000, "last"] and skipped == [("l.txt:3", "holds NUL bytes: binary, not text")]
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "bin.txt").write_bytes(b"\x00\x01binary")  # (a NUL in the first 8 KB of a text file: still binary, whole)
    with pytest.raises(Exception, match="binary file"):
        _converted(tmp_path / "b", tmp_path / "b.blob", lines=True)


def test_a_link_to_a_file_already_read_is_left_out_with_a_warning(tmp_path: Path, caplog) -> None:
    """latest.jsonl -> x.jsonl stored every document of x twice without a word (a walkthrough);
    a second link to a folder was already left out."""
    corpus = tmp_path / "c"
    corpus.mkdir()
    (corpus / "x.jsonl").write_text('{"text": "a"}\n{"text": "b"}\n', encoding="utf-8")
    (corpus / "latest.jsonl").symlink_to("x.jsonl")
    with caplog.at_level("WARNING", logger="packer"):
        docs, skipped = _converted(corpus, tmp_path / "c.blob")
    assert docs == ["a", "b"] and skipped == []
    assert "1 file is left out: the same file as one already read (latest.jsonl is x.jsonl)" in caplog.text


def test_a_utf16_or_binary_json_lines_file_is_skipped_whole(tmp_path: Path) -> None:
    """One NUL in a JSONL skips its line; a file of them (UTF-16, binary) is skipped once as
    binary, not as a skip per 'line' (a review: 1,001 skips)."""
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "a.jsonl").write_bytes("".join(f'{{"text": "d{i}"}}\n' for i in range(50)).encode("utf-16"))
    (tmp_path / "c" / "b.jsonl").write_text('{"text": "kept"}\n', encoding="utf-8")
    (tmp_path / "c" / "c.txt").write_bytes(bytes(range(256)) * 4)  # binary: no byte-order mark
    (tmp_path / "c" / "d.txt").write_bytes("plain words\n".encode("utf-16-be"))  # no byte-order mark: said as binary
    docs, skipped = _converted(tmp_path / "c", tmp_path / "c.blob")
    # UTF-16 was said as binary: by its byte-order mark, what to do instead (a walkthrough)
    utf16 = "UTF-16 text (by its byte-order mark), not UTF-8: convert it first (iconv -f UTF-16 -t UTF-8)"
    binary = "binary file (contains NUL bytes), not text"
    assert docs == ["kept"] and skipped == [("a.jsonl", utf16), ("c.txt", binary), ("d.txt", binary)]


def test_a_compressed_copy_left_out_in_a_subfolder_is_named_by_its_path(tmp_path: Path, caplog) -> None:
    """The warning named the copy by its bare name (``part-0.jsonl.gz``), not which of the
    corpus's folders holds it (a text walkthrough: nested shards of one name in every folder)."""
    import gzip

    for folder in ("en", "de"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "part-0.jsonl").write_text('{"text": "one"}\n', encoding="utf-8")
    (tmp_path / "de" / "part-0.jsonl.gz").write_bytes(gzip.compress(b'{"text": "one"}\n'))
    corpus = scan_text(tmp_path)
    assert [d.source for d in corpus.docs] == ["de/part-0.jsonl:1", "en/part-0.jsonl:1"]
    assert "de/part-0.jsonl.gz is left out: the same file uncompressed lies beside it (gzip -k keeps both)" in caplog.text
