"""Before and after a change, side by side in one sitting: conversion and ``Loader`` rates of two
revisions, run in alternation (ABBA...), so that drift of the machine hits both alike.

    python -m benchmarks.before_after --base 822d505            # the base revision vs this tree
    python -m benchmarks.before_after --base 822d505 --images 500 --rounds 1   # a quick look

The base revision is checked out into a temporary git worktree; each measurement runs in a
fresh child process whose ``PYTHONPATH`` puts that tree's ``packer`` and ``readers`` first, so
both sides use the same Python, libraries and data:
* conversion: the suite's ImageNet-like JPEGs (``benchmarks.common.imagenet_like``; with
  ``--source presized`` the same images at 224x224 as BMP, nothing to decode or resize:
  ``benchmarks.common.presized``) to each format at 224x224 raw, with all usable cores,
  images/s of the whole ``convert`` call;
* ``Loader``: the same datasets (the on-disk formats are shared by both revisions, written
  once by this tree), batches of 256 with 2 threads, images/s over at least ``--seconds``
  after a warm-up pass, pages warm in the OS cache;
* ``cold`` (``--jobs cold``, root only: it drops the whole machine's page cache): the same
  ``Loader``'s first epoch (shuffled) right after the page cache was dropped, the dataset read
  from the disk.
Each figure is median (min-max) over ``--rounds`` runs per side; the ratio is after / before.
Results go to ``benchmarks/out/before_after.json`` (``--update-results``: benchmarks/results/).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from .common import OUT_DIR, RESULTS_DIR, cpu_count, imagenet_like, machine, markdown_table, presized, save_json, run_main

FORMATS = {"lmdb": ".lmdb", "hdf5": ".h5", "blob": ".blob", "webdataset": ".shards"}
REPO = Path(__file__).resolve().parent.parent

_CONVERT = """
import json, sys, time
from packer import ImageOptions, convert
from packer.parallel import keep_freed_memory
keep_freed_memory()
src, dst, fmt, workers = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
start = time.perf_counter()
report = convert(src, dst, format=fmt, image=ImageOptions(size=224), workers=workers)
print(json.dumps({"rate": report.written / (time.perf_counter() - start)}))
"""

_LOAD = """
import json, sys, time
from readers import Loader, open_dataset
path, seconds = sys.argv[1], float(sys.argv[2])
loader = Loader(open_dataset(path), batch_size=256, shuffle=True, threads=2)
for _ in loader:
    pass
images, start = 0, time.perf_counter()
while time.perf_counter() - start < seconds:
    for batch, _labels in loader:
        images += len(batch)
print(json.dumps({"rate": images / (time.perf_counter() - start)}))
"""

_COLD = """
import json, os, sys, time
from readers import Loader, open_dataset
path = sys.argv[1]
os.sync()
with open("/proc/sys/vm/drop_caches", "w") as caches:
    caches.write("3")
loader = Loader(open_dataset(path), batch_size=256, shuffle=True, threads=2)
images, start = 0, time.perf_counter()
for batch, _labels in loader:
    images += len(batch)
print(json.dumps({"rate": images / (time.perf_counter() - start)}))
"""


def child(tree: Path, code: str, *args: str) -> float:
    """Run ``code`` with ``tree``'s packer and readers first on the path; its reported rate."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, cwd=tree, capture_output=True, text=True, check=True)
    return float(json.loads(out.stdout.strip().splitlines()[-1])["rate"])


def summary(rates: list[float]) -> dict:
    return {"median": statistics.median(rates), "min": min(rates), "max": max(rates), "runs": rates}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="822d505", help="the revision to compare with (default: before the one-engine work)")
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2, help="runs per side, alternating")
    parser.add_argument("--seconds", type=float, default=3.0, help="shortest timed Loader pass")
    parser.add_argument("--formats", nargs="+", choices=list(FORMATS), default=list(FORMATS))
    parser.add_argument("--jobs", nargs="+", choices=["convert", "loader", "cold"], default=["convert", "loader"],
                        help="cold: the Loader's first epoch after dropping the page cache (root only)")
    parser.add_argument("--source", choices=["jpeg", "presized"], default="jpeg",
                        help="jpeg: ImageNet-like 500x375 JPEGs; presized: the same at 224x224 as BMP (nothing to decode or resize)")
    parser.add_argument("--tag", default="", help="suffix of the result file's name (before_after-TAG.json)")
    parser.add_argument("--update-results", action="store_true", help="write benchmarks/results/ instead of benchmarks/out/")
    args = parser.parse_args()
    if "cold" in args.jobs and (not hasattr(os, "geteuid") or os.geteuid() != 0 or not Path("/proc/sys/vm/drop_caches").exists()):
        parser.error("--jobs cold drops the machine's page cache: run it as root on Linux")

    src = imagenet_like(args.images) if args.source == "jpeg" else presized(args.images)
    workers = str(cpu_count())
    with tempfile.TemporaryDirectory() as tmp:
        base_tree = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(base_tree), args.base], check=True, capture_output=True)
        try:
            sides = {"before": base_tree, "after": REPO}
            results: dict = {"convert": {}, "loader": {}, "cold": {}}
            formats = {fmt: FORMATS[fmt] for fmt in args.formats}
            for fmt, suffix in formats.items():  # conversions (they also make the datasets the Loader reads)
                rates: dict[str, list[float]] = {"before": [], "after": []}
                for round_ in range(args.rounds):
                    for side, tree in in_turn(sides, round_):
                        dst = Path(tmp) / f"{side}{suffix}"
                        if dst.is_dir():
                            shutil.rmtree(dst)
                        else:
                            dst.unlink(missing_ok=True)
                        rates[side].append(child(tree, _CONVERT, str(src), str(dst), fmt, workers))
                if "convert" in args.jobs:
                    results["convert"][fmt] = {side: summary(r) for side, r in rates.items()}
                    print(f"convert {fmt}: {_line(results['convert'][fmt])}", flush=True)
            for job, code, extra in (("loader", _LOAD, [str(args.seconds)]), ("cold", _COLD, [])):
                for fmt, suffix in formats.items() if job in args.jobs else ():
                    dataset = Path(tmp) / f"after{suffix}"  # written by this tree above; both read it
                    rates = {"before": [], "after": []}
                    for round_ in range(args.rounds):
                        for side, tree in in_turn(sides, round_):
                            rates[side].append(child(tree, code, str(dataset), *extra))
                    results[job][fmt] = {side: summary(r) for side, r in rates.items()}
                    print(f"{job} {fmt}: {_line(results[job][fmt])}", flush=True)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base_tree)], check=False, capture_output=True)
    rows = [
        [job, fmt, figure(r["before"]), figure(r["after"]), f"{r['after']['median'] / r['before']['median']:.2f}"]
        for job in ("convert", "loader", "cold") for fmt, r in results[job].items()
    ]
    print(markdown_table(["job", "format", f"before ({args.base}) img/s", "after img/s", "after/before"], rows))
    payload = {
        "command": " ".join(["python -m benchmarks.before_after", *sys.argv[1:]]),
        "base": args.base,
        "head": subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
        "images": args.images,
        "source": args.source,
        "rounds": args.rounds,
        "machine": machine(),
        **results,
    }
    name = f"before_after-{args.tag}" if args.tag else "before_after"
    print(f"wrote {save_json(name, payload, RESULTS_DIR if args.update_results else OUT_DIR)}")


def in_turn(sides: dict[str, Path], round_: int) -> list[tuple[str, Path]]:
    """The sides in round ``round_``'s order: before first in even rounds, after first in odd
    ones (ABBA), so that whatever favours the second run of a round (a cold read after the host's
    own cache has the file) favours both alike."""
    order = list(sides.items())
    return order if round_ % 2 == 0 else order[::-1]


def figure(rate: dict) -> str:
    return f"{rate['median']:,.0f} ({rate['min']:,.0f}-{rate['max']:,.0f})"


def _line(result: dict) -> str:
    return f"before {figure(result['before'])}, after {figure(result['after'])} img/s"


if __name__ == "__main__":
    run_main(main)
