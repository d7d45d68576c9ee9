"""Files of an output: where an unfinished one lives, removing, syncing and publishing it,
releasing a range of it (a hole), and writing one to disk as it grows."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import os
import shutil
import stat
import sys
from pathlib import Path
from typing import Any, Sequence

__all__ = ["partial_path", "remove_path", "fsync_path", "release_cached", "fsync_tree", "publish", "recover_replaced", "punch_hole", "allocate", "WriteBehind", "read_ahead"]


def partial_path(dst: Path) -> Path:
    """Where an unfinished conversion to ``dst`` is written."""
    return dst.with_name(dst.name + ".partial")


def remove_path(path: Path) -> None:
    """Remove a file or a folder tree if it exists."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            path.unlink()
        except FileNotFoundError:
            pass


def fsync_path(path: Path, flags: int = os.O_RDONLY, *, release: bool = False) -> None:
    """fsync the file or folder at ``path`` (a folder: the names in it); ``release``: then drop
    the file's pages from the page cache (:func:`release_cached`)."""
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
        if release:
            release_cached(fd)
    finally:
        os.close(fd)


def release_cached(fd: int, length: int = 0, *, map_size: int = 0, start: int = 0) -> None:
    """Drop bytes ``start`` up to ``length`` (0: to the end) of the file open as ``fd`` from the
    page cache, once they are durable (``POSIX_FADV_DONTNEED``, a hint: pages still mapped stay,
    and so do dirty ones, whose write-back it starts). ``map_size``: this process maps the file
    from its start over that many bytes (LMDB's read-only map); that range of the map is emptied
    first (``MADV_DONTNEED``: a later read maps it again), since the kernel caches a file in
    blocks of up to 2 MiB and keeps a whole block while one page of it is mapped.

    LMDB's and WebDataset's writers call it after each background checkpoint's ``fsync``: their
    output is not read while it is written, so its pages would only crowd out the user's own
    cached files, and the pages written next reuse the memory just freed instead of ever more
    of it (on the 2-core VM, whose hypervisor takes back free memory, touching fresh memory is
    what made LMDB's writes slow; docs/SCALING.md). The blob's and HDF5's workers drop the samples
    they place as they write them instead (:meth:`WriteBehind.wrote_range`); what their driver
    writes (other shapes, compression, samples after a skip) stays cached until the end.
    """
    if map_size and length:
        _unmap(fd, map_size, start - start % mmap.PAGESIZE, min(length, map_size))
    advise = getattr(os, "posix_fadvise", None)
    if advise is None:  # pragma: no cover - not POSIX (macOS has no fadvise)
        return
    try:
        advise(fd, start, length - start if length else 0, os.POSIX_FADV_DONTNEED)
    except OSError:  # pragma: no cover - a filesystem without it: the pages are only kept
        pass


def read_ahead(fd: int, offsets: Sequence[int], length: int) -> None:
    """Ask the kernel to read ``length`` bytes at each of ``offsets`` of the file ``fd`` into the
    page cache now, all at once (``POSIX_FADV_WILLNEED``, a hint), before small writes into pages
    it no longer holds (each would otherwise read its page first, one after another)."""
    advise = getattr(os, "posix_fadvise", None)
    if advise is None:  # pragma: no cover - not POSIX
        return
    try:
        for offset in offsets:
            advise(fd, offset, length, os.POSIX_FADV_WILLNEED)
    except OSError:  # pragma: no cover - a filesystem without it: each write reads its page
        pass


def _unmap(fd: int, map_size: int, first: int, end: int) -> None:
    """Empty bytes ``first`` (a page boundary) up to ``end`` of this process's map of the file
    ``fd`` (``map_size`` bytes from its start), looked up anew in ``/proc/self/maps`` each time (the library that made
    it does not say where it is): advice never goes to an address no longer the map's, which on
    private memory would zero it."""
    madvise = _libc("madvise", (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int))
    if madvise is None or not hasattr(mmap, "MADV_DONTNEED"):
        return
    stat = os.fstat(fd)
    device = (os.major(stat.st_dev), os.minor(stat.st_dev))
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:  # start-end perms offset major:minor inode [path]
                fields = line.split()
                if len(fields) < 5 or int(fields[4]) != stat.st_ino or int(fields[2], 16) != 0:
                    continue
                address, last = (int(x, 16) for x in fields[0].split("-"))
                if tuple(int(x, 16) for x in fields[3].split(":")) == device and last - address == map_size:
                    if end > first:
                        madvise(ctypes.c_void_p(address + first), ctypes.c_size_t(end - first), mmap.MADV_DONTNEED)
                    return
    except (OSError, ValueError):  # no /proc here: the mapped pages are only kept
        pass


def fsync_tree(path: Path) -> None:
    """fsync a file, or every file and folder under a folder."""
    if path.is_dir():
        for dirpath, _dirnames, filenames in os.walk(path):
            for name in filenames:
                fsync_path(Path(dirpath) / name)
            fsync_path(Path(dirpath))
    else:
        fsync_path(path)


def publish(tmp: Path, dst: Path) -> None:
    """Sync ``tmp`` and rename it to ``dst`` (replacing an existing one, whose permissions it
    takes: a private folder or file stays private), then sync the folder."""
    fsync_tree(tmp)
    old = None
    if dst.exists() or dst.is_symlink():
        if not dst.is_symlink():
            os.chmod(tmp, _mode_for(tmp, os.stat(dst).st_mode))
        old = dst.with_name(f"{dst.name}.replaced-{os.getpid()}")
        while old.exists() or old.is_symlink():  # never a name of the user's
            old = old.with_name(old.name + "x")
        os.replace(dst, old)
    try:
        os.replace(tmp, dst)
    except BaseException:
        if old is not None:
            os.replace(old, dst)  # the dataset that was there, back in its place
        raise
    fsync_path(dst.parent if str(dst.parent) else Path("."))
    if old is not None and not _removed(old):
        import logging

        logging.getLogger("packer").warning("%s: the dataset it replaced is left at %s (it could not be removed)", dst, old)


def _removed(old: Path) -> bool:
    """Remove a replaced dataset; whether it is gone."""
    remove_path(old)
    if old.exists():  # a read-only copy (its owner's 555 folder): writable, then removed
        for folder, _, _names in os.walk(old):
            os.chmod(folder, 0o700)
        remove_path(old)
    return not (old.exists() or old.is_symlink())


def recover_replaced(dst: Path) -> None:
    """Put right what a killed :func:`publish` left (SIGKILL, the OOM killer, power lost): the
    dataset it replaced, moved aside as ``DST.replaced-PID``, stayed there for good (a full
    copy nobody removed; an interrupted-conversions walkthrough). With DST published (there,
    and no ``DST.partial`` left), the copy is removed; killed between the two renames (no DST,
    or an empty folder made since), it goes back to DST, the new output staying ``DST.partial``
    to resume; DST holding something else then, it is left, said. Not while a conversion to
    DST holds its lock (it may be publishing)."""
    import logging
    import re

    from readers.formats.inprogress import is_empty_folder, lock_holder, lock_path

    say = logging.getLogger("packer").warning
    pattern = re.compile(re.escape(dst.name) + r"\.replaced-[0-9]+x*")
    try:
        names = sorted(name for name in os.listdir(dst.parent if str(dst.parent) else ".") if pattern.fullmatch(name))
    except OSError:
        return
    partial = partial_path(dst)
    if not names or lock_holder(lock_path(partial)) is not None:
        return
    for name in names:
        old, there = dst.with_name(name), dst.exists() or dst.is_symlink()
        if there and not (partial.exists() or partial.is_symlink()):
            if _removed(old):
                say("%s: removed %s, the dataset a killed --overwrite had replaced", dst, name)
            else:
                say("%s: %s is the dataset a killed --overwrite replaced (it could not be removed)", dst, name)
            continue
        if there and is_empty_folder(dst):
            dst.rmdir()  # (made again since, empty)
        elif there:
            say("%s: %s is the dataset a killed --overwrite had moved aside; DST holds other files now, so it is left there", dst, name)
            continue
        os.replace(old, dst)
        say("%s: a killed --overwrite had moved the dataset aside as %s; it is back", dst, name)


def _mode_for(path: Path, mode: int) -> int:
    """The permission bits of ``mode`` (a replaced DST's) for ``path``: as they were for the same
    kind; a folder's for a file without its execute bits, a file's for a folder with an execute
    bit wherever it has a read bit. Never the set-id or sticky bits."""
    bits = stat.S_IMODE(mode) & 0o777
    if path.is_dir() == stat.S_ISDIR(mode):
        return bits
    if path.is_dir():
        return bits | ((bits & 0o444) >> 2)
    return bits & 0o666


def punch_hole(fd: int, offset: int, length: int) -> bool:
    """Release the disk blocks of ``length`` bytes at ``offset`` of the file ``fd`` (open for
    writing), keeping its size; the range then reads as zeros. ``False`` where unsupported."""
    if not sys.platform.startswith("linux") or length <= 0:
        return False
    fallocate = _libc("fallocate", (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64))
    if fallocate is None:
        return False
    keep_size, punch = 0x01, 0x02  # FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE (linux/falloc.h)
    return fallocate(fd, keep_size | punch, offset, length) == 0


def allocate(fd: int, offset: int, length: int) -> bool:
    """Allocate the disk blocks of ``length`` bytes at ``offset`` of the file ``fd`` (open for
    writing) now, extending the file where they reach past its end (``fallocate``, mode 0: what
    the range holds is kept, what it does not yet hold reads as zeros). ``False`` where the
    filesystem cannot (the writes then allocate blocks as they go); a full disk (or quota)
    raises ``OSError``, and the caller gives back what the call got (it may have got part).

    The blob and HDF5 writers allocate the place of every sample their workers will write
    (packer/placement.py): on ext4, writes into blocks not yet allocated reserve them one page at
    a time, and a checkpoint's ``fsync`` allocates them under the inode's block-map lock, which
    the workers' next writes then wait for (docs/SCALING.md). Never glibc's ``posix_fallocate``,
    which writes zeros over the whole range where the filesystem has no ``fallocate``."""
    if not sys.platform.startswith("linux") or length <= 0:
        return False
    fallocate = _libc("fallocate", (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64))
    if fallocate is None:  # pragma: no cover - no glibc
        return False
    if fallocate(fd, 0, offset, length) == 0:
        return True
    error = ctypes.get_errno()
    if error in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
        return False
    raise OSError(error, os.strerror(error))


#: ``sync_file_range`` flags (linux/fs.h): wait for write-out already under way, start it, wait for it.
_WAIT_BEFORE, _WRITE, _WAIT_AFTER = 1, 2, 4
#: Errors of writing the data out, which :class:`WriteBehind` raises (any other turns it off).
_WRITE_ERRORS = (errno.EIO, errno.ENOSPC, errno.EDQUOT, errno.EROFS)
#: How far a file grows between two steps of :class:`WriteBehind`.
WRITE_BEHIND_STEP = 8 << 20


class WriteBehind:
    """Writes a file that grows sequentially (:meth:`wrote`), or this process's ranges of a file
    others write too (:meth:`wrote_range`), to disk as it is written, in steps of ``step`` bytes
    (default :data:`WRITE_BEHIND_STEP`).

    Each time the file has grown a step past the last, :meth:`wrote` starts the write-out of the
    new step (``sync_file_range``, ``SYNC_FILE_RANGE_WRITE``: it does not wait), then waits for
    the step before it and drops that step from the page cache (:func:`release_cached`'s
    reason: the output is not read while it is written). So the final ``fsync`` finds about two
    steps not yet on disk (two, and what was written past the last), where without it a
    WebDataset shard (150 MB of raw 224px samples) was all still in memory: the kernel starts
    writing dirty pages on its own only past a tenth of the memory or after 30 s, and the last
    shards' ``fsync`` then held the conversion's end with its cores idle (docs/SCALING.md). A
    disk slower than the samples come makes the writer wait here, where it would otherwise wait
    in the kernel's throttling.

    Only for files not read back while written (a WebDataset worker's finished shard, the
    shards the driver assembles, the samples a blob's or HDF5's workers place, :meth:`wrote_range`,
    of which only the few moved down after a skipped input are read back; LMDB's file, whose
    writer reads back only the few B-tree pages of its last commits: those that fall in a step
    dropped are read from the disk again; ``map_size``, the writer's map of the file, is emptied
    over each step dropped first, as at its checkpoints), never fragments the
    driver copies from. Where ``sync_file_range`` is missing or refused (not Linux, a filesystem
    without it), it does nothing; a write error or a full disk it reports raises ``OSError`` (and
    must: once a wait has seen a writeback error, an ``fsync`` through a descriptor opened after
    that does not report it; the blob's and HDF5's checkpoints sync through one opened before the
    workers wrote).
    """

    def __init__(self, fd: int, step: int | None = None, *, map_size: int = 0, start: int = 0) -> None:
        self.fd, self.step = fd, step or WRITE_BEHIND_STEP
        self.map_size = map_size  # this process maps the file over so many bytes (LMDB: :func:`release_cached`)
        start -= start % mmap.PAGESIZE  # ``start``: the file's first bytes are from before (a resumed output): left alone
        self.started = start  # write-out started below this offset
        self.released = start  # on disk and out of the page cache below this offset
        self._run_end = -1  # :meth:`wrote_range`: where the run of contiguous ranges written last ends
        self._cut = 0  # the first byte of that run not handed on yet (a page boundary)
        self._pending: list[tuple[int, int]] = []  # whole pages handed on, write-out not started
        self._pending_bytes = 0
        self._in_flight: list[tuple[int, int]] = []  # write-out started, not waited for yet
        self._call = _libc("sync_file_range", (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint))
        self.enabled = self._call is not None and sys.platform.startswith("linux")

    def due(self, position: int) -> bool:
        """Whether :meth:`wrote` at ``position`` would do anything (a buffered writer flushes
        first: its buffer may be as large as a step on some filesystems)."""
        return self.enabled and position >= self.started + self.step

    def wrote_through(self, handle: Any, position: int) -> None:
        """:meth:`wrote` for a file written through the buffered ``handle``, which holds
        ``position`` bytes with its buffer: flushed first when a step is due."""
        if self.due(position):
            handle.flush()
            self.wrote(position)

    def wrote(self, position: int) -> None:
        """The file now holds ``position`` bytes (written, not only buffered)."""
        if not self.due(position):
            return
        end = position - position % mmap.PAGESIZE
        if end <= self.started:  # a step under a page: nothing whole yet (a length 0 means "to the end")
            return
        if not self._sync(self.started, end, _WRITE):
            return
        if self.started > self.released:
            self._wait_and_release(self.released, self.started)
            self.released = self.started
        self.started = end

    def wrote_range(self, start: int, end: int) -> None:
        """Bytes ``start`` up to ``end`` of a file that other processes write into too, each its
        own ranges (the samples workers place: packer/placement.py), were written. Contiguous
        ranges make a run; a run's whole pages are written behind a step at a time, as
        :meth:`wrote` does, but not the page at either end of a run, which may hold another
        writer's bytes too: it is left to the next checkpoint's ``fsync`` (dropped from the page
        cache, the other writer's part-page write would have to read it back from the disk first)."""
        if not self.enabled:
            return
        if start != self._run_end:  # a new run: the last one's whole pages are handed on
            self._hand_on(self._run_end - self._run_end % mmap.PAGESIZE)
            self._cut = start + -start % mmap.PAGESIZE
        self._run_end = end
        if end - self._cut >= self.step:
            self._hand_on(end - end % mmap.PAGESIZE)
        if self._pending_bytes >= self.step:
            pending, self._pending, self._pending_bytes = self._pending, [], 0
            if all(self._sync(begin, stop, _WRITE) for begin, stop in pending):
                for begin, stop in self._in_flight:
                    self._wait_and_release(begin, stop)
                self._in_flight = pending

    def _hand_on(self, end: int) -> None:
        """The current run's whole pages up to ``end`` are due to be written behind."""
        if end <= self._cut:
            return
        if self._pending and self._pending[-1][1] == self._cut:
            self._pending[-1] = (self._pending[-1][0], end)
        else:
            self._pending.append((self._cut, end))
        self._pending_bytes += end - self._cut
        self._cut = end

    def _wait_and_release(self, start: int, end: int) -> None:
        """Wait for the write-out of bytes ``start`` to ``end`` (started earlier), then drop them."""
        if self._sync(start, end, _WAIT_BEFORE | _WRITE | _WAIT_AFTER):
            release_cached(self.fd, end, start=start, map_size=self.map_size)

    def _sync(self, start: int, end: int, flags: int) -> bool:
        if self._call(self.fd, start, end - start, flags) == 0:
            return True
        error = ctypes.get_errno()
        if error in _WRITE_ERRORS:  # seen here, a later fsync on another descriptor would not report it
            raise OSError(error, os.strerror(error))
        self.enabled = False  # refused or failed otherwise: the final fsync writes it all, as before
        return False


def keep_freed_heap(size: int) -> None:
    """Have the C library keep up to twice ``size`` bytes of freed heap memory for reuse instead of
    giving it back to the kernel at once, as any program that allocates and frees a block of
    ``size`` bytes does: glibc (``mallopt(3)``, "dynamic mmap threshold") then serves blocks up to
    ``size`` from its heap and trims the heap only when more than twice ``size`` lies free at its
    top. A writer whose library mallocs and frees a few MB at every commit (LMDB) otherwise gets
    the same memory back from the kernel each time as fresh pages, a fault for every 4 KiB. The
    block is never touched; up to 32 MiB counts; other C libraries just allocate and free it.
    The gentle form, for a process packer does not own (a program calling ``packer.convert``):
    the ``packer`` command's own process and every worker set glibc's thresholds outright
    (:func:`packer.memory.keep_freed_memory`), which this then leaves as they are."""
    malloc = _libc("malloc", (ctypes.c_size_t,), ctypes.c_void_p)
    free = _libc("free", (ctypes.c_void_p,), None)
    if malloc is not None and free is not None:
        block = malloc(size)
        if block:
            free(block)


def _libc(name: str, argtypes: tuple, restype: Any = ctypes.c_int) -> Any:
    """The C library's function ``name``, loaded once; None where there is none."""
    functions = _libc.__dict__.setdefault("functions", {})
    if name not in functions:
        try:
            function = getattr(ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True), name)
            function.argtypes, function.restype = argtypes, restype
        except (OSError, AttributeError):  # pragma: no cover - no glibc
            function = None
        functions[name] = function
    return functions[name]
