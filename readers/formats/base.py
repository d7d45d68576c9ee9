"""What every packed store shares: index checks, the batch path and decoding, in numpy.

A *store* is the torch-free access to one packed dataset: its metadata record and its samples
as uint8 arrays. Torch Datasets (``readers/lmdb.py`` and friends) wrap a store; the CLI
(``packer info``, ``packer verify``) uses stores directly, so it never imports torch.

A format subclasses :class:`Store` and supplies how to read its metadata record
(:meth:`Store._read_metadata`) and how to walk the stored records of a list of indices
(:meth:`Store._records`). Formats whose storage allows something faster for fixed-shape raw
batches (one gather from an array, a chunked HDF5 read) also override :meth:`Store._fill_raw`.
"""

from __future__ import annotations

import math
import operator
from pathlib import Path
from typing import ClassVar, Iterator, Sequence

import numpy as np

from ..codecs import decode_into
from ..schema import Metadata, PackedFormatError

__all__ = ["Store", "Record"]

#: One stored sample as a format hands it over: label, (C, H, W) shape, payload bytes.
#: The payload may be a view that is only valid until the next record is requested.
Record = tuple[int, tuple[int, int, int], "bytes | memoryview"]


class Store:
    """Read access to one packed dataset; picklable, opens storage lazily per process."""

    format_name: ClassVar[str] = ""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise FileNotFoundError(f"{self.path}: no such packed dataset")
        self.meta: Metadata = self._read_metadata()

    # -- what a format supplies ---------------------------------------------------------
    @classmethod
    def recognises(cls, path: Path) -> bool:
        """Whether ``path`` (which exists) looks like this format, from its name or first bytes."""
        raise NotImplementedError

    def _read_metadata(self) -> Metadata:
        raise NotImplementedError

    def _records(self, indices: Sequence[int]) -> Iterator[Record]:
        """Yield the stored record of each (already checked) index, in order."""
        raise NotImplementedError

    def stored_checksums(self) -> np.ndarray | None:
        """The per-sample checksums stored with the data (``readers/checksums.py``), or ``None``.

        One uint32 per sample, in index order; ``None`` when the metadata records no checksum.
        """
        return None

    def _fill_raw(self, indices: np.ndarray, out: np.ndarray, labels: np.ndarray) -> None:
        """Fill ``out`` (N, C, H, W) and ``labels`` (N,) for fixed-shape raw storage."""
        for j, (label, shape, payload) in enumerate(self._records(indices)):
            out[j] = self.raw_view(payload, shape, int(indices[j]))
            labels[j] = label

    # -- reading ------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.meta.count

    def read(self, index: int) -> tuple[np.ndarray, int]:
        """One sample as a new (C, H, W) uint8 array and its label."""
        i = self.check_index(index)
        for label, shape, payload in self._records([i]):
            image = np.empty(shape, np.uint8)
            self.decode(payload, image, i)
            return image, label
        raise PackedFormatError(f"{self.path}: sample {i} is missing")  # pragma: no cover

    def read_batch(self, indices: Sequence[int], out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Samples into one ``(N, C, H, W)`` uint8 array (``out`` or a new one) plus int64 labels.

        Needs a fixed sample shape (:attr:`Metadata.fixed_shape`); :meth:`read_samples` works
        for any shapes.
        """
        if not self.meta.fixed_shape:
            raise PackedFormatError(
                f"{self.path}: samples have different shapes, so they cannot fill one batch array: "
                "use read_samples(), or convert with --resize-mode center-crop, pad or stretch"
            )
        idx = self.check_indices(indices)
        shape = (len(idx), *self.meta.shape)  # type: ignore[misc]
        if out is None:
            out = np.empty(shape, np.uint8)
        elif out.shape != shape or out.dtype != np.uint8:
            raise ValueError(f"out must be a uint8 array of shape {shape}, got {out.dtype} {out.shape}")
        labels = np.empty(len(idx), np.int64)
        if self.meta.encoding == "raw":
            self._fill_raw(idx, out, labels)
        else:
            for j, (label, _shape, payload) in enumerate(self._records(idx)):
                self.decode(payload, out[j], int(idx[j]))
                labels[j] = label
        return out, labels

    def read_samples(self, indices: Sequence[int]) -> list[tuple[np.ndarray, int]]:
        """Samples as separate (C, H, W) arrays: works for variable shapes too."""
        idx = self.check_indices(indices)
        samples = []
        for i, (label, shape, payload) in zip(idx, self._records(idx)):
            image = np.empty(shape, np.uint8)
            self.decode(payload, image, int(i))
            samples.append((image, label))
        return samples

    # -- helpers ------------------------------------------------------------------------
    def decode(self, payload: bytes | memoryview, out: np.ndarray, index: int) -> None:
        """Write one stored payload into ``out`` (C, H, W): a copy for raw, a decode otherwise."""
        if self.meta.encoding == "raw":
            out[...] = self.raw_view(payload, out.shape, index)
            return
        try:
            decode_into(payload, out)
        except PackedFormatError as exc:
            raise PackedFormatError(f"{self.path}: sample {index}: {exc}") from None

    def raw_view(self, payload: bytes | memoryview, shape: Sequence[int], index: int) -> np.ndarray:
        expected = math.prod(shape)
        if len(payload) != expected:
            raise PackedFormatError(
                f"{self.path}: sample {index} has {len(payload)} bytes, expected {expected} for shape "
                f"{tuple(shape)}: the file is corrupt"
            )
        return np.frombuffer(payload, np.uint8).reshape(shape)

    def check_index(self, index: int) -> int:
        n = len(self)
        try:
            i = operator.index(index)
        except TypeError:
            raise TypeError(f"dataset indices must be integers, not {type(index).__name__}") from None
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"index {index} is out of range for a dataset of {n} samples")
        return i

    def check_indices(self, indices: Sequence[int]) -> np.ndarray:
        idx = np.array(indices, dtype=np.int64).reshape(-1)
        n = len(self)
        idx[idx < 0] += n
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            bad = next(int(i) for i in np.asarray(indices).reshape(-1) if not -n <= int(i) < n)
            raise IndexError(f"index {bad} is out of range for a dataset of {n} samples")
        return idx
