"""LMDB's pages and WebDataset's shards leave the page cache once a checkpoint made them durable
(``packer.writers.files.release_cached``): read back from the kernel (``mincore`` on a map of
the finished file), not from the writer's calls."""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from pathlib import Path

import pytest

import packer.writers.journal as journal
from packer import ImageOptions, StorageOptions, convert
from packer.preprocess.task import Encoded
from packer.writers.lmdb import LMDBWriter
from readers.formats.lmdb import DATA_FILE

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]


def cached_pages(path: Path, length: int = 0) -> tuple[int, int]:
    """``(pages of path in the page cache, pages of path)``, as the kernel's ``mincore`` says;
    ``length``: only the file's first ``length`` bytes."""
    size = length or path.stat().st_size
    pages = -(-size // mmap.PAGESIZE)
    fd = os.open(path, os.O_RDONLY)
    try:
        address = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if address in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap")
        try:
            vector = ctypes.create_string_buffer(pages)
            if _libc.mincore(address, size, vector) != 0:
                raise OSError(ctypes.get_errno(), "mincore")
            return sum(byte & 1 for byte in vector.raw), pages
        finally:
            _libc.munmap(address, size)
    finally:
        os.close(fd)


@pytest.fixture
def drops_synced_pages(tmp_path):
    """Skip unless the filesystem under tmp_path drops a synced file's pages when asked (tmpfs does not)."""
    if not hasattr(os, "posix_fadvise") or not hasattr(_libc, "mincore"):
        pytest.skip("no posix_fadvise or mincore here")
    probe = tmp_path / "probe"
    probe.write_bytes(os.urandom(16 * mmap.PAGESIZE))
    fd = os.open(probe, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    if cached_pages(probe)[0] != 0:
        pytest.skip("this filesystem keeps a file's pages in memory (tmpfs?)")
    probe.unlink()


@pytest.fixture
def checkpoint_often(monkeypatch):
    """A checkpoint after every sample (one in flight at a time); returns the list of commits."""
    monkeypatch.setattr(journal, "CHECKPOINT_SECONDS", 1e9)
    monkeypatch.setattr(journal, "BACKGROUND_CHECKPOINT_BYTES", 1)
    commits: list[int] = []
    real = journal.Journal.commit
    monkeypatch.setattr(journal.Journal, "commit", lambda self, *a, **k: (commits.append(1), real(self, *a, **k))[1])
    return commits


def test_lmdb_drops_what_each_checkpoint_made_durable(tmp_path, drops_synced_pages, checkpoint_often):
    """Each transaction reads B-tree pages of the last commit through LMDB's map, and the kernel
    caches a file in blocks of up to 2 MiB, a block kept whole while one page of it is mapped:
    without the writer taking the synced range out of its map first, a block per checkpoint stays."""
    writer = LMDBWriter(tmp_path / "out.lmdb", fingerprint={"test": 1})
    try:
        for i in range(12):
            for _ in range(16):  # 2.3 MiB, written in one pwritev at the commit
                writer.add(Encoded(i % 3, (3, 224, 224), os.urandom(3 * 224 * 224)))
            writer._checkpoint(writer.count, [], background=False)  # committed, synced, dropped
        assert len(checkpoint_often) == 12
        cached, pages = cached_pages(writer.tmp / DATA_FILE, length=writer._used_bytes())
        assert pages > 12 * 16 * 36  # 192 samples of 147 KiB, and LMDB's own pages
        assert cached <= 4, (cached, pages)  # seen: 2 (22 with the map left alone)
    finally:
        writer.abort()


def test_webdataset_drops_every_shard_a_checkpoint_made_durable(image_folder, tmp_path, drops_synced_pages, checkpoint_often):
    report = convert(image_folder, tmp_path / "out.shards", format="webdataset", image=ImageOptions(size=64),
                     storage=StorageOptions(shard_size=2), workers=1)
    assert report.written == 18 and len(checkpoint_often) >= 1  # each lists the first shard
    shards = sorted(report.dst.glob("*.tar"))
    assert len(shards) == 9
    first = cached_pages(shards[0])
    assert first[1] > 5 and first[0] == 0, first  # synced at a checkpoint, then dropped
