"""Token access over any packed text dataset, torch-free: documents, the flat stream, decoding.

A text dataset stores each document as one sample (record shape ``(1, 1, n)``, payload ``n``
little-endian uint16/uint32 token ids, EOS last). The *flat stream* is every document back to
back: the store's payload stream (``Store.payload_offsets``, ``Store.read_stream``), so this
module needs no format's layout. How each format serves it is that format's business:

* blob: the data section *is* the flat stream, mapped (or in shared memory); a span is one slice.
* HDF5: the flat ``payload`` dataset is the stream too; a span is one ranged read.
* LMDB, WebDataset: a span reads the (few) documents it touches and concatenates them.

Document token offsets (``(N + 1,)`` int64) are the store's byte offsets over the itemsize: from
the format's own index (blob/HDF5 offsets, the WebDataset member index) or, for LMDB, one pass
over the records, once per store and cached.

``verify=True`` checks every document a read touches against its stored checksum (a document
is the checksummed sample: label -1, shape ``(1, 1, n)``, its token bytes), once per document
and process: the first read of any of its tokens checks the whole document (a window that
covers it is checked in place; one that covers part of it reads the rest). A damaged document
raises :class:`~readers.checksums.CorruptSampleError` naming the dataset and the document.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Sequence

import numpy as np

from ..schema import Metadata, PackedFormatError
from ..tokenizer import Tokenizer, TokenizerError, file_sha256, load_tokenizer
from . import detect_format, reader_hint, store_class
from .base import Store, dataset_path

__all__ = ["TokenStore", "check_tokenizer"]

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def check_tokenizer(meta: Metadata, expect: str | os.PathLike[str], *, where: str) -> None:
    """Raise :class:`TokenizerError` unless ``expect`` (``"bytes"``, a file path or its sha256) is the dataset's tokenizer."""
    record = meta.tokenizer
    text = str(expect)
    if text == "bytes":
        ok, got = record.get("kind") == "bytes", "bytes"
    else:
        if not _SHA256.match(text.lower()) and not os.path.isfile(text):
            raise TokenizerError(f"{where}: expect_tokenizer={text!r} is no file: give the tokenizer file it was made with "
                                 f"(tokenizer.json, a SentencePiece .model), its sha256, or 'bytes'")
        got = text.lower() if _SHA256.match(text.lower()) else file_sha256(text)
        ok = got == record.get("sha256")
    if not ok:
        raise TokenizerError(
            f"{where}: was tokenised with {record.get('kind')} tokenizer {record.get('name')!r} "
            f"(sha256 {record.get('sha256') or '-'}), not {'the bytes tokenizer' if text == 'bytes' else f'{text} (sha256 {got})'}: "
            "use the tokenizer it was made with"
        )


class TokenStore:
    """A text dataset's tokens; picklable, opens storage lazily per process."""

    def __init__(
        self, path: str | Path, *, expect_tokenizer: str | os.PathLike[str] | None = None, in_memory: bool = False, verify: bool = False
    ) -> None:
        self.path = dataset_path(path)  # (a file:// URL: its local path; Path() alone made it file:/x)
        self.store: Store = _open(self.path, in_memory, bool(verify))
        self.meta: Metadata = self.store.meta
        if self.meta.kind != "text":
            raise PackedFormatError(
                f"{self.path}: a packer {self.store.label} dataset of {self.meta.count:,} {self.meta.kind}s, not text (token ids): "
                + reader_hint(self.meta)
            )
        if expect_tokenizer is not None:
            check_tokenizer(self.meta, expect_tokenizer, where=str(self.path))
        self.dtype = np.dtype(self.meta.dtype).newbyteorder("<")
        self._offsets: np.ndarray | None = None
        self._tokenizer: Tokenizer | None = None
        self._checked: np.ndarray | None = None  # verify: documents this process has checked

    @property
    def verify(self) -> bool:
        """Whether reads check each document's stored checksum (see the module docstring)."""
        return self.store.verify

    def __len__(self) -> int:
        return self.meta.count

    @property
    def num_tokens(self) -> int:
        """Tokens in the flat stream (EOS separators included)."""
        return int(self.offsets[-1])

    @property
    def offsets(self) -> np.ndarray:
        """``(N + 1,)`` int64: document ``i`` is tokens ``offsets[i]:offsets[i + 1]`` of the flat stream."""
        if self._offsets is None:
            self._offsets = self._token_offsets()
        return self._offsets

    def _token_offsets(self) -> np.ndarray:
        size = self.dtype.itemsize
        byte_offsets = self.store.payload_offsets()
        offsets = byte_offsets // size
        if np.any(byte_offsets % size) or int(offsets[-1]) != self.meta.tokens:
            raise PackedFormatError(f"{self.path}: document offsets disagree with the metadata's {self.meta.tokens} tokens: the dataset is corrupt")
        return offsets

    # -- reading ----------------------------------------------------------------------------
    def document(self, index: int) -> np.ndarray:
        """Document ``index``'s token ids (EOS included), as a new array of the stored dtype."""
        i = self.store.check_index(index)
        start, stop = self.offsets[i : i + 2]
        return self.span(int(start), int(stop))

    def span(self, start: int, stop: int, out: np.ndarray | None = None) -> np.ndarray:
        """Tokens ``start:stop`` of the flat stream, into ``out`` (or a new array)."""
        total = self.num_tokens
        if not 0 <= start <= stop <= total:
            raise IndexError(f"token span {start}:{stop} is outside the stream of {total} tokens")
        if out is None:
            out = np.empty(stop - start, self.dtype)
        size = self.dtype.itemsize
        self.store.read_stream(start * size, stop * size, out.view(np.uint8))
        if self.store.verify and stop > start:
            self._check_documents(start, stop, out)
        return out

    def _check_documents(self, start: int, stop: int, out: np.ndarray) -> None:
        """Check each document that tokens ``start:stop`` (read into ``out``) touch, once per process."""
        offsets = self.offsets
        if self._checked is None:
            self._checked = np.zeros(len(self), bool)
        first = int(np.searchsorted(offsets, start, "right")) - 1
        last = int(np.searchsorted(offsets, stop, "left"))
        for d in range(first, last):
            if self._checked[d]:
                continue
            lo, hi = int(offsets[d]), int(offsets[d + 1])
            if start <= lo and hi <= stop:
                tokens = out[lo - start : hi - start]
            else:
                tokens = np.empty(hi - lo, self.dtype)
                self.store.read_stream(lo * self.dtype.itemsize, hi * self.dtype.itemsize, tokens.view(np.uint8))
            self.store.check_sample(d, -1, (1, 1, hi - lo), np.ascontiguousarray(tokens).view(np.uint8))
            self._checked[d] = True

    # -- decoding ---------------------------------------------------------------------------
    def tokenizer(self, spec: str | os.PathLike[str] | None = None) -> Tokenizer:
        """The dataset's tokenizer: ``spec``, else the file recorded at conversion; checked by sha256."""
        if spec is None and self._tokenizer is not None:
            return self._tokenizer
        record = self.meta.tokenizer
        if spec is None:
            spec = "bytes" if record.get("kind") == "bytes" else record.get("path")
            if spec != "bytes" and (not spec or not Path(spec).is_file()):
                raise TokenizerError(
                    f"{self.path}: its tokenizer {record.get('name')!r} is not at {spec}; pass the tokenizer file (packer head "
                    "--tokenizer PATH; in Python, dataset.decode(ids, tokenizer=PATH))"
                )
        check_tokenizer(self.meta, spec, where=str(self.path))
        tokenizer = load_tokenizer(spec)
        self._tokenizer = tokenizer
        return tokenizer

    def decode(self, ids: Sequence[int] | np.ndarray, tokenizer: str | os.PathLike[str] | None = None) -> str:
        """Text of ``ids`` with the dataset's tokenizer (for inspection)."""
        return self.tokenizer(tokenizer).decode(np.asarray(ids).reshape(-1).tolist())

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_tokenizer"] = None  # loaded again where needed
        state["_checked"] = None  # each process checks what it reads
        return state


def _open(path: Path, in_memory: bool, verify: bool) -> Store:
    fmt = detect_format(path)
    if in_memory:
        from .blob import BlobStore

        if not BlobStore.recognises(path):
            raise ValueError(f"{path}: in_memory=True copies a blob into shared memory, and this is a {fmt} dataset; "
                             "leave in_memory out (or convert to .blob)")
        return BlobStore(path, in_memory=True, verify=verify)
    return store_class(fmt)(path, verify=verify)
