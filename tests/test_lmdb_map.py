"""How the LMDB writer maps its file, read back from the kernel (``/proc/self/smaps``), not
from py-lmdb's own flags (``packer/writers/lmdb.py``): a fresh output's map is read-only (LMDB
writes its pages with ``pwritev``, so they can be dropped from the page cache once durable) and
advised random, so that reading a B-tree page brings back none of the dropped pages around it;
a resumed one reads back what it deletes with read-ahead, then goes on advised random too."""

import mmap
from pathlib import Path

import pytest

import packer.writers.journal as journal
from packer.preprocess.task import Encoded
from packer.writers.lmdb import LMDBWriter
from readers.formats.lmdb import DATA_FILE


def map_flags(path: Path) -> list[set[str]] | None:
    """The ``VmFlags`` of every mapping of ``path`` in this process; ``None`` where the kernel
    does not say (no ``/proc/self/smaps``, or no ``VmFlags`` lines in it)."""
    try:
        text = Path("/proc/self/smaps").read_text()
    except OSError:
        return None
    if "\nVmFlags:" not in text:
        return None
    target, found, current = str(path.resolve()), [], False
    for line in text.splitlines():
        head = line.split(None, 5)  # the path, the sixth field, may hold spaces
        if head and "-" in head[0] and not head[0].endswith(":"):  # a mapping's first line
            current = len(head) == 6 and head[5] == target
        elif line.startswith("VmFlags:") and current:
            found.append(set(line.split()[1:]))
    return found


@pytest.fixture
def kernel_shows_advice(tmp_path):
    """Skip unless this kernel reports a mapping's ``MADV_RANDOM`` (``rr``) in smaps."""
    probe = tmp_path / "probe"
    probe.write_bytes(bytes(mmap.PAGESIZE))
    with probe.open("r+b") as handle, mmap.mmap(handle.fileno(), mmap.PAGESIZE) as mapped:
        if not hasattr(mapped, "madvise"):
            pytest.skip("no madvise here")
        mapped.madvise(mmap.MADV_RANDOM)
        flags = map_flags(probe)
        if not flags or "rr" not in flags[0]:
            pytest.skip("this kernel does not report a mapping's advice in /proc/self/smaps")


def _sample() -> Encoded:
    return Encoded(1, (3, 8, 8), bytes(192))


def test_a_fresh_writers_map_is_read_only_and_advised_random(tmp_path, kernel_shows_advice):
    writer = LMDBWriter(tmp_path / "out.lmdb")
    try:
        writer.add(_sample())
        writer._flush()  # the sample is in the map now
        flags = map_flags(writer.tmp / DATA_FILE)
        assert flags, "the data file is not mapped"
        assert all("rr" in f for f in flags), flags  # MADV_RANDOM: no read-around on a fault
        assert all("wr" not in f for f in flags), flags  # no writemap: written with pwritev
    finally:
        writer.abort()


def test_a_resumed_writer_deletes_with_read_ahead_then_goes_on_without(tmp_path, monkeypatch, kernel_shows_advice):
    import packer.writers.lmdb as lmdb_writer

    monkeypatch.setattr(journal, "CHECKPOINT_SECONDS", 0.0)

    monkeypatch.setattr(journal, "UNTIMED_CHECKPOINT_INPUTS", 1)  # (HDF5's: by inputs)
    dst, fingerprint = tmp_path / "out.lmdb", {"test": 1}
    first = LMDBWriter(dst, fingerprint=fingerprint)
    for i in range(3):
        first.add(_sample())
        first.progress(i + 1, [])
    first.suspend()  # as an interrupted run leaves it
    opened = []
    real_open = lmdb_writer.lmdb.open
    monkeypatch.setattr(lmdb_writer.lmdb, "open", lambda *a, **k: opened.append(k["readahead"]) or real_open(*a, **k))
    resumed = LMDBWriter(dst, fingerprint=fingerprint, resume=True)
    try:
        assert resumed.resumed_inputs >= 1  # a checkpoint was kept (later ones may have been deferred)
        assert opened == [True, False]  # read-ahead for the deletion, then not
        resumed.add(_sample())
        resumed._flush()
        flags = map_flags(resumed.tmp / DATA_FILE)
        assert flags and all("rr" in f for f in flags), flags  # the kernel's word: advised random
    finally:
        resumed.abort()

