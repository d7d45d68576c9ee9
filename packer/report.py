"""What a conversion did, for a person and for code: :class:`ConversionReport` and its text variant."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

from readers.formats import DATASETS
from readers.schema import Skipped

__all__ = ["ConversionReport", "TextConversionReport", "human_bytes", "one_line"]

#: Control characters as a printed line shows them: a file name holding a newline printed raw split
#: its warning in two, the second line looking like a warning of its own (a walkthrough).
_ESCAPES = {**{code: f"\\x{code:02x}" for code in (*range(0x20), 0x7F)}, 0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t"}

#: Skipped inputs (and classes) ``packer info`` lists before "... N more (see --json)".
MAX_LISTED = 20


def one_line(text: str) -> str:
    """``text`` with its control characters escaped (``\\n``, ``\\x1b``...), so it prints as one line."""
    return text.translate(_ESCAPES)


def human_bytes(n: float) -> str:
    """``1234567`` -> ``"1.2 MB"`` (decimal units)."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"  # pragma: no cover


@dataclass
class ConversionReport:
    """What a conversion did: counts, bytes and time."""

    dst: Path
    format: str
    inputs: int
    written: int
    skipped: list[Skipped] = field(default_factory=list)
    payload_bytes: int = 0
    seconds: float = 0.0
    workers: int = 1
    shape: tuple[int, int, int] | None = None
    encoding: str = "raw"
    #: Inputs an interrupted run had converted before this one resumed it.
    resumed: int = 0
    #: Samples, and their payload bytes, that interrupted run had written (counted in
    #: ``written`` and ``payload_bytes``, not in this run's rates).
    resumed_written: int = 0
    resumed_bytes: int = 0
    #: The dataset's class names and whether it is labeled (``None``: not known to this report,
    #: which then says nothing of labels).
    classes: tuple[str, ...] | None = None
    labeled: bool = True

    @property
    def images_per_second(self) -> float:
        """Samples this run wrote per second (a resumed run's earlier samples left out)."""
        return self._rate(self.written - self.resumed_written)

    def _rate(self, amount: float) -> float:
        return amount / self.seconds if self.seconds > 0 else 0.0

    def _tail(self) -> str:
        workers = f"with {self.workers} worker{'s' if self.workers != 1 else ''}"
        resumed = f" (resumed after {self.resumed:,} inputs)" if self.resumed else ""
        every = " --json" if len(self.skipped) > MAX_LISTED else ""  # (info lists MAX_LISTED, then "... N more (see --json)")
        listed = "listed in its metadata" if _is_url(self.dst) else f"listed by: packer info{every} {shlex.quote(str(self.dst))}"  # (info reads local paths)
        skipped = f"; skipped {len(self.skipped):,} ({listed})" if self.skipped else ""
        return f"{workers}{resumed}{skipped}"

    def summary(self) -> str:
        """One line for a person."""
        shape = "x".join(map(str, self.shape)) if self.shape else "variable shapes"
        return (
            f"wrote {_count(self.written, 'image')}{self._labels()} ({shape}, {self.encoding}) to {self.dst}: "
            f"{human_bytes(self.payload_bytes)} of samples in {self.seconds:.1f} s, {self.images_per_second:,.0f} img/s {self._tail()}"
        )

    def _labels(self) -> str:
        """" in 5 classes", " in 1 class" (every image in one: said even with --quiet, which hides the
        warning), " with integer labels" (labels without names), ", unlabeled", or nothing when not known."""
        if self.classes is None:
            return ""
        if self.classes:
            return f" in {len(self.classes):,} class{'es' if len(self.classes) != 1 else ''}"
        return " with integer labels" if self.labeled else ", unlabeled"

    #: The class of ``readers`` that reads the output, and the command that shows its samples.
    reader_class = ""
    look_command = "preview"

    def next_steps(self, streamed: str | None = None) -> str:
        """One line for a person who has just converted: the Python that reads the output, and
        the command that shows some of it (the path as given, so the line can be pasted);
        ``streamed``: a local WebDataset's brace pattern, as webdataset reads it (packer/info.py)."""
        reader = self.reader_class or DATASETS[self.format][1]
        if _is_url(self.dst):  # packer's commands and the map-style readers open local paths
            folder = str(self.dst).rstrip("/")
            if self.format == "webdataset":  # (streamed from its folder's URL: the shard pattern is not a URL it takes)
                return f"read it: readers.StreamingShards({(folder.rsplit('/', 1)[0] if '%' in folder.rsplit('/', 1)[-1] else folder)!r})"
            return f"read it: copy it to a local disk, then readers.{reader}(its local path)"
        stream = f"; stream it: readers.StreamingShards({str(self.dst)!r}), or webdataset's {streamed}" if streamed else ""
        return f"read it: readers.{reader}({str(self.dst)!r}){stream}; see it: packer {self.look_command} {shlex.quote(str(self.dst))}"


@dataclass
class TextConversionReport(ConversionReport):
    """A text conversion's report: documents written, and tokens."""

    reader_class = "TokenDataset"
    look_command = "head"

    tokens: int = 0
    tokenizer: str = ""
    #: Tokens of the documents an interrupted run had written (not in this run's rate).
    resumed_tokens: int = 0

    @property
    def tokens_per_second(self) -> float:
        """Tokens this run wrote per second."""
        return self._rate(self.tokens - self.resumed_tokens)

    def summary(self) -> str:
        return (
            f"wrote {_count(self.written, 'document')}, {_count(self.tokens, 'token')} ({self.tokenizer}) to {self.dst}: "
            f"{human_bytes(self.payload_bytes)} of samples in {self.seconds:.1f} s, {self.tokens_per_second:,.0f} tokens/s {self._tail()}"
        )


def _is_url(dst: object) -> bool:
    return isinstance(dst, str) and "://" in dst and not dst.lower().startswith("file://")


def _count(n: int, noun: str) -> str:
    """``n`` with ``noun`` in the singular or plural: "1 image", "1,000 images"."""
    return f"{n:,} {noun}{'s' if n != 1 else ''}"
