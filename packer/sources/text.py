"""Find the documents of a text corpus: ``.txt``, JSON Lines (``.jsonl``, ``.ndjson``) and (with pyarrow) Parquet files.

A corpus is a file or a folder searched recursively (hidden names ignored), read in sorted
relative-path order, so document order is deterministic. A ``.txt`` file is one document, or one
per non-empty line with ``lines=True``; a JSON Lines line and a Parquet row give the string under
``text_field``. Scanning finds where each document is (packer/sources/text_docs.py: its text is
read by the worker that tokenises it, which skips a line that is not UTF-8 or not JSON, a record
without the field, an empty document). Files that cannot be used at all (unreadable, binary, not
a regular file, a Parquet file without the column) are skipped here and listed as
:class:`Skipped`; the caller records them in the metadata or stops (``--on-error fail``).
"""

from __future__ import annotations

import codecs
from collections import Counter
import dataclasses
import logging
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from readers.schema import Skipped

from ..errors import OptionError, SourceError
from .splits import of_split
from .rules import ARCHIVE_SUFFIXES, IMAGE_EXTENSIONS
from .compressed import CODECS, DECOMPRESS_ERRORS, UNREAD_SUFFIXES, codec_of, open_decompressed
from .text_docs import BLANK_BYTES, DOC_ROW, Docs, TextFile

__all__ = ["TextCorpus", "scan_text", "is_text_corpus", "text_suffix", "TEXT_EXTENSIONS"]

log = logging.getLogger("packer")

#: File extensions read as text corpora.
TEXT_EXTENSIONS = (".txt", ".jsonl", ".ndjson", ".parquet")
#: JSON Lines: a JSON record a line.
JSON_LINES = (".jsonl", ".ndjson")
#: A file whose first bytes hold a NUL is binary, not text.
_SNIFF = 8192


@dataclass
class TextCorpus:
    """Where the documents of a corpus are, in order, and which files were skipped."""

    root: Path
    docs: Docs
    skipped: list[Skipped] = field(default_factory=list)
    files: int = 0
    #: Every text file read, in order (the resume fingerprint stats them).
    paths: list[str] = field(default_factory=list)
    #: Images found beside the text files (not converted: a corpus is text only).
    images: int = 0


#: Names of a folder's notes (``LICENSE.txt``), which are no documents of a corpus beside them.
NOTE_NAMES = frozenset({"LICENSE", "LICENCE", "README", "NOTICE", "COPYING", "CITATION", "AUTHORS", "CHANGELOG"})


def _folders(root: Path, *, quiet: bool = False) -> Iterator[tuple[str, list[str]]]:
    """Each folder under ``root`` (hidden ones left out) and its file names, symlinked folders
    followed (a corpus of links to shards on another disk), each real folder once: a folder
    reached again (a second link, a loop), or a link to ``root`` itself or a folder holding it
    (which would read what lies beside the corpus), is left out, with a warning unless
    ``quiet``. Real folders are visited before links, so a link is what is left out."""
    real_root = os.path.realpath(root)
    seen: set[tuple[int, int]] = set()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        try:
            st = os.stat(dirpath)
        except OSError:  # pragma: no cover - removed while walked
            dirnames[:] = []
            continue
        real = os.path.realpath(dirpath)
        above = dirpath != str(root) and (real == real_root or real_root.startswith(real.rstrip(os.sep) + os.sep))
        if (st.st_dev, st.st_ino) in seen or above:
            if not quiet:
                log.warning("%s: left out: %s", dirpath, "a link to the corpus or a folder holding it" if above else
                            "the same folder as one already read (its files would be read twice)")
            dirnames[:] = []
            continue
        seen.add((st.st_dev, st.st_ino))
        names = [d for d in dirnames if not d.startswith(".")]
        dirnames[:] = sorted(names, key=lambda d: (os.path.islink(os.path.join(dirpath, d)), d))
        yield dirpath, filenames


def _text_files(root: Path, quiet: bool = False) -> tuple[list[Path], int]:
    """The text files of ``root`` in order, and how many images lie beside them (compressed text
    files beside them, not read, are said in a warning, unless ``quiet``)."""
    if root.is_file():
        return [root], 0
    found, images, compressed, json_files, others = [], 0, 0, 0, []
    for dirpath, filenames in _folders(root, quiet=quiet):
        for name in filenames:
            ext = os.path.splitext(name)[1].lower()
            if name.startswith("."):
                continue
            if text_suffix(name):
                found.append(Path(dirpath) / name)
            elif ext in IMAGE_EXTENSIONS:
                images += 1
            elif _unread_compressed(name):
                compressed += 1
            elif _json_name(name):
                json_files += 1
            elif not (name.lower() in METADATA_JSON or (dirpath == str(root) and _is_note(name))):
                others.append(os.path.join(dirpath, name))
    found, copies = _without_compressed_copies(root, _each_file_once(root, found, quiet))
    if quiet:
        return sorted(found, key=lambda p: p.relative_to(root).as_posix()), images
    if copies:
        log.warning("%s: %s left out: the same file uncompressed lies beside %s (gzip -k keeps both); it is read instead",
                    root, f"{len(copies):,} compressed files ({copies[0]}, ...) are" if len(copies) > 1 else f"{copies[0]} is",
                    "each" if len(copies) > 1 else "it")
    if json_files:
        log.warning("%s: %s left out: %s", root, f"{json_files:,} .json files are" if json_files != 1 else "1 .json file is", JSON_ADVICE)
    if compressed:
        log.warning("%s: %s left out: %s", root, f"{compressed:,} compressed files are" if compressed != 1 else "1 compressed file is",
                    UNREAD_ADVICE)
    if others:  # (a.md beside b.txt was left out without a word: a text walkthrough)
        log.warning("%s: %s", root, others_left_out(root, others))
    return sorted(found, key=lambda p: p.relative_to(root).as_posix()), images


def others_left_out(root: Path, others: list[str]) -> str:
    """The warning for files of a corpus folder that no rule reads (``notes.md``, ``rows.csv``):
    how many of each extension, one for example, and how to have them read."""
    counts = Counter(os.path.splitext(name)[1].lower() or "no extension" for name in others)
    kinds = ", ".join(f"{n:,} {ext}" for ext, n in counts.most_common(3)) + (", ..." if len(counts) > 3 else "")
    example = os.path.relpath(min(others), root)
    return (f"{len(others):,} file{'s are' if len(others) != 1 else ' is'} left out ({kinds}; e.g. {example}): packer reads "
            ".txt, .jsonl, .ndjson and .parquet files (compressed too); rename plain-text documents to .txt to convert them")


def _is_note(name: str) -> bool:
    """Whether ``name`` is one of a folder's notes (``README.md``, ``LICENSE``): no document."""
    return name.split(".", 1)[0].upper() in NOTE_NAMES


def _each_file_once(root: Path, files: list[Path], quiet: bool = False) -> list[Path]:
    """``files``, each real file once (a plain file before links to it): a symlink or hard link to
    a file already read (``latest.jsonl -> part-7.jsonl``) is left out, with a warning; its
    documents were stored twice (a walkthrough)."""
    kept, seen, twins = [], {}, []
    for path in sorted(files, key=lambda p: (p.is_symlink(), p.relative_to(root).as_posix())):
        try:
            st = path.stat()
        except OSError:  # (a broken link: the scan records it)
            kept.append(path)
            continue
        if (st.st_dev, st.st_ino) in seen:
            twins.append(f"{path.relative_to(root).as_posix()} is {seen[st.st_dev, st.st_ino]}")
            continue
        seen[st.st_dev, st.st_ino] = path.relative_to(root).as_posix()
        kept.append(path)
    if twins and not quiet:
        log.warning("%s: %s left out: the same file as one already read (%s%s)", root,
                    f"{len(twins):,} files are" if len(twins) > 1 else "1 file is", twins[0], ", ..." if len(twins) > 1 else "")
    return kept


def is_text_corpus(root: str | os.PathLike[str]) -> bool:
    """Whether ``root`` holds text files and no images (how ``packer convert`` tells a corpus);
    one that holds only compressed files packer does not read (``.jsonl.lz4``, ``.parquet.gz``)
    or ``.json`` files is refused with one line saying so (:class:`SourceError`)."""
    root = Path(root)
    if root.is_file():
        if _unread_compressed(root.name):
            raise SourceError(f"{root}: {UNREAD_ADVICE}")
        if _json_name(root.name):
            raise SourceError(f"{root}: a .json file, which packer does not read: {JSON_ADVICE}")
        return text_suffix(root.name) is not None
    has_text, compressed, json_file, others, arrow = False, "", "", False, False
    for dirpath, filenames in _folders(root, quiet=True):
        for name in filenames:
            ext = os.path.splitext(name)[1].lower()
            if ext in IMAGE_EXTENSIONS:
                return False
            has_text = has_text or text_suffix(name) is not None
            compressed = compressed or (os.path.join(dirpath, name) if _unread_compressed(name) else "")
            json_file = json_file or (os.path.join(dirpath, name) if _json_name(name) else "")
            others = others or name.lower().endswith(ARCHIVE_SUFFIXES)
            arrow = arrow or name.endswith(".arrow")
    if arrow and not has_text:  # (its state.json and dataset_info.json would be refused as JSON)
        raise SourceError(f"{root}: holds .arrow files, a Hugging Face dataset saved with save_to_disk: convert it from Python, "
                          f"packer.convert(datasets.load_from_disk(PATH), DST, ...), or write it as Parquet files (Dataset.to_parquet)")
    if json_file and not (has_text or compressed or others):  # (a shard folder has its .json index beside its tars)
        raise SourceError(f"{root}: holds .json files ({json_file}) and nothing else packer reads: {JSON_ADVICE}")
    if compressed and not has_text:
        raise SourceError(f"{root}: holds compressed files ({compressed}): {UNREAD_ADVICE}")
    return has_text


#: What to do with ``.json`` files: they may hold JSON Lines, or one JSON value (a dataset's
#: configuration, an array), which are not documents.
JSON_ADVICE = ("packer reads JSON Lines from .jsonl and .ndjson files (compressed too); if they hold a record a line (as "
               "Hugging Face's Dataset.to_json writes them), rename them to .jsonl (a.json.gz to a.jsonl.gz)")


def _json_name(name: str) -> bool:
    """Whether ``name`` is a ``.json`` file, compressed or not (``c4-train.00000-of-01024.json.gz``),
    other than a dataset's own metadata (Hugging Face's ``dataset_infos.json``: no documents)."""
    stem, ext = os.path.splitext(name.lower())
    if name.lower() in METADATA_JSON:
        return False
    return ext == ".json" or (ext in CODECS and stem.endswith(".json"))


#: JSON files that describe a dataset beside its data (no documents, nothing to rename).
METADATA_JSON = frozenset({"dataset_infos.json", "dataset_info.json", "state.json", "dataset_dict.json"})


def _without_compressed_copies(root: Path, paths: list[Path]) -> tuple[list[Path], list[str]]:
    """``paths`` less each compressed file whose uncompressed file lies beside it (``a.jsonl``
    and ``a.jsonl.gz``: the same documents twice), and those left out, relative to ``root`` (the
    bare name did not say which folder's ``part-0.jsonl.gz`` it was)."""
    plain = {str(path) for path in paths if codec_of(path.name) is None}
    copies = [path for path in paths if codec_of(path.name) is not None and str(path.with_suffix("")) in plain]
    return [path for path in paths if path not in copies], [path.relative_to(root).as_posix() for path in copies]


#: What to do with compressed files packer does not read.
UNREAD_ADVICE = ("packer reads .txt, .jsonl and .ndjson files compressed with gzip, bzip2, xz or zstd (Parquet compresses "
                 "inside the file); decompress others first (lz4 -d, gunzip...)")


def text_suffix(name: str) -> str | None:
    """The text extension of a file packer reads as text (``.jsonl`` for ``a.jsonl`` and
    ``a.jsonl.gz``), or ``None``."""
    stem, ext = os.path.splitext(name.lower())
    if ext in TEXT_EXTENSIONS:
        return ext
    inner = os.path.splitext(stem)[1]
    return inner if codec_of(name) is not None and inner in TEXT_EXTENSIONS and inner != ".parquet" else None


def refuse_text_field_without_records(root: str | os.PathLike[str], kinds: set[str | None] | None = None) -> None:
    """Refuse ``--text-field`` for a corpus without JSON Lines or Parquet files (``kinds``: its
    files' text extensions, found here if not given). The command calls it for a typed
    ``--text-field text`` too, the default, which the scan cannot tell from none (a walkthrough)."""
    if kinds is None:
        kinds = {text_suffix(path.name) for path in _text_files(Path(root), quiet=True)[0]}  # (the scan says its warnings)
    if not kinds & {*JSON_LINES, ".parquet"}:
        raise OptionError(f"--text-field: applies to JSON Lines and Parquet files, and {root} has none; drop it")


def _unread_compressed(name: str) -> bool:
    """Whether the file ``name`` is a compressed text file packer does not read (``a.jsonl.lz4``, ``b.parquet.gz``)."""
    stem, ext = os.path.splitext(name.lower())
    inner = os.path.splitext(stem)[1]
    return inner in TEXT_EXTENSIONS and (ext in UNREAD_SUFFIXES or (ext in CODECS and inner == ".parquet"))


def scan_text(root: str | os.PathLike[str], *, lines: bool = False, text_field: str = "text", split: str | None = None) -> TextCorpus:
    """Find every document of ``root`` (where it is, never its text: packer/sources/text_docs.py);
    raises :class:`SourceError` if there are no text files, :class:`OptionError` (before reading
    any) for ``lines`` without ``.txt`` files or a ``text_field`` other than "text" without JSON
    Lines or Parquet files. ``split``: only the files of that split, as the Hub names them
    (packer/sources/splits.py; without it, files of several splits are said in a warning); the
    notes at the folder's top (``LICENSE.txt``, ``README.txt``...) are left out with a warning."""
    root = Path(root)
    if not root.exists():
        raise SourceError(f"{root}: no such file or folder")
    paths, images = _text_files(root)
    notes = [p for p in paths if p.parent == root and _is_note(p.name)]  # (at SRC's top only)
    if notes and len(notes) < len(paths):  # (the data beside them: LICENSE.txt was document 0 of a Parquet corpus)
        log.warning("%s: %s left out: %s", root, ", ".join(p.relative_to(root).as_posix() for p in notes[:3]) + ("..." if len(notes) > 3 else ""),
                    "a folder's notes, not documents; give their folder to convert them")
        paths = [p for p in paths if p not in notes]
    paths = of_split(paths, root, split, root)
    if not paths:
        raise SourceError(f"{root}: no .txt, .jsonl, .ndjson or .parquet files found")
    kinds = {text_suffix(path.name) for path in paths}  # an option no file uses would be dropped (and recorded as used)
    if lines and ".txt" not in kinds:
        raise OptionError(f"--lines: applies to .txt files, and {root} has none; drop it")
    if text_field != "text":
        refuse_text_field_without_records(root, kinds)
    base = root if root.is_dir() else root.parent
    files: list[TextFile] = []
    rows: list[np.ndarray] = []
    skipped: list[Skipped] = []
    for path in paths:
        name = path.relative_to(base).as_posix()
        ext = text_suffix(path.name)
        try:
            st = path.stat()
        except OSError as exc:
            skipped.append(Skipped(name, f"cannot read ({exc.strerror or exc})"))
            continue
        if not stat.S_ISREG(st.st_mode):  # a named pipe would block the scan forever, outside any worker's --timeout
            skipped.append(Skipped(name, "not a regular file (a named pipe, socket or device): not read"))
            continue
        if not st.st_size and codec_of(path.name) is not None and ext != path.suffix.lower():
            skipped.append(Skipped(name, "an empty file, not a compressed one (0 bytes: an interrupted write?)"))
            continue
        kind = "parquet" if ext == ".parquet" else "json" if ext in JSON_LINES else "text"
        file = TextFile(str(path.resolve()), name, kind, text_field if kind != "text" else None, st.st_size, st.st_mtime_ns,
                        codec=codec_of(path.name) if ext != path.suffix.lower() else None)
        kept = len(rows)
        try:
            found = (_parquet_rows(path, file, len(files), rows) if kind == "parquet" else
                     _document_rows(path, file, len(files), lines or kind == "json", rows))
        except OSError as exc:  # (partway through a file: none of its lines is kept, the file is skipped whole)
            found = f"cannot read ({exc.strerror or exc})" if file.codec is None or exc.errno else f"cannot decompress ({exc})"
        except DECOMPRESS_ERRORS as exc:  # (a damaged compressed file)
            found = f"cannot decompress ({' '.join(str(exc).split()) or type(exc).__name__})"
        if isinstance(found, str):
            del rows[kept:]
            skipped.append(Skipped(name, found))
            continue
        files.append(found)
    docs = Docs(files, np.concatenate(rows) if rows else np.empty(0, DOC_ROW))  # (once: the rows of every file)
    return TextCorpus(root, docs, skipped, files=len(paths), paths=[str(p) for p in paths], images=images)


#: A compressed file's first bytes, and the suffix that has it read through its decompressor.
_COMPRESSED_MAGIC = ((b"\x1f\x8b", ".gz", "gzip"), (b"\x28\xb5\x2f\xfd", ".zst", "zstd"), (b"\xfd7zXZ\x00", ".xz", "xz"))
#: Bytes a scan reads at once to find a file's lines.
_BLOCK = 4 << 20
#: Bytes a blank line may start with: ASCII blanks (those ``str.strip`` removes) and the lead
#: bytes of the other Unicode blanks in UTF-8 (U+0085, U+00A0: C2; U+1680: E1; U+2000-U+205F: E2;
#: U+3000: E3); and end with: ASCII blanks and continuation bytes.
_MAY_START_BLANK = np.zeros(256, bool)
_MAY_START_BLANK[[*BLANK_BYTES, 0xC2, 0xE1, 0xE2, 0xE3]] = True
_MAY_END_BLANK = np.zeros(256, bool)
_MAY_END_BLANK[[*BLANK_BYTES, *range(0x80, 0xC0)]] = True


def _document_rows(path: Path, file: TextFile, index: int, by_line: bool, found: list[np.ndarray]) -> TextFile | str:
    """``file``, the rows of its documents added to ``found``: the whole file, or (``by_line``)
    each line that is not blank, found a block at a time (a line is split at ``\\n`` only, as
    ``wc -l`` and JSON Lines count them; a ``\\r`` before it is not part of it); or why the file
    is skipped whole. A compressed file is read through its decompressor (its places are in the
    decompressed bytes)."""
    with open(path, "rb") if file.codec is None else open_decompressed(path, file.codec) as handle:
        block = handle.read(max(_BLOCK, _SNIFF) if by_line or file.codec else _SNIFF)
        for magic, suffix, codec in _COMPRESSED_MAGIC if file.codec is None else ():  # (gzip named .jsonl: skipped line by line)
            if block.startswith(magic):
                return f"{codec}-compressed data under a plain name: name it {path.name}{suffix} to have it read"
        nuls = block[:_SNIFF].count(b"\x00")
        if nuls and (file.kind != "json" or nuls > max(2, len(block[:_SNIFF]) // 100)):  # a JSON line holding one is its line's
            return ("UTF-16 text (by its byte-order mark), not UTF-8: convert it first (iconv -f UTF-16 -t UTF-8)"  # the file's
                    if block.startswith((b"\xff\xfe", b"\xfe\xff")) else "binary file (contains NUL bytes), not text")  # fault
        if not by_line:
            size = file.size
            if file.codec is not None:  # (its decompressed size: read through)
                size = len(block)
                while block:
                    block = handle.read(_BLOCK)
                    size += len(block)
            if not size:
                return "empty document"
            found.append(_rows(index, np.zeros(1, np.int64), np.zeros(1, np.int64), np.array([size])))
            return file
        number, at = 1, 0  # the next line's number; where this block starts in the file
        begun: list[bytes] = []  # the line not yet ended when this block starts, in pieces (joined once it ends)
        while block:
            ends = np.flatnonzero(np.frombuffer(block, np.uint8) == 10)
            if not len(ends):
                begun.append(block)
            else:
                first = 0
                if begun:  # it ends in this block
                    line = b"".join(begun) + block[: ends[0] + 1]
                    found.append(_line_rows(index, line, number, at - len(line) + ends[0] + 1, np.zeros(1, np.int64), np.array([len(line) - 1])))
                    number, first = number + 1, 1
                starts = np.concatenate([[0], ends[:-1] + 1])[first:]
                found.append(_line_rows(index, block, number, at, starts, ends[first:]))
                number += len(ends) - first
                begun = [block[ends[-1] + 1 :]] if ends[-1] + 1 < len(block) else []
            at += len(block)
            block = handle.read(_BLOCK)
        if begun:  # the last line, without its newline
            line = b"".join(begun)
            found.append(_line_rows(index, line, number, at - len(line), np.zeros(1, np.int64), np.array([len(line)])))
    return file


def _line_rows(index: int, data: bytes, number: int, offset: int, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The rows of the lines of ``data`` (at ``offset`` in the file, the first numbered
    ``number``) from ``starts`` to ``ends`` (each a newline, or the end of the file), blank ones
    (those ``str.strip`` empties) left out."""
    array = np.frombuffer(data, np.uint8)
    ends = ends - ((ends > starts) & (array[np.maximum(ends - 1, 0)] == 13))  # (a CRLF line ends before its CR)
    keep = ends > starts
    maybe = keep & _MAY_START_BLANK[array[np.minimum(starts, len(array) - 1)]] & _MAY_END_BLANK[array[np.maximum(ends - 1, 0)]]
    for line in np.flatnonzero(maybe):  # (rare but in some scripts; each checked here)
        keep[line] = not _blank(data[starts[line] : ends[line]])
    if offset == 0 and len(starts) and starts[0] == 0 and data.startswith(codecs.BOM_UTF8):  # the file's first line
        keep[0] = not _blank(data[len(codecs.BOM_UTF8) : ends[0]])  # (its byte-order mark is no text: a line of only it is blank)
    return _rows(index, number + np.flatnonzero(keep), offset + starts[keep], ends[keep] - starts[keep])


def _blank(line: bytes) -> bool:
    """Whether ``line`` is blank as ``str.strip`` sees it (not UTF-8: not blank, the worker says why)."""
    if not line.strip(BLANK_BYTES):
        return True
    try:
        return not line.decode("utf-8").strip()
    except UnicodeDecodeError:
        return False


def _rows(index: int, lines: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    rows = np.empty(len(lines), DOC_ROW)
    rows["file"], rows["line"], rows["start"], rows["length"] = index, lines, starts, lengths
    return rows


def _parquet_rows(path: Path, file: TextFile, index: int, found: list[np.ndarray]) -> TextFile | str:
    """``file`` with its row groups, its rows added to ``found`` (from its metadata only: the text
    is read as the rows are sent); or why it is skipped whole."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise SourceError(f"{path}: reading Parquet needs pyarrow: pip install pyarrow") from None
    try:
        parquet = pq.ParquetFile(path)
        columns = parquet.schema_arrow.names
        counts = [parquet.metadata.row_group(group).num_rows for group in range(parquet.metadata.num_row_groups)]
    except Exception as exc:  # noqa: BLE001 - pyarrow raises many types for bad files; recorded
        reason = " ".join(str(exc).split())  # pyarrow's messages run over lines: one line
        return f"cannot read Parquet column {file.field!r} ({reason})"
    if file.field not in columns:
        shown = ", ".join(columns[:8]) + (", ..." if len(columns) > 8 else "")
        return f"no Parquet column {file.field!r} (its columns: {shown or 'none'}); pass --text-field"
    kind = parquet.schema_arrow.field(file.field).type
    if not _text_type(kind):
        return f"the Parquet column {file.field!r} holds {kind}, not text; pass --text-field for a column of strings"
    groups = tuple(int(first) for first in np.cumsum([0, *counts]))
    rows = np.arange(groups[-1])
    found.append(_rows(index, rows + 1, rows, np.zeros(len(rows), np.int64)))
    return dataclasses.replace(file, groups=groups)


def _text_type(kind: Any) -> bool:
    """Whether an Arrow type holds strings (plain, large, a view, or dictionary-encoded)."""
    import pyarrow as pa

    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or getattr(pa.types, "is_string_view", lambda _: False)(kind)
