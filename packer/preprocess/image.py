"""The whole image preprocessing of one file: decode, orient, crop, resize, pad."""

from __future__ import annotations

import numpy as np

from ..options import ImageOptions
from .decode import decode
from .geometry import plan_for
from .resize import resize

__all__ = ["preprocess_image", "preprocess_pixels"]


def preprocess_image(data: bytes, options: ImageOptions) -> np.ndarray:
    """Image file bytes -> (H, W, C) uint8 pixels as they will be stored (C = 1 or 3).

    Raises :class:`~packer.preprocess.decode.DecodeError` for unusable input.
    """
    return preprocess_pixels(decode(data, grayscale=options.grayscale, target=options.decode_target, max_pixels=options.max_pixels), options)


def preprocess_pixels(pixels: np.ndarray, options: ImageOptions) -> np.ndarray:
    """Decoded (H, W, C) uint8 pixels (C as ``options`` asks) -> the stored pixels: the geometry
    of :func:`preprocess_image` (crop, resize, pad), for images that arrive decoded (a Python
    dataset's arrays: packer/preprocess/arrays.py)."""
    plan = plan_for(options.resize_mode, pixels.shape[0], pixels.shape[1], options.size, options.resize)
    top, left, height, width = plan.crop
    pixels = resize(pixels[top : top + height, left : left + width], *plan.resize)
    if plan.recrop is not None:
        top, left, height, width = plan.recrop
        pixels = pixels[top : top + height, left : left + width]
    if plan.pad is not None:
        canvas = np.zeros((*plan.pad, pixels.shape[2]), np.uint8)
        y = (plan.pad[0] - pixels.shape[0]) // 2
        x = (plan.pad[1] - pixels.shape[1]) // 2
        canvas[y : y + pixels.shape[0], x : x + pixels.shape[1]] = pixels
        pixels = canvas
    return np.ascontiguousarray(pixels)
