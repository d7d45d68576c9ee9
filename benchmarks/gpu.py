"""The CUDA side of the fast path, on a machine with an NVIDIA GPU (not run in CI).

    python -m benchmarks.gpu                 # 10,000 ImageNet-like JPEGs -> raw 224x224 blob and LMDB
    python -m benchmarks.gpu --quick         # 2,000 images, shorter passes

Side by side in one run (min/median/max over ``--repeats`` passes after a warm-up):
(a) the card's host-to-device copy rate for one uint8 batch of 256x3x224x224: from pinned memory
    (the ceiling) and from pageable memory;
(b) ``readers.Loader(dataset, device="cuda")`` over the blob, LMDB and HDF5: bytes of pixels that
    arrive on the device per second, as a share of (a)'s pinned rate (target: 80% or more): the
    blob gathered by the GPU from the page-locked blob (``gather="device"``, the default for a
    RAM blob), and the host path (``gather="host"``: filler threads, pinned buffers) by threads;
(c) ``CUDAPrefetcher`` around a plain ``DataLoader`` (worker processes, ``pin_memory=True``),
    for contrast;
(d) a ResNet-50 training step (bf16 autocast, channels_last, SGD, batch 256, with
    ``RandomResizedCrop`` + ``RandomHorizontalFlip`` + ``Normalize`` on the GPU) fed by
    ``Loader`` from the blob, LMDB and HDF5, vs the same step on a batch already on the GPU
    (target: 95% or more of it: the data path costs nothing). The three variants are
    interleaved, pass by pass, so clock drift hits them alike. ResNet-50 comes from torchvision
    when it is installed (the benchmark only; packer does not depend on it).
Also recorded: the conversion rate of the source folder on this machine's cores.
Results: a table, and ``gpu[-quick].json`` in ``benchmarks/out/`` (``--update-results``:
``benchmarks/results/``, the committed figures).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from .common import Rate, add_output_arguments, cpu_count, imagenet_like, machine, markdown_table, output_dir, save_json, run_main

SIZE = 224
BATCH = 256


def rate(samples: list[float]) -> Rate:
    return Rate(min(samples), statistics.median(samples), max(samples), len(samples))


def repeat(one_pass: Callable[[], float], repeats: int) -> Rate:
    """Warm up once, then ``repeats`` passes of ``one_pass`` (returns a rate)."""
    one_pass()
    return rate([one_pass() for _ in range(repeats)])


# -- (a) the card's copy rate ------------------------------------------------------------------
def copy_rate(pinned: bool, copies: int = 50) -> Callable[[], float]:
    """Bytes/s of host -> device copies of one batch, timed with CUDA events."""
    host = torch.randint(0, 256, (BATCH, 3, SIZE, SIZE), dtype=torch.uint8)
    if pinned:
        host = host.pin_memory()
    device = torch.empty_like(host, device="cuda")

    def one_pass() -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(copies):
            device.copy_(host, non_blocking=pinned)
        end.record()
        end.synchronize()
        return copies * host.numel() / (start.elapsed_time(end) / 1e3)

    return one_pass


# -- (b), (c) delivery to the device --------------------------------------------------------------
def delivery(loader: Any, seconds: float) -> Callable[[], float]:
    """Bytes/s of image batches that arrive on the device (iterated for ``seconds``)."""
    epoch = [0]

    def one_pass() -> float:
        moved, start = 0, time.perf_counter()
        while True:
            if hasattr(loader, "set_epoch"):
                loader.set_epoch(epoch[0])
            epoch[0] += 1
            for images, _labels in loader:
                moved += images.numel() * images.element_size()
                if time.perf_counter() - start >= seconds:
                    torch.cuda.current_stream().synchronize()  # every copy issued so far has landed
                    return moved / (time.perf_counter() - start)

    return one_pass


# -- (d) training step -----------------------------------------------------------------------
class Step:
    """One ResNet-50 training step with GPU augmentation, bf16 autocast and channels_last."""

    def __init__(self, classes: int) -> None:
        from torchvision.models import resnet50

        from readers import Normalize, RandomHorizontalFlip, RandomResizedCrop

        torch.backends.cudnn.benchmark = True
        self.model = resnet50(num_classes=classes).cuda().to(memory_format=torch.channels_last)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
        self.augment = torch.nn.Sequential(RandomResizedCrop(SIZE), RandomHorizontalFlip()).cuda()
        self.normalize = Normalize(channels_last=True).cuda()

    def __call__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(self.model(self.normalize(self.augment(images))), labels)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()


def resident_batches(dataset: Any) -> Callable[[], Any]:
    """An endless source of one real batch that is already on the GPU."""
    from readers import Loader

    images, labels = next(iter(Loader(dataset, BATCH, shuffle=True, seed=0, device="cuda", gather="host")))
    images, labels = images.clone(), labels.clone()

    def batches() -> Any:
        while True:
            yield images, labels

    return batches


def loader_batches(loader: Any) -> Callable[[], Any]:
    def batches() -> Any:
        epoch = 0
        while True:
            loader.set_epoch(epoch)
            yield from loader
            epoch += 1

    return batches


def train_rate(step: Step, source: Callable[[], Any], steps: int) -> Callable[[], float]:
    def one_pass() -> float:
        batches = source()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _, (images, labels) in zip(range(steps), batches):
            step(images, labels)
        torch.cuda.synchronize()
        rate_ = steps * BATCH / (time.perf_counter() - start)
        batches.close()
        return rate_

    return one_pass


# -- data -----------------------------------------------------------------------------------------
def make_data(images: int, workdir: Path) -> tuple[dict[str, Path], dict[str, float]]:
    """ImageNet-like JPEGs converted to raw 224x224 blob, LMDB and HDF5 with every core; conversion img/s."""
    from packer import ImageOptions, convert

    src = imagenet_like(images, workers=cpu_count())
    workdir.mkdir(parents=True, exist_ok=True)
    paths, rates = {}, {}
    for fmt, suffix in (("blob", ".blob"), ("lmdb", ".lmdb"), ("hdf5", ".h5")):
        dst = workdir / f"gpu-{images}{suffix}"
        start = time.perf_counter()
        report = convert(src, dst, image=ImageOptions(size=SIZE), workers=cpu_count(), overwrite=True, progress=False)
        rates[fmt] = report.written / (time.perf_counter() - start)
        paths[fmt] = dst
    return paths, rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--images", type=int)
    parser.add_argument("--seconds", type=float, help="length of one delivery pass")
    parser.add_argument("--steps", type=int, help="training steps per pass")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/packer-gpu-bench"))
    add_output_arguments(parser)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.gpu: needs a CUDA GPU (torch.cuda.is_available() is False)")
    images = args.images or (2000 if args.quick else 10000)
    seconds = args.seconds or (1.0 if args.quick else 3.0)
    steps = args.steps or (15 if args.quick else 40)

    from torch.utils.data import DataLoader

    from readers import CUDAPrefetcher, Loader, open_dataset

    paths, convert_rates = make_data(images, args.workdir)
    datasets = {fmt: open_dataset(path) for fmt, path in paths.items()}
    results: dict[str, Any] = {
        "machine": machine() | {"gpu": torch.cuda.get_device_name(), "cuda": torch.version.cuda},
        "images": images,
        "batch": BATCH,
        "convert_img_per_s": {fmt: round(r) for fmt, r in convert_rates.items()},
    }

    pinned, pageable = repeat(copy_rate(True), args.repeats), repeat(copy_rate(False), args.repeats)
    results["copy_gb_per_s"] = {"pinned": pinned, "pageable": pageable}
    rows = [["copy, pinned (ceiling)", f"{pinned.median / 1e9:.1f} ({pinned.min / 1e9:.1f}-{pinned.max / 1e9:.1f})", "100%"],
            ["copy, pageable", f"{pageable.median / 1e9:.1f}", f"{pageable.median / pinned.median:.0%}"]]
    delivered: dict[str, Rate] = {}
    loader = Loader(datasets["blob"], BATCH, shuffle=True, seed=0, device="cuda", gather="device", drop_last=True)
    delivered["Loader blob, GPU gather"] = repeat(delivery(loader, seconds), args.repeats)
    loader.close()
    for fmt, ds in datasets.items():
        for threads in (1, 2, 4, 8):
            loader = Loader(ds, BATCH, shuffle=True, seed=0, device="cuda", threads=threads, drop_last=True, gather="host")
            r = repeat(delivery(loader, seconds), args.repeats)
            loader.close()
            delivered[f"Loader {fmt}, {threads} threads"] = r
    for workers in (4, 8):
        plain = DataLoader(datasets["blob"], batch_size=BATCH, shuffle=True, num_workers=workers, pin_memory=True,
                           persistent_workers=True, drop_last=True)
        delivered[f"CUDAPrefetcher(DataLoader blob, {workers} workers, pinned)"] = repeat(delivery(CUDAPrefetcher(plain), seconds), args.repeats)
        del plain
    results["delivery_gb_per_s"] = delivered
    for name, r in delivered.items():
        rows.append([name, f"{r.median / 1e9:.1f} ({r.min / 1e9:.1f}-{r.max / 1e9:.1f})", f"{r.median / pinned.median:.0%}"])
    print(f"\n{torch.cuda.get_device_name()}, {cpu_count()} cores, {images} raw {SIZE}x{SIZE}x3 samples, batch {BATCH}\n")
    print(markdown_table(["host -> device", "GB/s", "of pinned copy"], rows))

    try:
        step = Step(classes=len(datasets["blob"].classes))
    except ImportError as exc:
        print(f"\ntraining step: skipped ({exc}; the ResNet-50 comes from torchvision)")
        step = None
    if step is not None:
        loaders = {
            "Loader over blob (GPU gather)": Loader(datasets["blob"], BATCH, seed=0, device="cuda", drop_last=True, gather="device"),
            "Loader over blob (host path)": Loader(datasets["blob"], BATCH, seed=0, device="cuda", drop_last=True, gather="host"),
            "Loader over lmdb": Loader(datasets["lmdb"], BATCH, seed=0, device="cuda", drop_last=True),
            "Loader over hdf5": Loader(datasets["hdf5"], BATCH, seed=0, device="cuda", drop_last=True),
        }
        sources = {"batch already on the GPU": resident_batches(datasets["blob"])}
        sources |= {name: loader_batches(loader) for name, loader in loaders.items()}
        passes = {name: train_rate(step, source, steps) for name, source in sources.items()}
        for one_pass in passes.values():  # warm-up: cudnn autotuning, allocator, filler threads
            one_pass()
        samples: dict[str, list[float]] = {name: [] for name in passes}
        for _ in range(args.repeats):
            for name, one_pass in passes.items():
                samples[name].append(one_pass())
        trained = {name: rate(s) for name, s in samples.items()}
        results["resnet50_img_per_s"] = trained
        base = trained["batch already on the GPU"].median
        print()
        print(markdown_table(["ResNet-50 step, bf16, batch 256", "img/s", "of on-GPU"],
                             [[name, str(r), f"{r.median / base:.1%}"] for name, r in trained.items()]))
    print("\nconversion (every core): " + ", ".join(f"{fmt} {r:,.0f} img/s" for fmt, r in convert_rates.items()))
    out = save_json("gpu-quick" if args.quick else "gpu", results, output_dir(args.update_results, args.out))
    print(f"saved {out}")


if __name__ == "__main__":
    run_main(main)
