"""Files of an output: where an unfinished one lives, removing, syncing and publishing it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

__all__ = ["partial_path", "remove_path", "fsync_tree", "publish"]


def partial_path(dst: Path) -> Path:
    """Where an unfinished conversion to ``dst`` is written."""
    return dst.with_name(dst.name + ".partial")


def remove_path(path: Path) -> None:
    """Remove a file or a folder tree if it exists."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            path.unlink()
        except FileNotFoundError:
            pass


def _fsync(path: Path, flags: int = os.O_RDONLY) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: Path) -> None:
    """fsync a file, or every file and folder under a folder."""
    if path.is_dir():
        for dirpath, _dirnames, filenames in os.walk(path):
            for name in filenames:
                _fsync(Path(dirpath) / name)
            _fsync(Path(dirpath))
    else:
        _fsync(path)


def publish(tmp: Path, dst: Path) -> None:
    """Sync ``tmp`` and rename it to ``dst`` (replacing an existing one), then sync the folder."""
    fsync_tree(tmp)
    old = None
    if dst.exists() or dst.is_symlink():
        old = dst.with_name(dst.name + ".replaced")
        remove_path(old)
        os.replace(dst, old)
    os.replace(tmp, dst)
    _fsync(dst.parent if str(dst.parent) else Path("."))
    if old is not None:
        remove_path(old)
