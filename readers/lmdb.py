"""``LMDBDataset``: a packer LMDB as a torch Dataset (layout: ``readers/formats/lmdb.py``)."""

from __future__ import annotations

from .dataset import PackedDataset
from .formats.lmdb import LMDBStore

__all__ = ["LMDBDataset"]


class LMDBDataset(PackedDataset):
    """Samples of a packer LMDB as ``(uint8 tensor (C, H, W), int label)``.

    Safe under DataLoader workers (fork and spawn): the environment opens lazily, read-only,
    once per process. ``DataLoader(LMDBDataset(path), batch_size=64)`` reads each batch in one
    transaction into one array.
    """

    store_class = LMDBStore
