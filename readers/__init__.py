"""packer's training-side readers: torch Datasets over packed files and on-device modules.

Importing ``readers`` is cheap and loads nothing but this index; each name is imported on
first use. It never imports click, OpenCV or the conversion code (``packer``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = [
    "LMDBDataset",
    "HDF5Dataset",
    "RAMDataset",
    "ShardDataset",
    "StreamingShards",
    "open_dataset",
    "TokenDataset",
    "WidenTokens",
    "Loader",
    "ResumableSampler",
    "ResumeError",
    "CUDAPrefetcher",
    "Normalize",
    "RandomHorizontalFlip",
    "RandomResizedCrop",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "Metadata",
    "PackedDataset",
    "PackedFormatError",
    "IncompleteDatasetError",
    "DatasetReplacedError",
    "CorruptSampleError",
    "UnsupportedVersionError",
    "FORMAT_VERSION",
    "diagnose",
    "Diagnosis",
]

_EXPORTS = {
    "LMDBDataset": "readers.lmdb",
    "HDF5Dataset": "readers.hdf5",
    "RAMDataset": "readers.blob",
    "ShardDataset": "readers.webdataset",
    "StreamingShards": "readers.webdataset",
    "open_dataset": "readers.open",
    "TokenDataset": "readers.tokens",
    "WidenTokens": "readers.tokens",
    "Loader": "readers.loader",
    "ResumableSampler": "readers.sampler",
    "ResumeError": "readers.epoch",
    "CUDAPrefetcher": "readers.cuda",
    "Normalize": "readers.gpu",
    "RandomHorizontalFlip": "readers.gpu",
    "RandomResizedCrop": "readers.gpu",
    "IMAGENET_MEAN": "readers.gpu",
    "IMAGENET_STD": "readers.gpu",
    "PackedDataset": "readers.dataset",
    "Metadata": "readers.schema",
    "PackedFormatError": "readers.schema",
    "IncompleteDatasetError": "readers.schema",
    "DatasetReplacedError": "readers.schema",
    "CorruptSampleError": "readers.checksums",
    "UnsupportedVersionError": "readers.schema",
    "FORMAT_VERSION": "readers.schema",
    "diagnose": "readers.diagnose_loop",
    "Diagnosis": "readers.diagnose_report",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'readers' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # pragma: no cover
    from .dataset import PackedDataset
    from .diagnose_loop import diagnose
    from .diagnose_report import Diagnosis
    from .gpu import IMAGENET_MEAN, IMAGENET_STD, Normalize, RandomHorizontalFlip, RandomResizedCrop
    from .cuda import CUDAPrefetcher
    from .epoch import ResumeError
    from .loader import Loader
    from .sampler import ResumableSampler
    from .lmdb import LMDBDataset
    from .schema import FORMAT_VERSION, DatasetReplacedError, IncompleteDatasetError, Metadata, PackedFormatError, UnsupportedVersionError
