"""Published figures come from committed JSON: README's performance block and RESULTS.md's tables
equal what ``python -m benchmarks.render`` makes of benchmarks/results/*.json."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is a package of the repository, not installed
from benchmarks import render  # noqa: E402
from benchmarks.common import RESULTS_DIR  # noqa: E402
from benchmarks.render import SECTIONS  # noqa: E402

# What the brief calls figure-looking: a number with a rate, ratio or share unit.
FIGURE = re.compile(r"(?<![\w.-])(\d[\d,.]*(?:-\d[\d,.]*)?)(?: ?(?:img/s|images/s|GB/s|MB/s|x\b|%))")


def _numbers(text: str) -> str:
    return re.sub(r"[^\d.\-,]", "", text).strip(".,-")


def test_committed_files_equal_their_render():
    """`python -m benchmarks.render --check` passes on the committed README.md and RESULTS.md."""
    assert render.main(["--check"]) == 0


def test_a_figure_edited_by_hand_fails_the_check(tmp_path, monkeypatch, capsys):
    readme = tmp_path / "README.md"
    text = render.README.read_text()
    block = render.README_BLOCK.search(text)
    figure = FIGURE.search(block.group("body"))
    edited = text[: block.start("body") + figure.start(1)] + "9" + text[block.start("body") + figure.start(1):]
    readme.write_text(edited)
    monkeypatch.setattr(render, "README", readme)
    assert render.main(["--check"]) == 1
    assert "README.md" in capsys.readouterr().err
    assert readme.read_text() == edited  # --check changes nothing


def test_every_figure_in_the_readme_block_has_a_committed_source():
    figures = render.Figures()
    body = render.readme_block(figures)
    assert render.README_BLOCK.search(render.README.read_text()).group("body").strip() == body.strip()
    sourced = {_numbers(text) for text, _ in figures.sources}
    found = [m.group(1) for m in FIGURE.finditer(body)]
    assert found, "the block shows no figure at all"
    for number in found:
        assert _numbers(number) in sourced, f"README figure {number!r} is not one the renderer took from a JSON"
    tracked = set(subprocess.run(["git", "ls-files", "benchmarks/results"], cwd=render.HERE.parent, capture_output=True,
                                 text=True, check=True).stdout.split())
    for _, source in figures.sources:
        assert f"benchmarks/results/{source}" in tracked, f"{source} is not committed"
        data = json.loads((RESULTS_DIR / source).read_text())
        assert data["command"].split("--")[0].strip().split()[-1] in body, f"the command of {source} is not named beside it"
        assert data.get("date") and (data.get("commit") or data.get("committed_in")) and data.get("machine")


def test_results_prose_quotes_no_figure_outside_the_generated_blocks():
    text = render.BLOCK.sub("", render.RESULTS.read_text())
    text = re.sub(r"`[^`]*`", "", text)  # commands and names
    assert [m.group(0) for m in FIGURE.finditer(text)] == []


@pytest.mark.parametrize("name", sorted(set(SECTIONS) - {"targets"}))
def test_every_section_names_its_json_and_command(name):
    out = SECTIONS[name]()
    assert out.startswith("Source: `benchmarks/results/")
    assert "written by `python -m benchmarks." in out or "written by `sudo .venv/bin/python -m benchmarks." in out


def test_every_target_row_names_a_committed_json():
    rows = SECTIONS["targets"]().splitlines()[2:]
    assert rows
    for row in rows:
        name = re.search(r"`([\w.-]+\.json)`", row).group(1)
        assert (RESULTS_DIR / name).is_file(), row


def test_the_readmes_storage_table_is_rendered_from_full_json(tmp_path, monkeypatch, capsys):
    """README "Which format?": each row's size and Loader rate are full.json's own (read here
    directly), and a hand edit inside the block fails the check."""
    text = render.README.read_text()
    block = render.BLOCK.search(text[text.index("<!-- render:storage_tradeoff -->"):])
    assert block and block.group("name") == "storage_tradeoff"
    full = json.loads((RESULTS_DIR / "full.json").read_text())
    loader = {r["pipeline"]: r for r in full["read"] if r["reader"] == "readers.Loader"}
    rows = [line for line in block.group("body").splitlines() if line.startswith("| `")]
    assert len(rows) == 8
    for line in rows:
        cells = [c.strip() for c in line.strip("|").split("|")]
        r = loader[f"packer {cells[0].strip('`')} ({cells[1]})"]
        assert cells[2] == f"{r['bytes'] / full['images'] / 1e3:,.0f} KB"
        assert cells[4].startswith(f"{r['median']:,.0f} (")
    readme = tmp_path / "README.md"
    start = text.index("<!-- render:storage_tradeoff -->")
    cell = text.index(" KB |", start)
    readme.write_text(text[:cell] + "9" + text[cell:])
    monkeypatch.setattr(render, "README", readme)
    assert render.main(["--check"]) == 1
    assert "README.md" in capsys.readouterr().err


def test_a_declared_tree_commit_is_recorded_beside_gits_own(tmp_path, monkeypatch):
    """On a lent GPU machine the tree travels with another git base: PACKER_BENCH_COMMIT names the
    tree's commit in its own field; git's stamp stays what git says, and the rendered source shows both."""
    from benchmarks.common import provenance, save_json

    monkeypatch.setenv("PACKER_BENCH_COMMIT", "abc1234")
    got = provenance()
    assert got["tree_commit"] == "abc1234" and got["commit"] != "abc1234"
    monkeypatch.delenv("PACKER_BENCH_COMMIT")
    assert "tree_commit" not in provenance()
    path = save_json("declared", {"tree_commit": "abc1234", "provenance_note": "copied back"}, tmp_path)
    from benchmarks import render_sections

    monkeypatch.setattr(render_sections, "load", lambda name: json.loads(path.read_text()))
    assert "(the tree of abc1234). Note: copied back" in render_sections.source_line("declared")
