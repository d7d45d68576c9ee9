"""What checking each sample's stored checksum on read (``verify=True``) costs, per format.

    python -m benchmarks.verify_cost                      # 512 samples of 224x224x3, raw and jpeg
    python -m benchmarks.verify_cost --update-results     # the committed figures (docs/RELIABILITY.md)

Side by side, in one run, every page warm in the OS cache: for each format (LMDB, HDF5, RAM
blob, WebDataset shards) and storage (raw 224x224x3, JPEG-encoded), images per second with
``verify=False`` and ``verify=True`` through

* ``readers.Loader`` (whole batches of 256 through the format's fast fill, default threads), and
* plain per-sample reads (``dataset[i]`` in a shuffled order, one thread).

Off and on are timed in alternating passes (off, on, off, on, ...) so that load from other
processes falls on both; the cost is the median over pairs of ``1 - on / off``. Figures are
median (min-max) images/s over the timed passes. The default ``verify=None`` (checks jpeg/png,
not raw) was chosen from these figures: see docs/RELIABILITY.md, "Checksums and packer verify".
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Callable

import numpy as np

from .common import Rate, add_output_arguments, cpu_count, machine, markdown_table, output_dir, save_json, run_main

SIZE = 224
BATCH = 256
FORMATS = {"lmdb": ".lmdb", "hdf5": ".h5", "blob": ".blob", "webdataset": ".shards"}
ENCODINGS = ("raw", "jpeg")


def make_data(workdir: Path, images: int) -> dict[tuple[str, str], Path]:
    """``images`` 224x224 JPEGs converted to every format, raw and jpeg (made once, reused)."""
    from packer import ImageOptions, StorageOptions, convert
    from packer.samples import make_image_folder
    from readers.formats import open_store
    from readers.schema import PackedFormatError

    src = make_image_folder(workdir / f"src-{images}", classes=8, per_class=max(1, images // 8), size=(SIZE, SIZE), workers=cpu_count())
    paths = {}
    for fmt, suffix in FORMATS.items():
        for encoding in ENCODINGS:
            dst = workdir / f"{encoding}-{images}{suffix}"
            try:
                open_store(dst)
            except (FileNotFoundError, PackedFormatError):
                storage = StorageOptions(shard_size=128) if fmt == "webdataset" else None
                image = ImageOptions(size=SIZE, encoding=encoding)
                convert(src, dst, format=fmt, image=image, storage=storage, workers=cpu_count(), overwrite=True)
            paths[fmt, encoding] = dst
    return paths


def paired(passes: dict[bool, Callable[[], int]], repeats: int) -> tuple[dict[bool, Rate], list[float]]:
    """Time ``passes[False]`` and ``passes[True]`` alternately (after one warm-up each):
    the rate of each, and ``1 - on / off`` of every pair."""
    for verify in (False, True):
        passes[verify]()
    rates: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(repeats):
        for verify in (False, True):
            start = time.perf_counter()
            items = passes[verify]()
            rates[verify].append(items / (time.perf_counter() - start))
    costs = [1 - on / off for off, on in zip(rates[False], rates[True])]
    return {v: Rate(min(r), statistics.median(r), max(r), len(r)) for v, r in rates.items()}, costs


def loader_pass(path: Path, verify: bool, seconds: float) -> Callable[[], int]:
    import readers

    loader = readers.Loader(readers.open_dataset(path, verify=verify), batch_size=BATCH, shuffle=True)

    def one_pass() -> int:
        start, images = time.perf_counter(), 0
        while time.perf_counter() - start < seconds:
            for batch, _labels in loader:
                images += len(batch)
        return images

    return one_pass


def sample_pass(path: Path, verify: bool, seconds: float) -> Callable[[], int]:
    import readers

    dataset = readers.open_dataset(path, verify=verify)
    order = np.random.default_rng(0).permutation(len(dataset)).tolist()

    def one_pass() -> int:
        start, images = time.perf_counter(), 0
        while time.perf_counter() - start < seconds:
            for i in order:
                dataset[i]
                images += 1
                if images % 64 == 0 and time.perf_counter() - start >= seconds:
                    return images
        return images

    return one_pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=512, help="samples per dataset (default 512)")
    parser.add_argument("--seconds", type=float, default=0.5, help="length of one timed pass (default 0.5)")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per setting (default 3)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/packer-verify-cost"), help="where the datasets are made (once)")
    add_output_arguments(parser)
    args = parser.parse_args()

    paths = make_data(args.workdir, args.images)
    rows, results = [], []
    for (fmt, encoding), path in paths.items():
        for reader, make in (("Loader", loader_pass), ("per sample", sample_pass)):
            rates, costs = paired({v: make(path, v, args.seconds) for v in (False, True)}, args.repeats)
            cost = statistics.median(costs)
            results.append({"format": fmt, "encoding": encoding, "reader": reader, "off": rates[False], "on": rates[True],
                            "cost": cost, "pair_costs": costs})
            rows.append((fmt, encoding, reader, str(rates[False]), str(rates[True]), f"{100 * cost:.1f}% ({100 * min(costs):.1f} to {100 * max(costs):.1f})"))
            print(" | ".join(rows[-1]), flush=True)
    table = markdown_table(["format", "storage", "reader", "verify off (img/s)", "verify on (img/s)", "cost: median (min to max) over pairs"], rows)
    print(table)
    command = "python -m benchmarks.verify_cost " + " ".join(f"--{k} {v}" for k, v in (("images", args.images), ("seconds", args.seconds), ("repeats", args.repeats)))
    payload = {"benchmark": "verify_cost", "command": command, "date": time.strftime("%Y-%m-%d"), "machine": machine(),
               "images": args.images, "size": SIZE, "batch": BATCH, "results": results, "table": table}
    print(f"wrote {save_json('verify_cost', payload, output_dir(args.update_results, args.out))}")


if __name__ == "__main__":
    run_main(main)
