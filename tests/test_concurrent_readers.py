"""Many readers at once, and read-only storage: what a DataLoader with many workers does.

Eight processes (forked and spawned) read every sample of the same LMDB, HDF5, blob and
WebDataset outputs at the same moment, from store objects opened (and used) in the parent
first, so a handle inherited through fork would show. Read-only copies are read by an
unprivileged user (permission bits do not stop root), and reading never creates a file (no
``lock.mdb``, no HDF5 or other lock files) or changes one.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import shutil
from pathlib import Path

import pytest

from readers.formats import STORES, open_store
from readers.formats.base import Store
from unprivileged import run_unprivileged, world_readable_dir

READERS = 8
FORMATS = sorted(STORES)


def digest(store: Store) -> str:
    """A hash of every sample and label, read one by one and as one batch."""
    h = hashlib.sha256()
    for i in range(len(store)):
        image, label = store.read(i)
        h.update(image.tobytes() + label.to_bytes(8, "little", signed=True))
    images, labels = store.read_batch(list(range(len(store)))[::-1])
    h.update(images.tobytes() + labels.tobytes())
    return h.hexdigest()


def read_all(stores: dict[str, Store], barrier, results) -> None:
    barrier.wait(timeout=60)  # all readers start together
    results.put((os.getpid(), {fmt: digest(store) for fmt, store in stores.items()}))


@pytest.fixture(scope="module")
def stores(packed_32) -> dict[str, Store]:
    opened = {fmt: open_store(packed_32(fmt)) for fmt in FORMATS}
    for store in opened.values():
        store.read(0)  # the parent holds open handles before the children start
    return opened


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_eight_processes_read_the_same_datasets_at_once(stores, method):
    expected = {fmt: digest(store) for fmt, store in stores.items()}
    context = multiprocessing.get_context(method)
    barrier, results = context.Barrier(READERS), context.Queue()
    processes = [context.Process(target=read_all, args=(stores, barrier, results)) for _ in range(READERS)]
    for process in processes:
        process.start()
    try:
        answers = [results.get(timeout=120) for _ in processes]
    finally:
        for process in processes:
            process.join(timeout=30)
    assert [p.exitcode for p in processes] == [0] * READERS
    assert len({pid for pid, _ in answers}) == READERS
    assert all(got == expected for _pid, got in answers)
    assert digest(stores["lmdb"]) == expected["lmdb"]  # the parent's handles still work


def listing(root: Path) -> list[tuple[str, int, int, int]]:
    """Every file and folder below ``root``: name, size, mtime and mode."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            st = os.lstat(os.path.join(dirpath, name))
            out.append((os.path.relpath(os.path.join(dirpath, name), root), st.st_size, st.st_mtime_ns, st.st_mode))
    return sorted(out)


def read_copy(path: Path) -> str:
    return digest(open_store(path))


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_read_only_copy_reads_and_is_left_untouched(packed_32, stores, fmt):
    source = packed_32(fmt)
    with world_readable_dir() as root:
        copy = root / source.name
        (shutil.copytree if source.is_dir() else shutil.copy2)(source, copy)
        for dirpath, dirnames, filenames in os.walk(root):
            os.chmod(dirpath, 0o555)
            for name in filenames:
                os.chmod(os.path.join(dirpath, name), 0o444)
        before = listing(root)
        assert run_unprivileged(read_copy, copy) == digest(stores[fmt])  # as a user who cannot write
        assert read_copy(copy) == digest(stores[fmt])  # and as whoever runs the tests
        assert listing(root) == before  # nothing created (no lock.mdb), nothing changed
        if fmt == "lmdb":
            assert not (copy / "lock.mdb").exists()
