"""Images that arrive decoded: a PIL image, a numpy array or a torch tensor, into stored pixels.

What a Python dataset's ``dataset[i]`` gives (packer/sources/datasets.py) and what a ``.npy``
member of WebDataset shards holds. Arrays are (H, W), (H, W, C) or (C, H, W) with C of 1, 3 or
4 (numpy arrays are read as HWC when their last axis can be channels, tensors as CHW when their
first can: each library's convention), uint8, or floats in [0, 1] (scaled by 255 and rounded).
The pixels then become RGB or grayscale exactly as a decoded image file does (Pillow's mode
conversion; alpha dropped), so a dataset and the same images saved as PNG files give identical
samples, and go through the same crop, resize and encoding (:func:`preprocess_pixels`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from PIL import Image, ImageOps

from ..options import ImageOptions
from .decode import DecodeError, to_uint8, too_many_pixels
from .encode import encode
from .image import preprocess_pixels

__all__ = ["to_pixels", "encode_pixels", "CHANNELS"]

#: Channel counts an array may have (gray, RGB, RGBA).
CHANNELS = (1, 3, 4)
_MODES = {1: "L", 3: "RGB", 4: "RGBA"}


def to_pixels(image: Any, *, grayscale: bool, max_pixels: int, layout: str | None = None) -> np.ndarray:
    """(H, W, 3) RGB or (H, W, 1) grayscale uint8 pixels of ``image``; :class:`DecodeError` saying
    what is wrong with it otherwise. ``layout`` ``"chw"``/``"hwc"`` overrides the guess."""
    if isinstance(image, Image.Image):
        if image.width * image.height > max_pixels:
            raise DecodeError(too_many_pixels(image.width, image.height, max_pixels))
        # as a file of it decodes: 16-bit and float modes scaled to 8 bits (convert("RGB") clipped an I;16 image to 0 and 255)
        return to_uint8(ImageOps.exif_transpose(image), grayscale)
    else:
        array = _as_array(image)
        array = _hwc(array, layout or ("chw" if _is_tensor(image) else "hwc"))
        height, width = array.shape[:2]
        if height * width > max_pixels:
            raise DecodeError(too_many_pixels(width, height, max_pixels))
        if height < 1 or width < 1:
            raise DecodeError(f"image has no pixels ({width}x{height})")
        array = _uint8(array)
        picture = Image.fromarray(np.ascontiguousarray(array[:, :, 0] if array.shape[2] == 1 else array), _MODES[array.shape[2]])
    target = "L" if grayscale else "RGB"
    if picture.mode != target:
        picture = picture.convert(target)
    pixels = np.asarray(picture)
    return pixels[:, :, np.newaxis] if pixels.ndim == 2 else pixels


def encode_pixels(pixels: np.ndarray, options: ImageOptions) -> tuple[tuple[int, int, int], bytes]:
    """The stored (C, H, W) shape and payload of decoded ``pixels``, preprocessed by ``options``."""
    pixels = preprocess_pixels(pixels, options)
    height, width, channels = pixels.shape
    return (channels, height, width), encode(pixels, options.encoding, options.quality or 90)


def _is_tensor(value: Any) -> bool:
    return type(value).__module__.startswith("torch")


def _as_array(value: Any) -> np.ndarray:
    if _is_tensor(value):
        value = value.detach().cpu().numpy()
    if not isinstance(value, np.ndarray):
        raise DecodeError(f"not an image: got {type(value).__name__} (give a PIL image, a numpy array or a tensor)")
    return value


def _hwc(array: np.ndarray, layout: str) -> np.ndarray:
    """``array`` as (H, W, C)."""
    if array.ndim == 2:
        return array[:, :, np.newaxis]
    if array.ndim != 3:
        raise DecodeError(f"array of shape {array.shape} is not an image (give (H, W), (H, W, C) or (C, H, W), C in 1, 3, 4)")
    first, last = array.shape[0] in CHANNELS, array.shape[2] in CHANNELS
    if (layout == "chw" and first) or (first and not last):
        return array.transpose(1, 2, 0)
    if last:
        return array
    raise DecodeError(f"array of shape {array.shape} has no channel axis of 1, 3 or 4")


def _uint8(array: np.ndarray) -> np.ndarray:
    if array.dtype == np.uint8:
        return array
    if array.dtype == np.bool_:
        return array.astype(np.uint8) * 255
    if np.issubdtype(array.dtype, np.floating):
        if array.size and not (np.isfinite(array).all() and array.min() >= 0.0 and array.max() <= 1.0):
            raise DecodeError(f"float pixels must lie in [0, 1] (found {np.nanmin(array):g} to {np.nanmax(array):g})")
        return np.rint(array.astype(np.float64) * 255.0).astype(np.uint8)
    raise DecodeError(f"pixels of dtype {array.dtype}: give uint8, or floats in [0, 1]")
