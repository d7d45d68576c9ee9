"""``open_dataset``: any packed dataset as its torch Dataset, whatever the format and kind."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .dataset import PackedDataset, Transform
from .formats import DATASETS, open_store

if TYPE_CHECKING:  # pragma: no cover
    from .tokens import TokenDataset

__all__ = ["open_dataset", "DATASETS"]


def open_dataset(
    path: str | Path, transform: Transform | None = None, *, verify: bool | None = None, **options: Any
) -> PackedDataset | TokenDataset:
    """Open the packed dataset at ``path`` with the reader of its format and kind.

    The format is recognised from the path and its metadata (an LMDB folder, an HDF5 file, a
    ``.blob`` file, a folder of WebDataset shards). Images: that format's dataset
    (``LMDBDataset`` and friends), ``verify`` (check each sample's stored checksum as it is
    read; ``None``: jpeg/png yes, raw no, see :class:`~readers.dataset.PackedDataset`) and
    ``options`` going to its constructor. Text (metadata ``kind: "text"``), in any format: a
    :class:`readers.TokenDataset` (documents, or blocks with ``block_size=...``; ``options`` go
    to it), which takes no ``transform``; ``verify=True`` checks each document it reads
    (``None``: no, as for raw images).
    """
    meta = open_store(path).meta
    if meta.kind == "text":
        if transform is not None:
            raise TypeError(f"{path}: a text dataset is read by readers.TokenDataset, which takes no transform")
        from .tokens import TokenDataset

        return TokenDataset(path, verify=bool(verify), **options)
    module, name = DATASETS[meta.format]
    cls = getattr(importlib.import_module(module), name)
    return cls(path, transform=transform, verify=verify, **options)
