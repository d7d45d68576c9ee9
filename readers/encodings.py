"""How a sample's pixels are stored: THE table of encodings.

One row per encoding: its name (metadata ``encoding``, ``--encoding``), the extension of a
WebDataset sample's image member (docs/FORMATS.md, "Members"), a typical size reduction (to
size WebDataset pieces for ``--shard-bytes``) and its decoder. Everything else derives from it:
``readers.schema.ENCODINGS`` (the names), ``readers.formats.webdataset.EXTENSIONS``, and the
encoders of ``packer/preprocess/encode.py``, keyed by these names (tests/test_encodings.py
checks that the key sets agree and that every encoding round-trips through every format).

This module imports only ``readers.decoders`` (which imports nothing from readers), since
``schema`` derives its names from it; Pillow and ``simplejpeg`` are imported on first decode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .decoders import jpeg_decode, pillow_decode

__all__ = ["Encoding", "ENCODINGS", "get_encoding", "pillow_decode"]


@dataclass(frozen=True)
class Encoding:
    """One stored encoding of a sample's pixels."""

    #: Name in the metadata record and on the command line.
    name: str
    #: Extension of the image member of a WebDataset sample (``KEY.<extension>``).
    extension: str
    #: Typical size reduction against raw pixels (a guess, used only to size pieces).
    ratio: int
    #: ``(payload, channels) -> (C, H, W) uint8``; ``None``: the payload *is* the planar pixels.
    decode: Callable[[bytes | memoryview, int], np.ndarray] | None


#: Every encoding, by name (the order is the order ``--encoding`` lists them).
ENCODINGS: dict[str, Encoding] = {
    encoding.name: encoding
    for encoding in (
        Encoding("raw", "npy", 1, None),
        Encoding("jpeg", "jpg", 10, jpeg_decode),
        Encoding("png", "png", 2, pillow_decode),
    )
}


def get_encoding(name: str) -> Encoding:
    """The table row of ``name``; the error lists the valid names."""
    try:
        return ENCODINGS[name]
    except KeyError:
        raise ValueError(f"unknown encoding {name!r} (choose from: {', '.join(ENCODINGS)})") from None
