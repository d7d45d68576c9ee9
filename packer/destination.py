"""Where a conversion may write: the checks that keep a user's own files safe.

* DST must not be SRC, lie inside SRC, or contain SRC: with or without ``--overwrite``
  (a conversion reads SRC while it writes, and replacing DST would delete the source).
* An existing DST is replaced only with ``--overwrite``, and only if it is a packer dataset
  (its metadata record reads) or an empty folder: anything else is refused with one line
  naming what is there, so ``--overwrite`` can never delete a folder of the user's files.
* DST's folder must exist and be writable.

The old dataset stays intact until the new one is complete (``packer/writers/base.py``
``publish``). Remote DSTs get the same rule in ``packer/remote.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

from readers.formats import open_store
from readers.schema import PackedFormatError

from .errors import OptionError, OutputError, OutputExistsError

__all__ = ["check_destination", "check_apart", "describe_path", "is_packer_dataset"]


def _resolved(path: str | os.PathLike[str]) -> Path:
    return Path(os.path.abspath(os.path.realpath(path)))


def check_apart(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """Refuse a DST that is SRC, lies inside it or contains it (local paths, links resolved)."""
    source, target = _resolved(src), _resolved(dst)
    if source == target:
        raise OptionError(f"{dst}: DST is the source folder itself; choose a DST outside {src}")
    if source in target.parents:
        raise OptionError(f"{dst}: DST lies inside the source {src}; choose a DST outside it")
    if target in source.parents:
        raise OptionError(f"{dst}: DST contains the source {src}; replacing it would delete the source: choose another DST")


def is_packer_dataset(path: Path) -> bool:
    """Whether ``path`` is a finished packer dataset: some format recognises it and its metadata record reads."""
    try:
        open_store(path)
    except (PackedFormatError, OSError, ValueError):
        return False
    return True


def describe_path(path: Path) -> str:
    """What is at ``path``, in a few words for an error line."""
    if path.is_symlink():
        return f"a symbolic link to {os.readlink(path)}"
    if path.is_dir():
        try:
            names = sorted(os.listdir(path))
        except OSError as exc:
            return f"a folder that cannot be listed ({exc.strerror})"
        if not names:
            return "an empty folder"
        files = sum(1 for name in names if not (path / name).is_dir())
        folders = len(names) - files
        parts = [f"{files:,} file{'s' if files != 1 else ''}"] if files else []
        parts += [f"{folders:,} folder{'s' if folders != 1 else ''}"] if folders else []
        return f"a folder holding {' and '.join(parts)}, for example {names[0]!r}"
    if path.is_file():
        return f"a file of {path.stat().st_size:,} bytes"
    return "something that is neither a file nor a folder"


def _is_empty_folder(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink() and not any(os.scandir(path))


def check_destination(dst: Path, *, overwrite: bool) -> None:
    """Refuse an existing ``dst`` unless ``overwrite`` and it is a packer dataset (or an empty
    folder); check that its folder exists and is writable."""
    if dst.exists() or dst.is_symlink():
        if not overwrite:
            raise OutputExistsError(f"{dst}: already exists; pass --overwrite to replace it, or choose another DST")
        if not (_is_empty_folder(dst) or is_packer_dataset(dst)):
            raise OutputExistsError(
                f"{dst}: is not a packer dataset ({describe_path(dst)}); --overwrite replaces only a packer dataset: "
                "move it away or choose another DST"
            )
    parent = dst.parent if str(dst.parent) else Path(".")
    if not parent.is_dir():
        raise OutputError(f"{dst}: folder {parent} does not exist; create it first")
    if not os.access(parent, os.W_OK):
        raise OutputError(f"{dst}: folder {parent} is not writable; check its permissions")
