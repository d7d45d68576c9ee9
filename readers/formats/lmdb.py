"""LMDB storage: one environment directory, one key per sample, metadata under ``__meta__``.

Layout (docs/FORMATS.md, "LMDB"): the key of sample ``i`` is ``b"%010d" % i``; its value is a
16-byte little-endian header (label int32, height uint32, width uint32, channels uint16,
reserved uint16) followed by the payload: raw planar pixels, or the encoded jpeg/png file.
``__crc32__`` holds every sample's checksum (``readers/checksums.py``), little-endian uint32s.
The writer, ``packer/writers/lmdb.py``, imports these constants; ``readers/lmdb.py`` wraps
:class:`LMDBStore` as a torch Dataset.
"""

from __future__ import annotations

import os
import struct
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator, Sequence

import lmdb
import numpy as np

from .._process import HandleCache, PerProcess, file_key, opened_key, replaced_error
from ..checksums import CHECKSUM_DTYPE
from .names import decode_source_names
from ..schema import IncompleteDatasetError, Metadata, PackedFormatError
from .base import Fault, Record, Store, dataset_path

__all__ = ["LMDBStore", "META_KEY", "CHECKSUMS_KEY", "SOURCES_KEY", "SAMPLE_HEADER", "DATA_FILE", "LOCK_FILE", "sample_key", "open_shared_env"]

META_KEY = b"__meta__"
#: Every sample's checksum, ``count`` little-endian uint32s (sorts before META_KEY: both are
#: appended at the end, in key order).
CHECKSUMS_KEY = b"__crc32__"
#: Every sample's source name (``readers/formats/names.py``): a JSON array; absent in datasets
#: written before names were recorded.
SOURCES_KEY = b"__sources__"
SAMPLE_HEADER = struct.Struct("<iIIHH")
DATA_FILE = "data.mdb"
LOCK_FILE = "lock.mdb"
#: Key of sample ``i``: zero-padded decimal, so keys sort in sample order.
KEY_FORMAT = b"%010d"
#: Threads that read a batch's values side by side once batches are found on disk (:class:`_ColdReads`).
PREFETCH_THREADS = 8
#: Records a pass over many indices reads (and, cold, reads ahead) at a time.
RECORDS_AT_ONCE = 256

try:
    import resource

    _RUSAGE_THREAD: int | None = getattr(resource, "RUSAGE_THREAD", None)  # Linux
except ImportError:  # pragma: no cover - Windows
    _RUSAGE_THREAD = None


def sample_key(index: int) -> bytes:
    """The LMDB key of sample ``index``."""
    return KEY_FORMAT % index


class LMDBStore(Store):
    """A packer LMDB, read-only.

    The environment opens without lock file or readahead, once per process, shared by every
    store over the same file (LMDB forbids opening one file twice in a process). A batch of
    indices is read in one transaction; batches whose values are on disk, not in the page cache,
    have them read side by side first (:class:`_ColdReads`).
    """

    format_name = "lmdb"
    own_names = frozenset({"data.mdb", "lock.mdb"})  # LMDB's own two files: packer writes nothing else there
    label = "LMDB"

    def __init__(self, path: str | Path, *, verify: bool | None = None) -> None:
        self._env = PerProcess(_EnvOpener(str(dataset_path(path))))  # (a file:// URL: its local path)
        super().__init__(path, verify=verify)

    @classmethod
    def mismatch(cls, path: Path) -> str | None:
        if not path.is_dir():
            return f"not an LMDB dataset (that is a folder holding {DATA_FILE}; this is a file)"
        if not (path / DATA_FILE).exists():
            return f"not an LMDB dataset (no {DATA_FILE} inside)"
        return None

    def _read_metadata(self) -> Metadata:
        with self._env.get().env.begin() as txn:
            raw = txn.get(META_KEY)
        if raw is None:
            raise IncompleteDatasetError(
                f"{self.path}: no {META_KEY.decode()} record: the conversion did not finish or this is "
                "not a packer LMDB; convert again"
            )
        return Metadata.from_json(raw, where=str(self.path)).expect_format("lmdb", where=str(self.path))

    def stored_checksums(self) -> np.ndarray | None:
        if not self.meta.checksum:
            return None
        with self._env.get().env.begin() as txn:
            raw = txn.get(CHECKSUMS_KEY)
        if raw is None or len(raw) != 4 * self.meta.count:
            size = "missing" if raw is None else f"{len(raw)} bytes"
            raise PackedFormatError(f"{self.path}: {CHECKSUMS_KEY.decode()} is {size}, expected {4 * self.meta.count} bytes")
        return np.frombuffer(raw, CHECKSUM_DTYPE)

    def source_names(self) -> list[str] | None:
        with self._env.get().env.begin() as txn:
            raw = txn.get(SOURCES_KEY)
        return None if raw is None else decode_source_names(raw, self.meta.count, where=f"{self.path} {SOURCES_KEY.decode()}")

    def _entries(self) -> tuple[int, int, bool]:
        """The environment's keys, how many packer wrote, and whether :data:`SOURCES_KEY` is one."""
        with self._env.get().env.begin() as txn:
            named = txn.get(SOURCES_KEY) is not None
        return self._env.get().env.stat()["entries"], self.meta.count + 1 + (1 if self.meta.checksum else 0) + named, named

    def foreign_content(self) -> list[str]:
        """Beside files in the folder, keys added after packer wrote it (more than it wrote)."""
        entries, expected, _named = self._entries()
        extra = entries - expected
        added = [f"{extra:,} LMDB key{'s' if extra != 1 else ''} packer did not write"] if extra > 0 else []
        return super().foreign_content() + added

    def structure_faults(self) -> Iterator[Fault]:
        """The environment holds exactly the sample keys, :data:`META_KEY`, (when checksums
        are recorded) :data:`CHECKSUMS_KEY` and (when present) :data:`SOURCES_KEY`: nothing left
        over, nothing missing."""
        entries, expected, named = self._entries()
        if entries != expected:
            extra = f", {CHECKSUMS_KEY.decode()}" if self.meta.checksum else ""
            extra += f", {SOURCES_KEY.decode()}" if named else ""
            yield "dataset", f"holds {entries:,} keys, expected {expected:,} ({self.meta.count:,} samples, {META_KEY.decode()}{extra})"

    def _records(self, indices: Sequence[int]) -> Iterator[Record]:
        header, key_format = SAMPLE_HEADER, KEY_FORMAT
        shared = self._env.get()
        with shared.env.begin(buffers=True) as txn:
            get = txn.get
            for first in range(0, len(indices), RECORDS_AT_ONCE):  # (a whole-dataset pass: a part at a time)
                part = indices[first:first + RECORDS_AT_ONCE]
                keys = [key_format % i for i in part]
                cold = shared.cold if len(keys) > 1 else None
                faults = cold.before(keys) if cold is not None else 0
                try:
                    for i, key in zip(part, keys):
                        value = get(key)
                        if value is None or len(value) < header.size:
                            raise PackedFormatError(f"{self.path}: sample {int(i)} is missing or truncated")
                        label, height, width, channels, _reserved = header.unpack_from(value)
                        yield label, (channels, height, width), value[header.size:]
                finally:  # (also when the reader stops early: the faults so far still count)
                    if cold is not None:
                        cold.after(faults, len(keys))

    def _fill_raw(self, indices: np.ndarray, out: np.ndarray, labels: np.ndarray) -> None:
        """A fixed-shape raw batch in one transaction, each value's pixels copied as one flat row
        straight into ``out`` (no per-sample array views); every header is still checked against
        the dataset's shape."""
        if not out.flags.c_contiguous:
            return super()._fill_raw(indices, out, labels)
        channels, height, width = self.meta.shape  # type: ignore[misc]
        nbytes = channels * height * width
        flat = out.reshape(len(indices), nbytes)
        header, key_format, size = SAMPLE_HEADER, KEY_FORMAT, SAMPLE_HEADER.size + nbytes
        shared, order = self._env.get(), indices.tolist()
        keys = [key_format % i for i in order]
        faults = shared.cold.before(keys)
        with shared.env.begin(buffers=True) as txn:
            get = txn.get
            for j, (i, key) in enumerate(zip(order, keys)):
                value = get(key)
                if value is None or len(value) < header.size:
                    raise PackedFormatError(f"{self.path}: sample {i} is missing or truncated")
                label, h, w, c, _reserved = header.unpack_from(value)
                if (c, h, w) != (channels, height, width) or len(value) != size:
                    self.raw_view(value[header.size :], (c, h, w), i)  # raises if the bytes do not fill the header's shape
                    raise PackedFormatError(f"{self.path}: sample {i} is {c}x{h}x{w}, expected {channels}x{height}x{width}: the file is corrupt")
                labels[j] = label
                flat[j] = np.frombuffer(value, np.uint8, nbytes, header.size)
        shared.cold.after(faults, len(order))


class _EnvOpener:
    """Picklable opener: the shared read-only environment of one path."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.key = opened_key(os.path.join(path, DATA_FILE))  # (the dataset this store reads: checked as each process opens it)

    def __call__(self) -> "_SharedEnv":
        return open_shared_env(self.path, self.key)


class _ColdReads:
    """Whether this process's batches find their values on disk, and the threads that then
    read each batch's values side by side before the batch is read.

    py-lmdb's ``get`` touches every page of a value before it returns, one after another (so
    that a copy later does not fault while holding the GIL), and the map is opened without
    read-ahead (a dataset larger than the memory, read in random order, would otherwise read
    neighbours for nothing). So a value not in the page cache costs one wait on the disk per
    page, a 224px raw sample 37, and a batch's values are read one after another. When a batch
    took major page faults (more than one for every two values: :meth:`after`, counted for the
    reading thread), the next batches first have their values read by
    :data:`PREFETCH_THREADS` threads, each a contiguous share in its own read transaction, so
    the disk has that many requests at once; the batch then finds them in memory. Once the
    threads fault no more (the dataset is cached by now), they are left alone until a batch
    faults again. Where the faults cannot be counted (not Linux), nothing changes.
    """

    def __init__(self, env: lmdb.Environment) -> None:
        self.env = env
        self.on = False

    def before(self, keys: list[bytes]) -> int:
        """Read ``keys``' values side by side if batches are found on disk; the reading thread's
        major faults so far (for :meth:`after`). The threads last one batch: none is left
        running between reads (a DataLoader forking its workers then forks no thread)."""
        if _RUSAGE_THREAD is None:
            return 0
        if self.on and len(keys) > 1:
            shares = min(PREFETCH_THREADS, len(keys))
            ordered = sorted(keys)
            step = -(-len(ordered) // shares)
            parts = [ordered[k:k + step] for k in range(0, len(ordered), step)]
            with ThreadPoolExecutor(len(parts), thread_name_prefix="readers-lmdb-prefetch") as threads:
                faults = sum(threads.map(self._read, parts))
            if faults <= len(keys) // 2:
                self.on = False
        return _major_faults()

    def after(self, before: int, count: int) -> None:
        """A batch of ``count`` values was read, the reading thread's faults ``before`` it as given."""
        if _RUSAGE_THREAD is not None and not self.on and _major_faults() - before > count // 2:
            self.on = True

    def _read(self, keys: list[bytes]) -> int:
        """Bring ``keys``' values into memory; this thread's major faults doing so."""
        start = _major_faults()
        with self.env.begin(buffers=True) as txn:
            get = txn.get
            for key in keys:
                get(key)
        return _major_faults() - start


def _major_faults() -> int:
    """The calling thread's major page faults so far (Linux)."""
    return resource.getrusage(_RUSAGE_THREAD).ru_majflt  # type: ignore[arg-type]


class _SharedEnv:
    """One open environment of this process; closed when the last dataset lets go of it."""

    def __init__(self, env: lmdb.Environment) -> None:
        self.env = env
        self.pid = os.getpid()
        self.cold = _ColdReads(env)

    def close(self) -> None:
        try:
            self.env.close()
        except lmdb.Error:  # pragma: no cover - already closed
            pass

    def __del__(self) -> None:
        self.close()


_handles: HandleCache[_SharedEnv] = HandleCache()


def _refuse_truncated(env: lmdb.Environment, path: str) -> None:
    """Close ``env`` and raise :class:`IncompleteDatasetError` when its file is shorter than the
    pages its meta page says are in use (a copy cut short): reading past the file's end through
    the map would kill the process with SIGBUS. The meta pages, at the start, are read safely."""
    try:
        used = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
        size = os.path.getsize(os.path.join(path, DATA_FILE))
    except (lmdb.Error, OSError) as exc:
        env.close()
        raise PackedFormatError(f"{path}: cannot open as LMDB ({exc})") from None
    if size < used:
        env.close()
        raise IncompleteDatasetError(f"{path}: truncated: {DATA_FILE} has {size:,} bytes but its pages in use end at {used:,}; "
                                     "the copy or conversion did not finish: copy or convert it again")


def open_shared_env(path: str, expected: tuple[int, ...] | None = None) -> _SharedEnv:
    """The read-only environment of ``path`` for this process, opened once; ``expected``: the
    :func:`~readers._process.opened_key` of its file when a store first opened it (another is refused).

    An environment inherited through fork is closed (in this process only: with lock=False,
    that unmaps our copy and closes our file descriptor) and opened afresh.
    """
    try:
        key = file_key(os.path.join(path, DATA_FILE))
    except (FileNotFoundError, NotADirectoryError):
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path}: no such LMDB dataset") from None
        raise PackedFormatError(f"{path}: not an LMDB dataset (no {DATA_FILE} inside)") from None
    if expected is not None and key != expected:
        raise replaced_error(path)

    def open_env() -> _SharedEnv:
        try:
            env = lmdb.open(path, readonly=True, lock=False, readahead=False, meminit=False, subdir=True, max_readers=1024)
        except lmdb.Error as exc:
            hint = "; py-lmdb opens a path once per process: close the other lmdb environment on it first" if "already open" in str(exc) else ""
            raise PackedFormatError(f"{path}: cannot open as LMDB ({exc}){hint}") from None
        _refuse_truncated(env, path)
        return _SharedEnv(env)

    return _handles.get(key, open_env)
