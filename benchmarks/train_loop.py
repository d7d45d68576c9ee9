"""The classic data-pipeline experiment: the same small network, four ways of feeding it.

    python -m benchmarks.train_loop --quick    # 6,000 images, 2 epochs (about a minute)
    python -m benchmarks.train_loop            # 70,000 images, 5 epochs

An MNIST-like set (70,000 28x28 grayscale digits, 10 classes; see :func:`make_digits`) trains a
784-128-64-10 feed-forward network with Adam (lr 1e-3), batch 64:

1. a per-file PNG folder dataset (PIL open, ToTensor-style float, Normalize) through
   ``DataLoader(num_workers=0, pin_memory=False)``, the tutorial way;
2. the same with ``num_workers`` = cores;
3. plus ``pin_memory=True`` and ``.to(device, non_blocking=True)``;
4. the same images packed once by packer (blob, else LMDB) and read with ``readers.Loader`` as
   uint8 batches, ``readers.Normalize`` on the device (a plain DataLoader over the packed
   dataset with batched reads when ``readers.Loader`` is not importable; the output says so).

Every configuration starts from the same weights; the figure is the wall time of the whole
training (data + compute), and the final loss is the mean over the last epoch.
Targets: (4) at least 5x faster than (1) and 2x faster than (3), final loss within noise.

Real MNIST is not used: no registry package ships its files without a download at run time
(torchvision and the ``mnist``-style packages fetch them), so digits are rendered
deterministically with OpenCV's Hershey fonts, randomly rotated, scaled, sheared, thickened and
blurred, then area-resized to 28x28 like MNIST's anti-aliased digits.
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Callable, Iterable

import cv2
import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset

from packer import ImageOptions, convert
from packer.sources.images import scan_image_folder

from .common import DATA_DIR, add_output_arguments, cpu_count, machine, markdown_table, output_dir, save_json, run_main

BATCH = 64
LR = 1e-3
MEAN, STD = 0.1307, 0.3081
FONTS = (
    cv2.FONT_HERSHEY_SIMPLEX,
    cv2.FONT_HERSHEY_DUPLEX,
    cv2.FONT_HERSHEY_COMPLEX,
    cv2.FONT_HERSHEY_TRIPLEX,
    cv2.FONT_HERSHEY_SCRIPT_SIMPLEX,
    cv2.FONT_HERSHEY_SCRIPT_COMPLEX,
    cv2.FONT_HERSHEY_PLAIN,
)


# ------------------------------------------------------------------------------------------ data


def render_digit(digit: int, seed: int) -> np.ndarray:
    """One 28x28 uint8 digit (white on black), varied in font, stroke, pose and blur by ``seed``."""
    rng = np.random.default_rng(seed)
    canvas = np.zeros((112, 112), np.uint8)
    font = FONTS[int(rng.integers(len(FONTS)))]
    scale = 2.6 if font == cv2.FONT_HERSHEY_PLAIN else 2.0
    thickness = int(rng.integers(4, 11))
    (w, h), _ = cv2.getTextSize(str(digit), font, scale, thickness)
    cv2.putText(canvas, str(digit), ((112 - w) // 2, (112 + h) // 2), font, scale, 255, thickness, cv2.LINE_AA)
    angle = rng.uniform(-18, 18)
    zoom = rng.uniform(0.75, 1.1)
    matrix = cv2.getRotationMatrix2D((56, 56), angle, zoom)
    matrix[0, 1] += rng.uniform(-0.3, 0.3)  # shear
    matrix[:, 2] += rng.uniform(-8, 8, 2)
    canvas = cv2.warpAffine(canvas, matrix, (112, 112), flags=cv2.INTER_LINEAR)
    canvas = cv2.GaussianBlur(canvas, (0, 0), rng.uniform(0.5, 2.0))
    # MNIST: the digit's bounding box fits 20x20, centred by mass in 28x28.
    ys, xs = np.nonzero(canvas > 30)
    if len(ys):
        top, bottom, left, right = ys.min(), ys.max() + 1, xs.min(), xs.max() + 1
        crop = canvas[top:bottom, left:right]
        f = 20 / max(crop.shape)
        crop = cv2.resize(crop, (max(1, round(crop.shape[1] * f)), max(1, round(crop.shape[0] * f))), interpolation=cv2.INTER_AREA)
        out = np.zeros((28, 28), np.uint8)
        y, x = (28 - crop.shape[0]) // 2, (28 - crop.shape[1]) // 2
        out[y : y + crop.shape[0], x : x + crop.shape[1]] = crop
    else:  # pragma: no cover - every digit draws something
        out = cv2.resize(canvas, (28, 28), interpolation=cv2.INTER_AREA)
    noise = rng.normal(0, 6, out.shape)
    return np.clip(out.astype(np.float32) + noise * (out > 0), 0, 255).astype(np.uint8)


def _write_digit(job: tuple[str, int, int]) -> None:
    path, digit, seed = job
    cv2.imwrite(path, render_digit(digit, seed))


def make_digits(images: int, *, workers: int | None = None) -> Path:
    """A cached folder ``benchmarks/data/digits-N/<d>/NNNNN.png`` of ``images`` PNGs (made once)."""
    root = DATA_DIR / f"digits-{images}"
    done = root / ".complete"
    if done.exists():
        return root
    jobs = []
    for i in range(images):
        digit = i % 10
        folder = root / str(digit)
        folder.mkdir(parents=True, exist_ok=True)
        jobs.append((str(folder / f"{i:05d}.png"), digit, i))
    with get_context("fork").Pool(workers or cpu_count()) as pool:
        pool.map(_write_digit, jobs, chunksize=256)
    done.touch()
    return root


class PNGFolder(Dataset):
    """The tutorial image-folder dataset: one PNG per ``__getitem__``, ToTensor + Normalize on the CPU."""

    def __init__(self, root: Path) -> None:
        self.items = [(item.path, item.label) for item in scan_image_folder(root).items]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.items[index]
        with Image.open(path) as image:
            pixels = np.asarray(image.convert("L"), dtype=np.float32) / 255.0
        return (torch.from_numpy(pixels).unsqueeze(0) - MEAN) / STD, label


# ----------------------------------------------------------------------------------------- model


def make_model(seed: int = 0) -> nn.Module:
    """784-128-64-10 with ReLU, the same initial weights for every configuration."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))


@dataclass
class Outcome:
    """One configuration's training run."""

    name: str
    seconds: float
    images: int
    final_loss: float
    note: str = ""

    @property
    def images_per_second(self) -> float:
        return self.images / self.seconds


def train(
    name: str,
    batches: Callable[[int], Iterable[tuple[torch.Tensor, torch.Tensor]]],
    *,
    epochs: int,
    device: torch.device,
    prepare: Callable[[torch.Tensor], torch.Tensor],
    non_blocking: bool = False,
    note: str = "",
) -> Outcome:
    """Train a fresh model for ``epochs`` over ``batches(epoch)``; time everything."""
    model = make_model().to(device)
    optimiser = torch.optim.Adam(model.parameters(), lr=LR)
    loss_fn = nn.CrossEntropyLoss()
    images, last = 0, []
    start = time.perf_counter()
    for epoch in range(epochs):
        losses = []
        for x, y in batches(epoch):
            x = prepare(x.to(device, non_blocking=non_blocking))
            y = y.to(device, non_blocking=non_blocking)
            optimiser.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            optimiser.step()
            losses.append(loss.detach())
            images += len(y)
        last = losses
    final = float(torch.stack(last).mean()) if last else math.nan
    if device.type == "cuda":
        torch.cuda.synchronize()
    return Outcome(name, time.perf_counter() - start, images, final, note)


def dataloader_batches(loader: DataLoader) -> Callable[[int], Iterable[Any]]:
    return lambda epoch: loader


# ------------------------------------------------------------------------------------------- run


def run(images: int, epochs: int) -> dict[str, Any]:
    """All four configurations; returns every figure."""
    from readers import Normalize

    cores = cpu_count()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    src = make_digits(images)
    print(f"data: {src} ({images:,} PNGs of 28x28); device {device}; {cores} cores; {epochs} epochs, batch {BATCH}", flush=True)
    folder = PNGFolder(src)
    identity: Callable[[torch.Tensor], torch.Tensor] = lambda x: x  # noqa: E731
    outcomes = []
    notes = []

    print("(1) DataLoader, num_workers=0", flush=True)
    loader = DataLoader(folder, batch_size=BATCH, shuffle=True, num_workers=0, pin_memory=False)
    outcomes.append(train("(1) PNG folder, DataLoader num_workers=0", dataloader_batches(loader), epochs=epochs, device=device, prepare=identity))

    print(f"(2) DataLoader, num_workers={cores}", flush=True)
    loader = DataLoader(folder, batch_size=BATCH, shuffle=True, num_workers=cores, persistent_workers=True)
    outcomes.append(train(f"(2) PNG folder, num_workers={cores}", dataloader_batches(loader), epochs=epochs, device=device, prepare=identity))
    del loader

    print("(3) + pin_memory, non_blocking", flush=True)
    pin = device.type == "cuda"
    if not pin:
        notes.append("pin_memory=True has no effect without a GPU (there is nothing to pin for); (3) runs with it off")
    loader = DataLoader(folder, batch_size=BATCH, shuffle=True, num_workers=cores, persistent_workers=True, pin_memory=pin)
    outcomes.append(train(f"(3) PNG folder, num_workers={cores}, pin_memory, non_blocking", dataloader_batches(loader), epochs=epochs,
                          device=device, prepare=identity, non_blocking=True))
    del loader

    with tempfile.TemporaryDirectory(prefix="train-loop-", dir=DATA_DIR) as tmp:
        from packer.writers import get_writer

        try:
            get_writer("blob")
            dst, fmt = Path(tmp) / "digits.blob", "blob"
        except (ImportError, AttributeError):
            dst, fmt = Path(tmp) / "digits.lmdb", "lmdb"
        start = time.perf_counter()
        convert(src, dst, format=fmt, image=ImageOptions(size=28, grayscale=True), workers=cores)
        packing = time.perf_counter() - start
        print(f"(4) packed into {fmt} in {packing:.1f} s", flush=True)
        from packer.bench import open_packed

        dataset = open_packed(dst, fmt)
        normalize = Normalize(mean=(MEAN,), std=(STD,)).to(device)
        try:
            from readers import Loader
        except (ImportError, AttributeError) as exc:
            note = f"readers.Loader not importable ({exc}): plain DataLoader with batched reads"
            plain = DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=0)
            outcomes.append(train(f"(4) packer {fmt}, DataLoader (batched reads) + Normalize", dataloader_batches(plain), epochs=epochs,
                                  device=device, prepare=normalize, non_blocking=True, note=note))
            notes.append(note)
        else:
            threaded = Loader(dataset, BATCH, shuffle=True, device=device if device.type == "cuda" else None)

            def epochs_of(epoch: int) -> Iterable[Any]:
                threaded.set_epoch(epoch)
                return threaded

            outcomes.append(train(f"(4) packer {fmt}, readers.Loader + Normalize on {device.type}", epochs_of, epochs=epochs,
                                  device=device, prepare=normalize, non_blocking=True))
            threaded.close()
        del dataset

    base, three, packed = outcomes[0], outcomes[2], outcomes[3]
    reference = [o.final_loss for o in outcomes[:3]]
    spread = max(0.02, 3 * statistics.pstdev(reference))
    loss_ok = abs(packed.final_loss - statistics.mean(reference)) <= spread
    return {
        "images": images,
        "epochs": epochs,
        "batch_size": BATCH,
        "device": str(device),
        "packing_seconds": packing,
        "outcomes": [{**o.__dict__, "images_per_second": o.images_per_second, "vs_baseline": base.seconds / o.seconds} for o in outcomes],
        "targets": {
            "packed_vs_1": base.seconds / packed.seconds,
            "packed_vs_3": three.seconds / packed.seconds,
            "speed_5x_vs_1_met": base.seconds / packed.seconds >= 5,
            "speed_2x_vs_3_met": three.seconds / packed.seconds >= 2,
            "loss_within_noise": loss_ok,
            "loss_tolerance": spread,
        },
        "notes": notes,
    }


def render(results: dict[str, Any]) -> str:
    rows = [[o["name"], f"{o['seconds']:.1f}", f"{o['images_per_second']:,.0f}", f"{o['vs_baseline']:.1f}x", f"{o['final_loss']:.4f}"]
            for o in results["outcomes"]]
    t = results["targets"]
    lines = [
        markdown_table(["configuration", "seconds", "images/s", "speed vs (1)", "final loss (last epoch mean)"], rows),
        "",
        f"(4) vs (1): {t['packed_vs_1']:.1f}x (target >= 5x: {'met' if t['speed_5x_vs_1_met'] else 'missed'}); "
        f"(4) vs (3): {t['packed_vs_3']:.1f}x (target >= 2x: {'met' if t['speed_2x_vs_3_met'] else 'missed'}); "
        f"final loss {'within' if t['loss_within_noise'] else 'outside'} noise (tolerance {t['loss_tolerance']:.3f})",
    ]
    lines += [f"note: {n}" for n in results["notes"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="6,000 images, 2 epochs")
    parser.add_argument("--images", type=int, help="default 70,000 (6,000 with --quick)")
    parser.add_argument("--epochs", type=int, help="default 5 (2 with --quick)")
    add_output_arguments(parser)
    args = parser.parse_args(argv)
    images = args.images or (6000 if args.quick else 70000)
    epochs = args.epochs or (2 if args.quick else 5)
    results = run(images, epochs)
    results["machine"] = machine()
    print()
    print(render(results))
    print("saved", save_json("train_loop-quick" if args.quick else "train_loop", results, output_dir(args.update_results, args.out)))


if __name__ == "__main__":
    run_main(main)
