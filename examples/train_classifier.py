"""Train a small CNN on a packed dataset: readers.Loader + GPU augmentation + Normalize (+ AMP on CUDA).

    python examples/train_classifier.py                       # a tiny generated dataset, a few CPU steps
    python examples/train_classifier.py --data train.lmdb --epochs 10 --size 160
    python examples/train_classifier.py --steps 3 --checkpoint ckpt.pt   # then again with --steps 6: resumes

The training loop is the fast path end to end: ``Loader`` fills uint8 batches in background
threads (pinned and copied on a side stream when on CUDA), and every per-pixel step (random
resized crop, flip, the cast to float and normalisation) runs batched on the device the batch
is on. With ``--data`` any packed image dataset of one shape works (``readers.open_dataset``;
RGB or ``--grayscale``, whose one channel the model and ``Normalize`` take); without it, a 3-class
folder of small JPEGs is generated and converted to LMDB in a temporary folder (nothing is
downloaded; with ``--checkpoint`` it is kept beside the checkpoint, so a restart reads the same one).

``--checkpoint PATH`` saves the model, the optimiser, the step and the loader's state
(``Loader.state_dict()``: the epoch and the samples of it consumed) after every step, atomically,
and a run that finds it carries on from there: the rest of the interrupted epoch, each sample
once, even with another ``--batch-size`` (or number of ranks), then whole epochs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from readers import IMAGENET_MEAN, IMAGENET_STD, Loader, Normalize, RandomHorizontalFlip, RandomResizedCrop, open_dataset


def small_cnn(classes: int, channels: int = 3) -> nn.Module:
    """Four conv blocks and a linear head: enough to learn, small enough for a CPU smoke run."""

    def block(cin: int, cout: int) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True), nn.MaxPool2d(2))

    return nn.Sequential(block(channels, 32), block(32, 64), block(64, 128), block(128, 256), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, classes))


def make_tiny_dataset(workdir: Path) -> Path:
    """3 classes x 24 JPEGs of 64x48, packed to LMDB at 48x48 (a couple of seconds)."""
    import packer
    from packer.samples import make_image_folder

    src = make_image_folder(workdir / "images", classes=3, per_class=24, size=(48, 64))
    dst = workdir / "tiny.lmdb"
    packer.convert(src, dst, image=packer.ImageOptions(size=48), workers=1, overwrite=True)
    return dst


def label_count(dataset) -> int:
    """The largest label + 1: the class count of a dataset converted without class names (a
    Python dataset with no ``.classes``), whose metadata lists none."""
    top = -1
    for start in range(0, len(dataset), 4096):  # (read_batch brings the pixels too: fine for an example's data)
        _images, labels = dataset.read_batch(range(start, min(start + 4096, len(dataset))))
        top = max(top, int(labels.max()))
    return top + 1


def train(
    data: Path, *, epochs: int | None, steps: int | None, batch_size: int, size: int, device: torch.device, lr: float,
    checkpoint: Path | None = None,
) -> float:
    """Train for ``epochs`` and/or until ``steps`` optimiser steps in all (``epochs=None``: as many
    as the steps need, or 1 without ``steps``), carrying on from ``checkpoint`` if it exists and
    saving it after every step; returns the last loss."""
    dataset = open_dataset(data)
    if dataset.meta.kind != "image":  # (a TokenDataset has no classes: it ended in an AttributeError)
        raise SystemExit(f"{data}: a {dataset.meta.kind} dataset; this example trains an image classifier: pass a packed image dataset")
    classes = max(len(dataset.classes) or label_count(dataset), 2)
    try:
        loader = Loader(dataset, batch_size, shuffle=True, seed=0, drop_last=True, device=device)
    except ValueError as exc:  # (a batch larger than the dataset, varying shapes, no GPU: its one line, not a traceback)
        raise SystemExit(f"{data}: {exc}") from None
    augment = nn.Sequential(RandomResizedCrop(size, scale=(0.35, 1.0)), RandomHorizontalFlip()).to(device)
    cuda = device.type == "cuda"
    channels = dataset.meta.channels  # 1 for a --grayscale conversion: one mean and std, the mean of ImageNet's
    stats = {} if channels == 3 else {"mean": [sum(IMAGENET_MEAN) / 3], "std": [sum(IMAGENET_STD) / 3]}
    normalize = Normalize(dtype=torch.float32, channels_last=cuda, **stats).to(device)
    model = small_cnn(classes, channels).to(device)
    if cuda:
        model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=True, weight_decay=5e-4)
    scaler = torch.amp.GradScaler("cuda", enabled=cuda)
    loss_fn = nn.CrossEntropyLoss()
    print(f"data: {dataset}\nloader: {loader}\naugment: {augment}\ndevice: {device}, mixed precision: {cuda}")

    step, loss_value, start, seen, first_epoch = 0, float("nan"), time.perf_counter(), 0, 0
    if checkpoint is not None and checkpoint.exists():
        saved = torch.load(checkpoint, map_location=device)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        loader.load_state_dict(saved["loader"])  # any batch size or number of ranks may continue it
        step, first_epoch, loss_value = saved["step"], saved["loader"]["epoch"], saved.get("loss", loss_value)
        print(f"resumed from {checkpoint}: step {step}, epoch {first_epoch}, {saved['loader']['samples_consumed']} samples of it consumed")
    if steps is not None and step >= steps:
        print(f"already at step {step} (--steps {steps}): nothing to train")
        return loss_value
    last = epochs if epochs is not None else (None if steps is not None else 1)  # None: until --steps
    epoch, final = first_epoch, None
    while last is None or epoch < last:
        loader.set_epoch(epoch)  # the same epoch keeps a loaded position: the rest of it
        model.train()
        batches = 0
        for images, labels in loader:  # uint8 (N, C, H, W) and int64 (N,), already on `device`
            x = normalize(augment(images))
            autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()
            with autocast:
                loss = loss_fn(model(x), labels)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            step, batches, seen, final = step + 1, batches + 1, seen + len(images), loss.detach()
            stop = steps is not None and step >= steps
            if checkpoint is not None or stop or step % 10 == 0 or step == 1:
                loss_value = final.item()  # (a wait for the GPU: only when the value is used)
            if checkpoint is not None:  # the loader's state next to the model's, written atomically
                state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step, "loss": loss_value,
                         "loader": loader.state_dict()}
                torch.save(state, f"{checkpoint}.tmp")
                os.replace(f"{checkpoint}.tmp", checkpoint)
            if step % 10 == 0 or step == 1:
                print(f"epoch {epoch} step {step}: loss {loss_value:.3f}, {seen / (time.perf_counter() - start):,.0f} img/s")
            if stop:
                print(f"stopped after {step} steps: loss {loss_value:.3f}")
                return loss_value
        if not batches and epoch > first_epoch:  # a whole epoch without one batch: --steps would never be reached
            raise SystemExit(f"{data}: an epoch gives no batch of {batch_size} (drop_last): pass a smaller --batch-size")
        print(f"end of epoch {epoch} at step {step}")
        epoch += 1
    if final is not None:  # the last step's loss (a resumed run that trained nothing keeps the checkpoint's)
        loss_value = final.item()
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
    parser.add_argument("--checkpoint", type=Path, help="save after every step; carry on from it if it exists")
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: CUDA is not available here; use --device cpu")
    device = torch.device(args.device)
    options = dict(epochs=args.epochs, batch_size=args.batch_size, size=args.size, device=device, lr=args.lr, checkpoint=args.checkpoint)
    if args.data is not None:
        train(args.data, steps=args.steps, **options)  # type: ignore[arg-type]
        return
    if args.checkpoint is not None:  # the generated dataset is kept beside the checkpoint: a restart reads the same one
        folder = args.checkpoint.resolve().parent / f"{args.checkpoint.name}.data"
        data = folder / "tiny.lmdb" if (folder / "tiny.lmdb").exists() else make_tiny_dataset(folder)
        train(data, steps=5 if args.steps is None else args.steps, **options)  # type: ignore[arg-type]
        return
    with tempfile.TemporaryDirectory(prefix="packer-train-") as tmp:
        train(make_tiny_dataset(Path(tmp)), steps=5 if args.steps is None else args.steps, **options)  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
