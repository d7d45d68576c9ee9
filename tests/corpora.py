"""Small text corpora for the text tests: files written from a ``{name: text}`` table."""

from __future__ import annotations

from pathlib import Path


def write_texts(root: Path, texts: dict[str, str]) -> Path:
    """Write each ``name: text`` of ``texts`` as a UTF-8 file under ``root``; return ``root``."""
    for name, text in texts.items():
        (root / name).write_text(text, encoding="utf-8")
    return root
