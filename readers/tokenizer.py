"""Tokenizers a text dataset is made with, and their identity record.

Three kinds, chosen by :func:`load_tokenizer`'s spec:

* ``"bytes"``: built in, no file. A document is its UTF-8 bytes (ids 0..255); the end-of-document
  token is id :data:`BYTES_EOS` (256), so the vocabulary has :data:`BYTES_VOCAB` (257) ids.
* a path to a Hugging Face ``tokenizer.json`` (the ``tokenizers`` library).
* a path to a SentencePiece ``.model`` (``pip install 'packer[text]'``; imported on use).

:meth:`Tokenizer.identity` is what the metadata records (kind, vocab_size, eos_id, sha256 of the
file, name), so a reader can refuse a tokenizer other than the one the data was made with. Used by
both sides (``packer`` encodes, ``readers`` decodes); torch-free.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Sequence

__all__ = ["Tokenizer", "load_tokenizer", "file_sha256", "token_dtype", "TokenizerError", "BYTES_EOS", "BYTES_VOCAB", "EOS_NAMES"]

#: ``bytes`` tokenizer: ids 0..255 are the UTF-8 bytes, 256 ends a document.
BYTES_EOS = 256
BYTES_VOCAB = 257
#: Special tokens taken as a file tokenizer's own end of document, first found wins.
EOS_NAMES = ("<|endoftext|>", "</s>", "<eos>", "[EOS]", "<|end_of_text|>", "[SEP]")


class TokenizerError(ValueError):
    """A tokenizer cannot be loaded or does not match what a dataset was made with."""


def file_sha256(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def token_dtype(vocab_size: int) -> str:
    """``"uint16"`` when every id of a ``vocab_size`` vocabulary fits, else ``"uint32"``."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


class Tokenizer:
    """One loaded tokenizer: ``encode(text) -> list[int]``, ``decode(ids) -> str`` and its identity."""

    def __init__(self, kind: str, path: str, vocab_size: int, eos_id: int | None, backend: Any = None) -> None:
        self.kind = kind
        self.path = path
        self.vocab_size = vocab_size
        self.eos_id = eos_id
        self._backend = backend
        self.sha256 = file_sha256(path) if path else ""

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens added)."""
        if self.kind == "bytes":
            return list(text.encode("utf-8"))
        if self.kind == "huggingface":
            return self._backend.encode(text, add_special_tokens=False).ids
        return self._backend.encode(text)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """:meth:`encode` of each text (the Hugging Face backend runs them as one batch)."""
        if self.kind == "huggingface":
            return [e.ids for e in self._backend.encode_batch(list(texts), add_special_tokens=False)]
        return [self.encode(t) for t in texts]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``; the ``bytes`` tokenizer shows EOS as a newline and invalid UTF-8 as U+FFFD."""
        ids = [int(i) for i in ids]
        if self.kind == "bytes":
            return bytes(10 if i == BYTES_EOS else i for i in ids).decode("utf-8", errors="replace")
        if self.kind == "huggingface":
            return self._backend.decode(ids, skip_special_tokens=False)
        return self._backend.decode(ids)

    def identity(self) -> dict[str, Any]:
        """The record stored in the metadata (``Metadata.tokenizer``; the converter adds the file's ``path``)."""
        return {
            "kind": self.kind,
            "vocab_size": self.vocab_size,
            "eos_id": self.eos_id,
            "sha256": self.sha256,
            "name": os.path.basename(self.path) if self.path else "bytes",
        }

    def __repr__(self) -> str:
        return f"Tokenizer(kind={self.kind!r}, vocab_size={self.vocab_size}, eos_id={self.eos_id}, path={self.path!r})"


def load_tokenizer(spec: str | os.PathLike[str]) -> Tokenizer:
    """``"bytes"``, a ``tokenizer.json`` path or a SentencePiece ``.model`` path -> :class:`Tokenizer`."""
    if str(spec) == "bytes":
        return Tokenizer("bytes", "", BYTES_VOCAB, BYTES_EOS)
    path = Path(spec)
    if not path.is_file():
        raise TokenizerError(f"{path}: tokenizer file not found (pass 'bytes', a tokenizer.json or a SentencePiece .model)")
    if path.suffix == ".model":
        return _load_sentencepiece(path)
    return _load_huggingface(path)


def _load_huggingface(path: Path) -> Tokenizer:
    try:
        from tokenizers import Tokenizer as HFTokenizer
    except ImportError:  # pragma: no cover - a declared dependency
        raise TokenizerError("the 'tokenizers' package is needed for tokenizer.json files: pip install tokenizers") from None
    try:
        backend = HFTokenizer.from_file(str(path))
    except Exception as exc:  # noqa: BLE001 - the library raises plain Exception for bad files
        raise TokenizerError(f"{path}: not a Hugging Face tokenizer.json ({exc})") from None
    vocab = backend.get_vocab(with_added_tokens=True)
    vocab_size = max(vocab.values(), default=-1) + 1  # ids may have gaps: the largest id bounds the dtype
    eos = next((vocab[name] for name in EOS_NAMES if name in vocab), None)
    return Tokenizer("huggingface", str(path), vocab_size, eos, backend)


def _load_sentencepiece(path: Path) -> Tokenizer:
    try:
        import sentencepiece
    except ImportError:
        raise TokenizerError(
            f"{path}: SentencePiece models need the 'sentencepiece' package: pip install 'packer[text]'"
        ) from None
    try:
        backend = sentencepiece.SentencePieceProcessor(model_file=str(path))
    except Exception as exc:  # noqa: BLE001
        raise TokenizerError(f"{path}: not a SentencePiece model ({exc})") from None
    eos = backend.eos_id()
    return Tokenizer("sentencepiece", str(path), backend.get_piece_size(), eos if eos >= 0 else None, backend)
