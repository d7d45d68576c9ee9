"""Per-sample checksums: one definition shared by every writer, store and ``packer verify``.

A sample's checksum is CRC-32 (``zlib.crc32``, the same polynomial as zip and PNG) of a small
little-endian header, the label then each dimension of the shape as int64, followed by the
stored payload bytes. Covering label and shape means a flipped label or a damaged shape field is
caught, not only damaged pixels. Where each format keeps the checksums is documented in
``docs/FORMATS.md`` (and owned by its module in ``readers/formats/``). The metadata field
``checksum`` names the algorithm (``"crc32"``), or is empty for a dataset without checksums.
"""

from __future__ import annotations

import struct
import zlib
from typing import Sequence

import numpy as np

__all__ = ["CHECKSUM", "CHECKSUM_DTYPE", "sample_checksum"]

#: The algorithm name recorded in :attr:`readers.schema.Metadata.checksum`.
CHECKSUM = "crc32"
#: How stored checksum arrays are typed on disk: little-endian uint32.
CHECKSUM_DTYPE = np.dtype("<u4")


def sample_checksum(label: int, shape: Sequence[int], payload: bytes | memoryview) -> int:
    """CRC-32 of ``<q label, <q each dimension, payload`` (an unsigned 32-bit int)."""
    head = struct.pack(f"<{1 + len(shape)}q", int(label), *(int(d) for d in shape))
    return zlib.crc32(payload, zlib.crc32(head))
