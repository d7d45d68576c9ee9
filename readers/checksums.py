"""Per-sample checksums: one definition shared by every writer, store and ``packer verify``.

A sample's checksum is CRC-32 (``zlib.crc32``, the same polynomial as zip and PNG) of a small
little-endian header, the label then each dimension of the shape as int64, followed by the
stored payload bytes. Covering label and shape means a flipped label or a damaged shape field is
caught, not only damaged pixels. Where each format keeps the checksums is documented in
``docs/FORMATS.md`` (and owned by its module in ``readers/formats/``). The metadata field
``checksum`` names the algorithm (``"crc32"``), or is empty for a dataset without checksums.

The CRC is computed by zlib-ng where it is installed (a dependency of packer: its ``crc32`` is
the same function, vectorised), else by Python's ``zlib``: the values are identical.

Readers check them as they read when opened with ``verify=True`` (``readers/formats/base.py``):
a damaged sample raises :class:`CorruptSampleError`.
"""

from __future__ import annotations

import hashlib
import shlex
import struct
import zlib
from typing import Sequence

try:  # the same CRC-32, computed with PCLMULQDQ/AVX where the CPU has them
    from zlib_ng.zlib_ng import crc32 as _crc32
except ImportError:  # pragma: no cover - zlib-ng is a dependency; a bare install still works
    _crc32 = zlib.crc32

import numpy as np

from .schema import PackedFormatError

__all__ = ["CHECKSUM", "CHECKSUM_DTYPE", "sample_checksum", "sha256_of_checksums", "CorruptSampleError"]

#: The algorithm name recorded in :attr:`readers.schema.Metadata.checksum`.
CHECKSUM = "crc32"
#: How stored checksum arrays are typed on disk: little-endian uint32.
CHECKSUM_DTYPE = np.dtype("<u4")


def sha256_of_checksums(checksums: np.ndarray) -> str:
    """The metadata's ``checksums_sha256``: SHA-256 (hex) of the per-sample checksums as stored
    (little-endian uint32, in sample order)."""
    return hashlib.sha256(np.ascontiguousarray(checksums, CHECKSUM_DTYPE).tobytes()).hexdigest()


def sample_checksum(label: int, shape: Sequence[int], payload: bytes | memoryview) -> int:
    """CRC-32 of ``<q label, <q each dimension, payload`` (an unsigned 32-bit int)."""
    head = struct.pack(f"<{1 + len(shape)}q", int(label), *(int(d) for d in shape))
    return _crc32(payload, _crc32(head))


class CorruptSampleError(PackedFormatError):
    """A sample read with ``verify=True`` does not match the checksum stored when it was written.

    ``path`` is the dataset, ``index`` the sample, ``where`` its location as the store names it
    (``"sample 7 (shard-000001.tar)"`` for shards). Constructible from the message alone, as
    torch re-raises a DataLoader worker's error.
    """

    def __init__(self, message: str, path: str = "", index: int = -1, where: str = "") -> None:
        super().__init__(message)
        self.path, self.index, self.where = path, index, where

    @classmethod
    def mismatch(cls, path: str, index: int, where: str, stored: int, computed: int) -> "CorruptSampleError":
        """The error for sample ``index`` whose bytes give ``computed`` where ``stored`` was recorded."""
        return cls(
            f"{path}: {where} is damaged: its bytes do not match the checksum stored when it was written "
            f"(stored {stored:08x}, read {computed:08x}); `packer verify {shlex.quote(str(path))}` lists every damaged sample: convert again",
            path,
            index,
            where,
        )

    def __reduce__(self):  # keeps path, index and where through pickling
        return (type(self), (str(self), self.path, self.index, self.where))
