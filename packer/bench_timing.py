"""How fast a dataset reads, for ``packer bench`` and the ``benchmarks/`` suite.

The timing helpers (:class:`Rate`, :func:`measure`, :func:`for_at_least`, :func:`timed_pass`,
:func:`epoch_of`), the raw folder read with packer's own preprocessing (:class:`FolderDataset`),
the opener of a packed sample (:func:`open_packed`), the rates of one dataset through each reader
compared (:func:`loader_rates`), and its size on disk (:func:`disk_bytes`).
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from .errors import OptionError
from .options import ImageOptions
from .preprocess.image import preprocess_image

__all__ = [
    "Rate",
    "measure",
    "for_at_least",
    "timed_pass",
    "epoch_of",
    "FolderDataset",
    "UsualFolder",
    "usual_crop",
    "folder_baseline",
    "collate",
    "open_packed",
    "loader_rates",
    "disk_bytes",
]

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
    the machine and made figures swing wildly on a busy 2-core box.
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
        if not pixels.flags.writeable:  # (a decoder's read-only view: torch warns on those)
            pixels = pixels.copy()
        return torch.from_numpy(pixels).permute(2, 0, 1), label


def usual_crop(image: Any, size: tuple[int, int], shorter: int) -> Any:
    """torchvision's ``Resize(shorter)`` + ``CenterCrop(size)`` on a PIL image, spelled out
    (torchvision is not a dependency): the shorter side to ``shorter``, the longer one
    ``int(shorter * long / short)``, bilinear with PIL's antialiasing, then the centre crop at
    ``round((side - crop) / 2)``."""
    from PIL import Image

    w, h = image.size
    nw, nh = (shorter, int(shorter * h / w)) if w <= h else (int(shorter * w / h), shorter)
    image = image.resize((nw, nh), Image.BILINEAR)
    th, tw = size
    top, left = int(round((nh - th) / 2.0)), int(round((nw - tw) / 2.0))
    return image.crop((left, top, left + tw, top + th))


class UsualFolder(Dataset):
    """The usual per-file pipeline: PIL open, ``Resize`` + ``CenterCrop`` (:func:`usual_crop`),
    uint8 ``(C, H, W)`` tensor, label; no float normalisation (the GPU's job, as with packer).
    A file PIL cannot read raises ``OSError`` naming it (the error's first line, as a DataLoader
    worker's is re-raised).

    ``shorter``: the ``Resize`` side (``ImageOptions.resize``; the standard 256 for 224)."""

    def __init__(self, items: Sequence[tuple[str, int]], size: tuple[int, int], shorter: int, grayscale: bool = False) -> None:
        self.items = list(items)
        self.size, self.shorter, self.mode = size, shorter, "L" if grayscale else "RGB"

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        from PIL import Image

        path, label = self.items[index]
        try:
            with Image.open(path) as image:
                pixels = np.asarray(usual_crop(image.convert(self.mode), self.size, self.shorter))
        except (OSError, ValueError, SyntaxError) as exc:  # PIL's decode errors: one line naming the file (a worker's too)
            raise OSError(f"{path}: {exc}") from exc
        pixels = pixels.reshape(*pixels.shape[:2], -1)
        return torch.from_numpy(pixels.copy()).permute(2, 0, 1), label


def folder_baseline(items: Sequence[tuple[str, int]], image: ImageOptions) -> Dataset:
    """What packed data is compared with: the usual PIL pipeline (:class:`UsualFolder`) for a
    centre crop of a fixed size, with ``Resize(image.resize)`` (``--resize``; else the crop's
    larger side, packer's default view); other modes, which that pipeline does not spell the
    same way, read per file with packer's own preprocessing (:class:`FolderDataset`)."""
    if image.resize_mode == "center-crop" and image.size is not None:
        return UsualFolder(items, image.size, image.resize or max(image.size), image.grayscale)
    return FolderDataset(items, image)


def open_packed(path: str | Path, format_name: str) -> Dataset:
    """The map-style ``readers`` dataset of a packed ``path`` (``format_name``: what it must be)."""
    from readers import open_dataset

    dataset = open_dataset(path)
    if dataset.meta.format != format_name:
        raise ValueError(f"{path}: a {dataset.meta.format} dataset, not {format_name}")
    return dataset


def quiet_handle_sharing(_worker_id: int = 0) -> None:
    """A ``DataLoader`` worker's ``worker_init_fn``: no traceback when the main process stops
    fetching a batch's shared-memory handle mid-way (it was interrupted: ``packer bench`` then
    says so in one line). The worker serves those handles from a thread of
    ``multiprocessing.resource_sharer``, which prints any error there through ``sys.excepthook``;
    a broken connection is the only error dropped, and only from that module."""
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        where = tb.tb_frame.f_code.co_filename if tb is not None else ""  # the frame that caught it
        if not (issubclass(kind, (ConnectionError, EOFError)) and where.endswith("resource_sharer.py")):
            previous(kind, value, tb)

    sys.excepthook = hook


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
            dataset, batch_size=batch_size, shuffle=True, num_workers=workers, persistent_workers=workers > 0, collate_fn=collate,
            worker_init_fn=quiet_handle_sharing,
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
            if getattr(getattr(dataset, "meta", None), "fixed_shape", True) is False:  # (its own error was a raw exception)
                out["readers.Loader"] = "not measured: readers.Loader needs one shape per dataset; these images have variable shapes"
                return out
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
