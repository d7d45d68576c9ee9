"""Decode + resize: speed vs fidelity of each method, on one core.

    python -m benchmarks.preprocess --quick     # 40 + 8 images
    python -m benchmarks.preprocess             # 300 ImageNet-like (500x375) + 40 photo-sized (2000x1500)

Every method makes the same 224x224 output (centre square, resized) from the JPEG bytes:

* PIL full decode + LANCZOS (the quality reference most people trust);
* PIL ``draft()`` (DCT-domain reduced decode, keeping at least the target size) + ``reduce``-gap resize;
* OpenCV ``IMREAD_REDUCED_*`` (keeping at least the target size) + ``INTER_AREA``;
* OpenCV full decode + ``INTER_LINEAR`` (fast, but aliases when shrinking more than 2x);
* packer's own ``preprocess_image`` (reduced decode keeping 2x, halvings + linear + area).

Fidelity is PSNR (dB) against a float Lanczos reference (full decode, each channel resampled in
32-bit float by Pillow, never rounded). Speed is images/s in one thread (OpenCV limited to one
thread) after a warm-up; min/median/max over repeats.
"""

from __future__ import annotations

import argparse
import io
import statistics
import time
from pathlib import Path
from typing import Callable

import cv2
import numpy as np
from PIL import Image

from packer import ImageOptions
from packer.preprocess.image import preprocess_image
from packer.sources.images import scan_image_folder

from .common import DATA_DIR, add_output_arguments, machine, markdown_table, output_dir, save_json, run_main

TARGET = 224
Method = Callable[[bytes], np.ndarray]


def _box(w: int, h: int) -> tuple[int, int, int, int]:
    """The centre square on whole pixels, exactly as ``_cv_crop`` and packer's plan cut it.

    (A half-pixel difference in the box alone costs several dB on textured images.)
    """
    side = min(w, h)
    left, top = (w - side) // 2, (h - side) // 2
    return (left, top, left + side, top + side)


def reference(data: bytes) -> np.ndarray:
    """Full decode, each channel resampled with Lanczos in float32, not rounded: (224, 224, 3) float."""
    with Image.open(io.BytesIO(data)) as image:
        image = image.convert("RGB")
        box = _box(*image.size)
        channels = [c.convert("F").resize((TARGET, TARGET), Image.LANCZOS, box=box) for c in image.split()]
    return np.stack([np.asarray(c, np.float32) for c in channels], axis=-1)


def pil_lanczos(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as image:
        image = image.convert("RGB")
        return np.asarray(image.resize((TARGET, TARGET), Image.LANCZOS, box=_box(*image.size)))


def pil_draft(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as image:
        w, h = image.size
        side = min(w, h)
        image.draft("RGB", (round(TARGET * w / side), round(TARGET * h / side)))  # >= the target after the crop
        image = image.convert("RGB")
        return np.asarray(image.resize((TARGET, TARGET), Image.BILINEAR, box=_box(*image.size), reducing_gap=2.0))


_REDUCED = {1: cv2.IMREAD_COLOR, 2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4, 8: cv2.IMREAD_REDUCED_COLOR_8}


def _cv_crop(image: np.ndarray) -> np.ndarray:
    h, w = image.shape[:2]
    side = min(h, w)
    top, left = (h - side) // 2, (w - side) // 2
    return image[top : top + side, left : left + side]


def cv_reduced_area(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as probe:
        shorter = min(probe.size)
    factor = max(f for f in (1, 2, 4, 8) if shorter // f >= TARGET)
    image = cv2.imdecode(np.frombuffer(data, np.uint8), _REDUCED[factor])
    out = cv2.resize(_cv_crop(image), (TARGET, TARGET), interpolation=cv2.INTER_AREA)
    return cv2.cvtColor(out, cv2.COLOR_BGR2RGB)


def cv_linear(data: bytes) -> np.ndarray:
    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    out = cv2.resize(_cv_crop(image), (TARGET, TARGET), interpolation=cv2.INTER_LINEAR)
    return cv2.cvtColor(out, cv2.COLOR_BGR2RGB)


_PACKER = ImageOptions(size=TARGET)


def packer_preprocess(data: bytes) -> np.ndarray:
    return preprocess_image(data, _PACKER)


METHODS: dict[str, Method] = {
    "PIL full decode + LANCZOS": pil_lanczos,
    "PIL draft + reducing_gap bilinear": pil_draft,
    "OpenCV IMREAD_REDUCED + INTER_AREA": cv_reduced_area,
    "OpenCV full decode + INTER_LINEAR (aliases)": cv_linear,
    "packer preprocess_image": packer_preprocess,
}


def psnr(image: np.ndarray, ref: np.ndarray) -> float:
    mse = float(np.mean((image.astype(np.float64) - np.clip(ref, 0, 255)) ** 2))
    return 10 * np.log10(255.0**2 / mse) if mse > 0 else float("inf")


def photo_like(count: int) -> Path:
    """A cached folder of ``count`` 2000x1500 natural-looking JPEGs (camera-photo sized)."""
    from packer.samples import make_image_folder

    return make_image_folder(DATA_DIR / f"photo-like-{count}", classes=1, per_class=count, size=(1500, 2000), quality=90, seed=1, workers=2)


def bench_set(name: str, files: list[Path], repeats: int) -> list[dict]:
    blobs = [p.read_bytes() for p in files]
    refs = [reference(b) for b in blobs]
    rows = []
    for label, method in METHODS.items():
        quality = statistics.mean(psnr(method(b), r) for b, r in zip(blobs, refs))
        for b in blobs[:3]:
            method(b)  # warm-up
        rates = []
        for _ in range(repeats):
            start = time.perf_counter()
            for b in blobs:
                method(b)
            rates.append(len(blobs) / (time.perf_counter() - start))
        rows.append({"set": name, "method": label, "psnr_db": quality, "min": min(rates), "median": statistics.median(rates), "max": max(rates)})
        print(f"  {name}: {label}: {statistics.median(rates):,.0f} img/s, {quality:.2f} dB", flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    add_output_arguments(parser)
    args = parser.parse_args(argv)
    cv2.setNumThreads(1)
    small, large, repeats = (40, 8, 2) if args.quick else (300, 40, 3)
    from .common import imagenet_like

    sets = {
        "ImageNet-like 500x375": [Path(i.path) for i in scan_image_folder(imagenet_like(max(small, 320))).items][:small],
        "photo-like 2000x1500": [Path(i.path) for i in scan_image_folder(photo_like(large)).items],
    }
    rows = []
    for name, files in sets.items():
        rows += bench_set(name, files, repeats)
    table = markdown_table(
        ["images", "method", "images/s median (min-max), 1 thread", "PSNR vs float Lanczos (dB)"],
        [[r["set"], r["method"], f"{r['median']:,.0f} ({r['min']:,.0f}-{r['max']:,.0f})", f"{r['psnr_db']:.2f}"] for r in rows],
    )
    print()
    print(table)
    print("saved", save_json("preprocess-quick" if args.quick else "preprocess", {"machine": machine(), "rows": rows}, output_dir(args.update_results, args.out)))


if __name__ == "__main__":
    run_main(main)
