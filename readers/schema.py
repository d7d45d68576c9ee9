"""The on-disk metadata record shared by every packer format.

The writer builds one :class:`Metadata`, serialises it with :meth:`Metadata.to_json` and stores
it *last* (a dataset without it is incomplete); the reader parses it with
:meth:`Metadata.from_json`, which validates the format version and every field before any
sample is touched. `docs/FORMATS.md` documents the fields; this module is the single source.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from .encodings import ENCODINGS as _ENCODING_TABLE

__all__ = [
    "FORMAT_VERSION",
    "FORMATS",
    "MAX_LABEL",
    "ENCODINGS",
    "LAYOUT",
    "KINDS",
    "TOKEN_DTYPES",
    "TOKEN_LAYOUT",
    "Metadata",
    "Skipped",
    "PackedFormatError",
    "IncompleteDatasetError",
    "UnsupportedVersionError",
]

#: Version of the on-disk layout this code writes and the newest it can read. Bump it when a
#: change would make an older reader misread a newer file.
FORMAT_VERSION = 1

#: Format names, as recorded in metadata and accepted by ``packer convert --format``.
FORMATS = ("lmdb", "hdf5", "webdataset", "blob")

#: The largest label (class index) a sample may have, in every format: LMDB's sample header
#: holds it as an int32 (docs/FORMATS.md), and a dataset converts to any format.
MAX_LABEL = 2**31 - 1

#: How image samples are stored: ``raw`` uint8 pixels, or one encoded file per sample. The
#: names of the one encoding table, ``readers/encodings.py`` (extension, decoder, ...).
ENCODINGS: tuple[str, ...] = tuple(_ENCODING_TABLE)

#: Pixel order of raw samples: planar (channels, height, width). See docs/FORMATS.md, "Layout".
LAYOUT = "CHW"

#: What a dataset holds: images (uint8 CHW pixels) or text (token ids, see docs/FORMATS.md).
KINDS = ("image", "text")

#: Token id dtypes of a text dataset: uint16 when the vocabulary fits, else uint32.
TOKEN_DTYPES = ("uint16", "uint32")

#: Layout of a text dataset: documents of token ids, in one flat stream or one record each.
TOKEN_LAYOUT = "tokens"

#: Per-sample checksum algorithms a dataset may record ("" = none recorded).
CHECKSUMS = ("", "crc32")


class PackedFormatError(ValueError):
    """A packed dataset cannot be read: its metadata is missing, corrupt or unsupported."""


class IncompleteDatasetError(PackedFormatError):
    """The dataset has no metadata record: the conversion did not finish."""


class DatasetReplacedError(PackedFormatError):
    """The dataset was replaced (a conversion's ``--overwrite``) after this reader opened it: a
    reader reads one dataset, never two mixed."""


class UnsupportedVersionError(PackedFormatError):
    """The dataset was written with a newer format version than this reader understands."""


@dataclass(frozen=True)
class Skipped:
    """An input the conversion did not write, and why."""

    path: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"path": self.path, "reason": self.reason}


@dataclass(frozen=True)
class Metadata:
    """Everything a reader needs to know about a packed dataset, and how it was made.

    ``shape`` is ``(channels, height, width)`` when every sample has that shape, ``None`` when
    shapes vary (``resize_mode`` ``shorter`` or ``none``); per-sample shapes then live in the
    format's own sample records.
    """

    format: str
    count: int
    channels: int
    shape: tuple[int, int, int] | None
    encoding: str = "raw"
    classes: tuple[str, ...] = ()
    labeled: bool = True
    kind: str = "image"
    dtype: str = "uint8"
    layout: str = LAYOUT
    preprocessing: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""
    skipped: tuple[Skipped, ...] = ()
    tool_version: str = ""
    created: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)
    #: Per-sample checksum algorithm (``"crc32"``, see ``readers/checksums.py``), "" for none.
    checksum: str = ""
    #: SHA-256 (hex) of the per-sample checksums as stored, little-endian uint32 in sample order
    #: ("" in datasets written before it, or without checksums): the same samples, labels and
    #: order give the same value whichever conversion wrote them, in any format. What a reader's
    #: resume state names its dataset by (``readers/epoch.py``).
    checksums_sha256: str = ""
    #: Text datasets: the tokenizer's identity (kind, vocab_size, eos_id, sha256, name).
    tokenizer: Mapping[str, Any] = field(default_factory=dict)
    #: Text datasets: total stored tokens (EOS separators included).
    tokens: int = 0
    format_version: int = FORMAT_VERSION
    tool: str = "packer"

    def __post_init__(self) -> None:
        _check(self.format in FORMATS, f"unknown format {self.format!r} (known: {', '.join(FORMATS)})")
        _check(self.kind in KINDS, f"unknown kind {self.kind!r}")
        _check(self.encoding in ENCODINGS, f"unknown encoding {self.encoding!r} (known: {', '.join(ENCODINGS)})")
        _check(_is_int(self.count) and self.count >= 0, f"count must be a non-negative integer, got {self.count!r}")
        _check(self.checksum in CHECKSUMS, f"unknown checksum {self.checksum!r} (known: {', '.join(CHECKSUMS[1:])})")
        _check(self.checksums_sha256 == "" or (isinstance(self.checksums_sha256, str) and len(self.checksums_sha256) == 64
                                                and all(c in "0123456789abcdef" for c in self.checksums_sha256)),
               f"checksums_sha256 must be 64 lowercase hex digits or empty, got {self.checksums_sha256!r}")
        if self.kind == "text":
            self._check_text()
            return
        _check(self.channels in (1, 3), f"channels must be 1 or 3, got {self.channels!r}")
        _check(self.dtype == "uint8", f"dtype must be 'uint8', got {self.dtype!r}")
        _check(self.layout == LAYOUT, f"layout must be {LAYOUT!r}, got {self.layout!r}")
        if self.shape is not None:
            _check(
                len(self.shape) == 3 and all(_is_int(d) and d > 0 for d in self.shape),
                f"shape must be three positive integers (C, H, W), got {self.shape!r}",
            )
            _check(self.shape[0] == self.channels, f"shape {self.shape} disagrees with channels={self.channels}")
        _check(all(isinstance(c, str) for c in self.classes), "classes must be strings")
        _check(self.labeled or not self.classes, "an unlabeled dataset cannot have classes")

    def _check_text(self) -> None:
        """A text dataset: token ids of a recorded tokenizer, one document per sample."""
        _check(self.dtype in TOKEN_DTYPES, f"text dtype must be one of {', '.join(TOKEN_DTYPES)}, got {self.dtype!r}")
        _check(self.layout == TOKEN_LAYOUT, f"text layout must be {TOKEN_LAYOUT!r}, got {self.layout!r}")
        _check(self.shape is None and self.encoding == "raw", "a text dataset has no fixed shape and raw encoding")
        _check(not self.classes and not self.labeled, "a text dataset has no classes")
        _check(_is_int(self.tokens) and self.tokens >= 0, f"tokens must be a non-negative integer, got {self.tokens!r}")
        vocab = self.tokenizer.get("vocab_size")
        _check(_is_int(vocab) and vocab > 0, f"tokenizer record needs a positive vocab_size, got {vocab!r}")
        limit = 1 << (16 if self.dtype == "uint16" else 32)
        _check(vocab <= limit, f"vocab_size {vocab} does not fit dtype {self.dtype}")
        _check(self.checksum in CHECKSUMS, f"unknown checksum {self.checksum!r} (known: {', '.join(CHECKSUMS[1:])})")

    # -- derived -------------------------------------------------------------------------
    @property
    def fixed_shape(self) -> bool:
        """True when every sample has :attr:`shape`, so batches stack into one array."""
        return self.shape is not None

    @property
    def sample_nbytes(self) -> int | None:
        """Bytes of one raw sample when shapes are fixed, else ``None``."""
        return math.prod(self.shape) if self.shape is not None else None

    # -- serialisation ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["shape"] = list(self.shape) if self.shape is not None else None
        out["classes"] = list(self.classes)
        out["skipped"] = [s.to_dict() for s in self.skipped]
        out["preprocessing"] = dict(self.preprocessing)
        out["extra"] = dict(self.extra)
        out["tokenizer"] = dict(self.tokenizer)
        return out

    def to_json(self) -> str:
        """UTF-8-safe JSON (non-ASCII and undecodable file names are escaped)."""
        return json.dumps(self.to_dict(), indent=1, sort_keys=True, ensure_ascii=True)

    @classmethod
    def from_dict(cls, data: Any, *, where: str = "dataset") -> "Metadata":
        """Validate and build from a parsed record; errors name ``where`` and what is wrong."""
        if not isinstance(data, dict):
            raise PackedFormatError(f"{where}: metadata is not a JSON object")
        if data.get("tool") != "packer":
            raise PackedFormatError(f"{where}: not a packer dataset (metadata has no tool='packer')")
        version = data.get("format_version")
        if not _is_int(version):
            raise PackedFormatError(f"{where}: metadata has no integer format_version")
        if version > FORMAT_VERSION:
            raise UnsupportedVersionError(
                f"{where} uses packer format version {version}, but this reader understands up to "
                f"version {FORMAT_VERSION}: update packer (git pull in its checkout, then pip install -e .)"
            )
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in names}
        missing = [f.name for f in dataclasses.fields(cls) if f.name not in kwargs and f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING]
        if missing:  # (said by name: the constructor's TypeError names Python's internals)
            raise PackedFormatError(f"{where}: invalid metadata: no {', '.join(missing)}")
        try:
            shape = kwargs.get("shape")
            kwargs["shape"] = tuple(shape) if shape is not None else None
            kwargs["classes"] = tuple(kwargs.get("classes", ()))
            kwargs["skipped"] = tuple(Skipped(str(s["path"]), str(s["reason"])) for s in kwargs.get("skipped", ()))
            return cls(**kwargs)
        except PackedFormatError as exc:
            raise PackedFormatError(f"{where}: invalid metadata: {exc}") from None
        except (TypeError, KeyError, ValueError) as exc:
            raise PackedFormatError(f"{where}: invalid metadata: {exc}") from None

    @classmethod
    def from_json(cls, text: str | bytes, *, where: str = "dataset") -> "Metadata":
        try:
            data = json.loads(text)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise PackedFormatError(f"{where}: metadata is not valid JSON ({exc})") from None
        return cls.from_dict(data, where=where)

    def expect_format(self, fmt: str, *, where: str) -> "Metadata":
        """Return self, or raise if this record describes another format."""
        if self.format != fmt:
            raise PackedFormatError(f"{where}: metadata says format {self.format!r}, expected {fmt!r}")
        return self


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise PackedFormatError(message)
