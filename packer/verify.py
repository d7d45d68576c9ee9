"""``packer verify``: check a packed dataset end to end, and optionally against its source.

What is checked (each problem becomes a :class:`Fault` naming the sample index and, for
WebDataset, the shard):

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
* with ``source``: the recorded preprocessing, re-run on the source folder, gives the same
  samples (raw and png: identical pixels; jpeg: decoded pixels within :data:`JPEG_TOLERANCE`
  on average, since encoders may differ between library builds). Samples are matched to the
  current inputs by the source name each sample records (``Store.source_names``), so a
  changed source is reported as exactly the inputs that changed, were added or were removed,
  each by its own name. Datasets written before names were recorded are matched by content in
  scan order instead (a removed input is then located in the scan order, not named).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from readers.checksums import sample_checksum
from readers.codecs import decode_image
from readers.formats import open_store
from readers.formats.base import Store
from readers.schema import Metadata, PackedFormatError

__all__ = ["verify", "VerifyReport", "Fault", "JPEG_TOLERANCE"]

#: Largest mean absolute pixel difference accepted between a stored jpeg sample and a fresh
#: re-encoding of its source (``--source``).
JPEG_TOLERANCE = 1.0
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

    path: Path
    format: str = "?"
    count: int = 0
    checked: int = 0
    decoded: int = 0
    compared: int = 0
    #: Text datasets: tokens counted in the checked documents (EOS included).
    tokens: int = 0
    checksums: bool = False
    faults: list[Fault] = field(default_factory=list)
    fault_count: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.fault_count == 0

    def add(self, where: str, message: str) -> None:
        self.fault_count += 1
        if len(self.faults) < MAX_FAULTS:
            self.faults.append(Fault(where, message))

    def summary(self) -> str:
        """One line for a person."""
        parts = [f"{self.checked:,} of {self.count:,} samples checked"]
        parts.append("checksums matched" if self.checksums and self.ok else "checksums compared" if self.checksums else "no checksums stored")
        if self.decoded:
            parts.append(f"{self.decoded:,} decoded")
        if self.compared:
            parts.append(f"{self.compared:,} compared with the source")
        head = f"{self.path}: OK" if self.ok else f"{self.path}: {self.fault_count:,} fault{'s' if self.fault_count != 1 else ''}"
        return f"{head} ({self.format}; {', '.join(parts)}; {self.seconds:.1f} s)"


def verify(
    path: str | Path, *, source: str | Path | None = None, quick: bool = False, workers: int | None = None
) -> VerifyReport:
    """Check the dataset at ``path``; see the module docstring for what is checked.

    ``quick`` skips decoding (checksums and structure are still checked); ``source`` re-runs
    the recorded preprocessing on that folder (a path or a URL, as SRC is) with ``workers``
    processes and compares.
    Raises ``FileNotFoundError`` for a missing path; everything else is a fault in the report.
    """
    started = time.perf_counter()
    report = VerifyReport(Path(path))
    try:
        store = open_store(path)
    except PackedFormatError as exc:
        report.add("dataset", str(exc))
        report.seconds = time.perf_counter() - started
        return report
    meta = store.meta
    report.format, report.count = meta.format, meta.count
    _check_metadata(meta, report)
    _check_structure(store, report)
    try:
        stored = store.stored_checksums()
    except PackedFormatError as exc:
        report.add("checksums", str(exc))
        stored = None
    report.checksums = stored is not None
    for start in range(0, meta.count, _CHUNK):
        _check_samples(store, range(start, min(start + _CHUNK, meta.count)), stored, quick, report)
    if meta.kind == "text" and report.checked == meta.count and report.tokens != meta.tokens:
        report.add("metadata", f"records {meta.tokens:,} tokens, the documents hold {report.tokens:,}")
    if source is not None:
        _compare_source(store, source, report, workers)
    report.seconds = time.perf_counter() - started
    return report


# -- metadata and structure ------------------------------------------------------------------
def _check_metadata(meta: Metadata, report: VerifyReport) -> None:
    if meta.labeled and not meta.classes:
        report.add("metadata", "labeled, but lists no classes")
    paths = [s.path for s in meta.skipped]
    if len(set(paths)) != len(paths):
        report.add("metadata", "an input is listed as skipped more than once")


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
        records = list(_copies(store.records(indices)))
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
        if meta.labeled and not (0 <= label < max(len(meta.classes), 1)):
            report.add(where, f"label {label} is not a class index (0..{len(meta.classes) - 1})")
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
    return ""


def _copies(records) -> Iterator[tuple[int, tuple[int, ...], bytes]]:
    for label, shape, payload in records:
        yield int(label), tuple(int(d) for d in shape), bytes(payload)


# -- against the source ------------------------------------------------------------------------
def _compare_source(store: Store, source: str | Path, report: VerifyReport, workers: int | None) -> None:
    """Match the dataset's samples to the source's current inputs, then report, by name, every
    input that changed, was added or was removed (see :func:`_match_source`)."""
    from .errors import PackerError
    from .options import ImageOptions
    from .preprocess.task import ImageTask
    from .sources.images import scan_image_folder
    from .sources.remote import is_source_url

    meta = store.meta
    if meta.kind != "image":
        report.add("source", f"--source compares image conversions only; this dataset holds {meta.kind}")
        return
    pre = meta.preprocessing
    try:
        image = ImageOptions(
            size=tuple(pre["size"]) if pre.get("size") else None,
            resize_mode=pre.get("resize_mode"),
            resize=pre.get("resize"),  # absent before --resize existed: the crop of --size alone
            grayscale=bool(pre.get("grayscale")),
            encoding=pre.get("encoding", meta.encoding),
            quality=pre.get("quality"),
            max_pixels=pre.get("max_pixels", ImageOptions().max_pixels),
        )
        remote = is_source_url(str(source))
        folder = scan_image_folder(str(source) if remote else Path(source))
    except (PackerError, KeyError, TypeError) as exc:
        report.add("source", f"cannot redo the recorded preprocessing: {exc}")
        return
    if list(folder.classes) != list(meta.classes):
        report.add("source", f"{source} has classes {folder.classes[:5]}..., the dataset {list(meta.classes[:5])}...")
    recorded = {s.path for s in meta.skipped}
    items = [item for item in folder.items if folder.relative(item.path) not in recorded]
    # a current label as the dataset numbers it (by class name; -2: a class the dataset lacks)
    labels = {k: meta.classes.index(c) if c in meta.classes else -2 for k, c in enumerate(folder.classes)}
    names = [folder.relative(item.path) for item in items]
    try:
        recorded_names = store.source_names()
    except PackedFormatError as exc:
        report.add("source", f"cannot read the recorded source names, matching by content: {exc}")
        recorded_names = None
    match = _match_by_name if recorded_names is not None else _match_source
    match(store, _Converter(ImageTask(image), labels, workers, remote), items, names, labels, report, recorded_names)


@dataclass(frozen=True)
class _Converter:
    """Converts source inputs as the recorded conversion did, labels numbered as the dataset numbers them."""

    task: object
    labels: dict[int, int]
    workers: int | None
    remote: bool

    def __call__(self, chosen: list) -> Iterator:
        from .parallel import default_workers, ordered_map
        from .preprocess.task import Encoded
        from .sources.remote import remote_chunksize

        workers = self.workers or default_workers()
        chunksize = remote_chunksize(len(chosen), workers) if self.remote else None  # as a conversion from it reads
        with ordered_map(self.task, chosen, workers=workers, chunksize=chunksize) as results:
            for result in results:
                yield dataclasses.replace(result, label=self.labels.get(result.label, result.label)) if isinstance(result, Encoded) else result


def _match_by_name(store: Store, convert: _Converter, items: list, names: list[str], labels: dict[int, int],
                   report: VerifyReport, recorded: list[str]) -> None:
    """Each sample is the input its recorded source name names: an input with no sample was
    *added*, a sample whose input is gone was *removed* (both named), and every other input is
    re-converted and compared with its sample (its checksum first, then the pixels)."""
    from .preprocess.task import Encoded

    where_is = {name: i for i, name in enumerate(recorded)}
    current = set(names)
    for i, name in enumerate(recorded):
        if name not in current:
            report.add(store.where(i), f"removed from the source: {name} is no longer there")
    for name in names:
        if name not in where_is:
            report.add(f"source {name}", "added: not in the dataset")
    pairs = [(where_is[name], j) for j, name in enumerate(names) if name in where_is]
    try:
        stored = store.stored_checksums()
    except (PackedFormatError, ValueError):
        stored = None
    for (i, j), result in zip(pairs, convert([items[j] for _i, j in pairs])):
        where = f"{store.where(i)} <- {names[j]}"
        if not isinstance(result, Encoded):
            report.add(where, f"the source no longer converts: {getattr(result, 'reason', result)}")
            continue
        report.compared += 1
        if stored is not None and sample_checksum(result.label, result.shape, result.payload) == int(stored[i]):
            continue
        try:
            [(label, shape, payload)] = list(_copies(store.records([i])))
        except (PackedFormatError, ValueError) as exc:
            report.add(where, str(exc))
            continue
        problem = _difference(result, label, shape, payload, store.meta)
        if problem:
            report.add(where, f"changed: {problem}")


def _match_source(store: Store, convert: _Converter, items: list, names: list[str], labels: dict[int, int],
                  report: VerifyReport, _recorded: None = None) -> None:
    """Samples were written in scan order, less the recorded skipped inputs, and the current
    inputs are listed in the same order: so the two sequences are aligned (``difflib``) on the
    checksum each sample was stored with and the one each input would be stored with now.
    Aligned equal: unchanged. Between two unchanged runs, a sample and an input of the same
    class at the same place are the same file, *changed* (re-converted and compared); a sample
    left over was *removed* from the source (no name is recorded: the fault says where in
    the scan order it was), an input left over was *added*. (Datasets that record no source names.)"""
    from .preprocess.task import Encoded

    fresh = [sample_checksum(r.label, r.shape, r.payload) if isinstance(r, Encoded) else -1 for r in convert(items)]
    try:
        stored = store.stored_checksums()
        kept = stored.tolist() if stored is not None else [sample_checksum(*r) for r in store.records(range(len(store)))]
    except (PackedFormatError, ValueError) as exc:
        report.add("source", f"cannot read the dataset's samples to match them: {exc}")
        return
    changed: list[tuple[int, int]] = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, kept, fresh, autojunk=False).get_opcodes():
        if tag == "equal":
            report.compared += i2 - i1
            continue
        samples = [(i, label) for i, (label, _shape, _payload) in zip(range(i1, i2), store.records(range(i1, i2)))]
        inputs = [(j, labels.get(items[j].label, items[j].label)) for j in range(j1, j2)]
        for cls in dict.fromkeys([label for _i, label in samples] + [label for _j, label in inputs]):
            mine, theirs = [i for i, label in samples if label == cls], [j for j, label in inputs if label == cls]
            changed.extend(zip(mine, theirs))
            for i in mine[len(theirs):]:
                after = f"after {names[j1 - 1]}" if j1 else "at the start"
                report.add(store.where(i), f"removed from the source: no input gives this sample (it was {after} in scan order)")
            for j in theirs[len(mine):]:
                report.add(f"source {names[j]}", "added: not in the dataset")
    for (i, j), result in zip(changed, convert([items[j] for _i, j in changed])):
        where = f"{store.where(i)} <- {names[j]}"
        if not isinstance(result, Encoded):
            report.add(where, f"the source no longer converts: {getattr(result, 'reason', result)}")
            continue
        try:
            [(label, shape, payload)] = list(_copies(store.records([i])))
        except (PackedFormatError, ValueError) as exc:
            report.add(where, str(exc))
            continue
        report.compared += 1
        problem = _difference(result, label, shape, payload, store.meta)
        if problem:
            report.add(where, f"changed: {problem}")


def _difference(expected, label: int, shape: Sequence[int], payload: bytes, meta: Metadata) -> str:
    """Why a stored sample differs from the freshly converted ``expected``, or ""."""
    if label != expected.label:
        return f"label {label}, the source gives {expected.label}"
    if tuple(shape) != tuple(expected.shape):
        return f"shape {tuple(shape)}, the source gives {tuple(expected.shape)}"
    if payload == expected.payload:
        return ""
    if meta.encoding == "raw":
        diff = np.count_nonzero(np.frombuffer(payload, np.uint8) != np.frombuffer(expected.payload, np.uint8)) if len(payload) == len(expected.payload) else -1
        return f"raw pixels differ from the source's ({diff} bytes)" if diff >= 0 else "raw payload size differs from the source's"
    try:
        mine = decode_image(payload, meta.channels).astype(np.int16)
    except PackedFormatError as exc:
        return f"does not decode: {exc}"
    fresh = decode_image(expected.payload, meta.channels).astype(np.int16)
    if mine.shape != fresh.shape:
        return f"decodes to {mine.shape}, the source gives {fresh.shape}"
    error = float(np.abs(mine - fresh).mean())
    if meta.encoding == "png" and error > 0:
        return f"png pixels differ from the source's (mean abs difference {error:.2f})"
    if error > JPEG_TOLERANCE:
        return f"jpeg pixels differ from the source's (mean abs difference {error:.2f} > {JPEG_TOLERANCE})"
    return ""
