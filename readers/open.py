"""``open_dataset``: any packed dataset as its torch Dataset, whatever the format and kind."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .dataset import PackedDataset, Transform
from .formats import DATASETS, open_store

if TYPE_CHECKING:  # pragma: no cover
    from .tokens import TokenDataset

__all__ = ["open_dataset", "DATASETS"]


def open_dataset(
    path: str | Path, transform: Transform | None = None, *, verify: bool | None = None, **options: Any
) -> PackedDataset | TokenDataset:
    """Open the packed dataset at ``path`` with the reader of its format and kind.

    The format is recognised from the path and its metadata (an LMDB folder, an HDF5 file, a
    ``.blob`` file, a folder of WebDataset shards). Images: that format's dataset
    (``LMDBDataset`` and friends), ``verify`` (check each sample's stored checksum as it is
    read; ``None``: jpeg/png yes, raw no, see :class:`~readers.dataset.PackedDataset`) and
    ``options`` going to its constructor (one it does not take is refused, naming what it takes). Text (metadata ``kind: "text"``), in any format: a
    :class:`readers.TokenDataset` (documents, or blocks with ``block_size=...``; ``options`` go
    to it), which takes no ``transform``; ``verify=True`` checks each document it reads
    (``None``: no, as for raw images).
    """
    meta = open_store(path).meta
    if meta.kind == "text":
        if transform is not None:
            raise TypeError(f"{path}: a text dataset is read by readers.TokenDataset, which takes no transform")
        from .tokens import TokenDataset

        _check_options(TokenDataset, options, path)
        return TokenDataset(path, verify=bool(verify), **options)
    module, name = DATASETS[meta.format]
    cls = getattr(importlib.import_module(module), name)
    _check_options(cls, options, path)
    return cls(path, transform=transform, verify=verify, **options)


def _check_options(cls: type, options: dict[str, Any], path: str | Path) -> None:
    """Refuse in one line an option the dataset class does not take (``in_memory=`` is the
    blob's): format-generic code gets told which, not Python's 'unexpected keyword argument'."""
    taken = inspect.signature(cls).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in taken.values()):
        return
    unknown = [name for name in options if name not in taken]
    if unknown:
        raise TypeError(f"open_dataset: {', '.join(f'{n}=' for n in unknown)} does not apply to {path}, read by readers.{cls.__name__}, "
                        f"which takes {', '.join(n for n in taken if n != 'path') or 'no options'}")
