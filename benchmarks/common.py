"""Shared benchmark plumbing: data generation, repeated timing, machine description, tables.

Every figure is a rate measured over several passes after a warm-up; we report min, median
and max, and compare pipelines as ratios measured in the same run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Iterable

from packer.bench import Rate, for_at_least, measure  # one implementation, shared with `packer bench`

HERE = Path(__file__).resolve().parent
DATA_DIR = HERE / "data"
OUT_DIR = HERE / "out"
RESULTS_DIR = HERE / "results"

__all__ = [
    "Rate", "measure", "for_at_least", "imagenet_like", "folder_stats", "cpu_count", "machine", "markdown_table", "save_json",
    "add_output_arguments", "output_dir", "provenance", "run_main",
]


def imagenet_like(images: int, *, classes: int = 10, workers: int | None = None) -> Path:
    """A cached folder of ``images`` natural-looking 500x375 JPEGs of ~100 KB (made once)."""
    from packer.samples import make_image_folder

    per_class = max(1, images // classes)
    root = DATA_DIR / f"imagenet-like-{classes}x{per_class}"
    return make_image_folder(
        root, classes=classes, per_class=per_class, size=(375, 500), quality=90, seed=0, workers=workers or os.cpu_count() or 1
    )


def presized(images: int) -> Path:
    """A cached folder of the :func:`imagenet_like` images already at 224x224, as BMP: a source
    with (nearly) nothing to decode or resize, whose conversion measures moving samples (made once)."""
    from PIL import Image, ImageOps

    src = imagenet_like(images)
    root = DATA_DIR / f"presized-224-{src.name}"
    done = root / ".complete"
    if not done.exists():
        for path in sorted(src.rglob("*.jpg")):
            out = root / path.relative_to(src).with_suffix(".bmp")
            out.parent.mkdir(parents=True, exist_ok=True)
            with Image.open(path) as image:
                ImageOps.fit(image.convert("RGB"), (224, 224)).save(out)
        done.touch()
    return root


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
        **({"gpu": torch.cuda.get_device_name(0)} if torch.cuda.is_available() else {}),  # on the host, used or not
    }


def markdown_table(header: Iterable[str], rows: Iterable[Iterable[object]]) -> str:
    header = list(header)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """``--update-results`` and ``--out DIR``: where a benchmark writes (see :func:`output_dir`)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--update-results", action="store_true",
                       help="write into benchmarks/results/, the committed figures (default: benchmarks/out/, git-ignored)")
    group.add_argument("--out", type=Path, metavar="DIR", help="write into DIR instead")


def output_dir(update_results: bool = False, out: Path | None = None) -> Path:
    """Where a benchmark's JSON (and charts) go: ``out`` if given, ``benchmarks/results/`` (the
    committed figures) only when asked to update them, else ``benchmarks/out/`` (git-ignored), so
    a trial run never overwrites a tracked file."""
    if out is not None:
        return out
    return RESULTS_DIR if update_results else OUT_DIR


def provenance() -> dict:
    """What produced a result: the command as typed, the UTC date, the commit (``+dirty`` when
    tracked files differ from it) and the machine. ``benchmarks.render`` prints these beside
    every table, so each published figure names its source."""
    argv = list(sys.argv)
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name:
        argv[0:1] = ["python", "-m", spec.name.removesuffix(".__main__")]
    commit = "unknown"
    try:
        root = HERE.parent
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True, check=True).stdout
        commit += "+dirty" if dirty.strip() else ""
    except (OSError, subprocess.CalledProcessError):  # pragma: no cover - not a git checkout
        pass
    declared = os.environ.get("PACKER_BENCH_COMMIT")  # the commit whose tree was sent to a lent GPU machine (its .git is another)
    return {
        "command": " ".join(shlex.quote(a) for a in argv),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "commit": commit,
        **({"tree_commit": declared} if declared else {}),
        "load_average_at_save": [round(x, 2) for x in os.getloadavg()],  # others sharing the cores show here
        "machine": machine(),
    }


def save_json(name: str, payload: dict, directory: Path = OUT_DIR) -> Path:
    """Write ``payload`` as ``directory/name.json`` (dataclasses as dicts), with its
    :func:`provenance` (command, date, commit, machine) wherever the payload lacks them."""
    payload = {**provenance(), **payload}  # the benchmark's own fields win (e.g. a machine it described itself)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2, default=lambda o: asdict(o) if hasattr(o, "__dataclass_fields__") else str(o)))
    return path


def run_main(main: Callable[[], object]) -> None:
    """Run a benchmark's ``main`` as its script: SIGTERM and SIGHUP (a ``timeout``, a closed
    terminal, a job scheduler) unwind it as Ctrl-C does, so its temporary folders, often GBs of
    converted data, are removed; then one line and exit 130. Before, only Ctrl-C did: a killed
    ``core_scaling`` left its folder behind. Otherwise it exits with what ``main`` returns."""
    from packer.interrupts import interruptible

    try:
        with interruptible():
            code = main()
    except KeyboardInterrupt:
        print("interrupted; temporary files removed", file=sys.stderr)
        raise SystemExit(130) from None
    raise SystemExit(code)
