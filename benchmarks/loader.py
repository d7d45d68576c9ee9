"""The batch loader against the machine's copy bandwidth and against a per-sample DataLoader.

    python -m benchmarks.loader                       # 2,000 raw 224x224x3 samples (made once, in /tmp)
    python -m benchmarks.loader --images 500 --seconds 1 --repeats 2

Side by side, in one run, all pages warm in the OS cache:
(a) memory copy bandwidth: one large numpy copy (1 thread, and one per core); the fastest copy
    seen is the physical limit the loaders are compared with;
(b) ``readers.Loader`` over the blob (``RAMDataset``, in RAM), as a share of that bandwidth in
    bytes of pixels per second (target: 70% or more);
(c) ``readers.Loader`` over LMDB and HDF5 vs the same reader through
    ``DataLoader(ds, batch_size=256, num_workers=0)`` reading one sample at a time through
    ``__getitem__`` (target: 2x or more);
(d) ``Loader`` at 1, 2, ... threads over LMDB (how the default thread count was chosen);
(e) RAM held by the loader's batch buffers.
A format whose reader does not exist yet is reported as "not available".
"""

from __future__ import annotations

import argparse
import importlib.util
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from .common import Rate, add_output_arguments, cpu_count, machine, markdown_table, measure, output_dir, save_json, run_main

BATCH = 256
SIZE = 224
#: Format -> (destination suffix, writer module, reader module, reader class).
FORMATS = {
    "blob": (".blob", "packer.writers.blob", "readers.blob", "RAMDataset"),
    "lmdb": (".lmdb", "packer.writers.lmdb", "readers.lmdb", "LMDBDataset"),
    "hdf5": (".h5", "packer.writers.hdf5", "readers.hdf5", "HDF5Dataset"),
}


class PerSample(Dataset):
    """Hides ``__getitems__``: the DataLoader then reads one sample at a time and stacks them."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]


def available(fmt: str) -> bool:
    _suffix, writer, reader, _cls = FORMATS[fmt]
    return all(importlib.util.find_spec(m) is not None for m in (writer, reader))


def make_data(workdir: Path, images: int, formats: list[str]) -> dict[str, Path | str]:
    """A folder of ``images`` 224x224 JPEGs converted to raw 224x224 in each format (made once).

    A cached conversion that this version cannot read is made again. A format whose
    conversion fails maps to the error text instead of a path."""
    from packer import ImageOptions, convert
    from packer.samples import make_image_folder
    from readers.formats import open_store
    from readers.schema import PackedFormatError

    classes = 10
    src = make_image_folder(workdir / f"src-{images}", classes=classes, per_class=max(1, images // classes), size=(SIZE, SIZE), workers=cpu_count())
    paths: dict[str, Path | str] = {}
    for fmt in formats:
        dst = workdir / f"data-{images}{FORMATS[fmt][0]}"
        try:
            try:
                open_store(dst)  # a cached conversion, if this packer version still reads it
            except (FileNotFoundError, PackedFormatError):
                convert(src, dst, format=fmt, image=ImageOptions(size=SIZE), workers=cpu_count(), overwrite=True)
            paths[fmt] = dst
        except Exception as exc:  # a format under construction: reported, not fatal
            paths[fmt] = f"conversion failed: {type(exc).__name__}: {exc}"
    return paths


def open_reader(fmt: str, path: Path) -> Any:
    _suffix, _writer, module, cls = FORMATS[fmt]
    return getattr(importlib.import_module(module), cls)(path)


def copy_bandwidth(nbytes: int, threads: int, repeats: int) -> Rate:
    """Bytes/s of ``np.copyto`` over ``nbytes``, split between ``threads`` threads."""
    src = np.ones(nbytes, np.uint8)
    dst = np.zeros(nbytes, np.uint8)
    parts = np.array_split(np.arange(nbytes), threads)
    bounds = [(int(p[0]), int(p[-1]) + 1) for p in parts]

    def one(lo: int, hi: int) -> None:
        np.copyto(dst[lo:hi], src[lo:hi])

    def one_pass() -> int:
        if threads == 1:
            np.copyto(dst, src)
            return nbytes
        ts = [threading.Thread(target=one, args=b) for b in bounds]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return nbytes

    return measure(one_pass, repeats=repeats * 3)


def through(make_iterable: Callable[[], Any], seconds: float) -> Callable[[], int]:
    """A pass: iterate epochs until ``seconds`` have passed; returns images seen."""

    def one_pass() -> int:
        start, images = time.perf_counter(), 0
        while True:
            for batch, _labels in make_iterable():
                images += len(batch)
            if time.perf_counter() - start >= seconds:
                return images

    return one_pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0, help="minimum length of one pass")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/packer-bench-loader"), help="where the data is made (kept)")
    add_output_arguments(parser)
    args = parser.parse_args()

    from readers import Loader

    cores = cpu_count()
    present = [fmt for fmt in FORMATS if available(fmt)]
    paths = make_data(args.workdir, args.images, present)
    sample_bytes = 3 * SIZE * SIZE
    results: dict[str, Any] = {"machine": machine(), "images": args.images, "batch": BATCH, "sample_bytes": sample_bytes}

    copies = {t: copy_bandwidth(512 * 2**20, t, args.repeats) for t in sorted({1, cores})}
    limit = max(r.max for r in copies.values())  # the physical limit: the fastest copy seen
    results["copy_bytes_per_s"] = copies
    print(f"data: {args.images} raw {SIZE}x{SIZE}x3 samples ({sample_bytes * args.images / 1e6:.0f} MB) in {args.workdir}")
    print("\n(a) memory copy bandwidth, GB/s, median (min-max): " + ", ".join(
        f"{t} thread(s) {r.median / 1e9:.1f} ({r.min / 1e9:.1f}-{r.max / 1e9:.1f})" for t, r in copies.items()
    ) + f"; limit used below: {limit / 1e9:.1f}")

    rows, ram = [], {}
    for fmt in FORMATS:
        if fmt not in present or not isinstance(paths[fmt], Path):
            rows.append([fmt, paths.get(fmt, "not available"), "", "", ""])
            continue
        ds = open_reader(fmt, paths[fmt])
        loader = Loader(ds, BATCH, shuffle=True)
        fast = measure(through(lambda: loader, args.seconds), repeats=args.repeats)
        ram[fmt] = loader.buffer_bytes
        share = f"{fast.median * sample_bytes / limit:.0%}"
        if fmt == "blob":
            rows.append([f"{fmt} (RAMDataset)", fast, share, "", ""])
            results[fmt] = {"loader": fast, "share_of_copy_bandwidth": fast.median * sample_bytes / limit}
            continue
        plain = DataLoader(PerSample(ds), batch_size=BATCH, shuffle=True, num_workers=0)
        slow = measure(through(lambda: plain, args.seconds), repeats=args.repeats)
        rows.append([fmt, fast, share, slow, f"{fast.median / slow.median:.1f}x"])
        results[fmt] = {"loader": fast, "per_sample_dataloader": slow, "speedup": fast.median / slow.median}
    print(f"\n(b, c) images/s, median (min-max) over {args.repeats} passes of >= {args.seconds:g} s, batch {BATCH}, "
          f"default threads ({cores} cores):")
    print(markdown_table(["reader", "Loader", "of copy bandwidth", "DataLoader per-sample, 0 workers", "Loader vs DataLoader"], rows))

    if isinstance(paths.get("lmdb"), Path):
        ds = open_reader("lmdb", paths["lmdb"])
        by_threads = {}
        for t in (1, 2, 3, 4):
            loader = Loader(ds, BATCH, threads=t)
            by_threads[t] = measure(through(lambda: loader, args.seconds), repeats=args.repeats)
        results["lmdb_by_threads"] = by_threads
        print("\n(d) Loader over LMDB by thread count, images/s:")
        print(markdown_table(["threads"] + [str(t) for t in by_threads], [["images/s"] + list(by_threads.values())]))

    results["buffer_bytes"] = ram
    results["copy_limit_bytes_per_s"] = limit
    print("\n(e) RAM held by the loader's buffers (default prefetch = 2 x threads, batch "
          f"{BATCH}): " + ", ".join(f"{fmt} {b / 2**20:.0f} MiB" for fmt, b in ram.items()))
    print("\nsaved", save_json("loader", results, output_dir(args.update_results, args.out)))


if __name__ == "__main__":
    torch.set_num_threads(1)  # nothing here computes; keep torch's pool from competing with the loader threads
    run_main(main)
