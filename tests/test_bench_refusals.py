"""``packer bench``'s one-line refusals and its report's first line, found by a walkthrough: an
unfinished conversion (said to have no images), a URL (folded to one slash), a missing
``--tmp-dir`` (a raw ``[Errno 2]``), the ``readers.Loader`` row of variable-shape images (a raw
exception), the machine and settings the figures were taken with (not said), and torch's
"not writable" warning (printed even with ``-q``)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import torch
from click.testing import CliRunner
from PIL import Image

from packer import ImageOptions
from packer.bench_report import cpu_model
from packer.bench_timing import FolderDataset
from packer.cli import cli
from packer.parallel import default_workers

from cli_checks import one_line_error, varied_folder

QUICK = ["--sample", "8", "-f", "blob", "--seconds", "0.05", "--repeats", "1", "-j", "1", "-q"]


def test_bench_says_an_unfinished_conversion_as_packer_info_does(lmdb_32: Path, tmp_path: Path) -> None:
    partial = tmp_path / "unf.lmdb.partial"
    shutil.copytree(lmdb_32, partial)
    code, line = one_line_error(["bench", str(partial), *QUICK])
    assert code == 1 and line.startswith(f"Error: {partial}: an unfinished conversion") and "--resume" in line, line


def test_bench_refuses_a_url_naming_it_as_given() -> None:
    code, line = one_line_error(["bench", "https://example.invalid/x", *QUICK])
    assert code == 1 and line.startswith("Error: https://example.invalid/x: a https:// URL; packer bench reads a local folder"), line


def test_bench_names_a_missing_tmp_dir(image_folder: Path, tmp_path: Path) -> None:
    missing = tmp_path / "nonexist"
    code, line = one_line_error(["bench", str(image_folder), "--size", "16", "--tmp-dir", str(missing), *QUICK])
    assert code == 2 and line == f"Error: --tmp-dir {missing}: no such folder", line
    assert not missing.exists()


def test_bench_says_the_machine_and_settings_and_why_the_loader_row_is_empty(tmp_path: Path) -> None:
    """No --size: the sample keeps its images' shapes, which readers.Loader cannot batch; its row
    said "failed (ValueError: ...)"."""
    result = CliRunner().invoke(cli, ["bench", str(varied_folder(tmp_path / "src")), "--batch-size", "4", *QUICK])
    assert result.exit_code == 0, result.output
    first = result.output.splitlines()[0]
    assert first.startswith(f"Measured on {cpu_model()}, {default_workers():,} usable cores; 8 sampled images, batch size 4, "), first
    assert "num_workers 0 and 1" in first and "1 timed pass(es) of at least 0.05 s" in first, first
    (row,) = [line for line in result.output.splitlines() if line.startswith("| blob (raw) | readers.Loader |")]
    assert "not measured: readers.Loader needs one shape per dataset; these images have variable shapes" in row, row
    assert "Error" not in row and "failed" not in row, row


def test_the_folder_baseline_gives_torch_writable_pixels(tmp_path: Path, monkeypatch) -> None:
    """torch warned "The given NumPy array is not writable" (twice, -q or not) on a decoder's
    read-only view: it gets a writable array."""
    src = varied_folder(tmp_path / "src")
    handed: list[bool] = []
    real = torch.from_numpy
    monkeypatch.setattr(torch, "from_numpy", lambda array: handed.append(array.flags.writeable) or real(array))
    image, label = FolderDataset([(str(src / "a" / "0.png"), 3)], ImageOptions())[0]
    assert handed == [True] and label == 3 and tuple(image.shape) == (3, 30, 20)
    assert np.array_equal(image.permute(1, 2, 0).numpy(), np.asarray(Image.open(src / "a" / "0.png").convert("RGB")))


def test_a_blob_the_machine_cannot_hold_is_not_recommended(tmp_path):
    """bench recommended the RAM blob from a 100-image sample (15 MB) with no word of the whole
    folder, whose blob would be larger than the machine's memory (an FFCV user's walkthrough).
    The size is projected from the sample; a blob over half the memory gives way to the next
    fastest, saying why; one that fits is recommended with its projected size."""
    from packer import ImageOptions
    from packer.bench_report import BenchReport, BenchRow
    from packer.bench_timing import Rate

    def report(memory: int) -> BenchReport:
        made = BenchReport(tmp_path / "imagenet", 100, ImageOptions(size=224), 2, 64, folder_images=1_000_000, memory=memory)
        made.rows = [BenchRow("raw folder", "DataLoader(num_workers=2)", Rate(400, 415, 420, 3)),
                     BenchRow("blob (raw)", "Loader", Rate(9000, 9500, 9900, 3), 15_100_000, 800.0),
                     BenchRow("lmdb (raw)", "Loader", Rate(5000, 5200, 5400, 3), 16_000_000, 700.0)]
        return made

    small = report(64 * 10**9).recommendation()
    assert small.startswith("Not blob (raw), though fastest here: read from RAM whole, it would take about 151.0 GB for the "
                            "folder's 1,000,000 images, over 50% of this machine's 64.0 GB of memory (where it fits, convert with -f blob).\n"
                            "Recommendation: lmdb (raw) read with Loader: 5,200 images/s"), small
    assert "16.0 MB for 100 images, 160 KB per image; about 160.0 GB for the folder's 1,000,000." in small
    big = report(512 * 10**9).recommendation()
    assert big.startswith("Recommendation: blob (raw) read with Loader: 9,500 images/s") and "about 151.0 GB for the folder's 1,000,000" in big
    unknown = BenchReport(tmp_path / "x", 100, ImageOptions(size=224), 2, 64, folder_images=100, memory=None)
    unknown.rows = report(1).rows
    assert unknown.recommendation().startswith("Recommendation: blob (raw)") and "for the folder's" not in unknown.recommendation()


def test_a_recommendation_of_images_of_varying_shape_says_how_a_dataloader_reads_them(tmp_path):
    """--resize-mode shorter: bench recommended "read with DataLoader(num_workers=0)", and a plain
    DataLoader then failed "stack expects each tensor to be equal size" (bench used a collate_fn)."""
    from packer import ImageOptions
    from packer.bench_report import BenchReport, BenchRow
    from packer.bench_timing import Rate

    made = BenchReport(tmp_path / "x", 10, ImageOptions(size=64, resize_mode="shorter"), 2, 8, folder_images=10)
    made.rows = [BenchRow("lmdb (raw)", "DataLoader(num_workers=0)", Rate(900, 1000, 1100, 3), 1_000_000, 500.0)]
    assert ("its images vary in shape, so the DataLoader needs a collate_fn that keeps them as a list, as here "
            "(packer.bench_timing.collate), or a fixed --size for readers.Loader.") in made.recommendation()
    made.image = ImageOptions(size=64)
    assert "collate_fn" not in made.recommendation()


def test_a_format_given_twice_is_timed_once_in_the_order_first_given(image_folder: Path, tmp_path: Path) -> None:
    """``-f lmdb -f blob -f lmdb`` converted lmdb twice into one scratch path: a row "failed to
    convert (OutputExistsError: .../data.lmdb: already exists ...)"."""
    quick = [arg for arg in QUICK if arg not in ("-f", "blob")]
    result = CliRunner().invoke(cli, ["bench", str(image_folder), "--size", "16", "-f", "lmdb", "-f", "blob", "-f", "lmdb",
                                      "--tmp-dir", str(tmp_path), *quick])
    assert result.exit_code == 0, result.output
    assert "failed" not in result.output and "already exists" not in result.output, result.output
    pipelines = [line.split("|")[1].strip() for line in result.output.splitlines() if line.startswith("| ") and "(raw)" in line]
    assert list(dict.fromkeys(pipelines)) == ["lmdb (raw)", "blob (raw)"], result.output
    assert list(tmp_path.iterdir()) == []
