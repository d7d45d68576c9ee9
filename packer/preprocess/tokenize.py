"""The work units of a text conversion: read documents and tokenise them into little-endian
token-id payloads.

Units carry the documents' places (packer/sources/text_docs.py: the worker reads their text) and
the tokenizer *spec* (``"bytes"`` or a file path), never a loaded tokenizer: each worker process
loads its own, once (:func:`worker_tokenizer`). A document that cannot be read or tokenised comes
back as a :class:`~packer.preprocess.task.Failed` value, as an image does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from readers.schema import Skipped
from readers.tokenizer import LONG_TEXT, Tokenizer, load_tokenizer

from ..sources.text_docs import Changed, document_texts
from ..work_unit import WorkUnit
from .task import SOURCE_CHANGED, Encoded, Failed

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
class TokenizeTask(WorkUnit):
    """Tokenise one document: ``bos_id``, ids (truncated to ``max_tokens``), then ``eos_id``, as ``dtype``."""

    tokenizer: str
    dtype: str
    eos_id: int | None = None
    max_tokens: int | None = None
    bos_id: int | None = None

    def __call__(self, doc: Any) -> Encoded | Failed:
        return self.map([doc])[0]

    def map(self, docs: Sequence[Any]) -> list[Encoded | Failed]:
        """Each document (a :class:`~packer.sources.text_docs.DocSpan` or
        :class:`~packer.sources.text_docs.TextDoc`) read (:func:`document_texts`) and tokenised:
        the short ones in one batch (the Hugging Face backend batches natively; a long one is
        tokenised in pieces: ``readers/tokenizer.py``); if the batch fails, document by document,
        so only the bad one fails."""
        texts = document_texts(docs)
        short = [i for i, text in enumerate(texts) if isinstance(text, str) and len(text) <= LONG_TEXT]
        try:
            batch = dict(zip(short, worker_tokenizer(self.tokenizer).encode_batch([texts[i] for i in short])))
        except Exception:  # noqa: BLE001 - find the failing document one by one
            batch = {}
        return [Failed(text.path, text.reason, stop=SOURCE_CHANGED if isinstance(text, Changed) else "") if isinstance(text, Skipped) else
                self.encoded(doc.source, batch[i]) if i in batch else self.tokenised(doc.source, text)
                for i, (doc, text) in enumerate(zip(docs, texts))]

    def tokenised(self, source: str, text: str) -> Encoded | Failed:
        """The stored sample of the document ``source``, whose text is ``text``."""
        try:
            ids = worker_tokenizer(self.tokenizer).encode_long(text, self.max_tokens)
        except Exception as exc:  # noqa: BLE001 - a tokenizer failure is one document's problem
            try:  # (JSON's \ud800 escapes make such strings; each tokenizer words the failure its own way)
                text.encode("utf-8")
            except UnicodeEncodeError as bad:
                return Failed(source, f"not valid Unicode: a lone surrogate {text[bad.start]!r} at character {bad.start:,}")
            return Failed(source, f"cannot tokenise ({type(exc).__name__}: {exc})")
        return self.encoded(source, ids)

    def encoded(self, source: str, ids: Sequence[int] | np.ndarray) -> Encoded | Failed:
        """The stored sample of the document ``source`` given its token ids."""
        if not len(ids):
            return Failed(source, "empty document (no tokens)")
        ids = np.asarray(ids[: self.max_tokens], dtype=np.int64)
        if self.eos_id is not None:
            ids = np.append(ids, self.eos_id)
        if self.bos_id is not None:
            ids = np.insert(ids, 0, self.bos_id)
        payload = ids.astype(np.dtype(self.dtype).newbyteorder("<")).tobytes()
        return Encoded(TEXT_LABEL, (1, 1, len(ids)), payload, self.dtype)
