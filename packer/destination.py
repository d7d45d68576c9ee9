"""Where a conversion may write: the checks that keep a user's own files safe.

* DST must not be SRC, lie inside SRC, or contain SRC: with or without ``--overwrite``
  (a conversion reads SRC while it writes, and replacing DST would delete the source).
* An existing DST is replaced only with ``--overwrite``, and only if it is a packer dataset
  (its metadata record reads) or an empty folder: anything else is refused with one line
  naming what is there, so ``--overwrite`` can never delete a folder of the user's files; nor
  a packer dataset they added to (files in its folder, datasets or attributes in its HDF5
  file, keys in its LMDB: ``Store.foreign_content``).
* DST's folder must exist and be writable.

The old dataset stays intact until the new one is complete (``packer/writers/base.py``
``publish``). Remote DSTs get the same rule in ``packer/remote.py``.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from readers.formats import open_store
from readers.formats.inprogress import is_empty_folder
from readers.schema import PackedFormatError

from .errors import OptionError, OutputError, OutputExistsError

__all__ = ["check_destination", "check_apart", "describe_path", "is_packer_dataset", "kernel_filesystem", "nothing_to_resume", "write_error"]


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


def nothing_to_resume(dst: str) -> str:
    """The line for ``--resume`` of a finished dataset (a local or a URL DST)."""
    return f"{dst}: already complete, nothing to resume; pass --overwrite instead of --resume to convert again, or choose another DST"


def check_destination(dst: Path, *, overwrite: bool, resume: bool = False) -> None:
    """Refuse an existing ``dst`` unless it is an empty folder (there is nothing to lose: the
    folder a WebDataset user makes first) or ``overwrite`` and it is a packer dataset; check that
    its folder exists and is writable."""
    if (dst.exists() or dst.is_symlink()) and not is_empty_folder(dst):
        if not overwrite and resume and is_packer_dataset(dst):  # a retry of a run that finished before it was stopped
            raise OutputExistsError(nothing_to_resume(str(dst)))
        if not is_packer_dataset(dst):  # (said first: --overwrite would not help)
            raise OutputExistsError(
                f"{dst}: is not a packer dataset ({describe_path(dst)}); --overwrite replaces only a packer dataset: "
                "move it away or choose another DST"
            )
        if not overwrite:
            raise OutputExistsError(f"{dst}: already exists; pass --overwrite to replace it, or choose another DST")
        foreign = open_store(dst).foreign_content()
        if foreign:  # replacing the dataset would delete them with it
            shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3:,} more" if len(foreign) > 3 else "")
            what = "files" if dst.is_dir() and all((dst / name).exists() for name in foreign) else "content"
            raise OutputExistsError(f"{dst}: a packer dataset that also holds {what} packer did not write ({shown}); "
                                    "--overwrite would delete them with it: move them out, or choose another DST")
    parent = dst.parent if str(dst.parent) else Path(".")
    if not parent.is_dir():
        if parent.exists() or parent.is_symlink():
            raise OutputError(f"{dst}: {parent} is not a folder ({describe_path(parent)}); choose a DST inside a folder")
        raise OutputError(f"{dst}: folder {parent} does not exist; create it first")
    kernel = kernel_filesystem(parent)
    if kernel is not None:
        raise OutputError(f"{dst}: {parent} is a kernel file system ({kernel}), not a disk; choose a DST on a disk")
    if _read_only(parent):
        raise OutputError(f"{dst}: folder {parent} is on a read-only file system; choose a DST on a writable disk")
    if not os.access(parent, os.W_OK):
        raise OutputError(f"{dst}: folder {parent} is not writable; check its permissions, or choose another DST")


def _read_only(folder: Path) -> bool:
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):  # pragma: no cover - not POSIX
        return False


#: File systems that show the kernel's state (``/proc``, ``/sys``, ...), never a place for data;
#: root may even pass their permission checks, and then gets ENOENT or EACCES on the first file.
KERNEL_FILESYSTEMS = frozenset({
    "proc", "sysfs", "cgroup", "cgroup2", "debugfs", "tracefs", "securityfs", "configfs", "pstore", "bpf",
    "efivarfs", "fusectl", "binfmt_misc", "devpts", "mqueue", "autofs", "rpc_pipefs", "nsfs",
})


def kernel_filesystem(folder: Path) -> str | None:
    """The type of the kernel file system ``folder`` lies on (``"proc"``, ``"sysfs"``...), or
    ``None``: a disk, or not Linux (read from ``/proc/self/mounts``, longest mount point first)."""
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="replace") as mounts:
            table = [line.split()[1:3] for line in mounts if len(line.split()) >= 3]
    except OSError:
        return None
    real = os.path.realpath(folder)
    best, kind = "", None
    for point, fstype in table:
        point = point.replace("\\040", " ")
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fstype
    return kind if kind in KERNEL_FILESYSTEMS else None


#: errno -> what went wrong writing DST, and what to do (after ``DST: ``).
_WRITE_ERRORS = {
    errno.ENOSPC: "no space left on the device; free some space or choose another DST",
    errno.EDQUOT: "disk quota exceeded; free some space or choose another DST",
    errno.EROFS: "the file system is read-only; choose a DST on a writable disk",
    errno.EACCES: "cannot write ({}); check the folder's permissions, or choose another DST",
    errno.EPERM: "cannot write ({}); check the folder's permissions, or choose another DST",
    errno.EFBIG: "a file grew past what this file system or your file-size limit allows; choose another DST",
    errno.ENOMEM: "out of memory or address space ({}); raise the limit (ulimit -v: an LMDB maps its whole file) or free some memory",
    errno.EMFILE: "too many open files ({}); raise the limit (ulimit -n) and run it again",
}


def write_error(dst: Path | str, exc: OSError) -> OutputError:
    """The one-line error for an ``OSError`` met while writing ``dst``: what happened and what
    to do, never a traceback or a bare ``[Errno N]``. Anything not listed (``/proc`` refusing to
    create a file says ENOENT) reads as a place packer cannot write to."""
    what = _WRITE_ERRORS.get(exc.errno or 0)
    reason = exc.strerror or str(exc)
    if what is None:
        what = "cannot write there ({}); choose a DST on a disk you can write to"
    return OutputError(f"{dst}: {what.format(reason)}")
