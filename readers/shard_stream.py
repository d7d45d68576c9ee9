"""Where :class:`~readers.webdataset.StreamingShards` gets its shards and how it decodes their
members: the shard list and metadata of a folder, pattern, URL or list
(:func:`resolve_shards`), a member's bytes as a sample (:func:`decode_member`), and the
sample shuffle buffer (:func:`shuffled`). The layout is ``readers/formats/webdataset.py``'s.
"""

from __future__ import annotations

import functools
import os
import random
import re
import tarfile
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol, Sequence
from urllib.parse import urlparse

import numpy as np
import torch

from ._process import check_unreplaced, opened_key
from .codecs import decode_image
from .formats import PARTIAL_SUFFIX, check_format
from .formats.base import dataset_path, local_path, refuse_other_pattern
from .formats.npy import parse_npy
from .formats.webdataset import LABEL_EXTENSION, META_FILE, ShardStore, iter_tar, read_metadata
from .formats.uploading import UPLOAD_MARKER, upload_refusal
from .schema import MAX_LABEL, TOKEN_DTYPES, IncompleteDatasetError, Metadata, PackedFormatError

#: Names of local files taken as shards without reading their first bytes.
TAR_SUFFIXES = (".tar", ".tgz", ".tar.gz")

__all__ = ["decode_member", "resolve_shards", "shard_name", "shuffled", "shard_samples", "expected_shards",
           "ShardItems", "ShardSamples", "worker_items"]


class ShardItems(Protocol):
    """What :class:`~readers.webdataset.StreamingShards` yields from its shards, each shard's items
    in order: samples (:class:`ShardSamples`) or a text dataset's token blocks
    (:class:`~readers.token_stream.TokenBlocks`). Counts, positions and padding are in items."""

    #: Items per shard file name, from the metadata (``None`` without: unknown).
    counts: dict[str, int] | None
    #: Token ids per block (``None``: the items are samples).
    block_size: int | None

    def read(self, urls: Sequence[str], cache: Any, check: Callable[[], None] | None) -> Iterator[Any]:
        """The items of ``urls``, in order, still encoded (what the shuffle buffer holds)."""
        ...

    def decode(self, item: Any) -> tuple[Any, Any]:
        """An item as it is yielded: ``(sample, label)``, or a block's ``(x, y)``."""
        ...


class ShardSamples:
    """:class:`ShardItems` of one sample per tar key: ``(image or document, label)``."""

    block_size = None

    def __init__(self, meta: Metadata | None) -> None:
        self.meta = meta
        self.counts = None if meta is None else dict(zip(meta.extra["shards"], meta.extra["shard_counts"]))

    def read(self, urls: Sequence[str], cache: Any, check: Callable[[], None] | None) -> Iterator[Any]:
        return shard_samples(urls, cache, expected_shards(self.meta), check)

    def decode(self, item: Any) -> tuple[Any, Any]:
        encoded, label = item
        return decode_member(*encoded, self.meta), label


def worker_items(items: ShardItems, urls: list[str], cache: Any, check: Callable[[], None] | None, skip: int,
                 own: int | None, share: int | None, rng: random.Random | None, buffer: int) -> Iterator[Any]:
    """A worker's encoded items from position ``skip`` to ``share``: its ``own`` items of ``urls``
    (through a shuffle buffer of ``buffer`` drawn from ``rng``, unless ``None``; truncated when
    ``share`` is smaller), then, when ``share`` is larger, repeats of its items in stored order
    from its first shard on (the padding). Positions before ``skip`` were handed out before a
    restart: read, not decoded again."""
    end = own if share is None or own is None else min(own, share)
    if end is None or skip < end:
        n, rest = 0, urls
        if skip and rng is None and items.counts is not None:  # whole shards already read are not opened
            while rest and n + items.counts.get(shard_name(rest[0]), skip + 1) <= skip:
                n += items.counts[shard_name(rest[0])]
                rest = rest[1:]
        stream = items.read(rest, cache, check)
        if rng is not None:
            stream = shuffled(stream, buffer, rng)
        for item in stream:
            if end is not None and n >= end:
                break
            if n >= skip:
                yield item
            n += 1
    n = own or 0
    while share is not None and n < share:  # the padding (equal_batches pads only workers with items)
        before = n
        for item in items.read(urls, cache, check):
            if n >= share:
                break
            if n >= skip:
                yield item
            n += 1
        if n == before:
            raise PackedFormatError(f"{urls[0] if urls else 'StreamingShards'}: no samples to pad with, the metadata counts {own}")


def decode_member(data: np.ndarray, ext: str, url: str, name: str, meta: Metadata | None) -> torch.Tensor:
    """A member's sample: pixels ``(C, H, W)`` uint8, or a text document's 1-D token ids.

    The metadata's ``kind`` decides; without metadata, a 1-D uint16/uint32 ``.npy`` member is a
    document and anything else an image."""
    kind = meta.kind if meta is not None else None
    try:
        if ext == "npy":
            shape, dtype, offset = parse_npy(data)
            if kind == "text" or (kind is None and dtype.name in TOKEN_DTYPES and len(shape) == 1):
                return token_ids(data[offset:], shape, dtype, meta.dtype if meta is not None else dtype.name)
            if dtype != np.uint8:
                raise PackedFormatError(f"dtype {dtype}, expected uint8")
            return torch.from_numpy(data[offset:].reshape(shape))
        if kind == "text":
            raise PackedFormatError(f"a .{ext} member in a text dataset, expected .npy token ids")
        channels = meta.channels if meta is not None else 3
        return torch.from_numpy(np.ascontiguousarray(decode_image(data, channels)))
    except (PackedFormatError, ValueError) as exc:
        raise PackedFormatError(f"{url}: member {name}: {exc}") from None


def token_ids(payload: np.ndarray, shape: tuple[int, ...], dtype: np.dtype, expected: str) -> torch.Tensor:
    """A document's token ids (the ``.npy`` payload after its header) as a 1-D tensor of native byte order."""
    if dtype.name != expected or len(shape) != 1:
        raise PackedFormatError(f"a {dtype.name} array of shape {shape}, expected a 1-D {expected} array of token ids")
    ids = payload.view(dtype)
    if ids.shape != shape:
        raise PackedFormatError(f"{ids.size} token ids after the header, expected {shape[0]}")
    return torch.from_numpy(ids.astype(dtype.newbyteorder("=")))  # a copy: aligned, native


def shuffled(samples: Iterator[Any], size: int, rng: random.Random) -> Iterator[Any]:
    """A shuffle buffer: fill to ``size``, then emit a random element for each new one."""
    pool: list[Any] = []
    for sample in samples:
        if len(pool) < size:
            pool.append(sample)
            continue
        j = rng.randrange(size)
        pool[j], sample = sample, pool[j]
        yield sample
    rng.shuffle(pool)
    yield from pool


def shard_name(url: str) -> str:
    """The shard's file name: the URL's last part (a ``pipe:`` command's last word's): a space is
    part of a file name (``my train-000000.tar``), and a shard of it was refused as not listed."""
    if url.startswith("pipe:"):
        url = url.split()[-1]
    return url.rstrip("/").rsplit("/", 1)[-1]


def resolve_shards(source: str | Path | Sequence[str]) -> tuple[list[str], Metadata | None]:
    """Shard URLs and, when it can be found locally, the metadata record. A ``Path`` is a shard
    folder, unless it is a file or named as a tar (one shard)."""
    given = source
    if isinstance(source, str):  # file:// URLs (packer convert writes to them) are local paths
        source = local_path(source)
        if not urlparse(source).scheme and dataset_path(source) != Path(source):  # a DST pattern, out/shard-%06d.tar: its folder
            source = dataset_path(source)
    elif not isinstance(source, Path):
        source = [str(local_path(url)) for url in source]
    if isinstance(source, (str, Path)) and not urlparse(str(source)).scheme and not os.path.exists(source) \
            and os.path.exists(f"{str(source).rstrip('/')}.partial"):
        check_format(source, ShardStore.format_name)  # a conversion writing it now (its pid), or interrupted: one line
    if isinstance(source, Path) and (source.is_file() or source.name.endswith(TAR_SUFFIXES)):
        source = str(source)
    if isinstance(source, Path) or (isinstance(source, str) and os.path.isdir(source)):
        folder = Path(source)
        _refuse_unfinished_local(str(folder))
        check_format(folder, ShardStore.format_name)  # another format's dataset, or none at all: one line
        meta = read_metadata(folder)
        if isinstance(given, str):
            refuse_other_pattern(given, folder, meta.extra["shards"])
        urls = [str(folder / name) for name in meta.extra["shards"]]
        _check_local(iter(urls))  # a shard the metadata lists but the folder lacks: one line now, not mid-epoch
        return urls, meta
    from .formats.remote_shards import shard_metadata
    from .remote import is_url

    if isinstance(source, str) and is_url(source) and not source.endswith(".tar") and "{" not in source:
        folder_url = source.rstrip("/")  # a remote shard folder: its metadata lists the shards
        meta = shard_metadata(folder_url)
        return [f"{folder_url}/{name}" for name in meta.extra["shards"]], meta
    if isinstance(source, str):
        from webdataset.shardlists import expand_urls

        urls = expand_urls(source)
    else:
        urls = [str(url) for url in source]
    _check_local(url for url in urls if not urlparse(url).scheme)
    folders = {os.path.dirname(url) for url in urls if not urlparse(url).scheme}
    meta = None
    remote_folders = {url.rsplit("/", 1)[0] for url in urls if is_url(url)}
    if len(remote_folders) == 1 and all(is_url(u) for u in urls):
        meta = shard_metadata(next(iter(remote_folders)), required=False)  # (None: foreign shards; packer's being uploaded: refused)
    if len(folders) == 1 and all(not urlparse(u).scheme for u in urls):
        folder = Path(next(iter(folders)) or ".")
        if (folder / META_FILE).exists():
            meta = read_metadata(folder)
    return urls, meta


def _refuse_unfinished_local(folder: str) -> None:
    """Refuse, in one line, a local folder holding packer's upload marker and no metadata record
    (``readers.formats.remote_shards.shard_metadata`` refuses a URL's): a ``file://`` DST is
    uploaded into its final folder, marker first, as an object store's is."""
    if os.path.exists(os.path.join(folder, UPLOAD_MARKER)) and not os.path.exists(os.path.join(folder, META_FILE)):
        raise IncompleteDatasetError(upload_refusal(folder))


def _check_local(paths: Iterator[str]) -> None:
    """Refuse, in one line, a local shard that is missing, a folder, a shard of an unfinished
    conversion (in its ``DST.partial``), or a regular file that is not a tar (by its name or its
    first bytes: another packer format's dataset is named, with the class that reads it). ``-`` (standard input, to the webdataset library's ``gopen``) and
    other non-regular files (a named pipe, ``/dev/stdin``) are left to the reading: their bytes
    can be read once only."""
    folders: set[str] = set()
    for path in paths:
        if path == "-":
            continue
        folder = os.path.dirname(path) or "."
        if folder not in folders:  # (once per folder: a list may name thousands of its shards)
            folders.add(folder)
            _refuse_unfinished_local(folder)
        if os.path.basename(os.path.dirname(os.path.abspath(path))).endswith(PARTIAL_SUFFIX):  # an unfinished conversion's
            check_format(os.path.dirname(path) or ".", ShardStore.format_name)  # shards, by pattern or list: refused as its folder is
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path}: no such shard (StreamingShards reads .tar shards, a packer shard folder or URLs)")
        if os.path.isdir(path):
            check_format(path, ShardStore.format_name)  # another packer format's dataset, or none: named
            raise PackedFormatError(f"{path}: a shard folder among the shards; pass the folder alone, or its .tar shards")
        if os.path.isfile(path) and not (path.endswith(TAR_SUFFIXES) or tarfile.is_tarfile(path)):
            check_format(path, ShardStore.format_name)


#: Extensions of a member that is a sample's image (any case), as packer's conversion takes them.
_IMAGE_FIELDS = frozenset({"jpg", "jpeg", "png", "webp", "gif", "bmp", "tif", "tiff"})
#: How a member is preferred as its sample's image: KEY.jpg (an image), KEY.npy, then KEY.x.jpg, KEY.x.npy.
_RANKS = ("image", "npy", "other image", "other npy")


def _member_rank(field: str) -> int:
    """The member's place in :data:`_RANKS` (its field: the name after the key's dot), or ``len(_RANKS)``: no image."""
    ext = field.rsplit(".", 1)[-1].lower()
    plain = "." not in field
    if ext in _IMAGE_FIELDS:
        return 0 if plain else 2
    if ext == "npy":
        return 1 if plain else 3
    return len(_RANKS)


def _label(data: np.ndarray, url: str, name: str) -> int:
    """A ``.cls`` member's class index (ASCII decimal, -1 unlabeled), or a one-line error naming it."""
    text = data.tobytes().decode("ascii", "replace").strip()
    if not re.fullmatch(r"-?[0-9]+", text) or not -1 <= int(text) <= MAX_LABEL:
        raise PackedFormatError(f"{url}: member {name}: label {text[:20]!r} is not a class index (-1 to {MAX_LABEL:,})")
    return int(text)


def _second_image(url: str, key: str | None, image: tuple[Any, ...] | None, other: str | None, said: bool) -> bool:
    """Warn, once a shard, of a member ranked as its sample's image but not read (``other``, beside
    ``image``'s): the conversion records it as skipped (packer/sources/shards.py). Whether warned."""
    if other is None or image is None or said:
        return False
    warnings.warn(f"{url}: member {other} is a second image of the sample {key} (beside {image[3]}) and is not read: "
                  "webdataset's key ends at the file name's first dot; name each sample's files KEY.EXT, with no dot "
                  "in KEY (other such members of this shard are not named)", stacklevel=3)
    return True


def expected_shards(meta: Metadata | None) -> dict[str, tuple[int, int]]:
    """Shard file name -> (bytes, samples), as a packer shard folder's metadata records them ({} without)."""
    if meta is None:
        return {}
    extra = meta.extra
    return {name: (int(size), int(count)) for name, size, count in zip(extra["shards"], extra["shard_sizes"], extra["shard_counts"])}


def replaced_check(urls: Sequence[str], meta: Metadata | None) -> Callable[[], None] | None:
    """For the local shards of one packer folder (``meta``: its metadata, just read): a check
    that the folder still holds that dataset (:func:`~readers._process.check_unreplaced`), made
    after each shard opens; ``None`` for other shards."""
    folders = {os.path.dirname(os.path.abspath(url)) for url in urls if not urlparse(url).scheme}
    if meta is None or len(folders) != 1 or len(urls) != sum(not urlparse(url).scheme for url in urls):
        return None
    path = os.path.join(next(iter(folders)), META_FILE)
    return functools.partial(check_unreplaced, path, opened_key(path), next(iter(folders)))


def shard_samples(urls: Sequence[str], cache: Any = None, expected: dict[str, tuple[int, int]] | None = None,
                  check: Callable[[], None] | None = None) -> Iterator[tuple[tuple[np.ndarray, str, str, str], int]]:
    """``((payload, ext, url, member name), label)`` of every sample of ``urls``, still encoded;
    ``cache``: a :class:`~readers.remote.ShardCache` that keeps the shards read; ``expected``
    (:func:`expected_shards`): a shard the metadata lists that ends before its last sample (a
    file or transfer cut short at a tar block) is an error, not a shorter epoch, and is never
    cached; ``check`` (:func:`replaced_check`) runs as each shard opens."""
    from .remote import open_shard

    for url in urls:
        size, count = (expected or {}).get(shard_name(url), (None, None))
        stream = cache.open(url, size) if cache is not None else open_shard(url)
        if check is not None:
            try:
                check()
            except BaseException:
                stream.close()
                raise
        try:
            key, image, label, n, rank, other, said = None, None, -1, 0, len(_RANKS), None, False
            for name, data in iter_tar(stream, url):
                folder, _, base = name.rpartition("/")
                stem, _, field = base.partition(".")  # (the key: up to the file name's first dot, as webdataset's)
                stem = f"{folder}/{stem}" if folder else stem
                if stem != key:
                    said = said or _second_image(url, key, image, other, said)
                    if image is not None:
                        n += 1
                        yield image, label
                    key, image, label, rank, other = stem, None, -1, len(_RANKS), None
                ext = field.rsplit(".", 1)[-1].lower()
                this = _member_rank(field)
                if this < rank:  # KEY.jpg before KEY.seg.png, KEY.npy before KEY.depth.npy (a mask or a map is no image)
                    image, rank, other = (data, ext, url, name), this, None
                elif this == rank < len(_RANKS):  # a.b.png, a.c.png: one sample to webdataset, as to the conversion
                    other = other or name
                elif field == LABEL_EXTENSION:
                    label = _label(data, url, name)
            _second_image(url, key, image, other, said)
            if image is not None:
                n += 1
                yield image, label
            if count is not None and n < count:
                raise PackedFormatError(f"{url}: ends after {n:,} of its {count:,} samples (the metadata's count): "
                                        "the shard, or its transfer, was cut short")
        finally:
            stream.close()
