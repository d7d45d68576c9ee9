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
straight out of a read-only memory map of the file (:class:`_Mapped`), in parallel threads.
"""

from __future__ import annotations

import math
import mmap
import os
import threading
from pathlib import Path
from typing import Iterator, Sequence

import h5py
import numpy as np

from .._process import HandleCache, PerProcess, file_key
from ..schema import IncompleteDatasetError, Metadata, PackedFormatError
from .base import Record, Store, dataset_path, magic_mismatch
from .names import decode_source_names

__all__ = ["HDF5Store", "META_ATTR", "IMAGES", "LABELS", "PAYLOAD", "OFFSETS", "SHAPES", "CHECKSUMS", "SOURCES", "SIGNATURE", "chunk_starts", "open_shared_file"]

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

_H5_ERRORS = (OSError, KeyError, ValueError, RuntimeError)

#: Without ``DatasetID.chunk_iter`` (h5py built against HDF5 < 1.12.3), chunks are located one by
#: one with ``get_chunk_info``, and each call walks the chunk index (measured: 75 us a chunk at
#: 2,000 chunks, 7 ms at 200,000). Only files of up to this many samples are mapped that way;
#: larger ones are read through h5py.
_CHUNK_INFO_LIMIT = 4096


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
        except _H5_ERRORS as exc:
            raise PackedFormatError(f"{self.path}: cannot read the {CHECKSUMS} dataset ({exc})") from None
        if values.shape != (self.meta.count,):
            raise PackedFormatError(f"{self.path}: {CHECKSUMS} has shape {values.shape}, expected ({self.meta.count},)")
        return values.astype(np.uint32, copy=False)

    def source_names(self) -> list[str] | None:
        file = self._file.get().file
        if SOURCES not in file:
            return None
        return decode_source_names(file[SOURCES][()].tobytes(), self.meta.count, where=f"{self.path} {SOURCES}")

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

    def __call__(self) -> "_SharedFile":
        return open_shared_file(self.path)


class _SharedFile:
    """One open HDF5 file of this process, its datasets, and its small arrays in memory."""

    def __init__(self, path: str, file: h5py.File) -> None:
        self.path = path
        self.file = file
        self.pid = os.getpid()
        self.images: h5py.Dataset | None = None
        self.payload: h5py.Dataset | None = None
        self.direct_chunks = False  # images: uncompressed, one sample per chunk
        self._mapped: _Mapped | None = None
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
        except _H5_ERRORS as exc:
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

    def mapped(self) -> "_Mapped | None":
        """The lock-free reader of ``images`` (None: read through h5py), made on first use.

        Not on open: locating a large file's chunks takes a while (about 1.6 us a sample), and
        opening for the metadata alone (``packer info``) should not pay it.
        """
        if not self._mapped_known:
            with self._map_lock:
                if not self._mapped_known:
                    self._mapped = _Mapped.locate(self.file, self.images) if self.images is not None else None
                    self._mapped_known = True
        return self._mapped

    def read_rows(self, start: int, stop: int, out: np.ndarray) -> None:
        """Read ``images[start:stop]`` into the C-contiguous ``out``.

        From the mapped file where possible (:class:`_Mapped`). Else uncompressed one-sample
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
        except _H5_ERRORS as exc:
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
        except _H5_ERRORS as exc:
            raise PackedFormatError(f"{self.path}: cannot read payload bytes {start}..{stop}: the file is corrupt ({exc})") from None

    def close(self) -> None:
        self._mapped, self._mapped_known = None, True  # unmapped once no batch is being copied from it
        try:
            self.file.close()
        except _H5_ERRORS:  # pragma: no cover - already closed
            pass


class _Mapped:
    """Raw fixed-layout samples read without h5py: the file mapped read-only, and where each
    sample starts in it (sample ``i`` is ``data[starts[i] : starts[i] + nbytes]``).

    Copies out of the map release the GIL, so threads fill batches in parallel; the pages come
    from, and stay in, the page cache, shared by every process reading the file.
    """

    def __init__(self, data: np.ndarray, starts: np.ndarray, shape: tuple[int, ...]) -> None:
        self.data = data
        self.starts = starts
        self.shape = shape
        self.nbytes = math.prod(shape)

    @classmethod
    def locate(cls, file: h5py.File, images: h5py.Dataset) -> "_Mapped | None":
        """Map ``file`` and find every sample of ``images`` in it; None where that cannot be done
        safely (compression or other filters, chunks other than one sample each, another file
        driver, a user block, no fast chunk listing for a large file): read those through h5py.

        The map is made from the descriptor h5py itself reads (so it is the same file, even if
        the path was replaced since), and the offsets found are checked against h5py's reading
        of the first and last samples.
        """
        try:
            if os.name != "posix" or file.driver != "sec2" or file.userblock_size != 0:
                return None
            n, shape = int(images.shape[0]), tuple(int(d) for d in images.shape[1:])
            nbytes = math.prod(shape)
            plist = images.id.get_create_plist()
            layout = plist.get_layout()
            if layout == h5py.h5d.CONTIGUOUS:  # not written by packer, but a valid file: samples back to back
                base = images.id.get_offset()
                if base is None:
                    return None
                starts: np.ndarray | None = base + np.arange(n, dtype=np.int64) * nbytes
            elif layout == h5py.h5d.CHUNKED and images.chunks == (1, *shape) and plist.get_nfilters() == 0:
                starts = chunk_starts(images.id, n, nbytes)
            else:
                return None
            if starts is None:
                return None
            data = np.frombuffer(mmap.mmap(file.id.get_vfd_handle(), 0, access=mmap.ACCESS_READ), np.uint8)
            if n and (int(starts.min()) < 0 or int(starts.max()) + nbytes > len(data)):
                return None
            for i in sorted({0, n - 1}) if n else ():
                start = int(starts[i])
                if not np.array_equal(data[start : start + nbytes].reshape(shape), images[i]):
                    return None
            return cls(data, starts, shape)
        except (*_H5_ERRORS, NotImplementedError):  # nothing to gain here: h5py reports a corrupt file
            return None

    def fill(self, indices: np.ndarray, out: np.ndarray) -> None:
        """Copy samples ``indices`` into ``out`` (N, C, H, W), visiting them forward through the
        file (what the disk prefers when the pages are not cached yet)."""
        starts = self.starts[indices]
        order = np.argsort(starts, kind="stable")
        data, nbytes, shape = self.data, self.nbytes, self.shape
        if out.flags.c_contiguous:
            flat = out.reshape(len(indices), nbytes)
            for j, start in zip(order.tolist(), starts[order].tolist()):
                flat[j] = data[start : start + nbytes]
        else:
            for j, start in zip(order.tolist(), starts[order].tolist()):
                out[j] = data[start : start + nbytes].reshape(shape)


def chunk_starts(dsid: h5py.h5d.DatasetID, n: int, nbytes: int) -> np.ndarray | None:
    """The file offset of each of ``n`` one-sample chunks of ``nbytes``, from HDF5's chunk index.

    ``DatasetID.chunk_iter`` visits every chunk in one pass (about 1.6 us a chunk); without it,
    ``get_chunk_info`` per chunk, only up to :data:`_CHUNK_INFO_LIMIT` chunks (its cost grows
    with the file). None when a sample has no chunk, or one of another size or filtered.
    """
    starts = np.full(n, -1, np.int64)

    def visit(info: h5py.h5d.StoreInfo) -> bool | None:
        row = info.chunk_offset[0]
        if info.size != nbytes or info.filter_mask or not 0 <= row < n or starts[row] >= 0:
            return True  # not one whole unfiltered sample: stop
        starts[row] = info.byte_offset
        return None

    iterate = getattr(dsid, "chunk_iter", None)
    if iterate is not None:
        if iterate(visit) is not None:
            return None
    elif n <= _CHUNK_INFO_LIMIT:
        for k in range(dsid.get_num_chunks()):
            if visit(dsid.get_chunk_info(k)) is not None:
                return None
    else:
        return None
    return starts if not n or int(starts.min()) >= 0 else None


_handles: HandleCache[_SharedFile] = HandleCache()


def open_shared_file(path: str) -> _SharedFile:
    """The read-only file of ``path`` for this process, opened once.

    A file inherited through fork is closed in this process and opened afresh: HDF5 would
    otherwise hand the new open the inherited library state.
    """
    try:
        key = file_key(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such HDF5 dataset") from None

    def open_file() -> _SharedFile:
        try:
            file = h5py.File(path, "r")  # HDF5's default locking: see HDF5Store
        except _H5_ERRORS as exc:
            raise PackedFormatError(f"{path}: cannot open as HDF5 ({' '.join(str(exc).split())})") from None
        try:
            return _SharedFile(path, file)
        except BaseException:
            file.close()
            raise

    return _handles.get(key, open_file)
