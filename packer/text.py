"""``packer.convert`` for text: a corpus in, token ids out, in any of the four formats.

Documents are read and checked in this process (:func:`packer.sources.text.scan_text`), then
tokenised by ``workers`` processes through :func:`packer.parallel.ordered_map` (work units carry
the tokenizer's file path; each worker loads it once), in input order, so the output is the
same whatever the worker count. Every document becomes one sample of ``n`` token ids (then the
EOS id), stored as uint16 when the vocabulary fits, else uint32 (docs/FORMATS.md, "Text").
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

from readers.schema import TOKEN_LAYOUT, Metadata, Skipped
from readers.tokenizer import Tokenizer, TokenizerError, load_tokenizer, token_dtype

from ._version import __version__
from .api import ConversionReport, _human_bytes, _sink_option
from .errors import InputError, OptionError
from .options import NO_EOS, ImageOptions, StorageOptions, TextOptions
from .parallel import ordered_map
from .preprocess.task import Encoded, Failed
from .preprocess.tokenize import TokenizeBatch, TokenizeTask
from .progress import progress_bar
from .sources.text import TextDoc, scan_text
from .writers import get_writer
from .writers.base import Writer
from .writers.blob import BlobSink
from .writers.webdataset import ShardSink

__all__ = ["convert_text", "TextConversionReport", "resolve_eos"]

log = logging.getLogger("packer")

#: Documents per work unit on the batched path (the Hugging Face tokenizer encodes a batch at once).
BATCH_DOCS = 64


@dataclass
class TextConversionReport(ConversionReport):
    """A text conversion's report: documents written, and tokens."""

    tokens: int = 0
    tokenizer: str = ""

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        text = (
            f"wrote {self.written:,} documents, {self.tokens:,} tokens ({self.tokenizer}) to {self.dst}: "
            f"{_human_bytes(self.payload_bytes)} in {self.seconds:.1f} s, {self.tokens_per_second:,.0f} tokens/s "
            f"with {self.workers} worker{'s' if self.workers != 1 else ''}"
        )
        if self.skipped:
            text += f"; skipped {len(self.skipped):,} (listed by: packer info {self.dst})"
        return text


def resolve_eos(tokenizer: Tokenizer, eos: int | str | None) -> int | None:
    """The separator id: explicit, the tokenizer's own, or none (``"none"``); checked against the vocabulary."""
    if eos == NO_EOS:
        return None
    if eos is None:
        if tokenizer.eos_id is None:
            raise OptionError(
                f"--eos: the tokenizer {tokenizer.path or tokenizer.kind} has no end-of-document token: "
                "pass --eos ID, or --eos none for no separator"
            )
        return tokenizer.eos_id
    assert isinstance(eos, int)
    if eos >= tokenizer.vocab_size:
        raise OptionError(f"--eos: id {eos} is outside the tokenizer's vocabulary of {tokenizer.vocab_size}")
    return eos


def convert_text(
    src: str | Path,
    dst: str | Path,
    *,
    format: str,
    text: TextOptions,
    storage: StorageOptions | None,
    workers: int,
    on_error: str,
    progress: bool,
    sink: ShardSink | BlobSink | None = None,
) -> TextConversionReport:
    """Tokenise the corpus ``src`` into ``dst`` (called by :func:`packer.convert` with checked options;
    ``sink``: the WebDataset writer's, for a URL DST)."""
    try:
        tokenizer = load_tokenizer(text.tokenizer)
    except TokenizerError as exc:
        raise OptionError(f"--tokenizer: {exc}") from None
    eos = resolve_eos(tokenizer, text.eos)
    dtype = token_dtype(tokenizer.vocab_size)
    spec = "bytes" if tokenizer.kind == "bytes" else str(Path(tokenizer.path).resolve())
    task = TokenizeTask(spec, dtype, eos, text.max_tokens)

    corpus = scan_text(src, lines=text.lines, text_field=text.text_field)
    skipped = list(corpus.skipped)
    if on_error == "fail" and skipped:
        first = skipped[0]
        raise InputError(f"{first.path}: {first.reason} (pass --on-error skip to skip such inputs)")
    for entry in skipped:
        log.warning("skipped %s: %s", entry.path, entry.reason)

    started = time.perf_counter()
    tokens = 0
    docs = corpus.docs
    with (
        get_writer(format)(Path(dst), storage, **_sink_option(format, sink)) as writer,
        _outcomes(writer, task, docs, workers) as results,
        progress_bar(len(docs), enabled=progress, unit="doc") as bar,
    ):
        for doc, result in zip(docs, results):
            if isinstance(result, Encoded):
                writer.add(result)
                tokens += result.shape[-1]
            elif isinstance(result, Failed):
                if on_error == "fail":
                    raise InputError(f"{doc.source}: {result.reason} (pass --on-error skip to skip such inputs)")
                skipped.append(Skipped(doc.source, result.reason))
                log.warning("skipped %s: %s", doc.source, result.reason)
            bar.update(1)
        if writer.writes_pieces:
            tokens = writer.payload_bytes // _itemsize(dtype)
        if writer.count == 0:
            first = skipped[0] if skipped else Skipped(str(src), "no documents")
            raise InputError(f"{src}: no document could be converted (first: {first.path}: {first.reason})")
        meta = Metadata(
            format=format,
            count=writer.count,
            channels=1,
            shape=None,
            kind="text",
            dtype=dtype,
            layout=TOKEN_LAYOUT,
            labeled=False,
            tokenizer={**tokenizer.identity(), "eos_id": eos, "path": "" if spec == "bytes" else spec},
            tokens=tokens,
            preprocessing=text.describe(),
            source=str(Path(src).resolve()),
            skipped=tuple(skipped),
            tool_version=__version__,
            created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            extra=writer.extra(),
        )
        writer.finish(meta)
    return TextConversionReport(
        dst=writer.dst,
        format=format,
        inputs=len(docs) + len(corpus.skipped),
        written=writer.count,
        skipped=skipped,
        payload_bytes=writer.payload_bytes,
        seconds=time.perf_counter() - started,
        workers=workers,
        encoding="raw",
        tokens=tokens,
        tokenizer=f"{tokenizer.kind}, vocab {tokenizer.vocab_size:,}, {dtype}",
    )


def _itemsize(dtype: str) -> int:
    return 2 if dtype == "uint16" else 4


@contextmanager
def _outcomes(writer: Writer, task: TokenizeTask, docs: list[TextDoc], workers: int) -> Iterator[Iterator[Encoded | Failed | None]]:
    """Each document's outcome in order: :class:`Encoded`/:class:`Failed`, or ``None`` when a worker wrote it."""
    if writer.writes_pieces:
        image = ImageOptions()
        pieces = writer.pieces(docs, image, workers=workers)  # type: ignore[attr-defined]
        with ordered_map(writer.piece_task(image, task), pieces, workers=workers, chunksize=1) as results:  # type: ignore[attr-defined]
            yield (outcome for piece in results for outcome in writer.add_piece(piece))  # type: ignore[attr-defined]
        return
    batches = [tuple(docs[i : i + BATCH_DOCS]) for i in range(0, len(docs), BATCH_DOCS)]
    with ordered_map(TokenizeBatch(task), batches, workers=workers, chunksize=1) as results:
        yield (outcome for batch in results for outcome in batch)
