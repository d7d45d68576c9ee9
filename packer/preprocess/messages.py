"""What a decoder printed while it decoded one input, captured instead of reaching the terminal.

libjpeg (through OpenCV or Pillow), libtiff and libpng write their warnings straight to file
descriptor 2 ("Corrupt JPEG data: premature end of data segment", "ZIPDecode: Decoding error at
scanline 0"), and Pillow warns through Python's :mod:`warnings`. In a conversion of odd images
hundreds of such lines would bury packer's own warnings, and ``--quiet`` could not silence them.

``with DecoderOutput() as printed:`` points fd 2 at a per-process temporary file while one input is
decoded, and records Python warnings, then hands the text back: the work unit attaches it to the
input's skip reason, or returns it with the sample for the driver to log as one packer warning
(packer/preprocess/task.py, packer/engine.py). When the decoder prints nothing the cost is five
system calls (``dup``, ``dup2`` twice, ``close``, ``lseek``) and a ``warnings.catch_warnings``: a small fraction
of decoding even the smallest JPEG (tests/test_decoder_messages.py bounds it).

While the body runs, anything this process writes to fd 2 is captured, from any thread: so only
decoding runs inside it.
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings

__all__ = ["DecoderOutput", "MAX_MESSAGE_CHARS"]

#: At most this much of what one input's decoders printed is kept (a damaged file can make a
#: decoder print a line per scanline).
MAX_MESSAGE_CHARS = 400

_sink: tuple[int, int] | None = None  # (pid, capture file fd)


def _capture_fd() -> int:
    """This process's capture file, made once per process (a forked child makes its own: the
    parent's file offset would be shared)."""
    global _sink
    if _sink is None or _sink[0] != os.getpid():
        with tempfile.TemporaryFile(prefix="packer-stderr-") as handle:  # unlinked at once; our fd keeps it
            capture = os.dup(handle.fileno())
        os.set_inheritable(capture, False)
        _sink = (os.getpid(), capture)
    return _sink[1]


class DecoderOutput:
    """Capture fd 2 and Python warnings while the ``with`` body runs; ``.text`` then holds them,
    one ``; ``-separated line each, duplicates dropped, at most :data:`MAX_MESSAGE_CHARS`.

    A class rather than a generator-based context manager: this runs once per input, and the
    generator's machinery cost as much as the system calls."""

    __slots__ = ("text", "_fds", "_warnings", "_caught")

    def __init__(self) -> None:
        self.text = ""

    def __enter__(self) -> "DecoderOutput":
        # fd 2 as it is now is saved for each input, never once per process: something else (a
        # test harness, a program's own logging) may point fd 2 elsewhere between inputs.
        _flush_stderr()
        try:
            self._fds = (_capture_fd(), os.dup(2))
        except OSError:  # no fd 2 at all: nothing can reach a terminal
            self._fds = None
        if self._fds is not None:
            os.dup2(self._fds[0], 2)
            self._warnings = warnings.catch_warnings(record=True)
            self._caught = self._warnings.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fds is None:
            return
        capture, saved = self._fds
        self._warnings.__exit__(*exc)
        _flush_stderr()
        os.dup2(saved, 2)
        os.close(saved)
        lines = [f"{w.category.__name__}: {w.message}" for w in self._caught]
        size = os.lseek(capture, 0, os.SEEK_CUR)
        if size:
            os.lseek(capture, 0, os.SEEK_SET)
            printed = os.read(capture, min(size, 4 * MAX_MESSAGE_CHARS)).decode("utf-8", "replace")
            os.ftruncate(capture, 0)
            os.lseek(capture, 0, os.SEEK_SET)
            lines = printed.splitlines() + lines
        if lines:
            self.text = _tidy(lines)


def _flush_stderr() -> None:
    """Python's buffered writes to fd 2 go out now, to the fd 2 they were meant for."""
    try:
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):  # no sys.stderr (None), or a closed one
        pass


def _tidy(lines: list[str]) -> str:
    unique = list(dict.fromkeys(line.strip() for line in lines if line.strip()))
    text = "; ".join(unique)
    return text if len(text) <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS - 3] + "..."
