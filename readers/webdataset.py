"""WebDataset shards as torch datasets (layout: ``readers/formats/webdataset.py``).

* :class:`ShardDataset`: map-style random access by index to a local shard folder, through
  the member index written beside the shards (``ds[i]``, the DataLoader's batched
  ``__getitems__``, ``read_batch``).
* :class:`StreamingShards`: an ``IterableDataset`` reading shards front to back, from local
  paths, brace patterns (``data-{000000..000009}.tar``), ``pipe:`` commands or URLs (the
  webdataset library's URL expansion and ``gopen``), with shard shuffling, a sample shuffle
  buffer, and an exact split across distributed ranks and DataLoader workers.

Samples are ``(uint8 tensor (C, H, W), int label)``; a text dataset's samples (``kind:
"text"`` in the metadata) are each document's token ids, a 1-D tensor of the stored dtype
(uint16/uint32, as :class:`~readers.tokens.TokenDataset` serves documents), with label -1, or
with ``block_size`` training blocks ``(x, y)`` cut within each shard (``readers/token_stream.py``).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch
from torch.utils.data import IterableDataset, get_worker_info

from .dataset import PackedDataset
from .epoch import (EpochCursor, ResumeError, check_batch_size, check_fingerprint, check_settings, dataset_fingerprint, flag,
                    positive_number, resolve_rank, whole_number)
from .shard_plan import ShardPlan, rank_shares, uneven_split, worker_position
from .shared_cursor import SharedCursor
from .formats.webdataset import ShardStore
from .shard_stream import replaced_check, resolve_shards, shard_name, worker_items
from .token_stream import stream_items

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

    ``urls_or_path``: a packer shard folder (its shards, in order, from the metadata), a path
    to one shard, or what the webdataset library accepts: a URL or path with brace patterns,
    several joined by ``::``, or a list of URLs; ``pipe:`` commands are opened with the
    webdataset library's ``gopen``, ``-`` is standard input. A local shard that is
    missing, a folder in a list, or a regular file that is not a tar (another packer format's
    dataset is named, with the class that reads it) is refused at construction, in one line
    (``readers/shard_stream.py``).

    Samples are ``(image, label)``, or for a text dataset ``(token ids, -1)``: each document's
    ids as a 1-D uint16/uint32 tensor (lengths differ: ``DataLoader(batch_size=None)`` or a
    collate function that pads).

    ``block_size=N`` (a text dataset only): items are training blocks ``(x, y)``, ``N`` token ids
    and their next-token targets (``w[:-1], w[1:]`` of a window of ``N + 1``), uint16/uint32 as
    :class:`~readers.tokens.TokenDataset`'s. Within each shard the documents (each ending with its
    EOS) are one token stream and block ``j`` is its tokens ``[j*N, j*N + N + 1)``; blocks never
    cross shards and a shard's tail shorter than a window is dropped: ``(tokens - 1) // N`` blocks
    a shard, counted from the metadata's ``shard_tokens`` (a local folder written before it: from
    its member index; a remote one is refused). Everything below then counts blocks: the split,
    padding, ``len()``, the shuffle buffer and resume positions (a state of another ``block_size``, or
    of documents, is refused). ``transform`` is refused with it (an item is a pair): apply it to the batches.

    Every epoch each process computes the same shard order (:class:`~readers.shard_plan.ShardPlan`:
    shuffled with ``seed`` and the epoch when ``shuffle``), takes every ``world_size``-th shard
    from ``rank``, then every ``num_workers``-th of those from its DataLoader worker id: each
    sample is read once per epoch over all ranks and workers (plus the padding below). With
    ``shuffle``, samples pass through a shuffle buffer of ``buffer`` samples seeded from (seed,
    epoch, rank, worker). Call :meth:`set_epoch` before each epoch (as with
    ``DistributedSampler``; a shuffled pass that repeats one run to its end warns); the epoch is
    kept in shared memory, so ``persistent_workers=True`` workers follow it too.

    Remote shards (readers/remote.py): http(s) URLs stream through urllib (a server that sends
    nothing for ``STALL_SECONDS`` is an error, not a hang), other fsspec URLs
    (``s3://bucket/data/``, ...) through fsspec; a folder URL (or shards sharing one) has its
    metadata fetched from there. ``cache_dir`` keeps downloaded shards on local disk, at most
    ``cache_bytes`` (least recently used out), for later epochs. A shard the metadata lists that
    ends before its last sample (a file or transfer cut short) is an error, never a shorter
    epoch (the ranks' equal batches rely on the counts), and is never cached.

    ``rank``/``world_size``: torch.distributed's once initialised, else 0/1 (warned if ``WORLD_SIZE > 1``).

    Equal steps on every rank (so that DDP never waits on a rank with a batch fewer): ranks read
    whole shards, so their sample counts differ; from the metadata's per-shard counts every rank
    computes every rank's and worker's share (:func:`~readers.shard_plan.rank_shares`). Pass the
    DataLoader's ``batch_size`` and ``num_workers`` (``batch_size=None``: batches of one sample, any
    ``num_workers``; without them, rank 0 warns in a DataLoader with several workers, whose batch
    counts may then differ by rank). By default each worker's samples are padded to whole batches by repeating its
    own samples from its first shard on, then ranks with fewer batches get whole batches of such
    repeats up to the longest rank (as ``DistributedSampler`` pads; every batch is full); with
    ``drop_last=True`` each rank stops after the shortest rank's number of whole batches (each
    worker's unread tail dropped, nothing read twice). An epoch with no batch is refused (at
    construction and ``set_epoch``). The shuffle buffer does not change the counts: padding follows
    a worker's shuffled stream, truncation cuts it. ``len()`` is the number of samples this rank
    yields per epoch (padding included), a multiple of ``batch_size``: ``len(DataLoader(...))`` is
    the true number of batches; a DataLoader with another worker count (when ``batch_size`` is
    given) is refused. Without metadata (unknown counts) ranks are not equalised, ``len()`` raises
    ``TypeError``, and ``batch_size``/``drop_last``/``num_workers`` are refused.

    Resume mid-epoch (sample-exact, needs the metadata): the training process counts the
    batches its ``DataLoader`` yielded this epoch and saves ``state_dict(batches)``
    (``batch_size``/``num_workers``: the DataLoader's, if not given to the constructor); after
    a restart, :meth:`load_state_dict` makes the next iteration of that epoch yield exactly the
    samples not yet seen (the rest of the padded epoch), in the same order. Positions follow
    the DataLoader's in-order round robin over its workers (``in_order=True``,
    ``drop_last=False``, the defaults). Whole shards already read are not opened again; a
    partly read shard, and with ``shuffle`` the worker's stream through its buffer, is replayed
    up to the position undecoded (the buffer holds encoded bytes).

    What is exact, and what is not elastic: the state is the shard split of this
    ``world_size`` and ``num_workers`` plus each worker's offset into its own stream. Resumed
    with the same settings, the rest of the epoch is exactly the samples not yet handed out,
    each once (with ``batch_size=None`` here, the DataLoader's batch size may change: only the
    interleaving of the workers' batches does). Another ``world_size`` or ``num_workers`` is
    refused (:class:`~readers.epoch.ResumeError`, naming it): what a worker handed out is a
    scattered subset of its shards that only its own split and buffer reproduce. For elastic
    resume read the shards map-style: ``Loader(ShardDataset(folder))`` or a ``DataLoader`` with
    :class:`~readers.sampler.ResumableSampler`. A state of other shards (the metadata's sample
    count, source and creation time) is refused naming what differs.
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
        cache_dir: str | Path | None = None,
        cache_bytes: int | str = 10 << 30,
        batch_size: int | None = None,
        drop_last: bool = False,
        num_workers: int = 0,
        block_size: int | None = None,
    ) -> None:
        self.urls, self.meta = resolve_shards(urls_or_path)
        self.items = stream_items(self.meta, self.urls, block_size, transform)  # samples, or token blocks
        self.block_size = self.items.block_size
        self._unreplaced = replaced_check(self.urls, self.meta)  # (a folder replaced mid-epoch: an error, never two datasets mixed)
        if batch_size is not None:
            batch_size = check_batch_size(batch_size)
        if not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers < 0:
            raise ValueError(f"num_workers must be a DataLoader's worker count (an integer >= 0), got {num_workers!r}")
        drop_last = flag(drop_last, "drop_last")
        if self.meta is None and (batch_size is not None or drop_last or num_workers):
            raise ValueError(
                "StreamingShards: batch_size, drop_last and num_workers equalise the ranks' batches from the shards' sample "
                "counts, and these shards have no packer metadata beside them; leave them out, or stream a packer shard folder"
            )
        self.batch_size, self.drop_last, self.num_workers = batch_size, drop_last, num_workers
        self.cache = None
        if cache_dir is not None:
            from .remote import ShardCache

            version = "" if self.meta is None else self.meta.to_json()  # (its options, source, counts and time of creation)
            self.cache = ShardCache(cache_dir, cache_bytes, version)
        if not self.urls:
            raise ValueError(f"{urls_or_path!r}: names no shards")
        buffer = positive_number(buffer, "buffer")  # samples
        rank, world_size = resolve_rank(rank, world_size, "StreamingShards")
        self.plan = ShardPlan(shuffle, seed, rank, world_size)
        self.buffer = buffer
        self.transform = transform
        # the epoch, and a resume position in it: (samples each worker skips, the worker whose batch is next)
        self._cursor = EpochCursor()
        self._resumed_batches: int | None = 0  # the batches of the epoch read before the position loaded
        #: The same in shared memory, which a DataLoader's persistent workers follow.
        self._shared = SharedCursor()
        self.set_epoch(0)
        if self.meta is not None and self.rank == 0:
            self._warn_uneven()

    # -- the plan (readers/epoch.py) ---------------------------------------------------------
    shuffle = property(lambda self: self.plan.shuffle, doc="Whether shards and samples are shuffled.")
    seed = property(lambda self: self.plan.seed, doc="The seed of every epoch's order.")
    rank = property(lambda self: self.plan.rank, doc="This process's rank.")
    world_size = property(lambda self: self.plan.world_size, doc="How many ranks share each epoch.")

    @property
    def epoch(self) -> int:
        """The epoch whose order the next iteration follows."""
        return self._cursor.epoch

    def set_epoch(self, epoch: int) -> None:
        """Use the shard and sample order of ``epoch`` (needs ``shuffle`` to change anything).
        A resume position loaded for another epoch is dropped; an epoch with no batch is refused (with
        ``shuffle`` and shards of unequal sizes, a later epoch can be where the first was not), and
        the epoch and position before it stay as they were."""
        before = (self._cursor.epoch, self._cursor.position)
        self._cursor.set_epoch(epoch)
        try:
            if self.meta is not None:
                self._shares(self.num_workers)
        except ValueError:
            self._cursor.epoch, self._cursor.position = before
            raise
        self._shared.publish(self._cursor)

    # -- equal steps --------------------------------------------------------------------------
    def _shares(self, num_workers: int) -> tuple[list[int], list[int]]:
        """For each of ``num_workers`` DataLoader workers (0: none) of this rank, this epoch: the
        samples of its shards, and how many it yields (padded or truncated, :func:`equal_batches`)."""
        if self.meta is None:
            folders = sorted({url.rsplit("/", 1)[0] for url in self.urls if "/" in url})
            why = (f"shards of {len(folders)} folders ({folders[0]}, {folders[1]}...), each folder's metadata counting only its own: "
                   "stream one folder's shards" if len(folders) > 1 else "no packer metadata beside these shards")
            raise TypeError(f"StreamingShards: the number of samples is unknown ({why})")
        key = (self.epoch, max(1, num_workers))
        if getattr(self, "_shares_cache", (None,))[0] != key:
            natural, shares = self._every_share(*key)
            self._shares_cache = (key, (natural[self.rank], shares[self.rank]))
        return self._shares_cache[1]

    def _every_share(self, epoch: int, workers: int) -> tuple[list[list[int]], list[list[int]]]:
        """:meth:`_shares` for every rank: ``[rank][worker]`` samples read, and yielded."""
        counts = self.items.counts or {}
        try:
            natural = [[sum(counts[shard_name(url)] for url in part) for part in rank] for rank in self.plan.split(self.urls, epoch, workers)]
        except KeyError as exc:
            raise ValueError(f"StreamingShards: shard {exc} is not listed in the metadata (is the shard list or brace "
                             "pattern longer than the folder's shards?)") from None
        return natural, rank_shares(natural, self.batch_size or 1, self.drop_last)

    def _warn_uneven(self) -> None:
        """Warn (rank 0, once, at construction) where too few shards per stream make equal
        batches repeat or drop much of epoch 0 (:func:`~readers.shard_plan.uneven_split`)."""
        workers = max(1, self.num_workers)
        message = uneven_split(len(self.urls), *self._every_share(0, workers), self.batch_size or 1, self.drop_last,
                               "samples" if self.block_size is None else f"blocks of {self.block_size} tokens")
        if message is not None:
            warnings.warn(f"StreamingShards: {message}", stacklevel=3)

    # -- resuming ----------------------------------------------------------------------------
    def state_dict(self, batches: int, *, batch_size: int | None = None, num_workers: int | None = None) -> dict[str, Any]:
        """The position after this rank's ``DataLoader(self, batch_size=..., num_workers=...)``
        yielded ``batches`` batches (samples, for ``batch_size=None``) in its current iteration:
        after a resume, counted from the resume position, as ``ResumableSampler.state_dict``
        counts (``enumerate(loader)``'s count). After the epoch's last batch: the next epoch,
        nothing of it read, as ``Loader.state_dict`` says. ``batch_size`` and ``num_workers``
        default to the constructor's, and must match them when the constructor has a ``batch_size``.

        Returns plain JSON-safe values: the epoch, the settings that decide the order, how many
        batches of it were read and how many samples each worker has handed out (``skip``)."""
        batches = whole_number(batches, "state_dict: batches", "a count of batches (an int >= 0)")
        batch_size = self.batch_size if batch_size is None else check_batch_size(batch_size)
        num_workers = self.num_workers if num_workers is None else whole_number(num_workers, "state_dict: num_workers")
        if self.batch_size is not None and (batch_size, max(1, num_workers)) != (self.batch_size, max(1, self.num_workers)):
            raise ValueError(
                f"state_dict: batch_size={batch_size}, num_workers={num_workers}, but this StreamingShards equalises batches "
                f"of batch_size={self.batch_size} over num_workers={self.num_workers}: pass the DataLoader's, as the constructor has them"
            )
        before = self._resumed_batches if self._cursor.position is not None else 0  # (a loaded position applies to this epoch)
        if before is None and batches:
            raise ValueError("state_dict: the state loaded was saved by a packer that did not record its batch count, so the "
                             "batches before it are unknown: save this rank's state from a fresh epoch, or without the resume")
        if before is None:  # (batches 0: where the loaded state stands, without a count, as it was saved)
            skip, following = self._cursor.position  # type: ignore[misc]
            return {"epoch": self.epoch, **self._settings(), "num_workers": num_workers, "dataset": self._fingerprint(),
                    "skip": list(skip), "first": following}
        batches, epoch = batches + before, self.epoch
        skip, following = self._position(batches, batch_size, num_workers)
        if batches and batches == sum(self._batches_per_worker(batch_size, num_workers)[1]):  # the epoch's last batch: the next one
            batches, epoch, skip, following = 0, epoch + 1, [0] * len(skip), 0
        return {"epoch": epoch, **self._settings(), "num_workers": num_workers, "dataset": self._fingerprint(),
                "batches": int(batches), "skip": skip, "first": following}

    def _batches_per_worker(self, batch_size: int | None, num_workers: int) -> tuple[list[int], list[int]]:
        """This epoch's samples each worker yields, and its batches (the last may be short)."""
        counts = self._shares(num_workers)[1]
        return counts, [-(-n // (batch_size or 1)) for n in counts]

    def _position(self, batches: int, batch_size: int | None, num_workers: int) -> tuple[list[int], int]:
        """Where this rank's ``num_workers`` workers are in the current epoch after ``batches``
        batches: the samples each has handed out, and the worker whose batch comes next."""
        return worker_position(self._shares(num_workers)[1], batches, batch_size)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next iteration continue the epoch of ``state`` (from :meth:`state_dict`) where it
        stopped; the order-deciding settings must match (a ``ValueError`` names the one that differs)."""
        self._load_state(state)
        self._shared.publish(self._cursor)

    def _load_state(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or "skip" not in state:
            raise ResumeError(f"load_state_dict: not a StreamingShards state (no 'skip'): {sorted(state) if isinstance(state, dict) else type(state).__name__}")
        if state.get("world_size", self.world_size) != self.world_size:
            raise ResumeError(
                f"load_state_dict: the state was saved with world_size={state['world_size']}, this StreamingShards has "
                f"world_size={self.world_size}: streamed shards are split per rank and shuffled per worker, so only the "
                "same split continues exactly; resume with the same world_size, or read the shards map-style "
                "(Loader(ShardDataset(...)) or readers.ResumableSampler) to resume with any"
            )
        other_rank = state.get("rank", self.rank) != self.rank
        if other_rank and self.batch_size is None:
            raise ResumeError(
                f"load_state_dict: the state was saved by rank {state['rank']}, this StreamingShards is rank {self.rank}; "
                "without batch_size, ranks are not in step, so each resumes from its own state: save every rank's "
                "(or construct with the DataLoader's batch_size, and any rank's state resumes them all)"
            )
        if other_rank and "batches" not in state:
            raise ResumeError(
                f"load_state_dict: the state was saved by rank {state['rank']}, this StreamingShards is rank {self.rank}, by a "
                "packer that did not record its batch count: resume each rank from its own state"
            )
        saved_workers = state.get("num_workers")
        if (isinstance(saved_workers, int) and len(state["skip"]) == max(1, saved_workers)
                and (self.batch_size is not None or self.num_workers) and max(1, saved_workers) != max(1, self.num_workers)):
            raise ResumeError(
                f"load_state_dict: the state was saved with num_workers={saved_workers}, this StreamingShards has "
                f"num_workers={self.num_workers}: each worker's offset is into its own shards and shuffle buffer, so only "
                "the same num_workers continues exactly; resume with it, or read the shards map-style "
                "(Loader(ShardDataset(...)) or readers.ResumableSampler) to resume with any"
            )
        check_settings({**state, "rank": self.rank}, self._settings(), "dataset")
        if self.meta is not None:
            check_fingerprint(state.get("dataset", {}), self._fingerprint(), "dataset")
        if not other_rank:
            self._cursor.resume(state["epoch"], ([int(n) for n in state["skip"]], int(state.get("first", 0))))
            self._resumed_batches = int(state["batches"]) if "batches" in state else None
            return
        # Equal batches keep the ranks in step: after the same number of batches, this rank's
        # workers are where this rank's own state would put them.
        before = (self._cursor.epoch, self._cursor.position)
        self._cursor.resume(state["epoch"], None)
        try:
            skip, following = self._position(int(state["batches"]), self.batch_size, int(state.get("num_workers", self.num_workers)))
        except ValueError:
            self._cursor.resume(*before)
            raise ResumeError(f"load_state_dict: batches={state['batches']} is more than rank {self.rank}'s batches in epoch "
                              f"{state['epoch']}: not a state of these shards and settings") from None
        self._cursor.resume(state["epoch"], (skip, following))
        self._resumed_batches = int(state["batches"])

    def _fingerprint(self) -> dict[str, Any]:
        """The metadata's identity of these shards (sample count, source, creation), as states record it."""
        return dataset_fingerprint(self, self.meta.count) if self.meta is not None else {}

    def _settings(self) -> dict[str, Any]:
        """The settings that decide the order, as a saved state records them."""
        return {"seed": self.seed, "shuffle": self.shuffle, "buffer": self.buffer, "rank": self.rank, "world_size": self.world_size,
                "shards": len(self.urls), "batch_size": self.batch_size, "drop_last": self.drop_last, "block_size": self.block_size}

    @property
    def classes(self) -> list[str]:
        return list(self.meta.classes) if self.meta is not None else []

    def shards_for(self, worker: int = 0, num_workers: int = 1) -> list[str]:
        """The shard URLs that DataLoader worker ``worker`` of this rank reads this epoch."""
        return self.plan.shards(self.urls, self.epoch, worker, num_workers)

    def __len__(self) -> int:
        """Samples this rank yields per epoch, padding included (the same on every rank); after
        :meth:`load_state_dict`, the rest of that epoch, which every iteration of it yields (the
        DataLoader's workers cannot clear the position: :meth:`set_epoch` to another epoch does)."""
        shares = self._shares(self.num_workers)[1]
        if self._cursor.position is None or len(self._cursor.position[0]) != len(shares):  # (another worker count: refused when iterating)
            return sum(shares)
        return sum(max(0, share - skip) for share, skip in zip(shares, self._cursor.position[0]))

    def __iter__(self) -> Iterator[tuple[Any, int]]:
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if info is not None:
            self._worker_checks(info.id, info.num_workers)
        if self.batch_size is not None and num_workers != max(1, self.num_workers):
            raise ValueError(
                f"StreamingShards: equal batches were computed for num_workers={self.num_workers}, this DataLoader has "
                f"{num_workers if info is not None else 0} workers; pass the DataLoader's num_workers to StreamingShards"
            )
        if worker == 0 and self._shared.repeats(num_workers) and self.rank == 0 and (self.shuffle or self._cursor.position):
            self._warn_repeat()
        skip, loader_worker = 0, worker
        if self._cursor.position is not None:
            skips, first = self._cursor.position
            if len(skips) != num_workers:
                raise ResumeError(
                    f"StreamingShards: the loaded state is for {len(skips)} DataLoader workers, this DataLoader has "
                    f"{num_workers if info is not None else 0}; resume with the same num_workers (each worker's offset is into its own shards "
                    "and shuffle buffer)"
                )
            # The DataLoader asks worker 0 first: rotate so that it continues the part whose batch was next.
            worker = (worker + first) % num_workers
            skip = skips[worker]
        urls = self.shards_for(worker, num_workers)
        own, share = None, None  # without metadata: the worker's samples as they come
        if self.meta is not None:
            natural, shares = self._shares(num_workers)
            own, share = natural[worker], shares[worker]
        rng = self.plan.sample_rng(self.epoch, worker) if self.shuffle else None
        for item in worker_items(self.items, urls, self.cache, self._unreplaced, skip, own, share, rng, self.buffer):
            sample, label = self.items.decode(item)
            yield (self.transform(sample) if self.transform is not None else sample), label
        self._shared.finished(loader_worker)

    def _warn_repeat(self) -> None:
        """A pass follows the epoch (and resume position) the last one followed to its end: said,
        as DistributedSampler's users are never told (webdataset's and Streaming's move on)."""
        again = f"the rest of epoch {self.epoch} after the resume" if self._cursor.position else f"epoch {self.epoch}'s order"
        warnings.warn(f"StreamingShards: this pass yields {again} again, as the last pass did to its end: call "
                      "set_epoch(epoch) before each epoch (as with DistributedSampler)", stacklevel=3)

    def _worker_checks(self, worker: int, num_workers: int) -> None:
        """In a DataLoader worker: follow the epoch and position :meth:`set_epoch` and
        :meth:`load_state_dict` gave since this copy was made (a persistent worker's), and warn
        (rank 0's first worker) where the ranks' batch counts may differ."""
        self._shared.follow(self._cursor)
        if worker == 0 and self.rank == 0 and num_workers > 1 and self.world_size > 1 and self.batch_size is None and self.meta is not None:
            warnings.warn(
                f"StreamingShards: without batch_size, ranks yield the same number of samples, but if the DataLoader batches "
                f"them, split over {num_workers} workers, not always the same number of batches (DDP then waits forever at an "
                "epoch's end, and len(DataLoader) is not the count): pass the DataLoader's batch_size and num_workers to "
                "StreamingShards (batch_size=1 for a DataLoader with batch_size=None or 1)", stacklevel=3)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({len(self.urls)} shards, shuffle={self.shuffle}, buffer={self.buffer}, "
            f"seed={self.seed}, rank={self.rank}/{self.world_size}, epoch={self.epoch}"
            f"{'' if self.block_size is None else f', block_size={self.block_size}'})"
        )
