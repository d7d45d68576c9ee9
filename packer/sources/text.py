"""Find the documents of a text corpus: ``.txt``, ``.jsonl`` and (with pyarrow) Parquet files.

A corpus is a file or a folder searched recursively (hidden names ignored), read in sorted
relative-path order, so document order is deterministic. A ``.txt`` file is one document, or one
per non-empty line with ``lines=True``; a ``.jsonl`` line and a Parquet row give the string under
``text_field``. Inputs that cannot be used (a binary file, invalid UTF-8, a line that is not JSON
or lacks the field, an empty document) are skipped and listed as :class:`Skipped`; the caller
records them in the metadata or stops (``--on-error fail``).
"""

from __future__ import annotations

import json
import logging
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from readers.schema import Skipped

from ..errors import OptionError, SourceError
from .rules import IMAGE_EXTENSIONS

__all__ = ["TextDoc", "TextCorpus", "scan_text", "is_text_corpus", "TEXT_EXTENSIONS", "COMPRESSED_SUFFIXES"]

log = logging.getLogger("packer")

#: File extensions read as text corpora.
TEXT_EXTENSIONS = (".txt", ".jsonl", ".parquet")
#: A file whose first bytes hold a NUL is binary, not text.
_SNIFF = 8192


@dataclass(frozen=True)
class TextDoc:
    """One document: where it came from (``file`` or ``file:line``) and its text."""

    source: str
    text: str

    @property
    def path(self) -> str:
        """Where the document came from (``file`` or ``file:line``), as an image input's path."""
        return self.source


@dataclass
class TextCorpus:
    """The documents of a corpus in order, and what was skipped."""

    root: Path
    docs: list[TextDoc]
    skipped: list[Skipped] = field(default_factory=list)
    files: int = 0
    #: Every text file read, in order (the resume fingerprint stats them).
    paths: list[str] = field(default_factory=list)
    #: Images found beside the text files (not converted: a corpus is text only).
    images: int = 0


def _text_files(root: Path) -> tuple[list[Path], int]:
    """The text files of ``root`` in order, and how many images lie beside them (compressed text
    files beside them, not read, are said in a warning)."""
    if root.is_file():
        return [root], 0
    found, images, compressed = [], 0, 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in filenames:
            ext = os.path.splitext(name)[1].lower()
            if not name.startswith(".") and ext in TEXT_EXTENSIONS:
                found.append(Path(dirpath) / name)
            images += not name.startswith(".") and ext in IMAGE_EXTENSIONS
            compressed += not name.startswith(".") and _compressed_text(name)
    if compressed:
        log.warning("%s: %s left out: packer does not read compressed text; decompress them first to convert them", root,
                    f"{compressed:,} compressed text files (.jsonl.gz and the like) are" if compressed != 1 else "1 compressed text file is")
    return sorted(found, key=lambda p: p.relative_to(root).as_posix()), images


def is_text_corpus(root: str | os.PathLike[str]) -> bool:
    """Whether ``root`` holds text files and no images (how ``packer convert`` tells a corpus);
    one that holds compressed text files only (``.jsonl.gz``), which are not read, is refused
    with one line saying so (:class:`SourceError`)."""
    root = Path(root)
    if root.is_file():
        if _compressed_text(root.name):
            raise SourceError(f"{root}: a compressed text file, which packer does not read: decompress it first (gunzip, zstd -d...)")
        return root.suffix.lower() in TEXT_EXTENSIONS
    has_text, compressed = False, ""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            ext = os.path.splitext(name)[1].lower()
            if ext in IMAGE_EXTENSIONS:
                return False
            has_text = has_text or ext in TEXT_EXTENSIONS
            compressed = compressed or (os.path.join(dirpath, name) if _compressed_text(name) else "")
    if compressed and not has_text:
        raise SourceError(f"{root}: holds compressed text files ({compressed}), which packer does not read: decompress them first "
                          "(gunzip, zstd -d...) to convert the .txt, .jsonl or .parquet files")
    return has_text


#: Compression suffixes of text files packer does not read (``corpus.jsonl.gz``).
COMPRESSED_SUFFIXES = (".gz", ".bz2", ".xz", ".zst", ".zstd", ".lz4")


def _compressed_text(name: str) -> bool:
    """Whether the file ``name`` is a compressed text file (``a.jsonl.gz``, ``b.txt.zst``)."""
    stem, ext = os.path.splitext(name.lower())
    return ext in COMPRESSED_SUFFIXES and os.path.splitext(stem)[1] in TEXT_EXTENSIONS


def scan_text(root: str | os.PathLike[str], *, lines: bool = False, text_field: str = "text") -> TextCorpus:
    """Read every document of ``root``; raises :class:`SourceError` if there are no text files,
    :class:`OptionError` (before reading any) for ``lines`` without ``.txt`` files or a
    ``text_field`` other than "text" without ``.jsonl`` or Parquet files."""
    root = Path(root)
    if not root.exists():
        raise SourceError(f"{root}: no such file or folder")
    files, images = _text_files(root)
    if not files:
        raise SourceError(f"{root}: no .txt, .jsonl or .parquet files found")
    kinds = {path.suffix.lower() for path in files}  # an option no file uses would be dropped (and recorded as used)
    if lines and ".txt" not in kinds:
        raise OptionError(f"--lines: applies to .txt files, and {root} has none; drop it")
    if text_field != "text" and not kinds & {".jsonl", ".parquet"}:
        raise OptionError(f"--text-field: applies to .jsonl and .parquet files, and {root} has none; drop it")
    corpus = TextCorpus(root, [], files=len(files), paths=[str(p) for p in files], images=images)
    base = root if root.is_dir() else root.parent
    for path in files:
        name = path.relative_to(base).as_posix()
        ext = path.suffix.lower()
        try:
            regular = stat.S_ISREG(path.stat().st_mode)
        except OSError as exc:
            corpus.skipped.append(Skipped(name, f"cannot read ({exc.strerror or exc})"))
            continue
        if not regular:  # a named pipe would block the scan forever, outside any worker's --timeout
            corpus.skipped.append(Skipped(name, "not a regular file (a named pipe, socket or device): not read"))
            continue
        if ext == ".parquet":
            _read_parquet(path, name, text_field, corpus)
            continue
        docs, skipped = len(corpus.docs), len(corpus.skipped)
        try:
            if ext == ".jsonl" or lines:  # a document a line: read a line at a time, never the whole file at once
                _read_lines(path, name, text_field if ext == ".jsonl" else None, corpus)
                continue
            data = path.read_bytes()
        except OSError as exc:  # (partway through a file: none of its lines is kept, the file is skipped whole)
            del corpus.docs[docs:], corpus.skipped[skipped:]
            corpus.skipped.append(Skipped(name, f"cannot read ({exc.strerror or exc})"))
            continue
        if b"\x00" in data[:_SNIFF]:
            corpus.skipped.append(Skipped(name, "binary file (contains NUL bytes), not text"))
            continue
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            corpus.skipped.append(Skipped(name, f"invalid UTF-8 at byte {exc.start}"))
            continue
        _add(corpus, name, text)
    return corpus


def _read_lines(path: Path, name: str, text_field: str | None, corpus: TextCorpus) -> None:
    """A document a line (``text_field``: JSON Lines, that field of each record; ``None``:
    ``--lines``), read a line at a time: a line that is not UTF-8 is skipped alone, as a line
    that is not JSON is (the file whole when its start holds NUL bytes: binary)."""
    with open(path, "rb") as handle:
        if b"\x00" in handle.read(_SNIFF):
            corpus.skipped.append(Skipped(name, "binary file (contains NUL bytes), not text"))
            return
        handle.seek(0)
        for number, raw in enumerate(handle, 1):  # binary: split at b"\n" only, as wc -l and JSON Lines count lines
            where = f"{name}:{number}"
            try:
                line = raw.decode("utf-8").removesuffix("\n").removesuffix("\r")
            except UnicodeDecodeError as exc:
                corpus.skipped.append(Skipped(where, f"invalid UTF-8 at byte {exc.start} of the line"))
                continue
            if not line.strip():
                continue
            if text_field is None:
                corpus.docs.append(TextDoc(where, line))
            else:
                _add_record(corpus, where, line, text_field)


def _add(corpus: TextCorpus, source: str, text: str) -> None:
    if text.strip():
        corpus.docs.append(TextDoc(source, text))
    else:
        corpus.skipped.append(Skipped(source, "empty document"))


def _add_record(corpus: TextCorpus, where: str, line: str, text_field: str) -> None:
    """A JSON Lines record's ``text_field``, or why it is skipped."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        corpus.skipped.append(Skipped(where, f"not JSON ({exc.msg})"))
        return
    value = record.get(text_field) if isinstance(record, dict) else None
    if not isinstance(value, str):
        strings = [key for key, field in record.items() if isinstance(field, str)][:8] if isinstance(record, dict) else []
        hint = f" (its string fields: {', '.join(map(repr, strings))}; pass --text-field)" if strings and text_field not in record else ""
        corpus.skipped.append(Skipped(where, f"no string field {text_field!r}{hint}"))
        return
    _add(corpus, where, value)


def _read_parquet(path: Path, name: str, text_field: str, corpus: TextCorpus) -> None:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise SourceError(f"{path}: reading Parquet needs pyarrow: pip install pyarrow") from None
    try:
        columns = pq.read_schema(path).names
        if text_field not in columns:
            shown = ", ".join(columns[:8]) + (", ..." if len(columns) > 8 else "")
            corpus.skipped.append(Skipped(name, f"no Parquet column {text_field!r} (its columns: {shown or 'none'}); pass --text-field"))
            return
        column = pq.read_table(path, columns=[text_field]).column(text_field).to_pylist()
    except Exception as exc:  # noqa: BLE001 - pyarrow raises many types for bad files; recorded
        reason = " ".join(str(exc).split())  # pyarrow's messages run over lines: one line
        corpus.skipped.append(Skipped(name, f"cannot read Parquet column {text_field!r} ({reason})"))
        return
    for row, value in enumerate(column, 1):  # rows counted from 1, as JSON Lines' lines are
        where = f"{name}:{row}"
        if not isinstance(value, str):
            corpus.skipped.append(Skipped(where, f"no string field {text_field!r}"))
        else:
            _add(corpus, where, value)
