"""Conversion speed on Ray vs the local process pool, same cores, same images.

    python -m benchmarks.ray_vs_local                       # 2,000 images, 2 cores, lmdb + webdataset
    python -m benchmarks.ray_vs_local --images 3000 --workers 2 --formats lmdb --abba

The images are the suite's natural-looking 500x375 JPEGs (``benchmarks/data/``, made once),
converted to 224x224 raw. Each side runs in a fresh Python process of its own, so neither pays
for the other: the local pool gets ``--workers`` processes in a process where Ray was never
imported; Ray gets a local instance with ``--workers`` CPUs, started before timing (its
start-up, a few seconds, is reported apart: it is paid once per cluster, not per conversion).
``--abba`` runs local, ray, ray, local and averages each side (a shared machine's load drifts).
The overhead is ``1 - ray / local`` img/s. Results: ``benchmarks/out/ray_vs_local.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from benchmarks.common import add_output_arguments, imagenet_like, machine, markdown_table, output_dir, save_json, run_main

SUFFIX = {"lmdb": ".lmdb", "hdf5": ".h5", "blob": ".blob", "webdataset": ".shards"}

#: One side of the comparison, in a fresh interpreter: prints {"ray_start": s, "rates": {fmt: img/s}}.
_SIDE = """
import json, shutil, sys, tempfile, time
from pathlib import Path
from packer import ImageOptions, convert
executor, src, workers, size, formats = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5].split(",")
suffix = {"lmdb": ".lmdb", "hdf5": ".h5", "blob": ".blob", "webdataset": ".shards"}
ray_start = 0.0
if executor == "ray":
    import ray
    started = time.perf_counter()
    ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    ray_start = time.perf_counter() - started
tmp = Path(tempfile.mkdtemp(prefix="packer-ray-bench-"))
rates = {}
try:
    for fmt in formats:
        report = convert(src, tmp / f"out{suffix[fmt]}", format=fmt, image=ImageOptions(size=size), workers=workers, executor=executor)
        rates[fmt] = report.images_per_second
        shutil.rmtree(tmp / f"out{suffix[fmt]}", ignore_errors=True)
        (tmp / f"out{suffix[fmt]}").unlink(missing_ok=True)
finally:
    shutil.rmtree(tmp, ignore_errors=True)
print(json.dumps({"ray_start": ray_start, "rates": rates}))
"""


def side(executor: str, src: Path, args: argparse.Namespace) -> dict:
    """Run one side in a fresh process; its rates per format."""
    out = subprocess.run(
        [sys.executable, "-c", _SIDE, executor, str(src), str(args.workers), str(args.size), ",".join(args.formats)],
        check=True, capture_output=True, text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    """Run the comparison and print a markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--formats", nargs="+", default=["lmdb", "webdataset"], choices=sorted(SUFFIX))
    parser.add_argument("--abba", action="store_true", help="local, ray, ray, local; each side averaged")
    add_output_arguments(parser)
    args = parser.parse_args(argv)

    src = imagenet_like(args.images, classes=10, workers=args.workers)
    order = ["local", "ray", "ray", "local"] if args.abba else ["local", "ray"]
    runs = [(executor, side(executor, src, args)) for executor in order]
    mean = {
        (fmt, executor): sum(r["rates"][fmt] for e, r in runs if e == executor) / order.count(executor)
        for fmt in args.formats for executor in ("local", "ray")
    }
    ray_start = max(r["ray_start"] for e, r in runs if e == "ray")
    rows = [[fmt, args.workers, f"{mean[fmt, 'local']:,.0f}", f"{mean[fmt, 'ray']:,.0f}",
             f"{1 - mean[fmt, 'ray'] / mean[fmt, 'local']:+.1%}"] for fmt in args.formats]
    print(f"{args.images:,} images of {src} at {args.size}x{args.size}, raw, order {'-'.join(order)}; "
          f"Ray start-up {ray_start:.1f} s (not timed)")
    print(markdown_table(["format", "cores", "local img/s", "ray img/s", "ray overhead"], rows))
    save_json("ray_vs_local", {"machine": machine(), "args": {k: v for k, v in vars(args).items() if k not in ("update_results", "out")},
                               "runs": runs, "ray_start_s": ray_start,
                               "mean_rates": {fmt: {"local": mean[fmt, "local"], "ray": mean[fmt, "ray"]} for fmt in args.formats}},
              output_dir(args.update_results, args.out))


if __name__ == "__main__":
    run_main(main)
