"""A map-style Python dataset as SRC: ``packer.convert(dataset, "mnist.blob", image=...)``.

Anything with ``len(dataset)`` and ``dataset[i]`` works: a torchvision dataset, a user's own
``Dataset`` class, a Hugging Face ``datasets.Dataset`` (duck-typed: nothing imports
``datasets``). ``dataset[i]`` is ``(image, label)``, an image alone (unlabeled), or a record
(a dict) whose image and label fields ``image_column`` / ``label_column`` name (default: the
first of :data:`IMAGE_FIELDS` / :data:`LABEL_FIELDS` present). The image is a PIL image, a
numpy array or a tensor (packer/preprocess/arrays.py); the label an integer class index
(a whole float, ``3.0``, too; a name of ``dataset.classes``: its index; ``None`` or -1: unlabeled). Class names come from ``dataset.classes``, or from a Hugging Face
``ClassLabel`` feature's ``names``.

Each input is ``dataset[i]``, named ``dataset[i]`` in messages and in the metadata's skipped
list. The dataset is pickled once to each worker, which reads its own samples, when it pickles
(to at most :data:`MAX_PICKLE` bytes); otherwise (a lambda inside, an open handle, a class
defined in an interactive session or where a worker cannot import it: packer/sources/main_names.py)
this process reads each sample as its work unit is sent,
and the sample travels to the worker with it (:class:`ParentItem`): the same output, with the
reading in one process. A sample whose reading raises is skipped with the exception as the
reason, like an undecodable image.

The resume fingerprint covers the dataset's identity (:func:`dataset_identity`): a Hugging Face
dataset's own ``_fingerprint``, else a SHA-256 of its pickle, else of a few of its samples.
"""

from __future__ import annotations

import hashlib
import logging
import sys
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..errors import OptionError, SourceError
from ..options import SourceOptions
from ..preprocess.decode import describe_error
from .images import ImageFolder, ImageItem

__all__ = ["is_python_dataset", "describe_dataset", "DatasetItem", "LoadedItem", "ParentItem", "DatasetReader", "scan_dataset", "dataset_identity", "identity_difference",
           "IMAGE_FIELDS", "LABEL_FIELDS", "MAX_PICKLE"]

log = logging.getLogger("packer")

#: Record fields tried, in order, for the image and for the label (``image_column``/``label_column`` override).
IMAGE_FIELDS = ("image", "img", "picture", "pixel_values", "pixels", "x")
LABEL_FIELDS = ("label", "labels", "fine_label", "class", "target", "y")
#: A dataset whose pickle is larger is read in this process instead of being copied to every worker.
MAX_PICKLE = 256 << 20


def is_python_dataset(src: Any) -> bool:
    """Whether ``src`` is a map-style dataset object rather than a path or URL."""
    return not isinstance(src, (str, bytes)) and not hasattr(src, "__fspath__") and hasattr(src, "__getitem__") and hasattr(src, "__len__")


@dataclass(frozen=True)
class DatasetItem(ImageItem):
    """Input ``index`` of a dataset (``path``: ``dataset[index]``); its worker reads it."""

    index: int = 0


@dataclass(frozen=True)
class LoadedItem(DatasetItem):
    """A sample read in this process, travelling to the worker: its image (PIL image or numpy
    array, ``layout`` ``chw`` for a former tensor) and raw label, or why it could not be read."""

    image: Any = None
    raw_label: Any = None
    layout: str | None = None
    error: str | None = None


class ParentItem:
    """Input ``index`` of a dataset that does not pickle: read here, by ``reader``, when it is
    pickled for a worker (its pickle is a :class:`LoadedItem`), or when it runs here."""

    __slots__ = ("path", "label", "index", "reader")

    def __init__(self, index: int, reader: "DatasetReader") -> None:
        self.path, self.label, self.index, self.reader = f"dataset[{index}]", -1, index, reader

    def load(self) -> LoadedItem:
        return self.reader.load(self.index)

    def __reduce__(self) -> tuple[Callable[..., LoadedItem], tuple[Any, ...]]:
        loaded = self.load()
        return LoadedItem, (loaded.path, loaded.label, loaded.index, loaded.image, loaded.raw_label, loaded.layout, loaded.error)


@dataclass(frozen=True)
class DatasetReader:
    """How one sample is taken from the dataset: ``dataset[i]``, then its image and label."""

    dataset: Any
    image_column: str | None = None
    label_column: str | None = None

    def sample(self, index: int) -> tuple[Any, Any]:
        """``(image, raw label)`` of sample ``index`` (label ``None`` when it has none)."""
        sample = self.dataset[index]
        if isinstance(sample, dict):
            if self.image_column not in sample:
                raise KeyError(f"the record has no {self.image_column!r} field (it has: {', '.join(map(str, sample))})")
            return sample[self.image_column], sample.get(self.label_column) if self.label_column else None
        if isinstance(sample, (tuple, list)):
            if not 1 <= len(sample) <= 2:
                raise ValueError(f"dataset[i] gave {len(sample)} values; give (image, label) or the image alone")
            return sample[0], sample[1] if len(sample) == 2 else None
        return sample, None

    def load(self, index: int) -> LoadedItem:
        """Sample ``index`` read here, ready to travel (a tensor becomes a numpy array)."""
        path = f"dataset[{index}]"
        try:
            image, label = self.sample(index)
        except Exception as exc:  # noqa: BLE001 - a user's dataset fails in its own ways: recorded, not hidden
            return LoadedItem(path, -1, index, error=reading_error(exc))
        layout = None
        if type(image).__module__.startswith("torch"):
            image, layout = image.detach().cpu().numpy(), "chw"
        if type(label).__module__.startswith("torch"):
            label = label.item() if label.numel() == 1 else label.tolist()
        elif type(label).__module__ == "numpy" and getattr(label, "size", 0) == 1:  # np.array(3), np.array([3]): as torch's
            label = label.item()
        return LoadedItem(path, -1, index, image, label, layout)


def reading_error(exc: BaseException) -> str:
    """The skip reason of a sample whose reading raised, reproducible: PIL's 'cannot identify
    image file <_io.BytesIO object at 0x7f...>' made the metadata differ from run to run."""
    text = describe_error(exc)
    return f"reading it raised {type(exc).__name__}" + (f": {text[:200]}" if text != type(exc).__name__ else "")


def scan_dataset(dataset: Any, options: SourceOptions) -> tuple[ImageFolder, DatasetReader, bool, bool]:
    """The dataset's inputs, its reader, whether workers can read it themselves (it pickles), and
    whether they need the program's ``__main__`` module for it (a class defined in the script)."""
    try:
        count = len(dataset)
    except TypeError as exc:
        raise SourceError(f"the dataset has no length ({exc}); give a map-style dataset (len() and [i])") from None
    if count == 0:
        raise SourceError(f"{describe_dataset(dataset)}: the dataset is empty")
    reader = DatasetReader(dataset, *_columns(dataset, options))
    _warn_unstored(dataset, reader)
    try:
        first = reader.sample(0)
    except Exception as exc:  # noqa: BLE001
        raise SourceError(f"{describe_dataset(dataset)}: dataset[0] could not be read ({reading_error(exc)})") from None
    classes = _classes(dataset, reader.label_column)
    labeled = first[1] is not None or bool(classes)
    portable, needs_main = _pickles(dataset)
    if portable:
        items: list[Any] = [DatasetItem(f"dataset[{i}]", -1, i) for i in range(count)]
    else:
        items = [ParentItem(i, reader) for i in range(count)]
    folder = ImageFolder(describe_dataset(dataset), items, classes if labeled else [], labeled, stamps={})
    return folder, reader, portable, needs_main


def dataset_identity(dataset: Any, reader: DatasetReader) -> str:
    """What identifies the dataset's content for ``--resume`` (see the module doc)."""
    own = getattr(dataset, "_fingerprint", None)
    if isinstance(own, str) and own:
        return f"datasets:{own}"
    digest = hashlib.sha256(describe_dataset(dataset).encode())
    try:
        from multiprocessing.reduction import ForkingPickler  # between our processes only, never in a file

        digest.update(bytes(ForkingPickler.dumps(dataset)))
        return f"pickle:{digest.hexdigest()}"
    except Exception:  # noqa: BLE001 - unpicklable: a few samples stand for it
        count = len(dataset)
        for index in sorted({0, count // 2, count - 1}):
            loaded = reader.load(index)
            digest.update(repr((loaded.raw_label, loaded.error)).encode())
            if loaded.image is not None:
                digest.update(np.asarray(loaded.image).tobytes())
        return f"samples:{digest.hexdigest()}"


def identity_difference(old: str, new: str) -> str:
    """How a refused ``--resume`` says the dataset's identity changed (two :func:`dataset_identity`
    values), not by its digests ("dataset was datasets:538d... in the interrupted run": an HF walkthrough)."""
    if old.startswith("datasets:") and new.startswith("datasets:"):
        return (f"the dataset is not the one the interrupted run converted: its Hugging Face fingerprint was {old[9:21]}, now "
                f"{new[9:21]} (a .map, .filter, .select or .shuffle makes another dataset)")
    return "the dataset is not the one the interrupted run converted: its samples or their order changed"


def _record_fields(dataset: Any) -> list[str] | None:
    """The field names of a dataset of records (Hugging Face columns, or the first dict's keys);
    ``None`` for a dataset of tuples or images (or one whose first sample cannot be read)."""
    names = list(getattr(dataset, "column_names", None) or [])
    if names:
        return names
    try:
        first = dataset[0]
    except Exception:  # noqa: BLE001 - reported by scan_dataset
        return None
    return list(first) if isinstance(first, dict) else None


def _warn_unstored(dataset: Any, reader: "DatasetReader") -> None:
    """Say which fields of a dataset's records are not stored, and which field gave the label:
    packer keeps an image and a label per sample (a caption or a mask was dropped without a word)."""
    names = _record_fields(dataset)
    if not names or reader.image_column is None:
        return
    used = {reader.image_column, reader.label_column}
    others = [name for name in names if name not in used]
    if others:
        label = f"the label from {reader.label_column!r}" if reader.label_column else "no label"
        log.warning("%s: the records' %s %s not stored (packer keeps the image from %r and %s; --image-column and "
                    "--label-column choose others)", describe_dataset(dataset), ", ".join(map(repr, others)),
                    "is" if len(others) == 1 else "are", reader.image_column, label)


def _columns(dataset: Any, options: SourceOptions) -> tuple[str | None, str | None]:
    """The image and label fields of a dataset of records (``None, None`` for tuples)."""
    values = getattr(dataset, "values", None)
    if isinstance(dataset, dict) and dataset and all(hasattr(split, "column_names") for split in values()):
        splits = list(dataset)  # a DatasetDict: 'no image column (it has: train)' blamed the column
        raise SourceError(f"a DatasetDict of the splits {', '.join(splits)}: convert one split, dataset[{splits[0]!r}]")
    names = _record_fields(dataset)
    if names is None:
        if options.image_column or options.label_column:
            given = "--image-column" if options.image_column else "--label-column"
            try:
                kind = f"{type(dataset[0]).__name__}s"
            except Exception:  # noqa: BLE001 - reported by scan_dataset
                kind = "other samples"
            raise OptionError(f"{given}: applies to a dataset of records (dicts); this one gives {kind}")
        return None, None
    image = _field(names, options.image_column, IMAGE_FIELDS, "image_column")
    if options.label_column is not None:
        label = _field(names, options.label_column, LABEL_FIELDS, "label_column")
    else:
        label = next((n for n in LABEL_FIELDS if n in names), None)
    return image, label


def _field(names: list[str], given: str | None, defaults: tuple[str, ...], option: str) -> str:
    if given is not None:
        if given not in names:
            raise OptionError(f"{option}={given!r}: the dataset has no such column (it has: {', '.join(names)})")
        return given
    found = next((n for n in defaults if n in names), None)
    if found is None:
        raise OptionError(f"{option}: the dataset has no {', '.join(defaults)} column (it has: {', '.join(names)}); name it")
    return found


def _classes(dataset: Any, label_column: str | None) -> list[str]:
    classes = getattr(dataset, "classes", None)
    if classes is None and label_column is not None:  # a Hugging Face ClassLabel feature
        feature = (getattr(dataset, "features", None) or {}).get(label_column)
        classes = getattr(feature, "names", None)
    if isinstance(classes, (list, tuple)) and classes and all(isinstance(c, str) for c in classes):
        return list(classes)
    return []


def _pickles(dataset: Any) -> tuple[bool, bool]:
    """Whether workers can be given the dataset (it pickles, to at most :data:`MAX_PICKLE` bytes,
    and what it needs from ``__main__`` a worker can import: a script, not an interactive
    session), and whether they need ``__main__`` for it."""
    from .main_names import importable_in_workers, pickle_and_main_names

    try:
        data, main_names = pickle_and_main_names(dataset)
    except Exception as exc:  # noqa: BLE001 - any pickling failure means: read it here
        log.info("the dataset does not pickle (%s); reading it in this process", reading_error(exc))
        return False, False
    if len(data) > MAX_PICKLE:
        log.info("the dataset pickles to %d MiB; reading it in this process rather than copying it to every worker", len(data) >> 20)
        return False, False
    if not main_names:
        return True, False
    if importable_in_workers(main_names):
        return True, True
    if getattr(sys.modules.get("__main__"), "__file__", None) in (None, "<stdin>", "-"):
        log.info("the dataset's class is defined in an interactive session; reading it in this process")
    else:
        log.warning("the dataset needs %s, which the workers cannot import from the script (defined under "
                    "`if __name__ == \"__main__\":`); reading it in this process, one sample at a time: define it at the "
                    "script's top level for the workers to read it", ", ".join(sorted(main_names)))
    return False, False


def describe_dataset(dataset: Any) -> str:
    """The source as the metadata records it: ``python:module.Class``."""
    kind = type(dataset)
    return f"python:{kind.__module__}.{kind.__qualname__}"
