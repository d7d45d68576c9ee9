"""Torch-free storage access, one module per packer format (each owns its on-disk layout).

:data:`STORES` maps a format name to the module and class that read it (imported on first use,
so reading LMDB never imports h5py); :func:`detect_format` tells the format of a path from its
name and contents (each store class's ``recognises``); :func:`open_store` opens it.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from ..schema import FORMATS, IncompleteDatasetError, PackedFormatError
from .base import Store

__all__ = ["detect_format", "open_store", "store_class", "STORES", "PARTIAL_SUFFIX"]

PARTIAL_SUFFIX = ".partial"

#: Format name -> (module, class) of its store. Detection tries them in this order.
STORES: dict[str, tuple[str, str]] = {
    "lmdb": ("readers.formats.lmdb", "LMDBStore"),
    "hdf5": ("readers.formats.hdf5", "HDF5Store"),
    "blob": ("readers.formats.blob", "BlobStore"),
    "webdataset": ("readers.formats.webdataset", "ShardStore"),
}
assert set(STORES) == set(FORMATS)


def store_class(format_name: str) -> type[Store]:
    """The store class of a format name (imports only that format's library)."""
    try:
        module, name = STORES[format_name]
    except KeyError:
        raise PackedFormatError(f"unknown packed format {format_name!r} (known: {', '.join(STORES)})") from None
    return getattr(importlib.import_module(module), name)


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
    for name in STORES:
        if store_class(name).recognises(p):
            return name
    raise PackedFormatError(
        f"{p}: not a packer dataset (expected an LMDB folder, an HDF5 file, a .blob file or a folder of WebDataset shards)"
    )


def open_store(path: str | Path) -> Store:
    """Open any packed dataset, torch-free."""
    return store_class(detect_format(path))(path)
