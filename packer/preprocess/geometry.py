"""Resize modes: where to crop the source, what size to resize to, and how much to pad.

A mode is a function ``(height, width, size) -> Plan`` in :data:`RESIZE_MODES`. Plans are
computed on the decoded, orientation-corrected image, in whole source pixels, so the crop is
a free view and only the kept region is resized.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

__all__ = ["Plan", "RESIZE_MODES", "FIXED_SIZE_MODES", "plan_for", "standard_crop"]


@dataclass(frozen=True)
class Plan:
    """Crop ``(top, left, height, width)`` of the source, resize it to ``resize`` (height,
    width), then keep ``recrop`` (top, left, height, width) of the result if given, or centre it
    on a zero canvas of ``pad`` (height, width) if given."""

    crop: tuple[int, int, int, int]
    resize: tuple[int, int]
    pad: tuple[int, int] | None = None
    recrop: tuple[int, int, int, int] | None = None

    @property
    def output(self) -> tuple[int, int]:
        if self.recrop is not None:
            return self.recrop[2:]
        return self.pad if self.pad is not None else self.resize


Size = tuple[int, int]


def _full(h: int, w: int) -> tuple[int, int, int, int]:
    return (0, 0, h, w)


def _center_crop(h: int, w: int, size: Size | None) -> Plan:
    """Scale so the image covers ``size``, keep the centre: the shorter side fills the target."""
    th, tw = _need(size, "center-crop")
    scale = max(th / h, tw / w)
    ch, cw = min(h, max(1, round(th / scale))), min(w, max(1, round(tw / scale)))
    return Plan(crop=((h - ch) // 2, (w - cw) // 2, ch, cw), resize=(th, tw))


def _pad(h: int, w: int, size: Size | None) -> Plan:
    """Fit the whole image inside ``size`` (aspect kept), pad the rest with zeros."""
    th, tw = _need(size, "pad")
    scale = min(th / h, tw / w)
    rh, rw = min(th, max(1, round(h * scale))), min(tw, max(1, round(w * scale)))
    return Plan(crop=_full(h, w), resize=(rh, rw), pad=(th, tw))


def _stretch(h: int, w: int, size: Size | None) -> Plan:
    """Resize to exactly ``size``, ignoring the aspect ratio."""
    return Plan(crop=_full(h, w), resize=_need(size, "stretch"))


def _shorter(h: int, w: int, size: Size | None) -> Plan:
    """Shorter side to ``size`` (a single number), aspect kept: shapes vary."""
    n = _need(size, "shorter")[0]
    scale = n / min(h, w)
    rh, rw = (n, max(1, round(w * scale))) if h <= w else (max(1, round(h * scale)), n)
    return Plan(crop=_full(h, w), resize=(rh, rw))


def _none(h: int, w: int, size: Size | None) -> Plan:
    """Keep the original size."""
    return Plan(crop=_full(h, w), resize=(h, w))


def _need(size: Size | None, mode: str) -> Size:
    if size is None:  # pragma: no cover - ImageOptions guarantees a size for these modes
        raise ValueError(f"resize mode {mode!r} needs a size")
    return size


RESIZE_MODES: dict[str, Callable[[int, int, Size | None], Plan]] = {
    "center-crop": _center_crop,
    "pad": _pad,
    "stretch": _stretch,
    "shorter": _shorter,
    "none": _none,
}

#: Modes whose every output has exactly the requested size.
FIXED_SIZE_MODES = ("center-crop", "pad", "stretch")


def standard_crop(h: int, w: int, size: Size, resize: int) -> Plan:
    """torchvision's ``Resize(resize)`` + ``CenterCrop(size)``, with its arithmetic: the shorter
    side to ``resize``, the longer ``int(resize * long / short)``, then the centre ``size`` at
    ``round((side - crop) / 2)``.

    The whole image is resized, then cropped: a crop of whole source pixels first would shift the
    view by up to a source pixel against what users' pipelines produce (tests/test_crop.py
    bounds the difference against PIL's).
    """
    th, tw = size
    rh, rw = (resize, int(resize * w / h)) if h <= w else (int(resize * h / w), resize)
    rh, rw = max(rh, th), max(rw, tw)
    return Plan(crop=_full(h, w), resize=(rh, rw), recrop=(int(round((rh - th) / 2.0)), int(round((rw - tw) / 2.0)), th, tw))


def plan_for(mode: str, height: int, width: int, size: Size | None, resize: int | None = None) -> Plan:
    """The plan of ``mode`` for a ``height`` x ``width`` source; ``resize`` (centre crop only):
    scale the shorter side to it first (:func:`standard_crop`)."""
    if resize is not None:
        if mode != "center-crop" or size is None:  # pragma: no cover - ImageOptions refuses these
            raise ValueError(f"resize={resize} applies to the center-crop mode with a size only")
        return standard_crop(height, width, size, resize)
    try:
        mode_fn = RESIZE_MODES[mode]
    except KeyError:
        raise ValueError(f"unknown resize mode {mode!r} (choose from: {', '.join(RESIZE_MODES)})") from None
    return mode_fn(height, width, size)
