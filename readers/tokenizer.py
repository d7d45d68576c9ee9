"""Tokenizers a text dataset is made with, and their identity record.

Three kinds, chosen by :func:`load_tokenizer`'s spec:

* ``"bytes"``: built in, no file. A document is its UTF-8 bytes (ids 0..255); the end-of-document
  token is id :data:`BYTES_EOS` (256), so the vocabulary has :data:`BYTES_VOCAB` (257) ids.
* a path to a Hugging Face ``tokenizer.json`` (the ``tokenizers`` library).
* a path to a SentencePiece ``.model`` (``pip install 'packer[text]'``; imported on use).

:meth:`Tokenizer.identity` is what the metadata records (kind, vocab_size, eos_id, sha256 of the
file, name), so a reader can refuse a tokenizer other than the one the data was made with. Used by
both sides (``packer`` encodes, ``readers`` decodes); torch-free.

A long text (over :data:`LONG_TEXT` characters: a whole book, a corpus saved as one ``.txt``) is
tokenised in pieces by :meth:`Tokenizer.encode_long`: a Hugging Face encoding keeps offsets and
token strings beside every id, so a whole large document at once could take more memory than the
machine has (the message of the commit that made this change has the measurement). Only a
Hugging Face BPE, WordPiece or WordLevel model whose pre-tokenizer ends its pre-tokens at
whitespace is cut (:data:`CUTTABLE_MODELS`: its ids are made within each pre-token; the
pre-tokenizer is probed, :func:`cuts_of`); others (Unigram, SentencePiece, no
pre-tokenizer or one that runs across spaces) are tokenised whole, as before. The text is
cut only where the ids are the same either way: at a candidate cut (after a newline, else before
a space, each followed by a character that is not whitespace), the ids of the
:data:`CUT_CONTEXT` characters before it and of those after it, put end to end, must equal the
ids of the two together (checked at every cut). A pre-tokenizer that prefixes every text it
starts (Metaspace) fails that check at newlines and is cut before spaces; a text with no cut
that passes (no spaces at all) is tokenised whole.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .extras import install_hint

__all__ = ["Tokenizer", "load_tokenizer", "file_sha256", "token_dtype", "TokenizerError", "BYTES_EOS", "BYTES_VOCAB", "EOS_NAMES",
           "LONG_TEXT", "PIECE_CHARS", "CUT_CONTEXT"]

#: ``bytes`` tokenizer: ids 0..255 are the UTF-8 bytes, 256 ends a document.
BYTES_EOS = 256
BYTES_VOCAB = 257
#: Special tokens taken as a file tokenizer's own end of document, first found wins.
EOS_NAMES = ("<|endoftext|>", "</s>", "<eos>", "[EOS]", "<|end_of_text|>", "[SEP]")
#: Beginning-of-document token names, in order, for ``--bos auto`` (after the configured one).
BOS_NAMES = ("<s>", "<|begin_of_text|>", "<|startoftext|>", "<bos>", "[BOS]", "[CLS]")
#: A text longer than this many characters is tokenised in pieces (module docstring).
LONG_TEXT = 1 << 18
#: About how many characters each piece of a long text holds.
PIECE_CHARS = 1 << 16
#: Characters on each side of a cut that are tokenised to check it (module docstring).
CUT_CONTEXT = 1024
#: Candidate cuts, best first: after a newline, else before a space; not before whitespace.
CUTS = (re.compile(r"\n(?=\S)"), re.compile(r"(?<=\S)(?= \S)"))
#: Hugging Face models whose ids are made within each pre-token: the only ones cut, and only with
#: a pre-tokenizer that ends its pre-tokens at newlines or spaces (:func:`cuts_of`). A
#: Unigram model's best path runs over the whole text (its float sums make ties and near-ties
#: depend on all that came before), and pre-tokens that run across spaces let a merge span a cut:
#: those, and SentencePiece models (either kind), are tokenised whole (module docstring).
CUTTABLE_MODELS = frozenset({"BPE", "WordPiece", "WordLevel"})
#: Candidates of each kind tried past a piece's end before the next kind is tried.
_TRIES = 8
#: Pieces' worth of text searched for a cut before the rest is tokenised whole.
_WINDOWS = 4


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
        #: The tokenizer's own beginning-of-document token (``--bos auto``), or ``None``.
        self.bos_id: int | None = None
        #: End-of-document names the vocabulary has as added tokens not marked special, so never taken
        #: as the EOS: a document holding the text would give that id mid-document (a walkthrough).
        self.plain_eos_names: list[str] = []
        self._backend = backend
        self.sha256 = file_sha256(path) if path else ""
        #: Where a long text may be cut into pieces (:meth:`encode_long`): the kinds of
        #: :data:`CUTS` at which a Hugging Face model of :data:`CUTTABLE_MODELS` has its
        #: pre-tokenizer end pre-tokens (:func:`cuts_of`); none for any other tokenizer.
        self.cuts: tuple[re.Pattern[str], ...] = ()

    def text_token(self, token_id: int) -> str | None:
        """The text of ``token_id`` if it is an ordinary token, one that text tokenises to (a
        byte, a word piece; ``None`` for a special or control token, or an id with no token)."""
        if self.kind == "bytes":
            return bytes([token_id]).decode("latin-1") if token_id < BYTES_EOS else None
        if self.kind == "huggingface":
            special = {i for i, token in self._backend.get_added_tokens_decoder().items() if token.special}
            return None if token_id in special else self._backend.id_to_token(token_id)
        if self._backend.IsControl(token_id) or self._backend.IsUnknown(token_id):
            return None
        return self._backend.IdToPiece(token_id)

    @property
    def cuttable(self) -> bool:
        """Whether a long text is cut into pieces at all."""
        return bool(self.cuts)

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

    def encode_long(self, text: str, limit: int | None = None) -> np.ndarray:
        """:meth:`encode` of ``text`` as int64 ids, the first ``limit`` when given (only the pieces
        needed are tokenised); a text of over :data:`LONG_TEXT` characters in pieces, cut where
        it gives the same ids (module docstring)."""
        if self.kind == "bytes":
            data = text.encode("utf-8")
            return np.frombuffer(data[:limit] if limit is not None else data, np.uint8).astype(np.int64)
        if len(text) <= LONG_TEXT or not self.cuttable:
            return np.asarray(self.encode(text)[:limit], dtype=np.int64)
        parts, count, start = [], 0, 0
        while start < len(text) and (limit is None or count < limit):
            end = self._cut(text, start + PIECE_CHARS)
            ids = np.asarray(self.encode(text[start:end]), dtype=np.int64)
            parts.append(ids)
            count, start = count + len(ids), end
        ids = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        return ids[:limit]

    def _cut(self, text: str, at: int) -> int:
        """The first cut at or after ``at`` that tokenises the same either way; ``len(text)`` (the
        rest in one piece) when under a piece is left, or when :data:`_WINDOWS` pieces' worth of
        text past ``at`` has no such cut (a tokenizer that cannot be cut: not tried further)."""
        for _ in range(_WINDOWS):
            if len(text) - at < PIECE_CHARS:
                break
            for pattern in self.cuts:
                for tries, match in enumerate(pattern.finditer(text, at, at + PIECE_CHARS), 1):
                    if self._same_either_way(text, match.end()):
                        return match.end()
                    if tries == _TRIES:
                        break
            at += PIECE_CHARS
        return len(text)

    def _same_either_way(self, text: str, cut: int) -> bool:
        left, right = text[max(0, cut - CUT_CONTEXT) : cut], text[cut : cut + CUT_CONTEXT]
        return self.encode(left) + self.encode(right) == self.encode(left + right)

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
    """``"bytes"``, a ``tokenizer.json`` path or a SentencePiece ``.model`` path (or a folder
    holding one, as ``save_pretrained`` writes) -> :class:`Tokenizer`."""
    if str(spec) == "bytes":
        return Tokenizer("bytes", "", BYTES_VOCAB, BYTES_EOS)
    path = Path(spec)
    if path.is_dir():  # a save_pretrained folder: its tokenizer.json (or its one SentencePiece model)
        found = [path / "tokenizer.json"] if (path / "tokenizer.json").is_file() else sorted(path.glob("*.model"))
        if len(found) != 1:
            raise TokenizerError(f"{path}: a folder without a tokenizer.json" + (" and with several .model files" if found else " or a SentencePiece .model")
                                 + (": pass one of them" if found else ": pass a tokenizer file"))
        path = found[0]
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
    backend.no_truncation()  # saved settings of a model's inputs: a document is tokenised whole, never cut or padded
    backend.no_padding()
    backend.encode_special_tokens = True  # "<|endoftext|>" written in a document is text, not the EOS id mid-document
    vocab = backend.get_vocab(with_added_tokens=True)
    vocab_size = max(vocab.values(), default=-1) + 1  # ids may have gaps: the largest id bounds the dtype
    try:  # an added token not marked special is matched in text as it is: one taken for the EOS gave its id mid-document
        plain = {token.content for token in backend.get_added_tokens_decoder().values() if not token.special}
    except AttributeError:  # pragma: no cover - tokenizers before 0.14
        plain = set()
    def own(key: str, names: Sequence[str]) -> int | None:  # the model's own choice first, as transformers' AutoTokenizer takes it
        configured = _configured_token(path, key)
        return next((vocab[name] for name in [*([configured] if configured else []), *names] if name in vocab and name not in plain), None)

    tokenizer = Tokenizer("huggingface", str(path), vocab_size, own("eos_token", EOS_NAMES), backend)
    tokenizer.bos_id = own("bos_token", BOS_NAMES)
    tokenizer.plain_eos_names = [name for name in EOS_NAMES if name in plain]
    if type(backend.model).__name__ in CUTTABLE_MODELS:
        tokenizer.cuts = cuts_of(backend.pre_tokenizer)
    return tokenizer


def _configured_token(path: Path, key: str) -> str | None:
    """The ``key`` (``eos_token``, ``bos_token``) of the ``tokenizer_config.json`` beside ``path``
    (as ``save_pretrained`` writes it: a string, or a record with its ``content``), or ``None``."""
    try:
        config = json.loads((path.parent / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    token = config.get(key) if isinstance(config, dict) else None
    token = token.get("content") if isinstance(token, dict) else token
    return token if isinstance(token, str) and token else None


#: What :func:`cuts_of` pre-tokenizes: words, digits and punctuation between spaces, a double
#: space, a tab and newlines; and words in quotes and brackets, across a space and a newline (a
#: Split regex that keeps a quoted span whole, spaces and all, passed a probe without them, and
#: was cut where a quote opened far before the cut: wrong ids, a walkthrough).
_PROBE = ('ab cd\nef  gh\tij. kl,mn 12 34\n\nop-qr "st uv" \'wx yz\' (ab cd) [ef gh] {ij kl} <mn op> «qr st» “uv wx” '
          '‘yz ab’ `cd ef` "gh\nij" (kl\nmn)')


def cuts_of(pre_tokenizer: Any) -> tuple[re.Pattern[str], ...]:
    """The kinds of :data:`CUTS` at which ``pre_tokenizer`` ends its pre-tokens: a newline (or a
    space) is a place to cut when none of the pre-tokens of :data:`_PROBE` holds one after a
    character that is not whitespace (GPT-2's byte-level regex puts a space at the start of the
    next word; Metaspace splits at spaces, not newlines; ``ByteLevel(use_regex=False)``,
    ``Metaspace(split=False)`` and ``Digits`` alone end none there: a merge could cross the cut)."""
    if pre_tokenizer is None:
        return ()
    try:
        pieces = [_PROBE[start:end].lstrip() for _piece, (start, end) in pre_tokenizer.pre_tokenize_str(_PROBE)]
    except Exception:  # noqa: BLE001 - a pre-tokenizer that cannot be probed is not cut
        return ()
    return tuple(pattern for char, pattern in zip("\n ", CUTS) if not any(char in piece for piece in pieces))


def _load_sentencepiece(path: Path) -> Tokenizer:
    try:
        import sentencepiece
    except ImportError:
        raise TokenizerError(
            f"{path}: SentencePiece models need the 'sentencepiece' package: {install_hint('text')}"
        ) from None
    try:
        backend = sentencepiece.SentencePieceProcessor(model_file=str(path))
    except Exception as exc:  # noqa: BLE001
        raise TokenizerError(f"{path}: not a SentencePiece model ({exc})") from None
    eos, bos = backend.eos_id(), backend.bos_id()
    tokenizer = Tokenizer("sentencepiece", str(path), backend.get_piece_size(), eos if eos >= 0 else None, backend)
    tokenizer.bos_id = bos if bos >= 0 else None
    return tokenizer
