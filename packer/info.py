"""``packer info``: a packed dataset's metadata, for a person or as JSON; of a local path, or
of a WebDataset or blob at a URL (read in place: readers/formats/remote.py), alike."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Iterator

from readers.formats import open_store
from readers.formats.base import dataset_path
from readers.formats.remote import is_remote, open_remote_store
from readers.formats.remote_shards import folder_url
from readers.formats.webdataset import read_metadata as read_shard_metadata
from readers.schema import Metadata

from .errors import DatasetReadError
from .report import MAX_LISTED, one_line
from .writers.webdataset import brace_pattern

__all__ = ["read_metadata", "dataset_info", "remote_reads", "describe", "disk_usage", "streamed_as"]


def read_metadata(path: str | Path) -> Metadata:
    """Open any packed dataset (without torch) and return its validated metadata."""
    return open_store(path).meta


def dataset_info(path: str | Path, *, as_json: bool = False) -> str:
    """``packer info PATH``: :func:`describe` of the dataset at a local path, or at a URL (its
    size: the bytes stored there, as its listing says)."""
    if is_remote(path):
        with remote_reads(path):
            store = open_remote_store(str(path))
            return describe(path, store.meta, as_json=as_json, size=store.stored_bytes())
    return describe(path, read_metadata(path), as_json=as_json)


@contextlib.contextmanager
def remote_reads(path: str | Path) -> Iterator[None]:
    """Reads of the dataset at ``path``: where it is a URL, one that fails (a server that does not
    answer, refused credentials, a missing fsspec backend) is a :class:`DatasetReadError` naming
    it, in one line (a missing object is said where it is found missing)."""
    try:
        yield
    except FileNotFoundError:
        raise
    except (OSError, ImportError) as exc:
        if not is_remote(path):
            raise
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise DatasetReadError(f"{path}: cannot be read ({type(exc).__name__}: {first}); check the URL, the network "
                               "and the credentials") from None


def disk_usage(path: str | Path) -> int:
    """Bytes on disk of a file or of every file under a folder."""
    p = Path(path)
    if p.is_file():
        return p.stat().st_size
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(p) for f in files)


def describe(path: str | Path, meta: Metadata, *, as_json: bool = False, size: int | None = None) -> str:
    """Render ``meta`` as aligned text (or JSON with the on-disk size added); ``size``: the
    dataset's bytes (default: :func:`disk_usage` of the local ``path``)."""
    size = disk_usage(path) if size is None else size
    if as_json:
        data = meta.to_dict()
        data["path"] = str(path)
        data["bytes_on_disk"] = size
        return json.dumps(data, indent=2, sort_keys=True)
    if meta.kind == "text":
        return _describe_text(path, meta, size)
    pre = meta.preprocessing
    shape = "x".join(map(str, meta.shape)) + " (C x H x W)" if meta.shape else "variable"
    classes = _classes(meta)
    size_text = "x".join(map(str, pre.get("size") or [])) or "original"
    resize_text = f" after the shorter side to {pre['resize']}" if pre.get("resize") else ""
    rows = [
        ("format", f"{meta.format}, format version {meta.format_version}, written by packer {meta.tool_version}"),
        ("created", meta.created),
        ("samples", f"{meta.count:,}"),
        ("shape", shape),
        ("storage", f"{meta.dtype} {meta.layout}, {meta.encoding}{_quality(pre)}{_compression(meta)}"),
        ("classes", classes),
        ("preprocess", f"{_geometry(pre, size_text)}{resize_text}, {'grayscale' if pre.get('grayscale') else 'RGB'}"),
        ("source", meta.source),
        ("on disk", f"{size:,} bytes"),
        ("skipped", f"{len(meta.skipped):,}"),
    ]
    return _render(path, rows, meta)


def streamed_as(path: str | Path) -> str | None:
    """How webdataset reads the local WebDataset at ``path`` (its brace pattern and shard count),
    for the line after a conversion; ``None`` where its metadata cannot be read (a URL) or its
    shards follow no pattern. Only its record is read (opening the store loads the index and
    checks every shard, which the conversion has just written)."""
    folder = dataset_path(path)
    try:
        meta = read_shard_metadata(folder)
    except (OSError, ValueError):
        return None
    braces = brace_pattern(str(folder), meta)
    count = len(meta.extra.get("shards") or [])
    return f"{braces!r} ({count:,} shard{'s' if count != 1 else ''})" if braces else None


def _shards(path: str | Path, meta: Metadata) -> str:
    """The ``shards`` row: how many, and the brace pattern webdataset reads them by."""
    count = len(meta.extra.get("shards") or [])
    braces = brace_pattern(folder_url(path) if is_remote(path) else str(dataset_path(path)), meta)  # type: ignore[arg-type]
    return f"{count:,}" + (f": {braces}" if braces else "")


def _geometry(pre: dict, size_text: str) -> str:
    """What was done to each image's size: ``--resize-mode shorter`` scales the shorter side to
    the size's height (the other side follows), every other mode makes ``size``."""
    if pre.get("resize_mode") == "shorter" and pre.get("size"):
        return f"shorter side to {pre['size'][0]} (the other follows its aspect ratio)"
    return f"size {size_text}, {pre.get('resize_mode')}"


def _quality(pre: dict) -> str:
    """The JPEG quality samples were stored at (``--encoding jpeg``), or nothing."""
    return f" (quality {pre['quality']})" if pre.get("encoding") == "jpeg" and pre.get("quality") else ""


def _compression(meta: Metadata) -> str:
    """The ``storage`` row's compression (HDF5 ``--compression``), or nothing."""
    return f", {meta.extra['compression']} compression" if meta.extra.get("compression") else ""


def _classes(meta: Metadata) -> str:
    """The ``classes`` row: the names, or what labels a dataset without names has. Integer labels
    (``--labels`` of integers, a WebDataset source's ``.cls``, a Python dataset without
    ``classes``) are their own class indices; the metadata does not record their range, and
    finding it reads every sample's record (all the pixels, in LMDB and HDF5), so info does not."""
    if meta.classes:
        text = f"{len(meta.classes)}: " + ", ".join(meta.classes[:MAX_LISTED])
        more = len(meta.classes) - MAX_LISTED
        return text + (f", ... ({more} more)" if more > 0 else "")
    if meta.labeled:
        return "integer labels without names (each label is its own class index)"
    return "none (unlabeled)"


def _describe_text(path: str | Path, meta: Metadata, size: int) -> str:
    """``packer info`` of a text dataset: tokenizer, documents and tokens."""
    tok = meta.tokenizer
    sha = str(tok.get("sha256") or "")
    rows = [
        ("format", f"{meta.format}, format version {meta.format_version}, written by packer {meta.tool_version}"),
        ("created", meta.created),
        ("documents", f"{meta.count:,}"),
        ("tokens", f"{meta.tokens:,} ({meta.tokens / max(meta.count, 1):,.1f} per document, {'EOS included' if tok.get('eos_id') is not None else 'no EOS'}{', BOS too' if tok.get('bos_id') is not None else ''})"),
        ("storage", f"{meta.dtype} {meta.layout}{_compression(meta)}"),
        ("tokenizer", " ".join(dict.fromkeys(str(tok.get(k)) for k in ("kind", "name")))  # ("bytes bytes" once)
                      + f", vocab {tok.get('vocab_size'):,}, eos {tok.get('eos_id')}" + (f", bos {tok['bos_id']}" if tok.get("bos_id") is not None else "")
                      + (f", sha256 {sha[:16]}..." if sha else "")),
        ("source", meta.source),
        ("on disk", f"{size:,} bytes"),
        ("skipped", f"{len(meta.skipped):,}"),
    ]
    return _render(path, rows, meta)


def _render(path: str | Path, rows: list[tuple[str, str]], meta: Metadata) -> str:
    """Aligned ``key value`` rows under the path (a WebDataset's shards before its size), then the
    skipped inputs (at most MAX_LISTED)."""
    if meta.format == "webdataset":
        rows.insert(-2, ("shards", _shards(path, meta)))
    lines = [str(path)] + [f"  {key:<11}{value}" for key, value in rows]
    for entry in meta.skipped[:MAX_LISTED]:
        lines.append(f"    {one_line(entry.path)}: {one_line(entry.reason)}")
    if len(meta.skipped) > MAX_LISTED:
        lines.append(f"    ... {len(meta.skipped) - MAX_LISTED} more (see --json)")
    return "\n".join(lines)
