"""packer in one minute: make a small image folder, pack it, read it back, compare speeds.

    python examples/quickstart.py            # works in a temporary folder, removed at the end
    python examples/quickstart.py --keep DIR # keep the sample folder and the LMDB in DIR

Everything is generated here (about 300 KB of JPEGs); nothing is downloaded.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader

import packer
from packer.samples import make_image_folder
from readers import LMDBDataset, Normalize

SIZE = 64
SECONDS = 1.5


def raw_folder_rate(items: list[tuple[Path, int]], normalize: Normalize) -> float:
    """Images/s of the usual per-file pipeline: PIL decode, resize, crop, float normalise."""
    start, done = time.perf_counter(), 0
    while time.perf_counter() - start < SECONDS:
        for path, _label in items:
            with Image.open(path) as image:
                image = image.convert("RGB")
                w, h = image.size
                scale = SIZE / min(w, h)
                image = image.resize((round(w * scale), round(h * scale)), Image.BILINEAR)
                left, top = (image.width - SIZE) // 2, (image.height - SIZE) // 2
                image = image.crop((left, top, left + SIZE, top + SIZE))
            tensor = torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1)
            normalize(tensor)
            done += 1
    return done / (time.perf_counter() - start)


def packed_rate(dataset: LMDBDataset, normalize: Normalize) -> float:
    """Images/s of uint8 batches from the LMDB, normalised as a GPU would (here on the CPU)."""
    loader = DataLoader(dataset, batch_size=32, shuffle=True)
    start, done = time.perf_counter(), 0
    while time.perf_counter() - start < SECONDS:
        for images, _labels in loader:
            normalize(images)
            done += len(images)
    return done / (time.perf_counter() - start)


def run(workdir: Path) -> None:
    src = make_image_folder(workdir / "images", classes=3, per_class=12, size=(96, 128), quality=90)
    files = sorted(src.rglob("*.jpg"))
    kb = sum(f.stat().st_size for f in files) / 1e3
    print(f"1. made a sample image folder: {src} (3 classes, {len(files)} JPEGs of 128x96, {kb:.0f} KB)")

    dst = workdir / "images.lmdb"
    report = packer.convert(src, dst, image=packer.ImageOptions(size=SIZE), overwrite=True)
    print(f"2. converted it (the same as `packer convert {src} {dst} --size {SIZE}`):\n   {report.summary()}")

    dataset = LMDBDataset(dst)
    normalize = Normalize()
    images, labels = next(iter(DataLoader(dataset, batch_size=8)))
    out = normalize(images)
    print(
        f"3. read it back: {dataset}\n   a batch: {tuple(images.shape)} {images.dtype} labels {labels.tolist()} -> "
        f"Normalize -> {out.dtype}, mean {out.mean():+.3f}, std {out.std():.3f}"
    )

    items = [(Path(p), 0) for p in files]
    raw = raw_folder_rate(items, normalize)
    packed = packed_rate(dataset, normalize)
    print("4. speed on this machine, one process, same images:")
    print(f"   raw folder (PIL decode + resize + crop + normalise): {raw:>9,.0f} img/s")
    print(f"   LMDB (uint8 batches + Normalize):                    {packed:>9,.0f} img/s  ({packed / raw:.0f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep", type=Path, help="work in this folder and keep the results")
    args = parser.parse_args()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        run(args.keep)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            run(Path(tmp))


if __name__ == "__main__":
    main()
