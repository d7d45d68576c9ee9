"""Stop a conversion part-way (for the --resume and interrupt tests): kill it right after its first
resume checkpoint, or make one of its calls raise."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

#: A child running ``packer ARGS`` with a checkpoint every 20 ms (HDF5, untimed: every sample),
#: pausing 0.3 s after each: the kill 0.1 s after the first lands before the conversion can finish
#: (a small blob conversion once finished in that 0.1 s and took its journal with it, in CI).
CHILD = ("import sys, time, packer.writers.journal as j; j.CHECKPOINT_SECONDS = 0.02; j.UNTIMED_CHECKPOINT_INPUTS = 1; "
         "commit = j.Journal.commit; j.Journal.commit = lambda *a, **k: (commit(*a, **k), time.sleep(0.3))[0]; "
         "from packer.cli import cli; cli(sys.argv[1:])")


def convert_until_checkpoint(
    args: list[str], journal: Path, timeout: float = 60.0, *, setup: str = "", until: Callable[[], bool] | None = None,
    sig: int = signal.SIGKILL,
) -> int:
    """Run ``packer *args`` in a child process, SIGKILL it (and its workers) soon after ``journal``
    appears (and ``until()`` is true), and return how many inputs the last checkpoint committed.
    ``setup``: Python statements the child runs first (to patch a constant); ``sig``: another
    signal to the process group (SIGINT: a Ctrl-C, which the child handles before it exits)."""
    child = f"{setup}; {CHILD}" if setup else CHILD
    proc = subprocess.Popen([sys.executable, "-c", child, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.time() + timeout
    while not journal.exists() or (until is not None and not until()):
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, "no checkpoint appeared"
        time.sleep(0.005)
    time.sleep(0.1)
    assert proc.poll() is None, f"the conversion ended before it could be stopped: {proc.communicate()}"
    os.killpg(proc.pid, sig)
    proc.communicate(timeout=timeout)  # reaps it and closes the pipes
    return json.loads(journal.read_text())["inputs"]


@contextmanager
def inputs_converted(monkeypatch: Any, owner: Any, name: str = "ordered_map") -> Iterator[list[int]]:
    """While inside, record how many inputs each call of the executor ``owner.name`` is given
    (a WebDataset piece counts its inputs): a resumed run must convert only those left."""
    counts: list[int] = []
    real = getattr(owner, name)

    def spy(fn, items, **options):
        counts.append(sum(len(getattr(item, "items", (item,))) for item in items))
        return real(fn, items, **options)

    monkeypatch.setattr(owner, name, spy)
    try:
        yield counts
    finally:
        monkeypatch.setattr(owner, name, real)


def interrupt_at_call(patch: Any, owner: Any, name: str, n: int, exc: type[BaseException] = KeyboardInterrupt) -> dict[str, int]:
    """Patch ``owner.name`` (with ``patch``: a monkeypatch or its context) so that its ``n``-th
    call raises ``exc`` and every other call runs the real one. Returns the call counter: set
    ``counter["n"] = 0`` to interrupt the ``n``-th call of the next run too."""
    real, calls = getattr(owner, name), {"n": 0}

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == n:
            raise exc
        return real(*args, **kwargs)

    patch.setattr(owner, name, interrupted)
    return calls
