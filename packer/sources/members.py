"""Archive members as inputs (packer/sources/archives.py, packer/sources/shards.py): the
:class:`Member` an entry of a listing becomes, which entries are safe to take, and reading one
back by offset in a worker (:func:`read_member`: one ``pread``, a zip member inflated there)."""

from __future__ import annotations

import bz2
import logging
import os
import posixpath
import zlib
from dataclasses import dataclass, field
from typing import Iterable

from readers.schema import Skipped

from .images import ImageItem
from .labels import safe_relative
from .rules import is_hidden, is_image_name
from .tarstream import SPECIAL, Entry

__all__ = ["Member", "read_member", "safe_entries", "member_of", "stamp", "pread", "warn_unended"]

log = logging.getLogger("packer")


@dataclass(frozen=True)
class Member(ImageItem):
    """An image inside an archive. ``path`` is ``ARCHIVE/NAME`` (messages); ``name`` its path in
    the archive as the metadata records it; ``archive``/``offset``/``size``: where its stored
    bytes lie (``method`` ``stored``, or a zip's ``deflated``/``bzip2`` from its local header at
    ``offset``), or ``data`` holds them (``memory``: a compressed tar, streamed)."""

    name: str = ""
    archive: str = ""
    offset: int = 0
    size: int = 0
    method: str = "stored"
    crc: int = -1
    data: bytes | None = field(default=None, repr=False)
    layout: str | None = None  # "chw" for the .npy payloads of packer's own shards


def read_member(member: Member) -> bytes:
    """The bytes of ``member``, read from its archive (in a worker: by offset, one open file per
    archive per process). Raises ``OSError`` or ``ValueError`` (a damaged member) with the reason."""
    if member.data is not None:
        return member.data
    if member.method == "stored" and member.crc < 0:
        return pread(member.archive, member.offset, member.size)
    header = pread(member.archive, member.offset, 30)
    if len(header) < 30 or header[:4] != b"PK\x03\x04":
        raise ValueError("damaged zip member (no local header where the directory says)")
    start = member.offset + 30 + int.from_bytes(header[26:28], "little") + int.from_bytes(header[28:30], "little")
    stored = pread(member.archive, start, member.size)
    if len(stored) != member.size:
        raise ValueError("the zip file ends inside this member (truncated)")
    try:
        data = stored if member.method == "stored" else zlib.decompress(stored, -15) if member.method == "deflated" else bz2.decompress(stored)
    except (zlib.error, OSError, ValueError) as exc:
        raise ValueError(f"damaged zip member ({exc})") from None
    if zlib.crc32(data) != member.crc:
        raise ValueError("damaged zip member (CRC mismatch)")
    return data


def safe_entries(entries: Iterable[Entry], skipped: list[Skipped], prefix: str = "", folders: set[str] | None = None) -> list[Entry]:
    """The file entries to consider: hidden names and ``__MACOSX/`` ignored; unsafe paths, links
    and unreadable zip members refused (recorded). Names become clean relative paths. ``folders``
    collects the archive's folders (clean paths, up to the first hidden name): its directory
    entries and the folders above each member, refused ones included (the folder they unpack to)."""
    kept = []
    for entry in entries:
        name = safe_relative(entry.name)
        if name is None:
            if not entry.folder:  # (a folder entry holds nothing: its unsafe members are refused one by one)
                skipped.append(Skipped(prefix + entry.name, "member path is absolute or leaves the archive ('..'); refused"))
            continue
        parts = name.split("/")
        if folders is not None and not is_hidden(parts[0]):
            for depth in range(1, len(parts) + entry.folder):
                if is_hidden(parts[depth - 1]):
                    break
                folders.add("/".join(parts[:depth]))
        if entry.folder or any(is_hidden(part) for part in parts):
            continue
        if entry.link or entry.method.startswith(("method", "encrypted")) or entry.method == SPECIAL:
            if is_image_name(parts[-1]) or name.lower().endswith(".tar"):
                why = ("a link inside the archive; not followed" if entry.link else
                       "not a regular file (a device or FIFO member)" if entry.method == SPECIAL else f"zip member {entry.method}: not supported")
                skipped.append(Skipped(prefix + name, why))
            continue
        entry.name = name
        kept.append(entry)
    return _last_of_each_name(kept, skipped, prefix)


def _last_of_each_name(kept: list[Entry], skipped: list[Skipped], prefix: str) -> list[Entry]:
    """``kept`` with one member per name, the last (the one ``tar -x`` leaves); an earlier image
    of a name that comes again is recorded as skipped (the later one silently replaced it)."""
    last = {entry.name: i for i, entry in enumerate(kept)}
    if len(last) == len(kept):
        return kept
    for i, entry in enumerate(kept):
        if last[entry.name] != i and (is_image_name(posixpath.basename(entry.name)) or entry.name.lower().endswith(".tar")):
            skipped.append(Skipped(prefix + entry.name, f"member {i + 1} of {len(kept)}: the archive holds this name again later, "
                                                        "and the last one is converted (as tar -x leaves it)"))
    return [entry for i, entry in enumerate(kept) if last[entry.name] == i]


def member_of(archive: str, entry: Entry, label: int, *, name: str | None = None, root: str | None = None,
            layout: str | None = None) -> Member:
    """The input for ``entry`` of ``archive``: recorded as ``name`` (default: its path), found at
    ``ROOT/name`` in messages (``root``: default the archive; for shards, their folder)."""
    name = name if name is not None else entry.name
    return Member(f"{root or archive}/{name}", label, name, archive, entry.offset, entry.size, entry.method, entry.crc, entry.data, layout)


def stamp(item: Member) -> str:
    st = os.stat(item.archive)
    return f"{st.st_size}:{st.st_mtime_ns}:{item.offset}:{item.size}"


def warn_unended(src: str | os.PathLike[str]) -> None:
    log.warning("%s ends without the two zero blocks that end a tar, so it may have been cut short (a copy or download "
                "that stopped): the members it holds are converted; compare its size with the original's", src)


_handles: dict[str, int] = {}
_owner = 0
_MAX_HANDLES = 64


def pread(path: str, offset: int, size: int) -> bytes:
    """``size`` bytes at ``offset`` of ``path``, through this process's open file for it."""
    global _owner
    if _owner != os.getpid():  # a forked child must not share its parent's file offsets or fds table
        _handles.clear()
        _owner = os.getpid()
    fd = _handles.get(path)
    if fd is None:
        if len(_handles) >= _MAX_HANDLES:
            os.close(_handles.pop(next(iter(_handles))))
        fd = _handles[path] = os.open(path, os.O_RDONLY)
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise OSError(f"the archive ends inside this member ({len(data)} of {size} bytes)")
    return data
