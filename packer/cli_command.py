"""The click command class of every ``packer`` command: an option given twice is refused, and
a peer tool's option is answered with packer's way of doing it.

click keeps the last value of a one-value option typed twice (``--size 224 ... --size 128``)
and drops the first without a word; packer's options are used or refused, so the command line
is refused, in one line, naming the option. An option of FFCV, LitData or MosaicML Streaming
that packer does not have got click's nearest name, which can mislead: ``--max-res`` was
offered ``--max-pixels``, which skips larger images where FFCV's ``max_resolution`` shrinks
them (:data:`PEER_OPTIONS`)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from readers.formats import refuse_remote
from readers.formats.base import local_path
from readers.remote import is_url

__all__ = ["OnceCommand", "PEER_OPTIONS", "escape_unencodable", "local_dataset", "dataset_or_url"]

_NO_MAX_RESOLUTION = ("packer has no max_resolution (FFCV's, which shrinks larger images): --size N --resize-mode shorter "
                      "stores the shorter side at N (shapes vary), --size N a fixed N x N; --max-pixels skips larger images instead")
#: Options of peer tools packer does not have, and what to use: (the option it applies with, or
#: ``None``; the line). The option must be the command's for the line to be said.
PEER_OPTIONS: dict[str, tuple[str | None, str]] = {
    "--max-res": ("--size", _NO_MAX_RESOLUTION),
    "--max-resolution": ("--size", _NO_MAX_RESOLUTION),
    "--compress-probability": ("--encoding", "packer has no compress_probability (FFCV's): --encoding jpeg stores every image "
                                             "as a JPEG (--quality), raw (the default) stores pixels"),
    "--jpeg-quality": ("--quality", "use --quality (with --encoding jpeg)"),
    "--num-workers": ("--workers", "use --workers (-j)"),
    "--chunk-bytes": ("--shard-bytes", "use --shard-bytes (WebDataset output; LitData's chunk_bytes)"),
    "--size-limit": ("--shard-bytes", "use --shard-bytes (WebDataset output; MosaicML Streaming's size_limit)"),
}


class OnceCommand(click.Command):
    """A :class:`click.Command` that refuses a one-value option given more than once (a
    ``multiple=True`` or counting option may repeat). Help and ``--version`` are left to click."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not ctx.resilient_parsing:
            _answer_peer_options(self, args)
            _refuse_repeats(self, ctx, args)
        return super().parse_args(ctx, args)


class _GivenTwice(click.ClickException):
    """An option refused (given twice, or a peer tool's): one line, exit 2."""

    exit_code = 2  # an option error, as packer's others (one line, no usage block)


def _answer_peer_options(command: click.Command, args: list[str]) -> None:
    """Refuse a peer tool's option (:data:`PEER_OPTIONS`) with packer's way, where it applies."""
    known = {name for param in command.params for name in getattr(param, "opts", ())}
    for arg in args:
        if arg == "--":
            return
        name = arg.split("=", 1)[0]
        if name in PEER_OPTIONS and name not in known and PEER_OPTIONS[name][0] in known:
            raise _GivenTwice(f"{name}: no such option; {PEER_OPTIONS[name][1]}")


def _refuse_repeats(command: click.Command, ctx: click.Context, args: list[str]) -> None:
    try:
        _, _, order = command.make_parser(ctx).parse_args(args=list(args))
    except click.UsageError:  # (click's own parse, next, says what is wrong)
        return
    if any(param.is_eager for param in order):  # --help, --version: answered before any value is used
        return
    seen = set()
    for param in order:
        if not isinstance(param, click.Option) or param.multiple or param.count:
            continue
        if param.name in seen:
            names = "/".join(param.opts + param.secondary_opts)
            raise _GivenTwice(f"{names} given more than once; give it once (its values would not all be used)")
        seen.add(param.name)


def escape_unencodable() -> None:
    """Print what the terminal cannot encode escaped: a name that is not UTF-8 (kept as
    ``'bad\\udcff.jpg'``, FORMATS.md) ended ``packer info`` in a UnicodeEncodeError traceback
    wherever stdout encodes strictly (an ordinary en_US.UTF-8 terminal)."""
    for stream in (sys.stdout, sys.stderr):
        if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")


def local_dataset(ctx: click.Context, _param: click.Parameter, value: str) -> Path:
    """The dataset PATH of a command that reads local paths (``packer head``, ``preview``): a
    ``file://`` URL (as ``packer convert`` takes for DST) is its local path; another URL is
    refused naming it as given, and the commands that take one."""
    refuse_remote(value, instead=f"packer {ctx.info_name} reads datasets from local paths (or file:// URLs): copy the dataset "
                                 "to a local disk first (packer info and packer verify take its URL)")
    return Path(local_path(value))


def dataset_or_url(_ctx: click.Context, _param: click.Parameter, value: str) -> Path | str:
    """The dataset PATH of ``packer info`` and ``packer verify``: a URL other than ``file://``, as
    given (a WebDataset folder or a blob there is read in place: readers/formats/remote.py); else
    a local path (a ``file://`` URL's)."""
    return value if is_url(value) else Path(local_path(value))
