"""Samples written past the page cache (``O_DIRECT``), in large pieces, by the workers that place them.

A placing worker (packer/placement.py) writes a run of consecutive samples (a chunk's) into the
output. Buffered, each sample costs the kernel its copy into the page cache and, later, its
write-out (``files.WriteBehind``): on 2 cores the largest part of a conversion's cost beyond the
work alone (the CPU account of ``core_scaling.json``, docs/SCALING.md). Written with
``O_DIRECT`` in pieces of a few MB, the device reads the pages from the worker's buffer, and
the kernel only maps them. Page-aligned writes past the page cache into allocated blocks
(the blob's and HDF5's places are allocated before the workers write) also run side by side
on one file: XFS takes the inode's lock shared for them, and ext4 too from Linux 6.3 on (its
"dio take shared inode lock when overwriting preallocated blocks"), where buffered writes to
one file take it in turn (a reading of the kernels' code, not measured here).

:class:`DirectRuns` gathers a run's samples into a page-aligned buffer and hands each full
piece to a thread, which writes its whole pages with ``O_DIRECT`` (the device's alignment)
while the worker converts the next samples; the part-pages at a run's two ends, which a
neighbouring worker's run may share, are written through the page cache as before (left to the
next checkpoint's ``fsync``). :meth:`DirectRuns.finish` waits for every piece: a worker sends
its chunk's records only after that, so the driver's checkpoint ``fsync`` covers them as it
covers buffered writes. Where the file cannot be opened with ``O_DIRECT`` (tmpfs, some network
filesystems: ``EINVAL``) or a piece is refused so, it writes through the page cache instead.
"""

from __future__ import annotations

import errno
import mmap
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

__all__ = ["DirectRuns", "open_direct", "pwrite_all", "PIECE_BYTES"]

#: Bytes a thread writes at a time (about 14 raw 224px samples): large enough that the kernel's
#: cost per write is small, small enough that a chunk's last piece is little to wait for.
PIECE_BYTES = 2 << 20

_PAGE = mmap.PAGESIZE


class DirectRuns:
    """Writes runs of bytes into a file: whole pages in pieces of ``piece`` bytes through
    ``direct`` (a descriptor opened with ``O_DIRECT``: :func:`open_direct`), on a thread; the
    part-pages at a run's ends through ``fd`` (the page cache)."""

    def __init__(self, fd: int, direct: int, piece: int = PIECE_BYTES) -> None:
        self.fd, self.direct = fd, direct
        self.piece = max(_PAGE, piece - piece % _PAGE)
        self._buffers = [mmap.mmap(-1, self.piece + 2 * _PAGE) for _ in range(2)]
        self._writing: list[Future | None] = [None, None]  # each buffer's piece being written
        self._turn = 0
        self._pool: ThreadPoolExecutor | None = None
        self._error: OSError | None = None
        self._lock = threading.Lock()
        self._start = self._end = -1  # the file range the current buffer holds, from a page boundary
        self._head = 0  # bytes at the buffer's start that are not this run's (before its first byte)

    def write(self, data: bytes | memoryview, offset: int) -> None:
        """Write ``data`` at ``offset``: appended to the current run if it starts where that ends."""
        view = memoryview(data).cast("B")
        if offset != self._end:
            self._flush(final=True)
            self._start = offset - offset % _PAGE
            self._head = offset - self._start
            self._end = offset
        while view:
            buffer = self._buffers[self._turn]
            at = self._end - self._start
            size = min(len(view), len(buffer) - at)
            buffer[at:at + size] = view[:size]
            view, self._end = view[size:], self._end + size
            if self._end - self._start >= self.piece:
                self._flush(final=False)

    def finish(self) -> None:
        """Write what is gathered and wait for every piece; raise the first write error."""
        self._flush(final=True)
        for turn in (0, 1):
            self._wait(turn)
        error, self._error = self._error, None
        if error is not None:
            raise error

    def close(self) -> None:
        """Stop the thread and close the ``O_DIRECT`` descriptor (not ``fd``)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self.direct >= 0:
            os.close(self.direct)
            self.direct = -1

    # -- internals ---------------------------------------------------------------------------
    def _flush(self, *, final: bool) -> None:
        """Hand the buffer's whole pages on (``final``: its last part-page too, and the run
        ends); a part-page left over moves to the other buffer's start."""
        if self._end <= self._start + self._head:
            return
        turn, start, head, end = self._turn, self._start, self._head, self._end
        buffer = self._buffers[turn]
        first = start + _PAGE if head else start
        whole_end = end - (end - start) % _PAGE
        if head:  # the run's first part-page (a neighbour's run may hold its start)
            self._buffered(buffer, start, start + head, min(first, end))
        if whole_end > first:
            self._submit(turn, first - start, whole_end - start, first)
        other = turn ^ 1
        self._wait(other)  # the other buffer is written out: free for what comes next
        self._turn = other
        if final:
            if end > max(whole_end, first):
                self._buffered(buffer, start, max(whole_end, first), end)
            self._start = self._end = -1
            self._head = 0
            return
        left = end - whole_end
        self._buffers[other][:left] = buffer[whole_end - start:end - start]
        self._start, self._head, self._end = whole_end, 0, end

    def _buffered(self, buffer: mmap.mmap, base: int, begin: int, end: int) -> None:
        """Write file bytes ``begin`` up to ``end`` from ``buffer`` (which starts at file offset
        ``base``) through the page cache."""
        try:
            pwrite_all(self.fd, memoryview(buffer)[begin - base:end - base], begin)
        except OSError as exc:
            self._fail(exc)

    def _submit(self, turn: int, begin: int, end: int, offset: int) -> None:
        """Write ``begin`` up to ``end`` of buffer ``turn`` (whole pages) at ``offset``, on the thread."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="packer-direct")
        self._writing[turn] = self._pool.submit(self._write_pages, memoryview(self._buffers[turn])[begin:end], offset)

    def _write_pages(self, view: memoryview, offset: int) -> None:
        try:
            try:
                pwrite_all(self.direct, view, offset)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                pwrite_all(self.fd, view, offset)  # refused past the page cache: through it (rare)
        except OSError as exc:
            self._fail(exc)

    def _fail(self, exc: OSError) -> None:
        with self._lock:
            if self._error is None:
                self._error = exc

    def _wait(self, turn: int) -> None:
        """Wait until buffer ``turn``'s piece is written."""
        future, self._writing[turn] = self._writing[turn], None
        if future is not None:
            future.result()


def open_direct(path: str) -> int:
    """``path`` opened for writing with ``O_DIRECT``; -1 where that is refused (tmpfs, some
    network filesystems, systems without it)."""
    try:
        return os.open(path, os.O_WRONLY | os.O_DIRECT)  # type: ignore[attr-defined]
    except (OSError, AttributeError):
        return -1


def pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    """Write all of ``data`` at ``offset`` (``os.pwrite`` may write less)."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written
