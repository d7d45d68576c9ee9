"""``--resume`` of a local image source whose files were touched since the interrupted run.

A copy, a checkout, a restore or a sync that rewrites files with the same bytes gives them a new
modification time, and the resume fingerprint's listing stamps each file with its time, so such
a resume was refused as "the source folder changed", its progress lost to ``--overwrite``. When
the listing differs only in times (every path, label and size the same: the fingerprint's
:data:`~packer.writers.fingerprint.SIZES_KEY`), the inputs the interrupted run had converted
from the folders whose listing changed are converted again and compared with the checksums its
journal recorded (and those it skipped must fail again). All the same, the journal takes this
run's fingerprint and the resume goes on; any other is refused, naming them. Inputs it had not
converted yet are converted as they are now, as in any run.

The check runs before the writer opens the partial output, holding its lock. Reading the journal
cuts its rows back to the last checkpoint (what follows was never durable, and a resume cuts it
too); the checkpoint itself is rewritten, with the new listing, only when every compared input
agrees.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping

from .errors import OptionError
from .executors import Executor
from .jobs import Job
from .locking import DestinationLock, lock_path
from .preprocess.task import Encoded
from .writers.fingerprint import FOLDERS_KEY, SIZES_KEY, SOURCE_CHANGED, fingerprint_difference
from .writers.journal import Journal, saved_fingerprint

__all__ = ["resume_touched_source", "MAX_NAMED"]

log = logging.getLogger("packer")

#: Inputs named in a refusal.
MAX_NAMED = 3


def resume_touched_source(job: Job, tmp: Path, fingerprint: Mapping[str, Any], run_map: Executor, *, workers: int | None,
                          timeout: float, what: str) -> None:
    """Before a ``--resume`` opens ``tmp`` (the partial output of ``what``): if its journal's
    fingerprint differs from ``fingerprint`` only in the listing's times, convert the inputs it
    holds from the changed folders again and adopt ``fingerprint`` when they agree (else raise
    :class:`OptionError` naming those that differ). Otherwise do nothing: the writer's resume
    then goes on, or refuses, as before."""
    old = saved_fingerprint(tmp) if tmp.exists() else None  # (no partial output: nothing to resume)
    if (old is None or job.kind != "image" or job.stage is not None or not fingerprint.get(SIZES_KEY)
            or old.get(SIZES_KEY) != fingerprint.get(SIZES_KEY)):
        return
    difference = fingerprint_difference(old, fingerprint)
    if difference is None or not difference.startswith(SOURCE_CHANGED):
        return  # the same, or an option changed too: the writer says which
    lock = DestinationLock(lock_path(tmp), what).acquire()
    try:
        checkpoint = Journal(tmp, old).load()  # (the interrupted run's own: never refused)
        if checkpoint is None or checkpoint.names is None or len(set(checkpoint.names)) != len(checkpoint.names):
            return  # no sample-by-name record to compare with: refused as before
        crcs = {name: int(row) & 0xFFFFFFFF for name, row in zip(checkpoint.names, checkpoint.rows["crc32"])}
        skipped = {entry.path for entry in checkpoint.skipped}
        changed = _changed_folders(old, fingerprint)
        items = [item for item in job.items[:checkpoint.inputs] if changed is None or os.path.dirname(os.path.abspath(item.path)) in changed]
        if items:
            log.warning("--resume: files of the source have new modification times since the interrupted run; converting the %s "
                        "input%s it converted from their folders again, to compare", f"{len(items):,}", "s" if len(items) != 1 else "")
        differ = []
        with run_map(job.task, items, workers=workers, chunksize=job.chunksize(workers), on_crash=job.crashed,
                     item_timeout=timeout) if items else _nothing() as results:
            for item, result in zip(items, results):
                name = job.name(item)
                if not (crcs.get(name) == result.checksum if isinstance(result, Encoded) else name in skipped):
                    differ.append(name)
        if differ:
            more = f" and {len(differ) - MAX_NAMED:,} more" if len(differ) > MAX_NAMED else ""
            verb, back = ("converts", "it back as it was") if len(differ) == 1 else ("convert", "them back as they were")
            raise OptionError(f"--resume: the source folder changed since the interrupted run: {', '.join(differ[:MAX_NAMED])}{more} "
                              f"{verb} differently now; put {back} to finish it, or run with --overwrite instead of --resume to "
                              "discard it and start over")
        Journal(tmp, fingerprint).adopt_fingerprint()
        if items:
            log.warning("--resume: the %s convert%s as before: resuming", f"{len(items):,} input" + ("s" if len(items) != 1 else ""),
                        "" if len(items) != 1 else "s")
    finally:
        lock.release()


@contextmanager
def _nothing() -> Iterator[Iterator[Any]]:
    """No outcomes (no input to convert again: no pool started)."""
    yield iter(())


def _changed_folders(old: Mapping[str, Any], new: Mapping[str, Any]) -> set[str] | None:
    """The folders whose listing differs (``None``: not recorded, so any may)."""
    before, after = old.get(FOLDERS_KEY), new.get(FOLDERS_KEY)
    if not isinstance(before, dict) or not isinstance(after, dict) or not before or not after:
        return None
    return {folder for folder in set(before) | set(after) if before.get(folder) != after.get(folder)}
