"""Writers, one module per format, and the name -> class registry."""

from __future__ import annotations

from readers.schema import FORMATS

from ..errors import OptionError
from .base import Writer
from .lmdb import LMDBWriter

__all__ = ["WRITERS", "get_writer", "format_for_path", "SUFFIXES"]

WRITERS: dict[str, type[Writer]] = {"lmdb": LMDBWriter}

#: Destination suffixes that select a format when ``--format`` is not given.
SUFFIXES: dict[str, str] = {".lmdb": "lmdb"}


def get_writer(name: str) -> type[Writer]:
    try:
        return WRITERS[name]
    except KeyError:
        known = ", ".join(WRITERS)
        hint = " (not implemented yet)" if name in FORMATS else ""
        raise OptionError(f"--format: unknown format {name!r}{hint} (choose from: {known})") from None


def format_for_path(path: str) -> str | None:
    """The format a destination's suffix selects, or ``None``."""
    lowered = str(path).rstrip("/").lower()
    for suffix, name in SUFFIXES.items():
        if lowered.endswith(suffix):
            return name
    return None
