"""Decoding of encoded samples (``encoding`` ``jpeg`` or ``png``) on the reading side.

Readers decode with Pillow only (no OpenCV import in a training job); the result is written
straight into the caller's (C, H, W) destination so batches need no extra copy.
"""

from __future__ import annotations

import io

import numpy as np

from .schema import PackedFormatError

__all__ = ["decode_into", "decode_image"]


def decode_image(payload: bytes | memoryview, channels: int) -> np.ndarray:
    """Decode one jpeg/png sample to a (C, H, W) uint8 array with ``channels`` channels."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(payload)) as image:
            image = image.convert("L" if channels == 1 else "RGB")
            pixels = np.asarray(image)
    except (OSError, ValueError, SyntaxError) as exc:
        raise PackedFormatError(f"undecodable sample ({exc})") from None
    if channels == 1:
        return pixels[np.newaxis]
    return pixels.transpose(2, 0, 1)


def decode_into(payload: bytes | memoryview, out: np.ndarray) -> None:
    """Decode into ``out`` (C, H, W), checking the decoded size matches."""
    pixels = decode_image(payload, out.shape[0])
    if pixels.shape != out.shape:
        raise PackedFormatError(f"decoded sample has shape {pixels.shape}, metadata says {out.shape}")
    out[...] = pixels
