"""The ``packer`` command's entry point (``packer`` and ``python -m packer``).

Importing the command takes a few tenths of a second (numpy, OpenCV, the formats' libraries).
A Ctrl-C then used to print a traceback, or worse, was swallowed by a library's import (a bare
``except:``) and the command ran on: a conversion the user had stopped, ``--overwrite`` and all.
So SIGINT is held from the first line until the command is imported, then it stops the command
with one line, before anything is done. Once the command has ended, its outcome said (a summary
printed, or an error), a Ctrl-C while Python shuts down is ignored, a second one ending it at
once: it ended a finished conversion by SIGINT after its summary (a fault sweep, 13 of 40
Ctrl-Cs as DST appeared). Only where the command is the process, not a call from a program.

The command's processes also keep OpenBLAS (numpy's) to one thread, unless the user chose a
count (``OPENBLAS_NUM_THREADS``): packer computes no matrices, and each process that imported
numpy otherwise started a thread per core that spun a while at import, in the command's process
and in its fork server alike, taking cores from the workers as they started. Set before anything
imports numpy, so the fork server and the workers inherit it.

The shared memory of a command killed with SIGKILL is removed by multiprocessing's resource
tracker, which warned of it ("There appear to be 1 leaked shared_memory objects") on the
terminal, past ``--quiet``: the command's processes take a ``-W`` option that silences that.

A reader of its output that goes away (``packer convert ... 2>&1 | head``, a ``tee`` or pager
closed, a terminal gone) no longer ends the command: its warnings, progress and summary then go
nowhere and the work goes on to its end (:class:`_Unread`). A conversion piped to ``head`` had
stopped at its next warning, exit code 1, its output and progress thrown away, nothing said.
"""

from __future__ import annotations

import errno
import os
import signal
import sys

__all__ = ["main"]

#: A ``-W`` option for the processes the command starts (multiprocessing passes ``sys.warnoptions``
#: on): the resource tracker, which removes the shared memory of a command killed with SIGKILL,
#: does so without printing a traceback-like warning that no user can act on.
_QUIET_TRACKER = "ignore::UserWarning:multiprocessing.resource_tracker"


def main() -> None:
    """Import the command with Ctrl-C held, then run it (or stop, if one came)."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy's import: the module docstring
    sys.warnoptions.append(_QUIET_TRACKER)  # (read when the tracker process starts: the module docstring)
    came: list[int] = []

    def hold(signum: int, _frame: object) -> None:
        came.append(signum)
        if len(came) > 1:  # a second Ctrl-C: an import that hangs (a network mount) must not make the command deaf
            raise KeyboardInterrupt

    held = signal.getsignal(signal.SIGINT) is signal.default_int_handler  # (a background job started ignoring it: left so)
    if held:
        signal.signal(signal.SIGINT, hold)
    try:
        from .cli import main as command
    except KeyboardInterrupt:
        came.append(signal.SIGINT)
    finally:
        if held:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    if came:
        print("Error: interrupted while starting; nothing was done", file=sys.stderr)
        sys.exit(130)
    streams = []
    if _entry_point() and sys.stdout is not None and sys.stderr is not None:
        sys.stdout, sys.stderr = streams = [_Unread(sys.stdout, "stdout"), _Unread(sys.stderr, "stderr")]
    try:
        command()
    except SystemExit as exc:
        if exc.code not in (None, 0) or not any(stream.failed for stream in streams):
            raise
    finally:  # its outcome is decided and said: a Ctrl-C in Python's shutdown (the fork server's) must not end it by SIGINT
        if held and _entry_point():
            signal.signal(signal.SIGINT, _exit_at_the_second)
    for stream in streams:  # (the command succeeded: what it printed was lost, so it did not)
        if stream.failed:
            print(f"Error: could not write to {stream.name} ({stream.failed}); the command ran to its end, "
                  f"what it printed there is lost", file=sys.__stderr__)
            sys.exit(1)


def _entry_point() -> bool:
    """Whether the ``packer`` command is this process (the console script, ``python -m packer``),
    not a call from a program that goes on after it (``runpy``, IPython's ``%run``)."""
    entry = sys.modules.get("__main__")
    spec = getattr(entry, "__spec__", None)
    return getattr(entry, "main", None) is main or getattr(spec, "name", None) == "packer.__main__"


def _exit_at_the_second(signum: int, _frame: object, came: list[int] = []) -> None:  # noqa: B006 - the presses so far
    """A Ctrl-C once the command has ended: the first is ignored; a second ends a shutdown that
    hangs (a network read it waits for) at once, exit 130."""
    came.append(signum)
    if len(came) > 1:
        os._exit(130)


class _Unread:
    """``sys.stdout`` or ``sys.stderr`` of the command, which goes on when its output cannot be
    written: the descriptor is pointed at ``/dev/null`` (what is buffered, and what is written
    later, goes there, and Python's last flush at exit raises nothing) and the command goes on.
    A reader gone (``EPIPE``: a closed pipe; ``EIO``: a terminal hung up) is no failure: no one
    reads. Any other (``ENOSPC``: ``packer info --json > full-disk/x.json``) is kept in
    :attr:`failed`, and a command that succeeded fails with one line saying so at its end (a
    traceback before, or a truncated JSON with exit code 0)."""

    def __init__(self, stream, name: str) -> None:
        self._stream = stream
        self.name = name
        self.failed: str | None = None

    def write(self, text):
        try:
            return self._stream.write(text)
        except OSError as exc:
            self._unread(exc)
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            self._unread(exc)

    def _unread(self, exc: OSError) -> None:
        if exc.errno not in (errno.EPIPE, errno.EIO) and self.failed is None:
            self.failed = exc.strerror or str(exc)
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, self._stream.fileno())
        finally:
            os.close(null)

    def __getattr__(self, name: str):  # isatty, fileno, encoding...: the stream's own
        return getattr(self._stream, name)
