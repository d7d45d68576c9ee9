"""Write a packer blob (layout owned by ``readers/formats/blob.py``).

Payloads stream to the file as they come, after a zeroed header page; only labels, offsets and
shapes (a few int64 per sample) are kept until the end, when they are written as aligned
sections, followed by the metadata record. Everything is then synced, and only after that is
the header (with its magic) written at offset 0: a file cut short at any point before has no
magic, and readers refuse it as unfinished. For fixed-shape raw samples the data section is
already one ``(N, C, H, W)`` array, so offsets and shapes are not written at all.

With a *sink* (:class:`BlobSink`; ``packer/multipart.py`` for an ``s3://`` DST) the file goes
to the sink as it grows: told after every checkpoint how much of it is durable, and at the end
to finish, instead of the rename to ``DST``.
"""

from __future__ import annotations

import math
import os
from array import array
from pathlib import Path
from typing import Any, Protocol

from readers.formats.blob import (
    MAGIC,
    ALIGNMENT,
    LABEL_DTYPE,
    OFFSET_DTYPE,
    SHAPE_DTYPE,
    SECTIONS,
    BlobHeader,
    align,
)
from readers.schema import FORMAT_VERSION, Metadata

from .. import remote as remote_urls
from ..multipart import MultipartUpload, supports_multipart
from ..placement import Placed, Placement, wait_for_writers
from ..preprocess.task import Encoded
from .base import Writer
from ..files import allocate
from .journal import Checkpoint, record_shapes

__all__ = ["BlobWriter", "BlobSink"]

#: ``array`` typecode of a little-endian int64 on this machine (checked: numpy reads the bytes).
_INT64 = "q"


class BlobSink(Protocol):
    """Where a :class:`BlobWriter`'s file goes instead of being renamed to ``DST``."""

    def start(self, local: Path, *, resumed_end: int | None = None) -> None:
        """The writer created ``local`` (or reopened it, cut back to ``resumed_end`` bytes)."""

    def synced(self, end: int) -> None:
        """The first ``end`` bytes of the file are durable (a checkpoint was committed)."""

    @property
    def sync_bytes(self) -> int:
        """How often (bytes written) the sink wants a checkpoint, at most."""
        ...

    def finish(self) -> None:
        """The file is complete: store it whole."""

    def abort(self) -> None:
        """The conversion failed: drop whatever was stored."""

    def close(self) -> None:
        """The conversion stopped (interrupted): stop sending, what was stored kept for a resume."""


class RemoteBlob:
    """:class:`~packer.remote.RemoteDestination` of a blob: streamed by S3 multipart upload where
    the store has it, else staged whole and uploaded at the end."""

    @staticmethod
    def sink(url: str, final: str) -> MultipartUpload | None:  # (a blob is stored at its URL: replaced whole)
        fs, root = remote_urls.dst_filesystem(url)
        return MultipartUpload(fs, root.rstrip("/"), url) if supports_multipart(fs) else None

    @staticmethod
    def unfinished(fs: Any, root: str) -> bool:
        return False  # a blob object appears only whole

    @staticmethod
    def is_ours(fs: Any, root: str, *, staged: bool) -> bool:
        try:
            with fs.open(root, "rb") as handle:
                return handle.read(len(MAGIC)) == MAGIC
        except (OSError, IsADirectoryError):
            return False

    @staticmethod
    def held_elsewhere(fs: Any, root: str) -> str | None:
        return None  # (a multipart upload is invisible until complete: nothing to find)

    @staticmethod
    def is_staged(fs: Any, root: str) -> bool:
        return False  # (never asked: a blob is replaced whole, never stored beside)

    @staticmethod
    def foreign_content(fs: Any, root: str) -> list[str]:
        return []  # (one file: nothing of anyone else's inside)

    @staticmethod
    def nothing_to_lose(fs: Any, root: str, url: str, dst: str) -> bool:
        return False

    @staticmethod
    def replaced_whole() -> bool:
        return True  # the upload's completion (or the whole file's) replaces the object: the old one stays until then


class BlobWriter(Writer):
    """Streams samples into ``DST.partial``; sections, metadata and finally the header at the end."""

    format_name = "blob"
    is_directory = False
    takes_sink = True
    remote = RemoteBlob

    def __init__(self, dst: Path, storage: Any = None, *, sink: BlobSink | None = None, **journal: Any) -> None:
        """``sink``: where the file goes (see :class:`BlobSink`); ``None``: renamed to ``DST``."""
        self.sink = sink
        super().__init__(dst, storage, **journal)

    def _open(self) -> None:
        self._file = open(self.tmp, "x+b")  # read too: a sample placed after a skip is read back to move it
        self._file.write(bytes(ALIGNMENT))  # the header page, filled in last
        if self.sink is not None:
            self._file.flush()
            self.sink.start(self.tmp)
        self._labels = array(_INT64)
        self._offsets = array(_INT64, [0])
        self._shapes = array(_INT64)
        self._placement: Placement | None = None

    @property
    def durable_in_background(self) -> bool:
        """Without a sink (which is told, per checkpoint, how much is durable): ``fsync`` in a thread."""
        return self.sink is None

    def _sync(self) -> dict[str, Any]:
        self._file.flush()
        if not self.durable_in_background:
            os.fsync(self._file.fileno())
        return {"data_bytes": self._offsets[-1]}

    def _durable(self) -> None:
        if self.durable_in_background:
            os.fsync(self._file.fileno())

    def _reopen(self, checkpoint: Checkpoint) -> None:
        """Cut the file back to the checkpoint's payload bytes and append from there."""
        rows = checkpoint.rows
        self._labels = array(_INT64, rows["label"].tolist())
        self._offsets = array(_INT64, [0])
        for nbytes in rows["nbytes"].tolist():
            self._offsets.append(self._offsets[-1] + nbytes)
        self._shapes = array(_INT64, record_shapes(rows).reshape(-1).tolist())
        if self._offsets[-1] != checkpoint.state.get("data_bytes"):
            raise OSError(0, "the resume journal disagrees with itself; run without --resume")
        self._placement = None
        self._file = open(self.tmp, "r+b")
        wait_for_writers(self._file.fileno(), str(self.tmp))  # workers of a killed run may still be writing
        self._file.truncate(ALIGNMENT + self._offsets[-1])
        self._file.seek(0, os.SEEK_END)
        if self.sink is not None:
            self.sink.start(self.tmp, resumed_end=ALIGNMENT + self._offsets[-1])

    def _checkpoint_bytes(self) -> int:
        """With a sink, checkpoints come as often as it wants durable bytes to send."""
        default = super()._checkpoint_bytes()
        return default if self.sink is None else min(default, self.sink.sync_bytes)

    def _committed(self) -> None:
        if self.sink is not None:
            self.sink.synced(ALIGNMENT + self._offsets[-1])

    def placement(self, shape: tuple[int, int, int], first_input: int, inputs: int) -> Placement | None:
        """Workers write input ``i``'s sample at ``ALIGNMENT + i * stride`` (packer/placement.py)
        while no input was skipped: not with a sink (it is sent what is durable, in order), nor
        after skipped inputs (a resumed run's samples are then no longer at their inputs' places)."""
        if self.sink is not None or self.count != first_input or self._offsets[-1] != self.count * math.prod(shape):
            return None
        self._file.flush()
        self._allocate(ALIGNMENT + self._offsets[-1], inputs * math.prod(shape))
        self._placement = Placement(str(self.tmp), ALIGNMENT, math.prod(shape), shape)
        return self._placement

    def _allocate(self, end: int, nbytes: int) -> None:
        """Allocate the ``nbytes`` after the samples so far (``end``) for the workers' samples
        (``files.allocate``; the file is cut after its last sample at the end). A full disk is
        the usual one-line error, now rather than halfway, and the file is cut back to ``end``."""
        try:
            allocate(self._file.fileno(), end, nbytes)
        except OSError as exc:
            try:
                self._file.truncate(end)
            except OSError:  # pragma: no cover - the one line below says what matters
                pass
            raise self.output_error(exc) from None

    def _write(self, index: int, sample: Encoded | Placed) -> None:
        if isinstance(sample, Placed):
            self._book_placed(index, sample)
        else:
            if self._placement is not None:  # workers wrote the samples so far, not this handle
                self._file.seek(ALIGNMENT + self._offsets[-1])
            self._file.write(sample.payload)
        self._labels.append(sample.label)
        self._offsets.append(self._offsets[-1] + sample.nbytes)
        self._shapes.extend(sample.shape)

    def _book_placed(self, index: int, sample: Placed) -> None:
        """A worker wrote it at input ``sample.index``'s place: that is sample ``index``'s place
        unless inputs before it were skipped; then it is moved down (:meth:`Placement.moved`)."""
        placement = self._placement
        assert placement is not None and sample.nbytes == placement.stride, "internal error: a placed sample without a placement"
        data = placement.moved(self._file.fileno(), sample, index)
        if data is not None:
            self._file.seek(ALIGNMENT + self._offsets[-1])
            self._file.write(data)

    def _write_metadata(self, meta: Metadata) -> None:
        handle = self._file
        fixed_raw = meta.fixed_shape and meta.encoding == "raw"
        sections: dict[str, tuple[int, int]] = {"data": (ALIGNMENT, self._offsets[-1])}
        position = ALIGNMENT + self._offsets[-1]
        if self._placement is not None:  # the workers' writes may reach past the last sample booked
            handle.seek(position)
            handle.truncate()

        def put(name: str, payload: bytes) -> None:
            nonlocal position
            start = align(position)
            handle.write(bytes(start - position))
            handle.write(payload)
            sections[name] = (start, len(payload))
            position = start + len(payload)

        put("labels", _little_endian(self._labels, LABEL_DTYPE.itemsize))
        put("offsets", b"" if fixed_raw else _little_endian(self._offsets, OFFSET_DTYPE.itemsize))
        put("shapes", b"" if fixed_raw else _little_endian(self._shapes, SHAPE_DTYPE.itemsize))
        put("checksums", self.checksum_array().tobytes())
        put("metadata", meta.to_json().encode())
        assert set(sections) == set(SECTIONS)
        names = self.source_names_bytes()
        if names is not None:
            put("sources", names)  # after the metadata: readers that predate it never reach it
        sources = sections.pop("sources", (0, 0))
        handle.flush()
        os.fsync(handle.fileno())  # everything is on disk before the header says it is complete
        handle.seek(0)
        handle.write(BlobHeader(FORMAT_VERSION, ALIGNMENT, self.count, sections, sources).pack())
        handle.flush()
        os.fsync(handle.fileno())
        handle.close()

    def _publish(self) -> None:
        """Without a sink: rename ``DST.partial`` to ``DST``. With one: the sink stores it whole."""
        if self.sink is None:
            super()._publish()
            return
        self.sink.finish()
        self.tmp.unlink()

    def _close(self) -> None:
        """Close the file and stop the sink's threads, its upload left open: an interrupted run
        (:meth:`suspend`) keeps it for ``--resume`` (a Ctrl-C aborted it, and with it the saved
        progress); :meth:`abort` drops it."""
        handle = getattr(self, "_file", None)
        if handle is not None and not handle.closed:
            handle.close()
        if self.sink is not None:
            self.sink.close()

    def abort(self) -> None:
        try:
            super().abort()
        finally:
            if self.sink is not None:
                self.sink.abort()


def _little_endian(values: array, itemsize: int) -> bytes:
    assert values.itemsize == itemsize
    if array("H", [1]).tobytes() != b"\x01\x00":  # pragma: no cover - big-endian machine
        values = array(values.typecode, values)
        values.byteswap()
    return values.tobytes()
