"""Write a packer LMDB (layout owned by ``readers/formats/lmdb.py``).

Samples are appended in write transactions of a few MB (keys are increasing, so ``append=True``
skips B-tree searches). LMDB copies each transaction's pages into buffers of its own and hands
them to the kernel with ``pwritev`` when it commits (its default, buffered mode); its map of the
file is read-only, for the few B-tree pages it reads back. The map grows by half whenever it
fills. The file's blocks are reserved with ``posix_fallocate`` before each commit writes over
them, in steps of 16 MiB ahead of the pages in use (the last step only what the commit needs,
where a step does not fit): a full disk is then, on most filesystems, an ordinary ``ENOSPC`` from
that call rather than from LMDB's write (which reports a write cut short as an I/O error; a
copy-on-write filesystem may still fail a write into reserved blocks). The map is only address
space (LMDB writes with ``pwritev``), so it is not reserved: reserving it whole, 64 MiB at the
start and then each half it grew by, failed conversions on a disk that held their dataset
many times over. The file is cut back to the pages in use when the dataset is finished.

Every checkpoint is made durable (``fdatasync``) in a thread beside the writing, and the pages it
made durable are then dropped from the page cache (``files.release_cached``; first from LMDB's
map, through which it reads its B-tree pages: the kernel keeps a cached block of the file whole
while one page of it is mapped): the file is not
read again while it is written, and the next pages written reuse the memory just freed (``benchmarks/results/one_writer.json``,
row (a), has the writer's rate; the message of the commit that made this change has its A/B
against the map). Between checkpoints the commits are also
written behind (``files.WriteBehind``, as WebDataset's shards and the blob's and HDF5's placed
samples are): every 8 MiB the file grows, the write-out of the new step starts and the step
before it is waited for and dropped (out of the map first; a B-tree page LMDB wrote there and
reads again comes back from the disk), so the next commits' pages reuse memory freed a few MB
earlier. A checkpoint's pages come back only after its ``fsync``, by then
often memory the 2-core VM's hypervisor had taken back, where a fresh page costs more than a
reused one (docs/SCALING.md); dropping a clean page costs no durability (the checkpoint's
``fdatasync`` still flushes the disk). Writing through a shared writable map
(``writemap``), as this writer did before, costs a page fault per new 4 KiB page and, at every
sync, write-protecting each page again (``msync``: ``folio_mkclean``, with a TLB shoot-down to
the other core), and the map's pages cannot be dropped from the cache.

LMDB copies each transaction's samples into pages it ``malloc``s and frees them when it commits;
so are the values built for it. Freed at the top of the heap, a few MB is more than glibc keeps
by default, so each transaction's memory went back to the kernel and came again as fresh pages,
a fault every 4 KiB. The writer first allocates and frees one block of four transactions
(``files.keep_freed_heap``), which has glibc keep twice that for reuse (the message of the commit
that made this change has the driver's faults and CPU time before and after). The ``packer``
command's process kept it already (``memory.keep_freed_memory``); a program calling
``packer.convert``, as the benchmarks do, did not.

A fresh output's map is opened without read-ahead (``readahead=False``: LMDB advises
``MADV_RANDOM``): its writer reads only the B-tree pages it appends to, and read-around would
bring back the pages just dropped. A resumed one is opened with read-ahead to delete what was
committed after the checkpoint (it reads those pages back, which a cold page cache would
otherwise fetch one fault at a time), then reopened without it for the rest of the run.
"""

from __future__ import annotations

import errno
import os
from typing import Any

import lmdb

from readers.formats.lmdb import CHECKSUMS_KEY, DATA_FILE, LOCK_FILE, META_KEY, SAMPLE_HEADER, SOURCES_KEY, sample_key
from readers.schema import Metadata

from ..preprocess.task import Encoded
from .base import Writer
from ..files import WriteBehind, keep_freed_heap, release_cached
from .journal import Checkpoint

__all__ = ["LMDBWriter"]

INITIAL_MAP_SIZE = 64 << 20
#: Samples are put in write transactions of about this many bytes: small enough that the pages
#: LMDB copies them into are still in the CPU's cache when its commit writes them out (the
#: message of the commit that chose it has the A/B against 64 MB; ``benchmarks/results/one_writer.json``
#: has the rate); each commit adds only a few B-tree pages.
TRANSACTION_BYTES = 4 << 20
GROWTH = 1.5
_ALIGN = 16 << 20


class LMDBWriter(Writer):
    format_name = "lmdb"
    is_directory = True

    def _open(self) -> None:
        self.tmp.mkdir()
        self._open_env(INITIAL_MAP_SIZE)

    def _reopen(self, checkpoint: Checkpoint) -> None:
        """Reopen the environment and delete what was committed after the checkpoint."""
        size = os.path.getsize(self.tmp / DATA_FILE)
        self._open_env(max(INITIAL_MAP_SIZE, -(-size // _ALIGN) * _ALIGN), readahead=True)  # module docstring
        first = sample_key(checkpoint.samples)
        try:
            with self._env.begin(write=True) as txn:
                cursor = txn.cursor()
                while cursor.set_range(first):
                    cursor.delete()
        except lmdb.Error as exc:
            raise _as_os_error(exc) from None
        map_size = self._map_size
        self._close()  # then on as a fresh output: without read-ahead (module docstring)
        self._open_env(map_size)

    @property
    def durable_in_background(self) -> bool:
        """``env.sync`` (``fdatasync``) in the checkpoint thread, beside the writing: the map is
        never resized under it (:meth:`_grow` waits for it first)."""
        return True

    def _sync(self) -> dict[str, Any]:
        self._flush()  # committed: the checkpoint holds every sample added so far
        self._synced_bytes = self._used_bytes()
        return {}

    def _durable(self) -> None:
        _lmdb_call(self._env.sync, True)
        release_cached(self._fd, self._synced_bytes, map_size=self._map_size)  # module docstring

    def _open_env(self, map_size: int, *, readahead: bool = False) -> None:
        """Open the environment in ``DST.partial`` with a map of ``map_size`` bytes, blocks reserved;
        ``readahead``: whether a fault reads the pages around it (module docstring)."""
        keep_freed_heap(4 * TRANSACTION_BYTES)  # module docstring
        self._pending: list[tuple[bytes, bytes]] = []
        self._pending_bytes = 0
        self._synced_bytes = 0
        self._preallocate = _can_preallocate(self.tmp / ".probe")
        self._map_size = map_size
        version = {"lib_version": 0} if int(lmdb.__version__.split(".")[0]) >= 3 else {}  # readable by any py-lmdb
        self._env = _lmdb_call(
            lmdb.open,
            str(self.tmp),
            map_size=self._map_size,
            subdir=True,
            sync=False,
            metasync=False,
            meminit=True,  # unused bytes of a page are zeros, not stale memory (docs/FORMATS.md: nothing but what it says)
            readahead=readahead,
            max_dbs=0,
            **version,
        )
        self._fd = os.open(self.tmp / DATA_FILE, os.O_RDWR)  # to reserve blocks and drop durable pages
        self._reserved = os.fstat(self._fd).st_size  # (a resumed file's blocks: reserved by the run that wrote it)
        # through a descriptor opened before any write (it reports their errors); dropping pages takes them out of the map
        # first; a resumed output's pages so far are left to the checkpoints
        self._behind = WriteBehind(self._fd, map_size=self._map_size, start=self._used_bytes())

    def _write(self, index: int, sample: Encoded) -> None:
        channels, height, width = sample.shape
        value = SAMPLE_HEADER.pack(sample.label, height, width, channels, 0) + sample.payload
        self._pending.append((sample_key(index), value))
        self._pending_bytes += len(value)
        if self._pending_bytes >= TRANSACTION_BYTES:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        page = self._env.stat()["psize"]  # each value rounds up to whole pages; a few B-tree pages besides
        self._reserve(self._used_bytes() + self._pending_bytes + (len(self._pending) + 16) * page)
        while True:
            try:
                with self._env.begin(write=True) as txn:
                    for key, value in self._pending:
                        txn.put(key, value, append=True)
                break
            except lmdb.MapFullError:
                self._grow()
            except lmdb.Error as exc:
                raise _as_os_error(exc) from None
        self._pending.clear()
        self._pending_bytes = 0
        self._behind.wrote(self._used_bytes())  # module docstring; a write-out error raises OSError, as the fsync's would

    def _grow(self) -> None:
        self._settle(raise_error=True)  # no sync may run while the map is replaced
        wanted = max(int(self._map_size * GROWTH), self._map_size + 2 * self._pending_bytes)
        wanted = -(-wanted // _ALIGN) * _ALIGN
        _lmdb_call(self._env.set_mapsize, wanted)  # address space only: the blocks are reserved as commits need them
        self._map_size = self._behind.map_size = wanted

    def _reserve(self, needed: int) -> None:
        """Reserve the file's blocks up to ``needed`` bytes: a step of ``_ALIGN`` ahead, or just
        ``needed`` where the step does not fit (the data may; module docstring)."""
        if not self._preallocate or needed <= self._reserved:
            return
        step = -(-needed // _ALIGN) * _ALIGN
        try:
            os.posix_fallocate(self._fd, 0, step)
        except OSError as exc:
            if exc.errno != errno.ENOSPC or step == needed:
                raise
            os.posix_fallocate(self._fd, 0, needed)  # a full disk: ENOSPC from here, not from LMDB's write
            step = needed
        self._reserved = step

    def _used_bytes(self) -> int:
        """The bytes of the file that hold LMDB's pages (the rest is reserved blocks)."""
        return (self._env.info()["last_pgno"] + 1) * self._env.stat()["psize"]

    def _write_metadata(self, meta: Metadata) -> None:
        self._pending.append((CHECKSUMS_KEY, self.checksum_array().tobytes()))  # sorts before META_KEY
        self._pending.append((META_KEY, meta.to_json().encode()))
        names = self.source_names_bytes()
        if names is not None:  # in the same transaction as META_KEY (it sorts after it)
            self._pending.append((SOURCES_KEY, names))
        self._flush()
        _lmdb_call(self._env.sync, True)
        used = self._used_bytes()
        self._env.close()
        os.ftruncate(self._fd, used)  # drop the reserved tail: the pages in use are all LMDB reads
        os.close(self._fd)
        self._fd = -1
        lock = self.tmp / LOCK_FILE  # readers open with lock=False: the lock file is not part of the data
        if lock.exists():
            os.unlink(lock)

    def _close(self) -> None:
        env = getattr(self, "_env", None)
        if env is not None:
            env.close()
        fd = getattr(self, "_fd", -1)
        if fd >= 0:
            os.close(fd)
            self._fd = -1


def _can_preallocate(probe: os.PathLike) -> bool:
    """Whether the filesystem under ``probe`` supports posix_fallocate."""
    fd = os.open(probe, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.posix_fallocate(fd, 0, 4096)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            return False
        raise
    finally:
        os.close(fd)
        os.unlink(probe)
    return True


def _as_os_error(exc: lmdb.Error) -> OSError:
    code = getattr(exc, "code", 0) or 0
    return OSError(code, os.strerror(code) if code > 0 else str(exc))


def _lmdb_call(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except lmdb.Error as exc:
        raise _as_os_error(exc) from None
