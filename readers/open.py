"""``open_dataset``: any packed dataset as its torch Dataset, whatever the format."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from .dataset import PackedDataset, Transform
from .formats import detect_format

__all__ = ["open_dataset", "DATASETS"]

#: Format name -> (module, class) of its map-style torch Dataset.
DATASETS: dict[str, tuple[str, str]] = {
    "lmdb": ("readers.lmdb", "LMDBDataset"),
    "hdf5": ("readers.hdf5", "HDF5Dataset"),
    "blob": ("readers.blob", "RAMDataset"),
    "webdataset": ("readers.webdataset", "ShardDataset"),
}


def open_dataset(path: str | Path, transform: Transform | None = None, **options: Any) -> PackedDataset:
    """Open the packed dataset at ``path`` with the reader of its format.

    The format is recognised from the path and its metadata (an LMDB folder, an HDF5 file, a
    ``.blob`` file, a folder of WebDataset shards); ``options`` go to that reader's constructor.
    """
    module, name = DATASETS[detect_format(path)]
    cls = getattr(importlib.import_module(module), name)
    return cls(path, transform=transform, **options)
