"""Shared benchmark plumbing: data generation, repeated timing, machine description, tables.

Every figure is a rate measured over several passes after a warm-up; we report min, median
and max, and compare pipelines as ratios measured in the same run.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable

HERE = Path(__file__).resolve().parent
DATA_DIR = HERE / "data"
OUT_DIR = HERE / "out"


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
    """Run ``one_pass`` (returns the number of items it processed) and time each run."""
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


def imagenet_like(images: int, *, classes: int = 10, workers: int | None = None) -> Path:
    """A cached folder of ``images`` natural-looking 500x375 JPEGs of ~100 KB (made once)."""
    from packer.samples import make_image_folder

    per_class = max(1, images // classes)
    root = DATA_DIR / f"imagenet-like-{classes}x{per_class}"
    return make_image_folder(
        root, classes=classes, per_class=per_class, size=(375, 500), quality=90, seed=0, workers=workers or os.cpu_count() or 1
    )


def folder_stats(root: Path) -> tuple[int, int]:
    """(number of files, total bytes) under ``root``."""
    sizes = [p.stat().st_size for p in root.rglob("*") if p.is_file()]
    return len(sizes), sum(sizes)


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover
        return os.cpu_count() or 1


def machine() -> dict:
    """What the figures were measured on."""
    import cv2
    import lmdb
    import numpy
    import PIL
    import torch

    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:  # pragma: no cover
        pass
    memory = 0
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover
        pass
    return {
        "cpu": model,
        "cores": cpu_count(),
        "memory_gib": round(memory / 2**30, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "opencv": cv2.__version__,
        "pillow": PIL.__version__,
        "lmdb": lmdb.__version__,
    }


def markdown_table(header: Iterable[str], rows: Iterable[Iterable[object]]) -> str:
    header = list(header)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def save_json(name: str, payload: dict) -> Path:
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    path = OUT_DIR / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2, default=lambda o: asdict(o) if hasattr(o, "__dataclass_fields__") else str(o)))
    return path
