"""WebDataset shards as torch datasets (layout: ``readers/formats/webdataset.py``).

* :class:`ShardDataset`: map-style random access by index to a local shard folder, through
  the member index written beside the shards (``ds[i]``, the DataLoader's batched
  ``__getitems__``, ``read_batch``).
* :class:`StreamingShards`: an ``IterableDataset`` reading shards front to back, from local
  paths, brace patterns (``data-{000000..000009}.tar``), ``pipe:`` commands or URLs (the
  webdataset library's URL expansion and ``gopen``), with shard shuffling, a sample shuffle
  buffer, and an exact split across distributed ranks and DataLoader workers.

Samples are ``(uint8 tensor (C, H, W), int label)``.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence
from urllib.parse import urlparse

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from .codecs import decode_image
from .dataset import PackedDataset
from .formats.webdataset import EXTENSIONS, LABEL_EXTENSION, META_FILE, ShardStore, iter_tar, parse_npy, read_metadata
from .schema import Metadata, PackedFormatError

__all__ = ["ShardDataset", "StreamingShards"]

Transform = Callable[[torch.Tensor], Any]


class ShardDataset(PackedDataset):
    """Samples of a local packer shard folder, by index, as ``(uint8 tensor (C, H, W), int label)``.

    Each shard is memory-mapped lazily, read-only, once per process (DataLoader workers under
    fork and spawn map their own); a batch is one gather into one array.
    """

    store_class = ShardStore


class StreamingShards(IterableDataset):
    """Stream samples from WebDataset shards, split exactly across ranks and DataLoader workers.

    ``urls_or_path``: a packer shard folder (its shards, in order, from the metadata), or what
    the webdataset library accepts: a URL or path with brace patterns, several joined by
    ``::``, or a list of URLs; ``pipe:`` commands and http(s) URLs are opened with the
    webdataset library's ``gopen``.

    Every epoch each process computes the same shard order (shuffled with ``seed`` and the epoch
    when ``shuffle``), takes every ``world_size``-th shard from ``rank``, then every
    ``num_workers``-th of those from its DataLoader worker id: each sample is read exactly once
    per epoch over all ranks and workers. With ``shuffle``, samples also pass through a shuffle
    buffer of ``buffer`` samples seeded from (seed, epoch, rank, worker). Call
    :meth:`set_epoch` before each epoch (as with ``DistributedSampler``) for a new order; with
    ``persistent_workers=True`` the workers do not see it.

    ``rank``/``world_size`` default to torch.distributed's when it is initialised, else 0/1.
    ``len()`` is the number of samples this rank reads per epoch, from the metadata (a packer
    folder, or the folder holding local shards); without metadata it raises ``TypeError``.
    """

    def __init__(
        self,
        urls_or_path: str | Path | Sequence[str],
        *,
        shuffle: bool = False,
        buffer: int = 1000,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        transform: Transform | None = None,
    ) -> None:
        self.urls, self.meta = _resolve(urls_or_path)
        if not self.urls:
            raise ValueError(f"{urls_or_path!r}: names no shards")
        if buffer < 1:
            raise ValueError(f"buffer must be a positive number of samples, got {buffer!r}")
        if rank is None or world_size is None:
            dist_rank, dist_size = _distributed()
            rank = dist_rank if rank is None else rank
            world_size = dist_size if world_size is None else world_size
        if not (world_size >= 1 and 0 <= rank < world_size):
            raise ValueError(f"rank must be in 0..world_size-1, got rank={rank}, world_size={world_size}")
        self.shuffle, self.buffer, self.seed = shuffle, buffer, seed
        self.rank, self.world_size = rank, world_size
        self.transform = transform
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Use the shard and sample order of ``epoch`` (needs ``shuffle`` to change anything)."""
        self.epoch = epoch

    @property
    def classes(self) -> list[str]:
        return list(self.meta.classes) if self.meta is not None else []

    def shards_for(self, worker: int = 0, num_workers: int = 1) -> list[str]:
        """The shard URLs that DataLoader worker ``worker`` of this rank reads this epoch."""
        order = list(self.urls)
        if self.shuffle:
            random.Random(_mix(self.seed, self.epoch)).shuffle(order)
        return order[self.rank :: self.world_size][worker::num_workers]

    def __len__(self) -> int:
        if self.meta is None:
            raise TypeError("StreamingShards: the number of samples is unknown (no packer metadata beside these shards)")
        counts = dict(zip(self.meta.extra["shards"], self.meta.extra["shard_counts"]))
        try:
            return sum(counts[_basename(url)] for url in self.shards_for())
        except KeyError as exc:
            raise TypeError(f"StreamingShards: shard {exc} is not listed in the metadata") from None

    def __iter__(self) -> Iterator[tuple[Any, int]]:
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        samples = self._samples(self.shards_for(worker, num_workers))
        if self.shuffle:
            rng = random.Random(_mix(self.seed, self.epoch, self.rank, worker))
            samples = _shuffled(samples, self.buffer, rng)
        for image, label in samples:
            yield (self.transform(image) if self.transform is not None else image), label

    def _samples(self, urls: list[str]) -> Iterator[tuple[torch.Tensor, int]]:
        from webdataset.gopen import gopen

        channels = self.meta.channels if self.meta is not None else 3
        image_exts = set(EXTENSIONS.values())
        for url in urls:
            stream = gopen(url, "rb")
            try:
                key, image, label = None, None, -1
                for name, data in iter_tar(stream, url):
                    stem, _, ext = name.partition(".")
                    if stem != key:
                        if image is not None:
                            yield image, label
                        key, image, label = stem, None, -1
                    if ext in image_exts:
                        image = _decode(data, ext, channels, url, name)
                    elif ext == LABEL_EXTENSION:
                        label = int(data.tobytes())
                if image is not None:
                    yield image, label
            finally:
                stream.close()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({len(self.urls)} shards, shuffle={self.shuffle}, buffer={self.buffer}, "
            f"seed={self.seed}, rank={self.rank}/{self.world_size}, epoch={self.epoch})"
        )


def _decode(data: np.ndarray, ext: str, channels: int, url: str, name: str) -> torch.Tensor:
    try:
        if ext == "npy":
            shape, dtype, offset = parse_npy(data)
            if dtype != np.uint8:
                raise PackedFormatError(f"dtype {dtype}, expected uint8")
            return torch.from_numpy(data[offset:].reshape(shape))
        return torch.from_numpy(np.ascontiguousarray(decode_image(data, channels)))
    except (PackedFormatError, ValueError) as exc:
        raise PackedFormatError(f"{url}: member {name}: {exc}") from None


def _shuffled(samples: Iterator[Any], size: int, rng: random.Random) -> Iterator[Any]:
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


def _mix(*values: int) -> int:
    seed = 0x9E3779B97F4A7C15
    for value in values:
        seed = (seed * 1_000_003 + int(value)) % (1 << 63)
    return seed


def _distributed() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def _basename(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1].split()[-1] if url else url


def _resolve(source: str | Path | Sequence[str]) -> tuple[list[str], Metadata | None]:
    """Shard URLs and, when it can be found locally, the metadata record."""
    if isinstance(source, Path) or (isinstance(source, str) and os.path.isdir(source)):
        folder = Path(source)
        meta = read_metadata(folder)
        return [str(folder / name) for name in meta.extra["shards"]], meta
    if isinstance(source, str):
        from webdataset.shardlists import expand_urls

        urls = expand_urls(source)
    else:
        urls = [str(url) for url in source]
    folders = {os.path.dirname(url) for url in urls if not urlparse(url).scheme}
    meta = None
    if len(folders) == 1 and all(not urlparse(u).scheme for u in urls):
        folder = Path(next(iter(folders)) or ".")
        if (folder / META_FILE).exists():
            meta = read_metadata(folder)
    return urls, meta
