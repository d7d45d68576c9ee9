"""The image decoders of jpeg/png samples: Pillow, and libjpeg-turbo through ``simplejpeg``.

Pillow decodes everything. A JPEG sample is decoded with ``simplejpeg`` (a dependency of packer;
Pillow alone where it is missing) where it gives exactly Pillow's pixels: both wrap libjpeg-turbo
with its default, accurate settings (islow DCT, fancy upsampling), and on our 224x224 q90
samples and on 4:4:4, 4:2:2, 4:2:0, progressive and grayscale files the two agree bit for bit
(tests/test_jpeg_read.py). It is declined, and Pillow decodes, for CMYK/YCCK files (the two
convert those to RGB differently, by 1 level), a colour file read as one channel (Pillow's
RGB->L weights differ from the file's Y plane), a size other than the one asked for, and any
file libjpeg-turbo warns about or rejects (Pillow then accepts or raises as it always did).

Why: ``simplejpeg`` decodes into a buffer we give it and holds no GIL while decoding, and
skips Pillow's per-image work (header parsing in Python, the copies of ``convert`` and
``np.asarray``); rates side by side: ``benchmarks/results/jpeg_read.json``. It writes
interleaved pixels; batches are planar (C, H, W), so a colour sample is decoded as RGBX into a
per-thread reusable (H, W) uint32 scratch buffer (libjpeg-turbo writes 4-byte pixels faster than
3-byte ones) and each plane is one shift and narrowing cast out of it into the batch row; a
whole decode into a (C, H, W) row this way took 263.2 (259.5-286.7) us a sample against 343.3
(338.3-360.8) us for simplejpeg RGB + a transposing copy, one thread, 9 rounds, 2-core Intel Xeon
host (``benchmarks/results/jpeg_read.json``, ``per_sample_us``, from ``python -m
benchmarks.jpeg_read --rounds 9 --update-results``). A gray sample is decoded straight into its
(1, H, W) row.

This module imports nothing from readers (``readers.encodings`` builds its table from it);
Pillow and ``simplejpeg`` are imported on first use.
"""

from __future__ import annotations

import functools
import io
import threading
from typing import Any

import numpy as np

__all__ = ["pillow_decode", "jpeg_decode", "turbo_decode_into", "simplejpeg_module"]

#: The first bytes of every JPEG file (start-of-image marker).
JPEG_MAGIC = b"\xff\xd8"
#: Colour spaces of a JPEG file (``simplejpeg.decode_jpeg_header``) whose pixels match Pillow's.
_SAME_AS_PILLOW = {"YCbCr": 3, "RGB": 3, "Gray": 1}

_scratch = threading.local()  # each thread's (H, W) RGBX buffer, reused across samples


def pillow_decode(payload: bytes | memoryview | np.ndarray, channels: int) -> np.ndarray:
    """Decode an image file's bytes (jpeg, png) to ``(channels, H, W)`` uint8 pixels with Pillow.

    A new, writable, contiguous array: Pillow's own (``np.asarray``) is read-only, and a gray
    sample was returned as a view of it, so ``StreamingShards`` yielded tensors over read-only
    memory (torch warned; writing to them is undefined). Raises what Pillow raises on bad data
    (``OSError``, ``ValueError``, ``SyntaxError``): ``readers.codecs.decode_image`` turns that
    into a ``PackedFormatError``.
    """
    from PIL import Image

    with Image.open(io.BytesIO(payload)) as image:
        pixels = np.asarray(image.convert("L" if channels == 1 else "RGB"))
    return np.array(pixels[np.newaxis]) if channels == 1 else np.ascontiguousarray(pixels.transpose(2, 0, 1))


@functools.lru_cache(maxsize=None)
def simplejpeg_module() -> Any:
    """The ``simplejpeg`` module, or ``None`` when it is not installed (looked up once)."""
    try:
        import simplejpeg
    except ImportError:
        return None
    return simplejpeg


def _header(payload: bytes | memoryview | np.ndarray) -> tuple[Any, int, int, int] | None:
    """``(simplejpeg, height, width, channels)`` of a JPEG that ``simplejpeg`` decodes as
    Pillow does, else ``None``."""
    turbo = simplejpeg_module()
    if turbo is None or len(payload) < 4 or bytes(payload[:2]) != JPEG_MAGIC:
        return None
    try:
        height, width, colorspace, _subsampling = turbo.decode_jpeg_header(payload)
    except (ValueError, RuntimeError):
        return None
    channels = _SAME_AS_PILLOW.get(colorspace)
    return None if channels is None else (turbo, height, width, channels)


def turbo_decode_into(payload: bytes | memoryview | np.ndarray, out: np.ndarray) -> bool:
    """Decode a JPEG into ``out`` (C, H, W) uint8 with ``simplejpeg``, as Pillow would.

    Returns ``False``, having written nothing it vouches for, when it declines (``simplejpeg``
    not installed, not a JPEG, CMYK, a colour file into one channel, another size, or any
    libjpeg-turbo warning or error): decode with Pillow then, which gives the answer (pixels
    or its error) it always gave.
    """
    header = _header(payload)
    if header is None or out.ndim != 3 or out.dtype != np.uint8:
        return False
    turbo, height, width, stored = header
    channels = out.shape[0]
    if out.shape[1:] != (height, width) or channels not in (1, 3) or (channels == 1 and stored != 1):
        return False
    try:
        if channels == 1 and out.flags.c_contiguous:  # (1, H, W) is (H, W, 1): straight into the row
            turbo.decode_jpeg(payload, "GRAY", buffer=out)
            return True
        if channels == 1:
            out[0] = turbo.decode_jpeg(payload, "GRAY")[:, :, 0]
            return True
        pixels = getattr(_scratch, "rgbx", None)
        if pixels is None or pixels.shape != (height, width):
            pixels = _scratch.rgbx = np.empty((height, width), "<u4")
        turbo.decode_jpeg(payload, "RGBX", buffer=pixels)
    except (ValueError, RuntimeError, IndexError):
        return False
    # Each pixel is one little-endian uint32 0xXXBBGGRR: a plane is a shift and a narrowing cast.
    np.copyto(out[0], pixels, casting="unsafe")
    np.right_shift(pixels, 8, out=out[1], casting="unsafe")
    np.right_shift(pixels, 16, out=out[2], casting="unsafe")
    return True


def jpeg_decode(payload: bytes | memoryview | np.ndarray, channels: int) -> np.ndarray:
    """Decode a JPEG to a new ``(channels, H, W)`` uint8 array: ``simplejpeg`` where it gives
    Pillow's pixels (:func:`turbo_decode_into`), else :func:`pillow_decode` (and its errors)."""
    header = _header(payload)
    if header is not None:
        out = np.empty((channels, header[1], header[2]), np.uint8)
        if turbo_decode_into(payload, out):
            return out
    return pillow_decode(payload, channels)
