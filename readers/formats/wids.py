"""The wids index of a packer WebDataset: ``wids-index.json`` beside the shards, which
webdataset's indexed reader opens for random access (``wids.ShardListDataset("out/wids-index.json")``):

``{"wids_version": 1, "name": STEM, "shardlist": [{"url": SHARD, "nsamples": N, "filesize": BYTES}, ...]}``

in shard order, the urls relative to the file's folder (wids resolves them there), ``STEM`` the
shard pattern's part before its number. The metadata records it (``extra["wids_index"]``), and
``packer verify`` checks it against the metadata's shards, counts and sizes (:func:`wids_faults`).
Layout: docs/FORMATS.md, *WebDataset*."""

from __future__ import annotations

import json
from typing import Callable, Iterator, Sequence

from ..schema import Metadata

__all__ = ["WIDS_FILE", "wids_index", "wids_faults"]

#: The index's file name in the shard folder.
WIDS_FILE = "wids-index.json"


def wids_index(pattern: str, shards: Sequence[str], counts: Sequence[int], sizes: Sequence[int]) -> bytes:
    """The index of ``shards`` (names in the folder), with their sample ``counts`` and byte ``sizes``."""
    name = pattern.split("%", 1)[0].rstrip("-_.") or "shards"
    shardlist = [{"url": shard, "nsamples": int(count), "filesize": int(size)} for shard, count, size in zip(shards, counts, sizes)]
    return json.dumps({"wids_version": 1, "name": name, "shardlist": shardlist}, indent=1).encode("ascii") + b"\n"


def wids_faults(read: Callable[[str], bytes], meta: Metadata) -> Iterator[tuple[str, str]]:
    """``(where, what)`` for a wids index the metadata records that is missing, unreadable or
    lists other shards, counts or sizes than the metadata's (nothing for a dataset written before
    it); ``read(name)``: the bytes of the file ``name`` beside the shards (a local folder's, a URL's)."""
    if meta.extra.get("wids_index") != WIDS_FILE:
        return
    extra = meta.extra
    expected = json.loads(wids_index(str(extra.get("shard_pattern") or ""), extra["shards"], extra["shard_counts"], extra["shard_sizes"]))
    try:
        found = json.loads(read(WIDS_FILE))
    except FileNotFoundError:
        yield WIDS_FILE, "missing: the metadata records it"
        return
    except (OSError, ValueError) as exc:
        yield WIDS_FILE, f"unreadable ({exc})"
        return
    if not isinstance(found, dict) or found.get("shardlist") != expected["shardlist"]:
        yield WIDS_FILE, "does not list the metadata's shards, sample counts and sizes: convert again"
