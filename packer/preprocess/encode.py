"""Turn preprocessed (H, W, C) pixels into the stored payload of one sample.

``raw`` stores planar (C, H, W) bytes, the layout readers hand to torch without any copy or
transpose (docs/FORMATS.md, "Layout"); ``jpeg`` and ``png`` store one ordinary image file.
"""

from __future__ import annotations

from typing import Callable

import cv2
import numpy as np

__all__ = ["ENCODERS", "encode"]

PNG_COMPRESSION = 3  # zlib level: most of level 9's size at a fraction of its time


def _raw(pixels: np.ndarray, quality: int) -> bytes:
    return np.ascontiguousarray(pixels.transpose(2, 0, 1)).tobytes()


def _to_bgr(pixels: np.ndarray) -> np.ndarray:
    return pixels[:, :, 0] if pixels.shape[2] == 1 else cv2.cvtColor(pixels, cv2.COLOR_RGB2BGR)


def _jpeg(pixels: np.ndarray, quality: int) -> bytes:
    ok, buffer = cv2.imencode(".jpg", _to_bgr(pixels), [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:  # pragma: no cover - OpenCV reports failures this way
        raise ValueError("JPEG encoding failed")
    return buffer.tobytes()


def _png(pixels: np.ndarray, quality: int) -> bytes:
    ok, buffer = cv2.imencode(".png", _to_bgr(pixels), [cv2.IMWRITE_PNG_COMPRESSION, PNG_COMPRESSION])
    if not ok:  # pragma: no cover
        raise ValueError("PNG encoding failed")
    return buffer.tobytes()


#: The encoder of each encoding of the one table, ``readers/encodings.py`` (same names: the
#: extensions, ratios and decoders live there; tests/test_encodings.py checks the names agree).
ENCODERS: dict[str, Callable[[np.ndarray, int], bytes]] = {"raw": _raw, "jpeg": _jpeg, "png": _png}


def encode(pixels: np.ndarray, encoding: str, quality: int = 90) -> bytes:
    """The payload for (H, W, C) uint8 ``pixels`` in ``encoding``."""
    try:
        encoder = ENCODERS[encoding]
    except KeyError:
        raise ValueError(f"unknown encoding {encoding!r} (choose from: {', '.join(ENCODERS)})") from None
    return encoder(pixels, quality)
