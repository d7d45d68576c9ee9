"""The work unit of a Python dataset SRC: one sample, ``dataset[i]``, into a stored sample.

The worker reads the sample itself (the dataset was pickled to it) or receives it read
(packer/sources/datasets.py), then converts its image as decoded pixels
(packer/preprocess/arrays.py) and checks its label.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

from readers.schema import MAX_LABEL

from ..options import ImageOptions
from ..sources.labels import LABEL_RANGE
from ..sources.datasets import DatasetItem, DatasetReader, LoadedItem, ParentItem
from .arrays import encode_pixels, to_pixels
from .decode import DecodeError, describe_error
from ..work_unit import WorkUnit
from .task import Encoded, Failed

__all__ = ["DatasetTask"]


@dataclass(frozen=True)
class DatasetTask(WorkUnit):
    """Convert sample ``item.index`` of the dataset. ``reader``: the dataset, when the workers
    read it (``None``: samples arrive read). ``labeled``/``classes`` (the dataset's class names):
    what a label must be. ``needs_main``: the dataset's class lives in the program's ``__main__``
    (packer/parallel.py then lets workers import it)."""

    options: ImageOptions
    reader: DatasetReader | None = None
    labeled: bool = True
    classes: tuple[str, ...] = ()
    needs_main: bool = False

    def __call__(self, item: DatasetItem | ParentItem) -> Encoded | Failed:
        if isinstance(item, LoadedItem):
            loaded = item
        elif isinstance(item, ParentItem):
            loaded = item.load()
        else:
            assert self.reader is not None, "a dataset read in the parent sends its samples read"
            loaded = self.reader.load(item.index)
        if loaded.error is not None:
            return Failed(item.path, loaded.error)
        label = self.label(loaded.raw_label)
        if isinstance(label, str):
            return Failed(item.path, label)
        try:
            pixels = to_pixels(loaded.image, grayscale=self.options.grayscale, max_pixels=self.options.max_pixels, layout=loaded.layout)
            shape, payload = encode_pixels(pixels, self.options)
        except DecodeError as exc:
            return Failed(item.path, str(exc))
        except Exception as exc:  # noqa: BLE001 - odd objects break conversions in odd ways; recorded, not hidden
            return Failed(item.path, f"cannot convert the image ({type(exc).__name__}: {describe_error(exc)})")
        return Encoded(label, shape, payload)

    def label(self, raw: Any) -> int | str:
        """The class index of ``raw`` (-1: this sample is unlabeled, as torchvision's STL10 and a
        Hugging Face ClassLabel mark it), or why it is not one. In a dataset whose ``dataset[0]``
        has no label, a sample with one is refused, not stored as -1 (it was, without a word). A
        class name of ``dataset.classes`` is its index, and a whole float (``3.0``) its integer, as
        a label file's are; a bool is no label."""
        plain = isinstance(raw, numbers.Integral) and not isinstance(raw, bool)
        if not self.labeled:
            if plain and raw >= 0:
                return f"label {int(raw)}, but dataset[0] has none, so the dataset converts unlabeled (give dataset[0] its label)"
            return -1
        if plain and raw == -1:
            return -1
        if isinstance(raw, str):
            if raw in self.classes:
                return self.classes.index(raw)
            return (f"label {raw!r} is not one of dataset.classes" if self.classes else
                    f"label {raw!r} is a name, and the dataset has no classes list naming its classes (give dataset.classes, "
                    "or integer class indices)")
        if isinstance(raw, bool):
            return f"label {raw!r} is a bool, not a class index"
        if isinstance(raw, numbers.Real) and not isinstance(raw, numbers.Integral):
            if not float(raw).is_integer():
                return f"label {raw!r} is not a whole number (give an integer class index)"
            raw = int(raw)
            if raw == -1:
                return -1
        if raw is None or isinstance(raw, bool) or not isinstance(raw, numbers.Integral):
            return "no label" if raw is None else f"unknown label {raw!r} (give an integer class index)"
        if raw < 0 or raw > MAX_LABEL or (self.classes and raw >= len(self.classes)):
            return f"unknown label {int(raw)} (not a class index" + (f" of its {len(self.classes)} classes)" if self.classes else f"{LABEL_RANGE})")
        return int(raw)
