"""Per-sample source names: which input each sample was converted from.

Every format stores, beside its per-sample checksums, one name per sample in index order: the
input's path relative to the converted source (as the metadata's ``skipped`` list records its
paths), an archive member's name, ``dataset[i]`` for a Python dataset, a text document's
source. The names are one UTF-8 JSON array of strings, ASCII-escaped like the metadata record
(file names that are not valid UTF-8 keep their ``\\udcXX`` escapes), so the plain library and
``json.loads`` read them. Where each format keeps them: docs/FORMATS.md, *Source names*.

Datasets written before names were recorded have none: :meth:`Store.source_names` is then
``None`` (and ``packer verify --source`` matches samples by content instead).
"""

from __future__ import annotations

import json
from typing import Iterable

from ..schema import PackedFormatError

__all__ = ["EncodedNames", "decode_source_names"]


class EncodedNames:
    """Names appended one at a time and held in their stored form (the JSON array's body, ASCII
    bytes): a writer of millions of samples keeps about the names' own bytes, not a Python
    string per name (several times that)."""

    def __init__(self, names: Iterable[str] = ()) -> None:
        self._body = bytearray()
        self._count = 0
        for name in names:
            self.append(name)

    def append(self, name: str) -> None:
        if self._count:
            self._body += b","
        self._body += json.dumps(name, ensure_ascii=True).encode("ascii")
        self._count += 1

    def __len__(self) -> int:
        return self._count

    def to_bytes(self) -> bytes:
        """The stored form: a JSON array of strings, ASCII bytes."""
        return b"[" + bytes(self._body) + b"]"


def decode_source_names(raw: bytes | bytearray | memoryview, count: int, *, where: str) -> list[str]:
    """Parse stored names, checking they are ``count`` strings; errors name ``where``."""
    try:
        names = json.loads(bytes(raw))
    except (UnicodeDecodeError, ValueError) as exc:
        raise PackedFormatError(f"{where}: the source names are not a JSON array ({exc})") from None
    if not isinstance(names, list) or len(names) != count or not all(isinstance(n, str) for n in names):
        got = f"{len(names)} entries" if isinstance(names, list) else type(names).__name__
        raise PackedFormatError(f"{where}: the source names are {got}, expected {count} strings (one per sample)")
    return names
