"""The bytes of WebDataset shards: tar members written sequentially, the end of an archive,
fragments' member streams copied into one shard, and member names rewritten in place.

Layout constants (header format, block and record sizes, member names) are owned by
``readers/formats/webdataset.py``. What is recorded per sample written is one record of
:data:`MEMBER_DTYPE`, read by column name.
"""

from __future__ import annotations

import errno
import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from readers.encodings import get_encoding
from readers.formats.npy import npy_header, sample_array_shape
from readers.formats.tar import tar_header
from readers.formats.webdataset import BLOCK, INDEX_DTYPE, LABEL_EXTENSION, RECORD, sample_key

from ...preprocess.task import Encoded
from ...files import WriteBehind, read_ahead

__all__ = ["MEMBER_DTYPE", "ShardPart", "ShardFile", "Assembly", "tar_end", "is_full", "renumber", "TMP_PREFIX"]

#: Temporary names of shard files not yet published (numbered) by the writer.
TMP_PREFIX = ".piece-"

#: What is recorded per sample written to a shard: the index record but ``shard`` (which the
#: writer assigns when it numbers the shard), where the two tar members are (to renumber or
#: copy them: header positions and member sizes) and the sample's checksum.
MEMBER_DTYPE = np.dtype(
    [(name, kind) for name, kind in INDEX_DTYPE.descr if name != "shard"]
    + [(name, "<i8") for name in ("image_header", "image_size", "label_header", "label_size", "crc32")]
)


def _npy_head(sample: Encoded) -> bytes:
    """The .npy header of a raw sample's member (pixels, or a document's token ids)."""
    return npy_header(sample_array_shape(sample.shape, sample.dtype), sample.dtype)


@dataclass(frozen=True)
class ShardPart:
    """One shard a worker wrote: its temporary name, size and per-sample records, and its
    bytes when the worker returned it instead of writing a file (``in_memory``)."""

    tmp_name: str
    size: int
    rows: np.ndarray  # (samples,) records of MEMBER_DTYPE
    data: bytes | None = None


def tar_end(position: int) -> int:
    """Where a tar whose members end at ``position`` ends: two zero blocks, padded to RECORD."""
    end = position + 2 * BLOCK
    return end + -end % RECORD


def is_full(samples: int, member_bytes: int, incoming: int, shard_size: int | None, shard_bytes: int | None) -> bool:
    """Whether a shard of ``samples`` samples and ``member_bytes`` member bytes rolls over before
    a sample of ``incoming`` member bytes (workers and the parent's assembly decide alike)."""
    if shard_size is not None and samples >= shard_size:
        return True
    return shard_bytes is not None and member_bytes + incoming > shard_bytes


class ShardFile:
    """One tar file being written sequentially (to ``folder``, else in memory), with the
    records of its samples; ``write_behind``: a finished shard's file, written to disk as it
    grows (:class:`~packer.files.WriteBehind`; not a fragment, which the driver reads)."""

    def __init__(self, folder: str | None, name: str, encoding: str, *, write_behind: bool = False) -> None:
        self.path = Path(folder) / name if folder is not None else None
        self.name = name
        self.extension = get_encoding(encoding).extension
        self.raw = encoding == "raw"
        self.handle: Any = open(self.path, "wb") if self.path is not None else io.BytesIO()
        self.behind = WriteBehind(self.handle.fileno()) if write_behind and self.path is not None else None
        self.position = 0
        self.member_bytes = 0
        self.rows: list[tuple[int, ...]] = []  # fields of MEMBER_DTYPE, in its order

    @staticmethod
    def sample_bytes(sample: Encoded, raw: bool) -> int:
        label_size = len(str(sample.label))
        return (len(_npy_head(sample)) if raw else 0) + len(sample.payload) + label_size

    def add(self, index: int, sample: Encoded) -> None:
        key = sample_key(index)
        head = _npy_head(sample) if self.raw else b""
        image_size = len(head) + len(sample.payload)
        image_header = self.position
        self._member(f"{key}.{self.extension}", image_size, head, sample.payload)
        label = str(sample.label).encode("ascii")
        label_header = self.position
        self._member(f"{key}.{LABEL_EXTENSION}", len(label), label)
        channels, height, width = sample.shape
        offset = image_header + BLOCK + len(head)
        crc = sample.checksum  # computed in the worker
        self.rows.append(
            (offset, len(sample.payload), sample.label, channels, height, width, image_header, image_size, label_header, len(label), crc)
        )
        self.member_bytes += image_size + len(label)

    def _member(self, name: str, size: int, *chunks: bytes) -> None:
        write = self.handle.write
        write(tar_header(name, size))
        for chunk in chunks:
            write(chunk)
        padding = -size % BLOCK
        if padding:
            write(bytes(padding))
        self.position += BLOCK + size + padding
        if self.behind is not None:
            self.behind.wrote_through(self.handle, self.position)

    def close(self, *, end_archive: bool = True) -> ShardPart:
        """Finish the file; ``end_archive=False``: members only (a fragment's stream)."""
        end = tar_end(self.position) if end_archive else self.position
        self.handle.write(bytes(end - self.position))
        data = self.handle.getvalue() if self.path is None else None
        self.handle.close()
        return ShardPart(self.name, end, np.array(self.rows, MEMBER_DTYPE), data)

    def discard(self) -> None:
        """Close and delete the unfinished file (a close that fails to flush, on a full disk, is
        ignored: the file goes anyway, and the error that stopped us is the one to report)."""
        _close_quietly(self.handle)
        if self.path is not None:
            self.path.unlink(missing_ok=True)


class Assembly:
    """A shard the parent assembles from fragments' member streams (see ``ShardWriter.add_piece``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.handle = open(path, "wb")
        self.behind = WriteBehind(self.handle.fileno())
        self.position = 0
        self.member_bytes = 0
        self.samples = 0
        self.rows: list[np.ndarray] = []
        self.renumber = False  # some fragment's keys are not this shard's

    def append(self, source: Any, rows: np.ndarray, start: int, end: int, *, keys_right: bool) -> None:
        """Copy bytes ``start:end`` of a member stream (the samples ``rows``) to the shard's end."""
        left = end - start
        if isinstance(source, io.BufferedReader) and hasattr(os, "copy_file_range"):  # a worker's fragment file
            left = self._copy_in_kernel(source, start, left)
        source.seek(start + (end - start - left))
        while left:
            chunk = source.read(min(left, 1 << 22))
            if not chunk:  # pragma: no cover - internal invariant
                raise OSError(errno.EIO, f"{self.path.name}: fragment stream shorter than its rows")
            self.handle.write(chunk)
            left -= len(chunk)
        rows = rows.copy()
        for name in ("offset", "image_header", "label_header"):
            rows[name] += self.position - start
        self.rows.append(rows)
        self.position += end - start
        self.member_bytes += int((rows["image_size"] + rows["label_size"]).sum())
        self.samples += len(rows)
        self.renumber |= not keys_right
        self.behind.wrote_through(self.handle, self.position)

    def _copy_in_kernel(self, source: io.BufferedReader, start: int, count: int) -> int:
        """Copy ``count`` bytes of ``source`` from ``start`` to the shard's end without passing
        them through this process (``copy_file_range``); the bytes it did not copy so, for the
        caller to copy. Any refusal (a file system or kernel without it, a sandbox that forbids
        the call) leaves the rest to the caller, as ``shutil`` does; a full disk or an I/O error
        is the error."""
        self.handle.flush()
        out = self.handle.fileno()
        try:
            while count:
                done = os.copy_file_range(source.fileno(), out, count, start)
                if done == 0:
                    break
                start, count = start + done, count - done
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EIO):
                raise
        return count

    def close(self) -> ShardPart:
        """Write the end of the archive once; the finished shard, to publish."""
        end = tar_end(self.position)
        self.handle.write(bytes(end - self.position))
        self.handle.close()
        return ShardPart(self.path.name, end, np.concatenate(self.rows))

    def discard(self) -> None:
        _close_quietly(self.handle)
        self.path.unlink(missing_ok=True)


def _close_quietly(handle: Any) -> None:
    try:
        handle.close()
    except OSError:
        pass


def renumber(path: Path, rows: np.ndarray, first: int, encoding: str) -> None:
    """Rewrite the member names of the samples ``rows`` of the shard ``path`` in place, keyed
    from ``first`` (keys are fixed-width: only the 512-byte headers change). The shard was written
    behind (:class:`~packer.files.WriteBehind`): the pages of its headers are asked for
    all at once first, not read one by one as each partial write of a page not cached must."""
    extension = get_encoding(encoding).extension
    fd = os.open(path, os.O_RDWR)
    try:
        read_ahead(fd, [*rows["image_header"].tolist(), *rows["label_header"].tolist()], BLOCK)
        columns = zip(rows["image_header"].tolist(), rows["image_size"].tolist(), rows["label_header"].tolist(), rows["label_size"].tolist())
        for j, (image_header, image_size, label_header, label_size) in enumerate(columns):
            key = sample_key(first + j)
            os.pwrite(fd, tar_header(f"{key}.{extension}", image_size), image_header)
            os.pwrite(fd, tar_header(f"{key}.{LABEL_EXTENSION}", label_size), label_header)
    finally:
        os.close(fd)
