"""``PackedDataset``: the torch Dataset every map-style packer reader is.

It wraps a torch-free :class:`~readers.formats.base.Store` and turns its numpy arrays into
tensors without copying. ``__getitems__`` is the DataLoader's batched path: one read of the
whole batch into one array, so a plain ``DataLoader(ds, batch_size=64)`` is fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, ClassVar, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from .formats import check_format
from .formats.base import Store
from .schema import Metadata

__all__ = ["PackedDataset", "store_of"]


def store_of(dataset: Any) -> Store | None:
    """The packer store a dataset reads (a :class:`PackedDataset`'s, or the store itself), or
    ``None`` for any other."""
    if isinstance(dataset, Store):
        return dataset
    return dataset.store if isinstance(dataset, PackedDataset) else None

Transform = Callable[[torch.Tensor], Any]


class PackedDataset(Dataset):
    """A map-style dataset of ``(uint8 tensor (C, H, W), int label)`` samples.

    ``label`` is -1 for unlabeled datasets. ``transform``, if given, is applied to each image
    tensor. The dataset pickles without open handles, so DataLoader workers under fork and
    spawn each open their own. ``verify=True`` checks every sample read against the checksum
    stored when it was written, raising :class:`~readers.checksums.CorruptSampleError` (naming
    the dataset, the index and, for shards, the shard) for a damaged one; ``False`` never
    checks; ``None`` (default) checks jpeg/png samples, where the decode dwarfs it (measured:
    within run-to-run noise), and not raw ones, where it cuts reads by more than half
    (docs/RELIABILITY.md, ``benchmarks/verify_cost.py``). A text dataset (token ids, metadata ``kind: "text"``) is refused
    with one line naming :class:`readers.TokenDataset`, which reads it; so is another format's
    dataset, naming the class that reads it, and a path that is no packer dataset
    (:func:`readers.formats.check_format`).
    """

    store_class: ClassVar[type[Store]] = Store

    def __init__(self, path: str | Path, transform: Transform | None = None, *, verify: bool | None = None) -> None:
        if transform is not None and not callable(transform):  # (it failed at the first read, "'int' object is not callable")
            raise TypeError(f"transform must be a callable (image -> image) or None, got {transform!r}")
        check_format(path, self.store_class.format_name)
        self.store = self.store_class(path, verify=verify)
        self.store.require_images()
        self.transform = transform

    @property
    def path(self) -> Path:
        return self.store.path

    @property
    def meta(self) -> Metadata:
        return self.store.meta

    @property
    def classes(self) -> list[str]:
        return list(self.store.meta.classes)

    def __len__(self) -> int:
        return len(self.store)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        image, label = self.store.read(index)
        return self._sample(torch.from_numpy(image), label)

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[Any, int]]:
        if self.store.meta.fixed_shape:
            images, labels = self.store.read_batch(indices)
            batch = torch.from_numpy(images)
            return [self._sample(batch[j], int(labels[j])) for j in range(len(labels))]
        return [self._sample(torch.from_numpy(image), label) for image, label in self.store.read_samples(indices)]

    def read_batch(self, indices: Sequence[int], out: np.ndarray | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """A whole batch as one ``(N, C, H, W)`` uint8 tensor and ``(N,)`` int64 labels: the
        stored pixels, so a dataset opened with a per-sample ``transform`` refuses it (it would be
        skipped; transform whole batches instead, ``readers.gpu``)."""
        if self.transform is not None:
            raise ValueError(
                f"{type(self).__name__}.read_batch returns the stored uint8 pixels and would skip this dataset's "
                "per-sample transform: open the dataset without one and transform whole batches (readers.gpu), or index it"
            )
        images, labels = self.store.read_batch(indices, out)
        return torch.from_numpy(images), torch.from_numpy(labels)

    def __repr__(self) -> str:
        meta = self.store.meta
        shape = "x".join(map(str, meta.shape)) if meta.shape else "variable"
        return (
            f"{type(self).__name__}({str(self.path)!r}, count={meta.count}, shape={shape}, "
            f"encoding={meta.encoding}, classes={len(meta.classes) if meta.classes or not meta.labeled else 'unnamed'})"
        )

    def _sample(self, image: torch.Tensor, label: int) -> tuple[Any, int]:
        return (self.transform(image) if self.transform is not None else image), label
