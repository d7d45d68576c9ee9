"""``StreamingShards`` read rate before and after a change, run in alternation (ABAB...).

    python -m benchmarks.stream_before_after --base a7c8d14               # base revision vs this tree
    python -m benchmarks.stream_before_after --base a7c8d14 --rounds 2    # a quick look

The base revision's ``readers`` is exported (``git archive``) into a temporary folder; each
measurement is a fresh child process whose ``PYTHONPATH`` puts that tree's ``readers`` first, so
both sides read the same shards with the same Python and libraries. The data: ``--images``
JPEG-sized synthetic images (``packer.samples.make_image_folder``, 96x72) converted once, by
this tree, to WebDataset shards of 97 samples at 64x64 raw. A measurement: one warm-up pass
(pages in the OS cache), then ``--passes`` epochs of ``StreamingShards(shuffle=True,
buffer=200)`` in the process (no DataLoader workers); its figure is the best pass's samples/s
(padding included: after the equal-steps change the shorter rank yields more samples), by
wall clock and by this process's CPU time (``time.process_time``: less sensitive to other
processes sharing the cores, the figure to compare on a contended machine).
Configurations: one rank, and rank 1 of 2 (the rank that is padded after the change).
Each figure is the median (min-max) over ``--rounds`` processes per side; the ratio is after /
before of the medians. Results go to ``benchmarks/out/stream_before_after.json``
(``--update-results``: benchmarks/results/).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

from .common import add_output_arguments, output_dir, save_json, run_main

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {"1 rank": (0, 1), "rank 1 of 2": (1, 2)}

CHILD = r"""
import json, sys, time
from readers import StreamingShards
folder, rank, world, passes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
stream = StreamingShards(folder, shuffle=True, buffer=200, seed=0, rank=rank, world_size=world)
for _ in stream:  # warm-up: the shards in the page cache
    pass
rates, cpu_rates = [], []
for epoch in range(1, passes + 1):
    stream.set_epoch(epoch)
    start, cpu = time.perf_counter(), time.process_time()
    n = sum(1 for _ in stream)
    rates.append(n / (time.perf_counter() - start))
    cpu_rates.append(n / (time.process_time() - cpu))
print(json.dumps({"samples": n, "rate": max(rates), "cpu_rate": max(cpu_rates)}))
"""


def measure(root: Path, folder: Path, rank: int, world: int, passes: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", CHILD, str(folder), str(rank), str(world), str(passes)], env=env, cwd=root,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="the revision to compare with")
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=6, help="processes per side and configuration, alternating")
    parser.add_argument("--passes", type=int, default=3, help="timed epochs per process (the best counts)")
    add_output_arguments(parser)
    args = parser.parse_args()

    from packer import ImageOptions, StorageOptions, convert
    from packer.samples import make_image_folder

    with tempfile.TemporaryDirectory(prefix="stream-ba-") as tmp:
        tmp = Path(tmp)
        base = tmp / "base"
        base.mkdir()
        archive = subprocess.run(["git", "archive", args.base, "readers"], cwd=ROOT, capture_output=True, check=True).stdout
        tarfile.open(fileobj=BytesIO(archive)).extractall(base, filter="data")
        make_image_folder(tmp / "images", classes=4, per_class=args.images // 4, size=(96, 72))
        folder = tmp / "shards"
        convert(tmp / "images", folder, format="webdataset", image=ImageOptions(size=64), storage=StorageOptions(shard_size=97), workers=2)
        sides = {"before": base, "after": ROOT}
        runs: dict[str, dict[str, list[dict]]] = {c: {s: [] for s in sides} for c in CONFIGS}
        for round_ in range(args.rounds):
            for config, (rank, world) in CONFIGS.items():
                for side, root in sides.items():
                    runs[config][side].append(measure(root, folder, rank, world, args.passes))
                    print(f"round {round_ + 1} {config} {side}: {runs[config][side][-1]}", flush=True)

    results = {}
    for config, by_side in runs.items():
        row: dict = {}
        for side, found in by_side.items():
            row[side] = {"samples_per_epoch": found[0]["samples"]}
            for key, name in (("rate", "samples_per_s_wall"), ("cpu_rate", "samples_per_cpu_s")):
                rates = [r[key] for r in found]
                row[side][name] = {"median": round(statistics.median(rates)), "min": round(min(rates)), "max": round(max(rates)),
                                   "all": [round(r) for r in rates]}
        for name in ("samples_per_s_wall", "samples_per_cpu_s"):
            row[f"after_over_before_{name}"] = round(row["after"][name]["median"] / row["before"][name]["median"], 3)
        results[config] = row
        print(config, json.dumps(row))
    path = save_json("stream_before_after", {
        "compares": f"StreamingShards samples/s, {args.base} (before) vs this tree (after), alternating processes",
        "base": args.base, "images": args.images, "rounds": args.rounds, "passes": args.passes, "results": results,
    }, output_dir(args.update_results, args.out))
    print(path)


if __name__ == "__main__":
    run_main(main)
