"""The pipelines packer is compared against, written the way users write them.

No torchvision: its tutorial transforms are spelled out with PIL and torch (same operations:
``Resize(256)`` bilinear with antialiasing, ``CenterCrop(224)``, ``ToTensor()``,
``Normalize(mean, std)``).
"""

from __future__ import annotations

import os
from pathlib import Path

import lmdb
import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from packer.sources.images import scan_image_folder

MEAN = torch.tensor([0.485, 0.456, 0.406]).reshape(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).reshape(3, 1, 1)


def resize_shorter_center_crop(image: Image.Image, shorter: int, crop: int) -> Image.Image:
    w, h = image.size
    scale = shorter / min(w, h)
    image = image.resize((max(crop, round(w * scale)), max(crop, round(h * scale))), Image.BILINEAR)
    w, h = image.size
    left, top = (w - crop) // 2, (h - crop) // 2
    return image.crop((left, top, left + crop, top + crop))


class TutorialFolder(Dataset):
    """ImageFolder + Resize(256) + CenterCrop(224) + ToTensor + Normalize, all on the CPU."""

    def __init__(self, root: str | Path) -> None:
        folder = scan_image_folder(root)
        self.items = [(item.path, item.label) for item in folder.items]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.items[index]
        with Image.open(path) as image:
            image = resize_shorter_center_crop(image.convert("RGB"), 256, 224)
        tensor = torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1).float().div(255)
        return (tensor - MEAN) / STD, label


def _naive_sample(job: tuple[str, int]) -> bytes:
    path, _label = job
    with Image.open(path) as image:
        image = resize_shorter_center_crop(image.convert("RGB"), 224, 224)
    return np.asarray(image).tobytes()


def naive_convert(src: str | Path, dst: str | Path, workers: int) -> int:
    """The straightforward conversion loop: PIL decode + resize in a pool, one LMDB writer."""
    from multiprocessing import get_context

    folder = scan_image_folder(src)
    jobs = [(item.path, item.label) for item in folder.items]
    env = lmdb.open(str(dst), map_size=64 << 30, subdir=True)
    try:
        with get_context("fork").Pool(workers) as pool:
            txn = env.begin(write=True)
            for i, payload in enumerate(pool.imap(_naive_sample, jobs, chunksize=16)):
                txn.put(b"%010d" % i, payload)
                if i % 1000 == 999:
                    txn.commit()
                    txn = env.begin(write=True)
            txn.commit()
    finally:
        env.close()
    return len(jobs)


def remove(path: str | Path) -> None:
    import shutil

    p = Path(path)
    if p.is_dir():
        shutil.rmtree(p)
    elif p.exists():
        os.unlink(p)
