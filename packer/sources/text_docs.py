"""A text corpus's documents as places in its files, read by the workers that tokenise them.

Scanning a corpus (:func:`packer.sources.text.scan_text`) records where each document is, never
its text: one :data:`DOC_ROW` per document (its file, line, byte offset and length, or a
Parquet row's index), 28 bytes, so a corpus larger than the memory lists in little of it, and
no document's text crosses the pipe to a worker. :class:`Docs` is that list as the driver's
sequence of inputs: an entry is a :class:`DocSpan`, made when it is sent, and its text is read
by the worker that tokenises it (:func:`document_texts`: consecutive lines of one file in one
read), decoded and checked there; a line that is not UTF-8 or not JSON, a record without the
field, an empty document come back as :class:`~readers.schema.Skipped` and are recorded as any
input that cannot be converted.

Parquet rows are the exception: a row group is compressed whole, so their text is read in the
driver, a row group at a time as the work units are sent (a :class:`ParquetRow` is pickled as a
:class:`TextDoc`, its text in hand); reading it in the workers would decompress each group once
per worker. A file changed since the scan is not read (its documents are skipped and recorded).
"""

from __future__ import annotations

import bisect
import codecs
import json
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, BinaryIO, Iterator, Sequence, overload

import numpy as np

from readers.schema import Skipped

from .compressed import DECOMPRESS_ERRORS, open_decompressed, read_exactly

__all__ = ["DOC_ROW", "TextFile", "TextDoc", "DocSpan", "ParquetRow", "StreamRow", "Docs", "Changed", "document_texts", "BLANK_BYTES"]

#: One document's place: its file (an index into :attr:`Docs.files`), its line (counted from 1;
#: 0 for a whole file; a Parquet row's number), and its bytes (``start``, ``length``; for a
#: Parquet row, ``start`` is its index in the file).
DOC_ROW = np.dtype([("file", "<u4"), ("line", "<i8"), ("start", "<i8"), ("length", "<i8")])

#: The ASCII characters ``str.strip`` removes: a line of only these is no document.
BLANK_BYTES = b" \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f"

#: At most this many bytes are read at once for consecutive lines of one file.
_READ_AT_ONCE = 32 << 20
#: Decompressed documents the converting process keeps after sending them (:class:`_Streams`):
#: more than the work units in flight hold, for the usual document sizes.
_RECENT_BYTES = 64 << 20


@dataclass(frozen=True)
class TextFile:
    """A file of the corpus: where it is, how it is recorded, how its documents are stored.

    ``kind``: ``"text"`` (the whole file, or with ``--lines`` each line), ``"json"`` (the
    ``field`` of each JSON Lines record) or ``"parquet"`` (the ``field`` column of each row;
    ``groups``: each row group's first row, then the row count). ``size`` and ``mtime_ns``: its
    size and modification time when it was scanned (a file that changed since is not read: its
    documents' places may have moved)."""

    path: str
    name: str
    kind: str
    field: str | None = None
    size: int = 0
    mtime_ns: int = 0
    groups: tuple[int, ...] = ()
    #: The file's compression (packer/sources/compressed.py), or ``None``: places are then in its
    #: decompressed bytes, which the converting process reads (:class:`StreamRow`).
    codec: str | None = None


@dataclass(frozen=True, slots=True)
class TextDoc:
    """A document whose text is in hand (a Parquet row, read by the driver), or why there is none."""

    source: str
    text: str | None
    problem: str = ""

    @property
    def path(self) -> str:
        """Where the document came from (``file:row``), as an image input's path."""
        return self.source


class _InFile:
    """How a document found in a file is named: ``file``, or ``file:line`` (a line, or a Parquet
    row, counted from 1), relative to the corpus; ``path`` as an image input's."""

    __slots__ = ()
    file: TextFile
    line: int

    @property
    def source(self) -> str:
        return f"{self.file.name}:{self.line}" if self.line else self.file.name

    @property
    def path(self) -> str:
        return self.source


@dataclass(frozen=True, slots=True)
class DocSpan(_InFile):
    """A document stored as ``length`` bytes at ``start`` of ``file`` (its line ``line``, or the
    whole file when ``line`` is 0); its text is read where it is tokenised, or comes as ``data``
    (read by the converting process from a compressed file: :class:`StreamRow`)."""

    file: TextFile
    line: int
    start: int
    length: int
    data: bytes | None = None


class Docs(Sequence[Any]):
    """A corpus's documents in order: :data:`DOC_ROW` rows over ``files``. An entry is made
    when it is asked for (a :class:`DocSpan` or a :class:`ParquetRow`, neither holding text); a
    slice is another :class:`Docs` over the same files, and pickles (to a worker) as the list of
    its entries."""

    def __init__(self, files: Sequence[TextFile], rows: np.ndarray, reads: tuple[_RowGroups, _Streams] | None = None) -> None:
        self.files, self.rows = files, rows
        self._reads = reads if reads is not None else (_RowGroups(), _Streams())

    def __len__(self) -> int:
        return len(self.rows)

    @overload
    def __getitem__(self, where: int) -> Any: ...

    @overload
    def __getitem__(self, where: slice) -> Docs: ...

    def __getitem__(self, where: int | slice) -> Any:
        if isinstance(where, slice):
            return Docs(self.files, self.rows[where], self._reads)
        row = self.rows[where]
        file = self.files[int(row["file"])]
        line = int(row["line"])
        if file.kind == "parquet":
            return ParquetRow(file, line, int(row["start"]), self._reads[0])
        if file.codec is not None:
            return StreamRow(file, line, int(row["start"]), int(row["length"]), self._reads[1])
        return DocSpan(file, line, int(row["start"]), int(row["length"]))

    def __iter__(self) -> Iterator[Any]:
        return (self[i] for i in range(len(self.rows)))

    def __reduce__(self) -> tuple[Any, tuple[list[Any]]]:
        return list, (list(self),)


class ParquetRow(_InFile):
    """A Parquet row in the driver: its source, and its text read (its row group's column, by
    :class:`_RowGroups`) only when it is sent to a worker, where it arrives as a
    :class:`TextDoc`; booking its outcome by name reads nothing."""

    __slots__ = ("file", "line", "row", "_groups")

    def __init__(self, file: TextFile, line: int, row: int, groups: _RowGroups) -> None:
        self.file, self.line, self.row, self._groups = file, line, row, groups

    def document(self) -> TextDoc:
        """The row as a :class:`TextDoc`: its text, or why it has none."""
        values = self._groups.column(self.file, self.row)
        if isinstance(values, str):
            return TextDoc(self.source, None, values)
        value = values[self.row - self.file.groups[bisect.bisect_right(self.file.groups, self.row) - 1]]
        return TextDoc(self.source, value) if isinstance(value, str) else TextDoc(self.source, None, f"field {self.file.field!r} is {'null' if value is None else repr(value)}, not a string")

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        document = self.document()
        return TextDoc, (document.source, document.text, document.problem)


class _RowGroups:
    """The driver's reader of Parquet rows: the text column of the two row groups read last, and
    the file they came from open (its footer parsed once). Rows are sent in order, so each row
    group is read about once."""

    def __init__(self) -> None:
        self._read: OrderedDict[tuple[str, int], list[Any] | str] = OrderedDict()
        self._open: tuple[str, Any] | None = None
        self._lock = threading.Lock()  # (the pool may send from another thread than the one booking)

    def column(self, file: TextFile, row: int) -> list[Any] | str:
        """The ``field`` column of the row group holding ``row``, or why it cannot be read."""
        group = bisect.bisect_right(file.groups, row) - 1
        with self._lock:
            values = self._read.get((file.path, group))
            if values is None:
                values = self._read[(file.path, group)] = self._row_group(file, group)
                while len(self._read) > 2:
                    self._read.popitem(last=False)
            self._read.move_to_end((file.path, group))
        return values

    def _row_group(self, file: TextFile, group: int) -> list[Any] | str:
        import pyarrow.parquet as pq  # (scanning found it: a corpus with Parquet files needs pyarrow)

        try:
            now = os.stat(file.path)
            if (now.st_size, now.st_mtime_ns) != (file.size, file.mtime_ns):
                return f"{CHANGED}: not read"
            if self._open is None or self._open[0] != file.path:
                self._open = (file.path, pq.ParquetFile(file.path))
            values = self._open[1].read_row_group(group, columns=[file.field]).column(0).to_pylist()
        except Exception as exc:  # noqa: BLE001 - pyarrow raises many types for bad files; recorded per row
            reason = " ".join(str(exc).split())  # pyarrow's messages run over lines: one line
            return f"cannot read Parquet column {file.field!r} ({reason})"
        if len(values) != file.groups[group + 1] - file.groups[group]:
            return f"{CHANGED}: not read"
        return values

    def __del__(self) -> None:
        if self._open is not None:
            getattr(self._open[1], "close", lambda: None)()  # (its file; pyarrow before 15 has no close)


class StreamRow(_InFile):
    """A document of a compressed file in the driver: its place in the decompressed bytes, read
    (by :class:`_Streams`, in order) only when it is sent to a worker, where it arrives as a
    :class:`DocSpan` with its bytes; booking its outcome by name reads nothing."""

    __slots__ = ("file", "line", "start", "length", "_streams")

    def __init__(self, file: TextFile, line: int, start: int, length: int, streams: _Streams) -> None:
        self.file, self.line, self.start, self.length, self._streams = file, line, start, length, streams

    def document(self) -> DocSpan | TextDoc:
        """The document with its bytes, or (a :class:`TextDoc` without text) why they cannot be read."""
        data = self._streams.read(self.file, self.start, self.length)
        if isinstance(data, str):
            return TextDoc(self.source, None, data)
        return DocSpan(self.file, self.line, self.start, self.length, data)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        document = self.document()
        if isinstance(document, TextDoc):
            return TextDoc, (document.source, None, document.problem)
        return DocSpan, (document.file, document.line, document.start, document.length, document.data)


class _Streams:
    """The driver's reader of compressed files: the one read last stays open where it stopped,
    so documents sent in order decompress each file once; a document before that place reopens
    the file. The documents read last (:data:`_RECENT_BYTES`) are kept: a work unit sent again
    after its worker crashed finds them there, where reading them again decompressed the file
    from its start."""

    def __init__(self) -> None:
        self._open: tuple[str, BinaryIO] | None = None
        self._at = 0
        self._lock = threading.Lock()
        self._recent: OrderedDict[tuple[str, int], bytes] = OrderedDict()
        self._recent_bytes = 0

    def read(self, file: TextFile, start: int, length: int) -> bytes | str:
        """``length`` decompressed bytes at ``start`` of ``file``, or why they cannot be read."""
        with self._lock:
            recent = self._recent.get((file.path, start))
            if recent is not None and len(recent) == length:
                return recent
            data = self._read(file, start, length)
            if isinstance(data, bytes) and length <= _RECENT_BYTES // 4:
                self._recent[(file.path, start)] = data
                self._recent_bytes += len(data)
                while self._recent_bytes > _RECENT_BYTES:
                    self._recent_bytes -= len(self._recent.popitem(last=False)[1])
            return data

    def _read(self, file: TextFile, start: int, length: int) -> bytes | str:
        try:
            if self._open is None or self._open[0] != file.path or start < self._at:
                self._close()
                now = os.stat(file.path)
                if (now.st_size, now.st_mtime_ns) != (file.size, file.mtime_ns):
                    return f"{CHANGED}: not read"
                assert file.codec is not None
                self._open, self._at = (file.path, open_decompressed(file.path, file.codec)), 0
            reader = self._open[1]
            while self._at < start:
                skipped = len(reader.read(min(start - self._at, 16 << 20)))
                if not skipped:
                    break
                self._at += skipped
            data = read_exactly(reader, length) if self._at == start else b""
            self._at += len(data)
        except FileNotFoundError:
            self._close()
            return f"{CHANGED} (it is gone): not read"
        except DECOMPRESS_ERRORS as exc:
            self._close()
            return f"cannot decompress ({' '.join(str(exc).split()) or type(exc).__name__})"
        if len(data) != length:
            self._close()
            return f"{CHANGED} (shorter): not read"
        return data

    def _close(self) -> None:
        if self._open is not None:
            self._open[1].close()
        self._open, self._at = None, 0

    def __del__(self) -> None:
        self._close()


def document_texts(docs: Sequence[Any]) -> list[str | Skipped]:
    """Each document's text, or why it cannot be converted (a :class:`Skipped`): read from its
    file (consecutive lines of one file in one read), decoded as UTF-8, a JSON record's field
    taken, empty documents refused. Runs in the worker that tokenises them."""
    texts: list[str | Skipped] = []
    i = 0
    while i < len(docs):
        doc = docs[i]
        if isinstance(doc, (ParquetRow, StreamRow)):  # (not sent: read here)
            doc = doc.document()
        if isinstance(doc, DocSpan) and doc.data is not None:
            texts.append(_text(doc, doc.data))
            i += 1
            continue
        if isinstance(doc, TextDoc):
            texts.append(_skipped(doc.source, doc.problem) if doc.text is None else _nonempty(doc.source, doc.text))
            i += 1
            continue
        j = i + 1
        while (j < len(docs) and isinstance(docs[j], DocSpan) and docs[j].data is None and docs[j].file.path == doc.file.path
               and docs[j].start >= docs[j - 1].start + docs[j - 1].length and docs[j].start + docs[j].length - doc.start <= _READ_AT_ONCE):
            j += 1
        run = docs[i:j]
        data, problem = _read(doc.file, doc.start, run[-1].start + run[-1].length - doc.start)
        texts.extend(_skipped(d.source, problem) if data is None else _text(d, data[d.start - doc.start : d.start - doc.start + d.length])
                     for d in run)
        i = j
    return texts


class Changed(Skipped):
    """A document whose file changed since the scan: not read (the conversion stops: packer/engine.py)."""


#: How the reason for a document whose file changed since the scan starts.
CHANGED = "the file changed since it was scanned"


def _skipped(source: str, problem: str) -> Skipped:
    return (Changed if problem.startswith(CHANGED) else Skipped)(source, problem)


def _read(file: TextFile, start: int, length: int) -> tuple[bytes | None, str]:
    """``length`` bytes at ``start`` of ``file``, or ``None`` and why not."""
    try:
        with open(file.path, "rb") as handle:
            now = os.fstat(handle.fileno())
            if now.st_size != file.size:
                return None, f"{CHANGED} ({file.size:,} bytes then, {now.st_size:,} now): not read"
            if now.st_mtime_ns != file.mtime_ns:
                return None, f"{CHANGED} (modified since, same size): not read"
            data = os.pread(handle.fileno(), length, start) if length else b""
    except FileNotFoundError:
        return None, f"{CHANGED} (it is gone): not read"
    except OSError as exc:
        return None, f"cannot read ({exc.strerror or exc})"
    if len(data) != length:
        return None, f"{CHANGED} (shorter): not read"
    return data, ""


def _text(doc: DocSpan, raw: bytes) -> str | Skipped:
    """The text of ``doc`` from its bytes ``raw`` (a UTF-8 byte-order mark at the start of its
    file left out, as ``utf-8-sig`` does), or why it is skipped."""
    if not doc.start and raw.startswith(codecs.BOM_UTF8):
        raw = raw[len(codecs.BOM_UTF8) :]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Skipped(doc.source, f"invalid UTF-8 at byte {exc.start}{' of the line' if doc.line else ''}")
    if doc.file.kind != "json":
        if "\x00" in text:  # (a file's first 8 KB were sniffed: a NUL later, or in a line, was stored as a token)
            return Skipped(doc.source, "holds NUL bytes: binary, not text")
        return _nonempty(doc.source, text)
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        return Skipped(doc.source, f"not JSON ({exc.msg}: column {exc.colno})")
    field = doc.file.field
    if not isinstance(record, dict):  # (a JSON array or a bare string on one line: 'no string field' blamed --text-field)
        kind = {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(record), "number")
        return Skipped(doc.source, f"a JSON {kind}, not an object: JSON Lines hold one object a line")
    value = record.get(field) if isinstance(record, dict) else None
    if not isinstance(value, str):
        strings = [key for key, item in record.items() if isinstance(item, str)][:8] if isinstance(record, dict) else []
        hint = f" (its string fields: {', '.join(map(repr, strings))}; pass --text-field)" if strings and field not in record else ""
        if isinstance(record, dict) and field in record:  # ("text": null is there, but not a string)
            return Skipped(doc.source, f"field {field!r} is {json.dumps(value)[:40]}, not a string")
        return Skipped(doc.source, f"no string field {field!r}{hint}")
    return _nonempty(doc.source, value)


def _nonempty(source: str, text: str) -> str | Skipped:
    return text if text.strip() else Skipped(source, "empty document" + (" (whitespace only)" if text else ""))
