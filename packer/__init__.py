"""packer: convert image folders and text corpora once, offline, into fast packed datasets for PyTorch.

>>> import packer
>>> packer.convert("imagenet/train", "train.lmdb", image=packer.ImageOptions(size=224))
>>> packer.convert("corpus/", "corpus.blob", text=packer.TextOptions(tokenizer="tokenizer.json"))

The readers live in the separate ``readers`` package, which training jobs import alone.
"""

from __future__ import annotations

from ._version import __version__
from .api import ConversionReport, TextConversionReport, convert
from .errors import PackerError
from .options import ImageOptions, RunOptions, SourceOptions, StorageOptions, TextOptions

__all__ = [
    "__version__", "convert", "ConversionReport", "TextConversionReport", "ImageOptions", "TextOptions", "StorageOptions",
    "RunOptions", "SourceOptions", "PackerError",
]
