"""packer: convert image folders once, offline, into fast packed datasets for PyTorch.

>>> import packer
>>> packer.convert("imagenet/train", "train.lmdb", image=packer.ImageOptions(size=224))

The readers live in the separate ``readers`` package, which training jobs import alone.
"""

from __future__ import annotations

from ._version import __version__
from .api import ConversionReport, convert
from .errors import PackerError
from .options import ImageOptions, StorageOptions

__all__ = ["__version__", "convert", "ConversionReport", "ImageOptions", "StorageOptions", "PackerError"]
