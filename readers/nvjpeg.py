"""JPEG decoding on a CUDA device with nvJPEG, through NVIDIA's nvImageCodec (optional).

One module for both sides: ``packer convert --decode-device cuda`` (packer/gpu_stage.py) and
``readers.Loader(..., decode="cuda")`` (readers/device_decode.py) hand it byte strings and get
back uint8 ``(C, H, W)`` tensors on the device, one batched call per batch.

The library is ``nvidia-nvimgcodec-cu12`` with its ``nvjpeg`` extra (NVIDIA's nvJPEG wheel, which
torch's CUDA wheels do not bring; ``pip install 'packer[gpu]'``), imported only when a
:class:`GPUDecoder` is made, never by importing this module: a training job without it, or
without a GPU, imports ``readers`` as before. Made without a CUDA device or without the library,
a :class:`GPUDecoder` raises :class:`GPUDecodeUnavailable` with one line saying which and what
to do. Its images expose ``__cuda_array_interface__``; :func:`torch.as_tensor` takes them
without a copy.

``backend`` replaces nvImageCodec's decoder with any object of the same shape
(``decode(list_of_bytes) -> list of HWC images or None``), which is how the plumbing is tested
on a machine without a GPU: a CPU decoder on ``device="cpu"``. Run and measured on a lent H100
(``python -m benchmarks.gpu_decode --seconds 2``, benchmarks/results/gpu_decode.json);
tests/test_gpu_decode.py and tests/test_device_decode.py were run there and passed (2026-11-25).
"""

from __future__ import annotations

import importlib
from typing import Any, Sequence

import torch

from .extras import install_hint

__all__ = ["GPUDecoder", "GPUDecodeUnavailable", "GPU_EXTRA", "first_then", "load_nvimgcodec", "require_cuda"]

#: What to install for GPU decoding (named in every error that lacks it).
GPU_EXTRA = install_hint("gpu")
#: The pip distribution and the module it provides.
NVIMGCODEC_PACKAGE = "nvidia-nvimgcodec-cu12"
NVIMGCODEC_MODULE = "nvidia.nvimgcodec"


class GPUDecodeUnavailable(RuntimeError):
    """GPU decoding cannot run here: no CUDA device, or no nvImageCodec (the message says which)."""


def require_cuda(device: str | torch.device, what: str) -> torch.device:
    """``device`` as a CUDA :class:`torch.device` with its index, or :class:`GPUDecodeUnavailable`
    (one line, naming ``what`` asked for it) when it is not CUDA or CUDA is not available."""
    dev = torch.device(device)
    if dev.type != "cuda":
        raise GPUDecodeUnavailable(f"{what}: decodes on a CUDA device, got {str(device)!r}")
    if not torch.cuda.is_available():
        raise GPUDecodeUnavailable(f"{what}: no CUDA device is available here (torch.cuda.is_available() is False); decode on the CPU instead")
    return dev if dev.index is not None else torch.device("cuda", torch.cuda.current_device())


def load_nvimgcodec(what: str) -> Any:
    """The ``nvidia.nvimgcodec`` module, or :class:`GPUDecodeUnavailable` naming the extra."""
    try:
        return importlib.import_module(NVIMGCODEC_MODULE)
    except ImportError as exc:
        raise GPUDecodeUnavailable(
            f"{what}: needs NVIDIA's nvImageCodec ({NVIMGCODEC_PACKAGE}), which is not installed ({exc.msg}): {GPU_EXTRA}"
        ) from None


class _NvImgCodec:
    """nvImageCodec's batched decoders with our parameters: sRGB or gray uint8, EXIF orientation
    applied, GPU backends only (its CPU backend would decode silently on the CPU: an input the GPU
    refuses comes back ``None``, and the caller says so).

    The GPU's hardware JPEG engines first, where the card has them (A100, H100): on a lent H100
    they alone decoded batches faster than the hybrid backend and than one decoder offered every
    backend (which splits a batch between them; an ad hoc comparison, not committed, so no
    figure is quoted here). What they refuse (or every input, on a card without them) goes to
    the CUDA and hybrid backends."""

    def __init__(self, module: Any, device: torch.device, channels: int) -> None:
        self._module = module
        self._device = device
        kinds = module.BackendKind
        self._errors: list[str] = []
        hardware = self._make(kinds.HW_GPU_ONLY)  # None: no engine on this card; the others decode all
        general = self._make(kinds.GPU_ONLY, kinds.HYBRID_CPU_GPU) or self._make(kinds.HYBRID_CPU_GPU)
        self._decoders = [d for d in (hardware, general) if d is not None]
        if not self._decoders:
            raise GPUDecodeUnavailable(f"nvImageCodec could not make a GPU JPEG decoder on {device} ({self._errors[-1]}); "
                                       f"is nvidia-nvjpeg installed? {GPU_EXTRA}")
        spec = module.ColorSpec.GRAY if channels == 1 else module.ColorSpec.SRGB
        self._params = module.DecodeParams(color_spec=spec, apply_exif_orientation=True, allow_any_depth=False)

    def _make(self, *kinds: Any) -> Any:
        try:
            return self._module.Decoder(device_id=self._device.index, backends=[self._module.Backend(kind) for kind in kinds])
        except Exception as exc:  # noqa: BLE001 - the library raises RuntimeError("... Could not create decoder") for a missing backend
            self._errors.append(f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else exc!r}")
            return None

    def decode(self, blobs: Sequence[bytes]) -> list[Any]:
        streams = [self._module.CodeStream(bytes(blob)) for blob in blobs]
        stream = torch.cuda.current_stream(self._device).cuda_stream  # the decode is ordered before our use of it
        return first_then([lambda s, d=d: list(d.decode(s, params=self._params, cuda_stream=stream)) for d in self._decoders], streams)


def first_then(decoders: Sequence[Any], inputs: list[Any]) -> list[Any]:
    """Each input decoded by the first of ``decoders`` (callables: list -> list, ``None`` where it
    could not) that can; ``None`` where none could. Order kept; each decoder sees the inputs the
    ones before it refused, in one call."""
    out: list[Any] = [None] * len(inputs)
    todo = list(range(len(inputs)))
    for decode in decoders:
        if not todo:
            break
        images = list(decode([inputs[i] for i in todo]))
        if len(images) != len(todo):  # the library's contract: one answer per input
            raise RuntimeError(f"the decoder returned {len(images)} images for {len(todo)} inputs")
        for i, image in zip(todo, images):
            out[i] = image
        todo = [i for i in todo if out[i] is None]
    return out


class GPUDecoder:
    """Batch-decode JPEG byte strings into uint8 ``(C, H, W)`` tensors on ``device``.

    ``channels``: 3 (RGB) or 1 (gray), what the caller stores. ``what``: who asks, for the
    error messages (``"--decode-device cuda"``, ``"Loader(decode='cuda')"``). ``backend``: a
    decoder object standing in for nvImageCodec (see the module doc); with it, ``device`` may be
    the CPU and neither CUDA nor the library is needed.
    """

    def __init__(self, device: str | torch.device = "cuda", *, channels: int = 3, what: str = "GPU decoding", backend: Any = None) -> None:
        if channels not in (1, 3):
            raise ValueError(f"channels must be 1 or 3, got {channels!r}")
        self.channels = channels
        if backend is None:
            self.device = require_cuda(device, what)
            backend = _NvImgCodec(load_nvimgcodec(what), self.device, channels)
        else:
            self.device = torch.device(device)
        self._backend = backend

    def decode(self, blobs: Sequence[bytes | memoryview]) -> list[torch.Tensor | None]:
        """Each blob's pixels as a uint8 ``(C, H, W)`` tensor on the device (a view of the
        decoder's own image, no copy), or ``None`` where the decoder could not decode it."""
        if not blobs:
            return []
        images = self._backend.decode(list(blobs))
        if len(images) != len(blobs):  # pragma: no cover - the library's contract
            raise RuntimeError(f"the decoder returned {len(images)} images for {len(blobs)} inputs")
        return [None if image is None else self._chw(image) for image in images]

    def _chw(self, image: Any) -> torch.Tensor:
        tensor = torch.as_tensor(image, device=self.device)
        if tensor.dim() == 2:
            tensor = tensor.unsqueeze(-1)
        if tensor.dtype != torch.uint8 or tensor.dim() != 3 or tensor.shape[2] != self.channels:
            raise RuntimeError(f"the decoder returned a {tuple(tensor.shape)} {tensor.dtype} image, expected (H, W, {self.channels}) uint8")
        return tensor.permute(2, 0, 1)

    def __repr__(self) -> str:
        return f"GPUDecoder(device={str(self.device)!r}, channels={self.channels}, backend={type(self._backend).__name__})"
