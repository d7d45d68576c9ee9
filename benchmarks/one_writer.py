"""How far one writing process carries a single-file format (LMDB, HDF5, blob) at scale.

    python -m benchmarks.one_writer                 # 3,000 raw 224x224x3 samples, 3 repeats
    python -m benchmarks.one_writer --samples 1000 --repeats 1
    python -m benchmarks.one_writer --transports pipe shm   # (b), (c): the pool's result transports, A/B
    python -m benchmarks.one_writer --samples 6000 --tag 16cores  # another machine's figures, one_writer-16cores.json

LMDB, HDF5 and the blob are written by one process (the driver) that receives every encoded
sample from the workers, local or on Ray. This measures that process's ceiling with the
decoding taken away, so the figure is what the driver could absorb from any number of workers:
(a) the writer alone: ``Writer.add`` + resume checkpoints + ``finish`` (the last ``fsync`` and
    the rename), samples already in memory;
(b) the pool alone: workers that hand over ready-made 150 KB samples through
    ``packer.parallel.ordered_map`` (shared memory or the pipe, see ``--transports``), nothing written;
(c) both: what a conversion with infinitely fast decoding would reach;
(d) the blob and HDF5 with the workers writing the samples themselves (``packer/placement.py``:
    what ``packer convert`` does for fixed-shape raw samples), the driver only booking them;
(e) the plain way to write the same bytes: one process ``write``s them all to one file, then
    ``fsync``s it (no writeback overlapped with the writing, no bookkeeping): a reference for
    the disk, which the writers beat where their checkpoints sync in the background.
Steady rates: each pass is timed from its first sample (a pool's start, ~0.3 s once per
conversion, is left out) to the finished output (its removal afterwards is left out too).
Divided by the measured per-core conversion rate, (c) says at how many worker cores the one
writer becomes the bound (docs/SCALING.md). Workers: 1 and all cores but one, so the driver
has a core of its own (null workers never wait on decoding: more would only steal the
driver's CPU, which real workers, busy decoding, do far less). Median (min-max) of
``--repeats`` rounds, each of which runs every row once, in turn, the order rotated by one row
each round (after one warm-up pass of each), so drift of the machine (its disk's write-back
above all) hits all rows alike; with
several ``--transports`` (``packer.parallel.TRANSPORTS``), rows (b) and (c) have one row per
transport, alternated the same way.
Each sample's payload is a bytes object of its own, as a real worker's is: one object shared by
all samples is pickled once per chunk (pickle's memo), which understates the pipe's cost ~16x.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from packer.parallel import TRANSPORTS, keep_freed_memory, ordered_map
from packer.preprocess.task import Encoded
from packer.writers import get_writer
from packer.files import remove_path
from readers.schema import Metadata

from .work_units import SHAPE, MakeSample
from .common import Rate, add_output_arguments, cpu_count, machine, markdown_table, output_dir, save_json, run_main

SUFFIX = {"lmdb": ".lmdb", "hdf5": ".h5", "blob": ".blob"}
CLASSES = tuple(f"class_{i}" for i in range(10))
#: Per-core conversion rate of ImageNet-like JPEGs to raw 224 on the 2-core dev VM
#: (benchmarks/RESULTS.md, `benchmarks.convert_rates`, LMDB with 1 worker).
PER_CORE = 416


def write_all(fmt: str, samples: Any, workdir: Path) -> tuple[int, float]:
    """Add every sample of ``samples`` to a ``fmt`` writer with a resume journal and finish the
    output, as a conversion does (:func:`fill`)."""
    return fill(get_writer(fmt)(workdir / f"out{SUFFIX[fmt]}", fingerprint={"benchmark": fmt}), samples)


def fill(writer: Any, samples: Any) -> tuple[int, float]:
    """Add every sample to ``writer``, taking its checkpoints, and finish the output (its last
    ``fsync`` and rename); then remove it. Returns ``(samples, seconds)``: from the first sample
    to the finished output (the removal, and a pool's start before its first sample, are left
    out: this is the steady rate)."""
    count, start = 0, None
    try:
        for sample in samples:
            if start is None:
                start = time.perf_counter()
            writer.add(sample)
            count += 1
            writer.progress(count, [])
        meta = Metadata(format=writer.format_name, count=count, channels=SHAPE[0], shape=writer.shape, classes=CLASSES, source="one_writer")
        writer.finish(meta)
        seconds = time.perf_counter() - (start or 0.0)
    finally:
        if not writer.finished:
            writer.abort()
        remove_path(writer.dst)
    return count, seconds


def placed(fmt: str, make: MakeSample, n: int, workers: int, workdir: Path) -> tuple[int, float]:
    """(d): as (c) for ``fmt``, with the workers writing the samples into the output at their
    places themselves (``packer/placement.py``, what ``packer convert`` does for fixed-shape raw
    samples) and the driver booking them; timed as :func:`fill` times it."""
    writer = get_writer(fmt)(workdir / f"placed{SUFFIX[fmt]}", fingerprint={"benchmark": "placed"})
    placement = writer.placement(SHAPE, 0, n)
    assert placement is not None
    with ordered_map(placement.task(make), placement.items(range(n), 0), workers=workers) as results:
        return fill(writer, results)


def disk_alone(samples: list[Encoded], workdir: Path) -> tuple[int, float]:
    """(e): the same payloads written to one new file with ``os.write``, then ``fsync``ed, nothing
    else (the file is removed afterwards, untimed)."""
    path = workdir / "disk.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        start = time.perf_counter()
        for sample in samples:
            os.write(fd, sample.payload)
        os.fsync(fd)
        seconds = time.perf_counter() - start
    finally:
        os.close(fd)
        path.unlink()
    return len(samples), seconds


def drain(results: Any) -> tuple[int, float]:
    """Take every result; ``(count, seconds)`` from the first one's arrival to the last's."""
    count, start = 0, None
    for _ in results:
        if start is None:
            start = time.perf_counter()
        count += 1
    return count, time.perf_counter() - (start or 0.0)


def measure_ab(passes: dict[str, Any], *, repeats: int) -> dict[str, Rate]:
    """Each of ``passes`` (name -> a pass returning ``(items, seconds)``) once as a warm-up, then
    ``repeats`` rounds of one timed pass each, in turn, the order rotated by one each round (so
    no row always follows the same one, and finds its write-back still going)."""
    for one_pass in passes.values():
        one_pass()
    runs: dict[str, list[float]] = {name: [] for name in passes}
    names = list(passes)
    for k in range(repeats):
        for name in names[k % len(names):] + names[: k % len(names)]:
            items, seconds = passes[name]()
            runs[name].append(items / seconds)
    return {name: Rate(min(r), statistics.median(r), max(r), len(r)) for name, r in runs.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--transports", nargs="+", choices=TRANSPORTS, default=["shm"],
                        help="the pool's result transports for (b) and (c), alternated pass by pass (default: shm)")
    parser.add_argument("--tag", help="save as one_writer-TAG.json (another machine's figures beside this one's)")
    add_output_arguments(parser)
    args = parser.parse_args(argv)
    keep_freed_memory()  # as `packer convert` does for its process
    n, make = args.samples, MakeSample()
    in_memory = [make(i) for i in range(n)]
    nbytes = len(make.payload)
    workers = sorted({1, max(1, cpu_count() - 1)})  # the driver keeps a core of its own, as it needs at scale
    rates: dict[str, Rate] = {}
    load_before = os.getloadavg()
    tag = (lambda t: f" [{t}]") if len(args.transports) > 1 else (lambda t: "")
    with tempfile.TemporaryDirectory(prefix="packer-one-writer-") as tmp:
        work = Path(tmp)

        def pool_only(k: int, transport: str) -> tuple[int, float]:
            with ordered_map(make, range(n), workers=k, transport=transport) as results:
                return drain(results)

        def pool_and_writer(fmt: str, k: int, transport: str) -> tuple[int, float]:
            with ordered_map(make, range(n), workers=k, transport=transport) as results:
                return write_all(fmt, results, work)

        passes: dict[str, Any] = {f"(a) {fmt} writer alone": (lambda fmt=fmt: write_all(fmt, in_memory, work)) for fmt in SUFFIX}
        passes["(e) the plain way: write all, then fsync"] = lambda: disk_alone(in_memory, work)
        for k in workers:
            for t in args.transports:
                passes[f"(b) pool alone, {k} workers{tag(t)}"] = lambda k=k, t=t: pool_only(k, t)
        for fmt in SUFFIX:
            for k in workers:
                for t in args.transports:
                    passes[f"(c) {fmt}: pool + writer, {k} workers{tag(t)}"] = lambda fmt=fmt, k=k, t=t: pool_and_writer(fmt, k, t)
        for fmt in ("blob", "hdf5"):
            for k in sorted({1, cpu_count()}):  # the driver only books: every core may write
                passes[f"(d) {fmt}: workers write the samples, {k} workers"] = lambda fmt=fmt, k=k: placed(fmt, make, n, k, work)
        rates.update(measure_ab(passes, repeats=args.repeats))  # every row once per round: drift hits all alike
    rows = [[name, str(r), f"{r.median * nbytes / 1e6:,.0f}", f"{r.median / PER_CORE:.0f}" if name.startswith("(c)") else ""]
            for name, r in rates.items()]
    load = {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in os.getloadavg()]}
    print(f"\n{n} samples of {'x'.join(map(str, SHAPE))} uint8 ({nbytes / 1e3:.0f} KB), {cpu_count()} cores, load average {load}\n")
    print(markdown_table(["what", "samples/s", "MB/s", f"cores at {PER_CORE} img/s/core to saturate"], rows))
    payload = {"machine": machine(), "samples": n, "sample_bytes": nbytes, "transports": args.transports, "load_average": load, "rates": rates}
    out = save_json("one_writer" + (f"-{args.tag}" if args.tag else ""), payload, output_dir(args.update_results, args.out))
    print(f"saved {out}")


if __name__ == "__main__":
    run_main(main)
