"""Write a packer LMDB (layout owned by ``readers/formats/lmdb.py``).

Samples are appended in large write transactions (keys are increasing, so ``append=True``
skips B-tree searches). LMDB writes straight into its memory map (``writemap``), much faster here
(an uncommitted measurement) than its default of copying every page through malloc'd buffers. A write into a memory map
cannot report a full disk (the process would get SIGBUS instead), so the file's blocks are
reserved with ``posix_fallocate`` before the map grows over them: a full disk is an ordinary
``ENOSPC`` error. The map grows by half whenever it fills, and the file is cut back to the pages
in use when the dataset is finished. Where the filesystem cannot preallocate, LMDB's default
buffered writes are used.

A fresh output's map is opened without read-ahead (``readahead=False``: LMDB advises
``MADV_RANDOM``). A write fault on a page the file does not hold yet otherwise reads the pages
around it too, which for a new file means the kernel zeroing them, and zeroing pages it will
zero again: perf on the 2-core VM (kernel 6.18, ext4) showed ``memset`` under the fault path as
most of a faulting writer's time (docs/SCALING.md; ``benchmarks/results/one_writer.json``
was rerun with this change). A fresh output's writer reads only the B-tree pages it appends to,
so it loses nothing. A resumed one keeps read-ahead: it reads back what was committed after the
checkpoint to delete it, and then refills the freed pages, all of them pages the file already
holds, which a cold page cache would otherwise fetch one fault at a time.
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
from . import journal as _journal
from .journal import Checkpoint

__all__ = ["LMDBWriter"]

INITIAL_MAP_SIZE = 64 << 20
TRANSACTION_BYTES = 64 << 20
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

    @property
    def durable_in_background(self) -> bool:
        """``env.sync`` (an msync of the map, or fdatasync) in the checkpoint thread, beside the
        writing: the map is never resized under it (:meth:`_grow` waits for it first)."""
        return True

    def _checkpoint_bytes(self) -> int:
        """The larger spacing, though its checkpoints are synced in the background: each sync
        write-protects the map's dirty pages again, and LMDB writes some of them again (its
        tree's pages), each such write then a fault. With the smaller spacing the file formats
        use, its writer alone was slower on the 2-core VM (an ad hoc A/B of
        ``benchmarks.one_writer``; its figures are in the message of the commit that chose these,
        not a committed result)."""
        return _journal.CHECKPOINT_BYTES

    def _sync(self) -> dict[str, Any]:
        self._flush()  # committed: the checkpoint holds every sample added so far
        return {}

    def _durable(self) -> None:
        _lmdb_call(self._env.sync, True)

    def _open_env(self, map_size: int, *, readahead: bool = False) -> None:
        """Open the environment in ``DST.partial`` with a map of ``map_size`` bytes, blocks reserved;
        ``readahead``: whether a fault reads the pages around it (module docstring)."""
        self._pending: list[tuple[bytes, bytes]] = []
        self._pending_bytes = 0
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
            meminit=False,
            writemap=self._preallocate,
            map_async=self._preallocate,
            readahead=readahead,
            max_dbs=0,
            **version,
        )
        self._fd = os.open(self.tmp / DATA_FILE, os.O_RDWR)
        self._reserve(self._map_size)  # before the first write transaction touches the map

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

    def _grow(self) -> None:
        self._settle(raise_error=True)  # no msync of the old map may run while it is replaced
        wanted = max(int(self._map_size * GROWTH), self._map_size + 2 * self._pending_bytes)
        wanted = -(-wanted // _ALIGN) * _ALIGN
        self._reserve(wanted)  # blocks first: the map must never cover unallocated space
        _lmdb_call(self._env.set_mapsize, wanted)
        self._map_size = wanted

    def _reserve(self, size: int) -> None:
        if self._preallocate:
            os.posix_fallocate(self._fd, 0, size)

    def _write_metadata(self, meta: Metadata) -> None:
        self._pending.append((CHECKSUMS_KEY, self.checksum_array().tobytes()))  # sorts before META_KEY
        self._pending.append((META_KEY, meta.to_json().encode()))
        names = self.source_names_bytes()
        if names is not None:  # in the same transaction as META_KEY (it sorts after it)
            self._pending.append((SOURCES_KEY, names))
        self._flush()
        _lmdb_call(self._env.sync, True)
        used = (self._env.info()["last_pgno"] + 1) * self._env.stat()["psize"]
        self._env.close()
        os.ftruncate(self._fd, used)  # drop the preallocated tail: the pages in use are all LMDB reads
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
