"""The classic MNIST experiment, from a Python dataset packed once into a RAM blob.

    python examples/mnist_from_python.py                  # 12,000 training digits, 5 epochs
    python examples/mnist_from_python.py --train 3000     # smaller, faster

No download: ``MNISTLike`` makes 28x28 grayscale "digits" (a stroke pattern per class, shifted
and noisy) as torchvision's ``MNIST`` would give them: ``dataset[i] -> (PIL image, label)``,
``len(dataset)``, ``dataset.classes``. ``packer.convert(dataset, "mnist.blob", ...)`` packs it
(in parallel: the dataset is pickled to the workers), and the usual 5-epoch feed-forward loop
trains from the blob through ``readers.Loader``. Swap in ``torchvision.datasets.MNIST(root,
download=True)`` for the real digits: the same call packs it.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn

import packer
from readers import Loader, RAMDataset

EPOCHS = 5


class MNISTLike:
    """A map-style dataset of 28x28 grayscale digit-like pictures (10 classes), made here."""

    classes = [f"{d} - {name}" for d, name in enumerate("zero one two three four five six seven eight nine".split())]

    def __init__(self, count: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        templates = np.random.default_rng(0).random((10, 7, 7)) > 0.6  # one stroke pattern per class
        self.labels = rng.integers(0, 10, count)
        self.shifts = rng.integers(0, 8, (count, 2))
        self.noise_seed = seed
        self.templates = np.kron(templates, np.ones((3, 3), bool)).astype(np.uint8) * 255  # 21x21

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        label = int(self.labels[index])
        canvas = np.zeros((28, 28), np.uint8)
        y, x = self.shifts[index]
        canvas[y : y + 21, x : x + 21] = self.templates[label]
        noise = np.random.default_rng((self.noise_seed, index)).integers(0, 160, (28, 28), dtype=np.uint8)
        return Image.fromarray(np.maximum(canvas, noise), "L"), label


def train(train_blob: Path, test_blob: Path, epochs: int) -> float:
    """The classic loop: a 784-128-10 network, SGD, cross-entropy; the test accuracy."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 128), nn.ReLU(), nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    loader = Loader(RAMDataset(train_blob), batch_size=64, shuffle=True, seed=0)
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        total, count = 0.0, 0
        for images, labels in loader:  # uint8 (N, 1, 28, 28) and int64 (N,)
            loss = loss_fn(model(images.float() / 255), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total, count = total + loss.item() * len(labels), count + len(labels)
        print(f"epoch {epoch + 1}: loss {total / count:.4f}")
    correct = seen = 0
    with torch.no_grad():
        for images, labels in Loader(RAMDataset(test_blob), batch_size=256, shuffle=False):
            correct += int((model(images.float() / 255).argmax(1) == labels).sum())
            seen += len(labels)
    return correct / seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=12000, help="training digits")
    parser.add_argument("--test", type=int, default=2000, help="test digits")
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="packer-mnist-") as tmp:
        blobs = {}
        for split, count, seed in (("train", args.train, 1), ("test", args.test, 2)):
            start = time.perf_counter()
            blobs[split] = Path(tmp) / f"mnist-{split}.blob"
            report = packer.convert(MNISTLike(count, seed), blobs[split], image=packer.ImageOptions(grayscale=True))
            print(f"packed {report.written:,} {split} digits in {time.perf_counter() - start:.1f} s ({report.workers} workers)")
        accuracy = train(blobs["train"], blobs["test"], args.epochs)
        print(f"test accuracy after {args.epochs} epochs: {accuracy:.1%}")


if __name__ == "__main__":
    main()
