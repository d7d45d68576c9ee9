"""The ``packer doctor`` command (click): options -> :func:`packer.doctor.run_doctor` -> the report.

Kept apart from :mod:`packer.doctor` so that ``packer --help`` does not import torch."""

from __future__ import annotations

import importlib
import json
import os
import shlex
from pathlib import Path

import click

from .cli_command import OnceCommand

__all__ = ["doctor"]


@click.command(cls=OnceCommand)
@click.argument("src", type=click.Path())  # as typed: a URL is refused naming it, not folded to one slash
@click.option("--step", metavar="MODULE:FUNCTION", help="Your training step, step(images, labels), imported from MODULE (the current folder is importable).")
@click.option("--step-ms", type=click.FloatRange(0), help="Without --step: cost of the built-in model-free step, ms per batch (default: 25).")
@click.option("--batch-size", type=click.IntRange(1), default=64, show_default=True)
@click.option("--size", type=click.IntRange(1), help="A folder: images resized and center-cropped to SIZE x SIZE (default: 224).")
@click.option("--workers", "-j", type=click.IntRange(0), help="A folder: DataLoader worker processes (default: all cores).")
@click.option("--device", help="Where the step runs: cpu or cuda[:N] (default: cuda when available).")
@click.option("--batches", type=click.IntRange(1), default=30, show_default=True, help="Batches per measurement, over all rounds.")
@click.option("--rounds", type=click.IntRange(1), default=3, show_default=True, help="Interleaved rounds of the measurements.")
@click.option("--sample", type=click.IntRange(1), help="A folder: images converted to a temporary blob to time the packed alternative (default: 500).")
@click.option("--trace", type=click.Path(path_type=Path, file_okay=False), help="Write a torch.profiler trace (TensorBoard / Perfetto) to this folder.")
@click.option("--plot", type=click.Path(path_type=Path, dir_okay=False), help="Draw the rates and the time split to this PNG (needs matplotlib: packer[bench]).")
@click.option("--json", "json_path", type=click.Path(path_type=Path, dir_okay=False), help="Also write the figures (and the command, date, machine) as JSON to this file.")
@click.option("--quiet", "-q", is_flag=True, help="No progress lines.")
def doctor(src: str, step: str | None, step_ms: float | None, batch_size: int, size: int | None, workers: int | None, device: str | None,
           batches: int, rounds: int, sample: int | None, trace: Path | None, plot: Path | None, json_path: Path | None, quiet: bool) -> None:
    """Is your GPU starving? Time the loader, the step and the loop; say what bounds it and what to change.

    SRC is an image folder (read the usual way: PIL in DataLoader workers; a sample is also
    converted to a blob to measure the packed alternative) or a packed dataset (readers.Loader;
    --size, --workers and --sample are refused for it).

    \b
    Examples:
      packer doctor imagenet/train --batch-size 256 --device cuda
      packer doctor train.blob --step train:step --trace prof/ --plot doctor.png
    """
    from .doctor import plot as draw, run_doctor
    from .errors import OptionError

    for option, path in (("--json", json_path), ("--plot", plot)):  # refused before measuring, not after
        folder = path.parent if path is not None else None
        if folder is not None and not folder.is_dir():
            raise OptionError(f"{option} {path}: no such folder {folder}")
        if folder is not None and not os.access(folder, os.W_OK):
            raise OptionError(f"{option} {path}: cannot write in {folder} (permission denied)")
    if trace is not None:  # made before converting the sample: a folder that cannot be made is said naming --trace
        try:
            trace.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OptionError(f"--trace {trace}: cannot create that folder ({exc.strerror or exc})") from None
    if batches < rounds:  # refused before converting the sample, in the options' own terms
        raise click.BadParameter(f"{batches} is fewer than --rounds ({rounds}): each round times at least one batch", param_hint="--batches")
    if plot is not None:  # refuse before measuring for a minute
        try:
            importlib.import_module("matplotlib")
        except ImportError:
            from readers.extras import install_hint

            raise click.ClickException(f"--plot needs matplotlib: {install_hint('bench')}") from None
    say = None if quiet else (lambda message: click.echo(message, err=True))
    report = run_doctor(src, step=step, step_ms=step_ms, batch_size=batch_size, size=size, workers=workers, device=device,
                        batches=batches, rounds=rounds, sample=sample, trace=trace, log=say)
    click.echo(str(report))
    if json_path is not None:
        record = {"command": _command_line(click.get_current_context()), **_machine(), **report.to_dict()}
        try:
            json_path.write_text(json.dumps(record, indent=2) + "\n")
        except OSError as exc:
            raise OptionError(f"--json {json_path}: {exc.strerror or exc}") from None
        click.echo(f"wrote {json_path}")
    if plot is not None:
        click.echo(f"wrote {draw(report.diagnosis, plot)}")


def _command_line(ctx: click.Context) -> str:
    """``packer doctor SRC`` and the options given on the command line (what --json records)."""
    from click.core import ParameterSource

    parts = ["packer", "doctor", str(ctx.params["src"])]
    for param in ctx.command.params:
        name = param.name or ""
        if name != "src" and ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE:
            value = ctx.params[name]
            parts += [param.opts[0]] if value is True else [param.opts[0], str(value)]
    return shlex.join(parts)


def _machine() -> dict[str, object]:
    """When and where the figures were measured."""
    import datetime
    import platform

    from .bench_report import cpu_model

    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": f"{platform.machine()} {cpu_model()}".strip(),
            "cores": len(os.sched_getaffinity(0)), "load_average": list(os.getloadavg())}
