"""``packer bench`` end to end on a tiny folder: table, recommendation, no temporary files left."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from packer.bench import Rate, measure
from packer.cli import cli
from packer.samples import make_image_folder


def test_bench_cli_prints_table_and_recommendation_and_cleans_up(tmp_path: Path) -> None:
    src = make_image_folder(tmp_path / "images", classes=2, per_class=12, size=(60, 80))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    result = CliRunner().invoke(
        cli,
        ["bench", str(src), "--sample", "20", "--size", "32", "--workers", "1", "--seconds", "0.05", "--repeats", "1",
         "--tmp-dir", str(scratch), "--quiet"],
    )
    assert result.exit_code == 0, result.output
    out = result.output
    assert "| pipeline | reader |" in out
    assert "raw folder" in out and "DataLoader(num_workers=0)" in out and "DataLoader(num_workers=1)" in out
    assert "lmdb (raw)" in out
    assert "Recommendation:" in out and "packer convert" in out and "--size 32" in out
    assert list(scratch.iterdir()) == []  # the sample links and every conversion are gone


def test_bench_cleans_up_on_interrupt(tmp_path: Path, monkeypatch) -> None:
    import packer.bench as bench

    src = make_image_folder(tmp_path / "images", classes=2, per_class=3, size=(40, 40))
    scratch = tmp_path / "scratch"
    scratch.mkdir()

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(bench, "loader_rates", interrupted)
    result = CliRunner().invoke(cli, ["bench", str(src), "--size", "16", "--tmp-dir", str(scratch), "--quiet"])
    assert result.exit_code == 130
    assert "interrupted" in result.output
    assert list(scratch.iterdir()) == []


def test_measure_reports_min_median_max() -> None:
    rate = measure(lambda: 10, repeats=3, warmup=0)
    assert isinstance(rate, Rate) and rate.runs == 3
    assert rate.min <= rate.median <= rate.max
