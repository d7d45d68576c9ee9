"""Torch-free storage access, one module per packer format (each owns its on-disk layout).

:func:`detect_format` tells the format of a path; :func:`open_store` opens it.
"""

from __future__ import annotations

from pathlib import Path

from ..schema import IncompleteDatasetError, PackedFormatError
from .base import Store
from .lmdb import DATA_FILE as LMDB_DATA_FILE

__all__ = ["detect_format", "open_store", "store_class"]

PARTIAL_SUFFIX = ".partial"


def store_class(format_name: str) -> type[Store]:
    """The store class of a format name (imports only that format's library)."""
    if format_name == "lmdb":
        from .lmdb import LMDBStore

        return LMDBStore
    raise PackedFormatError(f"unknown packed format {format_name!r}")


def detect_format(path: str | Path) -> str:
    """The packer format of ``path``, from its name and contents."""
    p = Path(path)
    if p.name.endswith(PARTIAL_SUFFIX):
        raise IncompleteDatasetError(f"{p}: an unfinished conversion (its name ends in {PARTIAL_SUFFIX}); convert again")
    if not p.exists():
        partial = p.with_name(p.name + PARTIAL_SUFFIX)
        if partial.exists():
            raise IncompleteDatasetError(f"{p}: does not exist; {partial.name} is an unfinished conversion: convert again")
        raise FileNotFoundError(f"{p}: no such packed dataset")
    if p.is_dir() and (p / LMDB_DATA_FILE).exists():
        return "lmdb"
    raise PackedFormatError(f"{p}: not a packer dataset (expected an LMDB folder)")


def open_store(path: str | Path) -> Store:
    """Open any packed dataset, torch-free."""
    return store_class(detect_format(path))(path)
