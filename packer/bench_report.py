"""What ``packer bench`` measured, as a table and a recommendation: :class:`BenchReport`."""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from readers.schema import Skipped

from .bench_timing import Rate
from .options import ImageOptions
from .writers import SUFFIXES, format_for_path

__all__ = ["BenchReport", "BenchRow", "markdown_table", "cpu_model", "RAW_FOLDER", "SUFFIX"]

#: Destination name per format (webdataset: a folder of shards).
SUFFIX: dict[str, str] = {**{fmt: suffix for suffix, fmt in reversed(SUFFIXES.items())}, "webdataset": ".shards"}  # (a folder)

#: The pipeline name of the unpacked folder, the baseline every packed format is compared with.
RAW_FOLDER = "raw folder"
#: The share of this machine's memory a blob recommended may take (the training process needs the rest).
BLOB_MEMORY_SHARE = 0.5


@dataclass(frozen=True)
class BenchRow:
    """One pipeline read one way: its rate, or why it was not measured."""

    pipeline: str
    reader: str
    rate: Rate | None
    bytes_on_disk: int | None = None
    convert_rate: float | None = None
    note: str = ""


@dataclass
class BenchReport:
    """What :func:`run_bench` measured."""

    src: Path
    images: int
    image: ImageOptions
    cores: int
    batch_size: int
    rows: list[BenchRow] = field(default_factory=list)
    #: Pipeline (``RAW_FOLDER`` or a converted format's row name) -> the sampled inputs it skipped
    #: as undecodable; the raw folder leaves out what the conversions skipped (the same images on both sides).
    skipped: dict[str, list[Skipped]] = field(default_factory=dict)
    #: The timing settings (``--seconds``: the shortest timed pass; ``--repeats``: timed passes per figure).
    seconds: float = 2.0
    repeats: int = 3
    #: Where it was measured: the CPU model (:func:`cpu_model`) and the cores this process may use.
    machine: str = ""
    usable_cores: int = 0
    #: Images in SRC (the sample's share of them gives each format's projected size), and this
    #: machine's memory in bytes (``None``: unknown): a blob is read from RAM, whole.
    folder_images: int = 0
    memory: int | None = None

    def setup(self) -> str:
        """One line: the machine measured on and the settings that shape the figures."""
        workers = " and ".join(map(str, sorted({0, self.cores})))
        return (f"Measured on {self.machine or 'an unknown CPU'}, {self.usable_cores:,} usable cores; {self.images:,} sampled images, "
                f"batch size {self.batch_size}, num_workers {workers}; each figure: {self.repeats} timed pass(es) of at least "
                f"{self.seconds:g} s after a warm-up (--repeats, --seconds)")

    @property
    def measured(self) -> list[BenchRow]:
        return [row for row in self.rows if row.rate is not None]

    def baseline(self) -> BenchRow | None:
        """The raw folder at its best setting."""
        rows = [row for row in self.measured if row.pipeline == RAW_FOLDER]
        return max(rows, key=lambda row: row.rate.median) if rows else None

    def read(self, pipeline: str) -> int:
        """The sampled images ``pipeline`` holds (or reads): the sample less what it skipped."""
        return self.images - len(self.skipped.get(pipeline, ()))

    def skip_note(self) -> str:
        """One line: how many sampled inputs each pipeline skipped as undecodable, and the first
        one with why (``""`` when none was)."""
        if not any(self.skipped.values()):
            return ""
        counts = ", ".join(f"{pipeline} {len(entries):,}" for pipeline, entries in self.skipped.items())
        first = next(entry for entries in self.skipped.values() for entry in entries)
        return (f"Skipped as undecodable, as packer convert skips them (the raw folder too, so both sides read the same images), "
                f"of the {self.images:,} sampled: {counts}; first: {first.path}: {first.reason}")

    def best(self) -> BenchRow | None:
        """The fastest packed format and reader, of those that fit: a blob is read from RAM, so
        one whose projected size (:meth:`projected`) is over :data:`BLOB_MEMORY_SHARE` of this
        machine's memory is not."""
        rows = [row for row in self.measured if row.pipeline != RAW_FOLDER and not self.too_big(row)]
        return max(rows, key=lambda row: row.rate.median) if rows else None

    def projected(self, row: BenchRow) -> float | None:
        """Bytes ``row``'s format would take for the whole of SRC, from the sample's (``None``: unknown)."""
        images = self.read(row.pipeline)
        if not row.bytes_on_disk or not images or self.folder_images <= images:
            return float(row.bytes_on_disk) if row.bytes_on_disk else None
        return row.bytes_on_disk / images * self.folder_images

    def too_big(self, row: BenchRow) -> bool:
        """Whether ``row`` is a blob that would not fit in this machine's memory."""
        size = self.projected(row)
        return row.pipeline.startswith("blob") and size is not None and self.memory is not None and size > BLOB_MEMORY_SHARE * self.memory

    def memory_note(self) -> str:
        """Why the fastest measured row is not recommended (a blob too big for memory), or ``""``."""
        rows = [row for row in self.measured if row.pipeline != RAW_FOLDER]
        fastest = max(rows, key=lambda row: row.rate.median) if rows else None
        if fastest is None or not self.too_big(fastest):
            return ""
        return (f"Not {fastest.pipeline}, though fastest here: read from RAM whole, it would take about {_size(self.projected(fastest))} "
                f"for the folder's {self.folder_images:,} images, over {BLOB_MEMORY_SHARE:.0%} of this machine's "
                f"{_size(self.memory)} of memory (where it fits, convert with -f blob).\n")

    def table(self) -> str:
        """A markdown table: images/s median (min-max), ratio to the raw folder at its best, size, conversion speed;
        under it, :meth:`skip_note` when inputs were skipped."""
        base = self.baseline()
        header = ["pipeline", "reader", "images/s median (min-max)", "vs raw folder", "on disk", "convert img/s"]
        rows = []
        for row in self.rows:
            if row.rate is None:
                rows.append([row.pipeline, row.reader, row.note, "", _size(row.bytes_on_disk), _num(row.convert_rate)])
                continue
            ratio = f"{row.rate.median / base.rate.median:.1f}x" if base else ""
            rows.append([row.pipeline, row.reader, str(row.rate), ratio, _size(row.bytes_on_disk), _num(row.convert_rate)])
        note = self.skip_note()
        return markdown_table(header, rows) + (f"\n\n{note}" if note else "")

    def recommendation(self) -> str:
        """The fastest format and settings here, its size on disk, and the command that makes it."""
        best, base = self.best(), self.baseline()
        if best is None:
            return "No packed format could be measured here (see the notes in the table)."
        fmt = best.pipeline.split(" ", 1)[0]
        options = _cli_options(self.image)
        images = self.read(best.pipeline)
        per_image = f", {best.bytes_on_disk / images / 1e3:,.0f} KB per image" if best.bytes_on_disk and images else ""
        speed = f"{best.rate.median:,.0f} images/s"
        if base is not None:
            speed += f", {best.rate.median / base.rate.median:.1f}x the raw folder at its best ({base.rate.median:,.0f} with {base.reader})"
        size = f"{_size(best.bytes_on_disk)} for {images:,} images{per_image}"
        if self.folder_images > images and best.bytes_on_disk:
            size += f"; about {_size(self.projected(best))} for the folder's {self.folder_images:,}"
        if self.image.output_size is None and best.reader.startswith("DataLoader"):  # (a plain one fails: "stack expects each
            size += ("; its images vary in shape, so the DataLoader needs a collate_fn that keeps them as a list, as here "
                     "(packer.bench_timing.collate), or a fixed --size for readers.Loader")  # tensor to be equal size": a walkthrough)
        return (
            self.memory_note() + f"Recommendation: {best.pipeline} read with {best.reader}: {speed}; {size}.\n"
            f"  packer convert {shlex.quote(str(self.src))} DST{SUFFIX[fmt]}{'' if format_for_path(SUFFIX[fmt]) == fmt else f' --format {fmt}'}{options}"
        )

    def to_dict(self) -> dict[str, Any]:
        """Every figure, JSON-ready."""
        return {
            "src": str(self.src),
            "images": self.images,
            "image": self.image.describe(),
            "cores": self.cores,
            "batch_size": self.batch_size,
            "seconds": self.seconds,
            "repeats": self.repeats,
            "machine": self.machine,
            "usable_cores": self.usable_cores,
            "folder_images": self.folder_images,
            "memory": self.memory,
            "rows": [asdict(row) for row in self.rows],
            "skipped": {pipeline: [entry.to_dict() for entry in entries] for pipeline, entries in self.skipped.items()},
        }


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``'s ``model name``), else what ``platform`` says."""
    import platform

    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                key, sep, value = line.partition(":")
                if sep and key.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or ""


def markdown_table(header: Iterable[str], rows: Iterable[Iterable[object]]) -> str:
    """A GitHub-style markdown table."""
    header = list(header)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _size(n: int | None) -> str:
    if n is None:
        return ""
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return ""  # pragma: no cover


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:,.0f}"


def _cli_options(image: ImageOptions) -> str:
    parts = []
    if image.size is not None:
        h, w = image.size
        parts.append(f" --size {h}" if h == w else f" --size {h}x{w}")
        if image.resize is not None:
            parts.append(f" --resize {image.resize}")
        if image.resize_mode != "center-crop":
            parts.append(f" --resize-mode {image.resize_mode}")
    if image.grayscale:
        parts.append(" --grayscale")
    if image.encoding != "raw":
        parts.append(f" --encoding {image.encoding}")
        if image.encoding == "jpeg" and image.quality != 90:
            parts.append(f" --quality {image.quality}")
    return "".join(parts)
