"""The ``packer`` command line: parse, call the Python API, render. Nothing else lives here.

User mistakes (a missing folder, an existing output, a bad option, a damaged dataset) print a
single ``Error: ...`` line on stderr and exit non-zero, without a traceback.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click

from readers.schema import ENCODINGS, PackedFormatError

from . import api
from ._version import __version__
from .errors import PackerError
from .info import describe, read_metadata
from .options import COMPRESSIONS, DEFAULT_MAX_PIXELS, ON_ERROR, ImageOptions, StorageOptions
from .preprocess.geometry import RESIZE_MODES
from .writers import WRITERS

__all__ = ["cli", "main"]

MAX_WARNINGS = 20
EXIT_INTERRUPTED = 130


class _UserError(click.ClickException):
    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class _Group(click.Group):
    """Turns packer's user-facing exceptions into one-line errors."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except PackerError as exc:
            raise _UserError(str(exc), exc.exit_code) from None
        except (PackedFormatError, FileNotFoundError) as exc:
            raise _UserError(str(exc)) from None


class _WarningPrinter(logging.Handler):
    """Prints packer's warnings above the progress bar, at most ``limit`` of them."""

    def __init__(self, limit: int) -> None:
        super().__init__(logging.WARNING)
        self.limit = limit
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1
        if self.count <= self.limit:
            from tqdm import tqdm

            tqdm.write(f"warning: {record.getMessage()}", file=sys.stderr)

    def close(self) -> None:
        if self.count > self.limit:
            click.echo(f"warning: ... and {self.count - self.limit:,} more warnings", err=True)
        super().close()


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="packer")
def cli() -> None:
    """Convert datasets once, offline, into formats PyTorch reads at memory speed.

    \b
    Example:
      packer convert imagenet/train train.lmdb --size 224
      packer info train.lmdb
    """


@cli.command()
@click.argument("src", type=click.Path(path_type=Path))
@click.argument("dst", type=click.Path(path_type=Path))
@click.option("--format", "-f", "format_name", type=click.Choice(sorted(WRITERS)), help="Output format (default: from DST's suffix: .lmdb, .h5/.hdf5, .blob).")
@click.option("--size", "-s", metavar="N|HxW", help="Output size: N (square) or HEIGHTxWIDTH.")
@click.option("--resize-mode", type=click.Choice(list(RESIZE_MODES)), help="center-crop (default with --size), pad, stretch, shorter (shorter side to N), none (default without --size).")
@click.option("--grayscale", is_flag=True, help="Store one channel.")
@click.option("--encoding", type=click.Choice(ENCODINGS), default="raw", show_default=True, help="raw uint8 pixels, or jpeg/png files.")
@click.option("--quality", type=click.IntRange(1, 100), default=90, show_default=True, help="JPEG quality (with --encoding jpeg).")
@click.option("--max-pixels", type=click.IntRange(1), default=DEFAULT_MAX_PIXELS, show_default=True, help="Skip images with more pixels.")
@click.option("--workers", "-j", type=click.IntRange(1), help="Worker processes (default: all cores).")
@click.option("--on-error", type=click.Choice(ON_ERROR), default="skip", show_default=True, help="Skip and record undecodable inputs, or stop at the first.")
@click.option("--compression", type=click.Choice(COMPRESSIONS), help="HDF5 only: lossless compression filter (default: none).")
@click.option("--shard-size", type=click.IntRange(1), help="WebDataset only: samples per shard.")
@click.option("--shard-bytes", type=click.IntRange(1), help="WebDataset only: payload bytes per shard (at most).")
@click.option("--overwrite", is_flag=True, help="Replace DST if it exists.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar or warnings.")
def convert(
    src: Path,
    dst: Path,
    format_name: str | None,
    size: str | None,
    resize_mode: str | None,
    grayscale: bool,
    encoding: str,
    quality: int,
    max_pixels: int,
    workers: int | None,
    on_error: str,
    compression: str | None,
    shard_size: int | None,
    shard_bytes: int | None,
    overwrite: bool,
    quiet: bool,
) -> None:
    """Convert the image folder SRC (class sub-folders = labels) into DST.

    \b
    Examples:
      packer convert imagenet/train train.lmdb --size 224
      packer convert faces/ faces.lmdb --size 112x96 --resize-mode pad --grayscale
      packer convert photos/ photos.lmdb --size 256 --resize-mode shorter --encoding jpeg
    """
    image = ImageOptions(
        size=size, resize_mode=resize_mode, grayscale=grayscale, encoding=encoding, quality=quality, max_pixels=max_pixels
    )
    storage = StorageOptions(compression=compression, shard_size=shard_size, shard_bytes=shard_bytes)
    printer = _WarningPrinter(0 if quiet else MAX_WARNINGS)
    logger = logging.getLogger("packer")
    logger.addHandler(printer)
    logger.propagate = False
    try:
        report = api.convert(
            src, dst, format=format_name, image=image, storage=storage, workers=workers, overwrite=overwrite, on_error=on_error, progress=not quiet
        )
    except KeyboardInterrupt:
        raise _UserError(f"interrupted; nothing was written to {dst}", EXIT_INTERRUPTED) from None
    finally:
        logger.removeHandler(printer)
        logger.propagate = True
        printer.close()
    click.echo(report.summary())


@cli.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the metadata as JSON.")
def info(path: Path, as_json: bool) -> None:
    """Show what a packed dataset holds and how it was made.

    \b
    Example:
      packer info train.lmdb
    """
    click.echo(describe(path, read_metadata(path), as_json=as_json))


@cli.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--output", "-o", type=click.Path(path_type=Path), default=Path("preview.png"), show_default=True, help="Image file to write (.png or .jpg).")
@click.option("--count", "-n", type=click.IntRange(1, 1024), default=16, show_default=True, help="Number of random samples.")
@click.option("--seed", type=int, default=0, show_default=True, help="Which random samples.")
@click.option("--tile", type=click.IntRange(16, 1024), default=128, show_default=True, help="Cell size in pixels.")
def preview(path: Path, output: Path, count: int, seed: int, tile: int) -> None:
    """Save a contact sheet of random samples, captioned with index and class.

    \b
    Example:
      packer preview train.lmdb -o grid.png --count 25
    """
    from .preview import preview as make_preview

    click.echo(f"wrote {make_preview(path, output, count=count, seed=seed, tile=tile)}")


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="packer")


if __name__ == "__main__":  # pragma: no cover
    main()
