"""Conversion speed, and reading a packed LMDB vs reading the raw folder, side by side.

    python -m benchmarks.convert_and_read            # 2,000 ImageNet-like JPEGs (made once)
    python -m benchmarks.convert_and_read --images 500 --repeats 2

(a) conversion images/s: packer with 1 worker and all cores, and the straightforward
    PIL-decode-resize-write loop on all cores;
(b) reading through a torch DataLoader (batch 64) at num_workers 0 and all cores: the tutorial
    raw-folder pipeline (PIL, resize 256, centre crop 224, float normalise on the CPU) vs the
    LMDB as uint8 batches ready for the GPU. Each pipeline is compared at its best setting.
Pages are warm in the OS cache for both sides (the folder is read once before timing).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from torch.utils.data import DataLoader

from packer import ImageOptions, convert
from packer.bench import timed_pass

from .baselines import TutorialFolder, naive_convert, remove
from .common import Rate, cpu_count, folder_stats, imagenet_like, machine, markdown_table, measure, save_json, run_main

BATCH = 64


def loader(dataset, workers: int) -> DataLoader:
    return DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=workers, persistent_workers=workers > 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0, help="minimum length of one read pass")
    args = parser.parse_args()
    cores = cpu_count()
    src = imagenet_like(args.images)
    files, nbytes = folder_stats(src)
    print(f"data: {src} ({files:,} JPEGs, {nbytes / files / 1e3:.0f} KB each)")
    results: dict = {"machine": machine(), "images": files, "mean_file_kb": nbytes / files / 1e3, "convert": {}, "read": {}}

    with tempfile.TemporaryDirectory(dir=src.parent) as tmp:
        dst = Path(tmp) / "bench.lmdb"
        options = ImageOptions(size=224)

        def packer_pass(workers: int):
            def run() -> int:
                return convert(src, dst, image=options, workers=workers, overwrite=True).written

            return run

        def naive_pass() -> int:
            target = Path(tmp) / "naive.lmdb"
            remove(target)
            return naive_convert(src, target, cores)

        conv = {
            "packer, 1 worker": measure(packer_pass(1), repeats=args.repeats, warmup=0),
            f"packer, {cores} workers": measure(packer_pass(cores), repeats=args.repeats, warmup=0),
            f"naive PIL loop, {cores} workers": measure(naive_pass, repeats=args.repeats, warmup=0),
        }
        results["convert"] = conv
        convert(src, dst, image=options, workers=cores, overwrite=True)

        from readers import LMDBDataset

        reads: dict[str, dict[int, Rate]] = {"raw folder (tutorial)": {}, "LMDB uint8": {}}
        for workers in sorted({0, cores}):
            reads["raw folder (tutorial)"][workers] = measure(timed_pass(loader(TutorialFolder(src), workers), args.seconds), repeats=args.repeats)
            reads["LMDB uint8"][workers] = measure(timed_pass(loader(LMDBDataset(dst), workers), args.seconds), repeats=args.repeats)
        results["read"] = {name: {str(k): v for k, v in by.items()} for name, by in reads.items()}

    one, many, naive = conv.values()
    print("\nConversion, images/s: median (min-max) over", args.repeats, "runs")
    print(markdown_table(["pipeline", "images/s"], [(name, rate) for name, rate in conv.items()]))
    print(f"\n{cores} workers vs 1: {many.median / one.median:.2f}x; packer vs naive loop: {many.median / naive.median:.2f}x")

    print(f"\nReading through DataLoader(batch_size={BATCH}), images/s: median (min-max)")
    print(markdown_table(["pipeline"] + [f"num_workers={w}" for w in sorted({0, cores})] + ["best"], [
        [name] + [by[w] for w in sorted(by)] + [f"{max(r.median for r in by.values()):,.0f}"] for name, by in reads.items()
    ]))
    best_raw = max(r.median for r in reads["raw folder (tutorial)"].values())
    best_lmdb = max(r.median for r in reads["LMDB uint8"].values())
    print(f"\nLMDB vs raw folder, each at its best setting: {best_lmdb / best_raw:.1f}x")
    results["ratios"] = {
        "convert_all_cores_vs_1": many.median / one.median,
        "convert_packer_vs_naive": many.median / naive.median,
        "read_lmdb_vs_raw_folder": best_lmdb / best_raw,
    }
    print("\nsaved", save_json("convert_and_read", results))


if __name__ == "__main__":
    run_main(main)
