"""Conversion options as frozen dataclasses, validated when they are built.

The CLI parses strings into these; the Python API takes them directly. An invalid value raises
:class:`~packer.errors.OptionError` naming the option, the value and what is allowed.
"""

from __future__ import annotations

import numbers
import os
import re
from dataclasses import dataclass
from typing import Any

from readers.quantities import as_int, byte_count
from readers.schema import ENCODINGS

from .errors import OptionError
from .preprocess.geometry import FIXED_SIZE_MODES, RESIZE_MODES

__all__ = [
    "ImageOptions", "StorageOptions", "TextOptions", "SourceOptions", "RunOptions", "NO_EOS", "AUTO_BOS", "parse_size", "ON_ERROR", "DEFAULT_MAX_PIXELS",
    "DEFAULT_QUALITY", "DEFAULT_ITEM_TIMEOUT", "COMPRESSIONS", "EXECUTORS", "DECODE_DEVICES",
]

#: What to do with an input that cannot be converted: skip it (and record it), or stop.
ON_ERROR = ("skip", "fail")

#: Images with more pixels are skipped instead of decoded (a decompression bomb guard);
#: the same limit Pillow warns at.
DEFAULT_MAX_PIXELS = 89_478_485

#: Who runs a conversion's work units (``--executor``): this machine's processes, or Ray tasks.
EXECUTORS = ("local", "ray")

#: Where a conversion decodes JPEGs and resizes (``--decode-device``): the workers' CPUs, or the
#: GPU with nvJPEG in the driving process (packer/gpu_stage.py; ``pip install 'packer[gpu]'``).
DECODE_DEVICES = ("cpu", "cuda")

#: JPEG quality when ``--encoding jpeg`` is given without ``--quality``.
DEFAULT_QUALITY = 90

#: Seconds one input may take before its worker is considered hung (a photo takes milliseconds).
DEFAULT_ITEM_TIMEOUT = 120.0

#: HDF5 lossless compression filters (``--compression``), all shipped with h5py's wheels.
COMPRESSIONS = ("gzip", "lzf")

_SIZE_RE = re.compile(r"^\s*(\d+)\s*(?:[xX]\s*(\d+)\s*)?$")


def parse_size(text: str | int | tuple[int, int] | None) -> tuple[int, int] | None:
    """``224`` -> (224, 224); ``"160x224"`` -> (160, 224) as (height, width); integers may be
    numpy's or torch's, a pair a numpy array or tensor."""
    if text is None:
        return None
    if hasattr(text, "tolist") and getattr(text, "ndim", 0) == 1:  # np.array([160, 224]), torch.tensor([160, 224])
        text = tuple(text.tolist())
    if as_int(text) is not None:
        h = w = as_int(text)
    elif isinstance(text, bool) or (hasattr(text, "ndim") and not isinstance(text, (tuple, list))):
        raise OptionError(f"--size: expected N or HxW, got {text!r}")
    elif isinstance(text, (tuple, list)):
        pair = [as_int(v) for v in text]
        if len(pair) != 2 or None in pair:
            raise OptionError(f"--size: expected (height, width) integers, got {text!r}")
        h, w = pair
    else:
        match = _SIZE_RE.match(str(text))
        if not match:
            raise OptionError(f"--size: expected N or HxW (for example 224 or 160x224), got {text!r}")
        h = int(match.group(1))
        w = int(match.group(2)) if match.group(2) else h
    if not (1 <= h <= 65535 and 1 <= w <= 65535):
        raise OptionError(f"--size: sides must be between 1 and 65535 pixels, got {h}x{w}")
    return (h, w)


@dataclass(frozen=True)
class ImageOptions:
    """How each image is preprocessed and stored.

    ``size``: N, (height, width) or ``"HxW"``; ``None`` keeps the original size.
    ``resize_mode``: one of :data:`~packer.preprocess.geometry.RESIZE_MODES`; defaults to
    ``center-crop`` when a size is given, else ``none``.
    ``resize``: with ``center-crop``, first scale the shorter side to this (at least the size's
    larger side), then keep the centre ``size``: ``size=224, resize=256`` is torchvision's
    ``Resize(256)`` + ``CenterCrop(224)``, the standard evaluation crop. Without it the shorter
    side is scaled to the size itself (the widest centre view).
    ``encoding``: ``raw`` (uint8 pixels, nothing to decode when reading), ``jpeg`` (lossy,
    ``quality``, default :data:`DEFAULT_QUALITY`) or ``png`` (lossless); ``quality`` with another
    encoding is refused (it would do nothing).
    ``decode_device``: ``cpu`` (default) or ``cuda``: JPEGs decoded with nvJPEG and resized on
    the GPU in one process, other images on the CPU (packer/gpu_stage.py); the pixels differ
    slightly from the CPU path's, so it is recorded in the metadata and checked by ``--resume``.
    """

    size: Any = None
    resize_mode: str | None = None
    grayscale: bool = False
    encoding: str = "raw"
    quality: int | None = None
    max_pixels: int = DEFAULT_MAX_PIXELS
    resize: int | None = None
    decode_device: str = "cpu"

    def __post_init__(self) -> None:
        if not isinstance(self.grayscale, bool):  # ("no" is truthy: it converted to grayscale)
            raise OptionError(f"--grayscale: must be True or False, got {self.grayscale!r}")
        if self.decode_device not in DECODE_DEVICES:
            raise OptionError(f"--decode-device: must be one of {', '.join(DECODE_DEVICES)}, got {self.decode_device!r}")
        size = parse_size(self.size)
        object.__setattr__(self, "size", size)
        mode = self.resize_mode
        if mode is None:
            mode = "center-crop" if size is not None else "none"
            object.__setattr__(self, "resize_mode", mode)
        if mode not in RESIZE_MODES:
            raise OptionError(f"--resize-mode: unknown mode {mode!r} (choose from: {', '.join(RESIZE_MODES)})")
        if mode == "none" and size is not None:
            raise OptionError("--resize-mode none keeps the original size: drop --size, or pick another mode")
        if mode != "none" and size is None:
            raise OptionError(f"--resize-mode {mode} needs --size")
        if mode == "shorter" and size[0] != size[1]:
            raise OptionError(f"--resize-mode shorter takes one number (--size N), got {size[0]}x{size[1]}")
        if self.resize is not None:
            self._check_resize(mode, size)
        if self.encoding not in ENCODINGS:
            raise OptionError(f"--encoding: unknown encoding {self.encoding!r} (choose from: {', '.join(ENCODINGS)})")
        if self.quality is not None and self.encoding != "jpeg":
            raise OptionError(f"--quality: applies to --encoding jpeg only, not {self.encoding}; drop it")
        if self.encoding == "jpeg" and self.quality is None:
            object.__setattr__(self, "quality", DEFAULT_QUALITY)
        if self.quality is not None:
            if not 1 <= (as_int(self.quality) or 0) <= 100:  # (True was taken as quality 1: every image "cannot decode")
                raise OptionError(f"--quality: must be an integer from 1 to 100, got {self.quality!r}")
            object.__setattr__(self, "quality", as_int(self.quality))
        if (as_int(self.max_pixels) or 0) <= 0:
            raise OptionError(f"--max-pixels: must be a positive integer, got {self.max_pixels!r}")
        object.__setattr__(self, "max_pixels", as_int(self.max_pixels))

    def _check_resize(self, mode: str, size: tuple[int, int] | None) -> None:
        resize = as_int(self.resize)
        if resize is None or not 1 <= resize <= 65535:
            raise OptionError(f"--resize: must be a whole number of pixels (1 to 65535), got {self.resize!r}")
        object.__setattr__(self, "resize", resize)
        if size is None:
            raise OptionError("--resize: scales the shorter side before the centre crop of --size; give --size too (e.g. --size 224 --resize 256)")
        if mode != "center-crop":
            raise OptionError(f"--resize: applies to --resize-mode center-crop only, not {mode}; drop one of them")
        if resize < max(size):
            raise OptionError(f"--resize {resize}: must be at least the crop's larger side ({max(size)}), e.g. --size 224 --resize 256")

    @property
    def decode_target(self) -> tuple[int, int] | None:
        """(height, width) of the region the source is resized to before cropping, at least: the
        size, or with ``resize`` the crop's footprint at that scale (a square of ``resize``)."""
        if self.resize is None or self.size is None:
            return self.size
        return (max(self.resize, self.size[0]), max(self.resize, self.size[1]))

    @property
    def channels(self) -> int:
        return 1 if self.grayscale else 3

    @property
    def output_size(self) -> tuple[int, int] | None:
        """(height, width) of every output, or ``None`` when sizes vary."""
        return self.size if self.resize_mode in FIXED_SIZE_MODES else None

    def describe(self) -> dict[str, Any]:
        """The preprocessing record stored in metadata."""
        record: dict[str, Any] = {
            "size": list(self.size) if self.size is not None else None,
            "resize_mode": self.resize_mode,
            "grayscale": self.grayscale,
            "encoding": self.encoding,
            "quality": self.quality if self.encoding == "jpeg" else None,
            "max_pixels": self.max_pixels,
            "resample": "antialiased (area)",
            "exif_orientation": "applied",
        }
        if self.resize is not None:  # recorded only when given: files without it read as before
            record["resize"] = self.resize
        if self.decode_device != "cpu":  # likewise: recorded only when not the default
            record["decode_device"] = self.decode_device
            record["resample"] = "antialiased (bicubic, torch, on the GPU)"
        return record

    @classmethod
    def from_record(cls, record: dict[str, Any], encoding: str = "raw") -> "ImageOptions":
        """The options :meth:`describe` recorded (``encoding``: the metadata's, for records
        without one); fields added later read as their defaults where a record lacks them."""
        return cls(
            size=tuple(record["size"]) if record.get("size") else None,
            resize_mode=record.get("resize_mode"),
            resize=record.get("resize"),  # absent before --resize existed: the crop of --size alone
            grayscale=bool(record.get("grayscale")),
            encoding=record.get("encoding", encoding),
            quality=record.get("quality"),
            max_pixels=record.get("max_pixels", DEFAULT_MAX_PIXELS),
            decode_device=record.get("decode_device", "cpu"),
        )


@dataclass(frozen=True)
class StorageOptions:
    """Format-specific knobs of the writer (one given for another format is refused by :func:`packer.convert`).

    ``compression``: HDF5 lossless filter (``gzip`` or ``lzf``), off by default.
    ``shard_size`` / ``shard_bytes``: WebDataset shard bounds in samples / payload bytes (an
    integer, or text: ``"64MB"``, ``"1GiB"``).
    """

    compression: str | None = None
    shard_size: int | None = None
    shard_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.compression is not None and self.compression not in COMPRESSIONS:
            raise OptionError(f"--compression: unknown filter {self.compression!r} (choose from: {', '.join(COMPRESSIONS)})")
        if self.shard_size is not None and (as_int(self.shard_size) or 0) <= 0:
            raise OptionError(f"--shard-size: must be a positive integer, got {self.shard_size!r}")
        if self.shard_bytes is not None and (byte_count(self.shard_bytes) or 0) <= 0:
            raise OptionError(f"--shard-bytes: must be a positive number of bytes (as 1000000, 64MB or 1GiB), got {self.shard_bytes!r}")
        object.__setattr__(self, "shard_size", None if self.shard_size is None else as_int(self.shard_size))
        object.__setattr__(self, "shard_bytes", None if self.shard_bytes is None else byte_count(self.shard_bytes))


#: ``--eos none``: store documents back to back with no separator token.
NO_EOS = "none"
#: ``--bos auto``: put the tokenizer's own beginning-of-document token before every document.
AUTO_BOS = "auto"


@dataclass(frozen=True)
class TextOptions:
    """How a text corpus is read and tokenised (``packer convert --kind text``).

    ``tokenizer``: ``"bytes"`` (built in), a ``tokenizer.json`` or a SentencePiece ``.model``.
    ``lines``: one document per non-empty line of ``.txt`` files. ``text_field``: the string
    field of ``.jsonl`` records and Parquet rows. ``eos``: separator id after every document;
    ``None`` = the tokenizer's own EOS (``bytes``: 256), ``"none"`` = no separator.
    ``max_tokens``: keep at most this many tokens of each document (before its EOS). ``bos``:
    an id put before every document, ``"auto"`` = the tokenizer's own, ``None`` = none.
    """

    tokenizer: str = "bytes"
    lines: bool = False
    text_field: str = "text"
    eos: int | str | None = None
    max_tokens: int | None = None
    bos: int | str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.tokenizer, (str, os.PathLike)) or not str(self.tokenizer):
            raise OptionError(f"--tokenizer: must be 'bytes' or a tokenizer file, got {self.tokenizer!r}")
        if not isinstance(self.lines, bool):
            raise OptionError(f"--lines: must be True or False, got {self.lines!r}")
        if not isinstance(self.text_field, str) or not self.text_field:
            raise OptionError(f"--text-field: must be a non-empty field name, got {self.text_field!r}")
        if self.eos is not None and not (isinstance(self.eos, str) and self.eos == NO_EOS) and (as_int(self.eos) is None or as_int(self.eos) < 0):
            raise OptionError(f"--eos: must be a token id >= 0 or {NO_EOS!r}, got {self.eos!r}")
        if self.max_tokens is not None and (as_int(self.max_tokens) or 0) <= 0:
            raise OptionError(f"--max-tokens: must be a positive integer, got {self.max_tokens!r}")
        if self.bos is not None and self.bos != AUTO_BOS and (as_int(self.bos) is None or as_int(self.bos) < 0):
            raise OptionError(f"--bos: must be a token id >= 0 or {AUTO_BOS!r} (the tokenizer's own), got {self.bos!r}")
        for name in ("eos", "max_tokens", "bos"):  # a numpy integer (from a config) as Python's: the metadata is JSON
            if as_int(getattr(self, name)) is not None:
                object.__setattr__(self, name, as_int(getattr(self, name)))

    def describe(self) -> dict[str, Any]:
        """The options as recorded in the metadata's ``preprocessing``."""
        bos = {"bos": self.bos} if self.bos is not None else {}  # (recorded only when given: older records and fingerprints lack it)
        return {"lines": self.lines, "text_field": self.text_field, "max_tokens": self.max_tokens, **bos}

    @classmethod
    def from_record(cls, record: dict[str, Any], tokenizer: dict[str, Any]) -> "TextOptions":
        """The options :meth:`describe` recorded, with the metadata's ``tokenizer`` record (its
        ``path``, its ``eos_id``: ``None`` recorded ``--eos none``; its ``bos_id``, where there is one)."""
        eos = tokenizer.get("eos_id")
        return cls(tokenizer=tokenizer.get("path") or "bytes", lines=bool(record.get("lines")),
                   text_field=record.get("text_field", "text"), eos=NO_EOS if eos is None else eos,
                   max_tokens=record.get("max_tokens"), bos=tokenizer.get("bos_id"))


@dataclass(frozen=True)
class SourceOptions:
    """Where the inputs and their labels come from when SRC is not a folder of class folders
    (packer/sources/labels.py, packer/sources/datasets.py).

    ``labels``: a CSV, TSV, JSON or JSONL file giving each image's label (SRC: a folder or an
    archive; paths relative to it). ``path_column`` / ``label_column``: its columns (default: the
    first of :data:`~packer.sources.labels.PATH_COLUMNS` / ``LABEL_COLUMNS`` present).
    ``split``: keep only the rows whose ``split_column`` (default ``split``) has this value.
    A Python dataset of records (a Hugging Face ``datasets.Dataset``): ``image_column`` and
    ``label_column`` name the fields (default: ``image``/``img`` and ``label``/``labels``).
    Parquet files of images (packer/sources/parquet_images.py): ``image_column`` and
    ``label_column`` name the columns, ``split`` keeps the files of one split.
    ``classes``: a packer dataset or a text file of class names giving the class list, so that
    SRC's classes are numbered as another conversion's (packer/sources/class_list.py).
    Options that do not apply to the SRC are refused by :func:`packer.convert`.
    """

    labels: str | None = None
    path_column: str | None = None
    label_column: str | None = None
    split_column: str | None = None
    split: str | None = None
    image_column: str | None = None
    classes: str | None = None

    def __post_init__(self) -> None:
        for name in ("labels", "classes"):  # paths: a str or a PathLike (a list of names is not one)
            value = getattr(self, name)
            if value is not None and not isinstance(value, (str, os.PathLike)):
                raise OptionError(f"--{name}: a path, got {type(value).__name__} {value!r}")
            if value is not None:
                object.__setattr__(self, name, os.fspath(value))
        for name in ("labels", "path_column", "label_column", "split_column", "split", "image_column", "classes"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise OptionError(f"--{name.replace('_', '-')}: must be a non-empty name, got {value!r}")
        if self.split_column is not None and self.split is None:
            raise OptionError("--split-column: names the column --split selects on; pass --split NAME too")


@dataclass(frozen=True)
class RunOptions:
    """How a conversion runs, whatever it converts (none of these changes the output).

    ``on_error``: ``skip`` (record) or ``fail`` (stop) at an input that cannot be converted.
    ``workers``: processes (default: all usable cores; with Ray, the cluster's CPUs).
    ``timeout``: seconds one input may take before it is skipped as hung.
    ``executor``: ``local`` or ``ray`` (``ray_address``: the cluster to join).
    ``resume``: carry on an interrupted conversion from its last checkpoint.
    ``progress``: draw a progress bar on stderr.
    """

    on_error: str = "skip"
    workers: int | None = None
    timeout: float = DEFAULT_ITEM_TIMEOUT
    executor: str = "local"
    ray_address: str | None = None
    resume: bool = False
    progress: bool = False

    def __post_init__(self) -> None:
        if self.on_error not in ON_ERROR:
            raise OptionError(f"--on-error: must be one of {', '.join(ON_ERROR)}, got {self.on_error!r}")
        if self.workers is not None:
            if (as_int(self.workers) or 0) < 1:
                raise OptionError(f"--workers: must be a positive integer, got {self.workers!r}")
            object.__setattr__(self, "workers", as_int(self.workers))
        if isinstance(self.timeout, bool) or not isinstance(self.timeout, numbers.Real) or not self.timeout > 0:
            raise OptionError(f"--timeout: must be a positive number of seconds, got {self.timeout!r}")
        object.__setattr__(self, "timeout", float(self.timeout))
        if self.executor not in EXECUTORS:
            raise OptionError(f"--executor: must be one of {', '.join(EXECUTORS)}, got {self.executor!r}")
        if self.ray_address is not None and self.executor != "ray":
            raise OptionError("--ray-address: only with --executor ray")
        for shown, value in (("--resume", self.resume), ("progress", self.progress)):  # (no --progress flag: -q turns it off)
            if not isinstance(value, bool):  # "no" is true: never taken as asked
                raise OptionError(f"{shown}: must be True or False, got {value!r}")
