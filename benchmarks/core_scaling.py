"""Conversion against the work itself, by worker count: where a conversion stops scaling.

    python -m benchmarks.core_scaling                            # 1, 2, 4, ... all cores; 2,000 JPEGs, 3 rounds
    python -m benchmarks.core_scaling --workers 16 --images 9000 # a 16-core host
    python -m benchmarks.core_scaling --counts 4 8 16 --images 9000 --tag 16cores  # only these counts
    python -m benchmarks.core_scaling --images 60 --rounds 1     # CI-sized (tests/test_core_scaling.py)
    python -m benchmarks.core_scaling --source presized          # decoding nearly free: what moving samples costs
    python -m benchmarks.core_scaling --write-floor              # and (c): the work with its samples written, nothing more

For each worker count ``w`` in 1, 2, 4, ... up to ``--workers`` (and ``--workers`` itself), on
the same ImageNet-like 500x375 JPEGs (``benchmarks.common.imagenet_like``), converted to
224x224 raw:

(a) **the work alone**: packer's own work unit (``ImageTask``: read the file, decode, resize,
    encode) in ``w`` worker processes of packer's pool (``packer.parallel.ordered_map``), each
    sample dropped in the worker (only its size comes back): what ``w`` cores do when nothing
    is moved or written;
(b) **each format's conversion** (``packer.convert``) with ``w`` workers: the whole call, worker
    start-up, scan, publication and all, as (a) includes its pool's start-up;
(c) **the work and write** (``--write-floor``): (a) with each sample then written by its worker
    into one file allocated beforehand, at its place, with one ``pwrite`` and nothing else (no
    journal, checkpoint or write-out as it goes; one ``fsync`` at the end, as a conversion
    returns once its output is on disk). It is not a conversion (nothing could resume or read
    it) but the plain way of writing the same bytes: what a straightforward writer pays for
    them on this machine. A conversion whose writers write behind and drop what is on disk
    (the blob's and HDF5's workers) can keep more than it, since (c) leaves every dirty page to
    the final ``fsync``, cores idle.

Each run also records the machine's CPU account (Linux ``/proc/stat``, the whole machine: run it
on a quiet one), as milliseconds of a core per image: ``user`` (user and nice), ``system``
(system, irq, softirq), ``idle`` (idle and iowait). On a machine whose cores the work fills,
the three say where a conversion's time beyond the work's goes: its own computing (checksums,
the driver), the kernel (copying samples into files, writeback) or cores left waiting.

Rounds alternate (a) and the formats at every ``w``, so machine drift hits all alike. Each
figure is images/s, median (min-max) over ``--rounds``; ``share`` is (b)/(a) per round, median
(min-max): how much of the work's own rate a conversion keeps. Where the share falls as ``w``
grows, something other than the work (one writing process, the pipe, the disk) is the bound.
Issue 16's target is a share of at least 85% for every format at 16 workers.

``--source presized``: the same images at 224x224 as BMP (``benchmarks.common.presized``), so the
work is a read and a nearly free decode, no resize: the share then says how much of a fast
source's rate the conversion's moving and writing of samples keeps (issue 16's budget: at least
a third for the blob and HDF5, 30% for LMDB, at 2 workers on the 2-core VM).
Results: ``benchmarks/out/core_scaling.json`` (``core_scaling-presized.json``; ``--update-results``:
benchmarks/results/).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from packer import ImageOptions, StorageOptions, convert
from packer.parallel import keep_freed_memory, ordered_map
from packer.preprocess.task import ImageTask
from packer.sources.images import scan_image_folder
from packer.files import remove_path

from .work_units import Dropped, WrittenAlone
from .common import add_output_arguments, cpu_count, imagenet_like, machine, markdown_table, output_dir, presized, save_json, run_main

FORMATS = {"lmdb": ".lmdb", "hdf5": ".h5", "blob": ".blob", "webdataset": ".shards"}
SIZE = 224


def worker_counts(most: int) -> list[int]:
    """1, 2, 4, ... below ``most``, and ``most``."""
    counts, w = [], 1
    while w < most:
        counts.append(w)
        w *= 2
    return counts + [most]


def work_alone(src: Path, workers: int) -> float:
    """(a): images/s of the work unit over every image of ``src`` in ``workers`` processes."""
    task = ImageTask(ImageOptions(size=SIZE))
    start = time.perf_counter()
    items = scan_image_folder(src).items
    with ordered_map(Dropped(task), items, workers=workers) as results:
        done = sum(1 for size in results if size >= 0)
    return done / (time.perf_counter() - start)


def work_and_write(src: Path, out: Path, workers: int) -> float:
    """(c): images/s of the work unit over every image of ``src`` in ``workers`` processes, each
    sample written at its place in ``out`` (allocated first) and nothing more; synced at the end."""
    task = ImageTask(ImageOptions(size=SIZE))
    nbytes = 3 * SIZE * SIZE
    start = time.perf_counter()
    items = scan_image_folder(src).items
    fd = os.open(out, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.posix_fallocate(fd, 0, max(1, len(items) * nbytes))  # as the blob allocates its samples' places
        with ordered_map(WrittenAlone(task, str(out), nbytes), list(enumerate(items)), workers=workers) as results:
            done = sum(1 for size in results if size >= 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    return done / (time.perf_counter() - start)


def conversion(src: Path, dst: Path, fmt: str, workers: int, shard_size: int) -> float:
    """(b): images/s of a whole ``packer.convert`` of ``src`` to ``fmt`` with ``workers`` workers."""
    remove_path(dst)  # (an earlier run's: a large file's unlink takes a tenth of a second or more)
    storage = StorageOptions(shard_size=shard_size) if fmt == "webdataset" else None
    start = time.perf_counter()
    report = convert(src, dst, format=fmt, image=ImageOptions(size=SIZE), storage=storage, workers=workers)
    return report.written / (time.perf_counter() - start)


#: (c)'s name in the rates, the CPU account and the table.
FLOOR = "work and write"

#: /proc/stat's first line: user nice system idle iowait irq softirq steal, in clock ticks.
ACCOUNT = {"user": (0, 1), "system": (2, 5, 6), "idle": (3, 4)}


def cpu_ticks() -> list[int] | None:
    """The machine's CPU time so far, per /proc/stat field (None where there is no /proc/stat)."""
    try:
        with open("/proc/stat") as stat:
            return [int(x) for x in stat.readline().split()[1:9]]
    except (OSError, ValueError):
        return None


def cpu_per_image(before: list[int] | None, images: int) -> dict[str, float] | None:
    """Milliseconds of a core per image in each part of :data:`ACCOUNT` since ``before``."""
    after = cpu_ticks()
    if before is None or after is None or images <= 0:
        return None
    tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
    return {part: sum(after[i] - before[i] for i in fields) * tick_ms / images for part, fields in ACCOUNT.items()}


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": values}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, help="the largest worker count (default: the usable cores)")
    parser.add_argument("--counts", type=int, nargs="+", metavar="W",
                        help="measure these worker counts only (default: 1, 2, 4, ... --workers)")
    parser.add_argument("--images", type=int, default=2000, help="ImageNet-like JPEGs (default 2,000)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    parser.add_argument("--formats", nargs="+", choices=list(FORMATS), default=list(FORMATS))
    parser.add_argument("--shard-size", type=int, default=1000, help="WebDataset samples per shard (default 1,000)")
    parser.add_argument("--source", choices=["jpeg", "presized"], default="jpeg",
                        help="jpeg: ImageNet-like 500x375 JPEGs; presized: the same at 224x224 as BMP (nothing to decode or resize)")
    parser.add_argument("--write-floor", action="store_true",
                        help="also (c): the work with each sample written at its place in one file and nothing more")
    parser.add_argument("--tag", help="save as core_scaling[-presized]-TAG.json (another machine's figures beside this one's)")
    add_output_arguments(parser)
    args = parser.parse_args(argv)
    src = imagenet_like(args.images) if args.source == "jpeg" else presized(args.images)
    images = len(scan_image_folder(src).items)
    if args.counts and args.workers:
        parser.error("--counts names every worker count to measure: drop --workers")
    counts = sorted(set(args.counts)) if args.counts else worker_counts(args.workers or cpu_count())
    if min(counts) < 1:
        parser.error("--counts: worker counts are 1 or more")
    floor = [FLOOR] if args.write_floor else []
    rates: dict[str, dict[int, list[float]]] = {name: {w: [] for w in counts} for name in ["work alone", *floor, *args.formats]}
    floor_shares: dict[int, list[float]] = {w: [] for w in counts}
    shares: dict[str, dict[int, list[float]]] = {fmt: {w: [] for w in counts} for fmt in args.formats}
    cpu: dict[str, dict[int, list[dict[str, float]]]] = {name: {w: [] for w in counts} for name in rates}

    def timed(name: str, w: int, run) -> float:
        before = cpu_ticks()
        rate = run()
        account = cpu_per_image(before, images)
        if account is not None:
            cpu[name][w].append(account)
        rates[name][w].append(rate)
        return rate

    with tempfile.TemporaryDirectory(prefix="packer-core-scaling-") as tmp:
        conversion(src, Path(tmp) / "warm.lmdb", "lmdb", max(counts), args.shard_size)  # imports, fork server, page cache
        for _ in range(args.rounds):
            for w in counts:
                alone = timed("work alone", w, lambda: work_alone(src, w))
                if args.write_floor:
                    written = Path(tmp) / "floor.bin"
                    remove_path(written)
                    floor_shares[w].append(timed(FLOOR, w, lambda: work_and_write(src, written, w)) / alone)
                for fmt in args.formats:
                    out = Path(tmp) / f"out{FORMATS[fmt]}"
                    remove_path(out)  # (before the clock and the CPU account start)
                    rate = timed(fmt, w, lambda: conversion(src, out, fmt, w, args.shard_size))
                    shares[fmt][w].append(rate / alone)
                print(f"{w} workers: work alone {alone:,.0f} img/s; "
                      + ", ".join(f"{name} {rates[name][w][-1]:,.0f}" for name in [*floor, *args.formats]), flush=True)
    result = {
        "machine": machine(),
        "images": images,
        "source": args.source,
        "size": SIZE,
        "rounds": args.rounds,
        "shard_size": args.shard_size,
        "worker_counts": counts,
        "rates": {name: {str(w): summary(v) for w, v in by_w.items()} for name, by_w in rates.items()},
        "shares": {fmt: {str(w): summary(v) for w, v in by_w.items()} for fmt, by_w in shares.items()},
    }
    if args.write_floor:  # apart from "shares", whose keys are the formats (the targets table reads them)
        result["write_floor_shares"] = {str(w): summary(v) for w, v in floor_shares.items()}
    if all(runs for by_w in cpu.values() for runs in by_w.values()):
        result["cpu_ms_per_image"] = {
            name: {str(w): {part: statistics.median(run[part] for run in runs) for part in ACCOUNT} for w, runs in by_w.items()}
            for name, by_w in cpu.items()
        }
    print()
    print(render(result))
    name = "core_scaling" if args.source == "jpeg" else "core_scaling-presized"
    name += f"-{args.tag}" if args.tag else ""
    print(f"\nsaved {save_json(name, result, output_dir(args.update_results, args.out))}")


def render(result: dict) -> str:
    """The table: per worker count, the work's rate and each format's rate and share of it."""
    def fig(r: dict, percent: bool = False) -> str:
        if percent:
            return f"{r['median']:.0%} ({r['min']:.0%}-{r['max']:.0%})"
        return f"{r['median']:,.0f} ({r['min']:,.0f}-{r['max']:,.0f})"

    formats = list(result["shares"])
    floor = result.get("write_floor_shares")
    shares = dict(result["shares"], **({FLOOR: floor} if floor else {}))
    columns = [FLOOR] * bool(floor) + formats
    rows = [[w, fig(result["rates"]["work alone"][w])] + [f"{fig(result['rates'][c][w])}: {fig(shares[c][w], True)}" for c in columns]
            for w in map(str, result["worker_counts"])]
    what = "ImageNet-like JPEGs" if result.get("source", "jpeg") == "jpeg" else f"ImageNet-like images presized to {result['size']}x{result['size']} BMPs"
    head = (f"{result['images']:,} {what} to {result['size']}x{result['size']} raw, images/s median (min-max) of "
            f"{result['rounds']} round(s); each format" + (f" and the {FLOOR} (its samples written the plain way: a pwrite each, one fsync at the end)" if floor else "")
            + ": its rate, then its share of the work alone:")
    table = head + "\n\n" + markdown_table(["workers", "work alone"] + columns, rows)
    account = result.get("cpu_ms_per_image")
    if not account:
        return table
    names = ["work alone"] + columns
    cpu_rows = [[w] + ["/".join(f"{account[n][w][part]:.2f}" for part in ACCOUNT) for n in names] for w in map(str, result["worker_counts"])]
    return (table + "\n\nThe machine's CPU per image, milliseconds of a core (median of the rounds): "
            "user / system / idle (`/proc/stat`):\n\n" + markdown_table(["workers"] + names, cpu_rows))


if __name__ == "__main__":
    keep_freed_memory()  # as `packer convert` does for its own process (process-wide: not when a test calls main)
    run_main(main)
