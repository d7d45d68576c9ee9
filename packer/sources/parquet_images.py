"""Parquet files of images as SRC: a Hugging Face dataset as the Hub stores it
(``data/train-00000-of-00004.parquet``: an ``image`` column of ``{bytes, path}`` and a
``label`` column), or any Parquet file with a column of encoded image files.

A SRC is such a source (:func:`parquet_image_source`) when it is a ``.parquet`` file, or a folder
whose files packer reads are ``.parquet`` files only, and the first one (by path) has an image
column: the column Hugging Face's metadata types ``Image``, else a struct column with a binary
``bytes`` field, else a binary column, one named as :data:`IMAGE_FIELDS` names (``image``,
``img``, ``jpg``...) first (a Parquet text corpus holds no binary column). Every file must have
that column. The label column is the one the metadata types ``ClassLabel`` (its ``names`` are
the classes), else the first column named as :data:`~packer.sources.datasets.LABEL_FIELDS`
names that holds integers (classes ``"0"``, ``"1"``... up to the largest) or strings (the
classes, sorted, as folder names are); without one, or when every label is null or negative (a
test split's -1), the dataset is unlabeled. ``--image-column`` / ``--label-column``
(``SourceOptions``) name them instead.

Inputs are rows, in file order (by path) then row order, named ``FILE:N`` (row N of the file,
counted from 1, as text corpora's rows are); ``--split NAME`` keeps the files of one split, as
the Hub names them (:func:`split_of`). This process lists the files and reads the label
column only; each worker reads the image bytes of its own rows, a row group's column at a time
(kept for the next rows of that group), so work is handed out a row group at a time, up to
:data:`MAX_CHUNK` rows. A row without image bytes (null, or a ``path`` alone, which Hugging Face
writes for images it did not embed) or with an unusable label is skipped and recorded.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from readers.schema import Skipped

from ..errors import OptionError, SourceError
from ..report import one_line
from .datasets import IMAGE_FIELDS as DATASET_IMAGE_FIELDS, LABEL_FIELDS
from .images import ImageFolder, ImageItem
from .rules import IMAGE_EXTENSIONS, is_hidden

__all__ = ["ParquetRow", "ParquetImages", "parquet_image_source", "scan_parquet_images", "read_row_image", "MAX_CHUNK"]

log = logging.getLogger("packer")

#: Names of a binary column of encoded images (with those of a Python dataset's image field).
IMAGE_FIELDS = (*DATASET_IMAGE_FIELDS, "jpg", "jpeg", "png", "webp", "image_bytes")
#: The most rows of one row group handed to a worker at once.
MAX_CHUNK = 128


@dataclass(frozen=True)
class ParquetRow(ImageItem):
    """A row of a Parquet file: ``path`` is ``FILE:N`` (messages); its image is row ``row`` of
    row group ``group`` of ``file``, in ``column`` (a struct's ``bytes`` field when ``struct``)."""

    file: str = ""
    group: int = 0
    row: int = 0
    column: str = ""
    struct: bool = False


@dataclass(frozen=True)
class ParquetImages(ImageFolder):
    """The rows of Parquet files as an image source: names are relative to ``base`` (the folder
    SRC, or a file SRC's folder), so a file's rows are ``FILE:N`` either way; ``chunk``: a full
    row group's rows, up to :data:`MAX_CHUNK`; ``columns``: the image and label columns."""

    base: str = ""
    columns: dict[str, str] = field(default_factory=dict)

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


def _image_column(schema: Any) -> tuple[str, bool] | None:
    """The image column of ``schema`` and whether it is a ``{bytes, path}`` struct, or ``None``."""
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
    named = [n for n in schema.names if n.lower() in IMAGE_FIELDS]
    for name in named + schema.names:  # (a text corpus holds no binary column)
        if binary(schema.field(name).type):
            return name, False
    return None


def _column_kind(schema: Any, name: str) -> tuple[str, bool] | None:
    """``name`` as an image column of ``schema`` (as :func:`_image_column` gives one), or ``None``."""
    import pyarrow as pa

    fields = pa.schema([schema.field(name)])
    return _image_column(fields)


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
    return files if _image_column(schema) is not None else None


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

    root = Path(src)
    base = str(root.parent if root.is_file() else root)
    if split is not None:
        found = sorted({name for p in files if (name := split_of(p, root)) is not None})
        files = [p for p in files if split_of(p, root) == split]
        if not files:
            raise OptionError(f"--split: no Parquet file of {src} is of the split {split!r} "
                              f"({'its splits: ' + ', '.join(found) if found else 'none is named as a split'})")
    else:
        _warn_of_splits(files, root)
    first = _schema(files[0], src)
    for option, name in (("--image-column", image_column), ("--label-column", label_column)):
        if name is not None and name not in first.names:
            raise OptionError(f"{option}: {files[0].name} has no column {name!r} (its columns: {', '.join(first.names)})")
    image, struct = _image_column(first) if image_column is None else _column_kind(first, image_column) or (None, False)
    if image is None:
        raise OptionError(f"--image-column: column {image_column!r} of {files[0].name} holds no encoded images "
                          f"(it is {first.field(image_column).type}; binary, or a struct with binary 'bytes', is needed)")
    label, names = _label_column(first) if label_column is None else _label_column(pa.schema([first.field(label_column)], metadata=first.metadata), named=True)
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
    labels = [value for *_, value in rows]
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
    columns = {"image_column": image, "label_column": label or ""}
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


def split_of(path: Path, root: Path) -> str | None:
    """The split a Parquet file belongs to, as the Hugging Face Hub names them: the file's name
    up to its first ``-`` when it is a shard (``train-00000-of-00004.parquet``, ``test.parquet``
    too), else the folder it is in below ``root`` (``data/validation/0000.parquet``)."""
    name = path.name[: -len(".parquet")]
    if "-of-" in name or "-" not in name and path.parent == root:
        return name.split("-", 1)[0]
    return path.parent.name if path.parent != root and root in path.parents else None


def _warn_of_splits(files: list[Path], root: Path) -> None:
    """Say when the files are those of several splits (:func:`split_of`): converted together."""
    splits = sorted({name for p in files if (name := split_of(p, root)) is not None})
    if len(splits) > 1:
        log.warning("%s: its Parquet files are those of the splits %s, which are converted together into one dataset; "
                    "to convert one split, pass --split %s", root, ", ".join(splits), splits[0])


_last: tuple[tuple[int, str, int, str], Any] | None = None


def read_row_image(item: ParquetRow) -> bytes:
    """The image bytes of ``item``, read in the worker: its row group's column is read once and
    kept for the group's next rows. Raises ``OSError`` or ``ValueError`` with the reason."""
    global _last
    import pyarrow as pa
    import pyarrow.parquet as pq

    key = (os.getpid(), item.file, item.group, item.column)
    if _last is None or _last[0] != key:
        _last = None
        try:
            column = pq.ParquetFile(item.file).read_row_group(item.group, columns=[item.column]).column(0).combine_chunks()
        except pa.ArrowException as exc:
            raise ValueError(f"cannot read its row group from the Parquet file ({exc})") from None
        _last = (key, column.field("bytes") if item.struct else column)
    values = _last[1]
    if item.row >= len(values):
        raise ValueError("the Parquet file changed since it was listed (its row group is shorter)")
    data = values[item.row].as_py()
    if data is None:
        raise ValueError("the row holds no image bytes" + (" (only a path to the image, not embedded)" if item.struct else ""))
    return data
