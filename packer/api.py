"""``packer.convert``: the conversion, as a Python call. The CLI only parses and calls this."""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

from readers.schema import Metadata, Skipped

from ._version import __version__
from .errors import InputError, OptionError
from .options import ON_ERROR, ImageOptions, StorageOptions
from .parallel import default_workers, ordered_map
from .preprocess.task import Encoded, Failed, ImageTask
from .progress import progress_bar
from .sources.images import ImageItem, scan_image_folder
from .writers import format_for_path, get_writer
from .writers.base import Writer, check_destination

__all__ = ["convert", "ConversionReport", "resolve_format"]

log = logging.getLogger("packer")


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

    @property
    def images_per_second(self) -> float:
        return self.written / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        """One line for a person."""
        shape = "x".join(map(str, self.shape)) if self.shape else "variable shapes"
        text = (
            f"wrote {self.written:,} images ({shape}, {self.encoding}) to {self.dst}: "
            f"{_human_bytes(self.payload_bytes)} in {self.seconds:.1f} s, {self.images_per_second:,.0f} img/s "
            f"with {self.workers} worker{'s' if self.workers != 1 else ''}"
        )
        if self.skipped:
            text += f"; skipped {len(self.skipped):,} (listed by: packer info {self.dst})"
        return text


def resolve_format(dst: str | Path, format: str | None) -> str:
    """The output format: explicit ``format``, else from DST's suffix."""
    if format is not None:
        get_writer(format)
        return format
    guessed = format_for_path(str(dst))
    if guessed is None:
        raise OptionError(f"{dst}: cannot tell the format from the name; pass --format (for example --format lmdb)")
    return guessed


def convert(
    src: str | Path,
    dst: str | Path,
    *,
    format: str | None = None,
    image: ImageOptions | None = None,
    storage: StorageOptions | None = None,
    workers: int | None = None,
    overwrite: bool = False,
    on_error: str = "skip",
    progress: bool = False,
) -> ConversionReport:
    """Convert the image folder ``src`` into a packed dataset at ``dst``.

    Class sub-folders of ``src`` become labels. Each image is decoded, oriented, resized and
    encoded once, by ``workers`` processes (default: all cores); the output is identical
    whatever the worker count. Undecodable inputs are skipped and recorded in the metadata
    (``on_error="skip"``) or stop the conversion (``"fail"``). ``storage`` holds format-specific
    writer options (HDF5 compression, shard bounds). The output appears at ``dst`` only when
    complete.
    """
    fmt = resolve_format(dst, format)
    image = image if image is not None else ImageOptions()
    if on_error not in ON_ERROR:
        raise OptionError(f"--on-error: must be one of {', '.join(ON_ERROR)}, got {on_error!r}")
    workers = default_workers() if workers is None else workers
    if not isinstance(workers, int) or workers < 1:
        raise OptionError(f"--workers: must be a positive integer, got {workers!r}")
    dst = Path(dst)
    check_destination(get_writer(fmt).destination(dst), overwrite=overwrite)
    folder = scan_image_folder(src)
    for name in folder.empty_classes:
        log.warning("class folder %r has no images (its label is kept)", name)
    skipped = list(folder.skipped)
    for entry in skipped:
        log.warning("skipped %s: %s", entry.path, entry.reason)

    started = time.perf_counter()
    with (
        get_writer(fmt)(dst, storage) as writer,
        _outcomes(writer, image, folder.items, workers) as results,
        progress_bar(len(folder.items), enabled=progress) as bar,  # after the pool: see packer/parallel.py
    ):
        for item, result in zip(folder.items, results):
            if isinstance(result, Encoded):
                writer.add(result)
            elif isinstance(result, Failed):
                reason = result.reason
                relative = folder.relative(item.path)
                if on_error == "fail":
                    raise InputError(f"{item.path}: {reason} (pass --on-error skip to skip such files)")
                skipped.append(Skipped(relative, reason))
                log.warning("skipped %s: %s", relative, reason)
            bar.update(1)
        meta = Metadata(
            format=fmt,
            count=writer.count,
            channels=image.channels,
            shape=writer.shape,
            encoding=image.encoding,
            classes=tuple(folder.classes),
            labeled=folder.labeled,
            preprocessing=image.describe(),
            source=str(Path(src).resolve()),
            skipped=tuple(skipped),
            tool_version=__version__,
            created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            extra=writer.extra(),
        )
        if writer.count == 0:
            first = skipped[len(folder.skipped)]
            raise InputError(
                f"{src}: none of the {len(folder.items):,} images could be converted "
                f"(first: {first.path}: {first.reason})"
            )
        writer.finish(meta)
    return ConversionReport(
        dst=writer.dst,
        format=fmt,
        inputs=len(folder.items) + len(folder.skipped),
        written=writer.count,
        skipped=skipped,
        payload_bytes=writer.payload_bytes,
        seconds=time.perf_counter() - started,
        workers=workers,
        shape=writer.shape,
        encoding=image.encoding,
    )


@contextmanager
def _outcomes(writer: Writer, image: ImageOptions, items: list[ImageItem], workers: int) -> Iterator[Iterator[Encoded | Failed | None]]:
    """Each input's outcome, in input order, computed by ``workers`` processes.

    Most writers get an :class:`Encoded` sample per input to :meth:`~Writer.add` here. A writer
    that ``writes_pieces`` has its workers convert and write whole pieces (shards); it is
    handed each finished piece in order, and its inputs come back as ``None`` (written) or
    :class:`Failed`.
    """
    if not writer.writes_pieces:
        with ordered_map(ImageTask(image), items, workers=workers) as results:
            yield results
        return
    pieces = writer.pieces(items, image)  # type: ignore[attr-defined]
    with ordered_map(writer.piece_task(image), pieces, workers=workers, chunksize=1) as results:  # type: ignore[attr-defined]
        yield (outcome for piece in results for outcome in writer.add_piece(piece))  # type: ignore[attr-defined]


def _human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"  # pragma: no cover
