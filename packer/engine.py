"""The one conversion driver: any :class:`~packer.jobs.Job` into any writer.

:func:`run` opens the format's writer on ``DST.partial`` (resuming from its journal when asked),
runs the job's work unit over the inputs on the executor (the local crash-proof pool, or Ray),
hands each outcome to the writer in input order, records skipped inputs (or stops, with
``--on-error fail``), takes resume checkpoints as it goes, and finishes with the metadata
record last. Images and text corpora go through exactly this code: what differs between them
lives in their job (packer/jobs.py, packer/text.py), what differs between formats in their
writer (packer/writers/).

An interrupted run (Ctrl-C, SIGTERM, an error) keeps its last checkpoint, so ``--resume``
finishes it; a run that never reached one leaves nothing behind.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import re
import shutil
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, NoReturn, Sequence

from readers.schema import Metadata, Skipped

from ._version import __version__
from .destination import is_packer_dataset
from .errors import InputError, OutputError, OutputExistsError, SourceChangedError
from .executors import Executor, get_executor
from .jobs import Job
from .locking import DestinationLock, busy_error, lock_holder, lock_path
from .memory import available_memory
from .options import RunOptions, StorageOptions
from .parallel import workers_within_cores
from .placement import Placed, Placement, PlacingWriter
from .preprocess.task import SOURCE_CHANGED, Encoded, Failed
from .progress import progress_bar
from .report import ConversionReport, human_bytes
from .touched import resume_touched_source
from .writers import get_writer
from .writers.base import Writer, partial_path
from .writers.piece_writer import PieceWriter, Written
from .writers.journal import foreign_leftover, journal_path, saved_inputs

__all__ = ["run", "Interrupted", "check_unfinished", "SkipWarnings", "SKIP_WARNINGS", "UNPRINTED_SKIP"]

log = logging.getLogger("packer")
#: Skipped inputs warned of one line each; the rest are counted in one line (all are recorded).
SKIP_WARNINGS = 50
#: The attribute of a skipped input's record past :data:`SKIP_WARNINGS` (logged at debug level).
UNPRINTED_SKIP = "packer_unprinted_skip"


class Interrupted(KeyboardInterrupt):
    """The conversion was interrupted (Ctrl-C, or SIGTERM/SIGHUP in the CLI): still a
    ``KeyboardInterrupt``, whose message says what is saved and how to finish."""


class SkipWarnings:
    """A warning line for each skipped input up to :data:`SKIP_WARNINGS`, then one line saying the
    rest are not printed: a dataset-wide mistake (pixels of the wrong dtype) printed a line per
    sample, a million at ImageNet's size. Every skip is still recorded and counted."""

    def __init__(self, limit: int = SKIP_WARNINGS) -> None:
        self.limit, self.seen = limit, 0

    def __call__(self, name: str, reason: str) -> None:
        self.seen += 1
        if self.seen <= self.limit:
            log.warning("skipped %s: %s", name, reason)
        elif self.seen == self.limit + 1:
            log.warning("skipped %s: %s; further skipped inputs are not printed one by one (the summary counts them, and "
                        "the metadata records each: packer info DST lists them)", name, reason)
        else:  # (a debug record, which the command's warning printer counts: "... and N more warnings")
            log.debug("skipped %s: %s", name, reason, extra={UNPRINTED_SKIP: True})


def none_converted_because(skipped: Sequence[Skipped], first: Skipped) -> str:
    """Why none of the inputs converted: ``" (first: PATH: REASON)"`` when ``first``'s kind of reason
    is the most common, else the most common kind's count and an example first, then the first
    skip (403 images over --max-pixels were said as the one unreadable file that came first). A kind is the
    reason without its numbers and parenthesised details ("80x64 has 5,120 pixels..." and
    "640x480 has 307,200 pixels..." are one)."""
    kinds: dict[str, list[Skipped]] = {}
    for entry in skipped:
        kinds.setdefault(_reason_kind(entry.reason), []).append(entry)
    most = max(kinds.values(), key=len)
    if len(kinds.get(_reason_kind(first.reason), ())) >= len(most):  # the first skip's kind is (one of) the most common
        return f" (first: {first.path}: {first.reason})"
    return f" (most common, {len(most):,} of the {len(skipped):,}: {most[0].path}: {most[0].reason}; first: {first.path}: {first.reason})"


def _reason_kind(reason: str) -> str:
    return re.sub(r"\d[\d,.x]*", "N", re.sub(r"\([^()]*\)", "", reason)).strip()


def check_unfinished(dst: Path, *, resume: bool, overwrite: bool) -> None:
    """Refuse to start over silently when an interrupted conversion to ``dst`` can be resumed,
    and name the process when the conversion that saved it is still running, not interrupted."""
    partial = partial_path(dst)
    lock = lock_path(partial)
    holder = lock_holder(lock)
    if holder is not None:
        raise busy_error(str(dst), holder)
    if not partial.exists() and (lock.exists() or journal_path(partial).exists()):  # a run killed between its rename and its cleanup
        problem = foreign_leftover(partial)
        if problem is not None:
            raise OutputExistsError(f"{dst}: {problem}; move it away (packer removes only what its own conversions left)")
        with DestinationLock(lock, str(dst)):  # (removed while held: a conversion starting meanwhile keeps a lock of its own)
            shutil.rmtree(journal_path(partial), ignore_errors=True)
        return
    saved = saved_inputs(partial)
    inputs = f"{saved:,} input{'s' if saved != 1 else ''}" if saved is not None else ""
    if saved is not None and not overwrite and is_packer_dataset(dst):  # an --overwrite run over a finished one was interrupted
        raise OutputExistsError(f"{dst}: an interrupted conversion replacing it saved {inputs}; run with --resume --overwrite to "
                                "finish replacing it, or with --overwrite alone to discard it and start over")
    if resume or overwrite:
        return
    if saved is not None:
        raise OutputExistsError(
            f"{dst}: an interrupted conversion saved {inputs}; run the same command with --resume to "
            "finish it, or with --overwrite to discard it and start over"
        )


def _workers(run: RunOptions, job: Job) -> int | None:
    """The worker count for the local pool: as asked (default: the usable cores), capped at the
    usable cores and at what the available memory holds of the job's worst-case worker, each cap
    with a one-line warning. Ray sizes its own workers."""
    if run.executor != "local":
        return run.workers
    workers = workers_within_cores(run.workers)
    available = available_memory()
    fits = max(1, available // job.worker_bytes()) if available else workers
    if workers > fits:
        log.warning("%d workers could each need %s (a %s at its largest); %s of memory is available: using %d",
                    workers, human_bytes(job.worker_bytes()), job.noun, human_bytes(available), fits)
        workers = fits
    spare = _spare_descriptors()
    if spare is not None and workers > max(0, spare) // _DESCRIPTORS_PER_WORKER:
        if spare < _DESCRIPTORS_PER_WORKER:  # (it failed while a worker started, and the fork server printed a traceback)
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        log.warning("--workers %d: the open-file limit (ulimit -n) leaves room for %d; using %d", workers,
                    spare // _DESCRIPTORS_PER_WORKER, spare // _DESCRIPTORS_PER_WORKER)
        workers = spare // _DESCRIPTORS_PER_WORKER
    return workers


#: File descriptors the driver holds per worker (its pipes, its slots, the fork server's
#: connection as it starts), and those kept for the writer, its journal and lock besides.
_DESCRIPTORS_PER_WORKER = 6
_DESCRIPTORS_KEPT = 8


def _spare_descriptors() -> int | None:
    """How many more files this process may open beside those it keeps for writing (``None``
    where it cannot tell: no ``/proc``, no limit)."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft == resource.RLIM_INFINITY:
            return None
        return soft - len(os.listdir("/proc/self/fd")) - _DESCRIPTORS_KEPT
    except (ImportError, OSError):  # pragma: no cover - not Linux
        return None


def run(job: Job, fmt: str, dst: Path, *, storage: StorageOptions | None, options: RunOptions, sink: Any = None) -> ConversionReport:
    """Convert ``job`` into ``dst`` in format ``fmt``; the report of what was done."""
    run_map = get_executor(options.executor, ray_address=options.ray_address)
    workers = _workers(options, job)
    skipped = list(job.skipped)
    if options.on_error == "fail" and skipped and job.scan_skips_fail:
        raise InputError(f"{skipped[0].path}: {skipped[0].reason} (pass --on-error skip to skip such inputs)")
    warn_skip = SkipWarnings()
    for entry in skipped:
        warn_skip(entry.path, entry.reason)
    writer_class = get_writer(fmt)
    extra = {"sink": sink} if sink is not None else {}
    fingerprint = job.fingerprint(fmt, Path(dst), dataclasses.asdict(storage or StorageOptions()), options.on_error)
    started = time.perf_counter()
    if options.resume:  # a source only touched since the interrupted run: its converted inputs compared, not refused
        resume_touched_source(job, partial_path(Path(dst)), fingerprint, run_map, workers=workers, timeout=options.timeout, what=str(dst))
    writer = writer_class(dst, storage, fingerprint=fingerprint, resume=options.resume, **extra)
    resumed_at = (0, 0)  # samples and payload bytes a resumed run found written (not in this run's rate)
    units: list[int] = []  # how many work units (inputs, or a piece writer's pieces) this run mapped
    try:
        with writer:
            resumed_at = (writer.count, writer.payload_bytes)
            _drive(job, writer, skipped, options, workers, run_map, units, warn_skip, in_memory=sink is not None and options.executor != "local")
            if writer.count == 0:
                first = skipped[len(job.skipped)] if len(skipped) > len(job.skipped) else (skipped[0] if skipped else None)
                because = none_converted_because(skipped, first) if first else ""
                inputs = len(job.items) + len(job.skipped)  # those the scan already refused too
                if not inputs:  # ("none of the 0 documents": a corpus of blank lines said nothing of why)
                    raise InputError(f"{job.source}: no {job.noun}s to convert" + (" (its files are empty or hold blank lines only)" if job.noun == "document" else ""))
                what = job.noun if job.items else "input"  # (2 Parquet files skipped whole were '2 documents')
                said = f"none of the {inputs:,} {what}s could be converted" if inputs > 1 else f"its one {what} could not be converted"
                raise InputError(f"{job.source}: {said}{because}")
            writer.finish(Metadata(
                format=fmt, count=writer.count, source=job.source, skipped=tuple(skipped), tool_version=__version__,
                created=datetime.now(timezone.utc).isoformat(timespec="seconds"), extra=writer.extra(), **job.metadata_fields(writer),
            ))
    except KeyboardInterrupt:
        if writer.finished:
            raise Interrupted(f"interrupted after the output was complete: {writer.dst} is finished") from None
        saved = saved_inputs(writer.tmp)
        total = len(job.items) + len(job.skipped)
        if saved is None:
            raise Interrupted(f"interrupted before the first checkpoint; nothing was written to {dst}") from None
        raise Interrupted(f"interrupted: {saved:,} of {total:,} inputs are saved; run the same command with --resume to finish") from None
    except (OutputError, InputError) as exc:  # its checkpoint kept (Writer.__exit__): said, or the user starts over elsewhere
        saved = saved_inputs(writer.tmp) if not writer.finished and writer.tmp.exists() else None
        if saved is None:
            raise
        total = len(job.items) + len(job.skipped)
        advice = getattr(exc, "resume_advice", "once that is fixed, run the same command with --resume to finish")
        raise type(exc)(f"{exc}; {saved:,} of {total:,} inputs are saved" + (f": {advice} (or with --overwrite to start over)" if advice else "")
                        ) from None  # (not where: a URL DST's is a staging folder)
    return job.report(
        dst=writer.dst, format=fmt, inputs=len(job.items) + len(job.skipped), written=writer.count, skipped=skipped,
        payload_bytes=writer.payload_bytes, seconds=time.perf_counter() - started, resumed_written=resumed_at[0], resumed_bytes=resumed_at[1],
        workers=_used_workers(workers, run_map, units[0] if units else len(job.items)), shape=writer.shape,
        resumed=writer.resumed_inputs,
    )


def _used_workers(workers: int | None, run_map: Executor, units: int) -> int:
    """How many worker processes the report names: as many as ran, no more than there were work units."""
    started = workers if workers is not None else run_map.workers or 1
    return max(1, min(started, units))


def _drive(job: Job, writer: Writer, skipped: list[Skipped], options: RunOptions, workers: int | None, run_map: Executor,
           units: list[int], warn_skip: SkipWarnings, *, in_memory: bool) -> None:
    """Every remaining input's outcome into the writer, in order; skips recorded, checkpoints taken;
    ``units`` gets how many work units were mapped."""
    done = writer.resumed_inputs
    skipped += writer.resumed_skipped[len(job.skipped) :]
    items = job.items[done:]
    units.append(len(items))  # (a piece writer's pieces replace it: _outcomes)
    placement = _placement(writer, job, options, done, len(items))
    with (
        _outcomes(writer, job, items, workers, options.timeout, run_map, in_memory=in_memory, placement=placement, units=units) as results,
        progress_bar(len(items), enabled=options.progress, unit=job.unit) as bar,  # after the pool: see packer/parallel.py
    ):
        for done, (item, result) in enumerate(zip(items, results), done + 1):
            if isinstance(result, (Encoded, Placed)):
                writer.add(result)
                writer.record_source(job.name(item))
                if result.decoder_messages:  # captured in the worker (packer/preprocess/messages.py)
                    log.warning("%s: converted, but the decoder printed: %s", job.name(item), result.decoder_messages)
            elif isinstance(result, Failed):
                if placement is not None:  # samples after a skip are no longer at their inputs' places
                    placement.stop()
                if result.stop:
                    stopped = (SourceChangedError if result.stop == SOURCE_CHANGED else InputError)(
                        f"{item.path}: {result.reason}; the conversion stopped: {result.stop}")
                    stopped.resume_advice = ""  # (its own says what to do)
                    raise stopped
                if options.on_error == "fail":  # the full path (or URL), to find the file
                    failed = InputError(f"{item.path}: {result.reason} (pass --on-error skip to skip such inputs)")
                    failed.resume_advice = "run the same command with --resume --on-error skip to finish without it"  # (fixed, it
                    raise failed  # would be a changed source: --resume refuses it)
                name = job.name(item)
                skipped.append(Skipped(name, result.reason))
                warn_skip(name, result.reason)
            else:  # None or Written: a piece writer's worker wrote it
                writer.record_source(job.name(item))
                if isinstance(result, Written):  # captured in the worker, as the pool's are
                    log.warning("%s: converted, but the decoder printed: %s", job.name(item), result.decoder_messages)
            bar.update(1)
            writer.progress(done, skipped)  # a resume checkpoint, when one is due


def _placement(writer: Writer, job: Job, options: RunOptions, first: int, inputs: int) -> Placement | None:
    """Where the workers write the samples themselves (packer/placement.py): a local pool, a
    fixed-shape job and a writer that offers it; else ``None`` (the driver writes them). With
    another executor (tasks on other nodes) the writer is still told, so that it lays the file
    out as for a local run (HDF5 allocates every row): the driver then writes every sample."""
    shape = job.fixed_shape()
    if shape is None or not isinstance(writer, PlacingWriter):
        return None
    try:
        placement = writer.placement(shape, first, inputs)  # (it writes: the blob's buffered header page, a full disk's)
    except OSError as exc:
        raise writer.output_error(exc) from None
    if placement is not None and options.executor != "local":
        placement.stop()
        return None
    return placement


@contextmanager
def _outcomes(writer: Writer, job: Job, items: Sequence[Any], workers: int | None, timeout: float, run_map: Executor, *,
              in_memory: bool = False, placement: Placement | None = None,
              units: list[int] | None = None) -> Iterator[Iterator[Encoded | Placed | Failed | Written | None]]:
    """Each input's outcome, in input order, computed by ``workers`` processes.

    Most writers get an :class:`Encoded` sample per input to :meth:`~Writer.add` here; with a
    ``placement`` (the blob and HDF5, fixed-shape raw samples, local workers) the workers write the
    samples into the output themselves and send back :class:`Placed` records instead. A writer
    that writes pieces has its workers convert and write whole pieces (shards; with few pieces,
    fragments of them, given ``workers``); it is handed each finished piece in order, and its
    inputs come back as ``None`` (written) or :class:`Failed`. ``run_map`` is the executor
    (``ordered_map``'s contract, packer/executors).

    An input that kills or hangs its worker is a :class:`Failed` ("crashed the decoder
    (SIGSEGV)", "timed out after 120 s"). A piece is converted whole, so a piece that does
    (its inputs retried one by one would need the writer in this process) stops the
    conversion with an error naming the piece's first input. ``in_memory``: the pieces' tasks
    return shard bytes instead of writing into the writer's folder (which they may not see).
    """
    if placement is not None:  # items as (index, item, offset) entries: packer/placement.py
        with run_map(placement.task(job.task), placement.items(items, writer.resumed_inputs), workers=workers,
                     chunksize=job.chunksize(workers), on_crash=lambda entry, reason: job.crashed(entry.item, reason),
                     item_timeout=timeout) as results:
            yield results
        return
    if not isinstance(writer, PieceWriter):
        with run_map(job.task, items, workers=workers, chunksize=job.chunksize(workers), on_crash=job.crashed,
                     item_timeout=timeout) as results:
            yield results if job.stage is None else iter(job.stage(results))  # the GPU stage of --decode-device cuda
        return
    planned = workers if workers is not None else run_map.planned_workers()
    try:  # Ray joined by planned_workers() is left by the map, or here if there is none
        pieces = writer.pieces(items, job.image, workers=planned, sample_bytes=job.expected_sample_bytes())  # few pieces: fragments
        if units is not None:
            units[:] = [len(pieces)]  # (fewer than the inputs: what the workers get)
        per_piece = timeout * max((len(piece.items) for piece in pieces), default=1)
        task = writer.piece_task(job.image, job.task, in_memory=in_memory)
    except BaseException:
        run_map.release()
        raise
    def crashed(piece: Any, reason: str) -> NoReturn:
        raise InputError(writer.piece_crashed(piece, reason))

    with run_map(task, pieces, workers=workers, chunksize=1, on_crash=crashed, item_timeout=per_piece) as results:
        yield (outcome for piece in results for outcome in writer.add_piece(piece))



