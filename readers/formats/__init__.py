"""Torch-free storage access, one module per packer format (each owns its on-disk layout).

:data:`STORES` maps a format name to the module and class that read it (imported on first use,
so reading LMDB never imports h5py); :func:`detect_format` tells the format of a path from its
name and contents (each store class's ``recognises``); :func:`open_store` opens it.
:func:`check_format` is what a reader of one format asks before it opens a path: it refuses, in
one line, another format's dataset (naming it and the class that reads it, from
:data:`DATASETS`), an unfinished conversion, and a path that is no packer dataset at all.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from ..schema import FORMATS, IncompleteDatasetError, Metadata, PackedFormatError
from .base import Store, dataset_path, missing_dataset
from .inprogress import is_empty_folder, lock_holder, lock_path

__all__ = ["detect_format", "check_format", "open_store", "refuse_remote", "store_class", "reader_hint", "STORES", "DATASETS", "PARTIAL_SUFFIX"]

PARTIAL_SUFFIX = ".partial"
#: What to do about an unfinished conversion (``--resume`` keeps what its checkpoints saved).
_FINISH = "run the same packer convert command again, with --resume to keep what it saved"

#: Format name -> (module, class) of its store. Detection tries them in this order.
STORES: dict[str, tuple[str, str]] = {
    "lmdb": ("readers.formats.lmdb", "LMDBStore"),
    "hdf5": ("readers.formats.hdf5", "HDF5Store"),
    "blob": ("readers.formats.blob", "BlobStore"),
    "webdataset": ("readers.formats.webdataset", "ShardStore"),
}
assert set(STORES) == set(FORMATS)

#: Format name -> (module, class) of its map-style torch Dataset of images (names only: nothing
#: here imports torch). ``readers.open_dataset`` opens them; messages name them.
DATASETS: dict[str, tuple[str, str]] = {
    "lmdb": ("readers.lmdb", "LMDBDataset"),
    "hdf5": ("readers.hdf5", "HDF5Dataset"),
    "blob": ("readers.blob", "RAMDataset"),
    "webdataset": ("readers.webdataset", "ShardDataset"),
}
assert set(DATASETS) == set(FORMATS)


def store_class(format_name: str) -> type[Store]:
    """The store class of a format name (imports only that format's library)."""
    try:
        module, name = STORES[format_name]
    except KeyError:
        raise PackedFormatError(f"unknown packed format {format_name!r} (known: {', '.join(STORES)})") from None
    return getattr(importlib.import_module(module), name)


def detect_format(path: str | Path) -> str:
    """The packer format of ``path``, from its name and contents."""
    p = _existing(path)
    found = _recognised(p)
    if found is None:
        raise PackedFormatError(
            f"{p}: not a packer dataset (expected an LMDB folder, an HDF5 file, a .blob file or a folder of WebDataset shards)"
        )
    return found


def check_format(path: str | Path, format_name: str) -> None:
    """Return if ``path`` looks like a dataset of ``format_name`` (its store checks the rest),
    else raise one line: an unfinished conversion (:class:`IncompleteDatasetError`, as
    :func:`detect_format`), a missing path (``FileNotFoundError``), another format's finished
    dataset (which format, and which class reads it) or no packer dataset at all. Only a path
    its own format does not recognise is shown to the others (so opening one format imports no
    other format's library)."""
    p = _existing(path)
    expected = store_class(format_name)
    if expected.recognises(p):
        return
    found = _recognised(p)
    if found is None:
        raise PackedFormatError(f"{p}: {expected.mismatch(p)}, nor any other packer dataset")
    meta = store_class(found)(p).meta  # an unfinished or damaged one says so here, in its own words
    raise PackedFormatError(f"{p}: a packer {store_class(found).label} {meta.kind} dataset, not {expected.label}: {reader_hint(meta)}")


def reader_hint(meta: Metadata) -> str:
    """``"read it with readers.X(path) (or readers.open_dataset(path))"``, X the class that reads ``meta``'s dataset."""
    name = "TokenDataset" if meta.kind == "text" else DATASETS[meta.format][1]
    return f"read it with readers.{name}(path) (or readers.open_dataset(path))"


def open_store(path: str | Path) -> Store:
    """Open any packed dataset, torch-free."""
    return store_class(detect_format(path))(path)


#: What a reader given a URL does instead (:func:`refuse_remote`).
_REMOTE_INSTEAD = ("packed datasets are opened from local paths (or file:// URLs): stream WebDataset shards from a URL "
                   "with readers.StreamingShards, or copy the dataset to a local disk first")


def refuse_remote(path: str | Path, *, instead: str = _REMOTE_INSTEAD) -> None:
    """Raise one line naming ``path`` as given when it is a URL other than ``file://`` (``Path``
    would fold its ``//`` into one, and the error would name another path), then ``instead``:
    what to do (a command of ``packer`` that does not take URLs says which do)."""
    scheme = re.match(r"([A-Za-z][A-Za-z0-9+.-]*)://", path) if isinstance(path, str) else None
    if scheme is not None and scheme.group(1).lower() != "file":
        raise PackedFormatError(f"{path}: a {scheme.group(1)}:// URL; {instead}")


def _existing(path: str | Path) -> Path:
    """``path`` (a shard pattern: its folder), unless it is an unfinished conversion or missing (then raise)."""
    refuse_remote(path)
    p = dataset_path(path)
    partial = p.with_name(p.name + PARTIAL_SUFFIX)
    if not p.exists() or (is_empty_folder(p) and partial.exists()):  # (an empty folder made for DST: its conversion's news)
        if partial.exists() and not p.name.endswith(PARTIAL_SUFFIX):
            holder = lock_holder(lock_path(partial))
            state = "is an empty folder" if p.exists() else "does not exist"
            if holder is not None:  # not interrupted: still being written
                raise IncompleteDatasetError(f"{p}: {state}{'' if p.exists() else ' yet'}; a packer conversion (pid {holder}) is writing it now "
                                             f"({partial.name}): wait for it to finish")
            raise IncompleteDatasetError(f"{p}: {state}; {partial.name} is an unfinished conversion: {_FINISH}")
        raise missing_dataset(p)
    if p.name.endswith(PARTIAL_SUFFIX):
        holder = lock_holder(lock_path(p))
        if holder is not None:  # as for DST above: it said 'run it again with --resume' of a running one
            raise IncompleteDatasetError(f"{p}: a conversion in progress: packer (pid {holder}) is writing it now; wait for it "
                                         f"to finish and open {p.name[:-len(PARTIAL_SUFFIX)]}")
        raise IncompleteDatasetError(f"{p}: an unfinished conversion (its name ends in {PARTIAL_SUFFIX}): {_FINISH}")
    return p


def _recognised(p: Path) -> str | None:
    """The first format (in :data:`STORES` order) whose store recognises the existing ``p``."""
    return next((name for name in STORES if store_class(name).recognises(p)), None)
