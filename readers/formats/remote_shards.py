"""A packer WebDataset at a URL (``s3://bucket/train``, ``http://host/train``), read in place.

:func:`shard_metadata` is the one reader of a shard folder URL's metadata record (its
:data:`~readers.formats.webdataset.META_FILE`): ``readers.StreamingShards`` lists its shards by it, and
``packer info`` and ``packer verify`` of a URL open the dataset by it. A folder without the
record that holds packer's upload marker is an upload in progress, or an interrupted one
(``readers/formats/uploading.py``), and is refused in one line.

:class:`RemoteShardStore` is :class:`~readers.formats.webdataset.ShardStore` over a URL: the
same checks and records, its files fetched through ``readers/remote.py`` (fsspec; http(s)
through urllib) instead of mapped from a folder. The member index and the checksums are
fetched whole (16 bytes a sample on the wire in all, small beside the shards); the shards one
at a time, into memory, when a record or the tar structure of one is asked for (the last one
fetched is kept), so nothing of the dataset is written to local disk. The object sizes come
from one listing of the folder (http(s): a HEAD request per file, and nothing else in the
folder is seen).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..remote import read_url, url_listing, url_size
from ..schema import IncompleteDatasetError, Metadata, PackedFormatError
from .base import SHARD_NAME
from .uploading import UPLOAD_MARKER, upload_refusal
from .webdataset import INDEX_FILE, META_FILE, ShardStore, index_from_bytes, parse_metadata, shard_size_fault

__all__ = ["shard_metadata", "folder_url", "RemoteShardStore"]


def folder_url(url: str) -> str:
    """The folder URL of a dataset given as ``url``: without a trailing slash, and without a shard
    name pattern as ``packer convert`` takes DST (``s3://b/train/train-%06d.tar``)."""
    url = url.rstrip("/")
    head, _, name = url.rpartition("/")
    return head if head and SHARD_NAME.fullmatch(name) else url


def shard_metadata(folder: str, *, required: bool = True) -> Metadata | None:
    """The validated metadata record of the shard folder at the URL ``folder``. Without one, an
    upload in progress (its marker) is refused in one line (:class:`IncompleteDatasetError`);
    otherwise ``None``, or (``required``) an :class:`IncompleteDatasetError` naming the folder."""
    folder = folder.rstrip("/")
    raw = read_url(f"{folder}/{META_FILE}")
    if raw is not None:
        return parse_metadata(raw, folder)
    if read_url(f"{folder}/{UPLOAD_MARKER}") is not None:
        raise IncompleteDatasetError(upload_refusal(folder))
    if not required:
        return None
    raise IncompleteDatasetError(f"{folder}: no {META_FILE}: the upload did not finish or this is not a packer shard folder")


class RemoteShardStore(ShardStore):
    """The packer WebDataset at the folder URL ``url``, read-only, in this process (it is not
    sent to DataLoader workers: stream one with ``readers.StreamingShards``)."""

    def __init__(self, url: str, *, verify: bool | None = None, meta: Metadata | None = None) -> None:
        """``meta``: the record :func:`shard_metadata` has just read for ``url``, not fetched again."""
        self._given_meta = meta
        self._listing: dict[str, int] | None = None
        self._listed = False  # (whether the folder was listed: http(s) folders are not)
        super().__init__(url, verify=verify)

    def _locate(self, path: str | Path) -> Path:
        return folder_url(str(path))  # type: ignore[return-value]  # (a URL: Path would fold its //)

    def _opened_key(self, path: str | Path) -> None:
        return None  # (nothing here replaces the dataset between reads: one process, one pass)

    def _read_metadata(self) -> Metadata:
        meta = self._given_meta if self._given_meta is not None else shard_metadata(str(self.path))
        return meta  # type: ignore[return-value]

    def _shard_files(self, key: tuple[int, ...] | None) -> "_RemoteShards":
        return _RemoteShards(self)

    def _read_file(self, name: str) -> bytes:
        raw = read_url(f"{self.path}/{name}")
        if raw is None:
            raise FileNotFoundError(f"{self.path}/{name}: no such file")
        return raw

    def _index_rows(self) -> int:
        return len(self._files.get().index)

    def _sizes(self) -> dict[str, int]:
        """Name -> bytes of the files in the folder: one listing (http(s): a HEAD request for each
        file the dataset has, the missing ones left out)."""
        if self._listing is None:
            listing = url_listing(str(self.path))
            self._listed = listing is not None
            if listing is None:
                names = sorted(self.own_names) + list(self.meta.extra["shards"])
                listing = {name: size for name in names if (size := url_size(f"{self.path}/{name}")) is not None}
            self._listing = listing
        return self._listing

    def _shard_sizes(self) -> list[int | None]:
        return [self._sizes().get(name) for name in self.shards]

    def _folder_names(self) -> list[str] | None:
        names = list(self._sizes())
        return names if self._listed else None

    def stored_bytes(self) -> int:
        """Bytes of the files in the folder (``packer info``'s "on disk")."""
        return sum(self._sizes().values())


class _RemoteShards:
    """The store's member index (fetched on first use) and its shards, fetched whole, one at a
    time (``map``: the last one is kept, as the records of a pass come shard after shard)."""

    def __init__(self, store: RemoteShardStore) -> None:
        self.store = store
        self._index: np.ndarray | None = None
        self._kept: tuple[int, bytes] | None = None

    def get(self) -> "_RemoteShards":
        return self

    @property
    def index(self) -> np.ndarray:
        if self._index is None:
            url = str(self.store.path)
            self._index = index_from_bytes(read_url(f"{url}/{INDEX_FILE}"), url)
        return self._index

    def map(self, shard: int) -> bytes:
        if self._kept is None or self._kept[0] != shard:
            where = f"{self.store.path}/{self.store.shards[shard]}"
            data = read_url(where)
            fault = shard_size_fault(where, None if data is None else len(data), int(self.store.meta.extra["shard_sizes"][shard]))
            if fault is not None:
                raise PackedFormatError(fault)
            self._kept = (shard, data)  # type: ignore[assignment]
        return self._kept[1]  # type: ignore[index]
