"""``packer verify``: check a packed dataset end to end, and optionally against its source.

The dataset is a local path, or the URL of a WebDataset or blob ``packer convert`` wrote there,
checked in place, alike (readers/formats/remote.py: its objects read one at a time, never
copied whole to local disk; a URL that cannot be read stops it with one line).

What is checked (each problem becomes a :class:`Fault` naming the sample index and, for
WebDataset, the shard; a path that is not a packer dataset, or is missing, is not a fault but
the error ``packer info`` gives for it, and a recognised dataset that does not open, truncated
or with a damaged header, is one ``dataset`` fault):

* the metadata record parses and agrees with the storage (the store's own checks on open:
  counts, section and dataset sizes, shard sizes);
* format structure, as the format's store checks it (``Store.structure_faults``): LMDB holds
  exactly the expected keys; every WebDataset shard is a valid tar whose members are the
  expected keys, at the offsets and sizes of the member index, with the right labels in its
  ``.cls`` members and the right shape and dtype in its ``.npy`` headers;
* every sample is present, its label is valid for ``classes``, its shape agrees with the
  metadata, and its checksum (``readers/checksums.py``) matches the stored one;
* every sample decodes (raw: the byte count; jpeg/png: a full decode), unless ``quick``;
* a text dataset: every document is ``(1, 1, n)`` token ids inside the tokenizer's vocabulary,
  ending with its end-of-document id (when it has one), and the documents hold the metadata's
  ``tokens`` in all;
* with ``source`` (:mod:`packer.verify_source`; image datasets: given for a text dataset it is
  refused before anything is checked): the recorded preprocessing, re-run on the
  source (a folder, a URL, an archive, WebDataset shards, or a folder or archive with its label
  file given again as ``source_options``), gives the same
  samples (raw and png: identical pixels; jpeg: decoded pixels within :data:`JPEG_TOLERANCE`
  on average, since encoders may differ between library builds). Samples are matched to the
  current inputs by the source name each sample records (``Store.source_names``), so a
  changed source is reported as exactly the inputs that changed, were added or were removed,
  each by its own name, and an input the conversion skipped that converts now is named too.
  Datasets written before names were recorded are matched by content in
  scan order instead (a removed input is then located in the scan order, not named).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from readers.checksums import sample_checksum, sha256_of_checksums
from readers.formats import detect_format, store_class
from readers.formats.base import Store
from readers.formats.remote import detect_remote, is_remote, open_remote
from readers.schema import Metadata, PackedFormatError

from .info import remote_reads
from .options import SourceOptions
from .sources.parquet_images import asked_once
from .verify_source import JPEG_TOLERANCE, check_source_applies, compare_source, copies

__all__ = ["verify", "VerifyReport", "Fault", "JPEG_TOLERANCE"]

#: Faults kept in the report (the rest are counted).
MAX_FAULTS = 200
_CHUNK = 256


@dataclass(frozen=True)
class Fault:
    """One problem: where (``sample 12 (shard-000001.tar)``, ``metadata``, a file) and what."""

    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


@dataclass
class VerifyReport:
    """What :func:`verify` checked and found."""

    #: The dataset's local path, or its URL as given.
    path: Path | str
    #: The format the path was recognised as (a recognised dataset may still fail to open).
    format: str = ""
    #: Whether the dataset opened (its metadata read and checked against the storage): if not,
    #: the one fault says why and nothing else was checked.
    opened: bool = False
    count: int = 0
    checked: int = 0
    decoded: int = 0
    compared: int = 0
    #: Text datasets: tokens counted in the checked documents (EOS included).
    tokens: int = 0
    #: Stored checksums were read and compared with every checked sample.
    checksums: bool = False
    #: The metadata records checksums (``checksums`` False with this True: they could not be read).
    checksums_recorded: bool = False
    faults: list[Fault] = field(default_factory=list)
    fault_count: int = 0
    seconds: float = 0.0
    #: What is worth saying that is not a fault (files in the dataset's folder packer did not write).
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.fault_count == 0

    def add(self, where: str, message: str) -> None:
        self.fault_count += 1
        if len(self.faults) < MAX_FAULTS:
            self.faults.append(Fault(where, message))

    def summary(self) -> str:
        """One line for a person."""
        if not self.opened:
            parts = ["could not be opened, so no sample was checked"]
        elif self.checksums:
            parts = [f"{self.checked:,} of {self.count:,} samples checked", "checksums matched" if self.ok else "checksums compared"]
        else:
            parts = [f"{self.checked:,} of {self.count:,} samples checked",
                     "stored checksums unreadable" if self.checksums_recorded else "no checksums stored"]
        if self.decoded:
            parts.append(f"{self.decoded:,} decoded")
        if self.compared:
            parts.append(f"{self.compared:,} compared with the source")
        head = f"{self.path}: OK" if self.ok else f"{self.path}: {self.fault_count:,} fault{'s' if self.fault_count != 1 else ''}"
        return f"{head} ({'; '.join(filter(None, [self.format, ', '.join(parts), f'{self.seconds:.1f} s']))})"


@asked_once()  # (as convert: the source's tree walked once)
def verify(
    path: str | Path, *, source: str | Path | None = None, quick: bool = False, workers: int | None = None,
    source_options: SourceOptions | None = None, tokenizer: str | Path | None = None,
) -> VerifyReport:
    """Check the dataset at ``path``; see the module docstring for what is checked.

    ``quick`` skips decoding (checksums and structure are still checked); ``source`` re-runs
    the recorded preprocessing on that source (what ``packer convert`` takes as SRC: a folder,
    a URL, an archive, WebDataset shards; with ``source_options`` a label file and its columns,
    as the conversion had them) with ``workers`` processes and compares
    (:mod:`packer.verify_source`); ``tokenizer``: a text dataset's tokenizer file where the
    recorded one has moved (the same file: its sha256 is checked).
    Raises ``FileNotFoundError`` for a missing path, ``PackedFormatError`` for a path that is not
    a packer dataset at all (what ``packer info`` says of it: nothing to verify), and
    :class:`packer.errors.OptionError` for ``source`` given for a text dataset,
    ``source_options`` that do not apply to ``source``, or ``workers`` without ``source`` (only
    the comparison runs processes), before checking anything. Everything
    else is a fault in the report, a recognised dataset that does not open included (truncated,
    a damaged header: one ``dataset`` fault, and ``report.opened`` is False).
    """
    if workers is not None and source is None:
        from .errors import OptionError

        raise OptionError("--workers: only with --source (the processes that redo the conversion to compare with)")
    if source is not None:  # label options without --labels: refused as convert refuses them
        from .jobs import check_source_options

        check_source_options(source, source_options if source_options is not None else SourceOptions())
        if source_options is not None and source_options.classes is not None:  # a bad list: said before anything is checked
            from .sources.class_list import read_class_list

            read_class_list(source_options.classes)
    with remote_reads(path):  # (a URL that cannot be read, now or midway: one line)
        return _verify(path, source, quick, workers, source_options, tokenizer)


def _verify(path: str | Path, source: str | Path | None, quick: bool, workers: int | None, source_options: SourceOptions | None,
            tokenizer: str | Path | None) -> VerifyReport:
    """:func:`verify`, its arguments checked."""
    started = time.perf_counter()
    remote = is_remote(path)  # (a URL: read in place, readers/formats/remote.py)
    report = VerifyReport(path if remote else Path(path), format=detect_remote(path) if remote else detect_format(path))  # type: ignore[arg-type]
    try:  # (above: not a dataset, an unfinished one, or missing: raised)
        store = open_remote(path, report.format) if remote else store_class(report.format)(path)  # type: ignore[arg-type]
    except PackedFormatError as exc:  # recognised (by name or first bytes), but damaged: a fault
        report.add("dataset", str(exc))
        report.seconds = time.perf_counter() - started
        return report
    meta = store.meta
    if source is not None:
        check_source_applies(meta, path, source_options)
    report.opened, report.count, report.checksums_recorded = True, meta.count, bool(meta.checksum)
    _check_metadata(meta, report)
    _check_structure(store, report)
    _check_foreign(store, report)
    try:
        stored = store.stored_checksums()
    except PackedFormatError as exc:
        report.add("checksums", str(exc))
        stored = None
    report.checksums = stored is not None
    if stored is not None and meta.checksums_sha256 and sha256_of_checksums(stored) != meta.checksums_sha256:
        report.add("checksums", "their SHA-256 is not the metadata's checksums_sha256: the stored checksums (or the record) changed after writing")
    if quick and meta.encoding == "raw":  # (it said nothing: as if something had been skipped)
        report.notes.append(f"--quick skips decoding jpeg/png samples; these are {meta.encoding} ({meta.kind}), so every check ran")
    for start in range(0, meta.count, _CHUNK):
        _check_samples(store, range(start, min(start + _CHUNK, meta.count)), stored, quick, report)
    if meta.kind == "text" and report.checked == meta.count and report.tokens != meta.tokens:
        report.add("metadata", f"records {meta.tokens:,} tokens, the documents hold {report.tokens:,}")
    if source is not None:
        compare_source(store, source, report, workers, source_options, tokenizer=tokenizer)
    report.seconds = time.perf_counter() - started
    return report


# -- metadata and structure ------------------------------------------------------------------
def _check_metadata(meta: Metadata, report: VerifyReport) -> None:
    """(Labeled with no classes is valid: integer labels given as such, docs/FORMATS.md.)"""
    paths = [s.path for s in meta.skipped]
    if len(set(paths)) != len(paths):
        report.add("metadata", "an input is listed as skipped more than once")
    steps = meta.preprocessing
    size, mode = steps.get("size"), steps.get("resize_mode")
    if meta.kind == "image" and mode in ("center-crop", "stretch", "pad") and meta.shape is not None and list(meta.shape[1:]) != size:
        report.add("metadata", f"its preprocessing says size {size} ({mode}), its samples are {meta.shape[1]}x{meta.shape[2]}")


def _check_foreign(store: Store, report: VerifyReport) -> None:
    """Files in the dataset's folder that packer did not write (a commands walkthrough: verify
    said nothing of them): a ``.tar`` among shards is a fault, as a glob or brace pattern over the
    folder reads it as one; anything else a note (readers ignore it; ``--overwrite`` refuses it)."""
    foreign = store.foreign_content()
    tars = [name for name in foreign if name.endswith(".tar")] if store.meta.format == "webdataset" else []
    for name in tars:
        report.add(name, "a .tar packer did not write, among the shards: a pattern over the folder's .tar files reads it too")
    others = [name for name in foreign if name not in tars]
    if others:
        shown = ", ".join(others[:3]) + (f" and {len(others) - 3:,} more" if len(others) > 3 else "")
        report.notes.append(f"{store.path} also holds files packer did not write ({shown}): readers ignore them; "
                            "--overwrite will not replace the dataset until they are moved out")


def _check_structure(store: Store, report: VerifyReport) -> None:
    """The format's own structure (LMDB keys, WebDataset tar members): the store knows it."""
    try:
        for where, message in store.structure_faults():
            report.add(where, message)
    except PackedFormatError as exc:
        report.add("dataset", str(exc))


# -- samples -------------------------------------------------------------------------------
def _check_samples(store: Store, indices: range, stored: np.ndarray | None, quick: bool, report: VerifyReport) -> None:
    try:
        records = list(copies(store.records(indices)))
    except (PackedFormatError, ValueError, IndexError) as exc:
        if len(indices) > 1:  # find which sample: one at a time
            for i in indices:
                _check_samples(store, range(i, i + 1), stored, quick, report)
            return
        report.add(store.where(indices[0]), str(exc))
        return
    meta = store.meta
    for i, (label, shape, payload) in zip(indices, records):
        where = store.where(i)
        report.checked += 1
        if meta.labeled and label == -1:
            pass  # one sample unlabeled (README: STL10's unlabeled split, a ClassLabel's missing label), stored as -1
        elif meta.labeled and meta.classes and not 0 <= label < len(meta.classes):
            report.add(where, f"label {label} is not a class index (0..{len(meta.classes) - 1}, or -1: unlabeled)")
        elif meta.labeled and label < 0:  # integer labels without names: any index, never below -1 (unlabeled)
            report.add(where, f"label {label} is negative in a labeled dataset (only -1, unlabeled, is)")
        elif not meta.labeled and label != -1:
            report.add(where, f"label {label} in an unlabeled dataset (expected -1)")
        if meta.kind == "image" and ((meta.shape is not None and tuple(shape) != tuple(meta.shape)) or shape[0] != meta.channels):
            report.add(where, f"shape {tuple(shape)} disagrees with the metadata ({meta.shape or meta.channels})")
        if stored is not None and sample_checksum(label, shape, payload) != int(stored[i]):
            report.add(where, "checksum mismatch: the stored sample changed after it was written")
        if meta.kind == "text":
            report.tokens += shape[-1]
        if meta.encoding == "raw":
            expected = math.prod(shape) * np.dtype(meta.dtype).itemsize  # uint8 pixels, or token ids
            if len(payload) != expected:
                report.add(where, f"{len(payload)} bytes, expected {expected} for shape {tuple(shape)} of {meta.dtype}")
            elif meta.kind == "text" and (problem := _document_problem(meta, shape, payload)):
                report.add(where, problem)
        elif not quick:
            try:
                store.decode(payload, np.empty(shape, np.uint8), i)
                report.decoded += 1
            except PackedFormatError as exc:
                report.add(where, f"does not decode: {exc}")


def _document_problem(meta: Metadata, shape: tuple[int, ...], payload: bytes) -> str:
    """Why a stored text document is not one (shape (1, 1, n), ids in the vocabulary, EOS last), or ""."""
    if tuple(shape[:2]) != (1, 1):
        return f"shape {tuple(shape)}: a document is stored as (1, 1, n)"
    ids = np.frombuffer(payload, np.dtype(meta.dtype).newbyteorder("<"))
    vocab, eos = meta.tokenizer.get("vocab_size"), meta.tokenizer.get("eos_id")
    if ids.size and int(ids.max()) >= vocab:
        return f"token id {int(ids.max())} is outside the tokenizer's vocabulary of {vocab}"
    if eos is not None and (not ids.size or int(ids[-1]) != eos):
        return f"does not end with the end-of-document id {eos}"
    bos = meta.tokenizer.get("bos_id")
    if bos is not None and (not ids.size or int(ids[0]) != bos):
        return f"does not begin with the beginning-of-document id {bos}"
    return ""
