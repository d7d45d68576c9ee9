"""Run a function as an unprivileged user, so permission tests mean something even as root."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

#: The conventional "nobody" ids.
NOBODY = 65534

#: The machine's temporary folder, where a test runs with one of its own (tests/conftest.py,
#: ``worker_temp_folder``, inside pytest's folder that only we may enter).
SHARED_TMP = "PACKER_TESTS_SHARED_TMP"


def _child(conn: Any, fn: Callable[..., Any], args: tuple) -> None:
    if os.geteuid() == 0:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    try:
        conn.send(("ok", fn(*args)))
    except BaseException as exc:  # noqa: BLE001 - handed back to the test
        conn.send(("raised", exc))


def run_unprivileged(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a forked child that dropped root (if it had it); its exceptions re-raise here."""
    parent, child = multiprocessing.get_context("fork").Pipe()
    process = multiprocessing.get_context("fork").Process(target=_child, args=(child, fn, args))
    process.start()
    child.close()
    try:
        kind, value = parent.recv()
    finally:
        process.join()
    if kind == "raised":
        raise value
    return value


@contextmanager
def world_readable_dir() -> Iterator[Path]:
    """A fresh folder that an unprivileged user can enter (pytest's tmp_path is private to us)."""
    path = Path(tempfile.mkdtemp(prefix="packer-test-", dir=os.environ.get(SHARED_TMP)))
    path.chmod(0o755)
    try:
        yield path
    finally:
        for dirpath, dirnames, filenames in os.walk(path):
            os.chmod(dirpath, 0o755)
            for name in dirnames + filenames:
                full = os.path.join(dirpath, name)
                if not os.path.islink(full):
                    os.chmod(full, 0o755)
        shutil.rmtree(path)
