"""The geometry of :func:`~packer.preprocess.image.preprocess_pixels` on torch tensors: the GPU path's.

``packer convert --decode-device cuda`` decodes on the GPU (packer/gpu_stage.py) and crops,
resizes and pads there with this code, to exactly the output geometry of the CPU path (the same
:func:`~packer.preprocess.geometry.plan_for`). The resize is
``torch.nn.functional.interpolate(mode="bicubic", antialias=True)`` in float32, rounded: a
proper antialiasing filter at any scale, the same code on CPU and CUDA tensors, so its fidelity
is measured on the CPU (``python -m benchmarks.gpu_resize``: PSNR against the float Lanczos
reference of ``benchmarks/preprocess.py``, beside the CPU path's ``preprocess_image``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..options import ImageOptions
from .geometry import Plan, plan_for

__all__ = ["resize_tensor", "preprocess_tensor", "preprocess_tensors", "TENSOR_RESAMPLE"]

TENSOR_RESAMPLE = "bicubic"
#: Cropped source elements resized in one call at most: 48 Mi uint8 elements, 192 MiB as float32
#: (64 ImageNet-sized images; a 12-megapixel photo alone is about 36 Mi).
BATCH_ELEMENTS = 48 * 2**20


def resize_tensor(image: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Resize a uint8 ``(C, H, W)`` or ``(N, C, H, W)`` tensor to ``height`` x ``width``, antialiased, on its device."""
    if tuple(image.shape[-2:]) == (height, width):
        return image
    batch = image if image.dim() == 4 else image.unsqueeze(0)
    scaled = F.interpolate(batch.float(), size=(height, width), mode=TENSOR_RESAMPLE, antialias=True, align_corners=False)
    scaled = scaled.round_().clamp_(0, 255).to(torch.uint8)
    return scaled if image.dim() == 4 else scaled.squeeze(0)


def preprocess_tensor(image: torch.Tensor, options: ImageOptions) -> torch.Tensor:
    """Decoded uint8 ``(C, H, W)`` pixels -> the stored pixels, ``(C, h, w)`` contiguous: crop,
    resize, re-crop or pad exactly as the CPU path plans them (packer/preprocess/geometry.py)."""
    return preprocess_tensors([image], options)[0]


def preprocess_tensors(images: list[torch.Tensor], options: ImageOptions, *, budget: int = BATCH_ELEMENTS) -> list[torch.Tensor]:
    """:func:`preprocess_tensor` of each image; the images with the same plan (same source size,
    the usual case) are stacked and resized in one call: a few kernels a group, not a few an image.
    A group is cut into calls of at most ``budget`` cropped source elements (one image alone may
    exceed it), so its float copy stays bounded whatever the photos' size. Each pixel is what the
    one-image call gives (the resize treats each image of a batch alone)."""
    groups: dict[tuple[Plan, int], list[int]] = {}
    for i, image in enumerate(images):
        plan = plan_for(options.resize_mode, int(image.shape[1]), int(image.shape[2]), options.size, options.resize)
        groups.setdefault((plan, int(image.shape[0])), []).append(i)
    out: list[torch.Tensor | None] = [None] * len(images)
    for (plan, channels), members in groups.items():
        top, left, height, width = plan.crop
        per_call = max(1, budget // (channels * height * width))
        for start in range(0, len(members), per_call):
            part = members[start : start + per_call]
            batch = torch.stack([images[i][:, top : top + height, left : left + width] for i in part])
            for i, image in zip(part, _planned(batch, plan)):
                out[i] = image
    return out  # type: ignore[return-value]


def _planned(batch: torch.Tensor, plan: Plan) -> torch.Tensor:
    """Cropped ``(N, C, H, W)`` pixels resized, re-cropped or padded as ``plan`` says, contiguous."""
    batch = resize_tensor(batch, *plan.resize)
    if plan.recrop is not None:
        top, left, height, width = plan.recrop
        batch = batch[:, :, top : top + height, left : left + width]
    if plan.pad is not None:
        canvas = batch.new_zeros((*batch.shape[:2], *plan.pad))
        y = (plan.pad[0] - batch.shape[2]) // 2
        x = (plan.pad[1] - batch.shape[3]) // 2
        canvas[:, :, y : y + batch.shape[2], x : x + batch.shape[3]] = batch
        batch = canvas
    return batch.contiguous()
