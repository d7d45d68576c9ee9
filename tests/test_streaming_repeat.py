"""``StreamingShards`` without ``set_epoch`` between passes: its epoch does not move on by itself
(as ``DistributedSampler``'s does not), and a shuffled pass that repeats the order of a pass run
to its end said nothing, where webdataset's and Streaming's users expect a new order each epoch
(last session's left-alone list). The pass now warns (rank 0, its first worker), with and without
DataLoader workers, persistent or not; a resume position repeated is said too; ``set_epoch``
(even to the same epoch) and a pass cut short are no repeat."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
from torch.utils.data import DataLoader

import packer
from packer import StorageOptions
from readers import StreamingShards

REPEAT = r"this pass yields epoch 0's order again, as the last pass did to its end: call set_epoch\(epoch\)"


@pytest.fixture(scope="module")
def six_shards(tmp_path_factory) -> Path:
    rng = np.random.default_rng(6)
    samples = [(rng.integers(0, 256, (4, 4, 3), dtype=np.uint8), i % 3) for i in range(12)]
    folder = tmp_path_factory.mktemp("repeat") / "six"
    packer.convert(samples, folder, format="webdataset", storage=StorageOptions(shard_size=2), workers=1)
    return folder


def passes(stream: StreamingShards, loader_args: dict, count: int = 2, between=None) -> list[list[str]]:
    """The warnings of each of ``count`` whole passes of a DataLoader over ``stream``."""
    loader = DataLoader(stream, batch_size=2, **loader_args)
    said = []
    for n in range(count):
        if between is not None and n:
            between(stream)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert sum(len(labels) for _, labels in loader) == 12
        said.append([str(w.message) for w in caught if "again" in str(w.message)])
    return said


def test_a_shuffled_pass_repeating_a_whole_one_warns(six_shards):
    stream = StreamingShards(six_shards, shuffle=True, batch_size=2)
    said = passes(stream, {}, count=3)
    assert not said[0] and [len(s) for s in said[1:]] == [1, 1] and "set_epoch(epoch) before each epoch" in said[1][0]


WORKERS = r"""
import sys, warnings
from torch.utils.data import DataLoader
from readers import StreamingShards

for persistent in (False, True):
    stream = StreamingShards(sys.argv[1], shuffle=True, batch_size=2, num_workers=2)
    loader = DataLoader(stream, batch_size=2, num_workers=2, persistent_workers=persistent)
    for n in range(3):
        print(f"== PASS {n} persistent={persistent}", file=sys.stderr, flush=True)
        assert sum(len(labels) for _, labels in loader) == 12
        if sys.argv[2] == "set_epoch":
            stream.set_epoch(n + 1)
"""


@pytest.mark.parametrize("between", ["nothing", "set_epoch"])
def test_a_workers_pass_says_it_too_persistent_or_not(six_shards, between):
    """In DataLoader workers, as a training script runs them (pytest records a forked worker's
    warnings into the worker's own copy of its list): the first worker says it, each pass of new
    workers, and once in persistent ones (Python shows a warning once per place in a process)."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", WORKERS, str(six_shards), between], cwd=root, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    parts = done.stderr.split("== PASS ")[1:]
    said = [part.count("order again, as the last pass did to its end") for part in parts]
    assert said == ([0, 1, 1, 0, 1, 0] if between == "nothing" else [0] * 6), done.stderr


def test_set_epoch_between_passes_even_to_the_same_epoch_is_no_repeat(six_shards):
    stream = StreamingShards(six_shards, shuffle=True, batch_size=2)
    for between in (lambda s: s.set_epoch(s.epoch + 1), lambda s: s.set_epoch(0)):
        assert passes(stream, {}, between=between) == [[], []]
        stream.set_epoch(0)


def test_unshuffled_passes_and_a_pass_cut_short_are_no_repeat(six_shards):
    assert passes(StreamingShards(six_shards, batch_size=2), {}) == [[], []]
    stream = StreamingShards(six_shards, shuffle=True, batch_size=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        next(iter(DataLoader(stream, batch_size=2)))  # cut short after one batch
        assert sum(len(labels) for _, labels in DataLoader(stream, batch_size=2)) == 12
    with pytest.warns(UserWarning, match=REPEAT):
        list(DataLoader(stream, batch_size=2))


def test_the_rest_of_a_resumed_epoch_repeated_is_said(six_shards):
    """After a resume the position stays until set_epoch moves on (the DataLoader's workers cannot
    clear it): a second pass yields the same rest of the epoch, and says so; unshuffled too."""
    stream = StreamingShards(six_shards, batch_size=2)
    state = stream.state_dict(2)
    stream.load_state_dict(state)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sum(len(labels) for _, labels in DataLoader(stream, batch_size=2)) == 8
    with pytest.warns(UserWarning, match=r"this pass yields the rest of epoch 0 after the resume again"):
        assert sum(len(labels) for _, labels in DataLoader(stream, batch_size=2)) == 8
