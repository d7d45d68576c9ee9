"""Where a many-core conversion stops: the work itself, the output path, or the one driver process.

    python -m benchmarks.scaling_ceilings                         # all cores, 3,000 ImageNet-like JPEGs
    python -m benchmarks.scaling_ceilings --workers 16 --images 9000

Each row is one timed pass (these are ceilings to compare within a run, not precise rates):
(a) JPEG decode + resize alone in 1, k/2 and k processes (one in-memory 500x375 JPEG, PIL,
    no result sent anywhere): what the cores can do; then the same reading each JPEG from its
    own file, and the file reads alone (``--images`` files);
(b) 150 KB results sent through a ``multiprocessing`` pool's pipes into one process (k
    workers, no work): what one gathering process receives;
(c) 150 KB writes to disk from 1 and k processes: what the disk takes;
(d) real conversions of ``--images`` files to raw 224 with k workers: WebDataset with many
    shards (workers write their own), WebDataset with fewer shards than 2 per worker (workers
    write fragments, the driver assembles every shard) and the blob (one writer receives every
    sample). After a warm-up conversion (worker start-up, imports).
"""

from __future__ import annotations

import argparse
import io
import multiprocessing
import os
import tempfile
import time
from pathlib import Path

from packer import ImageOptions, StorageOptions, convert

from .common import cpu_count, imagenet_like, machine, markdown_table, save_json, run_main

SAMPLE = 3 * 224 * 224
_JPEG = b""


def _jpeg() -> bytes:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:375, 0:500]
    pixels = (np.stack([x % 256, y % 256, (x + y) % 256], -1) + rng.integers(0, 40, (375, 500, 3))).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def _decode_for(seconds: float) -> int:
    from PIL import Image

    count, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        Image.open(io.BytesIO(_JPEG)).convert("RGB").resize((224, 224), Image.BILINEAR, reducing_gap=None)
        count += 1
    return count


def _read_files(paths: list[str]) -> int:
    for path in paths:
        with open(path, "rb") as handle:
            handle.read()
    return len(paths)


def _read_and_decode(paths: list[str]) -> int:
    from PIL import Image

    for path in paths:
        with open(path, "rb") as handle:
            Image.open(io.BytesIO(handle.read())).convert("RGB").resize((224, 224), Image.BILINEAR, reducing_gap=None)
    return len(paths)


def _result(_index: int) -> bytes:
    return bytes(SAMPLE)


def _write(args: tuple[str, int]) -> int:
    path, count = args
    block = os.urandom(SAMPLE)
    with open(path, "wb") as handle:
        for _ in range(count):
            handle.write(block)
        handle.flush()
        os.fsync(handle.fileno())
    os.unlink(path)
    return count


def main() -> None:
    global _JPEG
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=cpu_count())
    parser.add_argument("--images", type=int, default=3000)
    args = parser.parse_args()
    k = args.workers
    _JPEG = _jpeg()
    context = multiprocessing.get_context("fork")
    rows: list[tuple[str, float]] = []
    for n in sorted({1, max(1, k // 2), k}):
        with context.Pool(n) as pool:
            rows.append((f"(a) decode + resize alone, {n} processes", sum(pool.map(_decode_for, [3.0] * n)) / 3.0))
    with tempfile.TemporaryDirectory(prefix="packer-ceilings-") as tmp:
        files = [f"{tmp}/{i:06d}.jpg" for i in range(args.images)]
        for path in files:
            Path(path).write_bytes(_JPEG)
        for label, fn in [("reading each JPEG from its file + decode + resize", _read_and_decode), ("file reads alone", _read_files)]:
            for n in sorted({1, k}):
                with context.Pool(n) as pool:
                    started = time.perf_counter()
                    done = sum(pool.map(fn, [files[j::n] for j in range(n)]))
                    rows.append((f"(a) {label}, {n} processes", done / (time.perf_counter() - started)))
        for path in files:
            os.unlink(path)
        with context.Pool(k) as pool:
            started = time.perf_counter()
            received = sum(1 for _ in pool.imap(_result, range(args.images), chunksize=16))
            rows.append((f"(b) 150 KB results into one process, {k} workers", received / (time.perf_counter() - started)))
        for n in sorted({1, k}):
            with context.Pool(n) as pool:
                started = time.perf_counter()
                written = sum(pool.map(_write, [(f"{tmp}/{j}.bin", args.images // n) for j in range(n)]))
                rows.append((f"(c) 150 KB writes to disk, {n} processes", written / (time.perf_counter() - started)))
        src = imagenet_like(args.images)
        image = ImageOptions(size=224)
        many, few = max(1, args.images // (6 * k)), max(1, args.images // max(1, k // 2))
        convert(src, Path(tmp) / "warm.blob", image=image, workers=k)
        for name, fmt, shard_size in [
            (f"(d) WebDataset, shards of {many} ({-(-args.images // many)}: workers write them)", "webdataset", many),
            (f"(d) WebDataset, shards of {few} ({-(-args.images // few)}: fragments, the driver assembles)", "webdataset", few),
            ("(d) blob (one writer receives every sample)", "blob", None),
        ]:
            started = time.perf_counter()
            report = convert(src, Path(tmp) / f"out-{fmt}", format=fmt, image=image, storage=StorageOptions(shard_size=shard_size),
                             workers=k, overwrite=True)
            rows.append((name, report.written / (time.perf_counter() - started)))
    print(f"\n{cpu_count()} cores, {k} workers, {args.images} images\n")
    print(markdown_table(["what", "samples/s", "MB/s (raw 224)"], [[name, f"{rate:,.0f}", f"{rate * SAMPLE / 1e6:,.0f}"] for name, rate in rows]))
    out = save_json("scaling_ceilings", {"machine": machine(), "workers": k, "images": args.images, "rows": dict(rows)})
    print(f"saved {out}")


if __name__ == "__main__":
    run_main(main)
