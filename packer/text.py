"""A text corpus as a conversion job: documents in, token ids out, in any of the four formats.

Documents are found in this process (:func:`packer.sources.text.scan_text`: where each one is,
never its text), then read, checked and tokenised by the driver's workers (:mod:`packer.engine`,
the same driver as images: resume, timeouts, crash isolation, ``--on-error``, Ray). Work units
carry the documents' places and the tokenizer's file path; each worker loads the tokenizer once,
reads its chunk of documents (consecutive lines of a file in one read) and encodes them in one
batch. Every document
becomes one sample of ``n`` token ids (then the EOS id), stored as uint16 when the vocabulary
fits, else uint32 (docs/FORMATS.md, "Text").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Iterable, Mapping

import numpy as np

from readers.schema import TOKEN_LAYOUT, Skipped
from readers.tokenizer import Tokenizer, TokenizerError, load_tokenizer, token_dtype

from .errors import OptionError
from .jobs import Job
from .options import AUTO_BOS, NO_EOS, TextOptions
from .preprocess.tokenize import TokenizeTask
from .report import ConversionReport, TextConversionReport
from .sources.text import scan_text
from .sources.text_docs import DocSpan, ParquetRow, StreamRow, TextDoc, document_texts
from .writers.base import Writer

log = logging.getLogger("packer")

__all__ = ["TextJob", "text_job", "resolve_eos", "BATCH_DOCS"]

#: Documents per work unit (the Hugging Face tokenizer encodes a batch at once).
BATCH_DOCS = 64

#: What a text conversion's inputs are, as its resume fingerprint records it.
TEXT_INPUTS = "every non-blank line (or file, or Parquet row), those the workers skip included"


def resolve_eos(tokenizer: Tokenizer, eos: int | str | None) -> int | None:
    """The separator id: explicit, the tokenizer's own, or none (``"none"``); checked against the vocabulary."""
    if eos == NO_EOS:
        return None
    if eos is None:
        if tokenizer.eos_id is None:
            plain = (f" ({', '.join(map(repr, tokenizer.plain_eos_names))} is an added token not marked special, so a "
                     "document holding that text would give its id mid-document)") if tokenizer.plain_eos_names else ""
            raise OptionError(
                f"--eos: the tokenizer {tokenizer.path or tokenizer.kind} has no end-of-document token{plain}: "
                "pass --eos ID, or --eos none for no separator"
            )
        return tokenizer.eos_id
    assert isinstance(eos, int)
    return _checked_id(tokenizer, "--eos", eos, "end", "--eos none for no separator", tokenizer.eos_id)


def resolve_bos(tokenizer: Tokenizer, bos: int | str | None) -> int | None:
    """The id put before every document: none, the tokenizer's own (``"auto"``), or explicit; checked."""
    if bos is None:
        return None
    if bos == AUTO_BOS:
        if tokenizer.bos_id is None:
            raise OptionError(f"--bos auto: the tokenizer {tokenizer.path or tokenizer.kind} has no beginning-of-document token "
                              "(a special token such as <s>): pass --bos ID, or leave --bos out")
        return tokenizer.bos_id
    assert isinstance(bos, int)
    return _checked_id(tokenizer, "--bos", bos, "beginning", "leave --bos out for none", tokenizer.bos_id)


def _checked_id(tokenizer: Tokenizer, option: str, token: int, where: str, none: str, own: int | None) -> int:
    """``token``, refused outside the vocabulary, and said when it is an ordinary token (a
    document holding its text could not be told from its ``where``: Megatron's --append-eod
    takes the tokenizer's own)."""
    if token >= tokenizer.vocab_size:
        raise OptionError(f"{option}: id {token} is outside the tokenizer's vocabulary of {tokenizer.vocab_size}")
    text = tokenizer.text_token(token)
    if text is not None:
        log.warning("%s %d is an ordinary token of the tokenizer (the text %r): a document holding that text cannot be told "
                    "from its %s; pass a special token (%s)", option, token, text, where,
                    f"its own is {own}" if own is not None else f"it has none: {none}")
    return token


@dataclass
class TextJob(Job):
    """A tokenised text corpus: one sample of token ids per document, unlabeled."""

    kind: ClassVar[str] = "text"
    noun: ClassVar[str] = "document"
    unit: ClassVar[str] = "doc"

    text: TextOptions = field(default_factory=TextOptions)
    tokenizer: Tokenizer | None = None
    eos: int | None = None
    bos: int | None = None
    dtype: str = "uint16"
    spec: str = "bytes"
    paths: list[str] = field(default_factory=list)
    split: str | None = None

    @property
    def scan_skips_fail(self) -> bool:
        """Any: a file scanning skipped (undecodable, binary, unreadable) is an input error."""
        return True

    def name(self, item: Any) -> str:
        assert isinstance(item, (DocSpan, ParquetRow, StreamRow, TextDoc))
        return item.source

    def chunksize(self, workers: int | None) -> int | None:
        return max(1, min(BATCH_DOCS, len(self.items) // max(1, (workers or 1) * 4)))

    def expected_sample_bytes(self) -> int | None:
        """About a stored document's bytes: the mean of up to :data:`SIZE_PROBE` documents spread
        over the corpus (those in uncompressed text files), tokenised here as the workers would.
        Else the corpus's bytes per document (its files' sizes: a compressed one's, so less) as
        token ids, one a byte with ``bytes``, one per 4 bytes with a trained tokenizer. An
        estimate: an output cut by bytes stays within them (the file sizes put a JSON record's
        keys in every document: shards of --shard-bytes came out a third full, a walkthrough)."""
        itemsize = np.dtype(self.dtype).itemsize
        probed = self._probed_tokens()
        if probed is not None:
            return max(1, round(probed)) * itemsize
        files = getattr(self.items, "files", None)  # (the corpus's files: not each document made, for millions)
        sizes = {file.path: file.size for file in files} if files is not None else {}
        if not self.items or not sizes:
            return None
        per_byte = 1.0 if self.spec == "bytes" else 0.25
        return max(1, int(sum(sizes.values()) / len(self.items) * per_byte)) * itemsize

    def _probed_tokens(self) -> float | None:
        """The mean stored ids of the documents probed (EOS included): their mean size in their
        files times the ids per byte of those read (at most :data:`SIZE_PROBE_BYTES` of them, a
        huge one only counted), or ``None`` if none could be read."""
        if not self.items or self.tokenizer is None:
            return None
        spread = np.unique(np.linspace(0, len(self.items) - 1, min(len(self.items), SIZE_PROBE)).astype(np.int64))
        picked = [doc for doc in (self.items[int(i)] for i in spread)
                  if isinstance(doc, DocSpan) and doc.data is None and doc.file.codec is None and doc.length > 0]
        read: list[DocSpan] = []
        total = 0
        for doc in sorted(picked, key=lambda d: d.length):  # the smallest first: a huge one is only counted
            total += doc.length
            if total > SIZE_PROBE_BYTES:
                break
            read.append(doc)
        pairs = [(doc, text) for doc, text in zip(read, document_texts(read) if read else []) if isinstance(text, str)]
        if not pairs:
            return None
        per_byte = sum(len(self.tokenizer.encode(text)) for _, text in pairs) / sum(doc.length for doc, _ in pairs)
        cap = self.text.max_tokens or float("inf")
        return sum(min(doc.length * per_byte, cap) for doc in picked) / len(picked) + (self.eos is not None) + (self.bos is not None)

    def fingerprint_parts(self) -> tuple[Iterable[tuple[str, int]], Mapping[str, Any], Mapping[str, str] | None]:
        assert self.tokenizer is not None
        options = {**self.text.describe(), "tokenizer": self.tokenizer.identity(), "eos": self.eos, "dtype": self.dtype,
                   **({"bos id": self.bos} if self.bos is not None else {})}
        return ((path, -1) for path in self.paths), options, None

    def fingerprint(self, fmt: str, dst: Path, storage: Mapping[str, Any], on_error: str) -> dict[str, Any]:
        """The resume fingerprint, with what the inputs are: since the workers read the documents
        (packer/sources/text_docs.py), a bad line is an input too, so a journal of an earlier
        packer (which counted good documents only) is refused, not resumed at the wrong input."""
        return {**super().fingerprint(fmt, dst, storage, on_error), "inputs": TEXT_INPUTS}

    def metadata_fields(self, writer: Writer) -> dict[str, Any]:
        assert self.tokenizer is not None
        return {
            "channels": 1,
            "shape": None,
            "kind": "text",
            "dtype": self.dtype,
            "layout": TOKEN_LAYOUT,
            "labeled": False,
            "tokenizer": {**self.tokenizer.identity(), "eos_id": self.eos, "path": "" if self.spec == "bytes" else self.spec,
                          **({"bos_id": self.bos} if self.bos is not None else {})},
            "tokens": self.tokens(writer.payload_bytes),
            "preprocessing": {**self.text.describe(), **({"split": self.split} if self.split else {})},  # (the split: when given)
        }

    def tokens(self, payload_bytes: int) -> int:
        """Token ids in ``payload_bytes`` of stored documents."""
        return payload_bytes // (2 if self.dtype == "uint16" else 4)

    def report(self, **counts: Any) -> ConversionReport:
        assert self.tokenizer is not None
        return TextConversionReport(
            encoding="raw", tokens=self.tokens(counts["payload_bytes"]), resumed_tokens=self.tokens(counts.get("resumed_bytes", 0)),
            tokenizer=f"{self.tokenizer.kind}, vocab {self.tokenizer.vocab_size:,}, {self.dtype}", **counts,
        )


#: Before the conversion starts, the first records of this many files, this many of each, are
#: read to see that ``--text-field`` names a field the corpus has.
#: Documents read and tokenised to estimate a stored document's size (``--shard-bytes``).
SIZE_PROBE = 64
SIZE_PROBE_BYTES = 1 << 20
FIELD_PROBE_FILES, FIELD_PROBE_RECORDS = 20, 5
#: Records read spread over the corpus, when none of the first ones has the field, before it is refused.
FIELD_PROBE_SPREAD = 200


def _check_text_field(docs: Any, field: str) -> None:
    """Refuse ``--text-field`` in one line when none of the records probed (the first of each
    of the corpus's first files) has it as a string: a typo was one skipped document and one
    warning per record, then 'none of the documents could be converted'. A file whose records
    lack it beside one whose records have it converts as before; corpora without records pass."""
    rows = getattr(docs, "rows", None)
    starts = np.flatnonzero(np.diff(rows["file"], prepend=-1))[:FIELD_PROBE_FILES] if rows is not None else [0]
    indices = sorted({i for start in starts for i in range(start, min(start + FIELD_PROBE_RECORDS, len(docs)))})  # (windows overlap
    probe = [docs[int(i)] for i in indices]  # into the next files where files are short: each record once, or it counted them twice)
    probe = [doc for doc in probe if getattr(getattr(doc, "file", None), "kind", None) == "json"]  # (Parquet: checked at the scan)
    if not probe:
        return
    texts = document_texts(probe)
    if all(_lacks(text) for text in texts):  # records of another kind first (a header): look further before refusing
        spread = sorted({int(i) for i in np.linspace(0, len(docs) - 1, FIELD_PROBE_SPREAD)} - set(indices))
        more = [doc for doc in (docs[i] for i in spread) if getattr(getattr(doc, "file", None), "kind", None) == "json"]
        texts += document_texts(more) if more else []
    if all(_lacks(text) for text in texts):
        first = texts[0]
        raise OptionError(f"--text-field {field!r}: none of the {len(texts)} records read (the first of each file, then "
                          f"some spread over the corpus) has it as a string ({first.path}: {first.reason})")


def _lacks(text: Any) -> bool:
    """Whether a probed record lacks the text field (5 header records refused a corpus of 1,000
    documents after them, a walkthrough: the spread probe)."""
    return isinstance(text, Skipped) and "string field" in text.reason


def text_job(src: str | Path, text: TextOptions, split: str | None = None) -> TextJob:
    """The job of tokenising the corpus ``src`` (a local file or folder) with ``text`` options;
    ``split``: only the files of that split (``--split``; recorded in the metadata's preprocessing)."""
    try:
        tokenizer = load_tokenizer(text.tokenizer)
    except TokenizerError as exc:
        raise OptionError(f"--tokenizer: {exc}") from None
    eos, bos = resolve_eos(tokenizer, text.eos), resolve_bos(tokenizer, text.bos)
    dtype = token_dtype(tokenizer.vocab_size)
    spec = "bytes" if tokenizer.kind == "bytes" else str(Path(tokenizer.path).resolve())
    corpus = scan_text(src, lines=text.lines, text_field=text.text_field, split=split)
    _check_text_field(corpus.docs, text.text_field)
    if corpus.images:
        log.warning("%s: %s left out: a text corpus converts its .txt, .jsonl, .ndjson and .parquet files only", src,
                    f"{corpus.images:,} images are" if corpus.images != 1 else "1 image is")
    return TextJob(
        str(Path(src).resolve()), corpus.docs, TokenizeTask(spec, dtype, eos, text.max_tokens, bos), list(corpus.skipped),
        text=text, tokenizer=tokenizer, eos=eos, bos=bos, dtype=dtype, spec=spec, paths=corpus.paths, split=split,
    )
