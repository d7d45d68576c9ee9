"""Write a packer LMDB (layout owned by ``readers/formats/lmdb.py``).

Samples are appended in large write transactions (keys are increasing, so ``append=True``
skips B-tree searches); the memory map starts from an estimate and doubles whenever it fills.
"""

from __future__ import annotations

import os

import lmdb

from readers.formats.lmdb import LOCK_FILE, META_KEY, SAMPLE_HEADER, sample_key
from readers.schema import Metadata

from ..preprocess.task import Encoded
from .base import Writer

__all__ = ["LMDBWriter"]

INITIAL_MAP_SIZE = 256 << 20
TRANSACTION_BYTES = 64 << 20


class LMDBWriter(Writer):
    format_name = "lmdb"
    is_directory = True

    def _open(self) -> None:
        self._pending: list[tuple[bytes, bytes]] = []
        self._pending_bytes = 0
        options = {"lib_version": 0} if int(lmdb.__version__.split(".")[0]) >= 3 else {}  # readable by any py-lmdb
        self._env = _lmdb_call(
            lmdb.open,
            str(self.tmp),
            map_size=INITIAL_MAP_SIZE,
            subdir=True,
            sync=False,
            metasync=False,
            meminit=False,
            max_dbs=0,
            **options,
        )

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
                self._env.set_mapsize(max(2 * self._env.info()["map_size"], 2 * self._pending_bytes))
            except lmdb.Error as exc:
                raise _as_os_error(exc) from None
        self._pending.clear()
        self._pending_bytes = 0

    def _write_metadata(self, meta: Metadata) -> None:
        self._pending.append((META_KEY, meta.to_json().encode()))
        self._flush()
        _lmdb_call(self._env.sync, True)
        self._env.close()
        lock = self.tmp / LOCK_FILE  # readers open with lock=False: the lock file is not part of the data
        if lock.exists():
            os.unlink(lock)

    def _close(self) -> None:
        env = getattr(self, "_env", None)
        if env is not None:
            env.close()


def _as_os_error(exc: lmdb.Error) -> OSError:
    code = getattr(exc, "code", 0) or 0
    return OSError(code, os.strerror(code) if code > 0 else str(exc))


def _lmdb_call(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except lmdb.Error as exc:
        raise _as_os_error(exc) from None
