"""What every writer shares: sample bookkeeping and atomic publication.

A writer fills a temporary ``DST.partial`` and, in :meth:`Writer.finish`, writes the metadata
record last, syncs everything to disk and renames the result to ``DST``. Until then no reader
accepts the output: the temporary name is not ``DST``, and it has no metadata. :meth:`abort`
removes the temporary output.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import Any, ClassVar

from readers.schema import Metadata

from ..errors import OutputError, OutputExistsError
from ..options import StorageOptions
from ..preprocess.task import Encoded

__all__ = ["Writer", "partial_path", "check_destination", "remove_path", "fsync_tree", "publish"]


def partial_path(dst: Path) -> Path:
    """Where an unfinished conversion to ``dst`` is written."""
    return dst.with_name(dst.name + ".partial")


def check_destination(dst: Path, *, overwrite: bool) -> None:
    """Refuse an existing ``dst`` unless ``overwrite``; check its folder exists."""
    if dst.exists() and not overwrite:
        raise OutputExistsError(f"{dst}: already exists; pass --overwrite to replace it, or choose another DST")
    parent = dst.parent if str(dst.parent) else Path(".")
    if not parent.is_dir():
        raise OutputError(f"{dst}: folder {parent} does not exist; create it first")
    if not os.access(parent, os.W_OK):
        raise OutputError(f"{dst}: folder {parent} is not writable; check its permissions")


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


class Writer:
    """Base writer: counts samples, tracks whether all share one shape, publishes atomically."""

    format_name: ClassVar[str] = ""
    #: Whether the output is a folder (True) or a single file (False).
    is_directory: ClassVar[bool] = False
    #: Whether worker processes write the output, a piece of consecutive inputs each, instead
    #: of this process through :meth:`add` (then the class supplies ``pieces``, ``piece_task``
    #: and ``add_piece``: see ``packer/writers/webdataset.py``).
    writes_pieces: ClassVar[bool] = False

    @classmethod
    def destination(cls, dst: Path) -> Path:
        """The path the finished output will have, for a DST as given (the same, for most formats)."""
        return Path(dst)

    def __init__(self, dst: Path, storage: StorageOptions | None = None) -> None:
        self.dst = Path(dst)
        self.storage = storage if storage is not None else StorageOptions()
        self.tmp = partial_path(self.dst)
        self.count = 0
        self.payload_bytes = 0
        self.common_shape: tuple[int, int, int] | None = None
        self._mixed_shapes = False
        remove_path(self.tmp)  # a stale leftover of an interrupted run
        try:
            self._open()
        except OSError as exc:
            self.abort()
            raise self.output_error(exc) from None

    # -- what a format supplies ---------------------------------------------------------
    def _open(self) -> None:
        raise NotImplementedError

    def _write(self, index: int, sample: Encoded) -> None:
        raise NotImplementedError

    def _write_metadata(self, meta: Metadata) -> None:
        """Write the metadata record and close every handle."""
        raise NotImplementedError

    def _close(self) -> None:
        """Close handles without finishing (used by :meth:`abort`)."""

    def extra(self) -> dict[str, Any]:
        """Format-specific details for :attr:`Metadata.extra` (none by default)."""
        return {}

    # -- driving --------------------------------------------------------------------------
    def add(self, sample: Encoded) -> None:
        """Append one sample; it gets the next index."""
        if self.common_shape is None and not self._mixed_shapes:
            self.common_shape = sample.shape
        elif sample.shape != self.common_shape:
            self.common_shape, self._mixed_shapes = None, True
        try:
            self._write(self.count, sample)
        except OSError as exc:
            raise self.output_error(exc) from None
        self.count += 1
        self.payload_bytes += len(sample.payload)

    @property
    def shape(self) -> tuple[int, int, int] | None:
        """The shape every sample has, or ``None`` if they differ."""
        return None if self._mixed_shapes else self.common_shape

    def finish(self, meta: Metadata) -> None:
        """Write metadata last, sync, and rename the output to its final name."""
        try:
            self._write_metadata(meta)
            publish(self.tmp, self.dst)
        except OSError as exc:
            self.abort()
            raise self.output_error(exc) from None

    def abort(self) -> None:
        """Drop the unfinished output."""
        try:
            self._close()
        finally:
            remove_path(self.tmp)

    def output_error(self, exc: OSError) -> OutputError:
        if exc.errno == errno.ENOSPC:
            return OutputError(f"{self.dst}: no space left on the device; free some space or choose another DST")
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return OutputError(f"{self.dst}: cannot write ({exc.strerror}); check the folder's permissions")
        return OutputError(f"{self.dst}: cannot write ({exc.strerror or exc})")

    def __enter__(self) -> "Writer":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
