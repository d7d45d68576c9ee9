"""How :mod:`packer.parallel`'s pool starts its workers: from a fork server started deaf to
Ctrl-C (:func:`pool_context`), and without re-importing the caller's main script where the work
unit does not need it (:func:`main_not_reimported`)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from .work_unit import needs_main

__all__ = ["pool_context", "main_not_reimported", "server_running"]


def pool_context() -> multiprocessing.context.BaseContext:
    """The start method of every pool: a fork server (spawn where there is none)."""
    methods = multiprocessing.get_all_start_methods()
    if "forkserver" in methods:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["packer.pool_server", "packer.preprocess.task"])  # pool_server first: its docstring
        _start_forkserver_deaf_to_ctrl_c()
        return context
    return multiprocessing.get_context("spawn")  # pragma: no cover - Windows


def _start_forkserver_deaf_to_ctrl_c() -> None:
    """Start the fork server (if it is not running yet) with SIGINT blocked in this thread, which
    the server inherits: it cannot see a Ctrl-C while it starts, and its first preload,
    :mod:`packer.pool_server`, then ignores SIGINT and unblocks it, so its children (our workers)
    start ignoring it: a Ctrl-C to the terminal's process group never reaches a worker, not even
    while it imports (where it printed a KeyboardInterrupt traceback per worker). The parent stops
    the workers itself. Blocked, not ignored, here: a SIGINT that comes meanwhile is not lost
    (ignoring it lost it: a Ctrl-C at a pool's start ran the conversion to its end, 19 of 60
    tries). It is raised as the mask is restored, or at once where another thread takes it."""
    from multiprocessing import forkserver

    if server_running(forkserver):
        forkserver.ensure_running()
        return
    from multiprocessing import resource_tracker

    # First: its start unblocks SIGINT when it is done (CPython's own blocking). SIGHUP blocked
    # too, which the tracker inherits: a hang-up to the whole job (a closed terminal) killed it,
    # and each shared-memory block the run then released printed a traceback; it now outlives
    # the signal and cleans up at the end, as after a Ctrl-C.
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
    try:
        resource_tracker.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        forkserver.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def server_running(forkserver: Any) -> bool:
    """Whether this process's fork server runs (its pid is the module's private: else False)."""
    pid = getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None)
    try:
        return isinstance(pid, int) and os.kill(pid, 0) is None  # (not waitpid: ensure_running reaps it)
    except OSError:
        return False


@contextmanager
def main_not_reimported(fn: Callable) -> Iterator[None]:
    """Start workers without re-importing the caller's main module, when ``fn`` does not need it.

    A worker from a fork server or spawn first re-imports the ``__main__`` module of the
    program that started it (Python's rule, so that functions defined there unpickle). For a
    training script that imports torch that costs about a second per conversion, for nothing:
    packer's work units live in packer's own modules. So while a worker starts, ``__main__``
    hides the two attributes that name it (``__file__``, ``__spec__``), unless ``fn`` itself
    comes from ``__main__`` or says it carries something that does (``WorkUnit.needs_main``: a
    Python dataset whose class the script defines, packer/sources/datasets.py).
    """
    main = sys.modules.get("__main__")
    if main is None or needs_main(fn):
        yield
        return
    saved = {name: main.__dict__[name] for name in ("__file__", "__spec__") if name in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__dict__["__spec__"] = None
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)
