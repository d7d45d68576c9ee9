"""``packer bench``: how much faster would *your* folder read, packed, on *this* machine?

:func:`run_bench` converts a deterministic sample of an image folder to every format whose writer
is available, with the caller's preprocessing options, times reading each through a torch
``DataLoader`` (``num_workers`` 0 and all cores; and ``readers.Loader`` when it exists) against
reading the raw folder the usual way (PIL, ``Resize`` + ``CenterCrop`` of the same geometry: with
``--size 224 --resize 256`` the standard crop; :func:`~packer.bench_timing.folder_baseline`), and returns a :class:`BenchReport` with a
table and a recommendation. Its temporary files are removed whatever happens (Ctrl-C included).

An input the conversion cannot decode is skipped there, and left out of the raw-folder read too
(:func:`undecodable`: the conversion's own verdict, never a second rule), so both sides read the
same images; the report says how many each side skipped.

This module samples, converts and drives the run; the timing helpers and the readers compared
are in :mod:`packer.bench_timing` (shared with the ``benchmarks/`` suite), the table and the
recommendation in :mod:`packer.bench_report`. The names of both stay importable from here.
"""

from __future__ import annotations

import gc
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Sequence

from readers.schema import Skipped

from .bench_report import RAW_FOLDER, SUFFIX, BenchReport, BenchRow, cpu_model
from .bench_timing import (
    FolderDataset,
    Rate,
    UsualFolder,
    collate,
    disk_bytes,
    epoch_of,
    folder_baseline,
    for_at_least,
    loader_rates,
    measure,
    open_packed,
    timed_pass,
)
from .errors import OptionError, SourceError
from .options import ImageOptions
from .memory import total_memory
from .parallel import default_workers, ordered_map
from .preprocess.task import Failed, ImageTask
from .sources.images import ImageFolder, ImageItem, scan_image_folder

__all__ = [
    "run_bench",
    "sample_folder",
    "SaidOfSource",
    "scan_folder_of_images",
    "local_source",
    "scratch_folder",
    "unfinished_conversion",
    "undecodable",
    "BenchReport",
    "BenchRow",
    "Rate",
    "measure",
    "for_at_least",
    "timed_pass",
    "epoch_of",
    "FolderDataset",
    "UsualFolder",
    "folder_baseline",
    "collate",
    "open_packed",
    "loader_rates",
    "disk_bytes",
    "SUFFIX",
    "RAW_FOLDER",
]

Log = Callable[[str], None]


# ------------------------------------------------------------------------------------------ run


def scan_folder_of_images(src: str | Path) -> ImageFolder:
    """``src``'s images, where ``src`` is a folder (bench and doctor link a sample of its files);
    an archive or another file is refused in one line saying what they take."""
    from .sources.archives import is_archive
    from .sources.parquet_images import parquet_image_source

    if (Path(src).is_file() and is_archive(src)) or parquet_image_source(src) is not None:  # (else: the folder scan says what it is)
        what, it = ("the archive", "it") if Path(src).is_file() and is_archive(src) else ("the Parquet files' images", "them")
        raise SourceError(f"{src}: packer bench and packer doctor read a folder of images (they time a sample of its files); "
                          f"extract part of {what} into a folder, or convert {it} and point packer doctor at the dataset")
    try:
        return scan_image_folder(src)
    except SourceError as exc:  # no images: an unfinished conversion is said as packer info says it (--resume)
        raise SourceError(unfinished_conversion(src) or str(exc)) from None


def unfinished_conversion(src: str | Path) -> str | None:
    """What ``packer info`` says of ``src`` when it is an unfinished conversion (``NAME.partial``,
    or NAME missing beside one), else ``None``."""
    from readers.formats import detect_format
    from readers.schema import IncompleteDatasetError

    try:
        detect_format(src)
    except IncompleteDatasetError as exc:
        return str(exc)
    except Exception:  # noqa: BLE001 - anything else is not an unfinished conversion: the caller says what it is
        return None
    return None


def local_source(src: str | Path, reads: str) -> Path:
    """``src`` as a local path (a ``file://`` URL: its path); any other URL is refused in one
    line naming it as given (``Path`` would fold its ``//`` into one). ``reads``: what the
    command reads, for that line (``"packer bench reads a local folder of images"``)."""
    from readers.formats.base import local_path

    if isinstance(src, str):
        scheme = re.match(r"([A-Za-z][A-Za-z0-9+.-]*)://", src)
        if scheme is not None and scheme.group(1).lower() != "file":
            raise SourceError(f"{src}: a {scheme.group(1)}:// URL; {reads}: copy it (or a part of it) to a local disk first")
    return Path(local_path(src))


def scratch_folder(tmp_dir: str | Path | None, prefix: str) -> Path:
    """A new temporary folder under ``tmp_dir`` (``--tmp-dir``; default: the system's); a
    missing or unwritable ``tmp_dir`` is refused in one line naming the option."""
    where = f"--tmp-dir {tmp_dir}" if tmp_dir is not None else f"the temporary folder {tempfile.gettempdir()} (set --tmp-dir)"
    if tmp_dir is not None and not Path(tmp_dir).is_dir():
        raise OptionError(f"{where}: {'not a folder' if Path(tmp_dir).exists() else 'no such folder'}")
    try:
        return Path(tempfile.mkdtemp(prefix=prefix, dir=tmp_dir))
    except OSError as exc:
        raise OptionError(f"{where}: cannot create a folder there ({exc.strerror or exc})") from None


def sample_folder(src: str | Path, dst: Path, sample: int) -> tuple[list[tuple[str, int]], int]:
    """Link an evenly spaced ``sample`` of ``src``'s images into ``dst`` (same class folders).

    Returns the sampled ``(path, label)`` items in ``dst`` and how many images ``src`` holds.
    Deterministic: the same folder always gives the same sample.
    """
    folder = scan_folder_of_images(src)
    items = folder.items
    if sample < len(items):
        step = len(items) / sample
        items = [items[int(i * step)] for i in range(sample)]
    dst.mkdir(parents=True)
    linked = []
    for item in items:
        # the same relative path: the sample's conversion records the same source names (and so
        # has the size on disk) that converting SRC itself would give
        target = dst / folder.relative(item.path)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.abspath(item.path), target)
        linked.append((str(target), item.label))
    return linked, len(folder.items)


def undecodable(
    items: Sequence[tuple[str, int]], sample_dir: Path, image: ImageOptions, workers: int, conversions: Sequence[Sequence[Skipped]]
) -> list[Skipped]:
    """The sampled ``items`` (in ``sample_dir``) the raw-folder baseline leaves out, named as the
    conversion names them (relative to the sample), in sample order.

    Packer's own verdict, never a second rule: the inputs ``conversions`` (each converted format's
    ``ConversionReport.skipped``) skipped, any of them; when no format was converted, those the
    conversion's work unit (:class:`~packer.preprocess.task.ImageTask`) fails on, run in the
    conversion's worker pool (OpenCV stays out of this process, as the note in :func:`run_bench` needs).
    """
    names = [os.path.relpath(path, sample_dir) for path, _ in items]
    if conversions:
        found: dict[str, Skipped] = {}
        for skipped in conversions:
            for entry in skipped:
                found.setdefault(entry.path, entry)
        return [found[name] for name in names if name in found]
    inputs = [ImageItem(path, label) for path, label in items]
    with ordered_map(ImageTask(image), inputs, workers=max(1, workers), on_crash=lambda item, reason: Failed(item.path, reason)) as results:
        return [Skipped(name, result.reason) for name, result in zip(names, results) if isinstance(result, Failed)]


def run_bench(
    src: str | Path,
    *,
    sample: int = 2000,
    image: ImageOptions | None = None,
    formats: Sequence[str] | None = None,
    workers: int | None = None,
    batch_size: int = 64,
    seconds: float = 2.0,
    repeats: int = 3,
    tmp_dir: str | Path | None = None,
    log: Log | None = None,
) -> BenchReport:
    """Convert a sample of ``src`` to each format and time reading it against the raw folder.

    ``image``: the preprocessing (as ``packer convert``); ``formats``: default every format (one given twice is timed once);
    ``workers``: conversion processes and the largest ``num_workers`` tried (default: all
    cores); ``seconds``: the shortest timed pass; ``repeats``: timed passes per figure (after
    one warm-up). A format whose writer or reader cannot be imported yet is reported as
    skipped. Inputs the conversion skips as undecodable are left out of the raw-folder read too
    (:func:`undecodable`) and counted per pipeline in ``BenchReport.skipped``. Temporary files
    go under ``tmp_dir`` (default: the system's) and are removed on return, on error and on Ctrl-C.
    """
    from .writers import WRITERS

    image = image if image is not None else ImageOptions()
    formats = list(WRITERS) if formats is None else list(dict.fromkeys(formats))  # each format once, in the order first given
    for name in formats:
        if name not in WRITERS:
            raise OptionError(f"--format: unknown format {name!r} (choose from: {', '.join(WRITERS)})")
    if not isinstance(sample, int) or sample < 1:
        raise OptionError(f"--sample: must be a positive integer, got {sample!r}")
    if not seconds > 0:
        raise OptionError(f"--seconds: must be positive, got {seconds!r}")
    src = local_source(src, "packer bench reads a local folder of images")
    cores = default_workers() if workers is None else workers
    settings = sorted({0, cores})
    say = log or (lambda message: None)

    tmp = scratch_folder(tmp_dir, "packer-bench-")
    try:
        items, found = sample_folder(src, tmp / "sample", sample)
        report = BenchReport(src, len(items), image, cores, batch_size, seconds=seconds, repeats=repeats,
                             machine=cpu_model(), usable_cores=default_workers(), folder_images=found, memory=total_memory())
        # Every conversion first: the raw-folder timing runs packer's OpenCV preprocessing in this
        # process, and a process pool forked after OpenCV's own thread pool has run can hang in
        # the child (seen here: cv2.setNumThreads blocking in pthread_cond_destroy).
        converted: dict[str, tuple[Path, float, int]] = {}
        skips: dict[str, list[Skipped]] = {}
        pending: list[tuple[str, BenchRow | None]] = []
        once = SaidOfSource(str(tmp / "sample"), str(src))
        logging.getLogger("packer").addFilter(once)
        try:
            _convert_each(formats, items, image, cores, tmp, converted, skips, pending, say)
        finally:
            logging.getLogger("packer").removeFilter(once)

        # the raw folder reads what the conversions wrote: the same images on both sides
        left_out = undecodable(items, tmp / "sample", image, cores, list(skips.values()))
        if len(left_out) == len(items):
            raise SourceError(f"{src}: none of the {len(items):,} sampled images can be decoded "
                              f"(first: {left_out[0].path}: {left_out[0].reason})")
        report.skipped = {RAW_FOLDER: left_out, **skips}
        unreadable = {entry.path for entry in left_out}
        readable = [(path, label) for path, label in items if os.path.relpath(path, tmp / "sample") not in unreadable]

        say(f"timing the raw folder (num_workers {', '.join(map(str, settings))})")
        raw_rates = loader_rates(  # worker processes first, then in this process (see above)
            folder_baseline(readable, image), settings=settings[::-1], batch_size=batch_size, seconds=seconds, repeats=repeats, with_loader=False
        )
        report.rows += [BenchRow(RAW_FOLDER, reader, raw_rates[reader]) for reader in sorted(raw_rates)]
        for name, skipped in pending:
            if skipped is not None:
                report.rows.append(skipped)
                continue
            label = f"{name} ({image.encoding})"
            dst, convert_rate, size = converted[name]
            try:
                dataset = open_packed(dst, name)
            except (ImportError, AttributeError) as exc:
                report.rows.append(BenchRow(label, "", None, size, convert_rate, f"skipped: reader not available ({exc})"))
                continue
            say(f"timing {name}")
            rates = loader_rates(dataset, settings=settings, batch_size=batch_size, seconds=seconds, repeats=repeats)
            for reader, rate in rates.items():
                if isinstance(rate, Rate):
                    report.rows.append(BenchRow(label, reader, rate, size, convert_rate))
                else:
                    report.rows.append(BenchRow(label, reader, None, size, convert_rate, rate))
            del dataset
            gc.collect()
        return report
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _convert_each(formats: Sequence[str], items: Sequence[tuple[str, int]], image: ImageOptions, cores: int, tmp: Path,
                  converted: dict[str, tuple[Path, float, int]], skips: dict[str, list[Skipped]],
                  pending: list[tuple[str, "BenchRow | None"]], say: Callable[[str], None]) -> None:
    """Convert the sample to each format: its output, rate and size into ``converted``, its skips
    into ``skips``, and a row for each format (a placeholder where it converted) into ``pending``."""
    from .api import convert
    from .writers import get_writer

    for name in formats:
        label = f"{name} ({image.encoding})"
        try:
            get_writer(name)
        except (ImportError, AttributeError) as exc:
            pending.append((name, BenchRow(label, "", None, note=f"skipped: writer not available ({exc})")))
            continue
        dst = tmp / f"data{SUFFIX[name]}"
        say(f"converting {len(items):,} images to {name}")
        try:
            done = convert(tmp / "sample", dst, format=name, image=image, workers=cores)
        except Exception as exc:  # noqa: BLE001 - one format failing must not hide the others; reported
            pending.append((name, BenchRow(label, "", None, note=f"failed to convert ({type(exc).__name__}: {exc})")))
            continue
        converted[name] = (dst, done.images_per_second, disk_bytes(dst))
        skips[label] = list(done.skipped)
        pending.append((name, None))


class SaidOfSource(logging.Filter):
    """The conversions' warnings of their inputs' sizes (the enlargement) once, not once per
    format, naming the user's SRC rather than the scratch copy of its sample (bench's, doctor's)."""

    def __init__(self, scratch: str, src: str) -> None:
        from .jobs import ENLARGEMENT

        super().__init__()
        self.scratch, self.src, self.said, self.attribute = scratch, src, False, ENLARGEMENT

    def filter(self, record: logging.LogRecord) -> bool:
        named = getattr(record, self.attribute, None)
        if named is None:
            return True
        if self.said:
            return False
        self.said = True
        record.args = tuple(arg.replace(self.scratch, self.src, 1) if arg == named else arg for arg in record.args or ())
        return True
