"""Parquet files of images as SRC: a Hugging Face dataset as the Hub stores it
(``data/train-00000-of-00004.parquet``: an ``image`` column of ``{bytes, path}`` and a
``label`` column), or any Parquet file with a column of encoded image files.

A SRC is such a source (:func:`parquet_image_source`) when it is a ``.parquet`` file, or a folder
whose files packer reads are ``.parquet`` files only, and the first one (by path) has an image
column: the column Hugging Face's metadata types ``Image``, else a struct column with a binary
``bytes`` field, else a binary column named as :data:`IMAGE_FIELDS` names (``image``, ``img``,
``jpg``...), else a binary column whose first value starts as an image file does (a corpus's
column of hashes or ids is no image column). Every file must have that column. The label column is the one the metadata types ``ClassLabel`` (its ``names`` are
the classes), else the first column named as :data:`~packer.sources.datasets.LABEL_FIELDS`
names that holds integers (classes ``"0"``, ``"1"``... up to the largest) or strings (the
classes, sorted, as folder names are); without one, or when every label is null or negative (a
test split's -1), the dataset is unlabeled. ``--image-column`` / ``--label-column``
(``SourceOptions``) name them instead.

Inputs are rows, in file order (by path) then row order, named ``FILE:N`` (row N of the file,
counted from 1, as text corpora's rows are); ``--split NAME`` keeps the files of one split, as
the Hub names them (:func:`split_of`). This process lists the files and reads the label
column only; each worker streams the image bytes of its own rows from their row group
(packer/sources/parquet_rows.py), so work is handed out a row group at a time, up to
:data:`MAX_CHUNK` rows, and ``--classes`` keeps the rows' order. A row without image bytes (null, or a ``path`` alone, which Hugging Face
writes for images it did not embed) or with an unusable label is skipped and recorded.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from readers.schema import Skipped

from ..errors import OptionError, SourceError
from ..report import one_line
from .datasets import IMAGE_FIELDS as DATASET_IMAGE_FIELDS, LABEL_FIELDS
from .images import ImageFolder
from .parquet_rows import ParquetRow
from .rules import IMAGE_EXTENSIONS, is_hidden

__all__ = ["ParquetImages", "parquet_image_source", "scan_parquet_images", "split_of", "MAX_CHUNK"]

log = logging.getLogger("packer")

#: Names of a binary column of encoded images (with those of a Python dataset's image field).
IMAGE_FIELDS = (*DATASET_IMAGE_FIELDS, "jpg", "jpeg", "png", "webp", "image_bytes")
#: The most rows of one row group handed to a worker at once.
MAX_CHUNK = 128


@dataclass(frozen=True)
class ParquetImages(ImageFolder):
    """The rows of Parquet files as an image source: names are relative to ``base`` (the folder
    SRC, or a file SRC's folder), so a file's rows are ``FILE:N`` either way; ``chunk``: a full
    row group's rows, up to :data:`MAX_CHUNK`; ``columns``: the image and label columns."""

    base: str = ""
    columns: dict[str, str] = field(default_factory=dict)
    class_order: ClassVar[bool] = False  # (rows in order: a worker streams its row group)

    def relative(self, path: str) -> str:
        prefix = self.base.rstrip(os.sep) + os.sep
        return path[len(prefix):] if path.startswith(prefix) else path


def _parquet_files(src: Path) -> list[Path] | None:
    """The ``.parquet`` files of ``src`` (a file, or a folder's, hidden names skipped, by path),
    or ``None`` when it holds images or text files besides them (not a Parquet source)."""
    from .text import text_suffix

    if src.is_file():
        return [src] if src.name.lower().endswith(".parquet") else None
    files = []
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames[:] = sorted(d for d in dirnames if not is_hidden(d))
        for name in filenames:
            if is_hidden(name):
                continue
            lower = name.lower()
            if lower.endswith(".parquet"):
                files.append(Path(dirpath) / name)
            elif os.path.splitext(lower)[1] in IMAGE_EXTENSIONS or text_suffix(name) is not None:
                return None
    return sorted(files, key=lambda p: p.relative_to(src).as_posix()) or None


def _features(schema: Any) -> dict[str, Any]:
    """Hugging Face's feature types from a Parquet schema's metadata (``{}`` without them)."""
    raw = (schema.metadata or {}).get(b"huggingface")
    try:
        features = json.loads(raw)["info"]["features"] if raw else {}
    except (ValueError, KeyError, TypeError):
        return {}
    return features if isinstance(features, dict) else {}


#: How encoded images start (JPEG, PNG, GIF, BMP, TIFF both ways, WebP's RIFF).
_IMAGE_MAGIC = (b"\xff\xd8\xff", b"\x89PNG", b"GIF8", b"BM", b"II*\x00", b"MM\x00*", b"RIFF")


def _first_is_image(path: Path, column: str) -> bool:
    """Whether the first value of ``column`` in ``path`` that is not null starts as an image file
    does (a binary column named as no image is: a corpus's hashes or ids are not images)."""
    import pyarrow.parquet as pq

    for batch in pq.ParquetFile(path).iter_batches(batch_size=16, columns=[column], use_threads=False):
        for value in batch.column(0).to_pylist():
            if value is not None:
                return value.startswith(_IMAGE_MAGIC)
    return False


def _image_column(schema: Any, path: Path | None = None) -> tuple[str, bool] | None:
    """The image column of ``schema`` and whether it is a ``{bytes, path}`` struct, or ``None``;
    a binary column of another name counts when its first value is an image (read from ``path``)."""
    import pyarrow as pa

    def binary(t: Any) -> bool:
        return pa.types.is_binary(t) or pa.types.is_large_binary(t)

    def struct_of_bytes(t: Any) -> bool:
        return pa.types.is_struct(t) and t.get_field_index("bytes") >= 0 and binary(t.field("bytes").type)

    features = _features(schema)
    typed = [n for n, f in features.items() if isinstance(f, dict) and f.get("_type") == "Image" and n in schema.names]
    for name in typed + [n for n in schema.names if struct_of_bytes(schema.field(n).type)]:
        kind = schema.field(name).type
        if struct_of_bytes(kind) or binary(kind):
            return name, struct_of_bytes(kind)
    for name in schema.names:
        if name.lower() in IMAGE_FIELDS and binary(schema.field(name).type):
            return name, False
    for name in schema.names if path is not None else ():
        if binary(schema.field(name).type) and _first_is_image(path, name):
            return name, False
    return None


def _column_kind(schema: Any, name: str) -> tuple[str, bool] | None:
    """``name`` (given: ``--image-column``) as an image column of ``schema``: binary, or a struct
    with a binary ``bytes`` field (whether it is one), else ``None``."""
    import pyarrow as pa

    kind = schema.field(name).type
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return name, False
    if pa.types.is_struct(kind) and kind.get_field_index("bytes") >= 0:
        inner = kind.field("bytes").type
        return (name, True) if pa.types.is_binary(inner) or pa.types.is_large_binary(inner) else None
    return None


def _label_column(schema: Any, *, named: bool = False) -> tuple[str | None, list[str] | None]:
    """The label column (or ``None``) and its class names when the metadata has them; ``named``:
    any column of ``schema`` that holds labels, whatever its name."""
    import pyarrow as pa

    for name, feature in _features(schema).items():
        if isinstance(feature, dict) and feature.get("_type") == "ClassLabel" and name in schema.names:
            names = feature.get("names")
            return name, [str(n) for n in names] if isinstance(names, list) else None
    for name in schema.names:
        kind = schema.field(name).type
        if (named or name.lower() in LABEL_FIELDS) and (pa.types.is_integer(kind) or pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            return name, None
    return None, None


def parquet_image_source(src: Any) -> list[Path] | None:
    """The Parquet files of ``src`` when it is a Parquet image source (the module doc), else ``None``."""
    if not isinstance(src, (str, os.PathLike)) or "://" in str(src):
        return None
    root = Path(src)
    if not root.exists():
        return None
    files = _parquet_files(root)
    if not files:
        return None
    try:
        schema = _schema(files[0], root)
    except SourceError:  # (an unreadable file: a text corpus's scan says so, file by file)
        return None
    try:
        return files if _image_column(schema, files[0]) is not None else None
    except (OSError, ValueError):  # (pyarrow's errors are both: the scan of a corpus says so)
        return None


def _schema(path: Path, src: Any) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_schema(path)
    except (OSError, pa.ArrowException) as exc:
        raise SourceError(f"{src}: cannot read {path.name} as a Parquet file ({exc})") from None


def scan_parquet_images(src: str | os.PathLike[str], files: list[Path], *, image_column: str | None = None,
                        label_column: str | None = None, split: str | None = None) -> ParquetImages:
    """The rows of ``files`` (:func:`parquet_image_source`'s) as inputs, with their labels;
    ``image_column`` / ``label_column``: the columns to take (default: the module doc's);
    ``split``: only the files of that split (:func:`split_of`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = Path(os.path.abspath(src))  # (absolute: the resume fingerprint names inputs whatever the spelling of SRC)
    files = [Path(os.path.abspath(p)) for p in files]
    base = str(root.parent if root.is_file() else root)
    if split is not None:
        found = sorted({name for p in files if (name := split_of(p, root)) is not None})
        files = [p for p in files if split_of(p, root) == split]
        if not files:
            what = (f"SRC is one Parquet file, {'of the split ' + found[0] if found else 'named as no split'}; drop --split"
                    if root.is_file() else f"no Parquet file of {src} is of the split {split!r} "
                    f"({'its splits: ' + ', '.join(found) if found else 'none is named as a split'})")
            raise OptionError(f"--split: {what}")
    else:
        _warn_of_splits(files, root)
    first = _schema(files[0], src)
    for option, name in (("--image-column", image_column), ("--label-column", label_column)):
        if name is not None and name not in first.names:
            raise OptionError(f"{option}: {files[0].name} has no column {name!r} (its columns: {', '.join(first.names)})")
    found = _image_column(first, files[0]) if image_column is None else _column_kind(first, image_column)
    image, struct = found if found is not None else (None, False)
    if image is None:
        raise OptionError(f"--image-column: column {image_column!r} of {files[0].name} holds no encoded images "
                          f"(it is {first.field(image_column).type}; binary, or a struct with binary 'bytes', is needed)")
    label, names = (_label_column(first) if label_column is None
                    else _label_column(pa.schema([first.field(label_column)], metadata=first.metadata), named=True))
    if label_column is not None and label is None:
        raise OptionError(f"--label-column: column {label_column!r} of {files[0].name} holds no labels "
                          f"(it is {first.field(label_column).type}; integers or strings are needed)")
    rows: list[tuple[str, int, int, int, Any]] = []  # (file, group, row in group, row in file, label)
    skipped: list[Skipped] = []
    refused: list[Skipped] = []  # unreadable files: input errors (--on-error fail stops at them)
    group_rows = []
    for path in files:
        file_rows: list[tuple[str, int, int, int, Any]] = []
        try:
            parquet = pq.ParquetFile(path)
            schema = parquet.schema_arrow
            if image not in schema.names or (label is not None and label not in schema.names):
                missing = image if image not in schema.names else label
                raise SourceError(f"{src}: {path.name} has no column {missing!r}, which {files[0].name} has "
                                  f"(its columns: {', '.join(schema.names)}); give a folder of one dataset's files")
            numbered = 0
            for group in range(parquet.num_row_groups):
                count = parquet.metadata.row_group(group).num_rows
                group_rows.append(count)
                values = parquet.read_row_group(group, columns=[label]).column(0).to_pylist() if label else [None] * count
                file_rows.extend((str(path), group, i, numbered + i + 1, value) for i, value in enumerate(values))
                numbered += count
        except (OSError, pa.ArrowException) as exc:  # its rows are lost, said and recorded as an unreadable image is
            refused.append(Skipped(os.path.relpath(path, base), f"cannot read it as a Parquet file ({one_line(str(exc))})"))
            continue
        rows.extend(file_rows)
    if not rows and not refused:
        raise SourceError(f"{src}: its Parquet files hold no rows")
    labels = [value for *_, value in rows]
    if len({type(v) is str for v in labels if v is not None}) > 1:  # (one file's column of strings, another's of integers)
        raise SourceError(f"{src}: the label column {label!r} holds strings in some files and integers in others; "
                          "give a folder of one dataset's files")
    labeled = label is not None and any(v is not None and (isinstance(v, str) or v >= 0) for v in labels)
    classes, number = _classes(labels, names, label, src) if labeled else ([], {})
    items = []
    for file, group, row, n, value in rows:
        path = f"{file}:{n}"
        if not labeled:
            target = -1
        elif value is None or (not isinstance(value, str) and value < 0):
            skipped.append(Skipped(os.path.relpath(path, base), f"no label (column {label!r} holds {value!r})"))
            continue
        else:
            target = number[value] if isinstance(value, str) else value
        items.append(ParquetRow(path, target, file=file, group=group, row=row, column=image, struct=struct))
    chunk = max(1, min(MAX_CHUNK, max(group_rows, default=1)))  # (a full row group: the last of a file is shorter)
    files_stat = {str(p): f"{(st := os.stat(p)).st_size}:{st.st_mtime_ns}" for p in files}
    stamps = {item.path: f"{files_stat[item.file]}:{item.group}:{item.row}" for item in items}
    columns = {"image_column": image, "label_column": label or "", "split": split or ""}
    return ParquetImages(root, items, classes, labeled, refused + skipped, stamps=stamps, refused=refused, base=base, chunk=chunk,
                         columns=columns)


def _classes(labels: list[Any], names: list[str] | None, column: str | None, src: Any) -> tuple[list[str], dict[str, int]]:
    """The class names and, for string labels, each one's number (sorted, as folder names are)."""
    strings = sorted({v for v in labels if isinstance(v, str)})
    if strings:  # (a column holds one type: strings, or numbers)
        return strings, {name: i for i, name in enumerate(strings)}
    top = max(v for v in labels if v is not None)
    if names is not None and top >= len(names):
        raise SourceError(f"{src}: label {top} in column {column!r} is beyond its {len(names)} class names (the file's metadata)")
    return (names if names is not None else [str(i) for i in range(top + 1)]), {}


_SHARD = re.compile(r"(?P<split>.+?)-\d+-of-\d+")


def split_of(path: Path, root: Path) -> str | None:
    """The split a Parquet file belongs to, as the Hugging Face Hub names them: a shard's name up
    to its number (``train-00000-of-00004.parquet``), else the folder it is in below ``root``
    (``validation/0000.parquet``, as the Hub's Parquet conversions are); ``None`` otherwise."""
    match = _SHARD.fullmatch(path.name[: -len(".parquet")])
    if match:
        return match["split"]
    return path.parent.name if path.parent != root and root in path.parents else None


def _warn_of_splits(files: list[Path], root: Path) -> None:
    """Say when the files are those of several splits (:func:`split_of`): converted together."""
    splits = sorted({name for p in files if (name := split_of(p, root)) is not None})
    if len(splits) > 1:
        log.warning("%s: its Parquet files are those of the splits %s, which are converted together into one dataset; "
                    "to convert one split, pass --split %s", root, ", ".join(splits), splits[0])
