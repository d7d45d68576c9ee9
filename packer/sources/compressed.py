"""Compressed text files: which ones packer reads, and how they are opened.

A corpus file named ``*.jsonl.gz``, ``*.ndjson.zst``, ``*.txt.xz``... is read through its
decompressor: gzip (zlib-ng's, a dependency of packer, as for ``.tar.gz`` archives), bzip2 and
xz from the standard library, zstd with the ``zstandard`` package (``pip install zstandard``, in
``packer[text]``). A compressed stream cannot be read from the middle, so the converting process
reads such files itself, in order, as the work is handed out (packer/sources/text_docs.py).
"""

from __future__ import annotations

import bz2
import importlib.util
import lzma
import os
import zlib
from typing import BinaryIO

from ..errors import SourceError

__all__ = ["CODECS", "UNREAD_SUFFIXES", "codec_of", "open_decompressed", "read_exactly", "DECOMPRESS_ERRORS"]

#: Compression suffixes packer reads, and their codec.
CODECS = {".gz": "gzip", ".bz2": "bzip2", ".xz": "xz", ".zst": "zstd", ".zstd": "zstd"}
#: Compression suffixes packer does not read (such text files are named in a warning).
UNREAD_SUFFIXES = (".lz4",)


def codec_of(name: str) -> str | None:
    """The codec of the file ``name`` by its last suffix, or ``None`` (not compressed, or unread)."""
    return CODECS.get(os.path.splitext(name)[1].lower())


def open_decompressed(path: str | os.PathLike[str], codec: str) -> BinaryIO:
    """``path`` opened for reading its decompressed bytes; :class:`SourceError` when zstd's
    package is missing."""
    if codec == "gzip":
        from zlib_ng import gzip_ng

        return gzip_ng.open(path, "rb")  # type: ignore[return-value]
    if codec == "bzip2":
        return bz2.open(path, "rb")
    if codec == "xz":
        return lzma.open(path, "rb")
    if importlib.util.find_spec("zstandard") is None:
        raise SourceError(f"{path}: reading zstd needs the zstandard package: pip install zstandard") from None
    return _ZstdReader(path)  # type: ignore[return-value]


class _ZstdReader:
    """A zstd file's decompressed bytes, frame after frame; a file that ends inside a frame (a
    cut download) raises, as gzip, bzip2 and xz readers do (zstandard's ``stream_reader``
    stops there without a word)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        import zstandard

        self._zstd = zstandard
        self._file = open(path, "rb")
        self._frame = zstandard.ZstdDecompressor().decompressobj()
        self._fed = False  # whether the current frame has had input
        self._buffer, self._at = b"", 0

    def read(self, size: int = -1) -> bytes:
        parts, want = [], size if size >= 0 else 1 << 62
        while want > 0:
            if self._at >= len(self._buffer) and not self._fill():
                break
            part = self._buffer[self._at : self._at + want]
            self._at += len(part)
            want -= len(part)
            parts.append(part)
        return b"".join(parts)

    def _fill(self) -> bool:
        """The next decompressed bytes into the buffer; ``False`` at the end of the file."""
        while True:
            raw = self._file.read(1 << 20)
            if not raw:
                if self._fed and not self._frame.eof:
                    raise self._zstd.ZstdError("the file ends inside a frame (cut short)")
                return False
            out = []
            while raw:
                self._fed = True
                out.append(self._frame.decompress(raw))
                raw = b""
                if self._frame.eof:  # a frame ended: what follows starts the next one
                    raw = self._frame.unused_data
                    self._frame, self._fed = self._zstd.ZstdDecompressor().decompressobj(), False
            self._buffer, self._at = b"".join(out), 0
            if self._buffer:
                return True

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> _ZstdReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_exactly(reader: BinaryIO, size: int) -> bytes:
    """``size`` bytes of ``reader`` (fewer only at its end): a decompressor may return fewer a call."""
    parts, left = [], size
    while left > 0:
        part = reader.read(min(left, 16 << 20))
        if not part:
            break
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def _errors() -> tuple[type[BaseException], ...]:
    from zlib_ng import zlib_ng

    errors: tuple[type[BaseException], ...] = (OSError, EOFError, zlib.error, zlib_ng.error, lzma.LZMAError, ValueError)
    try:
        import zstandard
    except ImportError:
        return errors
    return (*errors, zstandard.ZstdError)


#: What a damaged compressed file raises while it is read.
DECOMPRESS_ERRORS = _errors()
