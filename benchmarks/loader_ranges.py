"""What the Loader's profiler ranges cost when no profiler runs: ``readers.Loader`` with and without them.

    python -m benchmarks.loader_ranges                    # 10 alternating rounds, results to benchmarks/out/
    python -m benchmarks.loader_ranges --update-results   # ... to benchmarks/results/loader_ranges.json

``readers.Loader`` opens ``torch.profiler.record_function`` ranges around its stages (fill, wait,
copy to device) only while a profiler runs (``readers/loader.py``: ``_stage``). This compares the
Loader as shipped against the same Loader with the annotated classes swapped for the plain ones
(``readers.filling.BatchSource``, ``FillingIterator``), in one process, alternating which goes
first each round. Data: ``--images`` synthetic JPEGs (``packer.samples.make_image_folder``,
500x375) converted to two RAM blobs, 32x32 (batches of 8: the most batches per second, where a
per-batch cost would show most) and 224x224 (batches of 32). A measurement: reading whole epochs
for ``--seconds``; its figure is images/s. Each figure: median (min-max) over ``--rounds``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import readers.loader as loader_module
from readers.blob import RAMDataset
from readers.filling import BatchSource, FillingIterator

from .common import output_dir, run_main, save_json


def rate(path: Path, batch: int, seconds: float) -> float:
    loader = loader_module.Loader(RAMDataset(path), batch, buffers="recycle")
    images, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for batch_images, _labels in loader:
            images += len(batch_images)
    result = images / (time.perf_counter() - start)
    loader.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=240)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--update-results", action="store_true")
    args = parser.parse_args()
    import packer
    from packer.samples import make_image_folder

    shipped = (loader_module._ProfiledSource, loader_module._ProfiledIterator)
    plain = (BatchSource, FillingIterator)
    out: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="packer-ranges-") as tmp:
        src = make_image_folder(Path(tmp) / "images", classes=3, per_class=-(-args.images // 3), size=(375, 500))
        for size, batch in ((32, 8), (224, 32)):
            blob = Path(tmp) / f"{size}.blob"
            packer.convert(src, blob, image=packer.ImageOptions(size=size))
            figures: dict[str, list[float]] = {"with ranges (shipped)": [], "without": []}
            for k in range(args.rounds):
                for name in (("with ranges (shipped)", "without") if k % 2 == 0 else ("without", "with ranges (shipped)")):
                    loader_module._ProfiledSource, loader_module._ProfiledIterator = shipped if name.startswith("with ") else plain
                    figures[name].append(rate(blob, batch, args.seconds))
            loader_module._ProfiledSource, loader_module._ProfiledIterator = shipped
            out[f"{size}x{size} raw, batch {batch}"] = {
                name: {"median": statistics.median(v), "min": min(v), "max": max(v), "runs": v} for name, v in figures.items()
            }
            print(size, {n: f"{statistics.median(v):,.0f} ({min(v):,.0f}-{max(v):,.0f})" for n, v in figures.items()}, flush=True)
    record = {
        "compares": "readers.Loader images/s with its record_function stage classes (no profiler running) vs the plain classes",
        "cores": len(os.sched_getaffinity(0)),
        "results": out,
    }
    path = save_json("loader_ranges", record, output_dir(args.update_results))  # with its provenance: command, date, commit, machine
    print(f"wrote {path}")

if __name__ == "__main__":
    run_main(main)
