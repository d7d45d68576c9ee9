"""How far one writing process carries a single-file format (LMDB, HDF5, blob) at scale.

    python -m benchmarks.one_writer                 # 3,000 raw 224x224x3 samples, 3 repeats
    python -m benchmarks.one_writer --samples 1000 --repeats 1

LMDB, HDF5 and the blob are written by one process (the driver) that receives every encoded
sample from the workers, local or on Ray. This measures that process's ceiling with the
decoding taken away, so the figure is what the driver could absorb from any number of workers:
(a) the writer alone: ``Writer.add`` + resume checkpoints, samples already in memory;
(b) the pool alone: workers that hand over ready-made 150 KB samples through
    ``packer.parallel.ordered_map`` (pipe + unpickle in the driver), nothing written;
(c) both: what a conversion with infinitely fast decoding would reach.
Divided by the measured per-core conversion rate, (c) says at how many worker cores the one
writer becomes the bound (docs/SCALING.md). Workers: 1 and all cores but one, so the driver
has a core of its own (null workers never wait on decoding: more would only steal the
driver's CPU, which real workers, busy decoding, do far less). Median (min-max) of
``--repeats`` passes.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from packer.parallel import keep_freed_memory, ordered_map
from packer.preprocess.task import Encoded
from packer.writers import get_writer

from .common import Rate, add_output_arguments, cpu_count, machine, markdown_table, measure, output_dir, save_json

SHAPE = (3, 224, 224)
SUFFIX = {"lmdb": ".lmdb", "hdf5": ".h5", "blob": ".blob"}
#: Per-core conversion rate of ImageNet-like JPEGs to raw 224 on the 2-core dev VM
#: (benchmarks/RESULTS.md, `benchmarks.convert_rates`, LMDB with 1 worker).
PER_CORE = 416


class MakeSample:
    """A worker task that returns a ready 150 KB sample (no decoding: only the hand-over costs)."""

    def __init__(self) -> None:
        self.payload = np.random.default_rng(0).integers(0, 256, int(np.prod(SHAPE)), dtype=np.uint8).tobytes()

    def __call__(self, index: int) -> Encoded:
        return Encoded(index % 10, SHAPE, self.payload)


def write_all(fmt: str, samples: Any, workdir: Path) -> int:
    """Add every sample of ``samples`` to a ``fmt`` writer with a resume journal; then drop it."""
    writer = get_writer(fmt)(workdir / f"out{SUFFIX[fmt]}", fingerprint={"benchmark": fmt})
    count = 0
    try:
        for sample in samples:
            writer.add(sample)
            count += 1
            writer.progress(count, [])
    finally:
        writer.abort()
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    add_output_arguments(parser)
    args = parser.parse_args()
    keep_freed_memory()  # as `packer convert` does for its process
    n, make = args.samples, MakeSample()
    in_memory = [make(i) for i in range(n)]
    nbytes = len(make.payload)
    workers = sorted({1, max(1, cpu_count() - 1)})  # the driver keeps a core of its own, as it needs at scale
    rates: dict[str, Rate] = {}
    with tempfile.TemporaryDirectory(prefix="packer-one-writer-") as tmp:
        for fmt in SUFFIX:
            rates[f"(a) {fmt} writer alone"] = measure(lambda: write_all(fmt, in_memory, Path(tmp)), repeats=args.repeats)

        def pool_only(k: int) -> int:
            with ordered_map(make, range(n), workers=k) as results:
                return sum(1 for _ in results)

        for k in workers:
            rates[f"(b) pool alone, {k} workers"] = measure(lambda: pool_only(k), repeats=args.repeats)

        def pool_and_writer(fmt: str, k: int) -> int:
            with ordered_map(make, range(n), workers=k) as results:
                return write_all(fmt, results, Path(tmp))

        for fmt in SUFFIX:
            for k in workers:
                rates[f"(c) {fmt}: pool + writer, {k} workers"] = measure(lambda: pool_and_writer(fmt, k), repeats=args.repeats)
    rows = [[name, str(r), f"{r.median * nbytes / 1e6:,.0f}", f"{r.median / PER_CORE:.0f}" if name.startswith("(c)") else ""]
            for name, r in rates.items()]
    print(f"\n{n} samples of {'x'.join(map(str, SHAPE))} uint8 ({nbytes / 1e3:.0f} KB), {cpu_count()} cores\n")
    print(markdown_table(["what", "samples/s", "MB/s", f"cores at {PER_CORE} img/s/core to saturate"], rows))
    out = save_json("one_writer", {"machine": machine(), "samples": n, "sample_bytes": nbytes, "rates": rates}, output_dir(args.update_results, args.out))
    print(f"saved {out}")


if __name__ == "__main__":
    main()
