"""Train a small CNN on a packed dataset: readers.Loader + GPU augmentation + Normalize (+ AMP on CUDA).

    python examples/train_classifier.py                       # a tiny generated dataset, a few CPU steps
    python examples/train_classifier.py --data train.lmdb --epochs 10 --size 160

The training loop is the fast path end to end: ``Loader`` fills uint8 batches in background
threads (pinned and copied on a side stream when on CUDA), and every per-pixel step (random
resized crop, flip, the cast to float and normalisation) runs batched on the device the batch
is on. With ``--data`` any packed format works (``readers.open_dataset``); without it, a 3-class
folder of small JPEGs is generated and converted to LMDB in a temporary folder (nothing is
downloaded).
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from readers import Loader, Normalize, RandomHorizontalFlip, RandomResizedCrop, open_dataset


def small_cnn(classes: int) -> nn.Module:
    """Four conv blocks and a linear head: enough to learn, small enough for a CPU smoke run."""

    def block(cin: int, cout: int) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True), nn.MaxPool2d(2))

    return nn.Sequential(block(3, 32), block(32, 64), block(64, 128), block(128, 256), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, classes))


def make_tiny_dataset(workdir: Path) -> Path:
    """3 classes x 24 JPEGs of 64x48, packed to LMDB at 48x48 (a couple of seconds)."""
    import packer
    from packer.samples import make_image_folder

    src = make_image_folder(workdir / "images", classes=3, per_class=24, size=(48, 64))
    dst = workdir / "tiny.lmdb"
    packer.convert(src, dst, image=packer.ImageOptions(size=48), workers=1, overwrite=True)
    return dst


def train(data: Path, *, epochs: int | None, steps: int | None, batch_size: int, size: int, device: torch.device, lr: float) -> float:
    """Train for ``epochs`` and/or until ``steps`` optimiser steps (``epochs=None``: as many as the
    steps need, or 1 without ``steps``); returns the last loss."""
    dataset = open_dataset(data)
    classes = max(len(dataset.classes), 2)
    loader = Loader(dataset, batch_size, shuffle=True, seed=0, drop_last=True, device=device)
    augment = nn.Sequential(RandomResizedCrop(size, scale=(0.35, 1.0)), RandomHorizontalFlip()).to(device)
    cuda = device.type == "cuda"
    normalize = Normalize(dtype=torch.float32, channels_last=cuda).to(device)
    model = small_cnn(classes).to(device)
    if cuda:
        model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=True, weight_decay=5e-4)
    scaler = torch.amp.GradScaler("cuda", enabled=cuda)
    loss_fn = nn.CrossEntropyLoss()
    print(f"data: {dataset}\nloader: {loader}\naugment: {augment}\ndevice: {device}, mixed precision: {cuda}")

    step, loss_value, start, seen = 0, float("nan"), time.perf_counter(), 0
    if epochs is None:
        epochs = 1 if steps is None else -(-steps // max(len(loader), 1))
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        model.train()
        for images, labels in loader:  # uint8 (N, C, H, W) and int64 (N,), already on `device`
            x = normalize(augment(images))
            autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()
            with autocast:
                loss = loss_fn(model(x), labels)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            step += 1
            seen += len(images)
            if step % 10 == 0 or step == 1:
                loss_value = loss.item()
                print(f"epoch {epoch} step {step}: loss {loss_value:.3f}, {seen / (time.perf_counter() - start):,.0f} img/s")
            if steps is not None and step >= steps:
                loss_value = loss.item()
                print(f"stopped after {step} steps: loss {loss_value:.3f}")
                return loss_value
    loss_value = loss.item() if step else loss_value
    print(f"done: {step} steps, last loss {loss_value:.3f}")
    return loss_value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, help="a packed dataset (any format); default: a tiny generated one")
    parser.add_argument("--epochs", type=int, help="passes over the data (default: 1, or as many as --steps needs)")
    parser.add_argument("--steps", type=int, help="stop after this many steps (default: 5 on the generated data)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--size", type=int, default=32, help="side of the random crops fed to the model")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    options = dict(epochs=args.epochs, batch_size=args.batch_size, size=args.size, device=device, lr=args.lr)
    if args.data is not None:
        train(args.data, steps=args.steps, **options)  # type: ignore[arg-type]
        return
    with tempfile.TemporaryDirectory(prefix="packer-train-") as tmp:
        train(make_tiny_dataset(Path(tmp)), steps=5 if args.steps is None else args.steps, **options)  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
