"""Splits of a dataset's files, as the Hugging Face Hub names them (``train-00000-of-00004.parquet``,
``test.jsonl``, ``validation/0000.parquet``): :func:`split_of` one file's, :func:`of_split` the
files of one (``--split NAME``), with a warning when files of several are converted together.
Used by Parquet files of images (packer/sources/parquet_images.py) and text corpora
(packer/sources/text.py)."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from ..errors import OptionError

__all__ = ["split_of", "of_split"]

log = logging.getLogger("packer")

#: A shard's name as the Hub writes it: SPLIT-00000-of-00004, older ones with a hash after it.
_SHARD = re.compile(r"(?P<split>.+?)-\d+-of-\d+(-[0-9a-f]+)?")
#: Names of splits a file may be called by (``train.parquet``, ``test-part1.parquet``), as the Hub's data files resolve them.
_SPLIT_NAMES = re.compile(r"(?P<split>train|training|test|testing|validation|valid|val|dev|eval|evaluation)([-_.].*)?", re.IGNORECASE)


def split_of(path: Path, root: Path) -> str | None:
    """The split a file belongs to, as the Hugging Face Hub names them: a shard's name up
    to its number (``train-00000-of-00004.parquet``, ``.jsonl.gz``...), a file named as a split
    is (``test.parquet``), else a folder below ``root`` named as a split is (``train/2020/0000.parquet``),
    else the folder it is in (``validation/0000.parquet``, as the Hub's Parquet conversions are);
    ``None`` otherwise."""
    stem = path.name.split(".", 1)[0]  # (train-00000-of-00004.jsonl.gz: its name before the suffixes)
    match = _SHARD.fullmatch(stem) or _SPLIT_NAMES.fullmatch(stem)
    if match:
        return match["split"]
    if path.parent == root or root not in path.parents:
        return None
    folders = path.parent.relative_to(root).parts
    named = [part for part in folders if _SPLIT_NAMES.fullmatch(part)]  # (train/2020/0000.parquet: train)
    return named[0] if named else folders[-1]


def _named_as_split(path: Path, root: Path) -> bool:
    """Whether ``path`` is named as a split is (a Hub shard, ``test.jsonl``, a folder ``train/``),
    not only in a folder of its own: a corpus laid out by source (``arxiv/``, ``github/``, as
    RedPajama's) was warned of as splits converted together (a text walkthrough)."""
    stem = path.name.split(".", 1)[0]
    if _SHARD.fullmatch(stem) or _SPLIT_NAMES.fullmatch(stem):
        return True
    return root in path.parents and any(_SPLIT_NAMES.fullmatch(part) for part in path.parent.relative_to(root).parts)


def of_split(files: list[Path], root: Path, split: str | None, src: Any) -> list[Path]:
    """``files`` of the split ``split`` (all of them, with a warning when they are of several, without)."""
    found = sorted({name for p in files if (name := split_of(p, root)) is not None})
    if split is None:
        named = sorted({split_of(p, root) for p in files if _named_as_split(p, root)})  # (arxiv/, github/: a mix's sources)
        if len(found) > 1 and named:
            likely = "train" if "train" in named else named[0]
            others = [name for name in found if name not in named]
            log.warning("%s: its files are those of the splits %s%s, which are converted together into one dataset; to "
                        "convert one split, pass --split %s", src, ", ".join(named),
                        f" and of the folders {', '.join(others)}" if others else "", likely)
        return files
    kept = [p for p in files if split_of(p, root) == split]
    if not kept:
        what = (f"SRC is one file, {'of the split ' + found[0] if found else 'named as no split'}; drop --split"
                if root.is_file() else f"no file of {src} is of the split {split!r} "
                f"({'its splits: ' + ', '.join(found) if found else 'none is named as a split'})")
        raise OptionError(f"--split: {what}")
    return kept
