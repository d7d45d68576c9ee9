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


class FastFolder(Dataset):
    """The raw folder with the best per-sample tricks a careful user writes by hand.

    PIL ``draft()`` (JPEG decoded at 1/2, 1/4 or 1/8 scale in the DCT domain when the image stays
    at least as large as needed), one resize straight from the centre box to 224x224 (the same
    geometry as Resize(256) + CenterCrop(224), a quarter of the pixels resampled), uint8 output:
    the float conversion and normalisation happen later, on the device. Same output as packer's.
    """

    def __init__(self, root: str | Path, *, shorter: int = 256, crop: int = 224) -> None:
        folder = scan_image_folder(root)
        self.items = [(item.path, item.label) for item in folder.items]
        self.shorter, self.crop = shorter, crop

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.items[index]
        with Image.open(path) as image:
            w, h = image.size
            scale = self.shorter / min(w, h)
            image.draft("RGB", (round(w * scale), round(h * scale)))  # keeps >= the requested size
            image = image.convert("RGB")
            w2, h2 = image.size
            side = self.crop / self.shorter * min(w2, h2)  # the centre box that becomes the crop
            left, top = (w2 - side) / 2, (h2 - side) / 2
            image = image.resize((self.crop, self.crop), Image.BILINEAR, box=(left, top, left + side, top + side))
        return torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1), label


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
