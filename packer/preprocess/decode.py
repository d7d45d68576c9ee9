"""Decode image bytes to 8-bit RGB or grayscale pixels, orientation applied.

Two decoders, one result:

* Ordinary JPEGs (YCbCr or grayscale, complete) go through OpenCV, which decodes faster
  than Pillow here (``benchmarks/results/preprocess-quick.json``) and can decode at 1/2, 1/4 or 1/8 scale in the DCT domain
  (``IMREAD_REDUCED_*``) when the image is far larger than what will be kept.
* Everything else (PNG, GIF's first frame, BMP, TIFF, WebP, CMYK JPEGs, 16-bit, palette,
  alpha) goes through Pillow, which also gives the definitive error for a damaged file.

A JPEG whose picture does not end with the end-of-image marker (:func:`picture_end`: a trailer may
follow it) is treated as suspect and sent to Pillow, which raises on truncation; some decoders
instead return a half-grey image silently. One whose data runs into zeros (a preallocated
download cut short) is refused before either decodes it.
"""

from __future__ import annotations

import io
import re
import warnings
from contextlib import contextmanager
from typing import Iterator

import cv2
import numpy as np
from PIL import Image, ImageOps

__all__ = ["decode", "to_uint8", "DecodeError", "reduction_for", "describe_error", "too_many_pixels", "jpeg_ends_cleanly", "damage_printed", "zeros_at_end", "picture_end", "ZERO_RUN"]

_JPEG_MAGIC = b"\xff\xd8\xff"
_JPEG_END = b"\xff\xd9"
_COLOR_RGB = getattr(cv2, "IMREAD_COLOR_RGB", None)  # OpenCV >= 4.10
_REDUCED = {  # factor -> (color flag, grayscale flag)
    2: (cv2.IMREAD_REDUCED_COLOR_2, cv2.IMREAD_REDUCED_GRAYSCALE_2),
    4: (cv2.IMREAD_REDUCED_COLOR_4, cv2.IMREAD_REDUCED_GRAYSCALE_4),
    8: (cv2.IMREAD_REDUCED_COLOR_8, cv2.IMREAD_REDUCED_GRAYSCALE_8),
}


class DecodeError(Exception):
    """The bytes are not a usable image; the message says why (it becomes the skip reason)."""


def reduction_for(height: int, width: int, target: tuple[int, int] | None) -> int:
    """Largest DCT reduction (1, 2, 4 or 8) that keeps at least twice the target resolution.

    Keeping 2x means the final antialiased resize still does the real filtering, so the result
    stays visually equal to a full decode (tested: PSNR above 35 dB against it).
    """
    if target is None:
        return 1
    need = 2 * max(target)
    for factor in (8, 4, 2):
        if min(height, width) // factor >= need:
            return factor
    return 1


def decode(data: bytes, *, grayscale: bool, target: tuple[int, int] | None, max_pixels: int) -> np.ndarray:
    """Decode to an (H, W, 3) RGB or (H, W, 1) grayscale uint8 array.

    ``target`` (height, width) is the size the caller will resize to; it allows reduced
    decoding of large JPEGs. Raises :class:`DecodeError` for anything unusable.
    """
    if not data:
        raise DecodeError("empty file (0 bytes)")
    with warnings.catch_warnings(), _pillow_limit(None):
        # Opening reads the header only: ``max_pixels`` is checked below, before decoding, and
        # the message names it (Pillow's own limit, 178,956,970 pixels, is not the user's).
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            image = Image.open(io.BytesIO(data))
        except (OSError, SyntaxError, ValueError) as exc:
            raise DecodeError(f"not a readable image ({describe_error(exc)})") from None
    with image:
        width, height = image.size
        if width * height > max_pixels:
            raise DecodeError(too_many_pixels(width, height, max_pixels))
        if width < 1 or height < 1:
            raise DecodeError(f"image has no pixels ({width}x{height})")
        factor = reduction_for(height, width, target)
        closed = image.format == "JPEG" and (jpeg_ends_cleanly(data) or picture_end(data) is not None)
        zeros = zeros_at_end(data)[0] if image.format == "JPEG" and not closed else 0
        if zeros >= ZERO_RUN:  # a decoder takes zeros for data: a picture of nothing, no error
            raise DecodeError(f"truncated: its JPEG data ends in {zeros:,} zero bytes, not its end-of-image marker "
                              "(a download or copy cut short)")
        if closed and image.mode in ("RGB", "L"):  # (a trailer after the marker is no concern of the decoder's)
            pixels = _decode_opencv(data, grayscale, factor)
            if pixels is not None:
                return pixels
        elif closed:  # CMYK: Pillow's libjpeg says nothing of a scan cut short (JPEG_CUT_SHORT): an eighth-size pass lets
            cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_REDUCED_GRAYSCALE_8)  # libjpeg print it to the captured
            # fd 2 (a review found CMYK stored half grey where RGB was skipped)
        # While decoding, Pillow's own checks (a GIF frame, an ICO entry larger than the header
        # said) refuse at twice its limit, so its limit is the user's half: their --max-pixels.
        with warnings.catch_warnings(), _pillow_limit(max(1, max_pixels // 2)):
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            try:
                return _decode_pillow(image, grayscale, factor)
            except Image.DecompressionBombError as exc:
                raise DecodeError(f"more than --max-pixels {max_pixels:,} once decoded ({describe_error(exc)})") from None


def too_many_pixels(width: int, height: int, max_pixels: int) -> str:
    """The skip reason of an image over ``--max-pixels``."""
    return f"{width}x{height} has {width * height:,} pixels, more than --max-pixels {max_pixels:,}"


@contextmanager
def _pillow_limit(limit: int | None) -> Iterator[None]:
    """Pillow's decompression-bomb limit (a module global) set to ``limit`` for the block.

    Decoding runs one input at a time per process (packer/parallel.py's workers), so nothing
    else sees the change; it is restored however the block ends."""
    saved = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = limit
    try:
        yield
    finally:
        Image.MAX_IMAGE_PIXELS = saved


def _decode_opencv(data: bytes, grayscale: bool, factor: int) -> np.ndarray | None:
    buffer = np.frombuffer(data, np.uint8)
    if grayscale:
        flag = cv2.IMREAD_GRAYSCALE if factor == 1 else _REDUCED[factor][1]
    elif factor == 1 and _COLOR_RGB is not None:
        flag = _COLOR_RGB
    else:
        flag = cv2.IMREAD_COLOR if factor == 1 else _REDUCED[factor][0]
    pixels = cv2.imdecode(buffer, flag)
    if pixels is None:
        return None
    if not grayscale and flag != _COLOR_RGB:
        pixels = cv2.cvtColor(pixels, cv2.COLOR_BGR2RGB)
    return pixels[:, :, np.newaxis] if pixels.ndim == 2 else pixels


def _decode_pillow(image: Image.Image, grayscale: bool, factor: int) -> np.ndarray:
    try:
        if factor > 1 and image.format == "JPEG":
            image.draft(image.mode, (image.width // factor, image.height // factor))
        image.seek(0)  # first frame of animations
        image.load()
        image = ImageOps.exif_transpose(image)
        pixels = to_uint8(image, grayscale)
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise DecodeError(f"cannot decode ({describe_error(exc)})") from None
    return pixels


def to_uint8(image: Image.Image, grayscale: bool) -> np.ndarray:
    """Any Pillow mode -> (H, W, 3) RGB or (H, W, 1) L uint8; alpha is dropped (a file's image, and a
    Python dataset's: packer/preprocess/arrays.py)."""
    mode = image.mode
    if mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):
        # 16-bit (or 32-bit integer) grayscale: scale to 8 bits instead of clipping.
        values = np.asarray(image, dtype=np.float64)
        top = 65535.0 if mode.startswith("I;16") or values.max(initial=0) > 255 else 255.0
        image = Image.fromarray(np.clip(np.rint(values * (255.0 / top)), 0, 255).astype(np.uint8), "L")
    elif mode == "F":
        values = np.asarray(image, dtype=np.float64)
        if values.size and np.nanmax(values) <= 1.0:
            values = values * 255.0
        image = Image.fromarray(np.clip(np.rint(np.nan_to_num(values)), 0, 255).astype(np.uint8), "L")
    elif mode == "P":
        image = image.convert("RGBA" if "transparency" in image.info else "RGB")
    target_mode = "L" if grayscale else "RGB"
    if image.mode != target_mode:
        if image.mode in ("LA", "La") and not grayscale:
            image = image.convert("L")
        elif image.mode == "PA":  # (its palette's colours: it went through "L", grey, before)
            image = image.convert("RGBA")
        image = image.convert(target_mode)
    pixels = np.asarray(image)
    return pixels[:, :, np.newaxis] if pixels.ndim == 2 else pixels


#: What libjpeg prints when a JPEG's coded data ends before its pixels do: the rest of the picture
#: is decoded grey, without an error. A file cut short then closed with an end marker (some
#: download and repair tools do it) passes :func:`jpeg_ends_cleanly`, so this catches it.
JPEG_CUT_SHORT = "premature end of data segment"




#: ... and when bytes are left over after the picture: harmless, unless they are a run of zeros
#: just before the end marker, where the decoder took zeros for the picture's data (a download
#: preallocated and cut short, then closed).
JPEG_LEFT_OVER = "extraneous bytes before marker 0xd9"
#: Zero bytes at a JPEG's end that make it a cut copy's (16 zero bytes are 128 zero bits of data).
ZERO_RUN = 16


def damage_printed(printed: str, data: bytes = b"") -> str | None:
    """Why an image the decoder returned is damaged, from what the decoder printed (and the file's
    ``data``); ``None`` when nothing it printed means missing pixels (extraneous bytes before a
    marker do not, unless zeros stood in for the picture's data)."""
    text = printed.lower()
    if JPEG_CUT_SHORT in text:
        return "truncated: its JPEG data ends before the picture does"
    if JPEG_LEFT_OVER in text:
        zeros, closed = zeros_at_end(data)
        if closed and zeros >= ZERO_RUN:
            return f"truncated: {zeros:,} zero bytes stand for its JPEG data before the end-of-image marker (a download or copy cut short)"
    return None


def picture_end(data: bytes) -> int | None:
    """Where a JPEG's picture ends: the offset of the end-of-image marker after its first scan
    (found by walking the marker segments, so an EXIF thumbnail's marker is passed over), or
    ``None`` when the file has none: its data runs to the end of the file. Coded data holds no
    ``FF D9`` (a coded ``FF`` is followed by ``00``), so the first one after the scan begins is it;
    what follows it (a camera's trailer, padding) is not the picture's."""
    at = 2
    while at + 4 <= len(data):
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == 0xFF:  # (fill bytes before a marker)
            at += 1
        elif marker == 0xDA:  # the first scan
            end = data.find(_JPEG_END, at)
            return end if end >= 0 else None
        elif marker in (0x01, 0xD8) or 0xD0 <= marker <= 0xD7:  # markers without a length
            at += 2
        else:
            at += 2 + int.from_bytes(data[at + 2:at + 4], "big")
    return None


def zeros_at_end(data: bytes) -> tuple[int, bool]:
    """How many zero bytes end ``data``'s JPEG data, and whether an end-of-image marker follows
    them (zeros after the marker are padding, not counted)."""
    body = data.rstrip(b"\x00")
    if body.endswith(_JPEG_END):
        inner = body[:-2]
        return len(inner) - len(inner.rstrip(b"\x00")), True
    return len(data) - len(body), False


def jpeg_ends_cleanly(data: bytes) -> bool:
    """Whether ``data`` starts as a JPEG and ends with its end-of-image marker (trailing zeros allowed)."""
    return data.startswith(_JPEG_MAGIC) and data.rstrip(b"\x00")[-2:] == _JPEG_END


#: ``<_io.BytesIO object at 0x7f...>`` and the like: a memory address, different in every run.
_OBJECT_REPR = re.compile(r"\s*<[^<>]* at 0x[0-9a-fA-F]+>")


def describe_error(exc: BaseException) -> str:
    """The first line of an exception's message, reproducible (no memory addresses)."""
    text = _OBJECT_REPR.sub("", str(exc)).strip().splitlines()
    return text[0] if text else type(exc).__name__


