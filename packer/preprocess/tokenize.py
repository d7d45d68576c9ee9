"""The work units of a text conversion: tokenise documents into little-endian token-id payloads.

Units carry the tokenizer *spec* (``"bytes"`` or a file path), never a loaded tokenizer: each
worker process loads its own, once (:func:`worker_tokenizer`). Errors come back as
:class:`~packer.preprocess.task.Failed` values, as for images.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from readers.tokenizer import Tokenizer, load_tokenizer

from ..sources.text import TextDoc
from .task import Encoded, Failed

__all__ = ["TokenizeTask", "worker_tokenizer", "TEXT_LABEL"]

#: The label every document gets (text datasets are unlabeled).
TEXT_LABEL = -1

_loaded: dict[str, Tokenizer] = {}


def worker_tokenizer(spec: str) -> Tokenizer:
    """The tokenizer of ``spec``, loaded once per process."""
    tokenizer = _loaded.get(spec)
    if tokenizer is None:
        tokenizer = _loaded[spec] = load_tokenizer(spec)
    return tokenizer


@dataclass(frozen=True)
class TokenizeTask:
    """Tokenise one document: ids (truncated to ``max_tokens``), then ``eos_id``, as ``dtype``."""

    tokenizer: str
    dtype: str
    eos_id: int | None = None
    max_tokens: int | None = None

    def __call__(self, doc: TextDoc) -> Encoded | Failed:
        try:
            ids = worker_tokenizer(self.tokenizer).encode(doc.text)
        except Exception as exc:  # noqa: BLE001 - a tokenizer failure is one document's problem
            return Failed(doc.source, f"cannot tokenise ({type(exc).__name__}: {exc})")
        return self.encoded(doc, ids)

    def map(self, docs: Sequence[TextDoc]) -> list[Encoded | Failed]:
        """``self(doc)`` for each document, encoded in one batch (the Hugging Face backend batches
        natively); if the batch fails, document by document, so only the bad one fails."""
        try:
            all_ids = worker_tokenizer(self.tokenizer).encode_batch([d.text for d in docs])
        except Exception:  # noqa: BLE001 - find the failing document one by one
            return [self(d) for d in docs]
        return [self.encoded(d, ids) for d, ids in zip(docs, all_ids)]

    def encoded(self, doc: TextDoc, ids: list[int]) -> Encoded | Failed:
        """The stored sample of ``doc`` given its token ids."""
        if not ids:
            return Failed(doc.source, "empty document (no tokens)")
        if self.max_tokens is not None:
            ids = ids[: self.max_tokens]
        if self.eos_id is not None:
            ids = [*ids, self.eos_id]
        payload = np.asarray(ids, dtype=np.dtype(self.dtype).newbyteorder("<")).tobytes()
        return Encoded(TEXT_LABEL, (1, 1, len(ids)), payload, self.dtype)
