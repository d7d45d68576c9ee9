"""The RAM-resident blob: one file, a fixed header, then page-aligned numpy-described sections.

Layout (docs/FORMATS.md, "RAM-resident blob"). The first :data:`ALIGNMENT` bytes are the header
page: :data:`HEADER` (little-endian ``<8sIIQ12Q``: magic, format version, alignment, sample
count, then offset and length in bytes of six sections), zero-padded. The sections follow, each
starting on a multiple of :data:`ALIGNMENT`:

* ``data``: the samples' payloads back to back. For fixed-shape ``raw`` storage this is exactly
  one C-contiguous uint8 array ``(N, C, H, W)``, so ``np.memmap`` maps it directly.
* ``labels``: ``(N,)`` little-endian int64.
* ``offsets``: ``(N + 1,)`` int64 byte offsets of each payload within ``data`` (empty for
  fixed-shape raw storage: sample ``i`` starts at ``i * C * H * W``).
* ``shapes``: ``(N, 3)`` int64 ``(C, H, W)`` of each sample (empty for fixed-shape raw storage).
* ``checksums``: ``(N,)`` little-endian uint32, each sample's checksum (``readers/checksums.py``;
  empty when the metadata records no ``checksum``).
* ``metadata``: the UTF-8 JSON record (:class:`readers.schema.Metadata`).
* ``sources`` (optional, after ``metadata``): each sample's source name, a JSON array
  (``readers/formats/names.py``). Its (offset, length) pair follows :data:`HEADER` in the
  header page (:data:`SOURCES_HEADER`); zeros, as in blobs written before it, mean none.

The writer (``packer/writers/blob.py``, which imports these constants) writes the header page
as zeros first and fills it in *last*, after everything else is on disk: a file without the
magic is an unfinished conversion. ``readers/blob.py`` wraps :class:`BlobStore` as a torch
Dataset.

Holding the bytes: a store either maps the file (``in_memory=False``; the page cache is shared
by every process) or copies it once into anonymous shared memory (``in_memory=True``, a Linux
``memfd``): a forked DataLoader worker inherits that mapping, and a spawned one receives its
file descriptor (``multiprocessing``'s ``DupFd``) when the dataset is pickled by
``multiprocessing``'s ``ForkingPickler``, so the pixels exist once in RAM however many workers
read them (``readers/formats/blob_memory.py``). A plain ``pickle.dumps`` carries only the path:
the receiving process loads its own copy on first use.

A blob at a URL is read by ranges (``readers/formats/remote_blob.py``) through the functions here
that parse its sections from any :data:`RangeReader`: :func:`read_blob_metadata`,
:func:`blob_index`, :func:`blob_checksums`, :func:`blob_source_names`.
"""

from __future__ import annotations

import mmap
import os
import struct
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from .._process import PerProcess, check_unreplaced, opened_key, replaced_error, rerunning_parent_script
from ..checksums import CHECKSUM_DTYPE
from ..schema import FORMAT_VERSION, IncompleteDatasetError, Metadata, PackedFormatError, UnsupportedVersionError
from .base import Record, Store, magic_mismatch
from .blob_memory import MemoryCopy, shared_copy
from .names import decode_source_names

__all__ = [
    "BlobStore",
    "BlobHeader",
    "MemoryCopy",
    "shared_copy",
    "MAGIC",
    "HEADER",
    "ALIGNMENT",
    "SECTIONS",
    "SOURCES_HEADER",
    "LABEL_DTYPE",
    "OFFSET_DTYPE",
    "SHAPE_DTYPE",
    "align",
    "RangeReader",
    "read_blob_metadata",
    "blob_checksums",
    "blob_source_names",
    "blob_index",
]

#: First bytes of a finished blob (written last).
MAGIC = b"PACKBLOB"
#: The header: magic, format version (uint32), alignment (uint32), count (uint64), then an
#: (offset, length) uint64 pair per section, in :data:`SECTIONS` order. Little-endian.
HEADER = struct.Struct("<8sIIQ12Q")
#: Sections start on multiples of this; the header page is this long, so data starts here.
ALIGNMENT = 4096
#: Section names, in header and file order.
SECTIONS = ("data", "labels", "offsets", "shapes", "checksums", "metadata")
#: The optional ``sources`` section's (offset, length), uint64 little-endian, right after
#: :data:`HEADER` (readers that predate it never look there; the header page is zero-padded).
SOURCES_HEADER = struct.Struct("<QQ")
LABEL_DTYPE = np.dtype("<i8")
OFFSET_DTYPE = np.dtype("<i8")
SHAPE_DTYPE = np.dtype("<i8")


def align(position: int) -> int:
    """``position`` rounded up to the next multiple of :data:`ALIGNMENT`."""
    return -(-position // ALIGNMENT) * ALIGNMENT


@dataclass(frozen=True)
class BlobHeader:
    """The parsed header: version, alignment, count, ``{section: (offset, length)}`` and the
    optional ``sources`` section's (offset, length) (:data:`SOURCES_HEADER`; ``(0, 0)``: none)."""

    version: int
    alignment: int
    count: int
    sections: dict[str, tuple[int, int]]
    sources: tuple[int, int] = (0, 0)

    def pack(self) -> bytes:
        """The header bytes (:data:`HEADER`, then :data:`SOURCES_HEADER`), as written at offset 0."""
        pairs = [v for name in SECTIONS for v in self.sections[name]]
        return HEADER.pack(MAGIC, self.version, self.alignment, self.count, *pairs) + SOURCES_HEADER.pack(*self.sources)

    @property
    def end(self) -> int:
        """Where the last section ends: the file is at least this long."""
        return max(offset + length for offset, length in [*self.sections.values(), self.sources])

    @classmethod
    def unpack(cls, raw: bytes, *, where: str, file_size: int) -> "BlobHeader":
        """Parse and check the header bytes of a file of ``file_size`` bytes."""
        if len(raw) < HEADER.size or raw[: len(MAGIC)] == bytes(len(MAGIC)):
            raise IncompleteDatasetError(
                f"{where}: no blob header: the conversion did not finish (the header is written last); convert again"
            )
        magic, version, alignment, count, *pairs = HEADER.unpack_from(raw)
        if magic != MAGIC:
            raise PackedFormatError(f"{where}: not a packer blob (starts with {magic!r}, expected {MAGIC!r})")
        if version > FORMAT_VERSION:
            raise UnsupportedVersionError(
                f"{where} uses packer format version {version}, but this reader understands up to "
                f"version {FORMAT_VERSION}: update packer (git pull in its checkout, then pip install -e .)"
            )
        sections = {name: (pairs[2 * k], pairs[2 * k + 1]) for k, name in enumerate(SECTIONS)}
        sources = SOURCES_HEADER.unpack_from(raw, HEADER.size) if len(raw) >= HEADER.size + SOURCES_HEADER.size else (0, 0)
        header = cls(version, alignment, count, sections, tuple(sources))
        if header.end > file_size:
            raise IncompleteDatasetError(
                f"{where}: truncated: it has {file_size:,} bytes but its header describes {header.end:,}; "
                "the copy or conversion did not finish: copy or convert it again"
            )
        return header


class BlobStore(Store):
    """A packer blob, read-only: mapped from the file, or copied once into shared memory.

    ``in_memory=True`` loads the whole file into RAM now (in this process) and shares that copy
    with DataLoader workers (fork: inherited; spawn: its descriptor is sent). Stores over the
    same unchanged file in one process share one copy. Made at the module level of a script that
    a spawned or forkserver child runs again (as ``__mp_main__``), it loads on first use, or just
    before that child forks, instead: the child reads the copy its parent sent, and N workers
    would otherwise load N copies. ``in_memory=False`` (the default here;
    :class:`readers.RAMDataset` defaults to loading) maps the file lazily, once per process.
    """

    format_name = "blob"
    label = "blob"

    def __init__(self, path: str | Path, *, in_memory: bool = False, verify: bool | None = None) -> None:
        self.in_memory = in_memory
        self.header: BlobHeader | None = None
        super().__init__(path, verify=verify)
        source: Callable[[], np.ndarray] = shared_copy(str(self.path)) if in_memory else _MapFile(str(self.path))
        self._view = PerProcess(_Opener(str(self.path), self.header, self.meta, source))  # type: ignore[arg-type]
        if in_memory and rerunning_parent_script():
            _load_before_fork(self)  # not now: a spawned worker reads the copy its parent sent
        elif in_memory:
            self._view.get()  # load here, before workers start, so they share this copy

    @classmethod
    def mismatch(cls, path: Path) -> str | None:
        if not path.is_file():
            return "not a blob (a blob is a single file)"
        if path.suffix == ".blob":  # an unfinished one too, so it gets a clear "incomplete" error
            return None
        return magic_mismatch(path, MAGIC, "a readable blob", "a packer blob")

    def _read_metadata(self) -> Metadata:
        where = str(self.path)
        if not self.path.is_file():
            raise PackedFormatError(f"{where}: not a blob (a blob is a single file)")
        with open(self.path, "rb") as handle:
            self.header, meta = read_blob_metadata(_reader(handle), os.fstat(handle.fileno()).st_size, where)
        return meta

    def _read_range(self, offset: int, length: int) -> bytes:
        with open(self.path, "rb") as handle:
            return _reader(handle)(offset, length)

    def _records(self, indices: Sequence[int]) -> Iterator[Record]:
        view = self._view.get()
        if view.images is not None:
            shape, flat, labels = self.meta.shape, view.flat, view.labels
            for i in indices:
                yield int(labels[i]), shape, flat[i]  # type: ignore[misc]
            return
        data, offsets, shapes, labels = view.data, view.offsets, view.shapes, view.labels
        for i in indices:
            c, h, w = shapes[i]
            yield int(labels[i]), (int(c), int(h), int(w)), data[offsets[i] : offsets[i + 1]]

    def _payload_offsets(self) -> np.ndarray:
        view = self._view.get()
        if view.images is not None:  # fixed-shape raw: sample i starts at i * C * H * W
            return np.arange(self.meta.count + 1, dtype=np.int64) * int(self.meta.sample_nbytes or 0)
        return view.offsets

    def _read_stream(self, start: int, stop: int, out: np.ndarray) -> None:
        """The ``data`` section is the payload stream: one slice."""
        out[...] = self._view.get().data[start:stop]

    def stored_checksums(self) -> np.ndarray | None:
        return blob_checksums(self.header, self.meta, self._read_range)  # type: ignore[arg-type]

    def source_names(self) -> list[str] | None:
        return blob_source_names(self.header, self.meta, self._read_range, str(self.path))  # type: ignore[arg-type]

    has_pixel_arrays = True

    def pixel_arrays(self) -> tuple[np.ndarray, np.ndarray] | None:
        """This process's (N, C, H, W) pixel array and (N,) labels, straight over the file's bytes
        (for a device-side gather, ``readers.device_gather``); ``None`` unless fixed-shape raw, and
        when ``verify`` is on (a device gather would bypass the checks: batches go through the host)."""
        view = self._view.get()
        return None if view.images is None or self.verify else (view.images, view.labels)

    def _fill_raw(self, indices: np.ndarray, out: np.ndarray, labels: np.ndarray) -> None:
        """One gather: ``np.take`` of the (N, C, H, W) array straight into ``out``."""
        view = self._view.get()
        if view.images is None:  # pragma: no cover - fixed-shape raw blobs always have images
            super()._fill_raw(indices, out, labels)
            return
        np.take(view.images, indices, axis=0, out=out, mode="clip")  # indices are checked already
        np.take(view.labels, indices, out=labels, mode="clip")


#: Reads ``length`` bytes of a blob at ``offset`` (from a local file, or a URL's ranged reads).
RangeReader = Callable[[int, int], bytes]


def _reader(handle) -> RangeReader:
    """A :data:`RangeReader` of the open file ``handle``."""
    def read(offset: int, length: int) -> bytes:
        handle.seek(offset)
        return handle.read(length)

    return read


def read_blob_metadata(read: RangeReader, size: int, where: str) -> tuple[BlobHeader, Metadata]:
    """The checked header and metadata record of the blob of ``size`` bytes that ``read`` reads
    (``where`` names it in errors): its header page and metadata section only."""
    header = BlobHeader.unpack(read(0, HEADER.size + SOURCES_HEADER.size), where=where, file_size=size)
    meta_offset, meta_length = header.sections["metadata"]
    if meta_length == 0:
        raise IncompleteDatasetError(f"{where}: no metadata record: the conversion did not finish; convert again")
    meta = Metadata.from_json(read(meta_offset, meta_length), where=where).expect_format("blob", where=where)
    _check_sections(header, meta, where)
    return header, meta


def blob_checksums(header: BlobHeader, meta: Metadata, read: RangeReader) -> np.ndarray | None:
    """The stored per-sample checksums (``None``: the metadata records none)."""
    if not meta.checksum:
        return None
    return np.frombuffer(read(*header.sections["checksums"]), CHECKSUM_DTYPE)  # length checked against the count on open


def blob_source_names(header: BlobHeader, meta: Metadata, read: RangeReader, where: str) -> list[str] | None:
    """Each sample's source name (``None``: the blob has no ``sources`` section)."""
    offset, length = header.sources
    return None if length == 0 else decode_source_names(read(offset, length), meta.count, where=f"{where} (sources)")


def blob_index(header: BlobHeader, meta: Metadata, read: RangeReader) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(labels (N,), offsets (N + 1,) of each payload in the data section, shapes (N, 3))``,
    read from their sections (made from the metadata for fixed-shape raw storage, which stores
    neither offsets nor shapes)."""
    def section(name: str, dtype: np.dtype) -> np.ndarray:
        return np.frombuffer(read(*header.sections[name]), dtype)

    labels = section("labels", LABEL_DTYPE)
    if meta.fixed_shape and meta.encoding == "raw":
        offsets = np.arange(meta.count + 1, dtype=np.int64) * int(meta.sample_nbytes or 0)
        return labels, offsets, np.tile(np.asarray(meta.shape, np.int64), (meta.count, 1))
    return labels, section("offsets", OFFSET_DTYPE), section("shapes", SHAPE_DTYPE).reshape(-1, 3)


def _check_sections(header: BlobHeader, meta: Metadata, where: str) -> None:
    """The header's sections agree with the metadata record."""
    n = meta.count
    if header.count != n:
        raise PackedFormatError(f"{where}: header says {header.count} samples, metadata says {n}: the file is corrupt")
    expected = {"labels": n * LABEL_DTYPE.itemsize, "checksums": n * CHECKSUM_DTYPE.itemsize if meta.checksum else 0}
    if meta.fixed_shape and meta.encoding == "raw":
        expected.update(data=n * meta.sample_nbytes, offsets=0, shapes=0)  # type: ignore[operator]
    else:
        expected.update(offsets=(n + 1) * OFFSET_DTYPE.itemsize, shapes=3 * n * SHAPE_DTYPE.itemsize)
    for name, length in expected.items():
        if header.sections[name][1] != length:
            raise PackedFormatError(
                f"{where}: section {name!r} has {header.sections[name][1]:,} bytes, expected {length:,}: the file is corrupt"
            )


@dataclass
class _View:
    """This process's numpy views of one blob's sections."""

    flat: np.ndarray  # (N, C*H*W) for fixed-shape raw, else unused
    images: np.ndarray | None  # (N, C, H, W) for fixed-shape raw storage
    data: np.ndarray
    labels: np.ndarray
    offsets: np.ndarray
    shapes: np.ndarray


@dataclass(frozen=True)
class _Opener:
    """Picklable: the section views over the bytes ``source()`` returns (the whole file)."""

    path: str
    header: BlobHeader
    meta: Metadata
    source: Callable[[], np.ndarray]

    def __call__(self) -> _View:
        buffer = self.source()
        if len(buffer) < self.header.end or bytes(buffer[: HEADER.size + SOURCES_HEADER.size]) != self.header.pack():
            raise replaced_error(self.path)  # (a copy loaded afresh: its header is another dataset's)

        def section(name: str, dtype: np.dtype) -> np.ndarray:
            offset, length = self.header.sections[name]
            return buffer[offset : offset + length].view(dtype)

        data = section("data", np.dtype(np.uint8))
        labels = section("labels", LABEL_DTYPE)
        offsets = section("offsets", OFFSET_DTYPE)
        shapes = section("shapes", SHAPE_DTYPE).reshape(-1, 3)
        images = flat = None
        if self.meta.fixed_shape and self.meta.encoding == "raw":
            images = data.reshape(self.meta.count, *self.meta.shape)  # type: ignore[misc]
            flat = data.reshape(self.meta.count, -1)
        return _View(flat, images, data, labels, offsets, shapes)  # type: ignore[arg-type]


def _load_before_fork(store: BlobStore) -> None:
    """Load ``store``'s in-memory copy just before this process forks, if it is still alive and
    unloaded: made at the module level of a re-run script (a ``torch.multiprocessing.spawn``
    rank, say), it is not loaded at once, and that rank's forked DataLoader workers must still
    inherit one copy instead of loading one each."""
    ref = weakref.ref(store)

    def before() -> None:
        alive = ref()
        if alive is not None:
            alive._view.get()

    os.register_at_fork(before=before)


class _MapFile:
    """Picklable: the file mapped read-only (pages come from, and stay in, the page cache)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.key = opened_key(path)  # (the dataset this store reads: checked as each process maps it)

    def __call__(self) -> np.ndarray:
        with open(self.path, "rb") as handle:
            check_unreplaced(self.path, self.key, self.path)
            mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        return np.frombuffer(mapped, np.uint8)
