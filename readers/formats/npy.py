"""The ``.npy`` member of a WebDataset sample: its header, written (:func:`npy_header`) and
parsed (:func:`parse_npy`), and the check of a stored one (:func:`npy_faults`). A raw image is
a uint8 ``(C, H, W)`` array, a text document a little-endian uint16/uint32 ``(n,)`` array; the
layout is docs/FORMATS.md's ("WebDataset shards", *Members*)."""

from __future__ import annotations

import io
from functools import lru_cache
from tokenize import TokenError
from typing import Iterator

import numpy as np

from ..schema import PackedFormatError
from .base import Fault

__all__ = ["npy_header", "sample_array_shape", "parse_npy", "npy_faults"]


@lru_cache(maxsize=64)
def npy_header(shape: tuple[int, ...], dtype: str = "uint8") -> bytes:
    """The .npy (version 1.0) header of a C-ordered array of ``shape`` (a multiple of 64 bytes).

    Images are uint8 ``(C, H, W)``; a text document is a little-endian uint16/uint32 token array
    ``(n,)`` (:func:`sample_array_shape`).
    """
    buffer = io.BytesIO()
    descr = np.dtype(dtype).newbyteorder("<").str if np.dtype(dtype).itemsize > 1 else "|u1"
    np.lib.format.write_array_header_1_0(buffer, {"descr": descr, "fortran_order": False, "shape": tuple(shape)})
    return buffer.getvalue()


def sample_array_shape(shape: tuple[int, ...], dtype: str) -> tuple[int, ...]:
    """Shape of a sample's ``.npy`` member: ``(C, H, W)`` for pixels, ``(n,)`` for a token document."""
    return tuple(shape) if dtype == "uint8" else (int(shape[-1]),)


@lru_cache(maxsize=64)
def _parse_npy_header(header: bytes) -> tuple[tuple[int, ...], np.dtype, int]:
    stream = io.BytesIO(header)
    version = np.lib.format.read_magic(stream)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(stream)
    else:
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(stream)
    if fortran:
        raise ValueError("Fortran-ordered arrays are not packer samples")
    return tuple(shape), dtype, stream.tell()


def parse_npy(data: bytes | memoryview | np.ndarray) -> tuple[tuple[int, ...], np.dtype, int]:
    """Shape, dtype and data offset of an .npy file held in ``data`` (headers are cached)."""
    view = memoryview(data).cast("B")
    if len(view) < 10 or bytes(view[:6]) != b"\x93NUMPY":
        raise PackedFormatError("not an .npy file")
    major = view[6]
    size = int.from_bytes(view[8:10], "little") + 10 if major == 1 else int.from_bytes(view[8:12], "little") + 12
    try:
        return _parse_npy_header(bytes(view[:size]))
    except (ValueError, SyntaxError, TypeError, TokenError, RecursionError) as exc:  # (numpy tokenises the header's text)
        raise PackedFormatError(f"bad .npy header ({exc})") from None


def npy_faults(header: bytes, shape: tuple[int, ...], dtype: str, where: str) -> Iterator[Fault]:
    """A raw sample's ``.npy`` header (the member's bytes before the indexed payload) describes
    ``shape`` of little-endian ``dtype``, and ends where the payload starts."""
    try:
        got_shape, got_dtype, size = parse_npy(header)
    except PackedFormatError as exc:
        yield where, f"its .npy member header: {exc}"
        return
    if size != len(header) or got_shape != tuple(shape) or got_dtype != np.dtype(dtype).newbyteorder("<"):
        yield where, f"its .npy header says {got_dtype} {got_shape} in {size} bytes, expected {dtype} {tuple(shape)} in {len(header)}"
