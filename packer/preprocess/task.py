"""The unit of work a conversion worker runs: one input file in, one stored sample out.

Work units are small picklable objects (they travel to spawned workers); errors come back as
values (:class:`Failed`) so one bad file never kills the pool.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from typing import Iterator, Sequence

from readers.checksums import sample_checksum

from ..options import ImageOptions
from ..sources.images import ImageItem
from ..sources.remote import RemoteReadError, is_source_url, read_ahead, read_url_bytes
from ..work_unit import WorkUnit
from .decode import DecodeError, damage_printed, describe_error
from .encode import encode
from .image import preprocess_image
from .messages import DecoderOutput

__all__ = ["Encoded", "Failed", "ImageTask"]


@dataclass(frozen=True)
class Encoded:
    """A converted sample: its label, stored (C, H, W) shape, payload bytes and their dtype.

    Images are uint8 pixels. A tokenised document (``packer/preprocess/tokenize.py``) has label
    -1, shape ``(1, 1, n)`` for its ``n`` token ids and ``dtype`` uint16/uint32 (little-endian
    payload), so every format's per-sample (C, H, W) bookkeeping holds it unchanged.
    """

    label: int
    shape: tuple[int, int, int]
    payload: bytes
    dtype: str = "uint8"
    #: What the decoders printed while converting it (libjpeg's "Corrupt JPEG data: ...", a
    #: Pillow warning), or ``""``: the driver logs it as one packer warning for the input.
    decoder_messages: str = ""
    #: The sample's checksum (``readers.checksums.sample_checksum`` of label, shape and payload),
    #: computed where the sample is made, in the worker, so the one writing process does not
    #: (it travels with the pickled sample; ``dataclasses.replace`` recomputes it).
    checksum: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "checksum", sample_checksum(self.label, self.shape, self.payload))

    @property
    def nbytes(self) -> int:
        """The payload's size in bytes."""
        return len(self.payload)

    def __setstate__(self, state: dict) -> None:
        """Unpickling: the carried checksum, or (from a packer that did not carry one, such as an
        older version on a Ray worker) one computed here."""
        for name, value in state.items():
            object.__setattr__(self, name, value)
        if "checksum" not in state:
            object.__setattr__(self, "checksum", sample_checksum(self.label, self.shape, self.payload))


#: What to do, said when a conversion stops at an input (:attr:`Failed.stop`): its source changed under it ...
SOURCE_CHANGED = "run it again once the source is no longer written to"
#: ... or a remote SRC's store stopped answering (every read would fail: not the input's fault).
UNREACHABLE = "the store did not answer; once it does, run the same command with --resume"


@dataclass(frozen=True)
class Failed:
    """An input that could not be converted, and why. ``stop``: whatever ``--on-error`` says, the
    conversion stops here, and this is what to do (the source changed under it, or its store
    cannot be reached: skipping would drop inputs that are fine, by the thousand, and report
    success)."""

    path: str
    reason: str
    stop: str = ""


@dataclass(frozen=True)
class ImageTask(WorkUnit):
    """Read, preprocess and encode one image file."""

    options: ImageOptions

    def __call__(self, item: ImageItem) -> Encoded | Failed:
        return self.convert(item, _read_url(item.path) if is_source_url(item.path) else _read_file(item.path))

    def map(self, items: Sequence[ImageItem]) -> Iterator[Encoded | Failed]:
        """``self(item)`` for each item, in order; remote inputs are read ahead by threads
        (packer/sources/remote.py), so their latency overlaps decoding. The pools' workers and
        WebDataset pieces run their items through this."""
        if not items or not is_source_url(items[0].path):  # one SRC: all items local, or all URLs
            yield from map(self, items)
            return
        for item, data in zip(items, read_ahead(_read_url, [item.path for item in items])):
            yield self.convert(item, data)

    def convert(self, item: ImageItem, data: bytes | Failed) -> Encoded | Failed:
        """Preprocess and encode ``item`` from its file's bytes ``data`` (a read failure passes through)."""
        if isinstance(data, Failed):
            return data
        with DecoderOutput() as printed:  # what C decoders print to fd 2 comes back as text
            try:
                pixels = preprocess_image(data, self.options)
                payload = encode(pixels, self.options.encoding, self.options.quality)
                failure = None
            except DecodeError as exc:
                failure = str(exc)
            except Exception as exc:  # noqa: BLE001 - hostile files break decoders in odd ways; recorded, not hidden
                failure = f"cannot decode ({type(exc).__name__}: {describe_error(exc)})"
        if failure is None and printed.text:
            failure = damage_printed(printed.text, data)
        if failure is not None:
            return Failed(item.path, f"{failure} (the decoder printed: {printed.text})" if printed.text else failure)
        height, width, channels = pixels.shape
        return Encoded(item.label, (channels, height, width), payload, decoder_messages=printed.text)


def _read_file(path: str) -> bytes | Failed:
    """A local file's bytes, or why not."""
    try:
        # Non-blocking open and a type check: a FIFO or device named like an image would
        # otherwise block forever or read without end.
        with open(os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)), "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                return Failed(path, "not a regular file")
            return handle.read()
    except OSError as exc:
        return Failed(path, f"cannot read ({exc.strerror or exc})")


def _read_url(url: str) -> bytes | Failed:
    """A remote SRC's object, read through this process's fsspec filesystem (retried when transient)."""
    try:
        return read_url_bytes(url)
    except RemoteReadError as exc:
        return Failed(url, str(exc), stop=UNREACHABLE if exc.unreachable else "")
