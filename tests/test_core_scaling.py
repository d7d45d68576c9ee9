"""benchmarks.core_scaling runs CI-sized on any machine: every worker count from 1 to --workers,
the work alone and each format's conversion, and each share is the conversion's rate over the
work's in the same round (issue 16, item 4)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is a package of the repository, not installed
from benchmarks import core_scaling  # noqa: E402
from benchmarks.work_units import Dropped  # noqa: E402

from packer import ImageOptions  # noqa: E402
from packer.preprocess.task import ImageTask  # noqa: E402
from packer.sources.images import scan_image_folder  # noqa: E402


def test_worker_counts_double_up_to_the_largest():
    assert core_scaling.worker_counts(1) == [1]
    assert core_scaling.worker_counts(2) == [1, 2]
    assert core_scaling.worker_counts(16) == [1, 2, 4, 8, 16]
    assert core_scaling.worker_counts(6) == [1, 2, 4, 6]


def test_the_dropped_work_is_the_conversions_work(image_folder):
    item = scan_image_folder(image_folder).items[0]
    task = ImageTask(ImageOptions(size=24))
    assert Dropped(task)(item) == len(task(item).payload) == 3 * 24 * 24


def test_a_ci_sized_run_reports_every_worker_count_and_format(tmp_path, capsys):
    core_scaling.main(["--images", "20", "--rounds", "1", "--workers", "2", "--formats", "lmdb", "blob", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "core_scaling.json").read_text())
    assert result["worker_counts"] == [1, 2] and result["images"] == 20
    assert set(result["rates"]) == {"work alone", "lmdb", "blob"}
    for fmt in ("lmdb", "blob"):
        for w in ("1", "2"):
            [alone], [rate] = result["rates"]["work alone"][w]["runs"], result["rates"][fmt][w]["runs"]
            assert alone > 0 and rate > 0
            assert result["shares"][fmt][w]["runs"] == [rate / alone]
    assert result["command"] and result["machine"]["cores"] >= 1
    assert "| workers | work alone | lmdb | blob |" in capsys.readouterr().out


def test_chosen_worker_counts_are_saved_under_the_tag(tmp_path):
    """A many-core host measures only some counts (--counts) and saves beside the VM's figures (--tag)."""
    core_scaling.main(["--images", "20", "--rounds", "1", "--counts", "2", "1", "2", "--formats", "blob", "--tag", "16cores", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "core_scaling-16cores.json").read_text())
    assert result["worker_counts"] == [1, 2] and list(result["shares"]["blob"]) == ["1", "2"]
    assert not (tmp_path / "core_scaling.json").exists()
