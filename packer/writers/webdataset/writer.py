"""The WebDataset writer (:class:`ShardWriter`): cuts the inputs into pieces, publishes what
the workers wrote (renaming or assembling, renumbering when earlier inputs failed), records
the member index and resumes at a checkpoint. The package docstring tells the whole story.
"""

from __future__ import annotations

import dataclasses
import errno
import io
import logging
import os
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from readers.formats.webdataset import (
    CHECKSUM_FILE,
    DEFAULT_PATTERN,
    INDEX_FILE,
    INDEX_COLUMNS,
    META_FILE,
    SHARD_TOKENS, SOURCES_FILE,
    check_pattern, shard_tokens,
    index_array,
)
from readers.formats.npy import npy_header
from readers.formats.wids import WIDS_FILE, wids_index
from readers.formats import open_store
from readers.formats.inprogress import is_empty_folder
from readers.schema import Metadata, PackedFormatError

from ...destination import describe_path, is_packer_dataset
from ...errors import OptionError
from ...options import ImageOptions, StorageOptions
from ...preprocess.task import Encoded, Failed
from ..base import remove_path
from ..piece_writer import Piece, PieceWriter, Written
from ...files import fsync_path
from ..journal import ROW_DTYPE, Checkpoint
from .destination import RemoteShards, pattern_refusal
from .pieces import PieceResult, PieceTask, fragments
from .tar import TMP_PREFIX, Assembly, ShardPart, is_full, renumber

__all__ = ["ShardWriter", "ShardSink", "split_destination", "DEFAULT_SHARD_SIZE"]

#: Inputs per piece (and so at most samples per shard) when neither bound is given.
DEFAULT_SHARD_SIZE = 1000
#: Fragment the pieces when there are fewer than this many per worker ...
_PIECES_PER_WORKER = 2
#: Workers from which fragments are worth a warning: their assembly in one process was the
#: bound with 16 workers on a 16-core host (an uncommitted run, docs/SCALING.md), and not with 2.
_ASSEMBLY_BOUND_WORKERS = 8
#: ... and inputs (fewer convert in seconds either way).
_ASSEMBLY_BOUND_INPUTS = 10_000


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
        """Stop storing and delete everything stored: the conversion failed (not once :meth:`publish` began)."""

    def stop(self) -> None:
        """Stop at once (the run was interrupted): drop what waits, fail a flush waiting, and leave
        what is being stored (no checkpoint lists it)."""

    def publish(self) -> None:
        """Everything is stored, the metadata record last: make it the destination (raise what
        failed; what is stored stays, whole, for ``--resume`` to publish again)."""

    def clean_up(self) -> None:
        """After :meth:`publish`, once the journal is gone: remove what only publishing needed."""

    @property
    def publishing(self) -> bool:
        """Whether :meth:`publish` began."""
        ...



def _tail_fragmented(pieces: list[Piece], workers: int) -> list[Piece]:
    """``pieces`` with the last round's cut into fragments for every worker.

    Workers take whole pieces in order, so with ``len(pieces) % workers`` pieces left for the
    last round the other workers would idle through it (36 shards for 16 workers: three rounds
    of work for two and a quarter; docs/SCALING.md has the measurements). Cut into
    ``ceil(workers / left)`` fragments each, that round is spread over every worker; the parent
    assembles only those shards (the output is the same)."""
    left = len(pieces) % workers
    if left == 0:
        return pieces
    split = -(-workers // left)
    return pieces[:-left] + [fragment for piece in pieces[-left:] for fragment in fragments(piece, split)]


class ShardWriter(PieceWriter):
    """Writes a folder of WebDataset shards, the shards themselves in worker processes.

    ``convert()`` drives it as a :class:`~packer.writers.piece_writer.PieceWriter`: :meth:`pieces`,
    :meth:`piece_task` and :meth:`add_piece`, not :meth:`add`.
    """

    format_name = "webdataset"
    storage_fields = ("shard_size", "shard_bytes")
    remote = RemoteShards
    is_directory = True
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

    @classmethod
    def refuse_replacing(cls, dst: Path) -> str | None:
        """A shard pattern into a folder holding a WebDataset of other shard names (``val-%06d.tar``
        beside ``train-%06d.tar``): the folder is one dataset, and replacing it would delete those
        shards. (A DST naming the folder itself replaces that dataset, whatever its names.)"""
        if "%" not in Path(dst).name:
            return None
        folder, pattern = split_destination(Path(dst))
        if folder.is_dir() and not is_packer_dataset(folder) and not is_empty_folder(folder.resolve()):  # (it said --overwrite would not help)
            return (f"{folder}: holds files that are not a packer dataset ({describe_path(folder)}); WebDataset shards are "
                    f"written into a folder of their own, new or empty: for example {folder / 'shards' / pattern}")
        try:
            meta = open_store(folder).meta
        except (PackedFormatError, OSError, ValueError):
            return None
        return pattern_refusal(str(folder), pattern, meta)

    # -- the parallel path -----------------------------------------------------------------
    def piece_inputs(self, sample_bytes: int | None = None) -> int:
        """Inputs per piece: ``shard_size``, else as many samples of about ``sample_bytes`` (the
        job's estimate of a payload, ``Job.expected_sample_bytes``) as fit ``shard_bytes``, each
        with its ``.npy`` header and ``.cls`` member; else :data:`DEFAULT_SHARD_SIZE`. A text
        corpus's pieces were always the default, so its shards never held more documents than
        that, whatever ``--shard-bytes`` allowed."""
        if self.storage.shard_size is not None:
            return self.storage.shard_size
        if self.storage.shard_bytes is not None and sample_bytes is not None:
            return max(1, self.storage.shard_bytes // (len(npy_header((1, 1, 1))) + sample_bytes + 2))
        return DEFAULT_SHARD_SIZE

    def pieces(self, items: Sequence[Any], image: ImageOptions, *, workers: int | None = None,
               sample_bytes: int | None = None) -> list[Piece]:
        """The inputs cut into consecutive pieces (depends on the options only, never on workers).

        After a resume, ``items`` are the inputs left (from :attr:`resumed_inputs`, always a piece
        boundary): the pieces keep the numbers and first keys of the uninterrupted run. With
        fewer pieces than ``2 * workers``, each is cut into fragments to keep every worker busy
        (the output is the same: the parent assembles the shards); with more, only the last
        round's pieces are (:func:`_tail_fragmented`)."""
        size = self.piece_inputs(sample_bytes)
        done = self.resumed_inputs
        pieces = [
            Piece((done + start) // size, done + start, items[start : start + size]) for start in range(0, len(items), size)
        ]
        if workers is None or workers < 2 or not pieces:
            return pieces
        if len(pieces) >= _PIECES_PER_WORKER * workers:
            return _tail_fragmented(pieces, workers)
        split = -(-_PIECES_PER_WORKER * workers // len(pieces))
        cut = [fragment for piece in pieces for fragment in fragments(piece, split)]
        if workers >= _ASSEMBLY_BOUND_WORKERS and len(items) >= _ASSEMBLY_BOUND_INPUTS and not self.resumed_inputs:
            # (a resumed run must keep its --shard-size: the journal's fingerprint holds it)
            logging.getLogger("packer").warning(
                "%d shard(s) for %d workers: this process assembles them from the workers' fragments, a bound of its own "
                "on the rate; --shard-size %d lets every worker write shards of its own (docs/SCALING.md)",
                len(pieces), workers, len(items) // (_PIECES_PER_WORKER * workers),
            )
        return cut

    def piece_task(
        self, image: ImageOptions, task: Callable[[Any], Encoded | Failed] | None = None, *, in_memory: bool = False
    ) -> PieceTask:
        """The picklable work unit that writes one piece's shards into ``DST.partial``, or with
        ``in_memory`` returns their bytes (for tasks that may run where that folder is not)."""
        self.encoding = image.encoding
        folder = None if in_memory else str(self.tmp)
        return PieceTask(image, folder, self.storage.shard_size, self.storage.shard_bytes, task)

    def add_piece(self, result: PieceResult) -> list[Failed | Written | None]:
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
                    self._publish_shard(part, renumber_keys=assumed != self.count)
                    assumed += len(part.rows)
        except OSError as exc:
            raise self.output_error(exc) from None
        if result.last:  # a checkpoint never falls inside a piece
            self._published_inputs = result.start + result.inputs
        outcomes: list[Failed | Written | None] = [None] * result.inputs
        for offset, failure in result.failed:
            outcomes[offset] = failure
        for offset, text in result.messages:
            outcomes[offset] = Written(text)
        return outcomes

    def _assemble(self, result: PieceResult) -> None:
        """Append a fragment's samples to the piece's open shard, rolling over into a new one
        exactly where a worker writing the whole piece would have; end it after the last fragment."""
        for part in result.parts:  # at most one member stream
            rows = part.rows
            sizes = (rows["image_size"] + rows["label_size"]).tolist()
            ends = [*rows["image_header"][1:].tolist(), part.size]  # each sample's members end where the next begin
            source: Any = io.BytesIO(part.data) if part.data is not None else open(self.tmp / part.tmp_name, "rb")
            with source:
                first = 0
                while first < len(rows):
                    shard = self._assembly
                    if shard is not None and self._full(shard.samples, shard.member_bytes, sizes[first]):
                        self._close_assembly()
                        shard = None
                    if shard is None:
                        shard = self._assembly = Assembly(self.tmp / f"{TMP_PREFIX}shard-{len(self.shards):06d}.tar")
                    samples, member_bytes, stop = shard.samples + 1, shard.member_bytes + sizes[first], first + 1
                    while stop < len(rows) and not self._full(samples, member_bytes, sizes[stop]):
                        samples, member_bytes, stop = samples + 1, member_bytes + sizes[stop], stop + 1
                    keys_right = result.start + first == self.count + shard.samples
                    shard.append(source, rows[first:stop], int(rows["image_header"][first]), ends[stop - 1], keys_right=keys_right)
                    first = stop
            if part.data is None:
                (self.tmp / part.tmp_name).unlink()
        if result.last and self._assembly is not None:
            self._close_assembly()

    def _full(self, samples: int, member_bytes: int, incoming: int) -> bool:
        return is_full(samples, member_bytes, incoming, self.storage.shard_size, self.storage.shard_bytes)

    def _close_assembly(self) -> None:
        shard, self._assembly = self._assembly, None
        assert shard is not None
        self._publish_shard(shard.close(), renumber_keys=shard.renumber)

    def _publish_shard(self, part: ShardPart, *, renumber_keys: bool) -> None:
        """Number and name a finished shard, hand it to the sink if any, and book its samples."""
        rows = part.rows
        if part.data is not None:  # returned by the task (in_memory): the driver writes the file
            (self.tmp / part.tmp_name).write_bytes(part.data)
        if renumber_keys:  # earlier inputs failed: the worker's keys are too high by that many
            renumber(self.tmp / part.tmp_name, rows, self.count, self.encoding)
        number = len(self.shards)
        name = self.pattern % number
        os.replace(self.tmp / part.tmp_name, self.tmp / name)
        if self.sink is not None:
            self.sink.put(self.tmp / name)  # uploaded, then deleted here; blocks while too many wait
        written = np.empty(len(rows), ROW_DTYPE)  # the index record and checksum of each sample
        written["shard"] = number
        for field in ROW_DTYPE.names or ():
            if field != "shard":
                written[field] = rows[field]
        self._index.append(written)
        self.shards.append(name)
        self.shard_counts.append(len(rows))
        self.shard_sizes.append(part.size)
        if self.sink is None:
            self._unsynced.append(name)
        self._record_rows(written)

    # -- Writer hooks ------------------------------------------------------------------------
    def _checkpoint_ready(self, inputs: int) -> bool:
        return inputs == self._published_inputs  # only whole pieces are ever resumed

    @property
    def durable_in_background(self) -> bool:
        """Without a sink: the published shards (never written again) are ``fsync``ed in a
        thread, so the driver goes on handing out pieces meanwhile."""
        return self.sink is None

    def _sync(self) -> dict[str, Any]:
        if self.sink is not None:  # durable = stored by the sink
            self.sink.flush()
        self._syncing, self._unsynced = self._unsynced, []  # made durable by _durable, next
        return {"shards": list(self.shards), "shard_counts": list(self.shard_counts), "shard_sizes": list(self.shard_sizes),
                "encoding": self.encoding}

    def _durable(self) -> None:
        """The shards the checkpoint lists, and the renames that named them (in the committing
        thread: the driver may publish more shards meanwhile, which the next checkpoint lists)."""
        for name in self._syncing:
            fsync_path(self.tmp / name, release=True)  # never read while the conversion runs
        fsync_path(self.tmp)  # the renames
        self._syncing = []

    def _reopen(self, checkpoint: Checkpoint) -> None:
        """Keep the shards the checkpoint lists; drop later shards and unpublished piece files
        (with a sink: the listed shards are in the sink, and every local file goes)."""
        self._init_lists()
        state = checkpoint.state
        self.shards, self.shard_counts, self.shard_sizes = list(state["shards"]), list(state["shard_counts"]), list(state["shard_sizes"])
        self.encoding = state["encoding"]
        self._published_inputs = checkpoint.inputs
        if len(checkpoint.rows):
            self._index.append(checkpoint.rows)
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
        self._unsynced: list[str] = []  # published shards no checkpoint has listed yet
        self._syncing: list[str] = []  # those the checkpoint in flight makes durable
        self._published_inputs = 0
        self._assembly: Assembly | None = None

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
            "wids_index": WIDS_FILE,
        }

    def _write_metadata(self, meta: Metadata) -> None:
        rows = np.concatenate(self._index) if self._index else np.empty(0, ROW_DTYPE)
        tokens = {SHARD_TOKENS: shard_tokens(rows, len(self.shards))} if meta.kind == "text" else {}  # (StreamingShards' blocks)
        meta = dataclasses.replace(meta, extra={**meta.extra, **self.extra(), **tokens})
        np.save(self.tmp / INDEX_FILE, index_array(rows), allow_pickle=False)  # the plain (count, 7) int64 array
        np.save(self.tmp / CHECKSUM_FILE, self.checksum_array(), allow_pickle=False)
        names = self.source_names_bytes()
        if names is not None:
            (self.tmp / SOURCES_FILE).write_bytes(names)
        (self.tmp / WIDS_FILE).write_bytes(wids_index(self.pattern, self.shards, self.shard_counts, self.shard_sizes))
        leftovers = [p.name for p in self.tmp.iterdir() if p.name.startswith(TMP_PREFIX)]
        if leftovers:  # pragma: no cover - internal invariant
            raise OSError(errno.EIO, f"unpublished shard files {leftovers}")
        (self.tmp / META_FILE).write_text(meta.to_json(), encoding="ascii")

    def _publish(self) -> None:
        """Without a sink: rename ``DST.partial`` to ``DST``. With one: store the index and
        checksums, wait until every file is stored, then store the metadata record last."""
        if self.sink is None:
            super()._publish()
            return
        for name in (INDEX_FILE, CHECKSUM_FILE, SOURCES_FILE, WIDS_FILE):
            if (self.tmp / name).exists():
                self.sink.put(self.tmp / name)
        self.sink.flush()
        self.sink.put(self.tmp / META_FILE)
        self.sink.publish()  # (a failure keeps the checkpoint: _keeps)
        remove_path(self.tmp)

    def _last_checkpoint_now(self) -> None:
        """With a sink, a checkpoint of every input whether one is due or not: publishing may
        fail, and --resume then publishes the whole upload with nothing to convert again."""
        if self.sink is not None and self._journal is not None and self._seen is not None:
            self._deferred = True
        super()._last_checkpoint_now()

    def finish(self, meta: Metadata) -> None:
        """As a local run's; then a sink cleans up, the journal gone (the dataset is complete)."""
        super().finish(meta)
        if self.sink is not None:
            self.sink.clean_up()

    def suspend(self) -> None:
        """As a local run's; a sink stops first, its uploads in progress not waited for (nor by a
        checkpoint being committed: it is dropped, the one before stands)."""
        if self.sink is not None:
            self.sink.stop()
        super().suspend()

    def _keeps(self, exc_type: type[BaseException]) -> bool:
        """As a local run's, and a sink's publishing that failed: what it stored is whole."""
        return super()._keeps(exc_type) or (self.sink is not None and self.sink.publishing)

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

