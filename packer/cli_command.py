"""The click command class of every ``packer`` command: an option given twice is refused.

click keeps the last value of a one-value option typed twice (``--size 224 ... --size 128``)
and drops the first without a word; packer's options are used or refused, so the command line
is refused, in one line, naming the option."""

from __future__ import annotations

import click

__all__ = ["OnceCommand"]


class OnceCommand(click.Command):
    """A :class:`click.Command` that refuses a one-value option given more than once (a
    ``multiple=True`` or counting option may repeat). Help and ``--version`` are left to click."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not ctx.resilient_parsing:
            _refuse_repeats(self, ctx, args)
        return super().parse_args(ctx, args)


class _GivenTwice(click.ClickException):
    exit_code = 2  # an option error, as packer's others (one line, no usage block)


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
