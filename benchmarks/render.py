"""Render benchmarks/RESULTS.md's tables (and docs/RELIABILITY.md's) and the README's performance block from the committed JSON.

    python -m benchmarks.render            # rewrite the generated blocks in place
    python -m benchmarks.render --check    # exit 1 when README.md or RESULTS.md differ from the JSON

RESULTS.md keeps its prose; each ``<!-- render:NAME -->`` ... ``<!-- /render:NAME -->`` block is
replaced by ``render_sections.SECTIONS[NAME]()`` (a table with its source line: file, command,
machine, date, commit). README.md's ``<!-- results:begin -->`` ... ``<!-- results:end -->`` block
is :func:`readme_block`. Edit the JSON (by rerunning its command), never the blocks.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from dataclasses import dataclass, field

from .common import HERE, run_main
from .render_sections import SECTIONS as _TABLES
from .render_sections import load
from .render_targets import targets

#: Block name -> its renderer: the tables, and the targets table computed from them.
SECTIONS = {**_TABLES, "targets": targets}

__all__ = ["README", "RESULTS", "BLOCK_FILES", "Figures", "readme_block", "render_results", "render_readme", "main"]

README = HERE.parent / "README.md"
RESULTS = HERE / "RESULTS.md"
#: Files whose ``<!-- render:NAME -->`` blocks are generated (README.md has its own block).
BLOCK_FILES = [RESULTS, HERE.parent / "docs" / "RELIABILITY.md"]
BLOCK = re.compile(r"(<!-- render:(?P<name>[\w.-]+) -->\n)(?P<body>.*?)(<!-- /render:(?P=name) -->)", re.S)
README_BLOCK = re.compile(r"(<!-- results:begin[^>]*-->\n)(?P<body>.*?)(<!-- results:end -->)", re.S)
TUTORIAL = "raw folder, tutorial (float on CPU)"
TRICKS = "raw folder, best tricks (uint8)"


@dataclass
class Figures:
    """Each figure printed in the README block, with the JSON it comes from (checked by tests)."""

    sources: list[tuple[str, str]] = field(default_factory=list)

    def __call__(self, text: str, source: str) -> str:
        self.sources.append((text, source))
        return text


def _span(values: list[float], digits: int = 1, unit: str = "x") -> str:
    lo, hi = min(values), max(values)
    return f"{lo:,.{digits}f}{unit}" if f"{lo:.{digits}f}" == f"{hi:.{digits}f}" else f"{lo:,.{digits}f}-{hi:,.{digits}f}{unit}"


def _best(rows: list[dict], pipeline: str, loader: bool) -> float | None:
    """The best median of one pipeline, through readers.Loader or through a DataLoader setting."""
    rates = [r["median"] for r in rows if r["pipeline"] == pipeline and "median" in r and (r["reader"] == "readers.Loader") == loader]
    return max(rates) if rates else None


def readme_block(figures: Figures | None = None) -> str:
    """The README's performance paragraph, every figure from benchmarks/results/*.json."""
    fig = figures if figures is not None else Figures()
    full = load("full")
    reads = full["read"]
    tutorial, tricks = _best(reads, TUTORIAL, False), _best(reads, TRICKS, False)
    packed = sorted({r["pipeline"] for r in reads if r["pipeline"].startswith("packer ")})

    def ratios(encoding: str, loader: bool, base: float) -> list[float]:
        return [b / base for p in packed if p.endswith(f"({encoding})") and (b := _best(reads, p, loader))]

    lmdb_dl, lmdb_loader = _best(reads, "packer lmdb (raw)", False), _best(reads, "packer lmdb (raw)", True)
    src_full = "full.json"
    lines = [
        f"On a {full['machine']['cores']}-core {full['machine']['cpu']} development machine (no GPU), with **raw 224x224 pixels** stored, reading the LMDB through a plain",
        f"`DataLoader` is **{fig(f'{lmdb_dl / tutorial:.1f}x', src_full)}** the usual per-file pipeline at its best setting (PIL decode,",
        f"`Resize(256)` + `CenterCrop(224)` and float normalisation on the CPU: {fig(f'{tutorial:,.0f}', src_full)} images/s), and",
        f"**{fig(f'{lmdb_loader / tutorial:.1f}x', src_full)}** through `readers.Loader` ({fig(f'{lmdb_loader:,.0f}', src_full)} images/s). Raw pixels in every",
        f"format: {fig(_span(ratios('raw', False, tutorial)), src_full)} through a `DataLoader`, {fig(_span(ratios('raw', True, tutorial)), src_full)} through `Loader`.",
        f"**Stored as JPEG** (q90, each read decodes again): {fig(_span(ratios('jpeg', False, tutorial)), src_full)} through a `DataLoader`,",
        f"{fig(_span(ratios('jpeg', True, tutorial)), src_full)} through `Loader`. Against a careful per-file pipeline (uint8 out, reduced",
        f"JPEG decode: {fig(f'{tricks:,.0f}', src_full)} images/s) raw pixels are {fig(_span(ratios('raw', False, tricks) + ratios('raw', True, tricks)), src_full)}",
        f"and JPEG {fig(_span(ratios('jpeg', False, tricks) + ratios('jpeg', True, tricks)), src_full)}",
        f"(`benchmarks/results/full.json`, `python -m benchmarks.run`, {full['date']}).",
    ]
    try:
        conv = load("convert_rates")
    except FileNotFoundError:
        conv = None
    if conv is not None:
        cores = conv["cores"]
        packer = [r["rate"]["median"] for r in conv["rows"] if r["tool"].startswith("packer") and r["workers"] == cores]
        naive = next(r["rate"]["median"] for r in conv["rows"] if r["tool"].startswith("naive"))
        src = "convert_rates.json"
        lines += [
            f"Conversion to raw 224x224 with {cores} workers (a {cores}-core {conv['machine']['cpu']} machine) runs at "
            f"{fig(_span(packer, 0, ''), src)} images/s across the formats, against",
            f"{fig(f'{naive:,.0f}', src)} images/s for a plain PIL loop writing LMDB in the same run"
            + (", on the machine shared with other work" if conv.get("note") else ""),
            f"(`benchmarks/results/convert_rates.json`, `python -m benchmarks.convert_rates`, {conv['date']}).",
        ]
    runs = [load("gpu"), load("gpu-run1")]
    gather = [r["delivery_gb_per_s"]["Loader blob, GPU gather"]["median"] for r in runs]
    share = [r["delivery_gb_per_s"]["Loader blob, GPU gather"]["median"] / r["copy_gb_per_s"]["pinned"]["median"] for r in runs]
    step = [v["median"] / r["resnet50_img_per_s"]["batch already on the GPU"]["median"]
            for r in runs for k, v in r["resnet50_img_per_s"].items() if k.startswith("Loader")]
    src = "gpu.json"
    lines += [
        f"On one {runs[0]['machine']['gpu']} ({runs[0]['machine']['cores']} vCPUs, two runs on {runs[0]['date']}), `Loader` feeds a ResNet-50 bf16",
        f"training step at {fig(_span([100 * s for s in step], 1, '%'), src)} of its speed on data already on the GPU (blob, LMDB, HDF5;",
        f"a rate above the resident step's is its own noise), and gathers a RAM blob onto the card at {fig(_span([g / 1e9 for g in gather], 1, ' GB/s'), src)}",
        f"({fig(_span([100 * s for s in share], 0, '%'), src)} of a pinned copy) (`benchmarks/results/gpu.json`, `gpu-run1.json`, `python -m benchmarks.gpu`).",
        "Every table, the targets we missed and why: [benchmarks/RESULTS.md](benchmarks/RESULTS.md).",
    ]
    return "\n".join(lines)


def render_results(text: str) -> str:
    """A file (RESULTS.md, docs/RELIABILITY.md) with every render block regenerated."""
    names = [m.group("name") for m in BLOCK.finditer(text)]
    unknown = sorted(set(names) - set(SECTIONS))
    if unknown:
        raise SystemExit(f"unknown render block(s) {', '.join(unknown)}; known: {', '.join(SECTIONS)}")
    return BLOCK.sub(lambda m: m.group(1) + SECTIONS[m.group("name")]() + "\n" + m.group(4), text)


def render_readme(text: str) -> str:
    """README.md with its performance block and its ``<!-- render:NAME -->`` blocks regenerated."""
    if not README_BLOCK.search(text):
        raise SystemExit("README.md: no <!-- results:begin --> ... <!-- results:end --> block")
    text = render_results(text)
    return README_BLOCK.sub(lambda m: m.group(1) + readme_block() + "\n" + m.group(3), text, count=1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when a file differs from what the JSON renders")
    args = parser.parse_args(argv)
    stale = []
    for path, render in [(path, render_results) for path in BLOCK_FILES] + [(README, render_readme)]:
        old = path.read_text()
        new = render(old)
        if new == old:
            continue
        if args.check:
            stale.append(path)
            diff = difflib.unified_diff(old.splitlines(), new.splitlines(), f"{path.name} (as committed)", f"{path.name} (rendered)", lineterm="", n=0)
            print("\n".join(list(diff)[:40]), file=sys.stderr)
        else:
            path.write_text(new)
            print(f"rewrote {path.relative_to(HERE.parent)}")
    if stale:
        print(f"out of date with benchmarks/results/*.json: {', '.join(p.name for p in stale)}; run: python -m benchmarks.render", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    run_main(main)
