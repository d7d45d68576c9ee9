"""LMDB batches found on disk have their values read side by side first (readers/formats/lmdb.py,
``_ColdReads``): the switch, what the threads read, and a real cold read in a fresh process."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import lmdb
import numpy as np
import pytest

import readers.formats.lmdb as lmdb_format
from packer import ImageOptions, convert
from packer.files import fsync_path
from readers import open_dataset

pytestmark = pytest.mark.skipif(lmdb_format._RUSAGE_THREAD is None, reason="counts page faults per thread (Linux)")


@pytest.fixture(scope="module")
def dataset(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return convert(image_folder, tmp_path_factory.mktemp("cold") / "out.lmdb", image=ImageOptions(size=64), workers=1).dst


def plain(env: lmdb.Environment, indices) -> tuple[np.ndarray, np.ndarray]:
    """The samples as docs/FORMATS.md says to read them with the lmdb library alone (through the
    process's one environment of the file: py-lmdb opens a path once per process)."""
    with env.begin() as txn:
        values = [txn.get(b"%010d" % i) for i in indices]
    labels = np.array([int.from_bytes(v[:4], "little", signed=True) for v in values])
    return np.stack([np.frombuffer(v[16:], np.uint8).reshape(3, 64, 64) for v in values]), labels


def test_a_batch_that_faults_turns_the_threads_on_and_they_read_the_next_batch_once(dataset, monkeypatch):
    shared = lmdb_format.open_shared_env(str(dataset))  # (held: the store reads through the same environment)
    cold = shared.cold
    monkeypatch.setattr(cold, "on", False)
    counter = itertools.count(0, 10)  # each look at the reading thread's faults finds 10 more
    monkeypatch.setattr(lmdb_format, "_major_faults", lambda: next(counter))
    read: list[list[bytes]] = []

    def spy(self, keys):
        read.append(keys)
        with self.env.begin() as txn:
            assert all(txn.get(key) is not None for key in keys)
        return 5  # the threads still fault: the dataset is not cached yet

    monkeypatch.setattr(lmdb_format._ColdReads, "_read", spy)
    store = open_dataset(dataset)
    store.read_batch(np.array([3, 0, 7, 1, 12, 5]))
    assert not read and cold.on  # that batch faulted: the next ones are read side by side first
    second = np.array([17, 2, 9, 14, 4, 11, 8, 6])
    images, labels = store.read_batch(second)
    shares = [key for share in read for key in share]
    assert sorted(shares) == sorted(b"%010d" % i for i in second) and len(shares) == len(second)  # each once
    assert all(share == sorted(share) for share in read) and 1 < len(read) <= lmdb_format.PREFETCH_THREADS
    expected, expected_labels = plain(shared.env, second)
    assert np.array_equal(np.asarray(images), expected) and np.array_equal(np.asarray(labels), expected_labels)
    assert cold.on  # the threads faulted (over one for every two values): still on


def test_threads_that_no_longer_fault_are_left_alone(dataset, monkeypatch):
    shared = lmdb_format.open_shared_env(str(dataset))  # (held, as above)
    cold = shared.cold
    monkeypatch.setattr(lmdb_format, "_major_faults", lambda: 0)
    read = []
    monkeypatch.setattr(lmdb_format._ColdReads, "_read", lambda self, keys: read.append(keys) or 0)
    monkeypatch.setattr(cold, "on", True)
    store = open_dataset(dataset)
    store.read_batch(np.arange(10))
    assert read and not cold.on  # no faults: the dataset is cached now
    read.clear()
    images, _labels = store.read_batch(np.arange(10, 18))
    assert not read and np.array_equal(np.asarray(images), plain(shared.env, range(10, 18))[0])


_CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np
    import readers.formats.lmdb as lmdb_format
    from readers import open_dataset
    counts = []
    real = lmdb_format._ColdReads._read
    lmdb_format._ColdReads._read = lambda self, keys: counts.append(real(self, keys)) or counts[-1]
    store = open_dataset(sys.argv[1])
    cold = lmdb_format.open_shared_env(sys.argv[1]).cold
    order = np.random.default_rng(0).permutation(len(store))
    half = len(order) // 2
    start = lmdb_format._major_faults()
    store.read_batch(order[:half])
    first = lmdb_format._major_faults() - start
    on = cold.on
    start = lmdb_format._major_faults()
    images, labels = store.read_batch(order[half:])
    second = lmdb_format._major_faults() - start
    print(json.dumps({"first": first, "on": on, "second": second, "threads": sum(counts), "shares": len(counts)}))
""")


def test_a_cold_batch_is_read_by_the_threads_in_a_fresh_process(image_folder, tmp_path):
    """Real page faults: the file (never opened here) is dropped from the page cache, a fresh
    process reads half the samples (the reading thread faults: the threads turn on), then the
    other half, whose values the threads read (their faults), the reading thread then finding
    them in memory."""
    dataset = convert(image_folder, tmp_path / "cold.lmdb", image=ImageOptions(size=64), workers=1).dst
    fsync_path(dataset / "data.mdb", release=True)  # out of the page cache (POSIX_FADV_DONTNEED)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parent.parent), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", _CHILD, str(dataset)], capture_output=True, text=True, env=env, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if result["first"] == 0:
        pytest.skip("this filesystem keeps the file in memory (nothing faults)")
    assert result["on"] and result["shares"] > 1
    assert result["threads"] > result["second"], result  # the threads read the second half from the disk


def test_a_pass_that_stops_early_still_counts_and_long_passes_go_a_part_at_a_time(dataset, monkeypatch):
    """Readers that zip records against their indices stop the generator before its end: the
    faults so far still count (the switch never turned on for them). A pass over many indices
    reads (and reads ahead) a part at a time, not every value of the dataset first."""
    shared = lmdb_format.open_shared_env(str(dataset))
    cold = shared.cold
    monkeypatch.setattr(cold, "on", False)
    counter = itertools.count(0, 10)
    monkeypatch.setattr(lmdb_format, "_major_faults", lambda: next(counter))
    store = lmdb_format.LMDBStore(dataset)
    records = store._records(list(range(6)))
    next(records), next(records)
    records.close()  # as a zip that ran out does, at the latest when it is collected
    assert cold.on
    asked = []
    monkeypatch.setattr(lmdb_format, "RECORDS_AT_ONCE", 4)
    monkeypatch.setattr(cold, "before", lambda keys: asked.append(len(keys)) or 0)
    assert len(list(store._records(list(range(10))))) == 10 and asked == [4, 4, 2]
