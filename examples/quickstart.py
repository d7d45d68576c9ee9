"""packer in about a minute: ImageNet-sized JPEGs, packed once, read back, timed side by side.

    python examples/quickstart.py                # in a temporary folder, removed at the end
    python examples/quickstart.py --keep DIR     # keep the JPEG folder and the LMDB in DIR

1. Generates 200 (``--images``) natural-looking 500x375 JPEGs (q90, ~100 KB each; nothing is
   downloaded) in 10 class folders.
2. Converts them with the standard evaluation crop, torchvision's ``Resize(256)`` +
   ``CenterCrop(224)`` (``packer convert SRC DST --size 224 --resize 256``), to LMDB.
3. Times, in alternating rounds, the same uint8 (N, 3, 224, 224) batches delivered by
   (a) the usual per-file pipeline: PIL open + Resize(256) + CenterCrop(224) + uint8 tensor in a
       ``DataLoader``, at its best ``num_workers`` on this machine (0 to the core count, tried first);
   (b) ``readers.Loader`` over the packed LMDB.
   Neither side converts to float or normalises: that is the GPU's job (``readers.Normalize``)
   whichever way the batch arrives. Prints images/s median (min-max) of each and the ratio
   round by round, median (min-max).

The figures are this machine's, now: a machine busy with other work gives wider spreads.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from torch.utils.data import DataLoader

import packer
from packer.bench_timing import UsualFolder  # the usual pipeline, shared with `packer bench`
from packer.samples import make_image_folder
from packer.sources.images import scan_image_folder
from readers import LMDBDataset, Loader

SIZE, RESIZE, BATCH = 224, 256, 64


def one_pass(loader, seconds: float) -> float:
    """Images/s of ``loader`` over ``seconds`` (epochs repeated; a slow one stops mid-epoch)."""
    start, done = time.perf_counter(), 0
    while True:
        for images, _labels in loader:
            done += len(images)
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                return done / elapsed


def warm(loader, batches: int = 2) -> None:
    """Start the workers or threads and touch the data before timing."""
    for i, _batch in enumerate(loader):
        if i + 1 >= batches:
            break


def spread(values: list[float], fmt: str = ",.0f") -> str:
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def run(workdir: Path, images: int, rounds: int, seconds: float) -> None:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    start = time.perf_counter()
    src = make_image_folder(workdir / "images", classes=10, per_class=max(1, images // 10), size=(375, 500), quality=90, seed=0,
                            workers=cores)
    files = sorted(src.rglob("*.jpg"))
    print(f"1. {len(files)} JPEGs of 500x375 ({sum(f.stat().st_size for f in files) / len(files) / 1e3:.0f} KB each) in {src} "
          f"({time.perf_counter() - start:.1f} s)")

    dst = workdir / "images.lmdb"
    report = packer.convert(src, dst, image=packer.ImageOptions(size=SIZE, resize=RESIZE), overwrite=True)
    print(f"2. packer convert {src} {dst} --size {SIZE} --resize {RESIZE}\n   {report.summary()}")

    items = [(item.path, item.label) for item in scan_image_folder(src).items]  # the order packer converted them in
    usual = UsualFolder(items, (SIZE, SIZE), RESIZE)
    packed = LMDBDataset(dst)
    sample = range(0, len(items), max(1, len(items) // 8))
    diff = np.mean([np.abs(usual[i][0].numpy().astype(int) - packed[i][0].numpy().astype(int)).mean() for i in sample])
    print(f"   same pictures: mean |difference| {diff:.1f} of 255 between the two pipelines' uint8 pixels "
          "(same geometry; OpenCV's vs PIL's antialiasing)")

    # (a) the usual pipeline at its best num_workers here: one timed pass each, after a warm-up
    settings = sorted({0, *range(1, cores + 1)})
    tried = {}
    for workers in settings:
        loader = DataLoader(usual, batch_size=BATCH, shuffle=True, num_workers=workers, persistent_workers=workers > 0)
        warm(loader)
        tried[workers] = one_pass(loader, seconds)
        del loader
    best = max(tried, key=tried.get)
    print("3. the usual pipeline, images/s by num_workers: " + ", ".join(f"{w}: {r:,.0f}" for w, r in tried.items()) + f" -> {best}")
    baseline = DataLoader(usual, batch_size=BATCH, shuffle=True, num_workers=best, persistent_workers=best > 0)
    fast = Loader(packed, batch_size=BATCH, shuffle=True)
    warm(baseline), warm(fast)

    slow_rates, fast_rates = [], []
    for _ in range(rounds):  # alternating, so a change in the machine's load hits both sides
        slow_rates.append(one_pass(baseline, seconds))
        fast_rates.append(one_pass(fast, seconds))
    ratios = [f / s for f, s in zip(fast_rates, slow_rates)]
    load = " ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    print(f"4. {rounds} alternating rounds on this machine ({cores} cores, load average {load}), "
          f"the same uint8 ({min(BATCH, len(packed))}, 3, {SIZE}, {SIZE}) batches, images/s median (min-max):")
    a = f"(a) per-file: PIL open + Resize({RESIZE}) + CenterCrop({SIZE}), DataLoader(num_workers={best}):"
    b = "(b) packed:   readers.Loader over the LMDB (no decode, no resize):"
    print(f"   {a:<80} {spread(slow_rates):>22}\n   {b:<80} {spread(fast_rates):>22}")
    print(f"   packed / per-file, round by round: {spread(ratios, '.1f')}x  (total {time.perf_counter() - start:.0f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep", type=Path, help="work in this folder and keep the results")
    parser.add_argument("--images", type=int, default=200, help="JPEGs to generate, a multiple of 10 (default 200)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating timed rounds (default 5)")
    parser.add_argument("--seconds", type=float, default=1.5, help="shortest timed pass (default 1.5)")
    args = parser.parse_args()
    if args.images < 10 or args.images % 10 or args.rounds < 1 or args.seconds <= 0:  # (48 made 40 without a word)
        parser.error("--images must be a multiple of 10 (10 classes), --rounds at least 1, --seconds positive")
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        run(args.keep, args.images, args.rounds, args.seconds)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            run(Path(tmp), args.images, args.rounds, args.seconds)


if __name__ == "__main__":
    main()
