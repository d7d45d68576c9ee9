"""Conversion images/s: packer (each format, 1 and all workers) vs the naive PIL loop, one run.

Uses the suite's generated data (``python -m benchmarks.run`` makes it; 3,000 ImageNet-like
JPEGs) and writes to a throwaway folder. Run it on a quiet machine: conversion shares the cores
with everything else.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable

from packer import ImageOptions, convert
from packer.parallel import keep_freed_memory

from .baselines import naive_convert, remove
from .common import Rate, add_output_arguments, cpu_count, imagenet_like, output_dir, save_json, run_main

SUFFIX = {"lmdb": ".lmdb", "webdataset": ".shards", "blob": ".blob", "hdf5": ".h5"}


def rate(one_run: Callable[[], object], images: int, repeats: int) -> Rate:
    """images/s of ``repeats`` whole runs."""
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        one_run()
        rates.append(images / (time.perf_counter() - start))
    return Rate(min(rates), statistics.median(rates), max(rates), len(rates))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--note", default="", help="recorded in the JSON (e.g. who else shared the machine)")
    add_output_arguments(parser)
    args = parser.parse_args()
    keep_freed_memory()  # as the packer command does for its own process
    src = imagenet_like(args.images)
    cores = cpu_count()
    with tempfile.TemporaryDirectory() as tmp:
        naive = Path(tmp) / "naive.lmdb"

        def naive_run() -> None:
            remove(naive)
            naive_convert(src, naive, cores)

        rows = [{"tool": "naive PIL loop -> LMDB", "workers": cores, "rate": rate(naive_run, args.images, args.repeats)}]
        print(f"| tool | workers | images/s median (min-max) |\n|---|---|---|\n| naive PIL loop -> LMDB | {cores} | {rows[0]['rate']} |", flush=True)
        for fmt, suffix in SUFFIX.items():
            dst = Path(tmp) / f"out{suffix}"
            for workers in sorted({1, cores}):
                figure = rate(
                    lambda: convert(src, dst, format=fmt, image=ImageOptions(size=224), workers=workers, overwrite=True),
                    args.images,
                    args.repeats,
                )
                rows.append({"tool": f"packer {fmt}", "workers": workers, "rate": figure})
                print(f"| packer {fmt} (raw) | {workers} | {figure} |", flush=True)
    payload = {"benchmark": "convert_rates", "images": args.images, "size": 224, "encoding": "raw", "repeats": args.repeats,
               "cores": cores, "note": args.note, "rows": rows}
    print("saved", save_json("convert_rates", payload, output_dir(args.update_results, args.out)))


if __name__ == "__main__":
    run_main(main)
