"""Shared by the tests of packer's inspection commands (bench, doctor): a command's one-line
refusal, and a folder of images of several shapes."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner
from PIL import Image

from packer.cli import cli


def one_line_error(args: list[str]) -> tuple[int, str]:
    """Run ``packer ARGS``; its exit code and its one output line (asserted to be one, no traceback)."""
    result = CliRunner().invoke(cli, args)
    lines = result.output.strip().splitlines()
    assert result.exit_code in (1, 2) and len(lines) == 1 and "Traceback" not in result.output, (result.exit_code, result.output)
    assert lines[0].startswith("Error: "), result.output
    return result.exit_code, lines[0]


def varied_folder(root: Path) -> Path:
    """Two classes of PNGs of different shapes and aspect ratios (packed without a fixed --size,
    or with ``--resize-mode shorter``, their shapes stay different)."""
    for label in ("a", "b"):
        (root / label).mkdir(parents=True)
        for i, (w, h) in enumerate([(20, 30), (30, 20), (24, 24), (40, 18)]):
            Image.new("RGB", (w, h), (i * 40, 90, 160)).save(root / label / f"{i}.png")
    return root
