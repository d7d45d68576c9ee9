"""Reading a JPEG-stored dataset: ``readers.Loader`` with simplejpeg, with Pillow, and a plain Pillow thread pool, in one run.

    python -m benchmarks.jpeg_read                      # 3,000 ImageNet-like images, stored as 224x224 JPEG q90 (made once)
    python -m benchmarks.jpeg_read --update-results     # ... to benchmarks/results/jpeg_read.json
    python -m benchmarks.jpeg_read --images 500 --rounds 2 --seconds 0.5   # a quick look

The data: :func:`benchmarks.common.imagenet_like` 500x375 JPEGs converted with
``--size 224 --encoding jpeg --quality 90`` (centre crops, stored by OpenCV's encoder, 4:2:0) to
each of ``--formats``, kept in ``--workdir``. Measured side by side in interleaved rounds: each round
runs every measurement for ``--seconds``, then again in reverse order (A B C C B A: load that
drifts during the round falls on all of them alike), and a measurement's rate in the round is
its images over its time in both. All pages warm in RAM, ``--threads`` threads (default 2),
shuffled batches of ``--batch``, (C, H, W) uint8 batches:

(a) ``pillow pool``: a plain ``ThreadPoolExecutor`` decoding the same stored bytes (held in a list
    in RAM) with Pillow into numpy (``np.asarray(Image.open(...).convert("RGB"))``), each batch
    split into one contiguous chunk per thread written into a batch array (the reference the
    issue names);
(b) ``simplejpeg pool``: the same pool decoding with ``simplejpeg`` (RGB) into a scratch buffer
    and one transposing copy per sample (the plain way to use the decoder);
(c) ``readers.Loader`` as it was: Pillow only (``simplejpeg`` made unimportable for the
    measurement, the way it reads when the extra is not installed);
(d) ``readers.Loader`` as it is: ``simplejpeg`` where it gives Pillow's pixels.
The Loaders use their defaults otherwise (``buffers="checked"``, the stored checksum of each
sample verified). Each figure is images/s over whole passes (epochs of the Loaders); ratios are
taken within a round, then summarised as median (min-max) over the rounds; the 1-minute load
average after each round is recorded (other jobs sharing the cores show there). FFCV's JPEG path is not run here: the
issue's figure (2,402 img/s, FFCV q90, 2 threads) is from another sitting on this VM, and the
``vs_ffcv_reference`` ratio divides by it only as a rough guide. Before timing, every sample is
decoded both ways and compared (``identical_to_pillow``). Each round also times, on one thread,
the decode of one sample into a (C, H, W) row (``per_sample_us``, over the first 256 samples):
Pillow (the Loader's old decode), simplejpeg RGB + a transposing copy, and
``readers.codecs.decode_into`` (simplejpeg RGBX + a shift per plane).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch

from .common import add_output_arguments, cpu_count, imagenet_like, markdown_table, output_dir, save_json, run_main
from .loader import FORMATS, open_reader
from .loader_ceiling import summary

#: A measurement: seconds -> (images, seconds taken), over whole passes.
Measure = Callable[[float], tuple[int, float]]

SIZE = 224
QUALITY = 90
#: FFCV's JPEG path (q90, 2 threads) in issue 20, measured in another sitting on this VM: a rough guide only.
FFCV_REFERENCE = 2402


def make_data(workdir: Path, images: int, formats: list[str]) -> dict[str, Path]:
    """``images`` ImageNet-like JPEGs converted to 224x224 JPEG q90 in each format (made once)."""
    from packer import ImageOptions, convert
    from readers.formats import open_store
    from readers.schema import PackedFormatError

    src = imagenet_like(images)
    workdir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for fmt in formats:
        dst = workdir / f"jpeg{QUALITY}-{src.name}{FORMATS[fmt][0]}"
        try:
            open_store(dst)  # a cached conversion this version still reads
        except (FileNotFoundError, PackedFormatError):
            convert(src, dst, format=fmt, image=ImageOptions(size=SIZE, encoding="jpeg", quality=QUALITY), workers=cpu_count(), overwrite=True)
        paths[fmt] = dst
    return paths


@contextlib.contextmanager
def pillow_only() -> Iterator[None]:
    """Within the block, ``simplejpeg`` cannot be imported: readers decode as without the extra."""
    from readers.decoders import simplejpeg_module

    saved = sys.modules.get("simplejpeg")
    sys.modules["simplejpeg"] = None  # type: ignore[assignment]  # `import simplejpeg` raises ImportError
    simplejpeg_module.cache_clear()
    try:
        yield
    finally:
        if saved is None:
            del sys.modules["simplejpeg"]
        else:
            sys.modules["simplejpeg"] = saved
        simplejpeg_module.cache_clear()


def _pillow_chunk(payloads: list[bytes], indices: np.ndarray, out: np.ndarray) -> None:
    from PIL import Image

    for j, i in enumerate(indices.tolist()):
        with Image.open(io.BytesIO(payloads[i])) as image:
            out[j] = np.asarray(image.convert("RGB")).transpose(2, 0, 1)


def _simplejpeg_chunk(payloads: list[bytes], indices: np.ndarray, out: np.ndarray) -> None:
    import simplejpeg

    scratch = np.empty((*out.shape[2:], 3), np.uint8)
    for j, i in enumerate(indices.tolist()):
        simplejpeg.decode_jpeg(payloads[i], "RGB", buffer=scratch)
        out[j] = scratch.transpose(2, 0, 1)


def pool_rate(payloads: list[bytes], chunk: Callable[..., None], batch: int, threads: int, shape: tuple[int, ...]) -> Measure:
    """A measurement: shuffled passes, each batch split between ``threads``
    threads of one pool, ``threads`` batches in flight (so no thread waits for another's batch)."""
    pool = ThreadPoolExecutor(threads)
    buffers = [np.zeros((batch, *shape), np.uint8) for _ in range(threads)]
    rng = np.random.default_rng(0)

    def one_batch(indices: np.ndarray, out: np.ndarray) -> None:
        chunk(payloads, indices, out[: len(indices)])

    def measure(seconds: float) -> tuple[int, float]:
        images, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            order = rng.permutation(len(payloads))
            batches = [order[k : k + batch] for k in range(0, len(order), batch)]
            for k in range(0, len(batches), threads):  # `threads` whole batches at once, one per thread
                group = batches[k : k + threads]
                for future in [pool.submit(one_batch, b, buffers[j]) for j, b in enumerate(group)]:
                    future.result()
                images += sum(len(b) for b in group)
        return images, time.perf_counter() - start

    return measure


def loader_rate(loader: Any) -> Measure:
    """A measurement: whole epochs of ``loader`` for at least ``seconds``."""

    def measure(seconds: float) -> tuple[int, float]:
        images, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            for batch, _labels in loader:
                images += len(batch)
        return images, time.perf_counter() - start

    return measure


def per_sample(payloads: list[bytes], shape: tuple[int, ...]) -> dict[str, Callable[[], float]]:
    """One thread: microseconds to decode one of the first 256 samples into a (C, H, W) row, each way."""
    import simplejpeg

    from readers.codecs import decode_into
    from readers.decoders import pillow_decode

    sample, out, scratch = payloads[:256], np.empty(shape, np.uint8), np.empty((*shape[1:], 3), np.uint8)

    def pillow(p: bytes) -> None:
        out[...] = pillow_decode(p, 3)

    def transposed(p: bytes) -> None:
        simplejpeg.decode_jpeg(p, "RGB", buffer=scratch)
        out[...] = scratch.transpose(2, 0, 1)

    def timed(decode: Callable[[bytes], None]) -> Callable[[], float]:
        def measure() -> float:
            start = time.perf_counter()
            for p in sample:
                decode(p)
            return (time.perf_counter() - start) / len(sample) * 1e6

        return measure

    return {"pillow": timed(pillow), "simplejpeg RGB + transposing copy": timed(transposed),
            "decode_into (simplejpeg RGBX + plane shifts)": timed(lambda p: decode_into(p, out))}


def check_identical(dataset: Any, payloads: list[bytes]) -> dict[str, Any]:
    """Every sample through the store with simplejpeg, and with Pillow only: the largest difference."""
    store = dataset.store
    worst, fast = 0, 0
    from readers.decoders import turbo_decode_into

    for start in range(0, len(payloads), 256):
        indices = np.arange(start, min(start + 256, len(payloads)))
        mine = store.read_batch(indices)[0]
        with pillow_only():
            pillow = store.read_batch(indices)[0]
        worst = max(worst, int(np.abs(mine.astype(np.int16) - pillow).max()))
        fast += sum(turbo_decode_into(payloads[i], np.empty_like(mine[0])) for i in indices.tolist())
    return {"samples": len(payloads), "decoded_by_simplejpeg": fast, "max_abs_difference": worst, "identical_to_pillow": worst == 0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2, help="threads of the pools and of each Loader")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=1.0, help="length of one measurement (twice a round)")
    parser.add_argument("--formats", default="blob,lmdb", help="comma-separated, of " + ", ".join(FORMATS))
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/packer-bench-jpeg-read"), help="where the data is made (kept)")
    add_output_arguments(parser)
    args = parser.parse_args()
    import simplejpeg

    from readers import Loader

    formats = [f for f in args.formats.split(",") if f]
    datasets = {fmt: open_reader(fmt, path) for fmt, path in make_data(args.workdir, args.images, formats).items()}
    first = next(iter(datasets.values())).store
    payloads = [bytes(payload) for _label, _shape, payload in first.records(range(len(first)))]
    shape = tuple(first.meta.shape)
    header = simplejpeg.decode_jpeg_header(payloads[0])
    identical = check_identical(next(iter(datasets.values())), payloads)
    print(f"{len(payloads):,} samples of {shape}, {np.mean([len(p) for p in payloads]) / 1e3:.1f} kB mean, "
          f"{header[2]} {header[3]}; simplejpeg vs Pillow: {identical}", flush=True)

    measurements: dict[str, Measure] = {
        "pillow pool": pool_rate(payloads, _pillow_chunk, args.batch, args.threads, shape),
        "simplejpeg pool": pool_rate(payloads, _simplejpeg_chunk, args.batch, args.threads, shape),
    }
    for fmt, ds in datasets.items():
        loader = Loader(ds, args.batch, shuffle=True, threads=args.threads)
        measurements[f"{fmt} Loader pillow"] = _with_pillow_only(loader_rate(loader))
        measurements[f"{fmt} Loader simplejpeg"] = loader_rate(loader)
    for measure in measurements.values():  # warm-up: pages, buffers, threads
        measure(min(0.5, args.seconds))
    singles = per_sample(payloads, shape)
    runs: dict[str, list[float]] = {name: [] for name in measurements}
    single_runs: dict[str, list[float]] = {name: [] for name in singles}
    load: list[list[float]] = []
    for k in range(args.rounds):
        done = {name: [0, 0.0] for name in measurements}
        for name in list(measurements) + list(reversed(measurements)):
            images, seconds = measurements[name](args.seconds)
            done[name][0] += images
            done[name][1] += seconds
        for name, (images, seconds) in done.items():
            runs[name].append(images / seconds)
        for name in list(singles) if k % 2 == 0 else list(reversed(singles)):
            single_runs[name].append(singles[name]())
        load.append([round(x, 2) for x in os.getloadavg()])
        print(f"round {k + 1}/{args.rounds} (load {load[-1][0]}): " + ", ".join(f"{n} {runs[n][-1]:,.0f}" for n in measurements), flush=True)

    ratio = lambda a, b: summary([x / y for x, y in zip(a, b)])  # noqa: E731
    pool = runs["pillow pool"]
    results: dict[str, Any] = {
        "images": len(payloads), "sample_shape": shape, "stored": {"quality": QUALITY, "colorspace": header[2], "subsampling": header[3],
                                                                   "mean_bytes": float(np.mean([len(p) for p in payloads]))},
        "batch": args.batch, "threads": args.threads, "rounds": args.rounds, "seconds": args.seconds, "cores": cpu_count(),
        "load_average_per_round": load, "simplejpeg": simplejpeg.__version__, "decoding": identical,
        "ffcv_reference": {"images_per_s": FFCV_REFERENCE, "source": "issue 20: FFCV JPEG q90, 2 threads, another sitting on this VM"},
        "pools": {name.split()[0]: {"images_per_s": summary(runs[name]), "of_pillow_pool": ratio(runs[name], pool)}
                  for name in ("pillow pool", "simplejpeg pool")},
        "loader": {},
        "per_sample_us": {name: summary(values) for name, values in single_runs.items()},
    }
    table = [[name, _fig(summary(runs[name])), _x(ratio(runs[name], pool)), "", ""] for name in ("pillow pool", "simplejpeg pool")]
    for fmt in datasets:
        old, new = runs[f"{fmt} Loader pillow"], runs[f"{fmt} Loader simplejpeg"]
        entry = {
            "pillow": {"images_per_s": summary(old), "of_pillow_pool": ratio(old, pool)},
            "simplejpeg": {"images_per_s": summary(new), "of_pillow_pool": ratio(new, pool), "of_loader_pillow": ratio(new, old),
                           "vs_ffcv_reference": summary([x / FFCV_REFERENCE for x in new])},
        }
        results["loader"][fmt] = entry
        table.append([f"{fmt} Loader pillow", _fig(entry["pillow"]["images_per_s"]), _x(entry["pillow"]["of_pillow_pool"]), "", ""])
        table.append([f"{fmt} Loader simplejpeg", _fig(entry["simplejpeg"]["images_per_s"]), _x(entry["simplejpeg"]["of_pillow_pool"]),
                      _x(entry["simplejpeg"]["of_loader_pillow"]), _x(entry["simplejpeg"]["vs_ffcv_reference"])])
    print(f"\n{len(payloads):,} JPEG q{QUALITY} samples of {SIZE}x{SIZE}x3, batch {args.batch}, {args.threads} threads, "
          f"{args.rounds} rounds of 2 x {args.seconds:g} s each, {cpu_count()} cores, load average per round {[l[0] for l in load]}")
    print("one thread, microseconds a sample: " + ", ".join(f"{n} {_fig(summary(v))}" for n, v in single_runs.items()))
    print(markdown_table(["", "images/s", "of Pillow pool", "of Loader pillow", f"of FFCV {FFCV_REFERENCE:,} (other sitting)"], table))
    print("\nsaved", save_json("jpeg_read", results, output_dir(args.update_results, args.out)))


def _with_pillow_only(measure: Measure) -> Measure:
    def pillow(seconds: float) -> tuple[int, float]:
        with pillow_only():
            return measure(seconds)

    return pillow


def _fig(r: dict[str, Any]) -> str:
    return f"{r['median']:,.0f} ({r['min']:,.0f}-{r['max']:,.0f})"


def _x(r: dict[str, Any]) -> str:
    return f"{r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f})"


if __name__ == "__main__":
    torch.set_num_threads(1)  # nothing here computes; keep torch's pool from competing with the decoding threads
    run_main(main)
