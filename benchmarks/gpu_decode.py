"""JPEG decoding on the GPU, beside the CPU path on the same host (needs CUDA and ``packer[gpu]``; not run in CI).

    python -m benchmarks.gpu_decode --update-results                  # 6,000 ImageNet-like JPEGs, 3 rounds
    python -m benchmarks.gpu_decode --images 1000 --rounds 1 --seconds 1   # a quick look

Two measurements, each side by side in interleaved rounds (A B ... B A: drift falls on all alike),
median (min-max) over ``--rounds``:

(a) **conversion** (issue 16, item 5): ``packer.convert`` of :func:`benchmarks.common.imagenet_like`
    500x375 JPEGs to a 224x224 raw blob with ``--workers`` workers (default: every core), decoded
    on the CPU (``preprocess_image`` in the workers) and with ``decode_device="cuda"`` (nvJPEG
    through nvImageCodec in the driving process, torch's antialiased bicubic resize on the GPU).
    Whole calls, images/s, and the GPU's rate over the CPU's within each round.
(b) **reading** (issue 20, item 3): the same images stored as 224x224 JPEG q90 (LMDB and blob),
    read by ``readers.Loader(..., device="cuda")`` into uint8 CUDA batches of ``--batch``, shuffled,
    decoded by ``--threads`` CPU threads (simplejpeg) and with ``decode="cuda"``; beside them the raw
    224x224 blob read by ``Loader(device="cuda")``, what JPEG storage competes with. Whole epochs for
    at least ``--seconds``, the device synchronised at the end of each; images/s. Sizes on disk too.

Agreement is checked before timing: the GPU conversion's pixels against the CPU conversion's (PSNR,
mean and largest difference; the two resize differently, see ``benchmarks.gpu_resize`` for each
against the Lanczos reference) and one unshuffled epoch decoded by nvJPEG against the same epoch
decoded on the CPU. Results: a table, and ``gpu_decode.json`` (``--update-results``:
``benchmarks/results/``).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from .common import add_output_arguments, cpu_count, imagenet_like, machine, markdown_table, output_dir, save_json, run_main
from .loader_ceiling import summary

SIZE = 224
QUALITY = 90
#: A measurement: seconds -> images/s over whole passes.
Measure = Callable[[float], float]


def disk_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


def convert_rate(src: Path, dst: Path, device: str, workers: int) -> float:
    """(a): images/s of one whole ``packer.convert`` of ``src`` to a raw blob, decoding on ``device``."""
    from packer import ImageOptions, convert

    dst.unlink(missing_ok=True)
    start = time.perf_counter()
    report = convert(src, dst, format="blob", image=ImageOptions(size=SIZE, decode_device=device), workers=workers)
    return report.written / (time.perf_counter() - start)


def loader_rate(loader: Any) -> Measure:
    """(b): images/s of whole epochs of ``loader`` (CUDA batches) over at least ``seconds``."""

    def measure(seconds: float) -> float:
        images, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            for batch, _labels in loader:
                images += len(batch)
            torch.cuda.synchronize()
        return images / (time.perf_counter() - start)

    return measure


def pixels(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Every sample of a raw blob and its labels, in stored order (read with the reader)."""
    from readers import RAMDataset

    ds = RAMDataset(path)
    images = np.stack([np.asarray(ds[i][0]) for i in range(len(ds))])
    labels = np.array([int(ds[i][1]) for i in range(len(ds))])
    return images, labels


def conversion_agreement(cpu: Path, gpu: Path) -> dict[str, Any]:
    """The GPU conversion's pixels against the CPU conversion's: same labels in the same order."""
    a, la = pixels(cpu)
    b, lb = pixels(gpu)
    diff = np.abs(a.astype(np.int16) - b.astype(np.int16))
    mse = float(np.mean(diff.astype(np.float64) ** 2))
    return {"samples": int(len(a)), "labels_equal": bool(np.array_equal(la, lb)), "mean_abs_diff": float(diff.mean()),
            "max_abs_diff": int(diff.max()), "psnr_db_between": 10 * np.log10(255**2 / mse) if mse else float("inf")}


def read_agreement(dataset: Any, batch: int) -> dict[str, Any]:
    """One unshuffled epoch decoded by nvJPEG against the same epoch decoded on the CPU."""
    from readers import Loader

    diffs = []
    gpu = Loader(dataset, batch, shuffle=False, device="cuda", decode="cuda")
    cpu = Loader(dataset, batch, shuffle=False, device="cuda")
    for (x, lx), (y, ly) in zip(gpu, cpu):
        assert torch.equal(lx, ly), "labels differ between the two decodes"
        diffs.append((x.short() - y.short()).abs())
    d = torch.cat([t.flatten() for t in diffs]).float()
    return {"mean_abs_diff": float(d.mean()), "max_abs_diff": int(d.max()), "share_equal": float((d == 0).float().mean())}


def interleaved(measures: dict[str, Measure], rounds: int, seconds: float, label: str) -> dict[str, list[float]]:
    """Each measure once per round, in A B ... B A order (two halves averaged), ``rounds`` times."""
    runs: dict[str, list[float]] = {name: [] for name in measures}
    for k in range(rounds):
        got: dict[str, list[float]] = {name: [] for name in measures}
        for name in list(measures) + list(reversed(measures)):
            got[name].append(measures[name](seconds))
        for name, rates in got.items():
            runs[name].append(statistics.fmean(rates))
        print(f"{label} round {k + 1}/{rounds}: " + ", ".join(f"{n} {runs[n][-1]:,.0f}" for n in measures), flush=True)
    return runs


def make_stored(src: Path, work: Path, workers: int) -> dict[str, Path]:
    """The raw blob and the JPEG-stored LMDB and blob the reading side measures (CPU conversions)."""
    from packer import ImageOptions, convert

    out = {"raw blob": work / "raw.blob", "jpeg lmdb": work / "jpeg.lmdb", "jpeg blob": work / "jpeg.blob"}
    jpeg = ImageOptions(size=SIZE, encoding="jpeg", quality=QUALITY)
    convert(src, out["raw blob"], format="blob", image=ImageOptions(size=SIZE), workers=workers)
    convert(src, out["jpeg lmdb"], format="lmdb", image=jpeg, workers=workers)
    convert(src, out["jpeg blob"], format="blob", image=jpeg, workers=workers)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=6000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=cpu_count(), help="conversion workers (default: every core)")
    parser.add_argument("--threads", type=int, default=cpu_count(), help="the CPU-decoding Loader's threads (default: every core)")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=3.0, help="length of one reading measurement (twice a round)")
    add_output_arguments(parser)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU (and pip install 'packer[gpu]')")
    import nvidia.nvimgcodec as nvimgcodec

    from readers import LMDBDataset, Loader, RAMDataset

    src = imagenet_like(args.images)
    with tempfile.TemporaryDirectory(prefix="packer-gpu-decode-") as tmp:
        work = Path(tmp)
        cpu_out, gpu_out = work / "cpu.blob", work / "gpu.blob"
        convert_rate(src, cpu_out, "cpu", args.workers)  # warm: imports, page cache, CUDA context, the decoder
        convert_rate(src, gpu_out, "cuda", args.workers)
        agree = conversion_agreement(cpu_out, gpu_out)
        print(f"GPU vs CPU conversion: {agree}", flush=True)
        convert_runs = interleaved({"cpu": lambda _s: convert_rate(src, cpu_out, "cpu", args.workers),
                                    "cuda": lambda _s: convert_rate(src, gpu_out, "cuda", args.workers)}, args.rounds, 0, "convert")
        for path in (cpu_out, gpu_out):
            path.unlink()

        stored = make_stored(src, work, args.workers)
        sizes = {name: disk_bytes(path) for name, path in stored.items()}
        raw, jl, jb = RAMDataset(stored["raw blob"]), LMDBDataset(stored["jpeg lmdb"]), RAMDataset(stored["jpeg blob"])
        read_agree = read_agreement(jl, args.batch)
        print(f"nvJPEG vs CPU decode on read: {read_agree}", flush=True)
        measures: dict[str, Measure] = {
            "raw blob": loader_rate(Loader(raw, args.batch, device="cuda", threads=args.threads)),
            "jpeg lmdb, cpu decode": loader_rate(Loader(jl, args.batch, device="cuda", threads=args.threads)),
            "jpeg lmdb, cuda decode": loader_rate(Loader(jl, args.batch, device="cuda", threads=args.threads, decode="cuda")),
            "jpeg blob, cpu decode": loader_rate(Loader(jb, args.batch, device="cuda", threads=args.threads)),
            "jpeg blob, cuda decode": loader_rate(Loader(jb, args.batch, device="cuda", threads=args.threads, decode="cuda")),
        }
        for measure in measures.values():  # warm-up: buffers, pinned memory, decoder state
            measure(0.5)
        read_runs = interleaved(measures, args.rounds, args.seconds, "read")

    ratio = lambda a, b: summary([x / y for x, y in zip(a, b)])  # noqa: E731
    result = {
        "machine": machine() | {"gpu": torch.cuda.get_device_name(), "cuda": torch.version.cuda, "nvimgcodec": nvimgcodec.__version__},
        "images": args.images, "size": SIZE, "quality": QUALITY, "rounds": args.rounds, "workers": args.workers,
        "threads": args.threads, "batch": args.batch, "seconds": args.seconds,
        "convert": {"images_per_s": {k: summary(v) for k, v in convert_runs.items()},
                    "cuda_over_cpu": ratio(convert_runs["cuda"], convert_runs["cpu"]), "agreement": agree},
        "read": {"images_per_s": {k: summary(v) for k, v in read_runs.items()},
                 "of_raw_blob": {k: ratio(v, read_runs["raw blob"]) for k, v in read_runs.items()},
                 "cuda_over_cpu_decode": {f: ratio(read_runs[f"{f}, cuda decode"], read_runs[f"{f}, cpu decode"]) for f in ("jpeg lmdb", "jpeg blob")},
                 "bytes_on_disk": sizes, "agreement": read_agree},
    }
    print(f"saved {save_json('gpu_decode', result, output_dir(args.update_results, args.out))}\n")
    print(render(result))


def render(result: dict[str, Any]) -> str:
    """Two tables: conversion by decode device; reading by stored encoding and decode device."""
    fig = lambda r: f"{r['median']:,.0f} ({r['min']:,.0f}-{r['max']:,.0f})"  # noqa: E731
    x = lambda r: f"{r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f})"  # noqa: E731
    c, r = result["convert"], result["read"]
    head = (f"{result['machine'].get('gpu', '?')}, {result['machine']['cores']} cores; {result['images']:,} ImageNet-like JPEGs; "
            f"median (min-max) of {result['rounds']} interleaved rounds.")
    conv = markdown_table(["conversion to a 224x224 raw blob", "images/s", "GPU over CPU"],
                          [[f"decode on the CPU, {result['workers']} workers", fig(c["images_per_s"]["cpu"]), ""],
                           ["decode on the GPU (--decode-device cuda)", fig(c["images_per_s"]["cuda"]), x(c["cuda_over_cpu"])]])
    sizes = r["bytes_on_disk"]
    rows = []
    for name, rates in r["images_per_s"].items():
        stored = "raw blob" if name == "raw blob" else name.split(",")[0]
        rows.append([name, f"{sizes[stored] / 1e6:,.0f} MB", fig(rates), x(r["of_raw_blob"][name])])
    read = markdown_table([f"Loader(device='cuda'), batch {result['batch']}, {result['threads']} threads", "on disk", "images/s", "of raw blob"], rows)
    return head + "\n\n" + conv + "\n\n" + read


if __name__ == "__main__":
    run_main(main)
