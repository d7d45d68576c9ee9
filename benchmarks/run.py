"""The benchmark suite: every pipeline, side by side, in one run on one machine.

    python -m benchmarks.run --quick           # under 2 minutes on 2 quiet cores: validates everything end to end
    python -m benchmarks.run                   # the full suite (3,000 images, longer passes)
    python -m benchmarks.run --data DIR        # your own image folder instead of the generated one
    python -m benchmarks.run --drop-caches --update-results   # as root: cold-cache figures too, into benchmarks/results/

Reading (DataLoader batch 64, shuffled, num_workers 0 and all cores; each pipeline is compared
at its best setting, as a ratio to the tutorial raw-folder pipeline measured in the same run):

* raw folder, the tutorial way (PIL, Resize 256, CenterCrop 224, float + normalise on the CPU);
* raw folder with the best per-sample tricks (PIL draft, one resize from the centre box, uint8);
* every packer format, raw and JPEG-encoded, through DataLoader and through ``readers.Loader``;
* the peers (webdataset, MosaicML Streaming, LitData) on the same preprocessed images.

Packed and "tricks" pipelines deliver uint8 batches; their normalisation belongs on the device
(``readers.Normalize``), so it is not timed here. Conversion images/s with 1 worker and all
cores, and bytes on disk. Cold-cache first-epoch figures only with ``--drop-caches`` (it drops
the whole machine's page cache: needs root, and slows everything else running). Output: a table
on the terminal, ``<mode>.json`` (every figure and the machine) and ``<mode>-throughput.png`` in
``benchmarks/out/`` (git-ignored), or in ``benchmarks/results/`` (the committed figures) with
``--update-results``.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib.metadata
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Callable

from torch.utils.data import DataLoader, Dataset

from packer import ImageOptions, convert
from packer.bench import SUFFIX, Rate, collate, disk_bytes, loader_rates, open_packed
from packer.sources.images import scan_image_folder
from packer.writers import WRITERS, get_writer

from .baselines import FastFolder, TutorialFolder, naive_convert, remove
from .common import DATA_DIR, add_output_arguments, cpu_count, folder_stats, imagenet_like, machine, markdown_table, output_dir, save_json, run_main
from .peers import PEERS, peer_versions, timed_write

BATCH = 64
ENCODINGS = ("raw", "jpeg")
TUTORIAL = "raw folder, tutorial (float on CPU)"
TRICKS = "raw folder, best tricks (uint8)"


@dataclass(frozen=True)
class Mode:
    """How long the suite runs."""

    images: int
    seconds: float  # shortest timed read pass
    repeats: int  # timed passes per figure, after one warm-up
    convert_repeats: int
    all_conversions_one_worker: bool  # else only packer LMDB raw at 1 worker
    cold_all: bool  # cold-cache pass over every packed dataset, else the folder and LMDB raw


MODES = {
    "quick": Mode(images=256, seconds=0.3, repeats=2, convert_repeats=1, all_conversions_one_worker=False, cold_all=False),
    "full": Mode(images=3000, seconds=3.0, repeats=3, convert_repeats=2, all_conversions_one_worker=True, cold_all=True),
}


def rate_dict(rate: Rate | str) -> dict[str, Any]:
    if isinstance(rate, Rate):
        return {"min": rate.min, "median": rate.median, "max": rate.max, "runs": rate.runs}
    return {"note": rate}


class Suite:
    """Collects every figure of one run."""

    def __init__(self, mode: Mode, cores: int) -> None:
        self.mode = mode
        self.cores = cores
        self.settings = sorted({0, cores})
        self.reads: list[dict[str, Any]] = []
        self.conversions: list[dict[str, Any]] = []
        self.cold: list[dict[str, Any]] = []
        self.notes: list[str] = []

    def say(self, message: str) -> None:
        print(message, flush=True)

    def add_reads(self, group: str, pipeline: str, rates: dict[str, Rate | str], bytes_on_disk: int | None = None) -> None:
        for reader, rate in rates.items():
            self.reads.append({"group": group, "pipeline": pipeline, "reader": reader, "bytes": bytes_on_disk, **rate_dict(rate)})

    def add_skip(self, group: str, pipeline: str, why: str) -> None:
        self.reads.append({"group": group, "pipeline": pipeline, "reader": "", "bytes": None, "note": why})
        self.say(f"  {pipeline}: {why}")

    def time_conversion(self, tool: str, encoding: str, workers: int, run: Callable[[], int], images: int) -> None:
        rates = []
        for _ in range(self.mode.convert_repeats):
            start = time.perf_counter()
            run()
            rates.append(images / (time.perf_counter() - start))
        rates.sort()
        self.conversions.append({
            "tool": tool, "encoding": encoding, "workers": workers,
            "min": rates[0], "median": rates[len(rates) // 2], "max": rates[-1], "runs": len(rates),
        })

    def dataloader_rates(self, dataset: Dataset) -> dict[str, Rate | str]:
        return loader_rates(dataset, settings=self.settings, batch_size=BATCH, seconds=self.mode.seconds, repeats=self.mode.repeats, with_loader=False)


def drop_page_cache() -> str | None:
    """Drop the page cache; ``None`` on success, else why it could not be done."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as handle:
            handle.write("3\n")
    except OSError as exc:
        return f"cannot drop the page cache ({exc.strerror or exc}; needs root and a writable /proc/sys)"
    return None


def isolated(fn: Callable[[], Any]) -> Any:
    """``fn()`` run in a forked child process; its result, or RuntimeError with the child's error.

    Peers leave shared memory, threads and signal handlers behind (LitData's workers can abort
    the process that owns them at exit); a child keeps them away from the rest of the suite.
    """
    ctx = get_context("fork")
    receive, send = ctx.Pipe(duplex=False)

    def child() -> None:
        import torch

        torch.set_num_threads(1)  # OpenMP's pool does not survive fork (DataLoader workers do the same)
        try:
            result: tuple[str, Any] = ("ok", fn())
        except BaseException as exc:  # noqa: BLE001 - sent to the parent, which reports it
            result = ("error", f"{type(exc).__name__}: {exc}")
        send.send(result)
        send.close()

    proc = ctx.Process(target=child, daemon=False)
    proc.start()
    send.close()
    try:
        status, value = receive.recv()
    except EOFError:
        proc.join()
        raise RuntimeError(f"the child process died (exit code {proc.exitcode})") from None
    proc.join()
    if status == "error":
        raise RuntimeError(value)
    return value


def cold_epoch(dataset: Dataset, workers: int) -> float:
    """Images/s of one first epoch right after the page cache was dropped."""
    loader = DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=workers, collate_fn=collate)
    start, images = time.perf_counter(), 0
    for batch, _ in loader:
        images += len(batch)
    return images / (time.perf_counter() - start)


def run_suite(src: Path, mode: Mode, *, peers: bool = True, cold: bool = False) -> dict[str, Any]:
    """Measure everything on ``src``; returns the JSON-ready results. ``cold``: also the
    cold-cache first epochs, which drop the whole machine's page cache (root only)."""
    cores = cpu_count()
    suite = Suite(mode, cores)
    items = [(i.path, i.label) for i in scan_image_folder(src).items]
    files, nbytes = folder_stats(src)
    suite.say(f"data: {src} ({len(items):,} images, {nbytes / max(files, 1) / 1e3:.0f} KB each); {cores} cores")
    options = {enc: ImageOptions(size=224, encoding=enc) for enc in ENCODINGS}
    tmp = Path(tempfile.mkdtemp(prefix="suite-", dir=DATA_DIR))
    packed: dict[str, Path] = {}
    try:
        suite.say("reading the raw folder")
        suite.add_reads("baseline", TUTORIAL, suite.dataloader_rates(TutorialFolder(src)), nbytes)
        suite.add_reads("baseline", TRICKS, suite.dataloader_rates(FastFolder(src)), nbytes)

        naive = tmp / "naive.lmdb"
        suite.time_conversion("naive PIL loop -> LMDB", "raw", cores, lambda: (remove(naive), naive_convert(src, naive, cores))[1], len(items))
        remove(naive)

        for fmt in WRITERS:
            for enc in ENCODINGS:
                name = f"packer {fmt} ({enc})"
                try:
                    get_writer(fmt)
                except (ImportError, AttributeError) as exc:
                    suite.add_skip("packer", name, f"skipped: writer not available ({exc})")
                    continue
                dst = tmp / f"{fmt}-{enc}{SUFFIX[fmt]}"
                suite.say(f"converting: {name}")
                one_worker = mode.all_conversions_one_worker or (enc == "raw" and fmt == "lmdb")
                worker_counts = [1, cores] if one_worker else [cores]
                for workers in sorted(set(worker_counts)):
                    def one(workers: int = workers) -> int:
                        return convert(src, dst, format=fmt, image=options[enc], workers=workers, overwrite=True).written

                    suite.time_conversion(f"packer {fmt}", enc, workers, one, len(items))
                size = disk_bytes(dst)
                suite.conversions[-1]["bytes"] = size
                try:
                    dataset = open_packed(dst, fmt)
                except (ImportError, AttributeError) as exc:
                    suite.add_skip("packer", name, f"skipped: reader not available ({exc})")
                    continue
                suite.say(f"reading: {name}")
                rates = loader_rates(dataset, settings=suite.settings, batch_size=BATCH, seconds=mode.seconds, repeats=mode.repeats)
                suite.add_reads("packer", name, {k: v for k, v in rates.items() if k != "readers.Loader"}, size)
                suite.add_reads("packer + Loader", name, {"readers.Loader": rates["readers.Loader"]}, size)
                packed[f"{fmt}-{enc}"] = dst
                del dataset
                gc.collect()

        if peers:
            for peer in PEERS:
                why = peer.available()
                if why:
                    suite.add_skip("peer", peer.name, why)
                    continue
                for enc in ENCODINGS:
                    name = f"{peer.name} ({enc})"
                    dst = tmp / f"peer-{peer.package}-{enc}"
                    suite.say(f"converting and reading: {name}")
                    worker_counts = sorted({1, cores}) if mode.all_conversions_one_worker else [cores]

                    def measure_peer(peer=peer, dst=dst, enc=enc, worker_counts=worker_counts) -> tuple[list[tuple[int, float]], int, dict]:
                        conv = [(w, timed_write(peer, items, dst, enc, w, remove)) for w in worker_counts]
                        rates = peer.read(dst, settings=suite.settings, batch_size=BATCH, seconds=mode.seconds, repeats=mode.repeats)
                        return conv, disk_bytes(dst), rates

                    try:
                        conv, size, rates = isolated(measure_peer)
                    except Exception as exc:  # noqa: BLE001 - a peer that fails is reported, not dropped
                        suite.add_skip("peer", name, f"failed: {str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__}")
                        continue
                    for workers, rate in conv:
                        suite.conversions.append({"tool": peer.name, "encoding": enc, "workers": workers, "min": rate, "median": rate, "max": rate, "runs": 1})
                    suite.conversions[-1]["bytes"] = size
                    suite.add_reads("peer", name, rates, size)
                    remove(dst)

        if cold:
            why = drop_page_cache()
            if why:
                suite.notes.append(f"cold cache: {why}; all figures are warm-cache")
                suite.say(why)
            else:
                suite.say("cold cache: first epoch after dropping the page cache")
                cold_sets: list[tuple[str, Callable[[], Dataset]]] = [(TUTORIAL, lambda: TutorialFolder(src)), (TRICKS, lambda: FastFolder(src))]
                for key, path in packed.items():
                    if not mode.cold_all and key != "lmdb-raw":
                        continue  # quick: one packed format, enough to validate the path
                    fmt = key.split("-", 1)[0]
                    cold_sets.append((f"packer {fmt} ({key.split('-', 1)[1]})", lambda path=path, fmt=fmt: open_packed(path, fmt)))
                for name, make in cold_sets:
                    drop_page_cache()
                    suite.cold.append({"pipeline": name, "num_workers": cores, "images_per_s": cold_epoch(make(), cores)})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    return {
        "src": str(src),
        "images": len(items),
        "mean_file_kb": nbytes / max(files, 1) / 1e3,
        "folder_bytes": nbytes,
        "cores": cores,
        "num_workers_settings": suite.settings,
        "batch_size": BATCH,
        "mode": {k: getattr(mode, k) for k in mode.__dataclass_fields__},
        "read": suite.reads,
        "convert": suite.conversions,
        "cold": suite.cold,
        "notes": suite.notes,
    }


def best_per_pipeline(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each (group, pipeline) at its best reader/setting, with its ratio to the tutorial baseline."""
    best: dict[tuple[str, str], dict[str, Any]] = {}
    for row in results["read"]:
        key = (row["group"], row["pipeline"])
        if "median" not in row:
            best.setdefault(key, row)
            continue
        if "median" not in best.get(key, {}) or row["median"] > best[key]["median"]:
            best[key] = row
    tutorial = best.get(("baseline", TUTORIAL), {}).get("median")
    tricks = best.get(("baseline", TRICKS), {}).get("median")
    out = []
    for row in best.values():
        row = dict(row)
        if "median" in row and tutorial:
            row["vs_tutorial"] = row["median"] / tutorial
            row["vs_tricks"] = row["median"] / tricks if tricks else None
        out.append(row)
    return out


def render(results: dict[str, Any]) -> str:
    """The terminal/markdown report."""
    lines = []
    fmt = lambda v: f"{v:,.0f}"  # noqa: E731
    read_rows = []
    for row in results["read"]:
        if "median" in row:
            read_rows.append([row["pipeline"], row["reader"], f"{fmt(row['median'])} ({fmt(row['min'])}-{fmt(row['max'])})"])
        else:
            read_rows.append([row["pipeline"], row["reader"], row["note"]])
    lines += ["### Reading, images/s: median (min-max)", "", markdown_table(["pipeline", "reader", "images/s"], read_rows), ""]
    best_rows = []
    for row in sorted(best_per_pipeline(results), key=lambda r: -r.get("median", 0)):
        if "median" in row:
            size = f"{row['bytes'] / 1e6:,.1f} MB" if row.get("bytes") else ""
            best_rows.append([row["pipeline"], row["group"], row["reader"], fmt(row["median"]), f"{row['vs_tutorial']:.1f}x", f"{row['vs_tricks']:.1f}x" if row.get("vs_tricks") else "", size])
        else:
            best_rows.append([row["pipeline"], row["group"], "", row["note"], "", "", ""])
    lines += ["### Each pipeline at its best setting", "",
              markdown_table(["pipeline", "group", "best reader", "images/s", "vs tutorial folder", "vs best-tricks folder", "on disk"], best_rows), ""]
    conv_rows = [[c["tool"], c["encoding"], c["workers"], f"{fmt(c['median'])} ({fmt(c['min'])}-{fmt(c['max'])})", f"{c['bytes'] / 1e6:,.1f} MB" if c.get("bytes") else ""]
                 for c in results["convert"]]
    lines += ["### Conversion, images/s: median (min-max)", "", markdown_table(["tool", "encoding", "workers", "images/s", "on disk"], conv_rows), ""]
    if results["cold"]:
        tutorial_cold = next((c["images_per_s"] for c in results["cold"] if c["pipeline"] == TUTORIAL), None)
        cold_rows = [[c["pipeline"], c["num_workers"], fmt(c["images_per_s"]), f"{c['images_per_s'] / tutorial_cold:.1f}x" if tutorial_cold else ""] for c in results["cold"]]
        lines += ["### Cold cache: first epoch after dropping the page cache", "", markdown_table(["pipeline", "num_workers", "images/s", "vs tutorial folder"], cold_rows), ""]
    for note in results["notes"]:
        lines.append(f"note: {note}")
    return "\n".join(lines)


def chart(results: dict[str, Any], path: Path) -> Path | None:
    """A horizontal bar chart of each pipeline at its best (log scale, min-max whiskers)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[bench]'): no chart")
        return None
    rows = sorted((r for r in best_per_pipeline(results) if "median" in r), key=lambda r: r["median"])
    colours = {"baseline": "#999999", "packer": "#1f77b4", "packer + Loader": "#2ca02c", "peer": "#ff7f0e"}
    fig, ax = plt.subplots(figsize=(11, 0.34 * len(rows) + 1.4))
    y = range(len(rows))
    med = [r["median"] for r in rows]
    err = [[r["median"] - r["min"] for r in rows], [r["max"] - r["median"] for r in rows]]
    ax.barh(list(y), med, xerr=err, color=[colours.get(r["group"], "#555555") for r in rows], capsize=2)
    ax.set_yticks(list(y), [f"{r['pipeline']} [{r['reader']}]" for r in rows], fontsize=7)
    ax.set_xscale("log")
    ax.set_xlim(min(med) / 2, max(med) * 12)
    ax.set_xlabel("images/s (log scale; best num_workers setting; median, min-max whiskers)")
    m = results["machine"]
    quick = " (--quick: preliminary)" if results["mode"]["images"] < 1000 else ""
    ax.set_title(f"Reading 224x224 images, batch {results['batch_size']}: {m['cpu'][:40]}, {m['cores']} cores{quick}", fontsize=9)
    for i, r in enumerate(rows):
        ax.text(r["median"], i, f"  {r['median']:,.0f} ({r.get('vs_tutorial', 0):.1f}x)", va="center", fontsize=6)
    from matplotlib.patches import Patch

    groups = [g for g in colours if any(r["group"] == g for r in rows)]
    ax.legend(handles=[Patch(color=colours[g], label=g) for g in groups], loc="lower right", fontsize=7)
    fig.tight_layout()
    fig.subplots_adjust(left=0.38)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def versions() -> dict[str, str]:
    """Versions of the readers' libraries and the peers (or why a peer is missing)."""
    out = {}
    for package in ("h5py", "webdataset", "matplotlib"):
        try:
            out[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            out[package] = "not installed"
    out.update(peer_versions())
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a short pass that validates the whole suite (under 2 minutes on 2 quiet cores)")
    parser.add_argument("--data", type=Path, help="an image folder to use instead of the generated ImageNet-like one")
    parser.add_argument("--images", type=int, help="generated images (default: 256 quick, 3000 full)")
    parser.add_argument("--no-peers", action="store_true", help="skip webdataset, Streaming and LitData")
    parser.add_argument("--drop-caches", action="store_true",
                        help="also measure cold-cache first epochs: drops the WHOLE MACHINE's page cache before each (root only)")
    add_output_arguments(parser)
    parser.add_argument("--render", type=Path, metavar="JSON", help="print the markdown report of a saved run (for RESULTS.md) and exit")
    args = parser.parse_args(argv)
    if args.render:
        import json

        print(render(json.loads(args.render.read_text())))
        return
    name = "quick" if args.quick else "full"
    mode = MODES[name]
    if args.images:
        mode = dataclasses.replace(mode, images=args.images)
    started = time.perf_counter()
    src = args.data if args.data else imagenet_like(mode.images)
    results = run_suite(src, mode, peers=not args.no_peers, cold=args.drop_caches)
    if not args.drop_caches:
        results["notes"].append("cold cache: not measured (run with --drop-caches, as root); all figures are warm-cache")
    results["machine"] = {**machine(), **versions()}
    results["seconds"] = time.perf_counter() - started
    report = render(results)
    print()
    print(report)
    print(f"\n{name} suite: {results['seconds']:.0f} s")
    out = output_dir(args.update_results, args.out)
    print("saved", save_json(name, results, out))
    png = chart(results, out / f"{name}-throughput.png")
    if png:
        print("saved", png)


if __name__ == "__main__":
    run_main(main)
