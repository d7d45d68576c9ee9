"""The work units of an archive SRC: one member's bytes, read from its archive by the worker, then
converted as an image file (:class:`~packer.preprocess.task.ImageTask`) or, for a ``.npy``
member of WebDataset shards, as decoded pixels (packer/preprocess/arrays.py); and of Parquet
files of images: one row's image bytes (packer/sources/parquet_images.py)."""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..sources.members import Member, read_member
from ..sources.parquet_rows import ParquetRow, read_row_image
from .arrays import encode_pixels, to_pixels
from .decode import DecodeError
from .task import Encoded, Failed, ImageTask

__all__ = ["MemberTask", "ParquetRowTask"]


@dataclass(frozen=True)
class MemberTask(ImageTask):
    """Read one archive member (:func:`~packer.sources.members.read_member`) and convert it."""

    def __call__(self, item: Member) -> Encoded | Failed:  # type: ignore[override]
        data = _read(item, read_member, "the archive")
        if isinstance(data, Failed) or not item.name.lower().endswith(".npy"):
            return self.convert(item, data)  # (a read failure passes through)
        try:
            array = np.load(io.BytesIO(data), allow_pickle=False)
            pixels = to_pixels(array, grayscale=self.options.grayscale, max_pixels=self.options.max_pixels, layout=item.layout)
            shape, payload = encode_pixels(pixels, self.options)
        except DecodeError as exc:
            return Failed(item.path, str(exc))
        except (ValueError, OSError) as exc:
            return Failed(item.path, f"not a readable .npy array ({exc})")
        return Encoded(item.label, shape, payload)


@dataclass(frozen=True)
class ParquetRowTask(ImageTask):
    """Read one Parquet row's image bytes (:func:`~packer.sources.parquet_rows.read_row_image`) and convert them."""

    def __call__(self, item: ParquetRow) -> Encoded | Failed:  # type: ignore[override]
        return self.convert(item, _read(item, read_row_image, "the Parquet file"))


def _read(item: Any, read: Callable[[Any], bytes], container: str) -> bytes | Failed:
    """``read(item)``, or the :class:`Failed` outcome saying why it could not be read from ``container``."""
    try:
        return read(item)
    except OSError as exc:
        return Failed(item.path, f"cannot read it from {container} ({exc.strerror or exc})")
    except ValueError as exc:  # (a damaged member or row: the reason as the reader gives it)
        return Failed(item.path, str(exc))
