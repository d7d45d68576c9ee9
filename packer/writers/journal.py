"""The resume journal: what an unfinished conversion has made durable, beside ``DST.partial``.

A writer commits a *checkpoint* now and then (:data:`CHECKPOINT_SECONDS`, or after
:data:`CHECKPOINT_BYTES` of payload): it makes everything written so far durable (its format's
flush and ``fsync``), appends one row per sample written since the last checkpoint to
``samples.i64`` (raw little-endian int64 rows: records of :data:`ROW_DTYPE`) and one line per
sample to ``names.jsonl`` (its source name, a JSON string) and syncs both, then atomically
replaces ``journal.json`` (write, ``fsync``,
rename, ``fsync`` the folder). The journal records the inputs consumed, the samples written,
the skipped inputs, the writer's own state (bytes of its data, shard list) and a
*fingerprint* of the conversion (source listing and every option that changes the output).

``convert(..., resume=True)`` reads the journal, refuses a different fingerprint (naming the
option), truncates the sample rows (and the writer truncates its data) back to the checkpoint
and carries on from the next input. Everything here is JSON and little-endian int64: no pickle.

Journal folder: ``DST.partial-journal/`` (the output itself may be a single file).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from readers.formats.webdataset import INDEX_DTYPE, record_shapes
from readers.schema import Skipped

from .fingerprint import EXPLAINED, LISTED_KEY, SOURCE_CHANGED, ResumeRefused, fingerprint_difference

__all__ = [
    "Journal",
    "Checkpoint",
    "journal_path",
    "saved_inputs",
    "saved_fingerprint",
    "ResumeRefused",
    "ROW_COLUMNS",
    "ROW_DTYPE",
    "record_shapes",
    "sample_row",
    "CHECKPOINT_SECONDS",
    "CHECKPOINT_BYTES",
    "BACKGROUND_CHECKPOINT_BYTES",
    "UNTIMED_CHECKPOINT_INPUTS",
]

#: A checkpoint is committed at most this often (seconds) ...
CHECKPOINT_SECONDS = 2.0
#: ... or once this much payload was written since the last one ...
CHECKPOINT_BYTES = 256 << 20
#: ... or this much, by a writer whose checkpoints are made durable in a thread beside the
#: writing (``Writer.durable_in_background``): such a checkpoint costs the writing nothing and sets
#: the disk to work on the bytes so far, so the last ``fsync``, which the conversion waits for,
#: has less left to write, and the pages it made durable are dropped from the page cache sooner
#: (``files.release_cached``).
BACKGROUND_CHECKPOINT_BYTES = 64 << 20
#: ... or, for a writer without timed checkpoints (``Writer.timed_checkpoints``), this many inputs.
UNTIMED_CHECKPOINT_INPUTS = 2048
#: One row per sample written, its columns the journal's own (``samples.i64`` holds them in this
#: order: another order is another :data:`JOURNAL_VERSION`): where the sample is (``shard``,
#: ``offset``: WebDataset only, else 0), its size, label and shape, and its checksum. Everyone
#: reads them by name; the WebDataset index takes its fields from them by name.
ROW_COLUMNS: tuple[str, ...] = ("shard", "offset", "nbytes", "label", "channels", "height", "width", "crc32")
ROW_DTYPE = np.dtype([(name, "<i8") for name in ROW_COLUMNS])
_ROW_BYTES = ROW_DTYPE.itemsize
if not set(INDEX_DTYPE.names or ()) <= set(ROW_COLUMNS):  # pragma: no cover - a change to the index's fields
    raise ImportError("the journal's rows lack fields of the WebDataset index: add them (and bump JOURNAL_VERSION)")


def sample_row(nbytes: int, label: int, shape: tuple[int, int, int], crc: int) -> tuple[int, ...]:
    """The row of a sample a format's driver wrote (no shard, offset 0), in :data:`ROW_COLUMNS` order."""
    return (0, 0, nbytes, label, *shape, crc)
JOURNAL_VERSION = 1
#: The checkpoint record inside the journal folder.
JOURNAL_FILE = "journal.json"
#: One JSON string per line: each journaled sample's source name, in sample order.
NAMES_FILE = "names.jsonl"
#: The journal's rows (``ROW_DTYPE`` records, appended).
ROWS_FILE = "samples.i64"
#: Every name a journal folder ever holds (the checkpoint record is written to ``journal.tmp``,
#: then renamed).
JOURNAL_NAMES = frozenset({JOURNAL_FILE, NAMES_FILE, ROWS_FILE, "journal.tmp"})


def journal_path(tmp: Path) -> Path:
    """The journal folder of the partial output ``tmp``."""
    return tmp.with_name(tmp.name + "-journal")


def foreign_leftover(tmp: Path) -> str | None:
    """Why ``tmp`` (``DST.partial``) or the journal folder beside it is not what a conversion of
    packer's leaves behind, so that starting over may not remove it; ``None`` when both are
    packer's or absent. Every run begins its journal before its partial output, so a partial
    output with no journal beside it is someone else's, unless it is empty, and so is a journal
    folder whose record is not a journal's (a file of the user's named journal.json), or, beside
    a partial output holding something, one without the two files every journal begins with (an
    empty folder made DST.partial packer's to remove); a link is only a link (removing it loses
    nothing)."""
    folder = journal_path(tmp)
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        return f"{folder} is not a folder packer made"
    if folder.is_dir():
        names = {entry.name for entry in folder.iterdir()}
        others = sorted(names - JOURNAL_NAMES)
        if others:
            return f"{folder} holds {', '.join(map(repr, others[:3]))}{' ...' if len(others) > 3 else ''}, which packer's journal never does"
        if JOURNAL_FILE in names and not _is_journal_record(folder / JOURNAL_FILE):
            return f"{folder / JOURNAL_FILE} is not a journal packer wrote"
        if not {ROWS_FILE, NAMES_FILE} <= names and _holds_something(tmp):  # (Journal.start makes both at once: a journal
            return f"{folder} lacks the {ROWS_FILE} and {NAMES_FILE} every journal of packer's begins with"  # killed between, or
            # half removed, has no partial output to lose)
    elif _holds_something(tmp):
        return f"{tmp} is not a conversion packer left (no journal beside it)"
    return None


def _holds_something(tmp: Path) -> bool:
    """Whether the partial output ``tmp`` is there with something in it (a link is only a link)."""
    return tmp.exists() and not tmp.is_symlink() and bool(any(tmp.iterdir()) if tmp.is_dir() else tmp.stat().st_size)


def _is_journal_record(path: Path) -> bool:
    """Whether ``path`` reads as a checkpoint record (written whole: ``journal.tmp``, renamed)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and "version" in data and "fingerprint" in data


@dataclass
class Checkpoint:
    """What the journal says is durable."""

    inputs: int
    samples: int
    payload_bytes: int
    skipped: list[Skipped]
    state: dict[str, Any]
    rows: np.ndarray = field(default_factory=lambda: np.empty(0, ROW_DTYPE))  # (samples,) ROW_DTYPE records
    #: Each sample's source name, or ``None`` when the journal does not hold one per sample.
    names: list[str] | None = field(default_factory=list)


class Journal:
    """Reads and commits the checkpoints of one partial output."""

    def __init__(self, tmp: Path, fingerprint: Mapping[str, Any]) -> None:
        self.folder = journal_path(tmp)
        self.fingerprint = dict(fingerprint)
        self.listed_at = time.time_ns()  # (a resume keeps the interrupted run's)
        self._rows_file = self.folder / ROWS_FILE
        self._names_file = self.folder / NAMES_FILE
        self._json_file = self.folder / JOURNAL_FILE

    def remove(self) -> None:
        """Drop the journal (a fresh start, or the output is finished)."""
        import shutil

        shutil.rmtree(self.folder, ignore_errors=True)

    def start(self) -> None:
        """Begin an empty journal (nothing durable yet)."""
        self.remove()
        self.folder.mkdir()
        self._rows_file.touch()
        self._names_file.touch()

    def load(self) -> Checkpoint | None:
        """The last checkpoint, or ``None`` if there is no usable journal.

        Raises ``ValueError`` naming the differing option when the fingerprint differs.
        """
        try:
            data = json.loads(self._json_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or data.get("version") != JOURNAL_VERSION:
            return None
        old = data.get("fingerprint", {})
        difference = fingerprint_difference(old, self.fingerprint, data.get(LISTED_KEY))
        if difference is not None:
            if any(old.get(key) != self.fingerprint.get(key) for key in EXPLAINED):
                advice = "finish it with that packer"
            elif difference.startswith(SOURCE_CHANGED):
                advice = ("put the source back as it was to finish it (a file of a remote source or a text corpus touched, or "
                          "rewritten with the same bytes, counts as modified: its modification time differs)")
            else:
                advice = "run with the same options to finish it"
            raise ResumeRefused(difference, advice)
        if isinstance(data.get(LISTED_KEY), int):
            self.listed_at = data[LISTED_KEY]
        samples = int(data["samples"])
        with open(self._rows_file, "r+b") as handle:
            handle.truncate(samples * _ROW_BYTES)  # rows after the checkpoint are not durable
            raw = handle.read()
        if len(raw) != samples * _ROW_BYTES:
            return None
        rows = np.frombuffer(raw, ROW_DTYPE).copy()
        skipped = [Skipped(str(s["path"]), str(s["reason"])) for s in data["skipped"]]
        return Checkpoint(int(data["inputs"]), samples, int(data["payload_bytes"]), skipped, dict(data["state"]), rows,
                          self._load_names(samples))

    def _load_names(self, samples: int) -> list[str] | None:
        """The first ``samples`` names (later lines are not durable: cut off), or ``None`` if
        fewer were journaled (the names file is then emptied: no later name can line up)."""
        try:
            with open(self._names_file, "r+b") as handle:
                lines = handle.read().split(b"\n")[:-1]  # the last piece has no newline: not durable
                keep = lines[:samples] if len(lines) >= samples else []
                handle.truncate(sum(len(line) + 1 for line in keep))
            names = [json.loads(line) for line in keep]
        except (OSError, ValueError):
            return None
        return names if len(names) == samples and all(isinstance(n, str) for n in names) else None

    def commit(self, checkpoint: Checkpoint, new_rows: np.ndarray, new_names: Iterable[str] = ()) -> None:
        """Append ``new_rows`` (:data:`ROW_DTYPE` records) and ``new_names`` (their source names,
        when known), sync, then atomically replace the journal record."""
        if new_rows.dtype != ROW_DTYPE:
            raise TypeError(f"journal rows must be {ROW_DTYPE}, not {new_rows.dtype}")
        with open(self._rows_file, "ab") as handle:
            handle.write(np.ascontiguousarray(new_rows).tobytes())
            handle.flush()
            os.fsync(handle.fileno())
        lines = "".join(json.dumps(name, ensure_ascii=True) + "\n" for name in new_names)
        if lines:
            with open(self._names_file, "ab") as handle:
                handle.write(lines.encode("ascii"))
                handle.flush()
                os.fsync(handle.fileno())
        record = {
            "version": JOURNAL_VERSION,
            "fingerprint": self.fingerprint,
            LISTED_KEY: self.listed_at,
            "inputs": checkpoint.inputs,
            "samples": checkpoint.samples,
            "payload_bytes": checkpoint.payload_bytes,
            "skipped": [s.to_dict() for s in checkpoint.skipped],
            "state": checkpoint.state,
        }
        self._replace_record(record)

    def adopt_fingerprint(self) -> None:
        """Record this run's fingerprint in the last checkpoint, in place of the interrupted run's:
        a source whose inputs were found to convert as they did (packer/touched.py)."""
        record = json.loads(self._json_file.read_text(encoding="utf-8"))
        record["fingerprint"] = self.fingerprint
        self._replace_record(record)

    def _replace_record(self, record: Mapping[str, Any]) -> None:
        """Write, ``fsync``, rename over ``journal.json``, ``fsync`` the folder."""
        tmp = self._json_file.with_suffix(".tmp")
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(record, handle, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self._json_file)
        fd = os.open(self.folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def saved_inputs(tmp: Path) -> int | None:
    """How many inputs the last checkpoint of the unfinished output ``tmp`` holds (``None``: no
    checkpoint, so nothing to resume)."""
    record = _saved_record(tmp)
    try:
        return int(record["inputs"]) if record is not None else None
    except (KeyError, TypeError, ValueError):
        return None


def saved_fingerprint(tmp: Path) -> dict[str, Any] | None:
    """The fingerprint the last checkpoint of the unfinished output ``tmp`` records, if any."""
    record = _saved_record(tmp)
    fingerprint = record.get("fingerprint") if record is not None else None
    return fingerprint if isinstance(fingerprint, dict) else None


def _saved_record(tmp: Path) -> dict[str, Any] | None:
    """The last checkpoint's record of this journal version, or ``None``."""
    try:
        data = json.loads((journal_path(tmp) / JOURNAL_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("version") == JOURNAL_VERSION else None
