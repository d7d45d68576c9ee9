"""Writers, one module per format (mirroring ``readers/formats/``), and the name -> class registry."""

from __future__ import annotations

import importlib

from readers.formats.base import SHARD_NAME
from readers.schema import FORMATS

from ..errors import OptionError
from .base import Writer

__all__ = ["WRITERS", "get_writer", "format_for_path", "SUFFIXES"]

#: Format name -> (module, class) of its writer, imported on first use.
WRITERS: dict[str, tuple[str, str]] = {
    "lmdb": ("packer.writers.lmdb", "LMDBWriter"),
    "hdf5": ("packer.writers.hdf5", "HDF5Writer"),
    "blob": ("packer.writers.blob", "BlobWriter"),
    "webdataset": ("packer.writers.webdataset", "ShardWriter"),
}
assert set(WRITERS) == set(FORMATS)

#: Destination suffixes that select a format when ``--format`` is not given.
SUFFIXES: dict[str, str] = {".lmdb": "lmdb", ".h5": "hdf5", ".hdf5": "hdf5", ".blob": "blob"}


def get_writer(name: str) -> type[Writer]:
    """The writer class of a format name; the error lists the valid names."""
    try:
        module, cls = WRITERS[name]
    except KeyError:
        raise OptionError(f"--format: unknown format {name!r} (choose from: {', '.join(WRITERS)})") from None
    return getattr(importlib.import_module(module), cls)


def format_for_path(path: str) -> str | None:
    """The format a destination's name selects: its suffix, or a shard pattern such as
    ``train-%06d.tar`` (WebDataset); ``None`` for any other name (a plain folder)."""
    lowered = str(path).rstrip("/").lower()
    for suffix, name in SUFFIXES.items():
        if lowered.endswith(suffix):
            return name
    if SHARD_NAME.fullmatch(str(path).rstrip("/").rsplit("/", 1)[-1]):  # (what the writer takes: readers/formats/webdataset.py)
        return "webdataset"
    return None
