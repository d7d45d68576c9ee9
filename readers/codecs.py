"""Decoding of encoded samples (``encoding`` ``jpeg`` or ``png``) on the reading side.

Readers decode with Pillow, and JPEGs with ``simplejpeg`` (libjpeg-turbo, no GIL held) when it
is installed and gives Pillow's exact pixels (``readers/decoders.py``; no OpenCV import in a
training job); the result is written straight into the caller's (C, H, W) destination, so
batches need no extra copy. Which encodings need decoding is the table in ``readers/encodings.py``.
"""

from __future__ import annotations

import numpy as np

from .decoders import jpeg_decode, turbo_decode_into
from .schema import PackedFormatError

__all__ = ["decode_into", "decode_image"]


def decode_image(payload: bytes | memoryview | np.ndarray, channels: int) -> np.ndarray:
    """Decode one jpeg/png sample to a (C, H, W) uint8 array with ``channels`` channels."""
    try:
        return jpeg_decode(payload, channels)  # anything but a JPEG simplejpeg takes goes to Pillow
    except (OSError, ValueError, SyntaxError) as exc:
        raise PackedFormatError(f"undecodable sample ({exc})") from None


def decode_into(payload: bytes | memoryview, out: np.ndarray) -> None:
    """Decode into ``out`` (C, H, W), checking the decoded size matches."""
    if turbo_decode_into(payload, out):  # a JPEG of out's size, decoded in place
        return
    pixels = decode_image(payload, out.shape[0])
    if pixels.shape != out.shape:
        raise PackedFormatError(f"decoded sample has shape {pixels.shape}, metadata says {out.shape}")
    out[...] = pixels
