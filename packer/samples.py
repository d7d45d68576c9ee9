"""Deterministic, natural-looking sample image folders (for the quick start, tests, benchmarks).

Images are 1/f ("pink") noise textures, the spectrum natural photos have, with a class-specific
tint and a few hard-edged shapes, saved as JPEG. At 500x375 and quality 90 they weigh about
100 KB, like ImageNet photos, so decode and I/O costs are realistic. Nothing is downloaded.
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import cv2
import numpy as np

__all__ = ["natural_image", "make_image_folder"]


def natural_image(rng: np.random.Generator, height: int, width: int, class_index: int = 0, classes: int = 10) -> np.ndarray:
    """One (height, width, 3) RGB uint8 image whose colours depend on ``class_index``."""
    fy = np.fft.fftfreq(height)[:, None]
    fx = np.fft.rfftfreq(width)[None, :]
    freq = np.sqrt(fx * fx + fy * fy)
    freq[0, 0] = 1.0
    amplitude = 1.0 / freq
    shape = (height, width // 2 + 1)
    shared = rng.standard_normal(shape) + 1j * rng.standard_normal(shape)
    hue = class_index / max(classes, 1)
    tint = 0.25 * np.cos(2 * np.pi * (hue + np.arange(3) / 3))
    image = np.empty((height, width, 3), np.float32)
    for c in range(3):
        spectrum = 0.8 * shared + 0.6 * (rng.standard_normal(shape) + 1j * rng.standard_normal(shape))
        field = np.fft.irfft2(spectrum * amplitude, s=(height, width))
        field = (field - field.mean()) / (field.std() + 1e-8)
        image[..., c] = 0.5 + tint[c] + 0.16 * field
    yy, xx = np.ogrid[:height, :width]
    for _ in range(int(rng.integers(2, 6))):
        cy, cx = int(rng.integers(0, height)), int(rng.integers(0, width))
        r = int(rng.integers(max(1, min(height, width) // 10), max(2, min(height, width) // 3)))
        if rng.random() < 0.5:
            mask = (yy - cy) ** 2 + (xx - cx) ** 2 < r * r
        else:
            mask = (np.abs(yy - cy) < r) & (np.abs(xx - cx) < max(1, r // 2))
        image[mask] = image[mask] * 0.4 + rng.uniform(0, 1, 3).astype(np.float32) * 0.6
    image += rng.standard_normal(image.shape).astype(np.float32) * 0.03
    return np.clip(image * 255, 0, 255).astype(np.uint8)


def _write_one(job: tuple[str, int, int, int, int, int, int]) -> int:
    path, seed, height, width, class_index, classes, quality = job
    rng = np.random.default_rng(seed)
    image = natural_image(rng, height, width, class_index, classes)
    ok, buffer = cv2.imencode(".jpg", image[:, :, ::-1], [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:  # pragma: no cover
        raise RuntimeError(f"cannot encode {path}")
    tmp = Path(path + ".tmp")
    tmp.write_bytes(buffer.tobytes())
    os.replace(tmp, path)  # a file that exists is complete
    return len(buffer)


def make_image_folder(
    root: str | os.PathLike[str],
    *,
    classes: int = 3,
    per_class: int = 10,
    size: tuple[int, int] = (375, 500),
    quality: int = 90,
    seed: int = 0,
    workers: int = 1,
) -> Path:
    """Write ``classes`` x ``per_class`` JPEGs of ``size`` (height, width) under ``root``.

    Layout: ``root/class_XX/img_YYYYY.jpg``. The same arguments always give the same bytes.
    Existing files are kept (so a benchmark's data is made once).
    """
    root_path = Path(root)
    jobs = []
    for c in range(classes):
        folder = root_path / f"class_{c:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            path = folder / f"img_{i:05d}.jpg"
            if not path.exists():
                jobs.append((str(path), seed * 1_000_003 + c * 100_003 + i, size[0], size[1], c, classes, quality))
    if workers > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(workers) as pool:
            list(pool.map(_write_one, jobs, chunksize=8))
    else:
        for job in jobs:
            _write_one(job)
    return root_path


def main(argv: list[str] | None = None) -> None:
    """``python -m packer.samples DIR``: a folder of sample class folders to try packer on."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m packer.samples", description=(
        "Write a folder of natural-looking ImageNet-like JPEGs in class sub-folders (DIR/class_00/img_00000.jpg, ...), "
        "to try packer on; the same arguments always give the same bytes, and nothing is downloaded."))
    parser.add_argument("dir", type=Path, help="the folder to write (created; existing images are kept)")
    parser.add_argument("--classes", type=int, default=10, help="class folders (default 10)")
    parser.add_argument("--per-class", type=int, default=20, help="images per class (default 20)")
    parser.add_argument("--size", default="375x500", help="HEIGHTxWIDTH of each image (default 375x500, ~100 KB each)")
    args = parser.parse_args(argv)
    try:
        height, width = (int(v) for v in args.size.lower().split("x"))
    except ValueError:
        parser.error(f"--size: HEIGHTxWIDTH, for example 375x500, not {args.size!r}")
    if min(args.classes, args.per_class, height, width) < 1:
        parser.error("--classes, --per-class and --size are 1 or more")
    root = make_image_folder(args.dir, classes=args.classes, per_class=args.per_class, size=(height, width), workers=os.cpu_count() or 1)
    print(f"wrote {args.classes * args.per_class:,} JPEGs in {args.classes} class folders under {root}")


if __name__ == "__main__":
    main()
