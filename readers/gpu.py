"""Small ``nn.Module``s that finish preprocessing on the device the batch is on.

Packed datasets hand over uint8 pixels (4x smaller than float32 on the host-to-device copy);
the cast, scaling and normalisation happen here, fused in one expression, on the GPU when the
batch is there. The same code runs on the CPU.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

__all__ = ["Normalize", "IMAGENET_MEAN", "IMAGENET_STD"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


class Normalize(nn.Module):
    """uint8 images ``(N, C, H, W)`` or ``(C, H, W)`` -> float ``(x / 255 - mean) / std``.

    ``mean`` and ``std`` are in [0, 1] units, one value per channel (or one for all).
    ``dtype`` is the output dtype; the arithmetic is done in float32 (float64 if asked) and
    rounded once. ``channels_last=True`` returns 4-D output in channels-last memory format,
    which convolutions under mixed precision prefer; the conversion is free here because the
    output is a new tensor anyway.
    """

    scale: torch.Tensor
    shift: torch.Tensor

    def __init__(
        self,
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
        *,
        dtype: torch.dtype = torch.float32,
        channels_last: bool = False,
    ) -> None:
        super().__init__()
        mean_t = torch.as_tensor(mean, dtype=torch.float64).reshape(-1)
        std_t = torch.as_tensor(std, dtype=torch.float64).reshape(-1)
        if mean_t.numel() == 0 or std_t.numel() == 0:
            raise ValueError("Normalize: mean and std need at least one value")
        if mean_t.numel() != std_t.numel() and 1 not in (mean_t.numel(), std_t.numel()):
            raise ValueError(f"Normalize: mean has {mean_t.numel()} values but std has {std_t.numel()}")
        if bool((std_t <= 0).any()):
            raise ValueError(f"Normalize: std must be positive, got {std_t.tolist()}")
        if dtype not in _FLOAT_DTYPES:
            raise ValueError(f"Normalize: dtype must be a floating dtype, got {dtype}")
        self.dtype = dtype
        self.channels_last = channels_last
        compute = torch.float64 if dtype == torch.float64 else torch.float32
        # y = x * scale + shift with scale = 1 / (255 std), shift = -mean / std (exact in float64,
        # rounded once to the compute dtype).
        self.register_buffer("scale", (1.0 / (255.0 * std_t)).to(compute).reshape(-1, 1, 1))
        self.register_buffer("shift", (-mean_t / std_t).to(compute).reshape(-1, 1, 1))

    @property
    def channels(self) -> int:
        return max(self.scale.numel(), self.shift.numel())

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if images.dtype != torch.uint8:
            raise TypeError(f"Normalize expects uint8 images, got {images.dtype}")
        if images.dim() not in (3, 4):
            raise ValueError(f"Normalize expects (C, H, W) or (N, C, H, W), got shape {tuple(images.shape)}")
        channels = images.shape[-3]
        if self.channels not in (1, channels):
            raise ValueError(f"Normalize has {self.channels} channel values but the images have {channels} channels")
        out = torch.addcmul(self.shift, images.to(self.scale.dtype), self.scale)
        if self.channels_last and out.dim() == 4:
            return out.to(dtype=self.dtype, memory_format=torch.channels_last)
        return out.to(self.dtype)

    def extra_repr(self) -> str:
        mean = [round(v, 4) for v in (-self.shift / (self.scale * 255)).reshape(-1).tolist()]
        std = [round(v, 4) for v in (1 / (self.scale * 255)).reshape(-1).tolist()]
        return f"mean={mean}, std={std}, dtype={self.dtype}, channels_last={self.channels_last}"
