"""Write a packer HDF5 file (layout owned by ``readers/formats/hdf5.py``).

The sample count is not known up front (inputs may be skipped), so the pixel dataset is
resizable and grows block by block: samples are buffered and appended about
:data:`BLOCK_BYTES` at a time (one h5py call per block; per-sample calls are slow). The layout
is chosen when the first block is written: *fixed* (``images`` (N, C, H, W)) when every
sample so far is raw with one shape, else *flat* (``payload`` + ``offsets`` + ``shapes``). If a
later sample breaks the fixed layout (another shape), or the metadata says the samples are
encoded, what was written moves to the flat layout. Labels, offsets and shapes are kept in
memory and written once at the end, then the metadata attribute, last.

When the conversion knows every sample's shape and the number of inputs up front (an
uncompressed fixed-size raw conversion: :meth:`HDF5Writer.placement`), ``images`` is instead
created at once with a row for every input, each row's chunk allocated then (and never filled by
HDF5): the workers write their samples into their rows' chunks themselves
(``packer/placement.py``), the driver writes the rest (after a skipped input) into the next free
row, and at the end the rows nobody took are cut off. Either way the file is the same, for any
worker count: HDF5's structures are all made in the driver, the samples are bytes at known places.
"""

from __future__ import annotations

import errno
import math
import os
from array import array
from typing import Any

import h5py
import numpy as np

from readers.formats.hdf5 import CHECKSUMS, IMAGES, LABELS, META_ATTR, OFFSETS, PAYLOAD, SHAPES, SOURCES
from readers.formats.hdf5_rows import H5_ERRORS, chunk_starts
from readers.schema import Metadata

from ..placement import Placed, Placement, pwrite_all, wait_for_writers
from ..preprocess.task import Encoded
from .base import Writer
from ..files import allocate, fsync_path, punch_hole
from .hdf5_compact import compact
from .journal import Checkpoint, record_shapes

__all__ = ["HDF5Writer", "BLOCK_BYTES", "PAYLOAD_CHUNK", "LIBVER"]

#: Buffered payload bytes per append to the file.
BLOCK_BYTES = 32 << 20
#: Room kept free for HDF5's own structures (object headers, chunk index, free-space records).
_HDF5_MARGIN = 1 << 20
#: Index bytes per sample written at finish: label and offset int64, checksum uint32, shape 3 x int64.
_INDEX_BYTES_PER_SAMPLE = 8 + 8 + 4 + 24
#: Chunk index bytes per row of ``images`` allocated up front (measured: about 137).
_INDEX_BYTES_PER_ROW = 160
#: Chunk length (bytes) of the flat ``payload`` dataset.
PAYLOAD_CHUNK = 64 << 10
#: HDF5 file-format bounds: the oldest structures that hold the data, readable by HDF5 >= 1.8.
LIBVER = ("earliest", "v108")


class HDF5Writer(Writer):
    format_name = "hdf5"
    storage_fields = ("compression",)
    is_directory = False
    #: Where h5py's flushes fall decides where HDF5 places its structures (a flush gives back
    #: the space it had set aside for them), so checkpoints every few seconds made the file's
    #: bytes depend on the machine's speed: 300 images converted alone and three at once gave
    #: files 328 bytes apart (an interrupted-conversions walkthrough). Its checkpoints fall at
    #: fixed points of the sample stream instead (``journal.UNTIMED_CHECKPOINT_INPUTS``).
    timed_checkpoints = False

    def _open(self) -> None:
        self._open_bookkeeping()
        # No HDF5 lock: it would be exclusive, and placing workers take shared locks on the file
        # (packer/placement.py); DST.partial is packer's own, guarded by the destination lock.
        self._file = _h5_call(h5py.File, self.tmp, "w", libver=LIBVER, locking=False)

    def _open_bookkeeping(self) -> None:
        self._pending: list[Encoded] = []
        self._pending_bytes = 0
        self._layout: str | None = None  # "fixed" or "flat", chosen at the first flush
        self._moved = False  # samples moved from "fixed" to "flat": the file keeps their first copy's space
        self._written = 0
        self._labels = array("q")
        self._shapes = array("q")  # flat (C, H, W) triples, of every sample written
        self._offsets = array("q", [0])
        #: With ``images`` allocated up front: each row's file offset, a descriptor to write them
        #: through, and the workers' placement (packer/placement.py).
        self._starts: np.ndarray | None = None
        self._fd = -1
        self._placement: Placement | None = None

    def extra(self) -> dict[str, Any]:
        return {"compression": self.storage.compression}

    # -- resuming ------------------------------------------------------------------------------
    @property
    def durable_in_background(self) -> bool:
        """``fsync`` beside h5py's writing, through the rows' descriptor where there is one: a
        write error a worker's write-behind saw first is told only to descriptors opened before
        (``files.WriteBehind``), and the journal would record samples the disk never got."""
        return True

    def _sync(self) -> dict[str, Any]:
        self._flush()
        _h5_call(self._file.flush)
        shape = getattr(self, "_fixed_shape", None)
        rows = None if self._starts is None else len(self._starts)
        return {"layout": self._layout, "fixed_shape": list(shape) if shape else None, "written": self._written, "rows": rows,
                "moved": self._moved}

    def _durable(self) -> None:
        rows = self._fd  # open since before any worker wrote (closed only after _settle)
        if rows >= 0:
            os.fsync(rows)
        else:
            fsync_path(self.tmp)

    def _reopen(self, checkpoint: Checkpoint) -> None:
        """Reopen the file and cut its datasets back to the checkpoint (rows allocated up front
        are kept: those past the checkpoint are written again).

        HDF5 keeps its own structures in memory between flushes, so a file killed in the middle
        of a block may not open any more: that is reported, and only a fresh start helps.
        """
        self._open_bookkeeping()
        state, rows = checkpoint.state, checkpoint.rows
        if state["written"] != checkpoint.samples:
            raise OSError(0, "the resume journal disagrees with itself; run without --resume")
        fd = os.open(self.tmp, os.O_RDWR)
        try:
            wait_for_writers(fd, str(self.tmp))  # placing workers of a killed run may still be writing
        finally:
            os.close(fd)
        try:
            # No lock: the killed run's workers, inherited its descriptor and still exiting, may hold one.
            self._file = h5py.File(self.tmp, "r+", libver=LIBVER, locking=False)
        except H5_ERRORS as exc:
            raise OSError(0, f"the partial HDF5 file was damaged by the interruption ({exc}); run without --resume") from None
        # an interrupted finish may have written the index and even the metadata: drop them
        for name in (LABELS, CHECKSUMS, SOURCES, OFFSETS, SHAPES):
            if name in self._file:
                _h5_call(self._file.__delitem__, name)
        if META_ATTR in self._file.attrs:
            _h5_call(self._file.attrs.__delitem__, META_ATTR)
        self._layout, self._written = state["layout"], checkpoint.samples
        self._moved = bool(state.get("moved"))
        if self._layout == "fixed" and IMAGES not in self._file and PAYLOAD in self._file:  # moved to flat after the checkpoint
            self._layout, self._moved = "flat", True  # (payload holds the checkpoint's rows first, back to back)
        self._labels.extend(rows["label"].tolist())
        if self._layout == "fixed":
            self._fixed_shape = tuple(state["fixed_shape"])
            # rows allocated up front stay (those past the checkpoint are written again), unless an
            # interrupted finish had cut them already
            if not (state.get("rows") and _h5_call(self._locate_rows, state["rows"])):
                _h5_call(self._file[IMAGES].resize, self._written, axis=0)
        elif self._layout == "flat":
            self._shapes.extend(record_shapes(rows).reshape(-1).tolist())
            for nbytes in rows["nbytes"].tolist():
                self._offsets.append(self._offsets[-1] + nbytes)
            _h5_call(self._file[PAYLOAD].resize, self._offsets[-1], axis=0)

    # -- rows allocated up front -----------------------------------------------------------------
    def placement(self, shape: tuple[int, int, int], first_input: int, inputs: int) -> Placement | None:
        """Workers write input ``i``'s sample into row ``i``'s chunk (packer/placement.py), for
        uncompressed samples of ``shape``: ``images`` is created with a row for each of the
        ``first_input + inputs`` inputs (or was, by the run this one resumes), every chunk allocated
        at once. ``None`` when compressed, when the file already holds another layout, or after
        skipped inputs (the driver then writes each sample into the next free row itself)."""
        rows = first_input + inputs
        if self.storage.compression or not rows:
            return None
        if self._layout is None and self._written == 0 and not self._pending:
            try:  # HDF5 writes every row's chunk index entry now: a full disk shows here
                self._reserve(rows * _INDEX_BYTES_PER_ROW)
                _h5_call(self._create_rows, shape, rows)
            except OSError as exc:
                raise self.output_error(exc) from None
        if self._starts is None or len(self._starts) != rows or self._fixed_shape != shape:
            return None
        if self._written != first_input:
            return None
        self._allocate_rows(first_input, math.prod(shape))
        self._placement = Placement(str(self.tmp), 0, math.prod(shape), shape, starts=self._starts)
        return self._placement

    def _allocate_rows(self, first: int, nbytes: int) -> None:
        """Allocate the chunks of the rows from ``first`` on, for the workers' samples
        (``files.allocate``): the span from the first to the last, with the chunk index nodes
        HDF5 placed between them (every few dozen rows), which ``allocate`` leaves as they are. A
        full disk is the usual one-line error, now rather than halfway, after the chunks'
        blocks (not the nodes') are given back."""
        assert self._starts is not None
        starts = self._starts[first:]
        if not len(starts):
            return
        low, high = int(starts.min()), int(starts.max()) + nbytes
        try:
            allocate(self._fd, low, high - low)
        except OSError as exc:
            ordered = np.sort(starts)
            runs = np.split(ordered, np.flatnonzero(np.diff(ordered) != nbytes) + 1)  # chunks back to back
            for run in runs:  # rows nobody wrote yet
                punch_hole(self._fd, int(run[0]), len(run) * nbytes)
            raise self.output_error(exc) from None

    def _create_rows(self, shape: tuple[int, int, int], rows: int) -> None:
        """``images`` with ``rows`` rows, each chunk allocated now (and not filled: its sample is
        written into it); none if HDF5 cannot list the chunks quickly."""
        plist = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        plist.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
        plist.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
        self._create_fixed(shape, rows=rows, dcpl=plist)
        self._layout = "fixed"
        if not self._locate_rows(rows):
            del self._file[IMAGES]
            self._layout = None

    def _locate_rows(self, rows: int) -> bool:
        """Find the file offset of each of ``rows`` rows; open the descriptor that writes them."""
        starts = chunk_starts(self._file[IMAGES].id, rows, math.prod(self._fixed_shape))
        if starts is None:
            return False
        self._starts = starts
        self._fd = os.open(self.tmp, os.O_RDWR)
        return True

    def _write_row(self, sample: Encoded | Placed) -> None:
        """Sample ``_written`` into its row: a placed one is there already unless inputs before it
        were skipped (then it is moved down, as few are: placing stops at the first skip)."""
        assert self._starts is not None
        row = self._written
        if isinstance(sample, Placed):
            assert self._placement is not None, "internal error: a placed sample without a placement"
            data = self._placement.moved(self._fd, sample, row)
            if data is not None:
                pwrite_all(self._fd, data, int(self._starts[row]))
        else:
            if not _fits_fixed([sample], self._fixed_shape):  # pragma: no cover - fixed-shape jobs only
                raise ValueError(f"internal error: a sample of shape {sample.shape} in an output of {self._fixed_shape}")
            pwrite_all(self._fd, sample.payload, int(self._starts[row]))
        self._labels.append(sample.label)
        self._written += 1

    def _cut_rows(self) -> None:
        """Drop the rows nobody took (one per skipped input), and the descriptor that wrote them.
        Their chunks are emptied first: a worker may have placed a sample there before it was
        moved down (or a killed run's worker, before a resume), and the file must be the one
        the driver alone writes."""
        if self._starts is not None and len(self._starts) != self._written:
            nbytes = math.prod(self._fixed_shape)
            for start in self._starts[self._written :].tolist():
                if not punch_hole(self._fd, start, nbytes):
                    pwrite_all(self._fd, bytes(nbytes), start)
            _h5_call(self._file[IMAGES].resize, self._written, axis=0)
        self._close_rows()

    def _close_rows(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    # -- appending --------------------------------------------------------------------------
    def _write(self, index: int, sample: Encoded | Placed) -> None:
        if self._starts is not None:
            self._write_row(sample)
            return
        assert isinstance(sample, Encoded)
        self._pending.append(sample)
        self._pending_bytes += len(sample.payload)
        if self._pending_bytes >= BLOCK_BYTES:
            self._flush()

    def _reserve(self, nbytes: int) -> None:
        """Raise ENOSPC unless the disk holds ``nbytes`` more (plus HDF5's own structures).

        libhdf5 does not survive a full disk: it drops the failed chunk writes (h5py only prints
        them) and then crashes the process in ``flush``. So the space is checked before HDF5 is
        asked to write (blocks, the index, rows allocated up front: their samples are written
        by ``pwrite``, which reports a full disk itself), and a full disk is the usual one-line
        error instead of a segfault."""
        st = os.statvfs(self.tmp.parent if str(self.tmp.parent) else ".")
        if st.f_bavail * st.f_frsize < nbytes + _HDF5_MARGIN:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def _flush(self, raw: bool | None = None) -> None:
        """Append the pending samples; ``raw`` is False when the metadata says they are encoded."""
        self._reserve(self._pending_bytes)
        block = self._pending
        if self._layout is None and (block or raw is not None):
            self._layout = "fixed" if raw is not False and block and _fits_fixed(block, block[0].shape) else "flat"
            _h5_call(self._create_fixed if self._layout == "fixed" else self._create_flat, block[0].shape if block else None)
        elif self._layout == "fixed" and (raw is False or not _fits_fixed(block, self._fixed_shape)):
            _h5_call(self._fixed_to_flat)
        if block:
            _h5_call(self._append_fixed if self._layout == "fixed" else self._append_flat, block)
        self._pending = []
        self._pending_bytes = 0

    def _compression(self) -> dict[str, Any]:
        return {"compression": self.storage.compression} if self.storage.compression else {}

    def _create_fixed(self, shape: tuple[int, int, int], rows: int = 0, dcpl: Any = None) -> None:
        self._fixed_shape = shape
        self._file.create_dataset(
            IMAGES,
            shape=(rows, *self._fixed_shape),
            maxshape=(None, *self._fixed_shape),
            chunks=(1, *self._fixed_shape),  # one sample per chunk: a random read touches only its sample
            dtype=np.uint8,
            dcpl=dcpl,
            **self._compression(),
        )

    def _create_flat(self, shape: tuple[int, int, int] | None = None) -> None:
        self._file.create_dataset(
            PAYLOAD, shape=(0,), maxshape=(None,), chunks=(PAYLOAD_CHUNK,), dtype=np.uint8, **self._compression()
        )

    def _append_fixed(self, block: list[Encoded]) -> None:
        """Uncompressed, each payload is its sample's chunk as stored: handed to HDF5 as it is
        (``write_direct_chunk``: no copy into a block array, no chunk cache); compressed, as a
        block slice. The one comparison committed bundles this with other changes: the HDF5
        writer alone ran at 1.7-1.9x its rate at 01dfde8 (after_over_before 1.887 and 1.679, two
        runs, 2-core Intel Xeon host): ``benchmarks/results/one_writer-before_after.json``, rates
        "(a) hdf5 writer alone", ``python -m benchmarks.one_writer --samples 6000 --repeats 3``
        at 01dfde8 and 7322546, alternated twice."""
        images = self._file[IMAGES]
        start = self._written
        images.resize(start + len(block), axis=0)
        if self.storage.compression:
            rows = np.empty((len(block), *self._fixed_shape), np.uint8)
            for j, sample in enumerate(block):
                rows[j] = np.frombuffer(sample.payload, np.uint8).reshape(self._fixed_shape)
            images[start:] = rows
        else:
            corner = (0,) * len(self._fixed_shape)
            for j, sample in enumerate(block):
                images.id.write_direct_chunk((start + j, *corner), sample.payload)
        self._labels.extend(sample.label for sample in block)
        self._written += len(block)

    def _append_flat(self, block: list[Encoded]) -> None:
        payload = self._file[PAYLOAD]
        data = np.frombuffer(b"".join(s.payload for s in block), np.uint8)
        start = self._offsets[-1]
        for sample in block:
            self._labels.append(sample.label)
            self._shapes.extend(sample.shape)
            self._offsets.append(self._offsets[-1] + len(sample.payload))
        payload.resize(start + len(data), axis=0)
        if len(data):
            payload[start:] = data
        self._written += len(block)

    def _fixed_to_flat(self) -> None:
        """Move the samples written so far from ``images`` into the flat layout."""
        images = self._file[IMAGES]
        self._create_flat()
        payload = self._file[PAYLOAD]
        nbytes = math.prod(self._fixed_shape)
        payload.resize(self._written * nbytes, axis=0)
        step = max(1, BLOCK_BYTES // nbytes)
        for start in range(0, self._written, step):
            rows = images[start : start + step]
            payload[start * nbytes : start * nbytes + rows.size] = rows.reshape(-1)
        self._shapes.extend(self._fixed_shape * self._written)
        self._offsets.extend(range(nbytes, (self._written + 1) * nbytes, nbytes))
        del self._file[IMAGES]
        self._layout, self._moved = "flat", True

    # -- finishing ---------------------------------------------------------------------------
    def _write_metadata(self, meta: Metadata) -> None:
        self._cut_rows()
        self._starts = None
        self._flush(raw=meta.encoding == "raw")
        names = self.source_names_bytes()
        self._reserve(_INDEX_BYTES_PER_SAMPLE * self._written + len(meta.to_json()) + len(names or b""))
        _h5_call(self._write_index, meta, names)
        self._file = None
        if self._moved and self._journal is not None:  # (its folder is packer's place for the copy)
            compact(self.tmp, self._journal.folder / "compact.h5", meta.to_json(), self.dst, LIBVER)

    def _write_index(self, meta: Metadata, names: bytes | None) -> None:
        file = self._file
        file.create_dataset(LABELS, data=np.frombuffer(self._labels, np.int64))
        file.create_dataset(CHECKSUMS, data=self.checksum_array())
        if names is not None:
            file.create_dataset(SOURCES, data=np.frombuffer(names, np.uint8))
        if self._layout == "flat":
            file.create_dataset(OFFSETS, data=np.frombuffer(self._offsets, np.int64))
            file.create_dataset(SHAPES, data=np.frombuffer(self._shapes, np.int64).reshape(-1, 3))
        file.flush()
        file.attrs[META_ATTR] = meta.to_json()  # last: a file without it is unfinished
        file.close()

    def _close(self) -> None:
        if getattr(self, "_fd", -1) >= 0:
            self._close_rows()
        file = getattr(self, "_file", None)
        if file is not None:
            try:
                file.close()
            except H5_ERRORS:
                pass
            self._file = None


def _fits_fixed(block: list[Encoded], shape: tuple[int, int, int]) -> bool:
    """Whether every sample has ``shape`` and a raw payload of that many bytes."""
    nbytes = math.prod(shape)
    return all(s.shape == shape and len(s.payload) == nbytes for s in block)


def _h5_call(fn, *args, **kwargs):
    """Call into h5py; its failures become OSError (errno kept where HDF5 gave one)."""
    try:
        return fn(*args, **kwargs)
    except OSError:
        raise
    except H5_ERRORS as exc:
        raise OSError(f"HDF5 error: {exc}") from None
