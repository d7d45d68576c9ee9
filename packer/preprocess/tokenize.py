"""The work units of a text conversion: tokenise documents into little-endian token-id payloads.

Units carry the tokenizer *spec* (``"bytes"`` or a file path), never a loaded tokenizer: each
worker process loads its own, once (:func:`worker_tokenizer`). Errors come back as
:class:`~packer.preprocess.task.Failed` values, as for images.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from readers.tokenizer import LONG_TEXT, Tokenizer, load_tokenizer

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
            ids = worker_tokenizer(self.tokenizer).encode_long(doc.text, self.max_tokens)
        except Exception as exc:  # noqa: BLE001 - a tokenizer failure is one document's problem
            return Failed(doc.source, f"cannot tokenise ({type(exc).__name__}: {exc})")
        return self.encoded(doc, ids)

    def map(self, docs: Sequence[TextDoc]) -> list[Encoded | Failed]:
        """``self(doc)`` for each document, the short ones encoded in one batch (the Hugging Face
        backend batches natively; a long one is tokenised in pieces: ``readers/tokenizer.py``); if
        the batch fails, document by document, so only the bad one fails."""
        short = [i for i, d in enumerate(docs) if len(d.text) <= LONG_TEXT]
        try:
            batch = dict(zip(short, worker_tokenizer(self.tokenizer).encode_batch([docs[i].text for i in short])))
        except Exception:  # noqa: BLE001 - find the failing document one by one
            batch = {}
        return [self.encoded(d, batch[i]) if i in batch else self(d) for i, d in enumerate(docs)]

    def encoded(self, doc: TextDoc, ids: Sequence[int] | np.ndarray) -> Encoded | Failed:
        """The stored sample of ``doc`` given its token ids."""
        if not len(ids):
            return Failed(doc.source, "empty document (no tokens)")
        ids = np.asarray(ids[: self.max_tokens], dtype=np.int64)
        if self.eos_id is not None:
            ids = np.append(ids, self.eos_id)
        payload = ids.astype(np.dtype(self.dtype).newbyteorder("<")).tobytes()
        return Encoded(TEXT_LABEL, (1, 1, len(ids)), payload, self.dtype)
