"""Training blocks of a text dataset's WebDataset shards, streamed: what
``StreamingShards(..., block_size=N)`` yields (:class:`TokenBlocks`).

Within each shard, its documents (stored back to back, each ending with its EOS) form that
shard's token stream; block ``j`` of the shard is tokens ``[j*N, j*N + N + 1)`` of it, yielded as
``(x, y) = (w[:-1], w[1:])``, uint16/uint32 as :class:`~readers.tokens.TokenDataset`'s blocks.
Blocks never cross shards (as LitData packs within a chunk), and a shard's tail shorter than a
window is dropped, so a shard of ``t`` tokens holds ``(t - 1) // N`` blocks (0 below ``N + 1``):
known from the metadata's ``shard_tokens`` (docs/FORMATS.md) without reading the shard, or for
a local folder written before that field, from its member index. Ranks, workers, padding,
``len()``, the shuffle buffer and resume positions all count blocks.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Iterator, Sequence
from urllib.parse import urlparse

import numpy as np
import torch

from .epoch import positive_number
from .formats.webdataset import SHARD_TOKENS, load_index, shard_tokens
from .schema import Metadata, PackedFormatError
from .shard_stream import ShardItems, ShardSamples, decode_member, expected_shards, shard_name, shard_samples

__all__ = ["TokenBlocks", "stream_items", "shard_blocks"]


def shard_blocks(tokens: int, block_size: int) -> int:
    """Blocks of ``block_size`` (each with its next-token target) in a shard of ``tokens`` token ids."""
    return max(0, (int(tokens) - 1) // block_size)


def stream_items(meta: Metadata | None, urls: Sequence[str], block_size: Any, transform: Any) -> ShardItems:
    """What ``StreamingShards`` yields: samples without ``block_size``, else the text dataset's
    token blocks; a ``block_size`` that cannot apply is refused in one line."""
    if block_size is None:
        return ShardSamples(meta)
    block_size = positive_number(block_size, "StreamingShards: block_size")
    if meta is None:
        raise ValueError(
            "StreamingShards: block_size cuts each shard's token stream into blocks counted from the packer metadata's "
            "token counts, and these shards have no packer metadata beside them; stream a packer shard folder of a text "
            "dataset, or leave block_size out (one document per sample)")
    if meta.kind != "text":
        raise ValueError(f"StreamingShards: block_size is for a text dataset (metadata kind 'text'), these shards hold a "
                         f"{meta.kind} dataset; leave block_size out")
    if transform is not None:
        raise ValueError(
            "StreamingShards: transform takes one sample's tensor, and with block_size each item is a pair (x, y) of "
            "token blocks; apply it to the DataLoader's batches instead, or leave block_size out")
    return TokenBlocks(meta, _tokens_per_shard(meta, urls), block_size)


def _tokens_per_shard(meta: Metadata, urls: Sequence[str]) -> list[int]:
    """Token ids per shard, in the metadata's shard order: its ``shard_tokens``, or for a local
    folder written before that field, its member index's document widths."""
    tokens = meta.extra.get(SHARD_TOKENS)
    if tokens is not None:
        return [int(n) for n in tokens]
    folders = {os.path.dirname(url) for url in urls}
    if len(folders) != 1 or any(urlparse(url).scheme for url in urls):
        where = next(iter(folders)) if len(folders) == 1 else "these shards"
        raise ValueError(
            f"StreamingShards: block_size needs each shard's token count, and {where}'s metadata has none ({SHARD_TOKENS}: "
            "written by a packer before it); for remote shards it is not read from the member index: convert the corpus again "
            "(packer convert CORPUS DST --format webdataset, which records it), or copy the folder to a local disk and stream that path")
    index = load_index(next(iter(folders)) or ".")
    if len(index) != meta.count:
        raise PackedFormatError(f"{next(iter(folders))}: the member index has {len(index):,} rows, the metadata counts "
                                f"{meta.count:,} documents: the folder is corrupt; convert again")
    return shard_tokens(index, len(meta.extra["shards"]))


class TokenBlocks:
    """:class:`~readers.shard_stream.ShardItems` of a text dataset's token blocks, cut within each
    shard; :attr:`counts` gives each shard's blocks, :attr:`tokens` its token ids."""

    def __init__(self, meta: Metadata, tokens: list[int], block_size: int) -> None:
        self.meta, self.block_size = meta, block_size
        self.tokens = dict(zip(meta.extra["shards"], tokens))
        self.counts: dict[str, int] | None = {name: shard_blocks(n, block_size) for name, n in self.tokens.items()}
        if self.tokens and not any(self.counts.values()):
            raise ValueError(f"StreamingShards: block_size={block_size} needs {block_size + 1:,} token ids in a shard (blocks never "
                             f"cross shards), and the largest shard holds {max(self.tokens.values()):,}; use a smaller block_size")

    def read(self, urls: Sequence[str], cache: Any, check: Callable[[], None] | None) -> Iterator[np.ndarray]:
        """Each shard's windows of ``block_size + 1`` token ids (native byte order), shard by shard."""
        expected = expected_shards(self.meta)
        for url in urls:  # (one shard at a time: a block never crosses into the next)
            yield from self._windows(url, shard_samples([url], cache, expected, check))

    def _windows(self, url: str, documents: Iterator[Any]) -> Iterator[np.ndarray]:
        """The windows of one shard's documents; a shard whose tokens are not the metadata's count
        is an error (the ranks' equal batches are planned from it)."""
        size, parts, held, seen = self.block_size + 1, [], 0, 0
        for encoded, _ in documents:
            ids = decode_member(*encoded, self.meta).numpy()
            parts.append(ids)
            held, seen = held + len(ids), seen + len(ids)
            if held >= size:
                stream = np.concatenate(parts)
                blocks = (len(stream) - 1) // self.block_size
                for j in range(blocks):
                    yield stream[j * self.block_size : j * self.block_size + size].copy()
                parts = [stream[blocks * self.block_size :]]
                held = len(parts[0])
        expected = self.tokens.get(shard_name(url))
        if expected is not None and seen != expected:
            raise PackedFormatError(f"{url}: holds {seen:,} token ids, the metadata counts {expected:,}: the shard was "
                                    "changed, or the metadata is not its own; convert again")

    def decode(self, item: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        window = torch.from_numpy(item)
        return window[:-1], window[1:]
