"""``packer doctor``'s one-line refusals, found by a walkthrough: a variable-shape dataset (a
traceback from ``readers.Loader``), an unfinished conversion (said to have no images), a URL
(folded to one slash), the folder-only options given for a packed dataset (silently ignored),
``--step-ms`` with ``--step`` (ignored), and a ``--json`` file in a missing folder (found only
after the whole measurement, as a raw ``[Errno 2]``)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from packer import ImageOptions, convert
from packer.cli import cli

from cli_checks import one_line_error, varied_folder

QUICK = ["--batch-size", "4", "--batches", "2", "--rounds", "1", "--device", "cpu", "-q"]


def test_doctor_on_a_variable_shape_dataset_is_one_line(tmp_path: Path) -> None:
    dst = convert(varied_folder(tmp_path / "src"), tmp_path / "d.blob", image=ImageOptions(size=16, resize_mode="shorter"), workers=1).dst
    code, line = one_line_error(["doctor", str(dst), *QUICK])
    assert code == 1 and line.startswith(f"Error: {dst}: its images have different shapes"), line
    assert "readers.Loader, which needs one shape per dataset" in line and "--size N" in line


def test_doctor_says_an_unfinished_conversion_as_packer_info_does(lmdb_32: Path, tmp_path: Path) -> None:
    partial = tmp_path / "unf.lmdb.partial"
    shutil.copytree(lmdb_32, partial)
    code, line = one_line_error(["doctor", str(partial), *QUICK])
    assert code == 1 and line.startswith(f"Error: {partial}: an unfinished conversion") and "--resume" in line, line
    info = CliRunner().invoke(cli, ["info", str(partial)])
    assert info.exit_code == 1 and info.output.strip() == line  # the same words as packer info
    finished = tmp_path / "unf.lmdb"  # its finished name, missing while the .partial is there
    code, line = one_line_error(["doctor", str(finished), *QUICK])
    assert code == 1 and f"{finished}: does not exist; unf.lmdb.partial is an unfinished conversion" in line and "--resume" in line, line


def test_doctor_refuses_a_url_naming_it_as_given() -> None:
    code, line = one_line_error(["doctor", "https://example.invalid/x", *QUICK])
    assert code == 1 and line.startswith("Error: https://example.invalid/x: a https:// URL; packer doctor reads a local"), line


@pytest.mark.parametrize("given, named", [
    (["--size", "99"], "--size"), (["--sample", "3"], "--sample"), (["-j", "3"], "--workers"),
    (["--size", "224", "--sample", "500", "--workers", "1"], "--size, --workers, --sample"),  # the defaults too: typed, so refused
])
def test_doctor_refuses_the_folder_options_for_a_packed_dataset(packed_32, given: list[str], named: str) -> None:
    src = packed_32("blob")
    code, line = one_line_error(["doctor", str(src), *given, *QUICK])
    assert code == 2 and line == f"Error: {named}: only for an image folder; {src} is a packed blob dataset, read as it was converted", line


def test_doctor_refuses_step_ms_with_a_step(packed_32) -> None:
    code, line = one_line_error(["doctor", str(packed_32("blob")), "--step", "train:step", "--step-ms", "5", *QUICK])
    assert code == 2 and line.startswith("Error: --step-ms: ") and "only without --step" in line, line


@pytest.mark.parametrize("option", ["--json", "--plot"])
def test_doctor_checks_the_output_folder_before_measuring(packed_32, tmp_path: Path, monkeypatch, option: str) -> None:
    import packer.doctor

    monkeypatch.setattr(packer.doctor, "run_doctor", lambda *args, **kwargs: pytest.fail("measured before refusing"))
    target = tmp_path / "nonexist" / "x.out"
    code, line = one_line_error(["doctor", str(packed_32("blob")), option, str(target), *QUICK])
    assert code == 2 and line == f"Error: {option} {target}: no such folder {target.parent}", line


def test_a_folder_of_images_named_partial_is_still_read(image_folder: Path, tmp_path: Path) -> None:
    """Only a path that is no image folder is said to be an unfinished conversion."""
    src = tmp_path / "images.partial"
    shutil.copytree(image_folder, src)
    result = CliRunner().invoke(cli, ["doctor", str(src), "--size", "16", "--sample", "4", "--workers", "0", "--step-ms", "1", *QUICK])
    assert result.exit_code == 0 and result.output.startswith("diagnosis of DataLoader(PILFolder, num_workers=0)"), result.output


def test_a_trace_folder_that_cannot_be_made_names_trace_before_measuring(packed_32, tmp_path: Path) -> None:
    """``--trace /proc/x`` ended, after the whole measurement, in a raw ``[Errno 2] No such file
    or directory: '/proc/x'`` naming no option."""
    import torch

    import readers
    from readers.diagnose_loop import DiagnoseError

    blocked = tmp_path / "a-file"
    blocked.write_text("")
    code, line = one_line_error(["doctor", str(packed_32("blob")), "--trace", str(blocked / "x"), *QUICK])
    assert code == 2 and line == f"Error: --trace {blocked / 'x'}: cannot create that folder (Not a directory)", line
    steps = []
    with pytest.raises(DiagnoseError, match=r"^trace='.*a-file/x': cannot create that folder \(Not a directory\)$"):
        readers.diagnose([(torch.zeros(2, 3, 4, 4, dtype=torch.uint8), torch.zeros(2))] * 2,
                         lambda images, labels: steps.append(1), batches=1, rounds=1, device="cpu", trace=blocked / "x")
    assert steps == []  # refused before measuring
