"""``packer doctor``: is a training loop over this folder (or packed dataset) starving for data?

:func:`run_doctor` builds the loader a user would write (a folder: per-file PIL decode and
resize in a torch ``DataLoader`` with worker processes; a packed dataset: ``readers.Loader``),
takes the user's ``step(images, labels)`` (``--step module:function``) or a built-in model-free
step of a given cost (:class:`CostStep`), and runs :func:`readers.diagnose` on them.
For a folder it converts an evenly spaced sample to a temporary blob and times
``readers.Loader`` over it in the same rounds, so "convert it" comes with a figure measured on
this machine; the folder's loader reads the same sampled images (never one outside the sample,
which nothing checked). An image that conversion skips as undecodable is left out of the
folder's loader too (said in the report), so a damaged file found in the sample does not stop
the diagnosis; one that PIL alone cannot read stops it with one line naming the file.
The chart (``--plot``) is :func:`plot`.
"""

from __future__ import annotations

import logging
import importlib
import os
import shlex
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch.utils.data import DataLoader

from readers.diagnose_loop import DiagnoseError, Diagnosis, diagnose
from readers.schema import PackedFormatError, Skipped

from .bench import SaidOfSource, local_source, sample_folder, scan_folder_of_images, scratch_folder, unfinished_conversion
from .bench_timing import UsualFolder, collate
from .errors import OptionError, PackerError, SourceError
from .options import ImageOptions
from .parallel import default_workers

__all__ = ["run_doctor", "CostStep", "PILFolder", "load_step", "plot", "DoctorError", "DEFAULT_STEP_MS", "DEFAULT_SIZE", "DEFAULT_SAMPLE"]

#: Cost of the built-in step per batch, ms: a stand-in for a GPU step, not a measurement of one
#: (``--step module:function`` times the real thing).
DEFAULT_STEP_MS = 25.0

#: A folder SRC's defaults: the side its images are resized and cropped to, and the images
#: converted to time the packed alternative. Given for a packed SRC, they are refused.
DEFAULT_SIZE = 224
DEFAULT_SAMPLE = 500


class DoctorError(PackerError):
    """The step, the loader or an option cannot be diagnosed (one line)."""


class CostStep:
    """A model-free step costing ``ms`` per batch: it reads every pixel once (``float().mean()``,
    which also waits for a CUDA device), then sleeps the rest, leaving the CPU free, as a GPU
    step does."""

    def __init__(self, ms: float) -> None:
        if not ms >= 0:
            raise OptionError(f"--step-ms: must be at least 0, got {ms!r}")
        self.ms = float(ms)
        self.__qualname__ = f"CostStep({self.ms:g} ms)"

    def __call__(self, images: torch.Tensor, labels: Any) -> None:
        start = time.perf_counter()
        images.float().mean().item()
        left = self.ms / 1000 - (time.perf_counter() - start)
        if left > 0:
            time.sleep(left)


class PILFolder(UsualFolder):
    """An image folder read the usual way (:class:`packer.bench_timing.UsualFolder`): PIL decode,
    RGB, ``Resize(size)`` + ``CenterCrop(size)``, uint8 ``(3, size, size)``."""

    def __init__(self, items: list[tuple[str, int]], size: int) -> None:
        super().__init__(items, (size, size), size)


def load_step(spec: str) -> Callable[[Any, Any], Any]:
    """``module:function`` -> the function (the current directory is importable, as for ``python -m``)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise OptionError(f"--step {spec!r}: expected module:function, e.g. train:step")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure is the user's module: one line
        raise DoctorError(f"--step {spec!r}: cannot import {module_name!r}: {type(exc).__name__}: {exc}") from None
    step = getattr(module, attr, None)
    if not callable(step):
        raise DoctorError(f"--step {spec!r}: {module_name} has no function {attr!r}")
    return step


@dataclass
class DoctorReport:
    """The diagnosis, and what the sample conversion measured (for a folder)."""

    diagnosis: Diagnosis
    source: str
    kind: str  # "folder" or the packed format
    sample: int = 0
    convert_images_per_s: float | None = None
    #: Sampled images the conversion skipped as undecodable, left out of the folder's loader too.
    skipped: list[Skipped] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "kind": self.kind, "sample": self.sample,
                "convert_images_per_s": self.convert_images_per_s, "skipped": [entry.to_dict() for entry in self.skipped],
                "diagnosis": self.diagnosis.to_dict()}

    def __str__(self) -> str:
        if not self.skipped:
            return str(self.diagnosis)
        first = self.skipped[0]
        return (f"{self.diagnosis}\nSkipped {len(self.skipped):,} undecodable image(s) of the {self.sample:,} sampled, as packer convert "
                f"skips them, and left them out of the folder's loader too (a plain DataLoader stops at them); "
                f"first: {first.path}: {first.reason}")


def _is_packed(src: Path) -> str | None:
    """The format of a packed image dataset at ``src``; None when it is not packed (a folder)."""
    from .info import read_metadata

    try:
        meta = read_metadata(src)
    except (PackedFormatError, FileNotFoundError, NotADirectoryError, OSError, ValueError):
        return None
    if meta.kind != "image":
        raise DoctorError(f"{src}: a {meta.kind} dataset; packer doctor measures loaders of (images, labels) batches")
    return meta.format


def run_doctor(
    src: str | Path,
    *,
    step: str | None = None,
    step_ms: float | None = None,
    batch_size: int = 64,
    size: int | None = None,
    workers: int | None = None,
    device: str | None = None,
    batches: int = 30,
    rounds: int = 3,
    sample: int | None = None,
    trace: str | Path | None = None,
    tmp_dir: str | Path | None = None,
    log: Callable[[str], None] | None = None,
) -> DoctorReport:
    """Diagnose a training loop over ``src`` (an image folder or a packed dataset).

    ``step``: ``"module:function"`` (``function(images, labels)``), else :class:`CostStep` of
    ``step_ms`` (default :data:`DEFAULT_STEP_MS`; refused with ``step``). A ``sample`` of a folder
    (default :data:`DEFAULT_SAMPLE`) is read by :class:`PILFolder` (``size``, default
    :data:`DEFAULT_SIZE`) in a ``DataLoader`` with ``workers`` processes (default: all cores),
    and converted to a temporary blob (removed on return) whose ``readers.Loader`` is the
    measured alternative. A packed dataset is read as it was
    converted: ``size``, ``workers`` and ``sample`` are refused for it. ``src`` may be a local
    path or a ``file://`` URL; another URL is refused.
    """
    say = log or (lambda message: None)
    src = local_source(src, "packer doctor reads a local image folder or packed dataset")
    if step is not None and step_ms is not None:
        raise OptionError("--step-ms: the cost of the built-in step, used only without --step (which times your step)")
    if device is not None:
        try:
            kind = torch.device(device).type
        except (RuntimeError, TypeError):  # torch's message lists every device type it knows
            kind = None
        if kind not in ("cpu", "cuda"):
            raise OptionError(f"--device {device}: the step runs on cpu or cuda[:N]")
        if kind == "cuda" and not torch.cuda.is_available():
            raise OptionError(f"--device {device}: CUDA is not available here; use --device cpu")
    fmt = _is_packed(src)  # (an unfinished conversion is a folder here: the folder scan says what it is)
    if fmt is None and not src.exists():
        raise SourceError(unfinished_conversion(src) or f"{src}: no such file or folder")
    if fmt is not None:
        given = [option for option, value in (("--size", size), ("--workers", workers), ("--sample", sample)) if value is not None]
        if given:
            raise OptionError(f"{', '.join(given)}: only for an image folder; {src} is a packed {fmt} dataset, read as it was converted")
    user_step = load_step(step) if step is not None else CostStep(DEFAULT_STEP_MS if step_ms is None else step_ms)
    size = DEFAULT_SIZE if size is None else size
    sample = DEFAULT_SAMPLE if sample is None else sample
    tmp = scratch_folder(tmp_dir, "packer-doctor-")
    try:
        from readers.loader import Loader

        if fmt is not None:
            from readers.open import open_dataset

            dataset = open_dataset(src)
            if not dataset.meta.fixed_shape:  # Loader fills one batch array: the error said so in a traceback
                raise DoctorError(f"{src}: its images have different shapes, and packer doctor times readers.Loader, which needs "
                                  "one shape per dataset: convert with --size N (--resize-mode center-crop, pad or stretch)")
            loader: Any = Loader(dataset, batch_size, device=device if device and device.startswith("cuda") else None)
            report = DoctorReport(None, str(src), fmt)  # type: ignore[arg-type]
            alternatives: dict[str, tuple[Any, str]] = {}
        else:
            folder = scan_folder_of_images(src)
            cores = default_workers() if workers is None else workers
            # the conversion first: a process pool forked after the DataLoader's workers ran is not needed then
            from .api import convert

            picked, _found = sample_folder(src, tmp / "sample", sample)
            say(f"converting a sample of {len(picked):,} images to a blob (--size {size})")
            said = SaidOfSource(str(tmp / "sample"), str(src))  # (its warnings name SRC, not the scratch copy: a walkthrough)
            logging.getLogger("packer").addFilter(said)
            try:
                done = convert(tmp / "sample", tmp / "sample.blob", format="blob", image=ImageOptions(size=size), workers=max(1, cores))
            finally:
                logging.getLogger("packer").removeFilter(said)
            from readers.blob import RAMDataset

            packed = Loader(RAMDataset(tmp / "sample.blob"), batch_size)
            how = (f"packer convert {shlex.quote(str(src))} train.blob --size {size} (converting ran at {done.images_per_second:,.0f} img/s here: "
                   f"~{_duration(len(folder.items) / max(done.images_per_second, 1e-9))} for the {len(folder.items):,} images), "
                   f"then readers.Loader(readers.RAMDataset('train.blob'), {batch_size})")
            alternatives = {f"packed blob ({done.written} images)": (packed, how)}  # the sample, less what it skipped
            # the folder's loader reads the sampled images the conversion read (named relative to SRC: the sample keeps
            # its paths), never an image outside the sample, which nothing checked (as packer bench reads its sample)
            sampled = {str(Path(path).relative_to(tmp / "sample")) for path, _ in picked} - {entry.path for entry in done.skipped}
            items = [(item.path, item.label) for item in folder.items if folder.relative(item.path) in sampled]
            loader = _folder_loader(items, size, batch_size, cores)
            if cores < default_workers():  # more workers: measured too, in the same rounds
                more = default_workers()
                alternatives[f"num_workers={more}"] = (_folder_loader(items, size, batch_size, more),
                                                       f"--workers {more} (DataLoader(num_workers={more}))")
            report = DoctorReport(None, str(src), "folder", len(picked), done.images_per_second, list(done.skipped))  # type: ignore[arg-type]
        say(f"diagnosing: {batches} batches of {batch_size} per measurement, {rounds} rounds")
        try:
            report.diagnosis = diagnose(loader, user_step, batches=batches, rounds=rounds, device=device, trace=trace,
                                        alternatives=alternatives, name=_describe(loader))
        except DiagnoseError as exc:
            raise DoctorError(str(exc)) from None
        return report
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _folder_loader(items: list[tuple[str, int]], size: int, batch_size: int, workers: int) -> DataLoader:
    return DataLoader(PILFolder(items, size), batch_size=batch_size, shuffle=True, num_workers=workers,
                      collate_fn=collate, persistent_workers=workers > 0)


def _describe(loader: Any) -> str:
    if isinstance(loader, DataLoader):
        return f"DataLoader({type(loader.dataset).__name__}, num_workers={loader.num_workers})"
    return repr(loader).split(", shuffle")[0] + ")"


def plot(diagnosis: Diagnosis, path: str | Path) -> Path:
    """A chart of the rates measured (loader, step, loop, alternatives) and of the loop's time split."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        from readers.extras import install_hint

        raise OptionError(f"--plot needs matplotlib: {install_hint('bench')}") from None
    d = diagnosis
    bars = [("loader alone", d.loader), ("step alone", d.step), ("training loop", d.together)]
    bars += [(alt.label, alt.measured) for alt in d.alternatives]
    fig, (rates, split) = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [3, 1]})
    names = [name for name, _ in bars]
    medians = [m.images_per_s for _, m in bars]
    errors = [[m.images_per_s - m.min for _, m in bars], [m.max - m.images_per_s for _, m in bars]]
    rates.barh(names, medians, xerr=errors, color=["#4c72b0", "#55a868", "#c44e52"] + ["#8172b2"] * len(d.alternatives))
    rates.set_xscale("log")
    for y, (_name, m) in enumerate(bars):  # the median, written right of its error bar
        rates.annotate(f" {m.images_per_s:,.0f}", (max(m.max, m.images_per_s), y), va="center", fontsize=8)
    rates.invert_yaxis()
    rates.set_xlabel("images/s, log scale (median, min-max of the rounds)")
    rates.set_title(d.verdict.split(";")[0])
    parts = [("waiting for data", d.data_bound), ("copy to device", d.copy_share), ("step", max(0.0, 1 - d.data_bound - d.copy_share))]
    bottom = 0.0
    for (name, share), color in zip(parts, ["#c44e52", "#dd8452", "#55a868"]):
        split.bar(["training loop"], [share * 100], bottom=[bottom], label=f"{name} {share:.0%}", color=color)
        bottom += share * 100
    split.set_ylabel("% of the loop's time")
    split.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def _duration(seconds: float) -> str:
    """``"40 s"``, ``"12 min"``, ``"3.5 h"``: a conversion's expected time, as a person says it."""
    if seconds < 90:
        return f"{max(seconds, 1):.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:,.1f} h"
