"""A packer blob at a URL (``s3://bucket/train.blob``), read in place by ranged reads.

:class:`RemoteBlobStore` reads the header page and the metadata section first (what ``packer
info`` needs: two small reads), then, when records are asked for, the labels, offsets and
shapes sections (40 bytes a sample at most) and the payloads, one ranged read per run of
consecutive samples (at most :data:`MAX_READ` bytes each), never the whole object. The layout
and its parsing are ``readers/formats/blob.py``'s (:func:`~readers.formats.blob.read_blob_metadata`
and friends, over this store's ranged reads); the reads are ``readers/remote.py``'s (fsspec;
http(s) through urllib, from a server that answers ``Range`` requests).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from ..remote import read_url_range
from ..schema import Metadata
from .base import Record, Store
from .blob import BlobHeader, blob_checksums, blob_index, blob_source_names, read_blob_metadata

__all__ = ["RemoteBlobStore", "MAX_READ"]

#: The most payload bytes one ranged read asks for (a larger sample is read alone, whole).
MAX_READ = 64 << 20


class RemoteBlobStore(Store):
    """The packer blob at ``url`` (of ``size`` bytes, as its listing or a HEAD request says),
    read-only, in this process."""

    format_name = "blob"
    label = "blob"

    def __init__(self, url: str, size: int | None, *, verify: bool | None = None) -> None:
        self.header: BlobHeader | None = None
        self.size = size
        self._index: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        super().__init__(url, verify=verify)

    def _locate(self, path: str | Path) -> Path:
        return str(path)  # type: ignore[return-value]  # (a URL: Path would fold its //)

    def _read(self, offset: int, length: int) -> bytes:
        return read_url_range(str(self.path), offset, length)

    def _read_metadata(self) -> Metadata:
        if self.size is None:
            raise FileNotFoundError(f"{self.path}: no such packed dataset")
        self.header, meta = read_blob_metadata(self._read, self.size, str(self.path))
        return meta

    def stored_checksums(self) -> np.ndarray | None:
        return blob_checksums(self.header, self.meta, self._read)  # type: ignore[arg-type]

    def source_names(self) -> list[str] | None:
        return blob_source_names(self.header, self.meta, self._read, str(self.path))  # type: ignore[arg-type]

    def _arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Labels, payload offsets and shapes, fetched on first use."""
        if self._index is None:
            self._index = blob_index(self.header, self.meta, self._read)  # type: ignore[arg-type]
        return self._index

    def _payload_offsets(self) -> np.ndarray:
        return self._arrays()[1]

    def _records(self, indices: Sequence[int]) -> Iterator[Record]:
        labels, offsets, shapes = self._arrays()
        data = self.header.sections["data"][0]  # type: ignore[union-attr]
        order = [int(i) for i in indices]
        first = 0
        while first < len(order):
            last = first  # the run of consecutive samples read at once
            while (last + 1 < len(order) and order[last + 1] == order[last] + 1
                   and offsets[order[last + 1] + 1] - offsets[order[first]] <= MAX_READ):
                last += 1
            start, stop = int(offsets[order[first]]), int(offsets[order[last] + 1])
            chunk = self._read(data + start, stop - start)
            for i in order[first : last + 1]:
                c, h, w = (int(x) for x in shapes[i])
                yield int(labels[i]), (c, h, w), chunk[int(offsets[i]) - start : int(offsets[i + 1]) - start]
            first = last + 1

    def _folder_names(self) -> list[str] | None:
        return None  # (one object)

    def stored_bytes(self) -> int:
        """Bytes of the object (``packer info``'s "on disk")."""
        return int(self.size or 0)
