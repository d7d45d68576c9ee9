"""The ``packer`` command line: parse, call the Python API, render. Nothing else lives here.

User mistakes (a missing folder, an existing output, a bad option, a damaged dataset) print a
single ``Error: ...`` line on stderr and exit non-zero, without a traceback.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import re
import sys
from typing import Iterator
from pathlib import Path

import click

from readers.formats.base import local_path
from readers.schema import ENCODINGS, KINDS, PackedFormatError

from . import api
from ._version import __version__
from .cli_command import dataset_or_url, escape_unencodable, local_dataset, OnceCommand
from .doctor_cli import doctor as doctor_command
from .engine import UNPRINTED_SKIP, Interrupted
from .errors import OptionError, PackerError
from .executors import EXECUTORS
from .info import dataset_info, read_metadata, streamed_as
from .interrupts import interruptible
from .jobs import changed_fields, check_kind_options
from .options import COMPRESSIONS, DECODE_DEVICES, DEFAULT_MAX_PIXELS, ON_ERROR, ImageOptions, StorageOptions, NO_EOS, AUTO_BOS, TextOptions, SourceOptions
from .parallel import DEFAULT_ITEM_TIMEOUT, keep_freed_memory
from .report import one_line
from .sources.text import refuse_text_field_without_records
from .sources.parquet_images import asked_once
from .preprocess.geometry import RESIZE_MODES
from .writers import WRITERS

__all__ = ["cli", "main"]

MAX_WARNINGS = 20
EXIT_INTERRUPTED = 130

#: ``convert``'s options that apply to one kind of source only (as click names them): typed on
#: the command line for the other kind, at any value (the default too), they are refused.
IMAGE_OPTIONS = ("size", "resize", "resize_mode", "grayscale", "encoding", "quality", "max_pixels", "decode_device")
TEXT_OPTIONS = ("tokenizer", "lines", "text_field", "eos", "max_tokens", "bos")


class _UserError(click.ClickException):
    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(one_line(message))  # (a file name's newline must not make a second line)
        self.exit_code = exit_code


class _Group(click.Group):
    """Turns packer's user-facing exceptions into one-line errors; its commands refuse an option
    given twice (:class:`OnceCommand`)."""

    command_class = OnceCommand

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except PackerError as exc:
            raise _UserError(str(exc), exc.exit_code) from None
        except (PackedFormatError, FileNotFoundError) as exc:
            raise _UserError(str(exc)) from None
        except OSError as exc:
            if exc.errno not in _LIMITS:  # anything else is a bug: its traceback says where
                raise
            raise _UserError(f"{exc.strerror or exc}: {_LIMITS[exc.errno]}") from None
        except MemoryError:
            raise _UserError(f"out of memory: {_LIMITS[errno.ENOMEM]}") from None
        except KeyboardInterrupt:  # outside a command's own handling (click would say "Aborted!", exit 1)
            raise _UserError("interrupted", EXIT_INTERRUPTED) from None


#: Limits a command can run into anywhere (starting workers, importing a library), and what to do.
_LIMITS = {
    errno.EMFILE: "the open-file limit (ulimit -n) is too low for this; raise it",
    errno.ENFILE: "the system has too many files open; close some programs, or pass fewer --workers",
    errno.ENOMEM: "raise the memory limit (ulimit -v), free some memory, or pass fewer --workers",
}


class _WarningPrinter(logging.Handler):
    """Prints packer's warnings above the progress bar, at most ``limit`` of them, then how many
    more there were (nothing at all when ``quiet``)."""

    def __init__(self, limit: int, *, quiet: bool = False) -> None:
        super().__init__(logging.DEBUG)
        self.limit = 0 if quiet else limit
        self.quiet = quiet
        self.count = 0
        self.closed = False
        from tqdm import tqdm  # now: imported at a warning under a memory limit, it failed there, in logging's traceback

        self._write = tqdm.write

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno < logging.WARNING and not getattr(record, UNPRINTED_SKIP, False):
            return
        self.count += 1  # (a skipped input past the engine's own limit is counted, never printed)
        if self.count <= self.limit and record.levelno >= logging.WARNING:
            self._write(f"warning: {one_line(record.getMessage())}", file=sys.stderr)

    def close(self) -> None:
        """Say how many warnings were not printed, once (logging closes every handler still
        alive again at exit: after an error, the traceback kept this one, and it said it twice)."""
        if self.count > self.limit and not self.quiet and not self.closed:
            click.echo(f"warning: ... and {self.count - self.limit:,} more warnings", err=True)
        self.closed = True
        super().close()


@contextlib.contextmanager
def _printed_warnings(quiet: bool = False) -> Iterator[None]:
    """packer's warnings printed while the block runs (:class:`_WarningPrinter`), in place of
    logging's default handler (no ``warning:`` prefix, no limit); how many more, at its end."""
    printer = _WarningPrinter(MAX_WARNINGS, quiet=quiet)
    logger, level = logging.getLogger("packer"), logging.getLogger("packer").level
    logger.addHandler(printer)
    logger.propagate = False
    logger.setLevel(logging.DEBUG)  # (the skips past the engine's limit come as debug records; setLevel clears logging's cache)
    try:
        yield
    finally:
        logger.removeHandler(printer)
        logger.propagate = True
        logger.setLevel(level)
        printer.close()


def label_file_options(command):
    """The label-file options of a SRC (``SourceOptions``): convert's, and verify's for --source."""
    for option in reversed([
        click.option("--labels", type=click.Path(dir_okay=False), help="Labels from a CSV/TSV/JSON/JSONL file (paths relative to SRC, a flat folder or archive)."),
        click.option("--path-column", metavar="NAME", help="With --labels: the image path column (default: path, filename, image, id...)."),
        click.option("--label-column", metavar="NAME", help="With --labels or a Parquet SRC: the label column (default: label, class, category...)."),
        click.option("--image-column", metavar="NAME", help="A Parquet SRC: the column of encoded images (default: the Image one, else image, img...)."),
        click.option("--split-column", metavar="NAME", help="With --split: the column it selects on (default: split, subset, set or fold)."),
        click.option("--split", metavar="VALUE", help="With --labels: only the rows of this split (e.g. val); a Parquet SRC or a text corpus: its files of this split."),
        click.option("--classes", "classes", type=click.Path(), metavar="PATH",
                     help="Number the classes as this list does: a packer dataset (--classes train.lmdb, converting val) "
                          "or a text file of class names, one a line."),
    ]):
        command = option(command)
    return command


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="packer")
def cli() -> None:
    """Convert datasets once, offline, into formats PyTorch reads at memory speed.

    \b
    Example:
      packer convert imagenet/train train.lmdb --size 224
      packer info train.lmdb
    """
    escape_unencodable()


@cli.command()
@click.argument("src", type=click.Path())  # str: a path or an fsspec URL (s3://...), which a Path would mangle
@click.argument("dst", type=click.Path())
@click.option("--format", "-f", "format_name", type=click.Choice(sorted(WRITERS)), help="Output format (default: from DST's name: .lmdb, .h5/.hdf5, .blob, folder/name-%06d.tar for WebDataset).")
@click.option("--size", "-s", metavar="N|HxW", help="Output size: N (square) or HEIGHTxWIDTH.")
@click.option("--resize", type=click.IntRange(1), metavar="N", help="Center-crop: scale the shorter side to N first (--size 224 --resize 256: the standard Resize(256) + CenterCrop(224)).")
@click.option("--resize-mode", type=click.Choice(list(RESIZE_MODES)), help="center-crop (default with --size), pad, stretch, shorter (shorter side to N), none (default without --size).")
@click.option("--grayscale", is_flag=True, help="Store one channel.")
@click.option("--encoding", type=click.Choice(ENCODINGS), default="raw", show_default=True, help="raw uint8 pixels, or jpeg/png files.")
@click.option("--quality", type=click.IntRange(1, 100), help="JPEG quality, with --encoding jpeg only (default: 90).")
@click.option("--decode-device", type=click.Choice(DECODE_DEVICES), default="cpu", show_default=True, help="cuda: decode JPEGs with nvJPEG and resize on the GPU, in one process (the 'gpu' extra); other images on the CPU.")
@click.option("--max-pixels", type=click.IntRange(1), default=DEFAULT_MAX_PIXELS, show_default=True, help="Skip images with more pixels.")
@click.option("--workers", "-j", type=click.IntRange(1), help="Worker processes (default: all cores).")
@click.option("--on-error", type=click.Choice(ON_ERROR), default="skip", show_default=True, help="Skip and record undecodable inputs, or stop at the first.")
@click.option("--timeout", type=click.FloatRange(0, min_open=True), default=DEFAULT_ITEM_TIMEOUT, show_default=True, help="Seconds one input (an image, a document) may take; a slower one (a hung decoder) is skipped.")
@click.option("--compression", type=click.Choice(COMPRESSIONS), help="HDF5 only: lossless compression filter (default: none).")
@click.option("--shard-size", type=click.IntRange(1), help="WebDataset only: samples per shard.")
@click.option("--shard-bytes", metavar="BYTES", help="WebDataset only: payload bytes per shard (at most): 1000000, 64MB, 1GiB.")
@click.option("--kind", type=click.Choice(KINDS), help="image or text (default: text for a folder of .txt/.jsonl/.ndjson files, or of .parquet files without an image column, and no images).")
@click.option("--tokenizer", default="bytes", show_default=True, help="Text: 'bytes' (UTF-8, EOS 256), a tokenizer.json, or a SentencePiece .model.")
@click.option("--lines", is_flag=True, help="Text: one document per non-empty line of .txt files.")
@click.option("--text-field", default="text", show_default=True, help="Text: the field of JSON Lines records / Parquet rows.")
@click.option("--eos", metavar="ID|none", help="Text: end-of-document id (default: the tokenizer's own; 256 for bytes).")
@click.option("--max-tokens", type=click.IntRange(1), help="Text: keep at most this many tokens of each document (EOS is added after them).")
@click.option("--bos", metavar="ID|auto", help="Text: an id put before every document (auto: the tokenizer's own, as <s>; default: none).")
@label_file_options
@click.option("--overwrite", is_flag=True, help="Replace DST if it is a packer dataset (never another file or folder).")
@click.option("--resume", is_flag=True, help="Carry on an interrupted conversion (same SRC, DST and options) from its last checkpoint.")
@click.option("--executor", type=click.Choice(EXECUTORS), default="local", show_default=True, help="local: this machine's processes; ray: Ray tasks on a cluster (the 'ray' extra; SRC and DST on shared storage, or URLs).")
@click.option("--ray-address", metavar="ADDR", help="With --executor ray: the cluster to join (default: a running one, else a local instance).")
@click.option("--quiet", "-q", is_flag=True, help="Only the summary: no progress bar, warnings or next-step line.")
@asked_once()  # (the kind checks here and the conversion walk SRC once)
def convert(
    src: str,
    dst: str,
    format_name: str | None,
    size: str | None,
    resize: int | None,
    resize_mode: str | None,
    grayscale: bool,
    encoding: str,
    quality: int | None,
    max_pixels: int,
    decode_device: str,
    workers: int | None,
    on_error: str,
    timeout: float,
    compression: str | None,
    shard_size: int | None,
    shard_bytes: str | None,
    kind: str | None,
    tokenizer: str, lines: bool, text_field: str, eos: str | None, max_tokens: int | None, bos: str | None,
    labels: str | None, path_column: str | None, label_column: str | None, image_column: str | None, split_column: str | None,
    split: str | None, classes: str | None,
    overwrite: bool,
    resume: bool,
    executor: str,
    ray_address: str | None,
    quiet: bool,
) -> None:
    """Convert the image folder SRC (class sub-folders = labels), or a text corpus, into DST.

    SRC may also be an archive (.tar, .tar.gz, .zip, a tar of tars), a folder of WebDataset
    shards, Parquet files of images (a Hugging Face dataset as the Hub stores it), or, with
    --labels, a flat folder or archive whose labels are in a file.

    \b
    Examples:
      packer convert imagenet/train train.lmdb --size 224
      packer convert imagenet/val val.lmdb --size 224 --resize 256
      packer convert faces/ faces.lmdb --size 112x96 --resize-mode pad --grayscale
      packer convert photos/ photos.lmdb --size 256 --resize-mode shorter --encoding jpeg
      packer convert /shared/imagenet /shared/train.shards -f webdataset --executor ray --ray-address auto
      packer convert ILSVRC2012_img_train.tar train.lmdb --size 224
      packer convert images/ train.lmdb --labels train.csv --split-column fold --split train
    """
    typed_image, typed_text = ([f"--{name.replace('_', '-')}" for name in names if _given(name)] for names in (IMAGE_OPTIONS, TEXT_OPTIONS))
    check_kind_options(src, kind, image=typed_image, text=typed_text)  # here: the API cannot tell a typed default from none
    image = None  # no image option on the command line: a text corpus takes none, an image folder the defaults
    if typed_image:
        image = ImageOptions(size=size, resize=resize, resize_mode=resize_mode, grayscale=grayscale, encoding=encoding, quality=quality,
                             max_pixels=max_pixels, decode_device=decode_device)
    text = _text_options(tokenizer, lines, text_field, eos, max_tokens, bos) if typed_text or kind == "text" else None
    if "--text-field" in typed_text and Path(local_path(str(src))).exists():  # (typed as its default too: refused alike)
        refuse_text_field_without_records(Path(local_path(str(src))))
    keep_freed_memory()  # this process receives and writes every sample: see packer/parallel.py
    storage = StorageOptions(compression=compression, shard_size=shard_size, shard_bytes=shard_bytes)
    report = None
    try:
        with _printed_warnings(quiet), interruptible():  # SIGTERM and SIGHUP stop a conversion as Ctrl-C does: its checkpoint is kept
            report = api.convert(
                src, dst, format=format_name, image=image, storage=storage, workers=workers, overwrite=overwrite, on_error=on_error,
                progress=not quiet, timeout=timeout, kind=kind, text=text,
                resume=resume, executor=executor, ray_address=ray_address,
                source=SourceOptions(labels=labels, path_column=path_column, label_column=label_column, split_column=split_column, split=split,
                                     classes=classes, image_column=image_column),
            )
        click.echo(report.summary())  # (a Ctrl-C as it prints: the output is complete, as below says)
        if not quiet:
            click.echo(report.next_steps(streamed_as(report.dst) if report.format == "webdataset" else None))
    except Interrupted as exc:
        raise _UserError(str(exc), EXIT_INTERRUPTED) from None
    except KeyboardInterrupt:
        if report is not None:  # (a swallowed interruption, raised as the block ended: packer/interrupts.py)
            raise _UserError(f"interrupted after the output was complete: {report.dst} is finished", EXIT_INTERRUPTED) from None
        raise _UserError(f"interrupted; nothing was written to {dst}", EXIT_INTERRUPTED) from None


def _given(*names: str) -> bool:
    """Whether any of the current command's options ``names`` was set on the command line."""
    ctx = click.get_current_context()
    return any(ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE for name in names)


def _text_options(tokenizer: str, lines: bool, text_field: str, eos: str | None, max_tokens: int | None, bos: str | None) -> TextOptions:
    """The text options, ``--eos`` and ``--bos`` parsed: an invalid value is an :class:`OptionError` (exit 2)."""
    def token(option: str, value: str | None, word: str) -> int | str | None:
        if value is None or value == word:
            return value
        if not re.fullmatch(r"\s*[+-]?[0-9]+\s*", value):
            raise OptionError(f"{option}: must be a token id >= 0 or {word!r}, got {value!r}")
        return int(value)  # a negative one: refused by TextOptions, as from Python

    return TextOptions(tokenizer=tokenizer, lines=lines, text_field=text_field, eos=token("--eos", eos, NO_EOS), max_tokens=max_tokens,
                       bos=token("--bos", bos, AUTO_BOS))


@cli.command()
@click.argument("path", type=click.Path(), callback=local_dataset)
@click.option("-n", "count", type=click.IntRange(1), default=3, show_default=True, help="Documents to print.")
@click.option("--tokenizer", help="Tokenizer file, if not where it was at conversion.")
@click.option("--chars", type=click.IntRange(0), default=2000, show_default=True, help="Characters printed of each document (0: all).")
def head(path: Path, count: int, tokenizer: str | None, chars: int) -> None:
    """Print the first documents of a text dataset, decoded.

    \b
    Example:
      packer head corpus.blob -n 3
    """
    from .preview import document_preview

    click.echo(document_preview(path, count=count, tokenizer=tokenizer, chars=chars))


@cli.command()
@click.argument("path", type=click.Path(), callback=dataset_or_url)
@click.option("--json", "as_json", is_flag=True, help="Print the metadata as JSON.")
def info(path: Path | str, as_json: bool) -> None:
    """Show what a packed dataset holds and how it was made (PATH may be the URL of a WebDataset or blob).

    \b
    Examples:
      packer info train.lmdb
      packer info s3://bucket/train
    """
    click.echo(dataset_info(path, as_json=as_json))


@cli.command()
@click.argument("path", type=click.Path(), callback=local_dataset)
@click.option("--output", "-o", type=click.Path(path_type=Path), default=Path("preview.png"), show_default=True, help="Image file to write (.png, .jpg, or another type Pillow writes).")
@click.option("--count", "-n", type=click.IntRange(1, 1024), default=16, show_default=True, help="Number of random samples (a text dataset: its first 3 documents, unless given).")
@click.option("--seed", type=int, default=0, show_default=True, help="Which random samples.")
@click.option("--tile", type=click.IntRange(16, 1024), default=128, show_default=True, help="Cell size in pixels.")
def preview(path: Path, output: Path, count: int, seed: int, tile: int) -> None:
    """Save a contact sheet of random samples, captioned with index and class (a text dataset:
    print its first documents, decoded, as packer head does; -o, --seed and --tile are refused).

    \b
    Example:
      packer preview train.lmdb -o grid.png --count 25
    """
    from .preview import SHEET_OPTIONS, document_preview, preview as make_preview, refuse_sheet_options

    if read_metadata(path).kind == "text":  # no pictures to draw: the first documents, decoded
        refuse_sheet_options(path, [name for name in SHEET_OPTIONS if _given(name)])  # -o, --seed, --tile: refused, not dropped
        click.echo(document_preview(path, count=count if _given("count") else 3))
        return
    click.echo(f"wrote {make_preview(path, output, count=count, seed=seed, tile=tile)}")


@cli.command()
@click.argument("src", type=click.Path())  # as typed: a URL is refused naming it, not folded to one slash
@click.option("--sample", type=click.IntRange(1), default=2000, show_default=True, help="Images of SRC to convert and time (evenly spaced).")
@click.option("--size", "-s", metavar="N|HxW", help="Output size, as in packer convert.")
@click.option("--resize", type=click.IntRange(1), metavar="N", help="As in packer convert (the raw folder is read with the same crop).")
@click.option("--resize-mode", type=click.Choice(list(RESIZE_MODES)), help="As in packer convert.")
@click.option("--grayscale", is_flag=True, help="Store one channel.")
@click.option("--encoding", type=click.Choice(ENCODINGS), default="raw", show_default=True, help="raw uint8 pixels, or jpeg/png files.")
@click.option("--quality", type=click.IntRange(1, 100), help="JPEG quality, with --encoding jpeg only (default: 90).")
@click.option("--format", "-f", "formats", multiple=True, type=click.Choice(sorted(WRITERS)), help="Formats to try (repeatable, each timed once; default: all).")
@click.option("--batch-size", type=click.IntRange(1), default=64, show_default=True)
@click.option("--workers", "-j", type=click.IntRange(1), help="Conversion processes and largest num_workers tried (default: all cores).")
@click.option("--seconds", type=click.FloatRange(0, min_open=True), default=2.0, show_default=True, help="Shortest timed pass.")
@click.option("--repeats", type=click.IntRange(1), default=3, show_default=True, help="Timed passes per figure (after a warm-up).")
@click.option("--tmp-dir", type=click.Path(path_type=Path, file_okay=False), help="Where the temporary conversions go (removed afterwards).")
@click.option("--quiet", "-q", is_flag=True, help="No progress lines.")
def bench(src: str, sample: int, size: str | None, resize: int | None, resize_mode: str | None, grayscale: bool, encoding: str, quality: int | None,
          formats: tuple[str, ...], batch_size: int, workers: int | None, seconds: float, repeats: int, tmp_dir: Path | None, quiet: bool) -> None:
    """Time reading a sample of SRC packed in each format against the raw folder, on this machine.

    \b
    Example:
      packer bench imagenet/train --size 224 --sample 2000
    """
    from .bench import run_bench

    image = ImageOptions(size=size, resize=resize, resize_mode=resize_mode, grayscale=grayscale, encoding=encoding, quality=quality)
    try:
        with interruptible():  # SIGTERM and SIGHUP clean up as Ctrl-C does
            report = run_bench(src, sample=sample, image=image, formats=formats or None, workers=workers, batch_size=batch_size,
                               seconds=seconds, repeats=repeats, tmp_dir=tmp_dir, log=None if quiet else lambda m: click.echo(m, err=True))
    except KeyboardInterrupt:
        raise _UserError("interrupted; temporary files removed", EXIT_INTERRUPTED) from None
    click.echo(report.setup())
    click.echo(report.table())
    click.echo()
    click.echo(report.recommendation())


@cli.command()
@click.argument("path", type=click.Path(), callback=dataset_or_url)
@click.option("--source", metavar="SRC", help="Also redo the recorded preprocessing on this source (what convert took as SRC: a folder, URL, archive or WebDataset shards) and compare every sample (a text dataset: its corpus, tokenised again).")
@label_file_options
@click.option("--quick", is_flag=True, help="Skip decoding jpeg/png samples (checksums and structure are still checked).")
@click.option("--workers", "-j", type=click.IntRange(1), help="Processes for --source (default: all cores).")
@click.option("--tokenizer", "tokenizer_file", type=click.Path(dir_okay=False), metavar="FILE",
              help="With --source of a text dataset: its tokenizer file, where the recorded one has moved (the same file: its sha256 is checked).")
def verify(path: Path | str, source: str | None, labels: str | None, path_column: str | None, label_column: str | None,
           image_column: str | None, split_column: str | None, split: str | None, classes: str | None, quick: bool, workers: int | None,
           tokenizer_file: str | None) -> None:
    """Check a packed dataset: metadata, structure, every sample's checksum and decode (PATH
    may be the URL of a WebDataset or blob: read in place, never copied whole).

    Prints each fault (sample index and shard) and exits non-zero if there is any.

    \b
    Examples:
      packer verify train.lmdb
      packer verify train.lmdb --source imagenet/train
      packer verify val.lmdb --source ILSVRC2012_img_val.tar --labels val.csv
    """
    from .verify import verify as run_verify

    options = SourceOptions(labels=labels, path_column=path_column, label_column=label_column, split_column=split_column, split=split,
                            classes=classes, image_column=image_column)
    given = changed_fields(options)
    if source is None and given:
        raise click.UsageError(f"{given[0]}: only with --source (the label file or class list of the source it compares with)")
    if source is None and tokenizer_file is not None:
        raise click.UsageError("--tokenizer: only with --source (the corpus tokenised again with it)")
    with _printed_warnings(), interruptible():  # SIGTERM and SIGHUP stop it as Ctrl-C does: its workers are stopped, "interrupted", exit 130
        report = run_verify(path, source=source, quick=quick, workers=workers, source_options=options, tokenizer=tokenizer_file)
    for note in report.notes:
        click.echo(f"note: {note}")
    for fault in report.faults:
        click.echo(f"fault: {fault}")
    if report.fault_count > len(report.faults):
        click.echo(f"fault: ... and {report.fault_count - len(report.faults):,} more")
    if not report.ok:
        raise _UserError(report.summary())
    click.echo(report.summary())


cli.add_command(doctor_command)  # packer doctor: packer/doctor_cli.py


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="packer")


if __name__ == "__main__":  # pragma: no cover
    main()
