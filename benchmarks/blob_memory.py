"""Memory of a RAM-resident blob read by 4 DataLoader workers: 1x the data, not 1 + 4 copies.

    python -m benchmarks.blob_memory                 # ~420 MB of random 3x224x224 samples
    python -m benchmarks.blob_memory --mb 200 --workers 2

A blob of random raw samples is written straight through ``BlobWriter`` (no JPEG decoding)
under /tmp. Each configuration then runs in a fresh Python process: a ``RAMDataset``, a
``DataLoader(batch_size=64, shuffle=True, num_workers=4, persistent_workers=True)`` under
``fork`` or ``spawn``, one full epoch, then, with the workers still alive, the proportional set
size (PSS: each shared page counted once in total, split between the processes mapping it) of
the parent and every worker, from ``/proc/PID/smaps_rollup``. Configurations:

* ``in-memory``: ``RAMDataset(path)``, the file copied once into shared memory (memfd);
* ``mmap``: ``RAMDataset(path, in_memory=False)``, the file mapped by every process;
* ``numpy copy``: the naive design for comparison, the file read into a numpy array held by
  the dataset (spawned workers each get their own copy by pickling);
* ``baseline``: a 1-sample blob, in-memory: interpreter, torch and DataLoader overhead alone.

``extra`` is total PSS minus the baseline's for the same start method: what the data costs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from .common import add_output_arguments, machine, markdown_table, output_dir, save_json, run_main

SHAPE = (3, 224, 224)
BATCH = 64
MODES = ("in-memory", "mmap", "numpy copy", "baseline")
CONTEXTS = ("fork", "spawn")


def write_blob(path: Path, count: int, *, seed: int = 0) -> int:
    """A blob of ``count`` random raw samples of :data:`SHAPE`; returns its size in bytes."""
    from packer.preprocess.task import Encoded
    from packer.writers.blob import BlobWriter
    from readers.schema import Metadata

    rng = np.random.default_rng(seed)
    nbytes = int(np.prod(SHAPE))
    with BlobWriter(path) as writer:
        for i in range(count):
            writer.add(Encoded(int(rng.integers(10)), SHAPE, rng.bytes(nbytes)))
        writer.finish(Metadata(format="blob", count=count, channels=3, shape=SHAPE, classes=tuple(f"c{k}" for k in range(10))))
    return path.stat().st_size


class NumpyCopy:
    """The naive in-RAM dataset: the file's bytes in a numpy array held by the dataset object."""

    def __init__(self, path: str) -> None:
        from readers.formats.blob import BlobStore

        store = BlobStore(path)
        offset, length = store.header.sections["data"]
        self.images = np.fromfile(path, np.uint8, count=length, offset=offset).reshape(len(store), *SHAPE)
        self.labels = np.fromfile(path, "<i8", count=len(store), offset=store.header.sections["labels"][0])

    def __len__(self) -> int:
        return len(self.labels)

    def __getitems__(self, indices):
        import torch

        idx = np.asarray(indices)
        return list(zip(torch.from_numpy(self.images[idx]), self.labels[idx].tolist()))


def pss_kib(pid: int) -> int:
    """Total PSS of a process, in KiB."""
    text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    return int(re.search(r"^Pss:\s+(\d+) kB", text, re.M).group(1))


def mapped_pss_kib(pid: int, needle: str) -> int:
    """PSS of the mappings of ``pid`` whose name contains ``needle``, in KiB."""
    total, inside = 0, False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            inside = needle in line
        elif inside and line.startswith("Pss:"):
            total += int(line.split()[1])
    return total


def run_one(mode: str, context: str, path: str, workers: int) -> dict:
    """One configuration, in this process: an epoch, then PSS of parent + workers."""
    import torch
    from torch.utils.data import DataLoader

    from readers import RAMDataset

    started = time.perf_counter()
    if mode == "numpy copy":
        dataset = NumpyCopy(path)
    else:
        dataset = RAMDataset(path, in_memory=mode != "mmap")
    loaded = time.perf_counter() - started
    loader = DataLoader(
        dataset,
        batch_size=BATCH,
        shuffle=True,
        num_workers=workers,
        persistent_workers=True,
        multiprocessing_context=context,
        generator=torch.Generator().manual_seed(0),
    )
    started = time.perf_counter()
    iterator = iter(loader)
    images = sum(len(batch) for batch, _labels in iterator)
    epoch = time.perf_counter() - started
    pids = [os.getpid()] + [w.pid for w in iterator._workers]  # private, but the only handle on the worker pids
    pss = [pss_kib(pid) for pid in pids]
    blob = [mapped_pss_kib(pid, "packer-blob" if mode == "in-memory" else os.path.basename(path)) for pid in pids]
    del iterator, loader
    return {
        "mode": mode,
        "context": context,
        "workers": workers,
        "images": images,
        "load_s": round(loaded, 2),
        "epoch_s": round(epoch, 2),
        "pss_mib": [round(k / 1024, 1) for k in pss],
        "total_pss_mib": round(sum(pss) / 1024, 1),
        "blob_mapping_pss_mib": round(sum(blob) / 1024, 1) if mode != "numpy copy" else None,
    }


def run_isolated(mode: str, context: str, path: Path, workers: int) -> dict:
    """:func:`run_one` in a fresh interpreter, so configurations do not share memory."""
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.blob_memory", "--one", mode, context, str(path), "--workers", str(workers)],
        check=True,
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=420, help="blob size in MB (default 420)")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--dir", default="/tmp", help="where the throwaway blobs are written (default /tmp)")
    parser.add_argument("--one", nargs=3, metavar=("MODE", "CONTEXT", "PATH"), help=argparse.SUPPRESS)
    add_output_arguments(parser)
    args = parser.parse_args()
    if args.one:
        mode, context, path = args.one
        print(json.dumps(run_one(mode, context, path, args.workers)))
        return

    with tempfile.TemporaryDirectory(prefix="packer-blob-memory-", dir=args.dir) as tmp:
        count = max(1, int(args.mb * 1e6 // np.prod(SHAPE)))
        big, tiny = Path(tmp) / "bench.blob", Path(tmp) / "tiny.blob"
        started = time.perf_counter()
        size = write_blob(big, count)
        written = time.perf_counter() - started
        write_blob(tiny, 1)
        results = []
        for context in CONTEXTS:
            for mode in MODES:
                result = run_isolated(mode, context, tiny if mode == "baseline" else big, args.workers)
                print(f"  {mode:<10} {context:<5} total PSS {result['total_pss_mib']:8.1f} MiB", file=sys.stderr, flush=True)
                results.append(result)

    blob_mib = size / 2**20
    baseline = {r["context"]: r["total_pss_mib"] for r in results if r["mode"] == "baseline"}
    rows = []
    for r in results:
        extra = r["total_pss_mib"] - baseline[r["context"]]
        r["extra_over_baseline_mib"] = round(extra, 1)
        r["extra_in_blob_sizes"] = round(extra / blob_mib, 2) if r["mode"] != "baseline" else None
        rows.append(
            [
                r["mode"],
                r["context"],
                f"{r['load_s']:.2f}",
                f"{r['epoch_s']:.2f}",
                " + ".join(f"{p:.0f}" for p in r["pss_mib"]),
                f"{r['total_pss_mib']:.0f}",
                "-" if r["blob_mapping_pss_mib"] is None else f"{r['blob_mapping_pss_mib']:.0f}",
                "-" if r["mode"] == "baseline" else f"{extra:.0f} ({r['extra_in_blob_sizes']:.2f}x)",
            ]
        )
    header = ["mode", "start", "load s", "epoch s", "PSS parent + workers (MiB)", "total PSS", "blob mappings PSS", "extra vs baseline"]
    print(f"blob: {count:,} samples of {'x'.join(map(str, SHAPE))} raw = {blob_mib:,.0f} MiB (written in {written:.1f} s); "
          f"{args.workers} DataLoader workers, batch {BATCH}, one shuffled epoch; MiB = 2^20 bytes")
    print(markdown_table(header, rows))
    payload = {"benchmark": "blob_memory", "machine": machine(), "blob_mib": round(blob_mib, 1), "samples": count,
               "shape": SHAPE, "workers": args.workers, "results": results}
    save_json("blob_memory", payload, output_dir(args.update_results, args.out))
    print(json.dumps(payload))


if __name__ == "__main__":
    run_main(main)
