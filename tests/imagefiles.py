"""Test helpers that write odd and hostile image files (made here, never shipped)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image


def gradient(height: int, width: int, channels: int = 3, seed: int = 0) -> np.ndarray:
    """A smooth but asymmetric test picture (so flips and rotations show)."""
    rng = np.random.default_rng(seed)
    y = np.linspace(0, 1, height)[:, None]
    x = np.linspace(0, 1, width)[None, :]
    planes = [np.clip(255 * (y * (c + 1) / 3 + x * (2 - c) / 3) + rng.normal(0, 2, (height, width)), 0, 255) for c in range(channels)]
    return np.stack(planes, axis=-1).astype(np.uint8)


def jpeg_bytes(pixels: np.ndarray, quality: int = 95, exif_orientation: int | None = None, mode: str | None = None) -> bytes:
    image = Image.fromarray(pixels.squeeze())
    if mode is not None:
        image = image.convert(mode)
    buffer = io.BytesIO()
    kwargs = {}
    if exif_orientation is not None:
        exif = image.getexif()
        exif[0x0112] = exif_orientation
        kwargs["exif"] = exif
    image.save(buffer, "JPEG", quality=quality, **kwargs)
    return buffer.getvalue()


def png_bytes(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path
