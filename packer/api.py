"""``packer.convert``: the conversion, as a Python call. The CLI only parses and calls this.

This module checks the request and routes it; the conversion itself is one driver for every
kind of source (:mod:`packer.engine`) over a job per kind (:mod:`packer.jobs`, :mod:`packer.text`).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

from readers.formats import open_store
from readers.formats.base import local_path
from readers.schema import PackedFormatError

from .destination import check_apart, check_destination
from .engine import check_unfinished, run
from .errors import OptionError, OutputExistsError, PackerError, SourceError
from .files import recover_replaced
from .jobs import Job, changed_fields, check_source_options, image_job, images_only, resolve_kind
from .options import DEFAULT_ITEM_TIMEOUT, ImageOptions, RunOptions, SourceOptions, StorageOptions, TextOptions
from .report import ConversionReport, TextConversionReport
from .sources.remote import is_source_url
from .sources.parquet_images import asked_once
from .writers import format_for_path, get_writer

__all__ = ["convert", "ConversionReport", "TextConversionReport", "resolve_format"]


def resolve_format(dst: str | Path, format: str | None) -> str:
    """The output format: explicit ``format``, else from DST's name (a ``format`` the name
    contradicts is refused: an HDF5 file named ``.lmdb`` misleads every tool after)."""
    guessed = format_for_path(str(dst))
    if format is not None:
        get_writer(format)
        if guessed is not None and guessed != format:
            raise OptionError(f"{dst}: the name says {guessed} but --format is {format}; rename DST to match, or leave --format out")
        return format
    if guessed is None:
        existing = _existing_format(dst)
        if existing is not None:  # a packer dataset there already (a shard folder): what --overwrite or --resume would replace
            return existing
        raise OptionError(f"{dst}: cannot tell the format from the name; pass --format (lmdb, hdf5, blob or webdataset), or name "
                          "it .lmdb, .h5, .blob or folder/name-%06d.tar (WebDataset)")
    return guessed


def _existing_format(dst: str | Path) -> str | None:
    """The format of the finished packer dataset at a local ``dst``, if there is one."""
    dst = local_path(str(dst))  # (a file:// URL: its local path)
    if "://" in str(dst):
        return None
    try:
        return open_store(dst).meta.format
    except (PackedFormatError, OSError, ValueError):
        return None


def _refuse_inside_a_worker_start() -> None:
    """A worker process imports the main script to find the classes it defines (a Python
    dataset's); a script without ``if __name__ == "__main__":`` then runs its conversion again in
    every worker, which failed on the output's lock, and the driver called each sample a decoder
    crash. Said plainly here, in the worker, where multiprocessing marks its start-up."""
    import multiprocessing.process

    if getattr(multiprocessing.process.current_process(), "_inheriting", False):  # its line alone: a traceback hid it in 46 lines
        print("packer.convert was called while a worker process was importing your script (workers import it to find the "
              "classes it defines): put the script's code under `if __name__ == \"__main__\":`", file=sys.stderr, flush=True)
        raise SystemExit(1)


@asked_once()  # (the source's kind and options ask whether it is Parquet files of images: its tree is walked once)
def convert(
    src: Any,
    dst: str | Path,
    *,
    format: str | None = None,
    image: ImageOptions | None = None,
    storage: StorageOptions | None = None,
    workers: int | None = None,
    overwrite: bool = False,
    on_error: str = "skip",
    progress: bool = False,
    timeout: float = DEFAULT_ITEM_TIMEOUT,
    kind: str | None = None,
    text: TextOptions | None = None,
    resume: bool = False,
    executor: str = "local",
    ray_address: str | None = None,
    sink: object = None,
    source: SourceOptions | None = None,
) -> ConversionReport:
    """Convert the image folder or text corpus ``src`` into a packed dataset at ``dst``.

    Images: class sub-folders of ``src`` become labels; each image is decoded, oriented, resized
    and encoded once (``image`` options). ``src`` may also be an archive (.tar, .tar.gz, .zip, a
    tar of tars: packer/sources/archives.py), a folder of WebDataset shards, Parquet files of
    images (a Hugging Face dataset as the Hub stores it: packer/sources/parquet_images.py), a folder or archive
    whose labels are in a file (``source=SourceOptions(labels="train.csv")``:
    packer/sources/labels.py), or a map-style Python dataset object (``dataset[i]`` is
    ``(image, label)`` or a record: packer/sources/datasets.py). Text (``kind="text"``, ``text`` options given, or a
    folder of .txt/.jsonl/.ndjson/.parquet files and no images): each document is tokenised into one
    sample of token ids. Options of the other kind, and ``storage`` options the format does not
    use, are refused, never ignored.

    Either way the work is done by ``workers`` processes (default: all cores; more are capped
    at the cores, with a warning) and the output is identical whatever the worker count. An
    input that cannot be converted, crashes its worker (a decoder segfault) or takes longer than
    ``timeout`` seconds is skipped and recorded in the metadata (``on_error="skip"``) or stops
    the conversion (``"fail"``). The output appears at ``dst`` only when complete; an existing
    ``dst`` is replaced only with ``overwrite`` and only if it is a packer dataset.
    ``resume=True`` carries on from the last checkpoint of an interrupted run with the same
    source and options (refused, naming the option, if they differ), with the same result; an
    interrupted run keeps its checkpoint, and a plain re-run refuses to discard it silently.
    ``executor="ray"`` runs the conversion as Ray tasks on the cluster at ``ray_address``
    (default: a running one, else a local instance; ``workers`` defaults to its CPUs), with the
    same output; SRC and DST must be on storage every node sees at the same path, or URLs
    (docs/SCALING.md). ``src``/``dst`` may be fsspec URLs (``s3://...``; WebDataset and blob DST:
    packer/remote.py; a URL SRC is streamed, each worker reading its inputs). ``sink`` takes a
    WebDataset's files or a blob's bytes instead of the local ``dst`` (what packer/remote.py
    passes for a URL DST).
    """
    _refuse_inside_a_worker_start()
    for name, value, expected in (("image", image, ImageOptions), ("storage", storage, StorageOptions), ("text", text, TextOptions),
                                  ("source", source, SourceOptions)):
        if value is not None and not isinstance(value, expected):
            raise TypeError(f"convert: {name}= takes a packer.{expected.__name__}, got {type(value).__name__} "
                            f"(for example {name}=packer.{expected.__name__}(...))")
    from .sources.datasets import is_python_dataset

    if not isinstance(overwrite, bool):  # "no" is true: an output replaced that was to be kept
        raise OptionError(f"--overwrite: must be True or False, got {overwrite!r}")
    for name, value in (("dst", dst), ("src", src)):
        if not isinstance(value, (str, os.PathLike)) and (name == "dst" or not is_python_dataset(value)):
            what = "a path or URL" if name == "dst" else "a folder, file or URL path, or a map-style dataset (dataset[i] and len())"
            raise TypeError(f"convert: {name} must be {what}, got {type(value).__name__}")
    options = RunOptions(on_error=on_error, workers=workers, timeout=timeout, executor=executor, ray_address=ray_address,
                         resume=resume, progress=progress)
    src = _local_if_read_locally(src)
    if (isinstance(src, (str, os.PathLike)) and not is_source_url(str(src)) and not os.path.lexists(src)
            and isinstance(dst, (str, os.PathLike)) and os.path.lexists(dst)):  # before DST's checks, which would blame DST
        raise SourceError(f"{src}: no such folder or file, and DST {dst} exists: SRC comes first (packer convert SRC DST)")
    fmt = resolve_format(dst, format)
    storage = storage if storage is not None else StorageOptions()
    unused = [name for name in changed_fields(storage) if name[2:].replace("-", "_") not in get_writer(fmt).storage_fields]
    if unused:
        raise OptionError(f"{unused[0]}: does not apply to {fmt} output; drop it")
    source = source if source is not None else SourceOptions()
    pyobject = is_python_dataset(src)
    check_source_options(src, source)
    if image is not None and image.decode_device != "cpu":
        from .gpu_stage import check_gpu_conversion

        check_gpu_conversion(fmt, executor, pyobject)
    if executor != "local" and not pyobject and not is_source_url(str(src)):
        src = Path(src).resolve()  # tasks elsewhere see absolute paths
    from .remote import is_dst_url, remote_destination
    from .writers import WRITERS

    remote = get_writer(fmt).remote
    if sink is not None and remote is None:  # (it reached the writer, a TypeError there)
        takes = [name for name in WRITERS if get_writer(name).remote is not None]
        raise OptionError(f"sink: applies to {' and '.join(takes)} output only, not {fmt}; drop it")
    if str(dst)[:7].lower() == "file://" and remote is None:  # a local path all the same: written in place
        dst = local_path(str(dst))
    if is_dst_url(str(dst)):
        if remote is None:
            written = [name for name in WRITERS if get_writer(name).remote is not None]
            raise OptionError(f"{dst}: a remote DST must be one of {', '.join(written)} (got {fmt}); convert locally and copy")
        if sink is not None:
            raise OptionError("sink: a URL DST is written through a sink of its own (packer/remote.py); give a local dst, or no sink")
        with remote_destination(str(dst), remote, overwrite=overwrite, resume=resume) as staging:
            local = staging.local_dst
            try:
                check_unfinished(get_writer(fmt).destination(local), resume=resume, overwrite=overwrite)
                report = run(_job(src, kind, image, text, source, options.workers), fmt, local, storage=storage, options=options, sink=staging.sink)
            except PackerError as exc:  # said of the DST as given, and where it is staged (a full disk there is this machine's)
                if str(local) not in str(exc):
                    raise
                raise type(exc)(str(exc).replace(str(local), f"{dst} (staged in {local.parent})", 1)) from None
        return dataclasses.replace(report, dst=str(dst))
    given = Path(dst)
    written = get_writer(fmt).destination(given)  # (a WebDataset pattern's: its folder)
    through_link = written.is_symlink() and written.exists()  # the link's target is written, the link kept (it was replaced by a folder)
    if executor != "local" or through_link:  # (tasks elsewhere see absolute paths)
        dst = given.resolve() if written == given else written.resolve() / given.name
    else:
        dst = given
    final = get_writer(fmt).destination(dst)
    if not pyobject and not is_source_url(str(src)):
        check_apart(src, final)
    recover_replaced(final)  # (a killed --overwrite's: the dataset it was replacing)
    check_unfinished(final, resume=resume, overwrite=overwrite)  # first: a running or interrupted conversion is the news
    refusal = get_writer(fmt).refuse_replacing(dst)
    if refusal is not None:
        raise OutputExistsError(refusal)
    check_destination(final, overwrite=overwrite, resume=resume)
    report = run(_job(src, kind, image, text, source, options.workers), fmt, dst, storage=storage, options=options, sink=sink)
    return report if dst == given else dataclasses.replace(report, dst=get_writer(fmt).destination(given))  # (said as given)


def _local_if_read_locally(src: Any) -> Any:
    """A ``file://`` SRC that packer reads from local paths only (a file: an archive, Parquet, a
    text file; a folder of text or of Parquet files) as its local path: it was refused as a URL
    ("text corpora are read from local folders only") though it is one. A folder of images stays
    a URL (streamed, its URL recorded)."""
    if not (isinstance(src, str) and src[:7].lower() == "file://"):
        return src
    local = Path(local_path(src))
    if not local.exists() or local.is_file():
        return str(local) if local.exists() else src
    from .sources.parquet_images import parquet_image_source
    from .sources.text import is_text_corpus

    return str(local) if parquet_image_source(local) is not None or is_text_corpus(local) else src


def _job(src: Any, kind: str | None, image: ImageOptions | None, text: TextOptions | None, source: SourceOptions,
         workers: int | None) -> Job:
    """The job for ``src``: images (a folder, an archive, a dataset...) or a text corpus, refusing
    the other kind's options."""
    if resolve_kind(src, kind, text_given=text is not None) == "image":
        if text is not None:
            named = ", ".join(changed_fields(text)) or "text=TextOptions()"
            from .sources.datasets import describe_dataset, is_python_dataset

            if is_python_dataset(src):  # (it named the object's repr, an "image folder" and --kind text, which is refused for it)
                raise OptionError(f"{describe_dataset(src)}: text options ({named}) do not apply: a Python dataset converts as images; drop text=")
            raise OptionError(f"{src}: text options ({named}) do not apply to an image folder; drop them, or pass --kind text")
        job = image_job(src, image if image is not None else ImageOptions(), source, workers=workers)
        if job.image.decode_device == "cpu":
            return job
        from .gpu_stage import gpu_job  # --decode-device cuda: workers fetch, one process decodes on the GPU

        return gpu_job(job, device=job.image.decode_device)
    if dataclasses.replace(source, split=None) != SourceOptions():  # (--split picks a text corpus's files too)
        raise images_only(changed_fields(source)[0], src, kind)
    from .text import text_job

    if image is not None:  # given, even at its defaults: used or refused, never dropped
        raise images_only((changed_fields(image) or ["image=ImageOptions()"])[0], src, kind)
    if is_source_url(str(src)):
        raise OptionError(f"{src}: text corpora are read from local folders only so far; copy it locally first")
    return text_job(src, text if text is not None else TextOptions(), split=source.split)
