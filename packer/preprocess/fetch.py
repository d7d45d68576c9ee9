"""The workers' part of ``packer convert --decode-device cuda``: read each input, hand plain JPEGs on.

:class:`FetchTask` / :class:`FetchMemberTask` / :class:`FetchParquetRowTask` run in the pool's workers instead of the image
tasks: they read an input's bytes and look at its header. A plain JPEG (complete, RGB or gray,
within ``--max-pixels``) comes back as :class:`Fetched` (its bytes, through the pool's
shared-memory transport) for the driving process to decode on the GPU (packer/gpu_stage.py);
anything else is converted right there on the CPU, exactly as without the option.

A module of its own, importing neither torch nor the GPU decoder: every worker unpickles its
task's class, and on a lent 16-core H100 host the import of torch in each of 16 workers made
the workers' fetching, not the GPU, the GPU path's bound (an ad hoc profile; the conversion's
rate before and after is in benchmarks/results/gpu_decode-before.json and gpu_decode.json).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

from PIL import Image

from .decode import ZERO_RUN, jpeg_ends_cleanly, zeros_at_end
from .members import MemberTask, ParquetRowTask
from .task import Encoded, Failed, ImageTask

__all__ = ["Fetched", "FetchTask", "FetchMemberTask", "FetchParquetRowTask", "gpu_decodable"]


@dataclass(frozen=True)
class Fetched:
    """A plain JPEG's bytes, read and checked by a worker, to be decoded on the GPU."""

    path: str
    label: int
    data: bytes


def gpu_decodable(data: bytes, max_pixels: int) -> bool:
    """Whether ``data`` is a JPEG the GPU path takes: complete, RGB or gray, within ``max_pixels``.
    Anything else goes the CPU path, which also gives the exact skip reason of a bad file (zeros
    standing for the data before the end marker: a cut copy's, which nvJPEG would decode)."""
    if not jpeg_ends_cleanly(data) or zeros_at_end(data)[0] >= ZERO_RUN:
        return False
    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
            return image.format == "JPEG" and image.mode in ("RGB", "L") and 1 <= width * height <= max_pixels
    except Exception:  # noqa: BLE001 - whatever the header does, the CPU path gives the answer
        return False


class _Fetch:
    """The GPU path's version of an image task's :meth:`~ImageTask.convert`: a plain JPEG's
    bytes are handed on, anything else is converted here on the CPU."""

    options: Any

    def convert(self, item: Any, data: bytes | Failed) -> Encoded | Failed | Fetched:  # type: ignore[override]
        if isinstance(data, bytes) and gpu_decodable(data, self.options.max_pixels):
            return Fetched(item.path, item.label, data)
        return super().convert(item, data)  # type: ignore[misc]


@dataclass(frozen=True)
class FetchTask(_Fetch, ImageTask):
    """Read one image file (or URL); a plain JPEG comes back as :class:`Fetched`."""


@dataclass(frozen=True)
class FetchMemberTask(_Fetch, MemberTask):
    """Read one archive member; a plain JPEG comes back as :class:`Fetched`."""


@dataclass(frozen=True)
class FetchParquetRowTask(_Fetch, ParquetRowTask):
    """Read one Parquet row's image; a plain JPEG comes back as :class:`Fetched`."""
