"""The pool keeps its workers fed while the caller consumes: a chunk too big to queue behind a
running one (a WebDataset piece: a shard's thousand inputs) goes to the worker that just
answered before its answer is handed to the caller, not after the caller comes back for more."""

from __future__ import annotations

import time

from packer import parallel
from packer.parallel import ordered_map

#: What the caller does with each result (a WebDataset writer publishing a shard, say).
CONSUME_SECONDS = 0.5


def started_at(item: tuple[int, str]) -> float:
    """When a worker started the item (``CLOCK_MONOTONIC``: one clock for every process)."""
    return time.monotonic()


def test_a_big_chunk_goes_to_the_idle_worker_before_the_caller_consumes():
    filler = "x" * (2 * parallel._PREFETCH_BYTES)  # each chunk pickles larger than a queued one may be
    items = [(i, filler) for i in range(4)]
    handed: list[float] = []
    with ordered_map(started_at, items, workers=2, chunksize=1) as results:
        starts = []
        for start in results:
            handed.append(time.monotonic())
            starts.append(start)
            time.sleep(CONSUME_SECONDS)
    # Item 2 goes to the worker that answered item 0 as soon as it answered, while the caller was
    # still consuming item 0: well before the caller came back for item 1.
    assert starts[2] < handed[0] + CONSUME_SECONDS / 2, (starts, handed)


def test_a_big_chunk_is_pickled_once_while_the_workers_are_busy(monkeypatch):
    """A busy worker is not sent a big chunk; finding that out pickles it, and that pickle is the
    one sent to the next idle worker: each chunk is pickled once (each is a shard's inputs:
    milliseconds; a compressed text file's lines are read as they are pickled, and a second
    pickle read the file again from its start)."""
    encoded: list[int] = []
    real = parallel.encode

    def counting(message):
        if isinstance(message, tuple) and len(message) == 2:
            encoded.append(message[0])
        return real(message)

    monkeypatch.setattr(parallel, "encode", counting)
    filler = "x" * (2 * parallel._PREFETCH_BYTES)
    items = [(i, filler) for i in range(6)]
    with ordered_map(started_at, items, workers=2, chunksize=1) as results:
        assert len(list(results)) == 6
    assert sorted(encoded) == list(range(6)), encoded
