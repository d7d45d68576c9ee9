"""Which columns of a Parquet file of images hold the images and the labels (the rules are in
packer/sources/parquet_images.py's docstring): read from the schema, Hugging Face's feature
types in its metadata, and for an unnamed binary column the first value's bytes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .datasets import IMAGE_FIELDS as DATASET_IMAGE_FIELDS, LABEL_FIELDS
from .labels import LABEL_COLUMNS

__all__ = ["IMAGE_FIELDS", "LABEL_NAMES", "image_columns", "given_image_column", "label_columns", "given_label_column",
           "unusable_label_columns", "features"]

#: Names of an image column (with those of a Python dataset's image field), preferred in this order.
IMAGE_FIELDS = (*DATASET_IMAGE_FIELDS, "jpg", "jpeg", "png", "webp", "image_bytes")
#: Names of a label column: a Python dataset's label fields and a label file's label columns
#: (and CIFAR-100's second one, after its first).
LABEL_NAMES = tuple(dict.fromkeys((*LABEL_FIELDS, *LABEL_COLUMNS, "coarse_label")))
#: How encoded images start (JPEG, PNG, GIF, BMP, TIFF both ways, WebP's RIFF).
_IMAGE_MAGIC = (b"\xff\xd8\xff", b"\x89PNG", b"GIF8", b"BM", b"II*\x00", b"MM\x00*", b"RIFF")


def features(schema: Any) -> dict[str, Any]:
    """Hugging Face's feature types from a Parquet schema's metadata (``{}`` without them)."""
    raw = (schema.metadata or {}).get(b"huggingface")
    try:
        found = json.loads(raw)["info"]["features"] if raw else {}
    except (ValueError, KeyError, TypeError):
        return {}
    return found if isinstance(found, dict) else {}


def _binary(kind: Any) -> bool:
    import pyarrow as pa

    view = getattr(pa.types, "is_binary_view", lambda _: False)  # (pyarrow 16 and later)
    return pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or view(kind)


def _struct_of_bytes(kind: Any) -> bool:
    import pyarrow as pa

    return pa.types.is_struct(kind) and kind.get_field_index("bytes") >= 0 and _binary(kind.field("bytes").type)


def _named_first(names: list[str], preferred: tuple[str, ...]) -> list[str]:
    """``names``, those in ``preferred`` first (in its order), then the others as they come."""
    lower = {n.lower(): n for n in reversed(names)}
    first = [lower[p] for p in preferred if p in lower]
    return first + [n for n in names if n not in first]


def _first_is_image(path: Path, column: str) -> bool:
    """Whether the first value of ``column`` in ``path`` that is not null starts as an image file
    does (a binary column named as no image is: a corpus's hashes or ids are not images)."""
    import pyarrow.parquet as pq

    for batch in pq.ParquetFile(path).iter_batches(batch_size=16, columns=[column], use_threads=False):
        for value in batch.column(0).to_pylist():
            if value is not None:
                return value.startswith(_IMAGE_MAGIC)
    return False


def image_columns(schema: Any, path: Path | None = None) -> list[tuple[str, bool]]:
    """The image columns of ``schema``, the preferred first, each with whether it is a ``{bytes,
    path}`` struct: those typed ``Image``, then structs of binary ``bytes``, then binary columns,
    each kind's named as :data:`IMAGE_FIELDS` first (a ``mask`` Image column comes after an
    ``image`` one); a binary column of another name only when its first value (read from
    ``path``) is an image, and only when there is no other."""
    types = {n: f.get("_type") for n, f in features(schema).items() if isinstance(f, dict) and n in schema.names}
    typed = [n for n, kind in types.items() if kind == "Image"]
    other = {n for n, kind in types.items() if kind not in ("Image", "Value", None)}  # (an Audio struct of bytes is no image)
    found: list[tuple[str, bool]] = []
    for name in _named_first(typed, IMAGE_FIELDS):
        kind = schema.field(name).type
        if _struct_of_bytes(kind) or _binary(kind):
            found.append((name, _struct_of_bytes(kind)))
    structs = [n for n in schema.names if _struct_of_bytes(schema.field(n).type) and n not in typed and n not in other]
    found += [(name, True) for name in _named_first(structs, IMAGE_FIELDS)]
    found += [(n, False) for n in _named_first(schema.names, IMAGE_FIELDS)
              if n.lower() in IMAGE_FIELDS and _binary(schema.field(n).type) and n not in typed and n not in other]
    if not found and path is not None:
        found += [(n, False) for n in schema.names
                  if _binary(schema.field(n).type) and n not in other and _first_is_image(path, n)][:1]
    return found


def given_image_column(schema: Any, name: str) -> tuple[str, bool] | None:
    """``name`` (``--image-column``) as an image column: binary, or a struct with a binary
    ``bytes`` field (and whether it is one); ``None`` when it is neither."""
    kind = schema.field(name).type
    if _binary(kind) or _struct_of_bytes(kind):
        return name, _struct_of_bytes(kind)
    return None


def _label_type(kind: Any) -> bool:
    """Integers, floats or strings (a dictionary of them too: pandas' Categorical)."""
    import pyarrow as pa

    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    view = getattr(pa.types, "is_string_view", lambda _: False)
    return (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_string(kind) or pa.types.is_large_string(kind)
            or view(kind))


def label_columns(schema: Any) -> list[tuple[str, list[str] | None]]:
    """The label columns of ``schema``, the preferred first, each with its class names when the
    metadata types it ``ClassLabel``: those, then columns named as :data:`LABEL_NAMES` holding
    integers, whole floats (pandas writes an integer column with a gap so) or strings."""
    found: list[tuple[str, list[str] | None]] = []
    typed = {n: f for n, f in features(schema).items() if isinstance(f, dict) and f.get("_type") == "ClassLabel" and n in schema.names}
    for name in _named_first(list(typed), LABEL_NAMES):
        names = typed[name].get("names")
        if _label_type(schema.field(name).type):
            found.append((name, [str(n) for n in names] if isinstance(names, list) else None))
    found += [(n, None) for n in _named_first(schema.names, LABEL_NAMES)
              if n.lower() in LABEL_NAMES and n not in typed and _label_type(schema.field(n).type)]
    return found


def given_label_column(schema: Any, name: str) -> tuple[str, list[str] | None] | None:
    """``name`` (``--label-column``) as a label column, with its ``ClassLabel`` names, or ``None``."""
    if not _label_type(schema.field(name).type):
        return None
    feature = features(schema).get(name)
    names = feature.get("names") if isinstance(feature, dict) and feature.get("_type") == "ClassLabel" else None
    return name, [str(n) for n in names] if isinstance(names, list) else None


def unusable_label_columns(schema: Any) -> list[str]:
    """Columns named as labels are that hold something else (a list: several labels a row)."""
    return [n for n in schema.names if n.lower() in LABEL_NAMES and not _label_type(schema.field(n).type)]
