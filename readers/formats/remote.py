"""Packed datasets at a URL, read in place: what ``packer info URL`` and ``packer verify URL`` open.

``packer convert`` writes two formats to a URL: WebDataset shards (a folder URL holding its
:data:`~readers.formats.webdataset.META_FILE`) and blobs (one object). :func:`detect_remote` tells
which is at a URL, refusing an upload in progress, a URL holding no packer dataset and a missing
one, each in one line, as :func:`readers.formats.detect_format` refuses their local kin;
:func:`open_remote` opens it (``readers/formats/remote_shards.py``, ``readers/formats/remote_blob.py``).
LMDB and HDF5 datasets are read from local paths only (``file://`` URLs are local paths).
"""

from __future__ import annotations

from ..remote import is_url, read_url_range, url_listing, url_size
from ..schema import IncompleteDatasetError, PackedFormatError
from .base import Store
from .blob import MAGIC
from .remote_blob import RemoteBlobStore
from .remote_shards import RemoteShardStore, folder_url, shard_metadata

__all__ = ["is_remote", "detect_remote", "open_remote", "open_remote_store"]


def is_remote(path: object) -> bool:
    """Whether ``path`` names a dataset at a URL read here (not a local path, not ``file://``)."""
    return isinstance(path, str) and is_url(path)


def detect_remote(url: str) -> str:
    """The packer format of the dataset at ``url``: ``"webdataset"`` (a folder with its metadata
    record, which may still be damaged) or ``"blob"`` (an object that starts as a finished blob
    does, or is named ``.blob``); one line otherwise: an upload in progress
    (:class:`IncompleteDatasetError`), nothing there (``FileNotFoundError``), or something that is
    no packer dataset (:class:`PackedFormatError`)."""
    try:
        if shard_metadata(folder_url(url), required=False) is not None:
            return "webdataset"
    except IncompleteDatasetError:
        raise  # an upload in progress
    except PackedFormatError:
        return "webdataset"  # a damaged record: verify says so, as of a local one
    size = url_size(url)
    if size is not None and (url.rstrip("/").endswith(".blob") or read_url_range(url, 0, len(MAGIC)) == MAGIC):
        return "blob"
    if size is None and not url_listing(folder_url(url)):  # (an http(s) URL's size is None only when it is missing)
        raise FileNotFoundError(f"{url}: no such packed dataset")
    raise PackedFormatError(f"{url}: not a packer dataset at a URL (expected a folder of WebDataset shards with its packer.json, "
                            "or a .blob object; LMDB and HDF5 datasets are read from local paths)")


def open_remote(url: str, format_name: str) -> Store:
    """The store of the ``format_name`` dataset at ``url`` (:func:`detect_remote`'s answer);
    a damaged one raises :class:`PackedFormatError` saying what is wrong."""
    if format_name == "webdataset":
        return RemoteShardStore(url)
    return RemoteBlobStore(url, url_size(url))


def open_remote_store(url: str) -> Store:
    """Open the packer dataset at ``url`` (:func:`detect_remote`, then :func:`open_remote`)."""
    return open_remote(url, detect_remote(url))
