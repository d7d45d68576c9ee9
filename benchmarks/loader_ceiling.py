"""How close ``readers.Loader`` comes to the machine's copy rate: the Loader and two copy ceilings in one run.

    python -m benchmarks.loader_ceiling                     # 5,000 raw 224x224x3 samples (made once, in /tmp)
    python -m benchmarks.loader_ceiling --update-results    # ... to benchmarks/results/loader_ceiling.json
    python -m benchmarks.loader_ceiling --images 500 --rounds 2 --seconds 0.3   # a quick look
    GLIBC_TUNABLES=glibc.cpu.x86_non_temporal_threshold=0x10000 python -m benchmarks.loader_ceiling --tag nt --update-results

The environment's ``GLIBC_TUNABLES`` is recorded: glibc's ``memcpy`` (what numpy's copies end in)
switches to non-temporal stores above a threshold it derives from the cache size the CPU
reports, and a VM reporting a very large L3 never reaches it; ``--tag`` names the JSON
``loader_ceiling-TAG.json`` so such a run sits beside the default one.

Measured side by side in interleaved rounds (each round runs every measurement once, the order
reversed every other round), all pages warm in RAM, batches of ``--batch`` rows of 150,528 bytes:
(a) the random-row ceiling: ``--threads`` threads (default 2), each filling its own batch buffer
    with one numpy row copy per sample, from random rows of an in-memory array of the same
    samples: what a batch gather can reach;
(b) the contiguous ceiling: the same threads, each copying ``--batch`` consecutive rows from a
    random start in one ``np.copyto``;
(c) ``readers.Loader`` (default threads) over the blob (``RAMDataset``), LMDB and HDF5 of the
    same samples, with the default buffers (``"checked"``) and with ``buffers="recycle"``,
    shuffled, whole epochs. A figure is images/s over ``--seconds``; each Loader figure is also
    given as a share of (a) and of (b) in the same round (median (min-max) of the rounds' ratios),
    and ``checked`` against ``recycle`` likewise. ``fresh_buffers`` counts the batch buffers each
    Loader allocated beyond its pool.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from .common import add_output_arguments, cpu_count, markdown_table, output_dir, save_json, run_main
from .loader import SIZE, make_data, open_reader

FORMATS = ("blob", "lmdb", "hdf5")
BUFFERS = ("checked", "recycle")


def summary(values: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": values}


def copy_ceiling(rows: np.ndarray, batch: int, threads: int, contiguous: bool) -> Callable[[float], float]:
    """A measurement (seconds -> images/s): ``threads`` threads filling batch buffers out of ``rows``."""
    buffers = [np.empty((batch, *rows.shape[1:]), rows.dtype) for _ in range(threads)]
    for b in buffers:
        b.fill(0)  # touched once, like a reused pool buffer

    def work(k: int, end: float, done: list[int]) -> None:
        rng, out, n = np.random.default_rng(k), buffers[k], len(rows)
        while time.perf_counter() < end:
            if contiguous:
                start = int(rng.integers(0, n - batch + 1))
                np.copyto(out, rows[start : start + batch])
            else:
                for j, i in enumerate(rng.integers(0, n, batch).tolist()):
                    out[j] = rows[i]
            done[k] += batch

    def measure(seconds: float) -> float:
        done = [0] * threads
        start = time.perf_counter()
        ts = [threading.Thread(target=work, args=(k, start + seconds, done)) for k in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return sum(done) / (time.perf_counter() - start)

    return measure


def loader_rate(loader: Any) -> Callable[[float], float]:
    def measure(seconds: float) -> float:
        images, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            for batch, _labels in loader:
                images += len(batch)
        return images / (time.perf_counter() - start)

    return measure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2, help="threads of the copy ceilings")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=1.5, help="length of one measurement")
    parser.add_argument("--formats", default=",".join(FORMATS), help="comma-separated, of " + ", ".join(FORMATS))
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/packer-bench-loader"), help="where the data is made (kept)")
    parser.add_argument("--tag", default="", help="save as loader_ceiling-TAG.json")
    add_output_arguments(parser)
    args = parser.parse_args()
    from readers import Loader

    formats = [f for f in args.formats.split(",") if f]
    paths = make_data(args.workdir, args.images, formats)
    failed = {f: p for f, p in paths.items() if not isinstance(p, Path)}
    if failed:
        raise SystemExit(f"conversion failed: {failed}")
    datasets = {fmt: open_reader(fmt, paths[fmt]) for fmt in formats}
    first = next(iter(datasets.values()))
    rows = np.ascontiguousarray(first.store.read_batch(np.arange(len(first)))[0])  # the same samples, in RAM
    rows.reshape(-1)[:: 4096] += 0  # every page touched
    measurements: dict[str, Callable[[float], float]] = {
        "random-row copy": copy_ceiling(rows, args.batch, args.threads, contiguous=False),
        "contiguous copy": copy_ceiling(rows, args.batch, args.threads, contiguous=True),
    }
    loaders = {}
    for fmt, ds in datasets.items():
        for mode in BUFFERS:
            loaders[f"{fmt} {mode}"] = Loader(ds, args.batch, shuffle=True, buffers=mode)
            measurements[f"{fmt} {mode}"] = loader_rate(loaders[f"{fmt} {mode}"])
    for measure in measurements.values():  # warm-up: pages, buffers, threads
        measure(min(0.5, args.seconds))
    pools = {name: loader.buffers_allocated for name, loader in loaders.items()}
    runs: dict[str, list[float]] = {name: [] for name in measurements}
    load: list[float] = []
    for k in range(args.rounds):
        names = list(measurements) if k % 2 == 0 else list(reversed(measurements))
        for name in names:
            runs[name].append(measurements[name](args.seconds))
        load.append(round(os.getloadavg()[0], 2))
        print(f"round {k + 1}/{args.rounds}: " + ", ".join(f"{n} {runs[n][-1]:,.0f}" for n in measurements), flush=True)

    random_rows, contiguous = runs["random-row copy"], runs["contiguous copy"]
    ratio = lambda a, b: summary([x / y for x, y in zip(a, b)])  # noqa: E731
    results: dict[str, Any] = {
        "images": args.images, "batch": args.batch, "sample_bytes": int(rows[0].nbytes), "ceiling_threads": args.threads,
        "rounds": args.rounds, "seconds": args.seconds, "cores": cpu_count(), "load_average_per_round": load,
        "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
        "ceilings": {"random_rows": summary(random_rows), "contiguous": summary(contiguous)},
        "loader": {},
    }
    table = []
    for name, loader in loaders.items():
        fmt, mode = name.split()
        entry = {
            "images_per_s": summary(runs[name]), "threads": loader.threads,
            "of_random_rows": ratio(runs[name], random_rows), "of_contiguous": ratio(runs[name], contiguous),
            "fresh_buffers": loader.buffers_allocated - pools[name],
        }
        if mode == "checked":
            entry["of_recycle"] = ratio(runs[name], runs[f"{fmt} recycle"])
        results["loader"].setdefault(fmt, {})[mode] = entry
        pct = lambda r: f"{r['median']:.0%} ({r['min']:.0%}-{r['max']:.0%})"  # noqa: E731
        table.append([name, _rate(entry["images_per_s"]), pct(entry["of_random_rows"]), pct(entry["of_contiguous"]),
                      pct(entry["of_recycle"]) if "of_recycle" in entry else "", entry["fresh_buffers"]])
    print(f"\n{args.images} raw {SIZE}x{SIZE}x3 samples, batch {args.batch}, {args.rounds} interleaved rounds of {args.seconds:g} s, "
          f"{cpu_count()} cores, load average per round {load}")
    print(f"(a) random-row copy, {args.threads} threads: {_rate(results['ceilings']['random_rows'])} images/s; "
          f"(b) contiguous copy: {_rate(results['ceilings']['contiguous'])} images/s")
    print(markdown_table(["Loader", "images/s", "of (a)", "of (b)", "checked / recycle", "fresh buffers"], table))
    print("\nsaved", save_json("loader_ceiling" + (f"-{args.tag}" if args.tag else ""), results, output_dir(args.update_results, args.out)))


def _rate(r: dict[str, Any]) -> str:
    return f"{r['median']:,.0f} ({r['min']:,.0f}-{r['max']:,.0f})"


if __name__ == "__main__":
    torch.set_num_threads(1)  # nothing here computes; keep torch's pool from competing with the loader threads
    run_main(main)
