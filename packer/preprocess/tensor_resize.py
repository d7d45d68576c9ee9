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
from .geometry import plan_for

__all__ = ["resize_tensor", "preprocess_tensor", "TENSOR_RESAMPLE"]

#: The interpolation of :func:`resize_tensor` (antialiased), as the metadata records it.
TENSOR_RESAMPLE = "bicubic"


def resize_tensor(image: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Resize a uint8 ``(C, H, W)`` tensor to ``(C, height, width)``, antialiased, on its device."""
    if tuple(image.shape[1:]) == (height, width):
        return image
    scaled = F.interpolate(image.unsqueeze(0).float(), size=(height, width), mode=TENSOR_RESAMPLE, antialias=True, align_corners=False)
    return scaled.squeeze(0).round_().clamp_(0, 255).to(torch.uint8)


def preprocess_tensor(image: torch.Tensor, options: ImageOptions) -> torch.Tensor:
    """Decoded uint8 ``(C, H, W)`` pixels -> the stored pixels, ``(C, h, w)`` contiguous: crop,
    resize, re-crop or pad exactly as the CPU path plans them (packer/preprocess/geometry.py)."""
    plan = plan_for(options.resize_mode, int(image.shape[1]), int(image.shape[2]), options.size, options.resize)
    top, left, height, width = plan.crop
    image = resize_tensor(image[:, top : top + height, left : left + width], *plan.resize)
    if plan.recrop is not None:
        top, left, height, width = plan.recrop
        image = image[:, top : top + height, left : left + width]
    if plan.pad is not None:
        canvas = image.new_zeros((image.shape[0], *plan.pad))
        y = (plan.pad[0] - image.shape[1]) // 2
        x = (plan.pad[1] - image.shape[2]) // 2
        canvas[:, y : y + image.shape[1], x : x + image.shape[2]] = image
        image = canvas
    return image.contiguous()
