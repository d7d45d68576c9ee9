"""``--classes``: a class list given, so that two conversions number the same classes alike.

A class folder (or a label file's names) is numbered by sorted name within its own source, so a
validation set holding a subset of the training classes (ImageNet-100, a mini val) would number
them otherwise than the training set. ``--classes PATH`` fixes the list: a packer dataset (its
recorded class names: ``--classes train.lmdb`` when converting val) or a text file of one class
name per line, in label order. Each input's label becomes its class's index in that list; the
dataset records the whole list as its classes (so its labels and ``classes`` agree with the
other dataset's), and its samples stay in class order. A class of SRC with samples that is not
in the list is refused in one line (never renumbered or dropped); one without samples (an empty
class folder, a label file's class of another split) is left out with a warning; the list's
classes that SRC lacks simply have no samples.
"""

from __future__ import annotations

import dataclasses
import logging

from readers.formats import detect_format, open_store
from readers.formats.base import dataset_path
from readers.schema import PackedFormatError

from ..errors import OptionError
from .images import ImageFolder

__all__ = ["read_class_list", "with_class_list"]

log = logging.getLogger("packer")


def read_class_list(path: str) -> list[str]:
    """The class names ``path`` lists, in label order: a packer dataset's classes, or a UTF-8
    text file's non-blank lines (each stripped)."""
    p = dataset_path(path)  # (a WebDataset DST given as its shard pattern, as it was converted: its folder)
    if not p.exists():
        raise OptionError(f"--classes {path}: no such file or dataset")
    try:
        detect_format(p)
        recognised = True
    except (PackedFormatError, OSError):  # not a packer dataset at all: a text file of names
        recognised = False
    if recognised:
        try:
            meta = open_store(p).meta
        except (PackedFormatError, OSError, ValueError) as exc:  # a dataset, damaged or unfinished: said as it is
            raise OptionError(f"--classes {path}: {exc}") from None
        if not meta.classes:
            raise OptionError(f"--classes {path}: that dataset records no class names (unlabeled, or integer labels); "
                              "pass a text file of class names, one a line")
        return list(meta.classes)
    if p.is_dir():
        raise OptionError(f"--classes {path}: a folder that is not a packer dataset; pass a dataset or a text file of class names")
    try:
        names = [line.strip() for line in p.read_text(encoding="utf-8-sig").splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise OptionError(f"--classes {path}: cannot read it as a UTF-8 text file of class names ({exc})") from None
    if not names:
        raise OptionError(f"--classes {path}: lists no class names (one a line)")
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise OptionError(f"--classes {path}: lists {name!r} twice; each class once, in label order")
        seen.add(name)
    return names


def with_class_list(folder: ImageFolder, names: list[str], path: str) -> ImageFolder:
    """``folder`` with each labelled item's label its class's index in ``names``, and ``names``
    as its classes; a class of the folder not in ``names`` is refused (:class:`OptionError`)."""
    if not folder.labeled or not folder.classes:
        raise OptionError(f"--classes {path}: SRC's labels have no class names to match ({'unlabeled' if not folder.labeled else 'integer labels'}); drop it")
    index = {name: i for i, name in enumerate(names)}
    used = sorted({item.label for item in folder.items if item.label >= 0})
    missing = [folder.classes[label] for label in used if folder.classes[label] not in index]
    if missing:
        more = f" (and {len(missing) - 1:,} more)" if len(missing) > 1 else ""
        raise OptionError(f"--classes {path}: SRC's class {missing[0]!r}{more} is not among its {len(names):,} classes; "
                          "a class list numbers every class of SRC")
    used_labels = set(used)
    unused = [name for label, name in enumerate(folder.classes) if name not in index and label not in used_labels]
    if unused:  # (an empty class folder, a label file's class of another split): nothing of it to number
        log.warning("--classes %s: SRC's class %r%s, which has no samples, is not in the list: left out", path, unused[0],
                    f" (and {len(unused) - 1:,} more)" if len(unused) > 1 else "")
    mapping = [index.get(name, -1) for name in folder.classes]
    if mapping == list(range(len(mapping))) and len(names) == len(mapping):
        return folder  # the same list
    items = [dataclasses.replace(item, label=mapping[item.label]) if item.label >= 0 else item for item in folder.items]
    if folder.class_order:  # class order, as a folder gives it (stable: path order within a class); a Parquet SRC's rows stay in order
        items.sort(key=lambda item: item.label)
    empty = [name for name in folder.empty_classes if name in index]
    return dataclasses.replace(folder, items=items, classes=list(names), empty_classes=empty)
