"""Small ``nn.Module``s that finish preprocessing on the device the batch is on.

Packed datasets hand over uint8 pixels (4x smaller than float32 on the host-to-device copy);
the cast, scaling and normalisation happen here (a cast and one multiply-add), on the GPU when
the batch is there. The same code runs on the CPU.

The random augmentations draw per-sample parameters for the whole batch at once and apply them
in one batched operation. Randomness comes from ``generator`` (a ``torch.Generator``, or an int
seed for a private CPU generator: reproducible runs) or, when it is ``None``, from torch's global
RNG on the batch's device. Drawing from a generator is kept out of ``torch.compile`` graphs
(it cannot be traced); the batched image work compiles.
"""

from __future__ import annotations

import math
import numbers
import operator
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Normalize", "RandomHorizontalFlip", "RandomResizedCrop", "IMAGENET_MEAN", "IMAGENET_STD"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


class Normalize(nn.Module):
    """uint8 images ``(N, C, H, W)`` or ``(C, H, W)`` -> float ``(x / 255 - mean) / std``.

    ``mean`` and ``std`` are in [0, 1] units, one value per channel (or one for all), as for
    torchvision's ``Normalize`` (``IMAGENET_MEAN``, ``IMAGENET_STD``). A mean or std above 1 can
    only be on the 0-255 pixel scale (FFCV's ``NormalizeImage`` and DALI's convention) and is
    refused with one line giving the values divided by 255, never reinterpreted.
    ``dtype`` is the output dtype; the arithmetic is one multiply-add in float32 (float64 if
    asked) with constants rounded to it, within a few float32 ulps of a float64 reference, and
    float16 or bfloat16 output is that result rounded once more. Like torch's own modules, ``.to(dtype)``, ``.half()``, ``.bfloat16()``,
    ``.double()`` and ``.float()`` (on this module or a model holding it) set the output dtype,
    and the constants are never rounded below float32: ``Normalize().bfloat16()`` computes
    exactly what ``Normalize(dtype=torch.bfloat16)`` does (``.double()`` keeps float32-exact
    constants; build with ``dtype=torch.float64`` for float64 ones).
    ``channels_last=True`` returns 4-D output in channels-last memory format, which
    convolutions under mixed precision prefer: the uint8 input is cast straight into it, so it
    costs no pass of its own.
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
        _check_scale(mean_t, std_t)
        _check_dtype(dtype)
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

    def _apply(self, fn, recurse=True):  # type: ignore[no-untyped-def]
        # what .to(), .half(), .cuda()... call: as in torch's own modules, a cast sets the output
        # dtype; the constants only move (float64 for float64 output, else float32: never rounded
        # to bfloat16 or float16, whose result is the float32 one rounded once more)
        target = fn(torch.empty(0, dtype=self.dtype, device=self.scale.device)).dtype
        _check_dtype(target)  # before anything moved
        kept = {name: self._buffers[name] for name in ("scale", "shift")}
        result = super()._apply(fn, recurse)
        compute = torch.float64 if target == torch.float64 else torch.float32
        for name, constant in kept.items():
            moved = self._buffers[name]
            self._buffers[name] = (constant if moved.dtype != constant.dtype else moved).to(moved.device, compute)
        self.dtype = target
        return result

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        _check_tensor(images, "Normalize", "a torch uint8 tensor")
        if images.dtype != torch.uint8:
            raise TypeError(f"Normalize expects uint8 images, got {images.dtype}: give it the batch as read (it scales by "
                            "1/255 itself); images already float in [0, 1] take torchvision's Normalize(mean, std)")
        _check_images(images, "Normalize")
        channels = images.shape[-3]
        if self.channels not in (1, channels):
            raise ValueError(f"Normalize has {self.channels} channel values but the images have {channels} channel{'s' if channels != 1 else ''}: "
                             f"pass {channels} mean and {channels} std value{'s' if channels != 1 else ''} (one per channel), "
                             "or one of each for every channel: Normalize(mean=[m], std=[s])"
                             + (" (or are these images channels-last, (N, H, W, C)? Normalize takes (N, C, H, W): "
                                "images.permute(0, 3, 1, 2))" if images.shape[-1] == self.channels else ""))
        if self.channels_last and images.dim() == 4:  # cast straight into channels-last: the multiply-add keeps it
            images = images.to(self.scale.dtype, memory_format=torch.channels_last)
        out = torch.addcmul(self.shift, images.to(self.scale.dtype), self.scale)
        return out.to(self.dtype)

    def extra_repr(self) -> str:
        mean = [round(v, 4) for v in (-self.shift / (self.scale * 255)).reshape(-1).tolist()]
        std = [round(v, 4) for v in (1 / (self.scale * 255)).reshape(-1).tolist()]
        return f"mean={mean}, std={std}, dtype={self.dtype}, channels_last={self.channels_last}"



def _check_scale(mean: torch.Tensor, std: torch.Tensor) -> None:
    """Refuse, in one line with the corrected call, a mean or std on the 0-255 pixel scale (FFCV's
    and DALI's convention for uint8 input): on Normalize's 0-1 scale a mean is at most 1 and a
    std above 1 would squeeze the images below a unit range, so either can only be a 0-255 value."""
    mean_off, std_off = bool((mean > 1).any()), bool((std > 1).any())
    if not (mean_off or std_off):
        return
    # with a 0-255 mean, std 1 is 0-255 too (mean subtraction only, as Caffe-style configs have it)
    std_off = std_off or bool((std >= 1).all())
    name, values = ("mean", mean) if mean_off else ("std", std)
    first = next(v for v in values.tolist() if v > 1)
    fixed_mean = [float(f"{v / 255 if mean_off else v:.6g}") for v in mean.tolist()]
    fixed_std = [float(f"{v / 255 if std_off else v:.6g}") for v in std.tolist()]
    which = " and ".join(n for n, off in (("mean", mean_off), ("std", std_off)) if off)
    raise ValueError(
        f"Normalize: {name} {first:g} is on the 0-255 scale; Normalize takes 0-1 values, as torchvision's does "
        f"((x/255 - mean) / std): divide {which} by 255: Normalize(mean={fixed_mean}, std={fixed_std})"
    )


def _numbers(value: object, owner: str, name: str, count: int, integers: bool = False) -> tuple:
    """``value`` as ``count`` numbers (integers: a whole ``int``, or ``count`` of them given as one
    int), or one line naming ``owner``'s argument (``RandomResizedCrop(16.0)`` was 'float object is
    not iterable')."""
    try:
        scalar = hasattr(value, "__index__") and getattr(value, "ndim", 0) == 0  # (an array of sizes has __index__ too)
        items = (value,) * count if integers and scalar else tuple(value)  # type: ignore[arg-type]
        if integers and len(items) == 1:  # (224,): one size for both, as torchvision takes it
            items = items * count
        if len(items) != count or any(isinstance(v, (bool, str)) for v in items):
            raise TypeError
        numbers = tuple(operator.index(v) if integers else float(v) for v in items)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        what = f"an integer or {count} integers" if integers else f"{count} numbers"
        raise TypeError(f"{owner}: {name} must be {what}, got {value!r}") from None
    return numbers


def _generator(generator: torch.Generator | int | None) -> torch.Generator | None:
    if generator is None or isinstance(generator, torch.Generator):
        return generator
    if isinstance(generator, bool) or not isinstance(generator, int):
        raise TypeError(f"generator must be a torch.Generator, an int seed or None, got {type(generator).__name__}")
    return torch.Generator().manual_seed(generator)


@torch.compiler.disable
def _uniform(shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """Uniform [0, 1) float32 draws: from ``generator`` (on its device) or the global RNG on ``device``."""
    if generator is None:
        return torch.rand(shape, device=device)
    return torch.rand(shape, generator=generator, device=generator.device).to(device, non_blocking=True)


def _check_dtype(dtype: torch.dtype) -> None:
    if dtype not in _FLOAT_DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in _FLOAT_DTYPES)
        raise ValueError(f"Normalize: dtype must be a floating dtype ({names}), got {dtype}")


def _check_tensor(images: object, who: str, wants: str) -> None:
    if isinstance(images, torch.Tensor):
        return
    kind = type(images)
    if (kind.__module__, kind.__name__) == ("numpy", "ndarray"):
        raise TypeError(f"{who} expects {wants}, got a numpy array: convert it with torch.from_numpy(array)")
    name = kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__name__}"
    raise TypeError(f"{who} expects {wants}, got {name}")


def _check_images(images: torch.Tensor, who: str) -> None:
    _check_tensor(images, who, "a torch tensor")
    if images.dim() not in (3, 4):
        raise ValueError(f"{who} expects (C, H, W) or (N, C, H, W), got shape {tuple(images.shape)}")


class RandomHorizontalFlip(nn.Module):
    """Mirror each image of a batch left-right with probability ``p``, independently, in one op.

    Works on any dtype and device; (C, H, W) input is one sample. :meth:`sample` draws the
    per-sample decisions and :meth:`flip` applies given ones (``forward`` is both).
    """

    def __init__(self, p: float = 0.5, generator: torch.Generator | int | None = None) -> None:
        super().__init__()
        if isinstance(p, bool) or not isinstance(p, numbers.Real):  # ('a' was float()'s error)
            raise TypeError(f"RandomHorizontalFlip: p must be a number in [0, 1], got {p!r}")
        p = float(p)
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"RandomHorizontalFlip: p must be in [0, 1], got {p}")
        self.p = p
        self.generator = _generator(generator)

    def sample(self, n: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """Which of ``n`` samples to flip: a bool tensor (n,) on ``device``."""
        return _uniform((n,), self.generator, torch.device(device)) < self.p

    @staticmethod
    def flip(images: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``images`` (N, C, H, W) with the samples where ``mask`` (N,) is true mirrored."""
        return torch.where(mask.reshape(-1, 1, 1, 1), images.flip(-1), images)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        _check_images(images, "RandomHorizontalFlip")
        if images.dim() == 3:
            return self.forward(images.unsqueeze(0)).squeeze(0)
        return self.flip(images, self.sample(images.shape[0], images.device))

    def extra_repr(self) -> str:
        return f"p={self.p}, generator={'seeded' if self.generator is not None else 'global'}"


class RandomResizedCrop(nn.Module):
    """Crop a random box out of each image and resize it to ``size``: the whole batch in one
    ``F.grid_sample`` (bilinear, ``align_corners=False``, the box's edge pixels repeated, as a
    crop then ``F.interpolate`` does; no antialiasing, so strong downscaling aliases, as GPU
    resizes usually do).

    Boxes follow torchvision's ``RandomResizedCrop``: area a ``scale`` share of the image, aspect
    ratio log-uniform in ``ratio``, integer pixel sides and position, 10 tries per sample and a
    centre crop (ratio clamped) for samples where none fits; every box lies inside its image.

    dtype: uint8 in -> uint8 out (interpolated in float32, rounded, clamped); float in -> the
    same float dtype out. (C, H, W) input is one sample. :meth:`sample` draws boxes and
    :meth:`crop` applies given ones (``forward`` is both).
    """

    def __init__(
        self,
        size: int | Sequence[int],
        scale: Sequence[float] = (0.08, 1.0),
        ratio: Sequence[float] = (3 / 4, 4 / 3),
        generator: torch.Generator | int | None = None,
        *,
        attempts: int = 10,
    ) -> None:
        super().__init__()
        height, width = _numbers(size, "RandomResizedCrop", "size", 2, integers=True)
        if height < 1 or width < 1:
            raise ValueError(f"RandomResizedCrop: size must be positive, got {size}")
        lo, hi = _numbers(scale, "RandomResizedCrop", "scale", 2)
        if not 0 < lo <= hi <= 1:
            raise ValueError(f"RandomResizedCrop: scale must satisfy 0 < min <= max <= 1, got {tuple(scale)}")
        rlo, rhi = _numbers(ratio, "RandomResizedCrop", "ratio", 2)
        if not 0 < rlo <= rhi:
            raise ValueError(f"RandomResizedCrop: ratio must satisfy 0 < min <= max, got {tuple(ratio)}")
        if attempts < 1:
            raise ValueError(f"RandomResizedCrop: attempts must be at least 1, got {attempts}")
        self.size = (int(height), int(width))
        self.scale = (lo, hi)
        self.ratio = (rlo, rhi)
        self.attempts = int(attempts)
        self.generator = _generator(generator)

    def sample(self, n: int, height: int, width: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """Boxes for ``n`` images of ``height`` x ``width``: float32 (n, 4) of ``(x, y, w, h)`` in pixels
        (integer-valued; the box covers columns x .. x+w-1 and rows y .. y+h-1)."""
        draws = _uniform((n, self.attempts, 4), self.generator, torch.device(device))
        area = float(height * width)
        log_lo, log_hi = math.log(self.ratio[0]), math.log(self.ratio[1])
        target = area * (self.scale[0] + (self.scale[1] - self.scale[0]) * draws[..., 0])
        aspect = torch.exp(log_lo + (log_hi - log_lo) * draws[..., 1])
        w = torch.round(torch.sqrt(target * aspect))
        h = torch.round(torch.sqrt(target / aspect))
        fits = (w >= 1) & (h >= 1) & (w <= width) & (h <= height)
        first = torch.argmax(fits.to(torch.uint8), dim=1, keepdim=True)  # first try that fits (0 if none)
        found = fits.gather(1, first).squeeze(1)
        w, h = w.gather(1, first).squeeze(1), h.gather(1, first).squeeze(1)
        x = torch.floor(draws[..., 2].gather(1, first).squeeze(1) * (width - w + 1))
        y = torch.floor(draws[..., 3].gather(1, first).squeeze(1) * (height - h + 1))
        # fallback: the largest centred box whose aspect is clamped into `ratio`
        in_ratio = width / height
        if in_ratio < self.ratio[0]:
            fw, fh = float(width), float(round(width / self.ratio[0]))
        elif in_ratio > self.ratio[1]:
            fw, fh = float(round(height * self.ratio[1])), float(height)
        else:
            fw, fh = float(width), float(height)
        fx, fy = float((width - fw) // 2), float((height - fh) // 2)
        boxes = torch.stack([x, y, w, h], dim=1)
        fallback = torch.tensor([fx, fy, fw, fh], dtype=boxes.dtype, device=boxes.device)
        return torch.where(found.unsqueeze(1), boxes, fallback)

    def crop(self, images: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        """Each image's box (``(x, y, w, h)`` pixels, (N, 4)) resized to ``size``, one batched op."""
        n, _c, height, width = images.shape
        boxes = boxes.to(images.device, torch.float32)  # (sample()'s are on the CPU unless told)
        x, y, w, h = boxes.unbind(1)
        # affine_grid maps output pixel centres (normalised, align_corners=False) into the input:
        # input_x_norm = (w / W) * out_x_norm + (2x + w) / W - 1, and the same for y.
        theta = torch.zeros(n, 2, 3, dtype=torch.float32, device=images.device)
        theta[:, 0, 0] = w / width
        theta[:, 0, 2] = (2 * x + w) / width - 1
        theta[:, 1, 1] = h / height
        theta[:, 1, 2] = (2 * y + h) / height - 1
        work = torch.float32 if images.dtype == torch.uint8 else images.dtype
        grid = F.affine_grid(theta.to(work), [n, 1, *self.size], align_corners=False)
        # Sampling points are kept within the centres of the box's own edge pixels: where the box
        # is enlarged, the outer output pixels fall outside them, and "border" padding would
        # blend in the pixels beyond the box (the image's edge is further away). Clamped, the
        # box's edge repeats, as a crop then resize does.
        low = torch.stack([(2 * x + 1) / width - 1, (2 * y + 1) / height - 1], dim=1).to(work)[:, None, None]
        high = torch.stack([(2 * (x + w) - 1) / width - 1, (2 * (y + h) - 1) / height - 1], dim=1).to(work)[:, None, None]
        grid = torch.clamp(grid, min=low, max=high)
        out = F.grid_sample(images.to(work), grid, mode="bilinear", padding_mode="border", align_corners=False)
        if images.dtype == torch.uint8:
            return out.round_().clamp_(0, 255).to(torch.uint8)
        return out

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        _check_images(images, "RandomResizedCrop")
        if images.dim() == 3:
            return self.forward(images.unsqueeze(0)).squeeze(0)
        if images.dtype != torch.uint8 and not images.is_floating_point():
            raise TypeError(f"RandomResizedCrop expects uint8 or float images, got {images.dtype}")
        n, channels, height, width = images.shape
        if n == 0:  # (affine_grid refuses an empty batch)
            return images.new_empty((0, channels, *self.size))
        return self.crop(images, self.sample(n, height, width, images.device))

    def extra_repr(self) -> str:
        scale = tuple(round(v, 4) for v in self.scale)
        ratio = tuple(round(v, 4) for v in self.ratio)
        seeded = "seeded" if self.generator is not None else "global"
        return f"size={self.size}, scale={scale}, ratio={ratio}, attempts={self.attempts}, generator={seeded}"
