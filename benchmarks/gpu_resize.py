"""The GPU path's resize fidelity, measured on the CPU: ``--decode-device cuda`` vs the CPU path.

    python -m benchmarks.gpu_resize --update-results       # 300 ImageNet-like + 40 photo-sized JPEGs
    python -m benchmarks.gpu_resize --quick                 # 40 + 8

``packer convert --decode-device cuda`` crops, resizes and pads with torch
(packer/preprocess/tensor_resize.py: ``interpolate(mode="bicubic", antialias=True)``), the same
code on CPU and CUDA tensors, so its fidelity is measured here on CPU tensors. Each image is
decoded in full (OpenCV standing in for nvJPEG: both are IDCT decoders of the same JPEG, a level
or two apart) and made into the same 224x224 centre crop as ``benchmarks/preprocess.py``'s
methods; fidelity is PSNR (dB) against that script's float Lanczos reference, beside the CPU
path (``preprocess_image``: reduced DCT decode, halvings + linear + area) measured in the same
run on the same images. Issue 16 asks the GPU path to be within 0.5 dB of the CPU path's.

Nothing here runs on a GPU: no speed is measured (a CPU rate of torch's resize says nothing of a
GPU's); the rows are labelled with the machine they ran on.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import cv2
import numpy as np
import torch

from packer import ImageOptions
from packer.preprocess.image import preprocess_image
from packer.preprocess.tensor_resize import TENSOR_RESAMPLE, preprocess_tensor
from packer.sources.images import scan_image_folder

from .common import add_output_arguments, imagenet_like, machine, markdown_table, output_dir, save_json, run_main
from .preprocess import TARGET, photo_like, psnr, reference

OPTIONS = ImageOptions(size=TARGET)


def gpu_path_on_cpu(data: bytes) -> np.ndarray:
    """The GPU path's pixels, computed on CPU tensors: full decode, then the torch geometry."""
    decoded = torch.from_numpy(cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR_RGB)).permute(2, 0, 1)
    return preprocess_tensor(decoded, OPTIONS).permute(1, 2, 0).numpy()


METHODS = {
    "CPU path: packer preprocess_image": lambda data: preprocess_image(data, OPTIONS),
    f"GPU path on CPU tensors: full decode + torch {TENSOR_RESAMPLE} antialias": gpu_path_on_cpu,
}


def fidelity(name: str, files: list[Path]) -> list[dict]:
    blobs = [p.read_bytes() for p in files]
    refs = [reference(b) for b in blobs]
    rows = []
    for label, method in METHODS.items():
        values = [psnr(method(b), r) for b, r in zip(blobs, refs)]
        rows.append({"set": name, "images": len(blobs), "method": label, "psnr_db": statistics.mean(values),
                     "psnr_db_min": min(values), "psnr_db_max": max(values)})
        print(f"  {name}: {label}: {rows[-1]['psnr_db']:.2f} dB", flush=True)
    cpu, gpu = rows[0]["psnr_db"], rows[1]["psnr_db"]
    rows[1]["vs_cpu_path_db"] = gpu - cpu
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    add_output_arguments(parser)
    args = parser.parse_args(argv)
    cv2.setNumThreads(1)
    small, large = (40, 8) if args.quick else (300, 40)
    sets = {
        "ImageNet-like 500x375": [Path(i.path) for i in scan_image_folder(imagenet_like(max(small, 320))).items][:small],
        "photo-like 2000x1500": [Path(i.path) for i in scan_image_folder(photo_like(large)).items],
    }
    rows = [row for name, files in sets.items() for row in fidelity(name, files)]
    print()
    print(markdown_table(["images", "method", "PSNR vs float Lanczos (dB), mean (min-max)", "vs CPU path (dB)"],
                         [[r["set"], r["method"], f"{r['psnr_db']:.2f} ({r['psnr_db_min']:.1f}-{r['psnr_db_max']:.1f})",
                           f"{r['vs_cpu_path_db']:+.2f}" if "vs_cpu_path_db" in r else ""] for r in rows]))
    note = ("Run on the CPU (no GPU): the GPU path's torch resize on CPU tensors, full decode by OpenCV standing in for nvJPEG; "
            "fidelity only, no speed (on a GPU: python -m benchmarks.gpu_decode)")
    payload = {"machine": machine(), "device": "cpu", "note": note, "rows": rows}
    print("saved", save_json("gpu_resize-quick" if args.quick else "gpu_resize", payload, output_dir(args.update_results, args.out)))


if __name__ == "__main__":
    run_main(main)
