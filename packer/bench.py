"""``packer bench``: how much faster would *your* folder read, packed, on *this* machine?

:func:`run_bench` converts a deterministic sample of an image folder to every format whose writer
is available, with the caller's preprocessing options, times reading each through a torch
``DataLoader`` (``num_workers`` 0 and all cores; and ``readers.Loader`` when it exists) against
reading the raw folder with the same preprocessing, and returns a :class:`BenchReport` with a
table and a recommendation. Its temporary files are removed whatever happens (Ctrl-C included).

The timing helpers (:class:`Rate`, :func:`measure`, :func:`for_at_least`) are shared with the
``benchmarks/`` suite.
"""

from __future__ import annotations

import gc
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from .errors import OptionError
from .options import ImageOptions
from .parallel import default_workers
from .preprocess.image import preprocess_image
from .sources.images import scan_image_folder

__all__ = [
    "run_bench",
    "BenchReport",
    "BenchRow",
    "Rate",
    "measure",
    "for_at_least",
    "timed_pass",
    "FolderDataset",
    "collate",
    "open_packed",
    "loader_rates",
    "DATASET_CLASSES",
    "SUFFIX",
]

#: Format name -> the ``readers`` class that reads it (used when ``readers.open_dataset`` is missing).
DATASET_CLASSES: dict[str, str] = {"lmdb": "LMDBDataset", "hdf5": "HDF5Dataset", "blob": "RAMDataset", "webdataset": "ShardDataset"}

#: Destination name per format (webdataset: a folder of shards).
SUFFIX: dict[str, str] = {"lmdb": ".lmdb", "hdf5": ".h5", "blob": ".blob", "webdataset": ".shards"}

RAW_FOLDER = "raw folder"
Log = Callable[[str], None]


# --------------------------------------------------------------------------------------- timing


@dataclass(frozen=True)
class Rate:
    """Items per second over repeated passes."""

    min: float
    median: float
    max: float
    runs: int

    def __str__(self) -> str:
        return f"{self.median:,.0f} ({self.min:,.0f}-{self.max:,.0f})"


def measure(one_pass: Callable[[], int], *, repeats: int = 3, warmup: int = 1) -> Rate:
    """Run ``one_pass`` (returns the number of items it processed) ``warmup + repeats`` times; time the last ``repeats``."""
    if repeats < 1:
        raise OptionError(f"repeats: must be at least 1, got {repeats!r}")
    for _ in range(warmup):
        one_pass()
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        items = one_pass()
        rates.append(items / (time.perf_counter() - start))
    return Rate(min(rates), statistics.median(rates), max(rates), len(rates))


def for_at_least(seconds: float, epoch: Callable[[], int]) -> Callable[[], int]:
    """A pass that repeats ``epoch`` until ``seconds`` have passed (stable figures for fast readers)."""

    def one_pass() -> int:
        start, items = time.perf_counter(), 0
        while True:
            items += epoch()
            if time.perf_counter() - start >= seconds:
                return items

    return one_pass


def timed_pass(loader: Iterable[Any], seconds: float) -> Callable[[], int]:
    """A pass: read batches of ``(images, labels)`` for at least ``seconds`` (across epochs, or
    stopping mid-epoch for slow pipelines); returns the images read."""

    def one_pass() -> int:
        start, images = time.perf_counter(), 0
        while True:
            for batch, _labels in loader:
                images += len(batch)
                if time.perf_counter() - start >= seconds:
                    return images
            if images == 0:
                raise RuntimeError(f"{loader!r} yielded no batches")

    return one_pass


def epoch_of(loader: Iterable[Any]) -> Callable[[], int]:
    """One full pass over ``loader`` (batches of ``(images, labels)``); returns the images seen."""

    def epoch() -> int:
        images = 0
        for batch, _labels in loader:
            images += len(batch)
        return images

    return epoch


# ------------------------------------------------------------------------------------- datasets


def collate(batch: Sequence[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor | list[torch.Tensor], torch.Tensor]:
    """Stack same-shaped images into one tensor (a list when shapes vary); labels as int64.

    The copy is numpy's (one thread), the same for every pipeline: ``torch.stack`` of large
    uint8 tensors runs on torch's OpenMP pool, whose threads spin against any other load on
    the machine and made figures swing by 10x on a busy 2-core box.
    """
    images = [image for image, _ in batch]
    labels = torch.tensor([label for _, label in batch], dtype=torch.int64)
    if all(image.shape == images[0].shape for image in images):
        if all(image.dtype == torch.uint8 for image in images):
            return torch.from_numpy(np.stack([image.numpy() for image in images])), labels
        return torch.stack(images), labels
    return images, labels


class FolderDataset(Dataset):
    """The raw folder, read per file with packer's own preprocessing: uint8 ``(C, H, W)``, label.

    Same pixels as the packed datasets (OpenCV reduced JPEG decode, antialiased resize), so the
    comparison measures only where the work happens, not different work.
    """

    def __init__(self, items: Sequence[tuple[str, int]], image: ImageOptions) -> None:
        self.items = list(items)
        self.image = image

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.items[index]
        with open(path, "rb") as handle:
            pixels = preprocess_image(handle.read(), self.image)
        return torch.from_numpy(pixels).permute(2, 0, 1), label


def open_packed(path: str | Path, format_name: str) -> Dataset:
    """The map-style ``readers`` dataset of a packed ``path`` (``readers.open_dataset`` when it exists)."""
    import readers

    try:
        opener = readers.open_dataset
    except (ImportError, AttributeError):
        return getattr(readers, DATASET_CLASSES[format_name])(path)
    return opener(path)


def loader_rates(
    dataset: Dataset,
    *,
    settings: Sequence[int],
    batch_size: int,
    seconds: float,
    repeats: int,
    warmup: int = 1,
    with_loader: bool = True,
) -> dict[str, Rate | str]:
    """Read rates of ``dataset`` through ``DataLoader(num_workers=w)`` for each ``w``, and ``readers.Loader``.

    Keys are reader descriptions; a value is a :class:`Rate`, or a string saying why that
    reader was not measured.
    """
    out: dict[str, Rate | str] = {}
    for workers in settings:
        loader = DataLoader(
            dataset, batch_size=batch_size, shuffle=True, num_workers=workers, persistent_workers=workers > 0, collate_fn=collate
        )
        out[f"DataLoader(num_workers={workers})"] = measure(timed_pass(loader, seconds), repeats=repeats, warmup=warmup)
        del loader
        gc.collect()  # ends persistent workers before the next loader starts its own
    if with_loader:
        try:
            from readers import Loader
        except (ImportError, AttributeError) as exc:
            out["readers.Loader"] = f"not available ({type(exc).__name__}: {exc})"
        else:
            try:
                threaded = Loader(dataset, batch_size=batch_size, shuffle=True)
                out["readers.Loader"] = measure(timed_pass(threaded, seconds), repeats=repeats, warmup=warmup)
            except Exception as exc:  # noqa: BLE001 - a reader still being written: reported, not hidden
                out["readers.Loader"] = f"failed ({type(exc).__name__}: {exc})"
            finally:
                threaded = None
                gc.collect()
    return out


def disk_bytes(path: Path) -> int:
    """Bytes on disk of a file or folder (allocated blocks, so sparse LMDB maps count what they use)."""
    if path.is_file():
        return path.stat().st_blocks * 512
    return sum(p.stat().st_blocks * 512 for p in path.rglob("*") if p.is_file())


# --------------------------------------------------------------------------------------- report


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

    @property
    def measured(self) -> list[BenchRow]:
        return [row for row in self.rows if row.rate is not None]

    def baseline(self) -> BenchRow | None:
        """The raw folder at its best setting."""
        rows = [row for row in self.measured if row.pipeline == RAW_FOLDER]
        return max(rows, key=lambda row: row.rate.median) if rows else None

    def best(self) -> BenchRow | None:
        """The fastest packed format and reader."""
        rows = [row for row in self.measured if row.pipeline != RAW_FOLDER]
        return max(rows, key=lambda row: row.rate.median) if rows else None

    def table(self) -> str:
        """A markdown table: images/s median (min-max), ratio to the raw folder at its best, size, conversion speed."""
        base = self.baseline()
        header = ["pipeline", "reader", "images/s median (min-max)", "vs raw folder", "on disk", "convert img/s"]
        rows = []
        for row in self.rows:
            if row.rate is None:
                rows.append([row.pipeline, row.reader, row.note, "", _size(row.bytes_on_disk), _num(row.convert_rate)])
                continue
            ratio = f"{row.rate.median / base.rate.median:.1f}x" if base else ""
            rows.append([row.pipeline, row.reader, str(row.rate), ratio, _size(row.bytes_on_disk), _num(row.convert_rate)])
        return markdown_table(header, rows)

    def recommendation(self) -> str:
        """The fastest format and settings here, its size on disk, and the command that makes it."""
        best, base = self.best(), self.baseline()
        if best is None:
            return "No packed format could be measured here (see the notes in the table)."
        fmt = best.pipeline.split(" ", 1)[0]
        options = _cli_options(self.image)
        per_image = f", {best.bytes_on_disk / self.images / 1e3:,.0f} KB per image" if best.bytes_on_disk else ""
        speed = f"{best.rate.median:,.0f} images/s"
        if base is not None:
            speed += f", {best.rate.median / base.rate.median:.1f}x the raw folder at its best ({base.rate.median:,.0f} with {base.reader})"
        size = f"{_size(best.bytes_on_disk)} for {self.images:,} images{per_image}"
        return (
            f"Recommendation: {best.pipeline} read with {best.reader}: {speed}; {size}.\n"
            f"  packer convert {self.src} DST{SUFFIX[fmt]} --format {fmt}{options}"
        )

    def to_dict(self) -> dict[str, Any]:
        """Every figure, JSON-ready."""
        return {
            "src": str(self.src),
            "images": self.images,
            "image": self.image.describe(),
            "cores": self.cores,
            "batch_size": self.batch_size,
            "rows": [asdict(row) for row in self.rows],
        }


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
        if image.resize_mode != "center-crop":
            parts.append(f" --resize-mode {image.resize_mode}")
    if image.grayscale:
        parts.append(" --grayscale")
    if image.encoding != "raw":
        parts.append(f" --encoding {image.encoding}")
        if image.encoding == "jpeg" and image.quality != 90:
            parts.append(f" --quality {image.quality}")
    return "".join(parts)


# ------------------------------------------------------------------------------------------ run


def sample_folder(src: str | Path, dst: Path, sample: int) -> list[tuple[str, int]]:
    """Link an evenly spaced ``sample`` of ``src``'s images into ``dst`` (same class folders).

    Returns the sampled ``(path, label)`` items in ``dst``. Deterministic: the same folder
    always gives the same sample.
    """
    folder = scan_image_folder(src)
    items = folder.items
    if sample < len(items):
        step = len(items) / sample
        items = [items[int(i * step)] for i in range(sample)]
    dst.mkdir(parents=True)
    linked = []
    for i, item in enumerate(items):
        parent = dst / folder.classes[item.label] if item.label >= 0 else dst
        parent.mkdir(exist_ok=True)
        target = parent / f"{i:06d}_{Path(item.path).name}"
        os.symlink(os.path.abspath(item.path), target)
        linked.append((str(target), item.label))
    return linked


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

    ``image``: the preprocessing (as ``packer convert``); ``formats``: default every format;
    ``workers``: conversion processes and the largest ``num_workers`` tried (default: all
    cores); ``seconds``: the shortest timed pass; ``repeats``: timed passes per figure (after
    one warm-up). A format whose writer or reader cannot be imported yet is reported as
    skipped. Temporary files go under ``tmp_dir`` (default: the system's) and are removed on
    return, on error and on Ctrl-C.
    """
    from .writers import WRITERS, get_writer

    image = image if image is not None else ImageOptions()
    formats = list(WRITERS) if formats is None else list(formats)
    for name in formats:
        if name not in WRITERS:
            raise OptionError(f"--format: unknown format {name!r} (choose from: {', '.join(WRITERS)})")
    if not isinstance(sample, int) or sample < 1:
        raise OptionError(f"--sample: must be a positive integer, got {sample!r}")
    if not seconds > 0:
        raise OptionError(f"--seconds: must be positive, got {seconds!r}")
    cores = default_workers() if workers is None else workers
    settings = sorted({0, cores})
    say = log or (lambda message: None)

    tmp = Path(tempfile.mkdtemp(prefix="packer-bench-", dir=tmp_dir))
    try:
        items = sample_folder(src, tmp / "sample", sample)
        report = BenchReport(Path(src), len(items), image, cores, batch_size)
        # Every conversion first: the raw-folder timing runs packer's OpenCV preprocessing in this
        # process, and a process pool forked after OpenCV's own thread pool has run can hang in
        # the child (seen here: cv2.setNumThreads blocking in pthread_cond_destroy).
        converted: dict[str, tuple[Path, float, int]] = {}
        pending: list[tuple[str, BenchRow | None]] = []
        for name in formats:
            label = f"{name} ({image.encoding})"
            try:
                get_writer(name)
            except (ImportError, AttributeError) as exc:
                pending.append((name, BenchRow(label, "", None, note=f"skipped: writer not available ({exc})")))
                continue
            from .api import convert

            dst = tmp / f"data{SUFFIX[name]}"
            say(f"converting {len(items):,} images to {name}")
            try:
                done = convert(tmp / "sample", dst, format=name, image=image, workers=cores)
            except Exception as exc:  # noqa: BLE001 - one format failing must not hide the others; reported
                pending.append((name, BenchRow(label, "", None, note=f"failed to convert ({type(exc).__name__}: {exc})")))
                continue
            converted[name] = (dst, done.images_per_second, disk_bytes(dst))
            pending.append((name, None))

        say(f"timing the raw folder (num_workers {', '.join(map(str, settings))})")
        raw_rates = loader_rates(  # worker processes first, then in this process (see above)
            FolderDataset(items, image), settings=settings[::-1], batch_size=batch_size, seconds=seconds, repeats=repeats, with_loader=False
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
