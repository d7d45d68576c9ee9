"""The tests the documents cite exist: a renamed test left docs/RELIABILITY.md naming one that
no longer did (a docs walkthrough)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "RESULTS.md"]


def test_every_cited_test_file_and_test_exists():
    defined = {name for path in (ROOT / "tests").glob("*.py")
               for name in re.findall(r"^\s*def (test_\w+)", path.read_text(encoding="utf-8"), re.M)}
    missing = []
    for document in DOCUMENTS:
        text = document.read_text(encoding="utf-8")
        for file in set(re.findall(r"tests/(test_\w+\.py)", text)):
            if not (ROOT / "tests" / file).is_file():
                missing.append(f"{document.name}: tests/{file}")
        for name in set(re.findall(r"(?<![\w/.])(test_\w+)(?![\w.])", text)):
            if name not in defined:
                missing.append(f"{document.name}: {name}")
    assert not missing, missing
