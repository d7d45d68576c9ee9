"""What every writer shares: sample bookkeeping and atomic publication.

A writer fills a temporary ``DST.partial`` and, in :meth:`Writer.finish`, writes the metadata
record last, syncs everything to disk and renames the result to ``DST``. Until then no reader
accepts the output: the temporary name is not ``DST``, and it has no metadata. :meth:`abort`
removes the temporary output.

Most writers take samples one at a time in this process (:meth:`Writer.add`); a
:class:`~packer.writers.piece_writer.PieceWriter` has worker processes write its output, a piece
of consecutive inputs each (WebDataset shards), and declares the calls the driver makes instead.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from array import array
from pathlib import Path
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np

from readers.checksums import CHECKSUM, CHECKSUM_DTYPE, sha256_of_checksums
from readers.formats.names import EncodedNames
from readers.schema import Metadata, Skipped

from . import journal as _journal
from .checkpoints import Committer
from ..files import fsync_tree, partial_path, publish, remove_path
from ..destination import write_error
from ..errors import InputError, OptionError, OutputError, OutputExistsError, SourceChangedError
from ..interrupts import signals_deferred
from ..locking import DestinationLock, lock_path
from ..options import StorageOptions
from ..placement import Placed
from ..preprocess.task import Encoded

__all__ = ["Writer", "partial_path", "remove_path", "fsync_tree", "publish"]


class Writer:
    """Base writer: counts samples, tracks whether all share one shape, publishes atomically."""

    format_name: ClassVar[str] = ""
    #: How the format is written to a URL DST (a :class:`~packer.remote.RemoteDestination`);
    #: ``None``: it is not (convert locally and copy).
    remote: ClassVar[Any] = None
    #: Whether the output is a folder (True) or a single file (False).
    is_directory: ClassVar[bool] = False
    #: Whether the writer can hand its output to a *sink* (a URL DST: packer/remote.py)
    #: instead of renaming it to ``DST``; such a writer takes a ``sink`` keyword.
    takes_sink: ClassVar[bool] = False
    #: The :class:`~packer.options.StorageOptions` fields this format uses (others are refused).
    storage_fields: ClassVar[tuple[str, ...]] = ()
    #: Whether a checkpoint also falls due by time (every few seconds). False: only at fixed
    #: points of the sample stream (bytes, samples), for a format whose bytes depend on where its
    #: syncs fall (HDF5), so that its output is the same whatever the machine's speed.
    timed_checkpoints: ClassVar[bool] = True

    @classmethod
    def destination(cls, dst: Path) -> Path:
        """The path the finished output will have, for a DST as given (the same, for most formats)."""
        return Path(dst)

    @classmethod
    def refuse_replacing(cls, dst: Path) -> str | None:
        """Why this conversion must not replace what is at :meth:`destination` even with
        ``--overwrite`` (the line to show), beyond the rules every format shares
        (``packer/destination.py``); ``None``: nothing more."""
        return None

    def __init__(
        self, dst: Path, storage: StorageOptions | None = None, *, fingerprint: Mapping[str, Any] | None = None, resume: bool = False
    ) -> None:
        """Open ``DST.partial``. With a ``fingerprint`` the writer keeps a resume journal
        (``packer/writers/journal.py``); with ``resume`` too, it carries on from the journal's
        last checkpoint (:attr:`resumed_inputs` inputs done) instead of starting over."""
        self.dst = Path(dst)
        #: True once :meth:`finish` has published the output.
        self.finished = False
        self.storage = storage if storage is not None else StorageOptions()
        self.tmp = partial_path(self.dst)
        # before anything touches DST.partial: it may be another conversion's, still running
        self._lock = DestinationLock(lock_path(self.tmp), str(self.dst)).acquire()
        try:
            self._start(fingerprint, resume)
        except BaseException:
            self._lock.release()
            raise

    def _start(self, fingerprint: Mapping[str, Any] | None, resume: bool) -> None:
        """Set up the bookkeeping, then open a fresh ``DST.partial`` or reopen a checkpoint's."""
        self.count = 0
        self.payload_bytes = 0
        self.common_shape: tuple[int, int, int] | None = None
        self._mixed_shapes = False
        #: Per-sample checksums (readers/checksums.py), in sample order; the format stores them.
        self.checksums = array("I")
        #: Per-sample source names (:meth:`record_source`), in sample order, held in their stored
        #: form; ``None`` once they no longer match the samples (a caller that adds samples
        #: without naming them).
        self.source_names: EncodedNames | None = EncodedNames()
        self._new_names: list[str] = []
        #: Inputs an interrupted run had already dealt with (``resume``), and those it skipped.
        self.resumed_inputs = 0
        self.resumed_skipped: list[Skipped] = []
        self._journal = _journal.Journal(self.tmp, fingerprint) if fingerprint is not None else None
        self._new_rows: list[tuple[int, ...]] = []  # journal rows (fields of ROW_DTYPE) since the last checkpoint
        self._last_checkpoint, self._checkpoint_inputs = time.monotonic(), 0
        self._bytes_since_checkpoint = 0
        self._committer = Committer()
        self._seen: tuple[int, Sequence[Skipped]] | None = None  # the last progress() call's inputs and skips
        self._deferred = False  # a checkpoint fell due while the last commit still ran
        checkpoint = None
        if resume and self._journal is not None and self.tmp.exists():
            try:
                checkpoint = self._journal.load()
            except _journal.ResumeRefused as exc:  # nothing is touched: the partial output stays for a correct --resume
                raise OptionError(f"--resume: {exc}; {exc.advice}, or with --overwrite instead of --resume to "
                                  "discard it and start over") from None
        if checkpoint is None:
            self._refuse_foreign_leftover()  # before the try: its clean-up removes DST.partial
        if resume and checkpoint is None:
            logging.getLogger("packer").warning("--resume: no interrupted conversion to %s to resume; starting over", self.dst)
        try:
            if checkpoint is None:
                remove_path(self.tmp)  # a stale leftover of an interrupted run
                if self._journal is not None:
                    self._journal.start()
                self._open()
            else:
                self._restore(checkpoint)
        except BaseException as exc:  # an error, or a fresh output interrupted as it opened (an LMDB's map): none of it kept
            if checkpoint is None or isinstance(exc, OSError):
                self.abort()
            if isinstance(exc, OSError):
                raise self.output_error(exc) from None
            raise

    def _refuse_foreign_leftover(self) -> None:
        """Raise :class:`OutputExistsError` where ``DST.partial`` or its journal folder is not
        packer's leftover: a user's file of that name is never removed."""
        problem = _journal.foreign_leftover(self.tmp)
        if problem is not None:
            raise OutputExistsError(f"{self.dst}: {problem}; move it away (packer removes only what its own conversions left)")

    # -- what a format supplies ---------------------------------------------------------
    def _open(self) -> None:
        raise NotImplementedError

    def _write(self, index: int, sample: Encoded) -> None:
        raise NotImplementedError

    def _write_metadata(self, meta: Metadata) -> None:
        """Write the metadata record and close every handle."""
        raise NotImplementedError

    def _close(self) -> None:
        """Close handles without finishing (used by :meth:`abort`)."""

    def _sync(self) -> dict[str, Any]:
        """Hand every sample added so far to the OS, and make it durable unless :meth:`_durable`
        does; return the state :meth:`_reopen` needs (JSON)."""
        raise NotImplementedError

    def _durable(self) -> None:
        """Make what :meth:`_sync` handed over durable (``fsync``), where ``_sync`` does not."""

    @property
    def durable_in_background(self) -> bool:
        """Whether :meth:`_durable` may run in a thread beside the writing (packer/writers/checkpoints.py)."""
        return False

    def _reopen(self, checkpoint: _journal.Checkpoint) -> None:
        """Open the partial output of an interrupted run, cut back to ``checkpoint``."""
        raise NotImplementedError

    def _checkpoint_bytes(self) -> int:
        """Payload bytes after which a checkpoint is due (even if not :data:`~_journal.CHECKPOINT_SECONDS` passed)."""
        return _journal.BACKGROUND_CHECKPOINT_BYTES if self.durable_in_background else _journal.CHECKPOINT_BYTES

    def _committed(self) -> None:
        """A checkpoint was just committed (a sink may now store what it made durable)."""

    def _checkpoint_ready(self, inputs: int) -> bool:
        """Whether a checkpoint may be taken after ``inputs`` inputs (WebDataset: piece ends only)."""
        return True

    def extra(self) -> dict[str, Any]:
        """Format-specific details for :attr:`Metadata.extra` (none by default)."""
        return {}

    def _publish(self) -> None:
        """Make the finished ``DST.partial`` the output: sync it and rename it to ``DST``."""
        publish(self.tmp, self.dst)

    # -- driving --------------------------------------------------------------------------
    def add(self, sample: Encoded | Placed) -> None:
        """Append one sample; it gets the next index. A :class:`~packer.placement.Placed` one
        was written by a worker (only a writer that gave it a placement gets such samples)."""
        self._note_shape(sample.shape)
        try:
            self._write(self.count, sample)
        except OSError as exc:
            raise self.output_error(exc) from None
        crc = sample.checksum  # computed in the worker
        self.checksums.append(crc)
        if self._journal is not None:
            self._new_rows.append(_journal.sample_row(sample.nbytes, sample.label, sample.shape, crc))
            self._bytes_since_checkpoint += sample.nbytes
        self.count += 1
        self.payload_bytes += sample.nbytes

    def _note_shape(self, shape: tuple[int, int, int]) -> None:
        """Track whether every sample so far has ``shape`` (see :attr:`shape`)."""
        if self.common_shape is None and not self._mixed_shapes:
            self.common_shape = shape
        elif shape != self.common_shape:
            self.common_shape, self._mixed_shapes = None, True

    def _note_shapes(self, rows: np.ndarray) -> None:
        for shape in sorted({tuple(s) for s in _journal.record_shapes(rows).tolist()}):
            self._note_shape(shape)  # type: ignore[arg-type]

    def _record_rows(self, rows: np.ndarray) -> None:
        """Book samples this writer wrote without :meth:`add` (worker processes wrote them):
        ``rows`` are their :data:`~_journal.ROW_DTYPE` records, in sample order, numbered from
        :attr:`count`. Counts them and their payload bytes, keeps their checksums, tracks their
        shapes and queues their rows for the journal's next checkpoint."""
        assert rows.dtype == _journal.ROW_DTYPE, rows.dtype  # fields by name: no positional casts
        nbytes = int(rows["nbytes"].sum())
        self._note_shapes(rows)
        self.checksums.extend((rows["crc32"] & 0xFFFFFFFF).tolist())
        if self._journal is not None:
            self._new_rows.extend(rows.tolist())
            self._bytes_since_checkpoint += nbytes
        self.count += len(rows)
        self.payload_bytes += nbytes

    def record_source(self, name: str) -> None:
        """Name the input the last sample booked came from (relative to the source); the driver
        calls it once per written sample, in order. The format stores the names
        (``readers/formats/names.py``) when every sample has one."""
        if self.source_names is not None:
            self.source_names.append(name)
            if self._journal is not None:
                self._new_names.append(name)

    def source_names_bytes(self) -> bytes | None:
        """The stored form of the source names, or ``None`` unless every sample has one."""
        names = self.source_names
        return names.to_bytes() if names is not None and len(names) == self.count else None

    def progress(self, inputs: int, skipped: Sequence[Skipped]) -> None:
        """``inputs`` inputs are dealt with (``skipped`` of them not written): commit a checkpoint
        to the resume journal when one is due (every few seconds, or without :attr:`timed_checkpoints`
        every few thousand inputs, or tens of MB); with
        :attr:`durable_in_background`, its ``fsync`` and commit run beside the writing."""
        if self._journal is None:
            return
        self._seen = (inputs, skipped)
        if self.timed_checkpoints:
            due = time.monotonic() - self._last_checkpoint >= _journal.CHECKPOINT_SECONDS
        else:
            due = inputs - self._checkpoint_inputs >= _journal.UNTIMED_CHECKPOINT_INPUTS
        try:
            self._committer.check()  # a background commit's error
            if not (due or self._bytes_since_checkpoint >= self._checkpoint_bytes()) or not self._checkpoint_ready(inputs):
                return
            if self._committer.busy and self.timed_checkpoints:  # the last one is still being made durable: the next chance
                self._deferred = True
                return
            self._committer.wait()  # (untimed: at this sample, however long the last one takes)
            self._checkpoint(inputs, skipped, background=self.durable_in_background)
        except OSError as exc:
            raise self.output_error(exc) from None

    def _checkpoint(self, inputs: int, skipped: Sequence[Skipped], *, background: bool) -> None:
        """Commit a checkpoint of everything added so far (``inputs`` dealt with): now, or with
        its slow half in the background (packer/writers/checkpoints.py)."""
        assert self._journal is not None
        self._deferred = False
        state = self._sync()
        rows = np.array(self._new_rows, _journal.ROW_DTYPE)
        if self.source_names is not None and len(self.source_names) != self.count:
            self.source_names = None  # samples without names: none are stored (and none journaled)
        names = self._new_names if self.source_names is not None else []
        checkpoint = _journal.Checkpoint(inputs, self.count, self.payload_bytes, list(skipped), state)
        self._new_rows, self._new_names = [], []
        if background:
            self._committer.start(lambda: self._commit(checkpoint, rows, names))
        else:
            self._commit(checkpoint, rows, names)
        self._last_checkpoint, self._checkpoint_inputs = time.monotonic(), inputs
        self._bytes_since_checkpoint = 0

    def _commit(self, checkpoint: _journal.Checkpoint, rows: np.ndarray, names: list[str]) -> None:
        """The slow half of a checkpoint: durable output, then the journal's record of it."""
        assert self._journal is not None
        self._durable()
        self._journal.commit(checkpoint, rows, names)
        self._committed()

    def _settle(self, *, raise_error: bool) -> None:
        """Wait for a background commit (before anything closes the output or reads the journal)."""
        try:
            self._committer.wait()
        except OSError as exc:
            if raise_error:
                raise self.output_error(exc) from None

    def _last_checkpoint_now(self) -> None:
        """Before finishing: a checkpoint that fell due while the last commit still ran is taken
        now (an interrupted finish then resumes with no more to convert again than a writer with
        synchronous checkpoints would)."""
        self._settle(raise_error=True)
        seen = self._seen
        if self._journal is not None and self._deferred and seen is not None:
            try:
                self._checkpoint(*seen, background=False)
            except OSError as exc:
                raise self.output_error(exc) from None

    def _restore(self, checkpoint: _journal.Checkpoint) -> None:
        """Take up an interrupted run's bookkeeping at ``checkpoint`` and reopen its output."""
        rows = checkpoint.rows
        self.count, self.payload_bytes = checkpoint.samples, checkpoint.payload_bytes
        self._checkpoint_inputs = checkpoint.inputs
        self.checksums = array("I", (rows["crc32"] & 0xFFFFFFFF).tolist())
        self._note_shapes(rows)
        self.resumed_inputs, self.resumed_skipped = checkpoint.inputs, list(checkpoint.skipped)
        self.source_names = EncodedNames(checkpoint.names) if checkpoint.names is not None else None
        self._reopen(checkpoint)

    def checksum_array(self) -> np.ndarray:
        """The per-sample checksums as the little-endian uint32 array every format stores."""
        return np.frombuffer(self.checksums, np.uint32).astype(CHECKSUM_DTYPE)

    @property
    def shape(self) -> tuple[int, int, int] | None:
        """The shape every sample has, or ``None`` if they differ."""
        return None if self._mixed_shapes else self.common_shape

    def finish(self, meta: Metadata) -> None:
        """Write metadata last, sync, and rename the output to its final name."""
        self._last_checkpoint_now()
        meta = dataclasses.replace(meta, checksum=CHECKSUM,  # every writer stores per-sample checksums
                                   checksums_sha256=sha256_of_checksums(self.checksum_array()))
        try:
            self._write_metadata(meta)
            with signals_deferred():  # a Ctrl-C lands after this, when DST is complete and known to be
                self._publish()
                self.finished = True  # nothing after this may treat the run as unfinished
        except OSError as exc:  # __exit__ then keeps the checkpoint or drops the output (its rule)
            raise self.output_error(exc) from None
        if self._journal is not None:
            self._journal.remove()
        self._lock.release()

    def abort(self) -> None:
        """Drop the unfinished output (a close that fails, as a flush into a full disk does, is
        ignored: the output goes anyway, and the error that stopped the run is the one to report)."""
        try:
            self._settle(raise_error=False)
            self._close()
        except Exception:  # noqa: BLE001 - (OSError; or a writer interrupted as it opened, half set up)
            pass
        finally:
            with signals_deferred():  # a second Ctrl-C waits for these (cut short, they left the journal and lock behind)
                remove_path(self.tmp)
                if getattr(self, "_journal", None) is not None:
                    self._journal.remove()
                self._lock.release()

    def output_error(self, exc: OSError) -> OutputError:
        """The one-line error for ``exc``, met writing this output (packer/destination.py)."""
        return write_error(self.dst, exc)

    def __enter__(self) -> "Writer":
        return self

    def suspend(self) -> None:
        """Stop without finishing, keeping ``DST.partial`` and its journal for ``--resume``:
        what an interrupted run does once it has a checkpoint (nothing a sink stored is removed).
        A close that fails (a flush into a full disk) is ignored, as :meth:`abort` ignores it: what
        follows the checkpoint is dropped on resuming, and the error that stopped the run is the one
        to report (it was replaced by the close's, in a traceback)."""
        try:
            self._settle(raise_error=False)
            self._close()
        except OSError:
            pass
        finally:
            self._lock.release()

    def _keeps(self, exc_type: type[BaseException]) -> bool:
        """Whether a fresh run's failure keeps its checkpoint: at its output or an input, once it has
        written samples, writing locally (a sink's upload is aborted as it closes), and not because
        the source changed (a ``--resume`` would be refused)."""
        return (issubclass(exc_type, (OutputError, InputError)) and not issubclass(exc_type, SourceChangedError)
                and self.count > 0 and getattr(self, "sink", None) is None)

    def __exit__(self, exc_type, exc, tb) -> None:
        """On an interruption (Ctrl-C; SIGTERM/SIGHUP in the CLI), any error in a resumed run, or a
        fresh run's failure at its output or an input (a full disk, ``--on-error fail``) once it has
        written samples: keep the last checkpoint if there is one, so ``--resume`` finishes the run
        (the error says so: packer/engine.py). A full disk at 90% dropped every checkpoint. Otherwise
        (a bug, or nothing written) drop everything."""
        if exc_type is None:
            return
        self._settle(raise_error=False)  # the journal a whole commit left is the one to go by
        if self.finished:  # interrupted after the rename: only the journal is left to drop
            if self._journal is not None:
                self._journal.remove()
            self._lock.release()
        elif (issubclass(exc_type, KeyboardInterrupt) or self.resumed_inputs > 0 or self._keeps(exc_type)) and self._journal is not None \
                and _journal.saved_inputs(self.tmp) is not None:
            self.suspend()
        else:
            self.abort()
