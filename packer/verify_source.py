"""``packer verify --source``: redo the recorded preprocessing on the source and compare.

A text dataset's corpus is scanned and tokenised again with the recorded options and tokenizer
(:func:`_compare_corpus`), and its documents matched to the samples by source name, as images.

The source is anything ``packer convert`` takes as SRC from the command line, with the same
options: a class folder (a path or a URL), a folder or archive with a label file
(``SourceOptions.labels`` and its columns), an archive (``.tar``, ``.tar.gz``, ``.zip``, a tar
of tars) or a folder of WebDataset shards. Its inputs are listed and converted exactly as the
conversion did (:func:`packer.jobs.image_job`), and matched to the samples by the source name
each sample records, or by content for datasets written before names were recorded.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Protocol, Sequence

import numpy as np

from readers.checksums import sample_checksum
from readers.codecs import decode_image
from readers.formats.base import Store
from readers.schema import Metadata, PackedFormatError

from .options import SourceOptions
from .sources.labels import LISTED_AGAIN


class Report(Protocol):
    """Where the comparison's findings go (:class:`packer.verify.VerifyReport`)."""

    compared: int

    def add(self, where: str, problem: str) -> None: ...


__all__ = ["compare_source", "check_source_applies", "copies", "JPEG_TOLERANCE", "GPU_TOLERANCE", "Report"]

#: Largest mean absolute pixel difference accepted between a stored jpeg sample and a fresh
#: re-encoding of its source (``--source``).
JPEG_TOLERANCE = 1.0
#: Largest mean absolute pixel difference accepted between a sample converted on the GPU
#: (``--decode-device cuda``: nvJPEG and a torch resize) and its source re-converted here on the
#: CPU (libjpeg-turbo and OpenCV's resize); two decoders' roundings differ by a pixel level or
#: two, which a margin of 3 leaves room for while a wrong image is far above it.
GPU_TOLERANCE = 3.0


def copies(records) -> Iterator[tuple[int, tuple[int, ...], bytes]]:
    for label, shape, payload in records:
        yield int(label), tuple(int(d) for d in shape), bytes(payload)


# -- against the source ------------------------------------------------------------------------
def _recorded_columns(pre: dict, source: Any, options: SourceOptions | None) -> SourceOptions | None:
    """``options`` with the Parquet columns and split the conversion read (``preprocessing``'s
    ``parquet``) where they are not given, for a Parquet SRC: its rows are compared as converted."""
    from .sources.parquet_images import parquet_image_source

    recorded = pre.get("parquet") if isinstance(pre, dict) else None
    if not isinstance(recorded, dict) or parquet_image_source(source) is None:
        return options
    options = options if options is not None else SourceOptions()
    fields = {name: getattr(options, name) or recorded.get(name) or None for name in ("image_column", "label_column", "split")}
    if Path(source).is_file():  # (one file of the split: --split picks files of a folder)
        fields["split"] = options.split
    return dataclasses.replace(options, **fields)


def check_source_applies(meta: Metadata, path: str | Path, options: SourceOptions | None = None) -> None:
    """Refuse ``--source`` options a dataset cannot use (``OptionError``, one line naming them):
    a text dataset's corpus is read as its conversion recorded, with no label file. Called before
    any check, as convert refuses an option that does not apply before converting anything."""
    from .errors import OptionError

    if meta.kind != "text" or options is None:
        return
    if dataclasses.replace(options, split=None) != SourceOptions():
        raise OptionError(f"--labels, --classes and their options: apply to image datasets, and {path} holds text; drop them")
    recorded = meta.preprocessing.get("split")
    if options.split is not None and options.split != recorded:  # (the recorded split is read: one that agrees is no news)
        read = f"its files of the split {recorded!r}" if recorded else "every file of its corpus"
        raise OptionError(f"--split {options.split}: {path} was converted from {read}, which --source reads as recorded; drop --split")


def compare_source(store: Store, source: str | Path, report: Report, workers: int | None,
                   options: SourceOptions | None = None, *, tokenizer: str | Path | None = None) -> None:
    """Match the dataset's samples to the source's current inputs, then report, by name, every
    input that changed, was added or was removed (see :func:`_match_source`). A dataset that is
    not an image conversion is refused (:func:`check_source_applies`), not reported; so are a
    source that cannot be read and options that do not fit it (``--labels``, ``--classes``)."""
    from .errors import OptionError, PackerError, SourceError
    from .jobs import image_job
    from .options import ImageOptions
    from .sources.datasets import is_python_dataset
    from .sources.remote import is_source_url

    meta = store.meta
    check_source_applies(meta, store.path, options)
    if meta.kind == "text":
        _compare_corpus(store, source, report, workers, tokenizer)
        return
    if tokenizer is not None:
        raise OptionError(f"--tokenizer: applies to a text dataset, and {store.path} holds images; drop it")
    if is_python_dataset(source):
        report.add("source", "--source takes what packer convert takes as SRC on the command line (a folder, URL, "
                             "archive or WebDataset shards), not a Python dataset: read it back and compare in Python")
        return
    pre = meta.preprocessing
    remote = is_source_url(str(source))
    options = _recorded_columns(pre, source, options)
    try:
        image = dataclasses.replace(ImageOptions.from_record(pre, meta.encoding), decode_device="cpu")  # redone here, on the CPU
        job = image_job(str(source) if remote else Path(source), image, options, workers=workers, advise=False)  # (the conversion's advice: not again)
    except (OptionError, SourceError):  # the source or its options, not the dataset: said as convert says them (they were
        raise  # 'faults', exit 1, as if the dataset were damaged: an options walkthrough)
    except (PackerError, KeyError, TypeError) as exc:
        report.add("source", f"cannot redo the recorded preprocessing: {exc}")
        return
    folder = job.folder
    assert folder is not None
    if list(folder.classes) != list(meta.classes):
        hint = ("; if it was converted with --classes, pass the same --classes to verify"
                if (options is None or options.classes is None) and set(folder.classes) <= set(meta.classes) else "")
        report.add("source", f"{source} has classes {folder.classes[:5]}..., the dataset {list(meta.classes[:5])}...{hint}")
    if meta.labeled and not folder.labeled:
        report.add("source", f"{source} gives no labels (no class folders), the dataset has them: if they came from a "
                             "labels file, pass the same --labels (and --split) to verify")
    try:
        recorded_names = store.source_names()
    except PackedFormatError as exc:
        report.add("source", f"cannot read the recorded source names, matching by content: {exc}")
        recorded_names = None
    # skipped inputs; not a labels file's row listing a path again (recorded under the path its
    # first row converted: it names a sample, not a skipped input)
    skips = {s.path: s.reason for s in meta.skipped
             if not s.reason.startswith(LISTED_AGAIN) and s.path not in set(recorded_names or ())}
    items = [item for item in job.items if job.name(item) not in skips]
    # a current label as the dataset numbers it (by class name; -2: a class the dataset lacks)
    labels = {k: meta.classes.index(c) if c in meta.classes else -2 for k, c in enumerate(folder.classes)}
    names = [job.name(item) for item in items]
    convert = _Converter(job.task, labels, workers, remote)
    match = _match_by_name if recorded_names is not None else _match_source
    match(store, convert, items, names, labels, report, recorded_names)
    _retry_skipped(job, convert, skips, report)


def _compare_corpus(store: Store, source: str | Path, report: Report, workers: int | None, tokenizer_file: str | Path | None) -> None:
    """A text dataset against its corpus: the documents found again with the recorded options,
    tokenised with the recorded tokenizer (its file must be the one the conversion used), and
    matched to the samples by their recorded source names (``file:line``), as images are."""
    from .errors import OptionError, PackerError
    from .options import TextOptions
    from .text import text_job

    meta, recorded = store.meta, None
    pre, tokenizer = meta.preprocessing or {}, dict(meta.tokenizer or {})
    options = TextOptions.from_record(pre, tokenizer)
    if tokenizer_file is not None:
        options = dataclasses.replace(options, tokenizer=str(tokenizer_file))
    elif options.tokenizer != "bytes" and not Path(options.tokenizer).is_file():  # (moved: not the dataset's fault)
        raise OptionError(f"{store.path}: its tokenizer {options.tokenizer} is gone (moved?); pass the same file with --tokenizer FILE")
    try:
        job = text_job(source, options, split=pre.get("split") if Path(source).is_dir() else None)
    except (PackerError, OSError, TypeError) as exc:
        report.add("source", f"cannot redo the recorded tokenisation: {exc}")
        return
    assert job.tokenizer is not None
    if job.tokenizer.sha256 != tokenizer.get("sha256", job.tokenizer.sha256):
        report.add("source", f"the tokenizer {options.tokenizer} is not the file the conversion used (its sha256 differs): "
                             "its ids would differ; pass the dataset the tokenizer it recorded")
        return
    try:
        recorded = store.source_names()
    except PackedFormatError as exc:
        report.add("source", f"cannot read the recorded source names: {exc}")
    if recorded is None:
        report.add("source", "the dataset records no source names (an older packer wrote it): its documents cannot be matched")
        return
    skips = {s.path: s.reason for s in meta.skipped if s.path not in set(recorded)}
    items = [item for item in job.items if job.name(item) not in skips]
    convert = _Converter(job.task, {}, workers, False)
    _match_by_name(store, convert, items, [job.name(item) for item in items], {}, report, recorded)
    _retry_skipped(job, convert, skips, report)


def _retry_skipped(job, convert: _Converter, reasons: dict[str, str], report: Report) -> None:
    """Inputs the conversion skipped (recorded in the metadata) that convert now, each named: a
    repaired file is a difference from the dataset too."""
    from .preprocess.task import Encoded

    again = [item for item in job.items if job.name(item) in reasons]
    for item, result in zip(again, convert(again)):
        if isinstance(result, Encoded):
            name = job.name(item)
            report.add(f"source {name}", f"skipped when converted ({reasons[name]}), converts now: not in the dataset")


@dataclass(frozen=True)
class _Converter:
    """Converts source inputs as the recorded conversion did, labels numbered as the dataset numbers them."""

    task: object
    labels: dict[int, int]
    workers: int | None
    remote: bool

    def __call__(self, chosen: list) -> Iterator:
        from .parallel import ordered_map, workers_within_cores
        from .preprocess.task import Encoded
        from .sources.remote import remote_chunksize

        workers = workers_within_cores(self.workers or None)  # (-j 64 started 64 processes on 2 cores)
        chunksize = remote_chunksize(len(chosen), workers) if self.remote else None  # as a conversion from it reads
        with ordered_map(self.task, chosen, workers=workers, chunksize=chunksize) as results:
            for result in results:
                yield dataclasses.replace(result, label=self.labels.get(result.label, result.label)) if isinstance(result, Encoded) else result


def _match_by_name(store: Store, convert: _Converter, items: list, names: list[str], labels: dict[int, int],
                   report: Report, recorded: list[str]) -> None:
    """Each sample is the input its recorded source name names: an input with no sample was
    *added*, a sample whose input is gone was *removed* (both named), and every other input is
    re-converted and compared with its sample (its checksum first, then the pixels)."""
    where_is = {name: i for i, name in enumerate(recorded)}
    current = set(names)
    for i, name in enumerate(recorded):
        if name not in current:
            report.add(store.where(i), f"removed from the source: {name} is no longer among its inputs")
    for name in names:
        if name not in where_is:
            report.add(f"source {name}", "added: not in the dataset")
    pairs = [(where_is[name], j) for j, name in enumerate(names) if name in where_is]
    try:
        stored = store.stored_checksums()
    except (PackedFormatError, ValueError):
        stored = None
    for (i, j), result in zip(pairs, convert([items[j] for _i, j in pairs])):
        _compare_one(store, i, f"{store.where(i)} <- {names[j]}", result, report, stored)


def _match_source(store: Store, convert: _Converter, items: list, names: list[str], labels: dict[int, int],
                  report: Report, _recorded: None = None) -> None:
    """Samples were written in scan order, less the recorded skipped inputs, and the current
    inputs are listed in the same order: so the two sequences are aligned (``difflib``) on the
    checksum each sample was stored with and the one each input would be stored with now.
    Aligned equal: unchanged. Between two unchanged runs, a sample and an input of the same
    class at the same place are the same file, *changed* (re-converted and compared); a sample
    left over was *removed* from the source (no name is recorded: the fault says where in
    the scan order it was), an input left over was *added*. (Datasets that record no source names.)"""
    from .preprocess.task import Encoded

    fresh = [r.checksum if isinstance(r, Encoded) else -1 for r in convert(items)]
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
        _compare_one(store, i, f"{store.where(i)} <- {names[j]}", result, report)


def _compare_one(store: Store, i: int, where: str, result: Any, report: Report, stored: Any = None) -> None:
    """Sample ``i`` against ``result``, its input converted afresh (its stored checksum first,
    when ``stored`` has it; then the record itself)."""
    from .preprocess.task import Encoded

    if not isinstance(result, Encoded):
        report.add(where, f"the source no longer converts: {getattr(result, 'reason', result)}")
        return
    report.compared += 1
    if stored is not None and result.checksum == int(stored[i]):
        return
    try:
        [(label, shape, payload)] = list(copies(store.records([i])))
    except (PackedFormatError, ValueError) as exc:
        report.add(where, str(exc))
        return
    problem = _difference(result, label, shape, payload, store.meta)
    if problem:
        report.add(where, f"changed: {problem}")


def _difference(expected, label: int, shape: Sequence[int], payload: bytes, meta: Metadata) -> str:
    """Why a stored sample differs from the freshly converted ``expected``, or ""."""
    if meta.kind == "text":  # token ids: (1, 1, n) of the recorded dtype
        if tuple(shape) != tuple(expected.shape):
            return f"{shape[-1]:,} tokens, the source gives {expected.shape[-1]:,}"
        if payload == expected.payload:
            return ""
        unequal = np.frombuffer(payload, np.uint8) != np.frombuffer(expected.payload, np.uint8)
        differ = int(np.count_nonzero(unequal.reshape(-1, np.dtype(meta.dtype).itemsize).any(axis=1)))
        return f"token ids differ from the source's ({differ:,} of {shape[-1]:,})"
    if label != expected.label:
        given = "a class the dataset does not have" if expected.label == -2 else expected.label
        return f"label {label}, the source gives {given}"
    if tuple(shape) != tuple(expected.shape):
        return f"shape {tuple(shape)}, the source gives {tuple(expected.shape)}"
    if payload == expected.payload:
        return ""
    gpu = (meta.preprocessing or {}).get("decode_device", "cpu") != "cpu"  # re-converted here on the CPU: close, not equal
    if meta.encoding == "raw" and gpu and len(payload) == len(expected.payload):
        error = float(np.abs(np.frombuffer(payload, np.uint8).astype(np.int16) - np.frombuffer(expected.payload, np.uint8)).mean())
        return f"raw pixels differ from the source's CPU conversion (mean abs difference {error:.2f} > {GPU_TOLERANCE}, converted on the GPU)" if error > GPU_TOLERANCE else ""
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
    if gpu:
        if error > GPU_TOLERANCE + JPEG_TOLERANCE:
            return f"pixels differ from the source's CPU conversion (mean abs difference {error:.2f} > {GPU_TOLERANCE + JPEG_TOLERANCE}, converted on the GPU)"
        return ""
    if meta.encoding == "png" and error > 0:
        return f"png pixels differ from the source's (mean abs difference {error:.2f})"
    if error > JPEG_TOLERANCE:
        return f"jpeg pixels differ from the source's (mean abs difference {error:.2f} > {JPEG_TOLERANCE})"
    return ""
