"""Labels from a file: CSV, TSV, JSON or JSONL rows naming an image and its label.

``packer convert images/ out.lmdb --labels train.csv``: each row names an image relative to SRC
(a folder or an archive) and its label. Columns are found by name (``--path-column``,
``--label-column``; by default the first of :data:`PATH_COLUMNS` / :data:`LABEL_COLUMNS`
present, any case, then ignoring ``_``, ``-`` and spaces). Labels are integers when every label is one (used as the class index), else
class names, numbered by sorted name over the *whole* file (every split), so a train and a val
conversion of one file agree on the indices; the names are the dataset's ``classes``. An
integer is written in ASCII digits, ``3`` or ``3.0`` (pandas writes an integer column with an
empty cell as floats); ``1.5`` or ``²`` makes every label a name. A negative integer is an
unknown label (some sets mark unlabeled rows ``-1``), and so is one over
``readers.schema.MAX_LABEL``: that row is skipped.
``--split val`` keeps the rows whose split column (``--split-column``, default ``split``) is
``val``.

A row that cannot be used is skipped and recorded with its reason, like an undecodable image:
no path, no label, a path leaving SRC, a file that is not there, or a path listed again (the
first row wins). A path without an extension matches the one image of that name (Kaggle's
``id`` columns). Samples are ordered as a class folder's are: by label, then by path.

Reading is :func:`read_label_rows` (the file) then :func:`match_rows` (the rows against what
SRC holds, a mapping of relative path to input): the same for a folder and an archive.
"""

from __future__ import annotations

import csv
import hashlib
import json
import logging
import os
import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, TypeVar

from readers.schema import MAX_LABEL, Skipped

from ..errors import OptionError, SourceError
from ..options import SourceOptions
from .rules import IMAGE_EXTENSIONS, image_order, is_hidden

__all__ = ["LISTED_AGAIN", "LABEL_RANGE", "PATH_COLUMNS", "LABEL_COLUMNS", "SPLIT_COLUMNS", "LabelRow", "LabelTable", "Matched", "read_label_rows", "match_rows", "labeled_items",
           "safe_relative", "file_digest"]

T = TypeVar("T")
log = logging.getLogger("packer")

#: The start of the skip reason of a row naming a path an earlier row named (verify tells it from a skipped input).
LISTED_AGAIN = "listed again at"
#: Column names tried, in order, for the image path (any case) when ``--path-column`` is not given.
PATH_COLUMNS = ("path", "filepath", "file_path", "filename", "file_name", "file", "image", "image_path", "image_id", "img", "id", "name")
#: ... and for the label.
LABEL_COLUMNS = ("label", "labels", "class", "class_name", "category", "target", "y")
#: ... and for the split, with ``--split``.
SPLIT_COLUMNS = ("split", "subset", "set", "fold")
#: What a skip reason of a label out of range adds (the row, a WebDataset source's ``.cls``).
LABEL_RANGE = f" from 0 to {MAX_LABEL:,}"
_INTEGER = re.compile(r"(-?[0-9]+)(?:\.0*)?")
#: Label-file suffixes and how each is read.
_FORMATS = {".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".json": "json", ".jsonl": "jsonl", ".ndjson": "jsonl"}


@dataclass(frozen=True)
class LabelRow:
    """One usable row: where it is (``train.csv:12``), the image path as written, the label."""

    where: str
    path: str
    label: int


@dataclass
class LabelTable:
    """What a label file says: its usable rows, the class names, the rows skipped already."""

    rows: list[LabelRow]
    classes: list[str]
    skipped: list[Skipped] = field(default_factory=list)
    #: The file's identity for the resume fingerprint: name, options and a digest of its bytes.
    identity: dict[str, Any] = field(default_factory=dict)
    #: The paths the rows of other splits name (``--split``): left out, not unlisted.
    elsewhere: list[str] = field(default_factory=list)


@dataclass
class Matched:
    """Inputs matched to rows, in sample order, and the rows that matched none."""

    items: list[Any]
    skipped: list[Skipped]
    unlisted: int  # inputs of SRC no row names (a row of another split does name it)


def file_digest(path: str | os.PathLike[str]) -> str:
    """SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_label_rows(options: SourceOptions) -> LabelTable:
    """The rows of ``options.labels`` for ``options.split`` (all rows without a split)."""
    assert options.labels is not None
    path = Path(options.labels)
    kind = _FORMATS.get(path.suffix.lower())
    if kind is None:
        raise OptionError(f"--labels {path}: cannot tell the format from the suffix (use .csv, .tsv, .json or .jsonl)")
    try:
        records = _read_records(path, kind)
    except OSError as exc:
        raise SourceError(f"--labels {path}: cannot read it ({exc.strerror or exc})") from None
    except (ValueError, csv.Error) as exc:
        raise SourceError(f"--labels {path}: not valid {kind.upper()} ({exc})") from None
    if not records:
        raise SourceError(f"--labels {path}: has no rows")
    columns = list(records[0][1])
    path_key = _column(path, columns, options.path_column, PATH_COLUMNS, "--path-column", "path")
    label_key = _column(path, columns, options.label_column, LABEL_COLUMNS, "--label-column", "label")
    split_key = _column(path, columns, options.split_column, SPLIT_COLUMNS, "--split-column", "split") if options.split else None
    values = [_text(record.get(label_key)) for _, record in records]
    integers = all(v is None or _integer(v) is not None for v in values) and any(v is not None for v in values)
    classes = [] if integers else sorted({v for v in values if v is not None})
    index = {name: i for i, name in enumerate(classes)}
    rows: list[LabelRow] = []
    skipped: list[Skipped] = []
    elsewhere: list[str] = []
    for (where, record), label in zip(records, values):
        if split_key is not None and _text(record.get(split_key)) != options.split:
            if (image := _text(record.get(path_key))) is not None:
                elsewhere.append(image)
            continue
        image = _text(record.get(path_key))
        if image is None:
            skipped.append(Skipped(where, f"no {path_key!r} value"))
        elif label is None:
            skipped.append(Skipped(image, f"no {label_key!r} value ({where})"))
        elif integers and not 0 <= _integer(label) <= MAX_LABEL:
            skipped.append(Skipped(image, f"unknown label {label} (not a class index{LABEL_RANGE}; {where})"))
        else:
            rows.append(LabelRow(where, image, _integer(label) if integers else index[label]))
    if split_key is not None and not rows and not skipped:
        found = sorted({v for v in (_text(r.get(split_key)) for _, r in records) if v is not None})
        raise OptionError(f"--split {options.split}: no row of {path} has it in column {split_key!r} (it has: {', '.join(found[:10])})")
    identity = {"labels": str(path.resolve()), "labels_sha256": file_digest(path), "path_column": path_key, "label_column": label_key,
                "split_column": split_key, "split": options.split}
    return LabelTable(rows, classes, skipped, identity, elsewhere)


def match_rows(table: LabelTable, inputs: Mapping[str, T], make: Callable[[T, int], Any], where: str) -> Matched:
    """The inputs ``table`` labels, ``make(input, label)`` each, ordered by label then path.

    ``inputs``: SRC's images by path relative to it (``/``-separated); ``where``: SRC, for reasons.
    """
    stems: dict[str, list[str]] = {}
    for name in inputs:
        stem, ext = posixpath.splitext(name)
        if ext.lower() in IMAGE_EXTENSIONS:
            stems.setdefault(stem, []).append(name)
    def named(path: str) -> str | None:  # the input a row's path names, if it is safe
        name = safe_relative(path)
        if name is not None and name not in inputs and not posixpath.splitext(name)[1] and len(stems.get(name, ())) == 1:
            name = stems[name][0]  # an id without its extension
        return name

    first: dict[str, str] = {}
    keyed: list[tuple[int, list[str], Any]] = []
    skipped = list(table.skipped)
    for row in table.rows:
        name = named(row.path)
        if name is None:
            skipped.append(Skipped(row.path, f"path leaves {where} (absolute, or '..'; {row.where}); refused"))
            continue
        if name not in inputs and any(is_hidden(part) for part in name.split("/")):  # (it may be there: never read)
            skipped.append(Skipped(name, f"a hidden file or folder ({row.where}): packer reads none (a name starting with "
                                         "'.', or a system folder); rename it"))
        elif name not in inputs and len(matches := stems.get(name, ()) if not posixpath.splitext(name)[1] else ()) > 1:
            skipped.append(Skipped(name, f"names {len(matches)} images ({', '.join(sorted(matches)[:3])}{', ...' if len(matches) > 3 else ''}): "
                                         f"give the file name with its extension ({row.where})"))
        elif name not in inputs:
            skipped.append(Skipped(name, f"no such image in {where} ({row.where})"))
        elif name in first:
            skipped.append(Skipped(name, f"{LISTED_AGAIN} {row.where} (the first row, {first[name]}, is used)"))
        else:
            first[name] = row.where
            keyed.append((row.label, image_order(name.split("/")), make(inputs[name], row.label)))
    keyed.sort(key=lambda entry: (entry[0], entry[1]))
    other_splits = {name for path in table.elsewhere if (name := named(path)) in inputs and name not in first}
    return Matched([item for _, _, item in keyed], skipped, len(inputs) - len(first) - len(other_splits))


def labeled_items(matched: Matched, table: LabelTable, src: Any) -> list[Any]:
    """The items ``matched`` gives (a folder's or an archive's alike): the images of ``src`` no row
    names are said in one warning, and none matched is an error naming the first reason."""
    if matched.unlisted:
        many = matched.unlisted != 1
        log.warning("%s in %s %s not in %s (not converted)", f"{matched.unlisted:,} images" if many else "1 image", src,
                    "are" if many else "is", table.identity["labels"])
    if not matched.items:
        first = f" (first: {matched.skipped[0].path}: {matched.skipped[0].reason})" if matched.skipped else ""
        raise SourceError(f"{src}: no image of it is named by a usable row of {table.identity['labels']}{first}")
    return matched.items


def safe_relative(name: str) -> str | None:
    """``name`` as a clean ``/``-separated relative path, or ``None`` if it is absolute or leaves
    its root through ``..`` (also how archive members are checked: packer/sources/archives.py)."""
    name = name.replace("\\", "/")
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        return None
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if not parts or ".." in parts:
        return None
    return "/".join(parts)


def _read_records(path: Path, kind: str) -> list[tuple[str, Mapping[str, Any]]]:
    """``(where, record)`` for each row of the file."""
    if kind in ("csv", "tsv"):
        with open(path, newline="", encoding="utf-8-sig") as handle:
            reader = csv.DictReader(handle, delimiter="," if kind == "csv" else "\t")
            if reader.fieldnames is None:
                return []
            return [(f"{path.name}:{reader.line_num}", row) for row in reader]
    if kind == "jsonl":
        records = []
        with open(path, encoding="utf-8-sig") as handle:
            for number, line in enumerate(handle, 1):
                if line.strip():
                    record = json.loads(line)
                    if not isinstance(record, dict):
                        raise ValueError(f"line {number} is not an object")
                    records.append((f"{path.name}:{number}", record))
        return records
    data = json.loads(path.read_text(encoding="utf-8-sig"))
    if isinstance(data, dict):  # {"path": label, ...}
        return [(f"{path.name}[{key!r}]", {"path": key, "label": value}) for key, value in data.items()]
    if not isinstance(data, list) or not all(isinstance(record, dict) for record in data):
        raise ValueError("expected a list of objects, or an object mapping each path to its label")
    return [(f"{path.name}[{number}]", record) for number, record in enumerate(data)]


def _column(path: Path, columns: list[str], given: str | None, aliases: tuple[str, ...], option: str, what: str) -> str:
    """The column ``given``, else the first alias present in any case, or failing that the first
    ignoring ``_``, ``-`` and spaces too (``ImageId`` is ``image_id``); refused naming the columns."""
    if given is not None:
        if given in columns:
            return given
        raise OptionError(f"{option} {given}: {path} has no such column (it has: {', '.join(columns)})")

    def key(name: str) -> str:
        return "".join(ch for ch in name.strip().lower() if ch not in "_- ")

    lowered = {column.strip().lower(): column for column in columns}  # first as before: any case
    for alias in aliases:
        if alias in lowered:
            return lowered[alias]
    normalised: dict[str, str] = {}  # then without '_', '-' or spaces (Kaggle's ImageId)
    for column in columns:
        normalised.setdefault(key(column), column)
    for alias in aliases:
        if key(alias) in normalised:
            return normalised[key(alias)]
    other = next((sep for sep in (";", "\t", "|") if len(columns) == 1 and sep in columns[0]), None)
    if other is not None:  # ("it has: id;label" then "pass --path-column NAME", which could not help; a newcomer walkthrough)
        raise OptionError(f"--labels {path}: its columns are separated by {other!r} ({columns[0]}); packer reads a .csv by commas "
                          "and a .tsv by tabs: save it so")
    raise OptionError(f"--labels {path}: no {what} column (looked for {', '.join(aliases)}; it has: {', '.join(columns)}); pass {option} NAME")


def _integer(text: str) -> int | None:
    """The integer a label cell's text writes in ASCII digits (``3``, ``-1``, ``3.0``), else ``None``
    (``"²".isdigit()`` is true, and ``int`` raised on it)."""
    match = _INTEGER.fullmatch(text)
    return int(match.group(1)) if match else None


def _text(value: Any) -> str | None:
    """A cell as text (``None`` when empty); JSON integers as their digits, booleans refused as labels."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = str(value).strip()
    return text or None
