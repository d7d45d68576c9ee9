"""LMDB's pages and WebDataset's shards leave the page cache once a checkpoint made them
durable (``packer.files.release_cached``), and a WebDataset worker's shard, or the
samples a blob's or HDF5's workers place, as they are written (``WriteBehind``): read back
from the kernel (``mincore`` on a map of the file), not from the writer's calls."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import io
import tarfile
import mmap
import os
from pathlib import Path

import pytest

import packer.files as files
import packer.writers.journal as journal
from packer import ImageOptions, StorageOptions, convert
from packer.preprocess.task import Encoded
from packer.sources.images import scan_image_folder
from packer.writers.piece_writer import Piece
from packer.files import WriteBehind
from packer.writers.webdataset.pieces import PieceTask, fragments
from packer.writers.webdataset.tar import Assembly, renumber
from readers.formats.webdataset import RECORD
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
    in_cache = page_map(path, length)
    return sum(in_cache), len(in_cache)


def page_map(path: Path, length: int = 0) -> list[bool]:
    """Per page of ``path`` (its first ``length`` bytes), whether it is in the page cache (``mincore``)."""
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
            return [bool(byte & 1) for byte in vector.raw]
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


def test_lmdb_writes_behind_its_commits_between_checkpoints(tmp_path, drops_synced_pages, monkeypatch):
    """No checkpoint falls due: each commit starts writing its pages out and the pages of the
    step before leave the page cache (``WriteBehind``), so the next pages reuse freed memory."""
    monkeypatch.setattr(journal, "CHECKPOINT_SECONDS", 1e9)
    monkeypatch.setattr(journal, "BACKGROUND_CHECKPOINT_BYTES", 1 << 40)
    monkeypatch.setattr(files, "WRITE_BEHIND_STEP", 1 << 20)
    writer = LMDBWriter(tmp_path / "out.lmdb", fingerprint={"test": 1})
    try:
        for i in range(96):  # 14 MiB in commits of about 4 MiB
            writer.add(Encoded(i % 3, (3, 224, 224), os.urandom(3 * 224 * 224)))
            writer.progress(i + 1, [])
        cached, pages = cached_pages(writer.tmp / DATA_FILE, length=writer._used_bytes())
        assert pages > 80 * 36 and writer._behind.released > 8 << 20, writer._behind.released  # the last commit is pending
        assert cached < pages // 2, (cached, pages)  # seen: about 1,040 of 3,115 (all of them without the write-behind, 2,092 with the map left alone)
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


def _grow(path: Path, chunks: int, chunk: int, behind: WriteBehind | None) -> None:
    """Write ``chunks`` random chunks to ``path``, telling ``behind`` after each."""
    with open(path, "wb", buffering=0) as handle:
        if behind is not None:
            behind.fd = handle.fileno()
        for j in range(chunks):
            handle.write(os.urandom(chunk))
            if behind is not None:
                behind.wrote((j + 1) * chunk)


def test_write_behind_puts_all_but_the_last_step_on_disk_as_the_file_grows(tmp_path, drops_synced_pages):
    """Pages the kernel drops on ``POSIX_FADV_DONTNEED`` are clean ones: a page out of the cache
    was written to disk. Without write-behind, nothing of a fresh file leaves it before an fsync."""
    step, chunk = 1 << 20, 256 << 10
    behind = WriteBehind(-1, step)
    _grow(tmp_path / "behind", 24, chunk, behind)  # 6 MiB, no fsync
    assert behind.enabled and behind.released == 5 * step and behind.started == 6 * step
    released_pages = behind.released // mmap.PAGESIZE
    assert cached_pages(tmp_path / "behind", behind.released)[0] == 0
    cached, pages = cached_pages(tmp_path / "behind")
    assert cached == pages - released_pages  # the last step stays, its write-out started
    _grow(tmp_path / "plain", 24, chunk, None)
    assert cached_pages(tmp_path / "plain") == (pages, pages)


def test_write_behind_of_a_resumed_file_leaves_its_first_bytes_alone(tmp_path, drops_synced_pages):
    """A resumed LMDB's pages so far are the checkpoints' business: a write-behind that starts
    there neither writes them out nor drops them with its first step (it waited for the whole
    file on the writer's thread)."""
    path = tmp_path / "resumed"
    path.write_bytes(os.urandom(4 << 20))  # from the interrupted run: cached
    fd = os.open(path, os.O_RDWR)
    try:
        behind = WriteBehind(fd, 1 << 20, start=(4 << 20) + 100)
        assert behind.started == behind.released == 4 << 20  # a page boundary
        for end in (6 << 20, 8 << 20):
            os.pwrite(fd, os.urandom(2 << 20), end - (2 << 20))
            behind.wrote(end)
        assert behind.released == 6 << 20
        in_cache = page_map(path)
        pages = (4 << 20) // mmap.PAGESIZE
        assert all(in_cache[:pages]) and not any(in_cache[pages : 2 * pages - pages // 2])
    finally:
        os.close(fd)


@pytest.mark.parametrize("error, raises", [
    (errno.EIO, True), (errno.ENOSPC, True), (errno.EDQUOT, True), (errno.EROFS, True),
    (errno.EINVAL, False), (errno.ENOSYS, False), (errno.ENOMEM, False),
])
def test_write_behind_reports_write_errors_and_steps_aside_where_refused(tmp_path, error, raises):
    calls = []

    def refuse(fd, start, length, flags):
        calls.append((start, length, flags))
        ctypes.set_errno(error)
        return -1

    behind = WriteBehind(-1, 1 << 16)
    behind._call = refuse
    if raises:
        with pytest.raises(OSError) as caught:
            _grow(tmp_path / "out", 4, 1 << 16, behind)
        assert caught.value.errno == error
    else:
        _grow(tmp_path / "out", 4, 1 << 16, behind)
        assert not behind.enabled and len(calls) == 1  # asked once, then never again
        assert (tmp_path / "out").stat().st_size == 4 << 16


@pytest.mark.parametrize("fragment", [None, 0])
def test_a_worker_writes_a_whole_shard_behind_but_keeps_a_fragment_for_the_driver(
    image_folder, tmp_path, drops_synced_pages, monkeypatch, fragment
):
    """A whole piece's shard leaves the page cache as it grows; a fragment, which the driver
    copies into its shard next, stays (dropped, it would be read back from the disk)."""
    monkeypatch.setattr(files, "WRITE_BEHIND_STEP", 16 << 10)
    items = scan_image_folder(image_folder).items
    task = PieceTask(ImageOptions(size=64), str(tmp_path))
    result = task(Piece(0, 0, tuple(items), fragment=fragment, last=True))
    assert result.error is None and len(result.parts) == 1
    cached, pages = cached_pages(tmp_path / result.parts[0].tmp_name)
    assert pages > 50  # 18 samples of 12 KiB
    if fragment is None:  # at most the last step, what came after it and the end of the archive
        assert cached * mmap.PAGESIZE <= 2 * (16 << 10) + RECORD + mmap.PAGESIZE, (cached, pages)
    else:
        assert cached == pages


def test_the_driver_writes_the_shard_it_assembles_from_fragments_behind(image_folder, tmp_path, drops_synced_pages, monkeypatch):
    monkeypatch.setattr(files, "WRITE_BEHIND_STEP", 16 << 10)
    items = scan_image_folder(image_folder).items
    task = PieceTask(ImageOptions(size=64), str(tmp_path))
    shard = Assembly(tmp_path / "shard.tar")
    for fragment in fragments(Piece(0, 0, tuple(items)), 4):
        part = task(fragment).parts[0]
        with open(tmp_path / part.tmp_name, "rb") as source:
            shard.append(source, part.rows, 0, part.size, keys_right=True)
    shard.close()
    cached, pages = cached_pages(tmp_path / "shard.tar")
    assert pages > 50 and cached < pages // 2, (cached, pages)  # the first three of four fragments left


def test_a_step_under_a_page_never_asks_for_an_empty_range(tmp_path):
    """A length of 0 means "to the end of the file" to ``sync_file_range``."""
    calls = []
    behind = WriteBehind(-1, 100)
    behind._call = lambda fd, start, length, flags: calls.append((start, length, flags)) or 0
    _grow(tmp_path / "out", 50, 1000, behind)
    assert calls and all(length > 0 for _start, length, _flags in calls)
    assert all(start % mmap.PAGESIZE == 0 and length % mmap.PAGESIZE == 0 for start, length, _flags in calls)


def test_a_shard_written_behind_is_renumbered_right(image_folder, tmp_path, monkeypatch):
    """After a skipped input the driver rewrites a published shard's member names in place,
    into pages the worker already dropped from the page cache."""
    monkeypatch.setattr(files, "WRITE_BEHIND_STEP", 16 << 10)
    items = scan_image_folder(image_folder).items
    part = PieceTask(ImageOptions(size=64), str(tmp_path))(Piece(0, 0, tuple(items))).parts[0]
    path = tmp_path / part.tmp_name
    before = path.read_bytes()
    renumber(path, part.rows, 100, "raw")
    with tarfile.open(path) as tar:
        names = tar.getnames()
        payloads = [tar.extractfile(member).read() for member in tar.getmembers()]
    assert names[:2] == ["0000000100.npy", "0000000100.cls"] and names[-1] == f"{100 + len(items) - 1:010d}.cls"
    assert len(names) == 2 * len(items) and path.stat().st_size == len(before)
    with tarfile.open(fileobj=io.BytesIO(before)) as tar:
        assert payloads == [tar.extractfile(member).read() for member in tar.getmembers()]


@pytest.mark.parametrize("stride, per_run, runs", [(10_000, 5, 60), (11_000, 5, 60), (10_000, 16, 24)],
                         ids=["runs-under-a-step", "other-stride", "runs-over-a-step"])
def test_placed_runs_are_written_behind_but_never_a_page_two_writers_share(tmp_path, drops_synced_pages, stride, per_run, runs):
    """Two writers place runs of samples in turn into one file, as a blob's workers do: what they
    wrote leaves the page cache as they go, but the write-out they ask for never covers a page at
    the edge of a run (the other writer's bytes may be in it, now or later), and those pages stay.
    (Runs over a step are handed on part-way too, in pieces that join up.)"""
    path, page = tmp_path / "out", mmap.PAGESIZE
    path.write_bytes(b"")
    fds = [os.open(path, os.O_WRONLY) for _ in range(2)]
    asked: list[tuple[int, int, int]] = []
    expected = bytearray()
    try:
        behinds = [WriteBehind(fd, 64 << 10) for fd in fds]
        real = behinds[0]._call
        for k, behind in enumerate(behinds):
            behind._call = lambda fd, start, length, flags, k=k: asked.append((k, start, length)) or real(fd, start, length, flags)
        for run in range(runs):
            for i in range(per_run):
                data, offset = os.urandom(stride), (run * per_run + i) * stride
                os.pwrite(fds[run % 2], data, offset)
                expected += data
                behinds[run % 2].wrote_range(offset, offset + stride)
    finally:
        for fd in fds:
            os.close(fd)
    in_cache = page_map(path)  # (before the file is read back below)
    owned = [[(run * per_run * stride, (run + 1) * per_run * stride) for run in range(k, runs, 2)] for k in range(2)]
    assert asked and all(length > 0 and start % page == 0 and length % page == 0 for _k, start, length in asked)
    assert all(any(a <= start and start + length <= b for a, b in owned[k]) for k, start, length in asked)
    edges = {run * per_run * stride // page for run in range(1, runs) if run * per_run * stride % page}
    assert len(edges) > 20 and all(in_cache[edge] for edge in edges)  # never asked for, never dropped
    run = per_run * stride  # per writer at most: a step and a run in flight, under a step pending, the current run
    most = len(edges) + 2 * (2 * (64 << 10) + 2 * run) // page + 4
    assert sum(in_cache) <= most < len(in_cache) // 3, (sum(in_cache), most, len(in_cache))
    assert path.read_bytes() == expected


@pytest.mark.parametrize("suffix", ["blob", "h5"])
def test_the_samples_workers_place_leave_the_page_cache_as_they_are_written(image_folder, tmp_path, drops_synced_pages,
                                                                            monkeypatch, suffix):
    """The step travels to the workers with their task (packer/placement.py), so a small one
    here shows in a real two-worker conversion: most of the output is on disk and out of memory
    when the conversion ends, where without write-behind every page of it stays cached."""
    monkeypatch.setattr(files, "WRITE_BEHIND_STEP", 8 << 10)
    report = convert(image_folder, tmp_path / f"out.{suffix}", image=ImageOptions(size=96), workers=2)
    assert report.written == 18
    cached, pages = cached_pages(report.dst)
    assert pages > 18 * 27648 // mmap.PAGESIZE and cached < pages // 2, (cached, pages)
