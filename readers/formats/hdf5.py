"""HDF5 storage: one file, samples in one or two datasets, metadata as a file attribute.

Layout (docs/FORMATS.md, "HDF5"). Two layouts; which one a file uses is told by the datasets it
holds:

* *fixed*, raw samples that all share one shape: ``images`` uint8 ``(N, C, H, W)`` (planar, as
  every packer format), chunked one sample per chunk.
* *flat*, variable shapes or jpeg/png payloads: every payload back to back in one uint8
  dataset ``payload``; sample ``i`` is ``payload[offsets[i]:offsets[i + 1]]`` and has shape
  ``shapes[i]`` (C, H, W).

Both have ``labels`` int64 ``(N,)`` (-1 when unlabeled), ``crc32`` uint32 ``(N,)`` (each sample's
checksum, ``readers/checksums.py``) and the metadata record, JSON, as the
file attribute ``packer_metadata``, written last. The writer, ``packer/writers/hdf5.py``,
imports these constants; ``readers/hdf5.py`` wraps :class:`HDF5Store` as a torch Dataset.

Every h5py call holds one process-wide lock, so threads reading through h5py take turns. The
fixed layout's pixels, when uncompressed, are therefore read without h5py: each sample's byte
offset in the file is looked up once per process in HDF5's chunk index, and batches are copied
straight out of a read-only memory map of the file (:class:`MappedRows`), in parallel threads.
"""

from __future__ import annotations

import math
import os
import threading
from pathlib import Path
from typing import Iterator, Sequence

import h5py
import numpy as np

from .._process import HandleCache, PerProcess, file_key, opened_key, replaced_error
from ..schema import IncompleteDatasetError, Metadata, PackedFormatError
from .base import Record, Store, dataset_path, magic_mismatch
from .hdf5_rows import H5_ERRORS, MappedRows
from .names import decode_source_names

__all__ = ["HDF5Store", "META_ATTR", "IMAGES", "LABELS", "PAYLOAD", "OFFSETS", "SHAPES", "CHECKSUMS", "SOURCES", "SIGNATURE", "open_shared_file"]

#: File attribute holding the metadata record (UTF-8 JSON string), written last.
META_ATTR = "packer_metadata"
#: Fixed layout: uint8 (N, C, H, W), one sample per chunk.
IMAGES = "images"
#: int64 (N,): the label of every sample, -1 when unlabeled.
LABELS = "labels"
#: Flat layout: uint8 (total bytes,), every payload back to back.
PAYLOAD = "payload"
#: Flat layout: int64 (N + 1,): sample i is payload[offsets[i]:offsets[i + 1]].
OFFSETS = "offsets"
#: Flat layout: int64 (N, 3): the (C, H, W) shape of every sample.
SHAPES = "shapes"
#: uint32 (N,): every sample's checksum (readers/checksums.py).
CHECKSUMS = "crc32"
#: uint8 (bytes,): every sample's source name, a JSON array (readers/formats/names.py); optional.
SOURCES = "sources"
#: The first 8 bytes of an HDF5 file (packer writes no user block, so it is at offset 0).
SIGNATURE = b"\x89HDF\r\n\x1a\n"



class HDF5Store(Store):
    """A packer HDF5 file, read-only.

    The file opens lazily, once per process, read-only, and is shared by every store over the
    same file. It opens with HDF5's default locking ("best effort": a shared read lock, which
    any number of readers hold together, and no error where the filesystem cannot lock), not
    ``locking=False``: HDF5 refuses to open a file twice in one process with different locking
    flags, so ``locking=False`` would break every plain ``h5py.File(path)`` beside the dataset.
    Labels and the flat layout's offsets and shapes are read into memory on open; pixels are
    read on demand.

    Uncompressed fixed-layout pixels are copied straight out of a read-only memory map of the
    file, at offsets found once per process in HDF5's chunk index (on the first pixel read):
    no h5py call, so threads read in parallel (:attr:`serial_reads` is False). Anything else
    (compression, the flat layout, an HDF5 too old to list chunks quickly) is read through h5py:
    a raw batch chunk-wise in increasing index order (contiguous runs as one read) straight into
    the batch array.
    """

    format_name = "hdf5"
    label = "HDF5"

    def __init__(self, path: str | Path, *, verify: bool | None = None) -> None:
        self._file = PerProcess(_FileOpener(str(dataset_path(path))))  # (a file:// URL: its local path)
        super().__init__(path, verify=verify)

    @classmethod
    def mismatch(cls, path: Path) -> str | None:
        if not path.is_file():
            return "not an HDF5 file (this is a folder)"
        return magic_mismatch(path, SIGNATURE, "a readable HDF5 file", "an HDF5 file")

    def _read_metadata(self) -> Metadata:
        shared = self._file.get()
        raw = shared.meta_text
        if raw is None:
            raise IncompleteDatasetError(
                f"{self.path}: no {META_ATTR} attribute: the conversion did not finish or this is not a "
                "packer HDF5 file; convert again"
            )
        meta = Metadata.from_json(raw, where=str(self.path)).expect_format("hdf5", where=str(self.path))
        shared.check(meta)
        return meta

    @property
    def serial_reads(self) -> bool:
        """Whether pixel reads go through h5py, whose calls all hold one process-wide lock (so a
        second reading thread only adds contention: ``readers.Loader`` then uses one); False when
        raw samples are copied straight out of the mapped file."""
        shared = self._file.get()
        return shared.images is None or shared.mapped() is None

    def stored_checksums(self) -> np.ndarray | None:
        if not self.meta.checksum:
            return None
        file = self._file.get().file
        try:
            values = file[CHECKSUMS][()]
        except H5_ERRORS as exc:
            raise PackedFormatError(f"{self.path}: cannot read the {CHECKSUMS} dataset ({exc})") from None
        if values.shape != (self.meta.count,):
            raise PackedFormatError(f"{self.path}: {CHECKSUMS} has shape {values.shape}, expected ({self.meta.count},)")
        return values.astype(np.uint32, copy=False)

    def source_names(self) -> list[str] | None:
        file = self._file.get().file
        if SOURCES not in file:
            return None
        return decode_source_names(file[SOURCES][()].tobytes(), self.meta.count, where=f"{self.path} {SOURCES}")

    def foreign_content(self) -> list[str]:
        """Datasets, groups and attributes added to the file after packer wrote it (h5py makes
        that easy: a user's embeddings or notes kept beside the samples)."""
        file = self._file.get().file
        own = {IMAGES, LABELS, PAYLOAD, OFFSETS, SHAPES, CHECKSUMS, SOURCES}
        kinds = {h5py.SoftLink: "link", h5py.ExternalLink: "external link"}  # (not followed: one may lead nowhere)
        found = [f"{kinds.get(type(link)) or ('group' if isinstance(file[name], h5py.Group) else 'dataset')} {name!r}"
                 for name in file if name not in own for link in [file.get(name, getlink=True)]]
        found += [f"attribute {name!r}" for name in file.attrs if name != META_ATTR]
        found += [f"attribute {name!r} of {member!r}" for member in own & set(file) for name in file[member].attrs]
        return sorted(found)

    def _records(self, indices: Sequence[int]) -> Iterator[Record]:
        shared = self._file.get()
        labels = shared.labels
        if shared.images is not None:
            shape = tuple(shared.images.shape[1:])
            for i in indices:
                row = np.empty(shape, np.uint8)
                shared.read_rows(int(i), int(i) + 1, row[np.newaxis])
                yield int(labels[i]), shape, memoryview(row).cast("B")
            return
        offsets, shapes = shared.offsets, shared.shapes
        for i in indices:
            start, stop = int(offsets[i]), int(offsets[i + 1])
            payload = np.empty(stop - start, np.uint8)
            shared.read_payload(start, stop, payload)
            c, h, w = (int(d) for d in shapes[i])
            yield int(labels[i]), (c, h, w), memoryview(payload)

    def _payload_offsets(self) -> np.ndarray:
        shared = self._file.get()  # fixed layout: every sample has the same size
        return shared.offsets if shared.images is None else np.arange(self.meta.count + 1) * math.prod(shared.images.shape[1:])

    def _read_stream(self, start: int, stop: int, out: np.ndarray) -> None:
        """The flat layout's ``payload`` dataset is the payload stream: one ranged read."""
        if self._file.get().images is not None:
            return super()._read_stream(start, stop, out)
        self._file.get().read_payload(start, stop, out)

    def _fill_raw(self, indices: np.ndarray, out: np.ndarray, labels: np.ndarray) -> None:
        shared = self._file.get()
        if shared.images is None:  # raw samples of one shape in the flat layout: valid, if unusual
            return super()._fill_raw(indices, out, labels)
        labels[:] = shared.labels[indices]
        if not len(indices):
            return
        mapped = shared.mapped()
        if mapped is not None:
            mapped.fill(indices, out)
            return
        target = out if out.flags.c_contiguous else np.empty(out.shape, np.uint8)
        # Visit indices in increasing order (HDF5 reads forward through the file); a run of
        # consecutive indices that also lands in consecutive batch slots is one read.
        order = np.argsort(indices, kind="stable")
        ordered = indices[order]
        repeat = np.zeros(len(ordered), bool)
        repeat[1:] = ordered[1:] == ordered[:-1]
        first, slot = ordered[~repeat], order[~repeat]
        breaks = np.flatnonzero((np.diff(first) != 1) | (np.diff(slot) != 1)) + 1
        starts = np.concatenate(([0], breaks)).tolist()
        stops = np.concatenate((breaks, [len(first)])).tolist()
        for a, b in zip(starts, stops):
            i, j = int(first[a]), int(slot[a])
            shared.read_rows(i, i + b - a, target[j : j + b - a])
        for k in np.flatnonzero(repeat).tolist():  # a repeated index: copy its first read
            target[order[k]] = target[order[k - 1]]
        if target is not out:
            out[...] = target


class _FileOpener:
    """Picklable opener: the shared read-only file of one path."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.key = opened_key(path)  # (the dataset this store reads: checked as each process opens it)

    def __call__(self) -> "_SharedFile":
        return open_shared_file(self.path, self.key)


class _SharedFile:
    """One open HDF5 file of this process, its datasets, and its small arrays in memory."""

    def __init__(self, path: str, file: h5py.File) -> None:
        self.path = path
        self.file = file
        self.pid = os.getpid()
        self.images: h5py.Dataset | None = None
        self.payload: h5py.Dataset | None = None
        self.direct_chunks = False  # images: uncompressed, one sample per chunk
        self._mapped: MappedRows | None = None
        self._mapped_known = False
        self._map_lock = threading.Lock()
        self.offsets = self.shapes = self.labels = np.empty(0, np.int64)
        try:
            text = file.attrs.get(META_ATTR)
            self.meta_text: str | bytes | None = text if isinstance(text, (str, bytes)) else None
            if self.meta_text is None:
                return
            self.labels = file[LABELS][()]
            if IMAGES in file:
                self.images = images = file[IMAGES]
                self.direct_chunks = (
                    images.chunks == (1, *images.shape[1:]) and images.id.get_create_plist().get_nfilters() == 0
                )
            else:
                self.payload = file[PAYLOAD]
                self.offsets = file[OFFSETS][()]
                self.shapes = file[SHAPES][()]
        except H5_ERRORS as exc:
            raise PackedFormatError(f"{path}: not a readable packer HDF5 file ({' '.join(str(exc).split())}); convert again") from None

    def check(self, meta: Metadata) -> None:
        """Raise unless the datasets agree with the metadata record (count, shapes, layout)."""
        n = meta.count
        problems = []
        if self.labels.shape != (n,):
            problems.append(f"{LABELS} has shape {self.labels.shape}, expected ({n},)")
        if self.images is not None:
            if meta.encoding != "raw" or meta.shape is None:
                problems.append(f"an {IMAGES} dataset, but encoding {meta.encoding} and shape {meta.shape}")
            elif self.images.shape != (n, *meta.shape) or self.images.dtype != np.uint8:
                problems.append(f"{IMAGES} is {self.images.dtype} {self.images.shape}, expected uint8 {(n, *meta.shape)}")
        else:
            if self.offsets.shape != (n + 1,) or self.shapes.shape != (n, 3):
                problems.append(f"{OFFSETS}/{SHAPES} have shapes {self.offsets.shape}/{self.shapes.shape} for {n} samples")
            elif self.payload is None or self.payload.shape != (int(self.offsets[-1]),):
                problems.append(f"{PAYLOAD} does not hold the {int(self.offsets[-1])} bytes {OFFSETS} point to")
            elif n and (self.offsets[0] != 0 or np.any(np.diff(self.offsets) < 0)):
                problems.append(f"{OFFSETS} are not increasing from 0")
        if problems:
            raise PackedFormatError(f"{self.path}: the file is corrupt: " + "; ".join(problems))

    def mapped(self) -> "MappedRows | None":
        """The lock-free reader of ``images`` (None: read through h5py), made on first use.

        Not on open: locating a large file's chunks takes a while (linear in the samples, once per
        open file), and opening for the metadata alone (``packer info``) should not pay it.
        """
        if not self._mapped_known:
            with self._map_lock:
                if not self._mapped_known:
                    self._mapped = MappedRows.locate(self.file, self.images) if self.images is not None else None
                    self._mapped_known = True
        return self._mapped

    def read_rows(self, start: int, stop: int, out: np.ndarray) -> None:
        """Read ``images[start:stop]`` into the C-contiguous ``out``.

        From the mapped file where possible (:class:`MappedRows`). Else uncompressed one-sample
        chunks are copied by h5py straight from the file into ``out`` (``read_direct_chunk``:
        faster than a selection, which goes through HDF5's chunk cache); anything else is
        one hyperslab read.
        """
        images = self.images
        assert images is not None and out.flags.c_contiguous
        mapped = self.mapped()
        if mapped is not None:
            mapped.fill(np.arange(start, stop), out)
            return
        try:
            if self.direct_chunks:
                flat = out.reshape(stop - start, -1)
                for j in range(stop - start):
                    images.id.read_direct_chunk((start + j, 0, 0, 0), out=flat[j])
                return
            space = images.id.get_space()
            space.select_hyperslab((start, 0, 0, 0), (stop - start, *images.shape[1:]))
            images.id.read(h5py.h5s.create_simple(out.shape), space, out)
        except H5_ERRORS as exc:
            raise PackedFormatError(f"{self.path}: cannot read samples {start}..{stop - 1}: the file is corrupt ({exc})") from None

    def read_payload(self, start: int, stop: int, out: np.ndarray) -> None:
        """Read ``payload[start:stop]`` into ``out``."""
        if stop == start:
            return
        payload = self.payload
        assert payload is not None
        space = payload.id.get_space()
        space.select_hyperslab((start,), (stop - start,))
        try:
            payload.id.read(h5py.h5s.create_simple(out.shape), space, out)
        except H5_ERRORS as exc:
            raise PackedFormatError(f"{self.path}: cannot read payload bytes {start}..{stop}: the file is corrupt ({exc})") from None

    def close(self) -> None:
        self._mapped, self._mapped_known = None, True  # unmapped once no batch is being copied from it
        try:
            self.file.close()
        except H5_ERRORS:  # pragma: no cover - already closed
            pass


_handles: HandleCache[_SharedFile] = HandleCache()


def open_shared_file(path: str, expected: tuple[int, ...] | None = None) -> _SharedFile:
    """The read-only file of ``path`` for this process, opened once; ``expected``: the
    :func:`~readers._process.opened_key` of the file when a store first opened it (another is refused).

    A file inherited through fork is closed in this process and opened afresh: HDF5 would
    otherwise hand the new open the inherited library state.
    """
    try:
        key = file_key(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such HDF5 dataset") from None
    if expected is not None and key != expected:
        raise replaced_error(path)

    def open_file() -> _SharedFile:
        try:
            file = h5py.File(path, "r")  # HDF5's default locking: see HDF5Store
        except H5_ERRORS as exc:
            said = " ".join(str(exc).split())
            hint = ""
            if "unable to lock file" in said and "errno = 11," in said:  # EAGAIN: a lock another process holds
                hint = ("; another process has it open for writing (HDF5's file lock): close it there, or set "
                        "HDF5_USE_FILE_LOCKING=FALSE where the filesystem's locks are not wanted")
            elif "unable to lock file" in said:  # ENOLCK, ENOSYS...: NFS or Lustre without locks
                hint = "; this filesystem does not lock files as HDF5 asks: set HDF5_USE_FILE_LOCKING=FALSE"
            elif "locking flag values don't match" in said:
                hint = ("; this process has it open already with other locking (h5py.File(..., locking=False)): open it "
                        "with the default there, or set HDF5_USE_FILE_LOCKING=FALSE before either opens it")
            raise PackedFormatError(f"{path}: cannot open as HDF5 ({said}){hint}") from None
        try:
            return _SharedFile(path, file)
        except BaseException:
            file.close()
            raise

    return _handles.get(key, open_file)
