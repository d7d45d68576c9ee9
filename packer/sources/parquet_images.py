"""Parquet files of images as SRC: a Hugging Face dataset as the Hub stores it
(``data/train-00000-of-00004.parquet``: an ``image`` column of ``{bytes, path}`` and a
``label`` column), or any Parquet file with a column of encoded image files.

A SRC is such a source (:func:`parquet_image_source`) when it is a ``.parquet`` file, or a folder
holding ``.parquet`` files of which the first readable one (by path) has an image column
(packer/sources/parquet_columns.py: the column typed ``Image`` by Hugging Face's metadata, else
a struct of binary ``bytes``, else a binary column named ``image``, ``img``, ``jpg``..., else a
binary column whose first value starts as an image file does; several: ``image`` before
``mask``). Image files beside them are refused (which to convert?); text files beside them
are left out with a warning. Every file must have the image column. The label column is the
one typed ``ClassLabel`` (its ``names`` are the classes, the same in every file), else the first
named ``label``, ``labels``, ``fine_label``, ``class``, ``class_name``, ``category``, ``target``
or ``y`` that holds integers (used as they are, no class names, as a label file's are; whole
floats too) or strings (the classes, sorted, as folder names are); without one, or when every
label is null or negative (a test split's -1), the dataset is unlabeled. Other image or label
columns are named in a warning. ``--image-column`` / ``--label-column`` (``SourceOptions``)
name them instead; the columns used are recorded in the metadata's ``preprocessing``
(``parquet``), so ``verify --source`` reads the same ones.

Inputs are rows, in file order (by path) then row order, named ``FILE:N`` (row N of the file,
counted from 1, as text corpora's rows are); ``--split NAME`` keeps the files of one split, as
the Hub names them (packer/sources/splits.py). This process lists the files and reads the label column
only; each worker streams the image bytes of its own rows from their row group
(packer/sources/parquet_rows.py), so work is handed out in chunks of a row group's rows (up
to :data:`MAX_CHUNK`), and ``--classes`` keeps the rows' order. A row without image bytes
(null, or a ``path`` alone, which Hugging Face writes for images it did not embed) or with an
unusable label is skipped and recorded; so is a file that cannot be read.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Iterator

from readers.schema import MAX_LABEL, Skipped

from ..errors import OptionError, SourceError
from ..report import one_line
from .images import ImageFolder
from .parquet_columns import given_image_column, given_label_column, image_columns, label_columns, unusable_label_columns
from .parquet_rows import ParquetRow
from .rules import IMAGE_EXTENSIONS, is_hidden
from .splits import of_split

__all__ = ["ParquetImages", "parquet_image_source", "asked_once", "scan_parquet_images", "MAX_CHUNK"]

log = logging.getLogger("packer")

#: The most rows of one row group handed to a worker at once.
MAX_CHUNK = 128


@dataclass(frozen=True)
class ParquetImages(ImageFolder):
    """The rows of Parquet files as an image source: names are relative to ``base`` (the folder
    SRC, or a file SRC's folder), so a file's rows are ``FILE:N`` either way; ``chunk``: a full
    row group's rows, up to :data:`MAX_CHUNK`; ``columns``: the image and label columns and the
    split, as the metadata records them."""

    base: str = ""
    columns: dict[str, str] = field(default_factory=dict)
    class_order: ClassVar[bool] = False  # (rows in order: a worker streams its row group)

    def relative(self, path: str) -> str:
        prefix = self.base.rstrip(os.sep) + os.sep
        return path[len(prefix):] if path.startswith(prefix) else path


def _walk(src: Path) -> tuple[list[Path], str, list[str]]:
    """The ``.parquet`` files of ``src`` (a file, or a folder's, hidden names skipped, by path),
    its first image file (``""``: none) and its text files, as paths relative to ``src``. Every
    conversion of an image folder asks (is it Parquet files of images?), so a file name costs
    a string test or two: nothing is built for an image but the first."""
    from .text import text_suffix

    if src.is_file():
        return ([src] if src.name.lower().endswith(".parquet") else []), "", []
    files, image, texts = [], "", []
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames[:] = sorted(d for d in dirnames if not is_hidden(d))
        images = []
        for name in filenames:
            lower = name.lower()
            if lower.endswith(".parquet"):
                if not is_hidden(name):
                    files.append(Path(dirpath) / name)
            elif "." + lower.rpartition(".")[2] in IMAGE_EXTENSIONS:
                images += [name] if not image and not is_hidden(name) else []
            elif text_suffix(name) is not None and not is_hidden(name):
                texts.append(os.path.relpath(os.path.join(dirpath, name), src).replace(os.sep, "/"))
        if images:
            image = os.path.relpath(os.path.join(dirpath, min(images)), src).replace(os.sep, "/")
    return sorted(files, key=lambda p: p.relative_to(src).as_posix()), image, sorted(texts)


def _first_schema(files: list[Path]) -> tuple[Path, Any] | None:
    """The first of ``files`` whose schema reads, and its schema (a cut download's file is recorded by the scan)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for path in files:
        try:
            return path, pq.read_schema(path)
        except (OSError, pa.ArrowException):
            continue
    return None


#: Answers of :func:`parquet_image_source` within :func:`asked_once` (``None``: outside, none kept).
_answers: dict[str, Any] | None = None


@contextlib.contextmanager
def asked_once() -> Iterator[None]:
    """Within the block, :func:`parquet_image_source` walks each SRC once: a conversion asks from
    several places (the kind, the options that apply, the job), and walking ImageNet's 1.28M
    files takes seconds."""
    global _answers
    outer = _answers
    _answers = {} if outer is None else outer
    try:
        yield
    finally:
        _answers = outer


def parquet_image_source(src: Any) -> list[Path] | None:
    """The Parquet files of ``src`` when it is a Parquet image source (the module doc), else
    ``None``; a :class:`SourceError` when image files lie beside them."""
    if not isinstance(src, (str, os.PathLike)) or "://" in str(src):
        return None
    if _answers is None:
        return _parquet_image_source(src)
    key = os.path.abspath(src)
    if key not in _answers:
        try:
            _answers[key] = _parquet_image_source(src)
        except SourceError as exc:
            _answers[key] = exc
    if isinstance(_answers[key], SourceError):
        raise _answers[key]
    return _answers[key]


def _parquet_image_source(src: str | os.PathLike[str]) -> list[Path] | None:
    root = Path(src)
    if not root.exists():
        return None
    if importlib.util.find_spec("pyarrow") is None:  # without it (the text extra), Parquet files are said as a corpus's are
        return None
    files, image, _ = _walk(root)
    first = _first_schema(files)
    try:
        if first is None or not image_columns(first[1], first[0]):
            return None
    except (OSError, ValueError):  # (pyarrow's errors are both: the scan of a corpus says so)
        return None
    if image:
        raise SourceError(f"{src}: holds Parquet files of images ({first[0].relative_to(root).as_posix()}) and image files "
                          f"({image}); give the folder of the one to convert")
    return files


def scan_parquet_images(src: str | os.PathLike[str], files: list[Path], *, image_column: str | None = None,
                        label_column: str | None = None, split: str | None = None) -> ParquetImages:
    """The rows of ``files`` (:func:`parquet_image_source`'s) as inputs, with their labels;
    ``image_column`` / ``label_column``: the columns to take (default: the module doc's);
    ``split``: only the files of that split (packer/sources/splits.py)."""
    root = Path(os.path.abspath(src))  # (absolute: the resume fingerprint names inputs whatever the spelling of SRC)
    files = of_split([Path(os.path.abspath(p)) for p in files], root, split, src)
    base = str(root.parent if root.is_file() else root)
    texts = _walk(root)[2]
    if texts:
        log.warning("%s: %s left out: the Parquet files' images are converted", src,
                    f"{len(texts):,} text files ({texts[0]}...) are" if len(texts) > 1 else f"1 text file ({texts[0]}) is")
    first = _first_schema(files)
    if first is None:
        raise SourceError(f"{src}: none of its Parquet files can be read")
    image, struct, label, names = _columns(first[1], first[0], image_column, label_column)
    rows, group_rows, skipped, refused = _rows(files, base, first[0], (image, struct), label, names)
    if not rows and not refused:
        raise SourceError(f"{src}: its Parquet files hold no rows")
    labels = [value for *_, value in rows]
    if len({type(v) is str for v in labels if v is not None}) > 1:  # (one file's column of strings, another's of integers)
        raise SourceError(f"{src}: the label column {label!r} holds strings in some files and integers in others; "
                          "give a folder of one dataset's files")
    files_stat = {str(p): f"{(st := os.stat(p)).st_size}:{st.st_mtime_ns}" for p in files}
    labeled = label is not None and any(v is not None and (isinstance(v, str) or v >= 0) for v in labels)
    strings = sorted({v for v in labels if isinstance(v, str)})
    classes = strings or (names if labeled and names is not None else [])
    number = {name: i for i, name in enumerate(strings)}
    items = []
    for file, group, row, n, value in rows:
        path = f"{file}:{n}"
        reason = _label_problem(value, label, names) if labeled else None
        if reason is not None:
            skipped.append(Skipped(os.path.relpath(path, base), reason))
            continue
        target = -1 if not labeled else number[value] if isinstance(value, str) else int(value)
        items.append(ParquetRow(path, target, file=file, group=group, row=row, column=image, struct=struct, stamp=files_stat[file]))
    chunk = max(1, min(MAX_CHUNK, max(group_rows, default=1)))  # (a full row group: the last of a file is shorter)
    stamps = {item.path: f"{item.stamp}:{item.group}:{item.row}" for item in items}
    columns = {"image_column": image, "label_column": label or "", "split": split or ""}
    return ParquetImages(root, items, classes, labeled, refused + skipped, stamps=stamps, refused=refused, base=base, chunk=chunk,
                         columns=columns)


def _columns(schema: Any, path: Path, image_column: str | None, label_column: str | None) -> tuple[str, bool, str | None, list[str] | None]:
    """The image column (and whether a struct), the label column and its class names, of the file
    ``path``: given, or found (the others of each kind named in a warning)."""
    name = path.name
    for option, given in (("--image-column", image_column), ("--label-column", label_column)):
        if given is not None and given not in schema.names:
            raise OptionError(f"{option}: {name} has no column {given!r} (its columns: {', '.join(schema.names)})")
    if image_column is not None:
        found = given_image_column(schema, image_column)
        if found is None:
            raise OptionError(f"--image-column: column {image_column!r} of {name} holds no encoded images "
                              f"(it is {schema.field(image_column).type}; binary, or a struct with binary 'bytes', is needed)")
        image, struct = found
    else:
        candidates = image_columns(schema, path)
        image, struct = candidates[0]
        if len(candidates) > 1:
            log.warning("%s: converting the images of column %r; it also has the image columns %s (--image-column chooses)",
                        name, image, ", ".join(repr(c) for c, _ in candidates[1:]))
    if label_column is not None:
        labeled = given_label_column(schema, label_column)
        if labeled is None:
            raise OptionError(f"--label-column: column {label_column!r} of {name} holds no labels "
                              f"(it is {schema.field(label_column).type}; integers or strings are needed)")
        return image, struct, *labeled
    candidates = label_columns(schema)
    if len(candidates) > 1:
        log.warning("%s: labels from column %r; it also has the label columns %s (--label-column chooses)",
                    name, candidates[0][0], ", ".join(repr(c) for c, _ in candidates[1:]))
    elif not candidates and unusable_label_columns(schema):
        log.warning("%s: column %r holds no single labels (it is %s), so the images convert unlabeled (--label-column chooses another)",
                    name, unusable_label_columns(schema)[0], schema.field(unusable_label_columns(schema)[0]).type)
    return (image, struct, *candidates[0]) if candidates else (image, struct, None, None)


def _rows(files: list[Path], base: str, first: Path, column: tuple[str, bool], label: str | None, names: list[str] | None,
          ) -> tuple[list[tuple[str, int, int, int, Any]], list[int], list[Skipped], list[Skipped]]:
    """Every row of ``files``: (file, group, row in group, row in file, label), the row groups'
    sizes, and what was skipped (rows) and refused (files that cannot be read)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    image, struct = column
    rows: list[tuple[str, int, int, int, Any]] = []
    group_rows: list[int] = []
    refused: list[Skipped] = []
    for path in files:
        file_rows: list[tuple[str, int, int, int, Any]] = []
        try:
            parquet = pq.ParquetFile(path)
            schema = parquet.schema_arrow
            where, other = os.path.relpath(path, base), os.path.relpath(first, base)
            missing = [c for c in (image, label) if c is not None and c not in schema.names]
            if missing:
                raise SourceError(f"{where} has no column {missing[0]!r}, which {other} has (its columns: "
                                  f"{', '.join(schema.names)}); give a folder of one dataset's files")
            kind = given_image_column(schema, image)
            labels = given_label_column(schema, label) if label is not None else None
            if kind is None or kind[1] != struct or (label is not None and labels is None):
                odd = image if kind is None or kind[1] != struct else label
                raise SourceError(f"{where}: its column {odd!r} is {schema.field(odd).type}, not as in {other}; "
                                  "give a folder of one dataset's files")
            if labels is not None and labels[1] is not None and names is not None and labels[1] != names:  # (numbered by the first file's names: wrong)
                raise SourceError(f"{where}: its class names in column {label!r} differ from {other}'s "
                                  f"({', '.join(labels[1][:3])}... against {', '.join(names[:3])}...); give a folder of one dataset's files")
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
    return rows, group_rows, [], refused


def _label_problem(value: Any, column: str | None, names: list[str] | None) -> str | None:
    """Why a row's label cannot be stored (``None``: it can)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return f"no label (column {column!r} holds {value!r})"
    if isinstance(value, str):
        return None
    if isinstance(value, float) and not value.is_integer():
        return f"label {value!r} in column {column!r} is not a class index"
    if value < 0:
        return f"no label (column {column!r} holds {int(value)})"
    if value > MAX_LABEL or (names is not None and value >= len(names)):
        return (f"label {int(value)} in column {column!r} is beyond its {len(names):,} class names (the file's metadata)"
                if names is not None else f"label {int(value):,} is beyond {MAX_LABEL:,} (an int32, as LMDB stores it)")
    return None
