"""Whole numbers and byte counts as users write them, read alike by the readers and the converter.

``--shard-bytes 64MB`` (the command), ``StorageOptions(shard_bytes="1GiB")`` and
``StreamingShards(cache_bytes="10GB")`` take the same spellings (LitData's ``chunk_bytes`` and
MosaicML Streaming's ``cache_limit`` take text too).
"""

from __future__ import annotations

import math
import operator
import re
from typing import Any

__all__ = ["as_int", "byte_count"]


def as_int(value: Any) -> int | None:
    """``value`` as an ``int`` when it is an integer (a numpy or torch one too), else ``None``
    (``True`` is an ``int`` to Python and to numpy's ``__index__``, never a size or a count)."""
    if isinstance(value, bool) or type(value).__name__ in ("bool_", "bool"):
        return None
    if hasattr(value, "ndim") and getattr(value, "ndim", 0) != 0:  # an array: no single integer
        return None
    if hasattr(value, "dtype") and "bool" in str(value.dtype):  # a 0-d boolean tensor
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


_BYTE_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
_BYTES = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?(?:e[0-9]+)?)\s*([kmgt]i?)?b?\s*", re.IGNORECASE)


def byte_count(value: Any) -> int | None:
    """A number of bytes: an integer, or text such as ``"64MB"``, ``"1.5 GB"``, ``"512KiB"``
    (decimal and binary units, LitData's ``chunk_bytes`` spelling); ``None`` if it is none."""
    whole = as_int(value)
    if whole is not None or not isinstance(value, str):
        return whole
    found = _BYTES.fullmatch(value)
    if found is None:
        return None
    amount = float(found.group(1)) * _BYTE_UNITS[(found.group(2) or "").lower()]
    return int(amount) if math.isfinite(amount) and amount == int(amount) else None  # (no fraction of a byte, no 1e400)
