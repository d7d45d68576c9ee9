"""Write WebDataset shards (layout owned by ``readers/formats/webdataset.py``), in parallel.

The input list is cut into consecutive *pieces* (:meth:`ShardWriter.pieces`); a worker runs
:class:`PieceTask` on a piece: it converts each input with :class:`ImageTask` and writes the
piece's shard file(s) under temporary names inside ``DST.partial``, rolling into a new shard
whenever ``shard_size`` samples or ``shard_bytes`` member bytes would be exceeded. It returns
only bookkeeping (:class:`PieceResult`). The parent (:meth:`ShardWriter.add_piece`, in input
order) gives the shards their final numbers and names and records the member index.

Where the output goes is the writer's *sink* (:class:`ShardSink`): none, and the shards stay in
``DST.partial``, renamed to ``DST`` at the end; a sink (``packer/remote.py``'s uploader for a
URL DST) takes each shard as it is published, and the index, checksums and metadata (last) at
the end, so local disk holds only the shards not yet stored. When the tasks may run on other
machines than the writer (Ray with a sink: the writer's folder is local to the driver), a
piece's shards come back as bytes in :class:`PieceResult` instead of files (``in_memory``).

When there are fewer pieces than about two per worker (small datasets, or few large shards),
:meth:`ShardWriter.pieces` cuts each piece into *fragments*, consecutive runs of its inputs that
different workers convert at once. A fragment's task writes a bare tar member stream (members
only, no end-of-archive blocks); the parent (:meth:`ShardWriter.add_piece`, in order) copies the
streams into the piece's shard(s), rolling over exactly where one worker would have, and ends
each shard once. That costs the parent a copy of every byte, so with enough pieces (the scale
path) workers keep writing whole shards and the parent only renames them.

Sample keys are dense (``0 .. count-1``) even when inputs fail: a worker keys its samples as if
nothing before its piece had failed (first key = the piece's first input index); when earlier
inputs did fail, the parent rewrites the (fixed-width) member names in the 512-byte tar headers
in place before renaming the shard. A shard so renumbered is byte-identical to one written
with the right keys to begin with, and piece boundaries depend only on the options, never on
the worker count: the output is identical whatever the worker count (and whether pieces were fragmented).
"""

from __future__ import annotations

import dataclasses
import errno
import io
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from readers.formats.webdataset import (
    BLOCK,
    CHECKSUM_FILE,
    DEFAULT_PATTERN,
    EXTENSIONS,
    INDEX_COLUMNS,
    INDEX_FILE,
    LABEL_EXTENSION,
    META_FILE,
    RECORD,
    check_pattern,
    npy_header,
    sample_array_shape,
    sample_key,
    tar_header,
)
from readers.checksums import sample_checksum
from readers.schema import Metadata, PackedFormatError

from ..errors import OptionError
from ..options import ImageOptions, StorageOptions
from ..parallel import run_items
from ..preprocess.task import Encoded, Failed, ImageTask
from ..sources.images import ImageItem
from .base import Writer, remove_path
from .journal import Checkpoint

__all__ = ["ShardWriter", "ShardSink", "PieceTask", "Piece", "PieceResult", "split_destination", "DEFAULT_SHARD_SIZE"]

#: Inputs per piece (and so at most samples per shard) when neither bound is given.
DEFAULT_SHARD_SIZE = 1000
_TMP_PREFIX = ".piece-"
#: Fragment the pieces when there are fewer than this many per worker ...
_PIECES_PER_WORKER = 2
#: ... into fragments of at least this many inputs.
_MIN_FRAGMENT = 4
#: Workers from which fragments are worth a warning: their assembly in one process was the
#: bound at ~2,000 img/s with 16 workers (docs/SCALING.md), and not yet with 2.
_ASSEMBLY_BOUND_WORKERS = 8
#: ... and inputs (fewer convert in seconds either way).
_ASSEMBLY_BOUND_INPUTS = 10_000
#: Typical size reduction by encoding, to size pieces for ``--shard-bytes`` (a guess: a piece
#: that turns out larger rolls into sub-shards, so the bound holds either way).
_COMPRESSION = {"raw": 1, "jpeg": 10, "png": 2}

# Columns of the bookkeeping a worker returns per sample (the index columns minus ``shard``,
# plus where the two tar headers are, for renumbering, and the sample's checksum).
_OFFSET, _NBYTES, _LABEL, _C, _H, _W, _IMG_HEADER, _IMG_SIZE, _CLS_HEADER, _CLS_SIZE, _CRC = range(11)
_ROW = 11


def _npy_head(sample: Encoded) -> bytes:
    """The .npy header of a raw sample's member (pixels, or a document's token ids)."""
    return npy_header(sample_array_shape(sample.shape, sample.dtype), sample.dtype)


def split_destination(dst: Path) -> tuple[Path, str]:
    """``(folder, shard name pattern)`` of a DST: a folder, or ``folder/name-%06d.tar``."""
    dst = Path(dst)
    if "%" not in dst.name:
        if dst.name.endswith(".tar"):
            raise OptionError(f"{dst}: WebDataset output is a folder of shards: name a folder, or a pattern like out/train-%06d.tar")
        return dst, DEFAULT_PATTERN
    try:
        pattern = check_pattern(dst.name)
    except PackedFormatError as exc:
        raise OptionError(f"{dst}: {exc}") from None
    if not str(dst.parent) or str(dst.parent) == ".":
        raise OptionError(f"{dst}: put the shard pattern inside a folder of its own, for example out/{dst.name}")
    return dst.parent, pattern


@dataclass(frozen=True)
class Piece:
    """A run of consecutive inputs, converted and written by one worker.

    ``fragment``: ``None`` for a whole piece (the worker writes its shard files); else the
    fragment's position in piece ``number`` (``start`` is its own first input), whose task
    writes a bare member stream for the parent to assemble; ``last``: the piece's last one."""

    number: int
    start: int
    items: tuple[ImageItem, ...]
    fragment: int | None = None
    last: bool = True


class ShardSink(Protocol):
    """Where a :class:`ShardWriter` puts its finished files instead of renaming ``DST.partial``
    to ``DST`` (``packer/remote.py``'s ``Uploader`` stores them at a URL)."""

    def put(self, path: Path) -> None:
        """Store the finished file ``path`` under its name, then delete it; may block (back-pressure)."""

    def flush(self) -> None:
        """Return once everything put so far is stored; raise what failed."""

    def stored(self) -> dict[str, int]:
        """Names and sizes of the files stored so far (those of an interrupted run included)."""
        ...

    def remove(self, names: Sequence[str]) -> None:
        """Delete stored files (a resumed run drops shards stored after its checkpoint)."""

    def discard(self) -> None:
        """Stop storing and delete everything stored: the conversion failed."""


@dataclass(frozen=True)
class ShardPart:
    """One shard a worker wrote: its temporary name, size and per-sample bookkeeping, and its
    bytes when the worker returned it instead of writing a file (``in_memory``)."""

    tmp_name: str
    size: int
    rows: np.ndarray  # (samples, _ROW) int64, columns _OFFSET .. _CRC
    data: bytes | None = None


@dataclass(frozen=True)
class PieceResult:
    """What a worker did with a piece: shards written and inputs that failed (offset in piece)."""

    piece: int
    start: int
    inputs: int
    parts: tuple[ShardPart, ...] = ()
    failed: tuple[tuple[int, Failed], ...] = ()
    payload_bytes: int = 0
    error: tuple[int, str] | None = None  # an OSError while writing, as (errno, message)
    fragment: bool = False  # parts are bare member streams (at most one), to assemble
    last: bool = True  # the piece's last fragment (always, for a whole piece)


def _tar_end(position: int) -> int:
    """Where a tar whose members end at ``position`` ends: two zero blocks, padded to RECORD."""
    end = position + 2 * BLOCK
    return end + -end % RECORD


def _is_full(samples: int, member_bytes: int, incoming: int, shard_size: int | None, shard_bytes: int | None) -> bool:
    """Whether a shard of ``samples`` samples and ``member_bytes`` member bytes rolls over before
    a sample of ``incoming`` member bytes (workers and the parent's assembly decide alike)."""
    if shard_size is not None and samples >= shard_size:
        return True
    return shard_bytes is not None and member_bytes + incoming > shard_bytes


class _ShardFile:
    """One tar file being written sequentially (to ``folder``, else in memory), with the
    bookkeeping of its members."""

    def __init__(self, folder: str | None, name: str, encoding: str) -> None:
        self.path = Path(folder) / name if folder is not None else None
        self.name = name
        self.extension = EXTENSIONS[encoding]
        self.raw = encoding == "raw"
        self.handle: Any = open(self.path, "wb") if self.path is not None else io.BytesIO()
        self.position = 0
        self.member_bytes = 0
        self.rows: list[tuple[int, ...]] = []

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
        crc = sample_checksum(sample.label, sample.shape, sample.payload)
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

    def close(self, *, end_archive: bool = True) -> ShardPart:
        """Finish the file; ``end_archive=False``: members only (a fragment's stream)."""
        end = _tar_end(self.position) if end_archive else self.position
        self.handle.write(bytes(end - self.position))
        data = self.handle.getvalue() if self.path is None else None
        self.handle.close()
        rows = np.array(self.rows, np.int64).reshape(-1, _ROW)
        return ShardPart(self.name, end, rows, data)

    def discard(self) -> None:
        self.handle.close()
        if self.path is not None:
            self.path.unlink(missing_ok=True)


@dataclass(frozen=True)
class PieceTask:
    """Convert the inputs of a :class:`Piece` and write its shard file(s) into ``folder``
    (``None``: return each shard's bytes in its :class:`ShardPart` instead).

    Picklable (options and a path only); each worker opens its own files. ``task`` converts one
    input (default: :class:`ImageTask` of ``image``; a text conversion passes its tokenise task).
    """

    image: ImageOptions
    folder: str | None
    shard_size: int | None = None
    shard_bytes: int | None = None
    task: Callable[[Any], Encoded | Failed] | None = None

    def __call__(self, piece: Piece) -> PieceResult:
        task = self.task if self.task is not None else ImageTask(self.image)
        parts: list[ShardPart] = []
        failed: list[tuple[int, Failed]] = []
        shard: _ShardFile | None = None
        payload_bytes = 0
        written = 0
        raw = self.image.encoding == "raw"
        try:
            for offset, result in enumerate(run_items(task, piece.items)):
                if isinstance(result, Failed):
                    failed.append((offset, result))
                    continue
                if piece.fragment is None and shard is not None and self._full(shard, _ShardFile.sample_bytes(result, raw)):
                    parts.append(shard.close())
                    shard = None
                if shard is None:
                    suffix = f"{len(parts):04d}" if piece.fragment is None else f"f{piece.fragment:04d}"
                    name = f"{_TMP_PREFIX}{piece.number:06d}-{suffix}.tar"
                    shard = _ShardFile(self.folder, name, self.image.encoding)
                shard.add(piece.start + written, result)
                written += 1
                payload_bytes += len(result.payload)
            if shard is not None:
                parts.append(shard.close(end_archive=piece.fragment is None))
                shard = None
        except OSError as exc:
            if shard is not None:
                shard.discard()
            return PieceResult(piece.number, piece.start, len(piece.items), error=(exc.errno or 0, exc.strerror or str(exc)))
        return PieceResult(
            piece.number, piece.start, len(piece.items), tuple(parts), tuple(failed), payload_bytes, fragment=piece.fragment is not None,
            last=piece.last,
        )

    def _full(self, shard: _ShardFile, incoming: int) -> bool:
        return _is_full(len(shard.rows), shard.member_bytes, incoming, self.shard_size, self.shard_bytes)


class _Assembly:
    """A shard the parent assembles from fragments' member streams (see :meth:`ShardWriter.add_piece`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.handle = open(path, "wb")
        self.position = 0
        self.member_bytes = 0
        self.samples = 0
        self.rows: list[np.ndarray] = []
        self.renumber = False  # some fragment's keys are not this shard's

    def append(self, source: Any, rows: np.ndarray, start: int, end: int, *, keys_right: bool) -> None:
        """Copy bytes ``start:end`` of a member stream (the samples ``rows``) to the shard's end."""
        source.seek(start)
        left = end - start
        while left:
            chunk = source.read(min(left, 1 << 22))
            if not chunk:  # pragma: no cover - internal invariant
                raise OSError(errno.EIO, f"{self.path.name}: fragment stream shorter than its rows")
            self.handle.write(chunk)
            left -= len(chunk)
        rows = rows.copy()
        rows[:, [_OFFSET, _IMG_HEADER, _CLS_HEADER]] += self.position - start
        self.rows.append(rows)
        self.position += end - start
        self.member_bytes += int((rows[:, _IMG_SIZE] + rows[:, _CLS_SIZE]).sum())
        self.samples += len(rows)
        self.renumber |= not keys_right

    def close(self) -> ShardPart:
        """Write the end of the archive once; the finished shard, to publish."""
        end = _tar_end(self.position)
        self.handle.write(bytes(end - self.position))
        self.handle.close()
        return ShardPart(self.path.name, end, np.concatenate(self.rows))

    def discard(self) -> None:
        self.handle.close()
        self.path.unlink(missing_ok=True)


class ShardWriter(Writer):
    """Writes a folder of WebDataset shards, the shards themselves in worker processes.

    ``convert()`` drives it through :meth:`pieces`, :meth:`piece_task` and :meth:`add_piece`
    (``writes_pieces``), not through :meth:`add`.
    """

    format_name = "webdataset"
    is_directory = True
    writes_pieces = True
    takes_sink = True

    def __init__(self, dst: Path, storage: StorageOptions | None = None, *, sink: ShardSink | None = None, **journal: Any) -> None:
        """``sink``: where finished files go (see :class:`ShardSink`); ``None``: the folder ``DST``."""
        folder, self.pattern = split_destination(Path(dst))
        self.sink = sink
        super().__init__(folder, storage, **journal)

    @classmethod
    def destination(cls, dst: Path) -> Path:
        """The folder a DST names (a shard name pattern lives inside it)."""
        return split_destination(Path(dst))[0]

    # -- the parallel path -----------------------------------------------------------------
    def piece_inputs(self, image: ImageOptions) -> int:
        """Inputs per piece: ``shard_size``, else as many expected samples as fit ``shard_bytes``."""
        if self.storage.shard_size is not None:
            return self.storage.shard_size
        if self.storage.shard_bytes is not None and image.output_size is not None:
            height, width = image.output_size
            shape = (image.channels, height, width)
            expected = len(npy_header(shape)) + height * width * image.channels // _COMPRESSION[image.encoding] + 2
            return max(1, self.storage.shard_bytes // expected)
        return DEFAULT_SHARD_SIZE

    def pieces(self, items: Sequence[ImageItem], image: ImageOptions, *, workers: int | None = None) -> list[Piece]:
        """The inputs cut into consecutive pieces (depends on the options only, never on workers).

        After a resume, ``items`` are the inputs left (from :attr:`resumed_inputs`, always a piece
        boundary): the pieces keep the numbers and first keys of the uninterrupted run. With
        fewer pieces than ``2 * workers``, each is cut into fragments to keep every worker busy
        (the output is the same: the parent assembles the shards)."""
        size = self.piece_inputs(image)
        done = self.resumed_inputs
        pieces = [
            Piece((done + start) // size, done + start, tuple(items[start : start + size])) for start in range(0, len(items), size)
        ]
        if workers is None or workers < 2 or not pieces or len(pieces) >= _PIECES_PER_WORKER * workers:
            return pieces
        split = -(-_PIECES_PER_WORKER * workers // len(pieces))
        fragments = [fragment for piece in pieces for fragment in _fragments(piece, split)]
        if workers >= _ASSEMBLY_BOUND_WORKERS and len(items) >= _ASSEMBLY_BOUND_INPUTS and not self.resumed_inputs:
            # (a resumed run must keep its --shard-size: the journal's fingerprint holds it)
            logging.getLogger("packer").warning(
                "%d shard(s) for %d workers: this process assembles them from the workers' fragments, about 2,000 img/s "
                "at most; --shard-size %d lets every worker write shards of its own (docs/SCALING.md)",
                len(pieces), workers, len(items) // (_PIECES_PER_WORKER * workers),
            )
        return fragments

    def piece_task(
        self, image: ImageOptions, task: Callable[[Any], Encoded | Failed] | None = None, *, in_memory: bool = False
    ) -> PieceTask:
        """The picklable work unit that writes one piece's shards into ``DST.partial``, or with
        ``in_memory`` returns their bytes (for tasks that may run where that folder is not)."""
        self.encoding = image.encoding
        folder = None if in_memory else str(self.tmp)
        return PieceTask(image, folder, self.storage.shard_size, self.storage.shard_bytes, task)

    def add_piece(self, result: PieceResult) -> list[Failed | None]:
        """Number, rename and index a finished piece's shards (call in input order).

        Returns each input's outcome in the piece: ``None`` when written, else its
        :class:`Failed` (for the caller to record, or raise with ``--on-error fail``).
        """
        if result.error is not None:
            raise self.output_error(OSError(*result.error))
        assumed = result.start  # the key the worker gave its first sample
        try:
            if result.fragment:
                self._assemble(result)
            else:
                for part in result.parts:
                    self._publish_shard(part, renumber=assumed != self.count)
                    assumed += len(part.rows)
        except OSError as exc:
            raise self.output_error(exc) from None
        self.payload_bytes += result.payload_bytes
        self._bytes_since_checkpoint += result.payload_bytes
        if result.last:  # a checkpoint never falls inside a piece
            self._published_inputs = result.start + result.inputs
        outcomes: list[Failed | None] = [None] * result.inputs
        for offset, failure in result.failed:
            outcomes[offset] = failure
        return outcomes

    def _assemble(self, result: PieceResult) -> None:
        """Append a fragment's samples to the piece's open shard, rolling over into a new one
        exactly where a worker writing the whole piece would have; end it after the last fragment."""
        for part in result.parts:  # at most one member stream
            rows = part.rows
            sizes = (rows[:, _IMG_SIZE] + rows[:, _CLS_SIZE]).tolist()
            ends = [*rows[1:, _IMG_HEADER].tolist(), part.size]  # each sample's members end where the next begin
            source: Any = io.BytesIO(part.data) if part.data is not None else open(self.tmp / part.tmp_name, "rb")
            with source:
                first = 0
                while first < len(rows):
                    shard = self._assembly
                    if shard is not None and self._full(shard.samples, shard.member_bytes, sizes[first]):
                        self._close_assembly()
                        shard = None
                    if shard is None:
                        shard = self._assembly = _Assembly(self.tmp / f"{_TMP_PREFIX}shard-{len(self.shards):06d}.tar")
                    samples, member_bytes, stop = shard.samples + 1, shard.member_bytes + sizes[first], first + 1
                    while stop < len(rows) and not self._full(samples, member_bytes, sizes[stop]):
                        samples, member_bytes, stop = samples + 1, member_bytes + sizes[stop], stop + 1
                    keys_right = result.start + first == self.count + shard.samples
                    shard.append(source, rows[first:stop], int(rows[first, _IMG_HEADER]), ends[stop - 1], keys_right=keys_right)
                    first = stop
            if part.data is None:
                (self.tmp / part.tmp_name).unlink()
        if result.last and self._assembly is not None:
            self._close_assembly()

    def _full(self, samples: int, member_bytes: int, incoming: int) -> bool:
        return _is_full(samples, member_bytes, incoming, self.storage.shard_size, self.storage.shard_bytes)

    def _close_assembly(self) -> None:
        shard, self._assembly = self._assembly, None
        assert shard is not None
        self._publish_shard(shard.close(), renumber=shard.renumber)

    def _publish_shard(self, part: ShardPart, *, renumber: bool) -> None:
        rows = part.rows
        if part.data is not None:  # returned by the task (in_memory): the driver writes the file
            (self.tmp / part.tmp_name).write_bytes(part.data)
        if renumber:  # earlier inputs failed: the worker's keys are too high by that many
            self._renumber(self.tmp / part.tmp_name, rows, self.count)
        number = len(self.shards)
        name = self.pattern % number
        os.replace(self.tmp / part.tmp_name, self.tmp / name)
        if self.sink is not None:
            self.sink.put(self.tmp / name)  # uploaded, then deleted here; blocks while too many wait
        self._index.append(np.hstack([np.full((len(rows), 1), number, np.int64), rows[:, : _W + 1]]))
        self.shards.append(name)
        self.shard_counts.append(len(rows))
        self.shard_sizes.append(part.size)
        self.checksums.extend(rows[:, _CRC].tolist())
        if self._journal is not None:
            self._new_rows.extend(row + [crc] for row, crc in zip(self._index[-1].tolist(), rows[:, _CRC].tolist()))
            if self.sink is None:
                self._unsynced.append(name)
        for shape in sorted({tuple(r) for r in rows[:, _C : _W + 1].tolist()}):
            self._note_shape(shape)  # type: ignore[arg-type]
        self.count += len(rows)

    def _renumber(self, path: Path, rows: np.ndarray, first: int) -> None:
        extension = EXTENSIONS[self.encoding]
        fd = os.open(path, os.O_WRONLY)
        try:
            for j, row in enumerate(rows.tolist()):
                key = sample_key(first + j)
                os.pwrite(fd, tar_header(f"{key}.{extension}", row[_IMG_SIZE]), row[_IMG_HEADER])
                os.pwrite(fd, tar_header(f"{key}.{LABEL_EXTENSION}", row[_CLS_SIZE]), row[_CLS_HEADER])
        finally:
            os.close(fd)

    def _note_shape(self, shape: tuple[int, int, int]) -> None:
        if self.common_shape is None and not self._mixed_shapes:
            self.common_shape = shape
        elif shape != self.common_shape:
            self.common_shape, self._mixed_shapes = None, True

    def _write(self, index: int, sample: Encoded) -> None:
        raise NotImplementedError("ShardWriter writes its shards in worker processes: drive it with packer.convert()")

    # -- Writer hooks ------------------------------------------------------------------------
    def _checkpoint_ready(self, inputs: int) -> bool:
        return inputs == self._published_inputs  # only whole pieces are ever resumed

    def _sync(self) -> dict[str, Any]:
        if self.sink is not None:  # durable = stored by the sink
            self.sink.flush()
        for name in self._unsynced:
            fd = os.open(self.tmp / name, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fd = os.open(self.tmp, os.O_RDONLY)  # the renames
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self._unsynced.clear()
        return {"shards": list(self.shards), "shard_counts": list(self.shard_counts), "shard_sizes": list(self.shard_sizes),
                "encoding": self.encoding}

    def _reopen(self, checkpoint: Checkpoint) -> None:
        """Keep the shards the checkpoint lists; drop later shards and unpublished piece files
        (with a sink: the listed shards are in the sink, and every local file goes)."""
        self._init_lists()
        state = checkpoint.state
        self.shards, self.shard_counts, self.shard_sizes = list(state["shards"]), list(state["shard_counts"]), list(state["shard_sizes"])
        self.encoding = state["encoding"]
        self._published_inputs = checkpoint.inputs
        if checkpoint.rows.size:
            self._index.append(np.ascontiguousarray(checkpoint.rows[:, : len(INDEX_COLUMNS)]))
        keep = set(self.shards) if self.sink is None else set()
        for path in self.tmp.iterdir():
            if path.name not in keep:
                path.unlink()
        if self.sink is None:
            sizes = {name: (self.tmp / name).stat().st_size for name in self.shards}
        else:
            sizes = self.sink.stored()
            self.sink.remove(sorted(set(sizes) - set(self.shards)))
        for name, size in zip(self.shards, self.shard_sizes):
            if sizes.get(name) != size:
                raise OSError(0, f"shard {name} changed since the checkpoint; run without --resume")

    def _init_lists(self) -> None:
        self.encoding = "raw"
        self.shards: list[str] = []
        self.shard_counts: list[int] = []
        self.shard_sizes: list[int] = []
        self._index: list[np.ndarray] = []
        self._unsynced: list[str] = []
        self._published_inputs = 0
        self._assembly: _Assembly | None = None

    def _open(self) -> None:
        self.tmp.mkdir()
        self._init_lists()
        if self.sink is not None:  # a fresh start: nothing an earlier unfinished run stored stays
            self.sink.remove(sorted(self.sink.stored()))

    def extra(self) -> dict[str, Any]:
        """Shard names, samples and bytes per shard, and the index file's name and columns."""
        return {
            "shards": list(self.shards),
            "shard_counts": list(self.shard_counts),
            "shard_sizes": list(self.shard_sizes),
            "shard_pattern": self.pattern,
            "index": INDEX_FILE,
            "index_columns": list(INDEX_COLUMNS),
        }

    def _write_metadata(self, meta: Metadata) -> None:
        meta = dataclasses.replace(meta, extra={**meta.extra, **self.extra()})
        index = np.concatenate(self._index) if self._index else np.empty((0, len(INDEX_COLUMNS)), np.int64)
        np.save(self.tmp / INDEX_FILE, np.ascontiguousarray(index, np.int64), allow_pickle=False)
        np.save(self.tmp / CHECKSUM_FILE, self.checksum_array(), allow_pickle=False)
        leftovers = [p.name for p in self.tmp.iterdir() if p.name.startswith(_TMP_PREFIX)]
        if leftovers:  # pragma: no cover - internal invariant
            raise OSError(errno.EIO, f"unpublished shard files {leftovers}")
        (self.tmp / META_FILE).write_text(meta.to_json(), encoding="ascii")

    def _publish(self) -> None:
        """Without a sink: rename ``DST.partial`` to ``DST``. With one: store the index and
        checksums, wait until every file is stored, then store the metadata record last."""
        if self.sink is None:
            super()._publish()
            return
        for name in (INDEX_FILE, CHECKSUM_FILE):
            self.sink.put(self.tmp / name)
        self.sink.flush()
        self.sink.put(self.tmp / META_FILE)
        self.sink.flush()
        remove_path(self.tmp)

    def abort(self) -> None:
        """Drop the unfinished output, and what the sink stored of it."""
        assembly, self._assembly = getattr(self, "_assembly", None), None
        if assembly is not None:
            assembly.discard()
        try:
            super().abort()
        finally:
            if self.sink is not None:
                self.sink.discard()


def _fragments(piece: Piece, split: int) -> list[Piece]:
    """``piece`` cut into at most ``split`` consecutive fragments of at least ``_MIN_FRAGMENT``
    inputs (sizes differing by at most one); one fragment is the whole piece, unfragmented."""
    count = max(1, min(split, len(piece.items) // _MIN_FRAGMENT))
    if count == 1:
        return [piece]
    base, extra = divmod(len(piece.items), count)
    fragments, offset = [], 0
    for j in range(count):
        size = base + (j < extra)
        items = piece.items[offset : offset + size]
        fragments.append(Piece(piece.number, piece.start + offset, items, fragment=j, last=j == count - 1))
        offset += size
    return fragments
