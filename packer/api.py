"""``packer.convert``: the conversion, as a Python call. The CLI only parses and calls this."""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, NoReturn

from readers.schema import Metadata, Skipped

from ._version import __version__
from .destination import check_apart, check_destination
from .errors import InputError, OptionError
from .options import ON_ERROR, ImageOptions, StorageOptions, TextOptions
from .parallel import DEFAULT_ITEM_TIMEOUT, default_workers, ordered_map
from .preprocess.task import Encoded, Failed, ImageTask
from .progress import progress_bar
from .sources.images import ImageItem, scan_image_folder
from .sources.remote import is_source_url, remote_chunksize
from .writers import format_for_path, get_writer
from .writers.base import Writer
from .writers.blob import BlobSink
from .writers.webdataset import ShardSink

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
    timeout: float = DEFAULT_ITEM_TIMEOUT,
    kind: str | None = None,
    text: TextOptions | None = None,
    resume: bool = False,
    executor: str = "local",
    ray_address: str | None = None,
    sink: ShardSink | BlobSink | None = None,
) -> ConversionReport:
    """Convert the image folder ``src`` into a packed dataset at ``dst``.

    Class sub-folders of ``src`` become labels. Each image is decoded, oriented, resized and
    encoded once, by ``workers`` processes (default: all cores); the output is identical
    whatever the worker count. Undecodable inputs are skipped and recorded in the metadata
    (``on_error="skip"``) or stop the conversion (``"fail"``). ``storage`` holds format-specific
    writer options (HDF5 compression, shard bounds). The output appears at ``dst`` only when
    complete. An input that crashes its worker (a decoder segfault) or takes longer than
    ``timeout`` seconds is skipped like an undecodable one (see docs/RELIABILITY.md).
    ``resume=True`` carries on from the last checkpoint of an interrupted run with the same
    source and options (refused, naming the option, if they differ), with the same result.
    ``executor="ray"`` runs the conversion as Ray tasks on the cluster at ``ray_address``
    (default: a running one, else a local instance; ``workers`` defaults to its CPUs), with the
    same output; SRC and DST must be on storage every node sees at the same path, or URLs (docs/SCALING.md).
    ``sink`` takes WebDataset output file by file instead of the folder ``dst`` (packer/remote.py
    passes its uploader for a URL DST; with Ray, tasks then return shard bytes, not files), or a
    blob as it grows (packer/multipart.py, for an ``s3://`` DST).
    ``src``/``dst`` may be fsspec URLs (``s3://...``; WebDataset and blob DST): packer/remote.py;
    a URL SRC is streamed, each worker reading its inputs (packer/sources/remote.py).
    """
    from .remote import is_dst_url

    if is_dst_url(str(dst)):  # staged locally and uploaded; a URL SRC is streamed either way
        from .remote import convert_remote

        return convert_remote(
            convert, src, dst, format=format, overwrite=overwrite, resume=resume, image=image, storage=storage, workers=workers,
            on_error=on_error, progress=progress, timeout=timeout, kind=kind, text=text, executor=executor, ray_address=ray_address,
        )
    fmt = resolve_format(dst, format)
    from .executors import get_executor

    run_map = get_executor(executor, ray_address=ray_address)
    image = image if image is not None else ImageOptions()
    if on_error not in ON_ERROR:
        raise OptionError(f"--on-error: must be one of {', '.join(ON_ERROR)}, got {on_error!r}")
    workers = default_workers() if workers is None and executor == "local" else workers
    if workers is not None and (not isinstance(workers, int) or workers < 1):
        raise OptionError(f"--workers: must be a positive integer, got {workers!r}")
    if not isinstance(timeout, (int, float)) or not timeout > 0:
        raise OptionError(f"--timeout: must be a positive number of seconds, got {timeout!r}")
    dst = Path(dst) if executor == "local" else Path(dst).resolve()  # tasks elsewhere see absolute paths
    src = src if executor == "local" or is_source_url(str(src)) else Path(src).resolve()
    final = get_writer(fmt).destination(dst)
    if not is_source_url(str(src)):
        check_apart(src, final)
    check_destination(final, overwrite=overwrite)
    if _resolve_kind(src, kind, text) == "text":  # a text corpus: packer/text.py
        from .text import convert_text

        if is_source_url(str(src)):
            raise OptionError(f"{src}: text corpora are read from local folders only so far; copy it locally first")
        if executor != "local":
            raise OptionError(f"--executor {executor}: only image folders convert on {executor} so far; text corpora run locally")

        return convert_text(
            src, dst, format=fmt, text=text or TextOptions(), storage=storage, workers=workers, on_error=on_error, progress=progress,
            sink=sink,
        )
    folder = scan_image_folder(src)
    for name in folder.empty_classes:
        log.warning("class folder %r has no images (its label is kept)", name)
    skipped = list(folder.skipped)
    for entry in skipped:
        log.warning("skipped %s: %s", entry.path, entry.reason)

    started = time.perf_counter()
    with (
        get_writer(fmt)(dst, storage, fingerprint=_fingerprint(fmt, src, dst, folder, image, storage, on_error), resume=resume,
                        **_sink_option(fmt, sink)) as writer,
        _outcomes(writer, image, folder.items[writer.resumed_inputs :], workers, timeout, run_map,
                  in_memory=sink is not None and executor != "local") as results,
        progress_bar(len(folder.items) - writer.resumed_inputs, enabled=progress) as bar,  # after the pool: see packer/parallel.py
    ):
        skipped += writer.resumed_skipped[len(folder.skipped) :]
        for done, (item, result) in enumerate(zip(folder.items[writer.resumed_inputs :], results), writer.resumed_inputs + 1):
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
            writer.progress(done, skipped)  # a resume checkpoint, when one is due
        meta = Metadata(
            format=fmt,
            count=writer.count,
            channels=image.channels,
            shape=writer.shape,
            encoding=image.encoding,
            classes=tuple(folder.classes),
            labeled=folder.labeled,
            preprocessing=image.describe(),
            source=folder.source,
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
        workers=workers if workers is not None else getattr(run_map, "workers", None) or 1,
        shape=writer.shape,
        encoding=image.encoding,
    )


@contextmanager
def _outcomes(
    writer: Writer, image: ImageOptions, items: list[ImageItem], workers: int | None, timeout: float,
    run_map: Any = ordered_map, *, in_memory: bool = False,
) -> Iterator[Iterator[Encoded | Failed | None]]:
    """Each input's outcome, in input order, computed by ``workers`` processes.

    Most writers get an :class:`Encoded` sample per input to :meth:`~Writer.add` here. A writer
    that ``writes_pieces`` has its workers convert and write whole pieces (shards; with few
    pieces, fragments of them, given ``workers``); it is handed each finished piece in order,
    and its inputs come back as ``None`` (written) or :class:`Failed`. ``run_map`` is the
    executor (``ordered_map``'s contract, packer/executors).

    An input that kills or hangs its worker is a :class:`Failed` ("crashed the decoder
    (SIGSEGV)", "timed out after 120 s"). A piece is converted whole, so a piece that does
    (its inputs retried one by one would need the writer in this process) stops the
    conversion with an error naming the piece's first input. ``in_memory``: the pieces' tasks
    return shard bytes instead of writing into the writer's folder (which they may not see).
    """
    if not writer.writes_pieces:
        chunksize = remote_chunksize(len(items), workers) if items and is_source_url(items[0].path) else None
        with run_map(ImageTask(image), items, workers=workers, chunksize=chunksize, on_crash=_crash_failure, item_timeout=timeout) as results:
            yield results
        return
    planned = workers if workers is not None or not hasattr(run_map, "planned_workers") else run_map.planned_workers()
    try:  # Ray joined by planned_workers() is left by the map, or here if there is none
        pieces = writer.pieces(items, image, workers=planned)  # type: ignore[attr-defined]  # few pieces: fragments
        per_piece = timeout * max((len(piece.items) for piece in pieces), default=1)
        task = writer.piece_task(image, in_memory=in_memory)  # type: ignore[attr-defined]
    except BaseException:
        getattr(run_map, "release", lambda: None)()
        raise
    with run_map(task, pieces, workers=workers, chunksize=1, on_crash=_piece_crash, item_timeout=per_piece) as results:
        yield (outcome for piece in results for outcome in writer.add_piece(piece))  # type: ignore[attr-defined]


def _sink_option(fmt: str, sink: ShardSink | BlobSink | None) -> dict[str, Any]:
    """The writer's ``sink`` keyword, when there is one (WebDataset and blob output take one)."""
    if sink is None:
        return {}
    if not get_writer(fmt).takes_sink:
        raise OptionError(f"sink: only WebDataset and blob output are written through a sink, not {fmt}")
    return {"sink": sink}


def _crash_failure(item: ImageItem, reason: str) -> Failed:
    """The outcome of an input that killed or hung its worker: skipped, with the reason."""
    return Failed(item.path, reason)


def _piece_crash(piece: Any, reason: str) -> NoReturn:
    """A whole piece killed or hung its worker: stop, naming where to look."""
    raise InputError(
        f"{piece.items[0].path}: the worker converting the WebDataset piece of {len(piece.items):,} inputs that starts "
        f"with this file {reason} (a piece is converted whole: convert the folder to .lmdb to find and skip the "
        "input that does it, or raise --timeout)"
    )


def _resolve_kind(src: str | Path, kind: str | None, text: TextOptions | None) -> str:
    """``kind`` if given, else ``"text"`` for a corpus (text files, no images) or when ``text`` options are given."""
    from readers.schema import KINDS

    from .sources.text import is_text_corpus

    if kind is not None:
        if kind not in KINDS:
            raise OptionError(f"--kind: must be one of {', '.join(KINDS)}, got {kind!r}")
        return kind
    if text is not None:
        return "text"
    return "text" if not is_source_url(str(src)) and Path(src).exists() and is_text_corpus(src) else "image"


def _fingerprint(fmt: str, src: str | Path, dst: Path, folder: Any, image: ImageOptions, storage: StorageOptions | None, on_error: str) -> dict[str, Any]:
    """What ``--resume`` must find unchanged: source listing, format and every output-deciding option."""
    import dataclasses

    from .writers.journal import conversion_fingerprint

    items = ((item.path, item.label) for item in folder.items)
    return conversion_fingerprint(fmt, folder.source, items, image.describe(), dataclasses.asdict(storage or StorageOptions()), on_error, dst,
                                  folder.stamps)


def _human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"  # pragma: no cover
