"""packer: convert image folders and text corpora once, offline, into fast packed datasets for PyTorch.

>>> import packer
>>> packer.convert("imagenet/train", "train.lmdb", image=packer.ImageOptions(size=224))
>>> packer.convert("corpus/", "corpus.blob", text=packer.TextOptions(tokenizer="tokenizer.json"))

The readers live in the separate ``readers`` package, which training jobs import alone.

The names below are imported on first use (PEP 562), so importing a submodule does not import
the conversion code: the ``packer`` command (``packer.launch``) holds Ctrl-C from its first line
while that import takes a few tenths of a second.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__

if TYPE_CHECKING:  # what the names are, for type checkers and editors
    from .api import ConversionReport, TextConversionReport, convert
    from .errors import PackerError
    from .options import ImageOptions, RunOptions, SourceOptions, StorageOptions, TextOptions

__all__ = [
    "__version__", "convert", "ConversionReport", "TextConversionReport", "ImageOptions", "TextOptions", "StorageOptions",
    "RunOptions", "SourceOptions", "PackerError",
]

#: Public name -> the module that defines it (the names of ``__all__``, checked below).
_HOMES = {
    "convert": ".api", "ConversionReport": ".api", "TextConversionReport": ".api", "ImageOptions": ".options",
    "TextOptions": ".options", "StorageOptions": ".options", "RunOptions": ".options", "SourceOptions": ".options",
    "PackerError": ".errors",
}
assert set(_HOMES) == set(__all__) - {"__version__"}, "packer.__all__ and _HOMES name the same names"


def __getattr__(name: str) -> Any:
    """A public name, imported now and kept; or a submodule (``packer.parallel``), imported."""
    if name in _HOMES:
        value = getattr(importlib.import_module(_HOMES[name], __name__), name)
        globals()[name] = value
        return value
    if not name.startswith("__"):
        try:
            return importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
    import readers  # (torch, numpy and the formats' libraries only: the training side)

    if name in getattr(readers, "__all__", ()):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}: the reading side is the top-level package "
                             f"'readers' (from readers import {name})")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))
