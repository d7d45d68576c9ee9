"""Is the GPU starving? The same training loop over a raw JPEG folder, then over packer's blob.

    python examples/diagnose_folder.py                          # 300 ImageNet-sized JPEGs; ResNet-18 on CUDA
    python examples/diagnose_folder.py --model small            # a light CNN step on the CPU
    python examples/diagnose_folder.py --images 48 --step-ms 5  # a quick smoke run (too few batches for a verdict)

A folder of ``--images`` generated JPEGs of 500x375 (ImageNet's typical size; nothing is
downloaded) is read the usual way: PIL decode, resize and center-crop in a torch ``DataLoader``
with worker processes. :func:`readers.diagnose` times the loader alone, the step alone and the
loop, and says what bounds it: with a GPU step (or its CPU stand-in), the decoding. Then the
folder is converted once (``packer.convert``) to a RAM blob and the same loop runs over
``readers.Loader``: at the default size the verdict flips to compute-bound, and the loop runs
as fast as the step (with a few dozen images an epoch is two or three batches, and restarting
the iterator is most of the loop: the quick run only shows it works).

The step is a ResNet-18-style training step on CUDA (``--model resnet``, the default there). On
the CPU the default is the model-free step of ``packer doctor`` (25 ms a batch, ``--step-ms``),
which stands for a GPU step: it leaves the CPU to the loader. A model on the CPU (``--model small``)
shares the cores with the decoding workers, and the diagnosis then says the step is contended.
Everything is written to a temporary folder and removed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn

import packer
from packer.doctor import CostStep, PILFolder
from packer.samples import make_image_folder
from readers import Loader, Normalize, RAMDataset, diagnose


def small_model(classes: int) -> nn.Module:
    """A patchify stem (8x8 patches) and one conv block: light enough for a CPU step."""
    return nn.Sequential(
        nn.Conv2d(3, 32, 8, stride=8), nn.BatchNorm2d(32), nn.ReLU(inplace=True),
        nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, classes),
    )


class Block(nn.Module):
    """ResNet's basic block: two 3x3 convs and a shortcut (a 1x1 conv when the shape changes)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
            nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout),
        )
        self.short = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.short(x))


def resnet18(classes: int) -> nn.Module:
    """ResNet-18's layout (stem, four stages of two basic blocks, 64-512 channels), written out here."""
    layers: list[nn.Module] = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
        cin = cout
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, classes))


class TrainStep:
    """``step(images, labels)``: normalise the uint8 batch on its device, forward, backward, SGD."""

    def __init__(self, model: nn.Module, device: torch.device) -> None:
        self.model = model.to(device).train()
        self.normalize = Normalize().to(device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.amp = device.type == "cuda"
        self.__qualname__ = f"TrainStep({type(model).__name__})"

    def __call__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        with torch.autocast(images.device.type, dtype=torch.bfloat16, enabled=self.amp):
            loss = nn.functional.cross_entropy(self.model(self.normalize(images)), labels)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=300, help="JPEGs generated (500x375), in 3 classes")
    parser.add_argument("--size", type=int, default=224, help="training resolution")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--batches", type=int, default=24, help="batches per measurement, over 3 rounds (at least 3)")
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)), help="DataLoader worker processes for the folder")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--model", choices=("small", "resnet"), help="default: resnet on CUDA, the model-free step on the CPU")
    parser.add_argument("--step-ms", type=float, help="use the model-free step of this cost (ms a batch; default on the CPU: 25)")
    parser.add_argument("--json", type=Path, help="also write both diagnoses, the command, date and machine to this file")
    args = parser.parse_args()
    if args.batches < 3:
        parser.error(f"--batches {args.batches}: at least 3, a batch for each of the 3 rounds")
    if args.device.startswith("cuda") and not torch.cuda.is_available():  # (torch's "not compiled with CUDA" assertion said it)
        parser.error(f"--device {args.device}: CUDA is not available here; use --device cpu")
    device = torch.device(args.device)

    if args.step_ms is not None or (args.model is None and device.type != "cuda"):
        step: CostStep | TrainStep = CostStep(25.0 if args.step_ms is None else args.step_ms)
    else:
        step = TrainStep(resnet18(3) if (args.model or "resnet") == "resnet" else small_model(3), device)

    with tempfile.TemporaryDirectory(prefix="packer-diagnose-") as tmp:
        per_class = -(-args.images // 3)
        src = make_image_folder(Path(tmp) / "images", classes=3, per_class=per_class, size=(375, 500))
        items = [(str(p), label) for label, folder in enumerate(sorted(src.iterdir())) for p in sorted(folder.iterdir())]
        print(f"generated {len(items)} JPEGs of 500x375 in 3 classes; step: {step.__qualname__} on {device}\n")

        folder = torch.utils.data.DataLoader(PILFolder(items, args.size), batch_size=args.batch_size, shuffle=True,
                                             num_workers=args.workers, persistent_workers=args.workers > 0)
        raw = diagnose(folder, step, batches=args.batches, device=device, name=f"the JPEG folder (PIL, {args.workers} workers)")
        print(raw, end="\n\n")

        blob = Path(tmp) / "train.blob"
        done = packer.convert(src, blob, image=packer.ImageOptions(size=args.size))
        print(f"packer.convert: {done.images_per_second:,.0f} img/s -> {blob.name}\n")
        with Loader(RAMDataset(blob), args.batch_size, device=device if device.type == "cuda" else None) as loader:
            packed = diagnose(loader, step, batches=args.batches, device=device, name="the blob (readers.Loader)")
        print(packed, end="\n\n")

    print(f"folder: {raw.bound}, {raw.data_bound:.0%} waiting, {raw.together.images_per_s:,.0f} img/s; "
          f"blob: {packed.bound}, {packed.data_bound:.0%} waiting, {packed.together.images_per_s:,.0f} img/s "
          f"(x{packed.together.images_per_s / raw.together.images_per_s:.1f})")
    if args.json is not None:
        record = {
            "command": shlex.join(["python", "examples/diagnose_folder.py", *sys.argv[1:]]),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": platform.machine(), "cores": len(os.sched_getaffinity(0)), "load_average": list(os.getloadavg()),
            "cuda": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
            "step": step.__qualname__, "folder": raw.to_dict(), "blob": packed.to_dict(),
        }
        args.json.write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
