"""Archives as SRC: .tar, .tar.gz (.tgz, .tar.bz2, .tar.xz), .zip, a tar of tars, WebDataset shards.

Nothing is unpacked to disk. An uncompressed tar or a zip is listed once here (member names and
where each member's bytes lie), and each worker then reads its own members by offset
(:func:`read_member`: one ``pread`` each, a zip member inflated in the worker), so the
conversion is parallel over all members as a folder's is. A tar of tars (ImageNet's training
archive) is the same: the inner archives are listed in parallel, one work unit each, and their
members are read straight from the outer file. A compressed tar cannot be read by offset: it is
streamed once, here (packer/sources/tarstream.py: inflated by zlib-ng where installed, in a
thread while this one parses), and its images travel to the workers with their bytes (it must fit
in a quarter of the available memory; else decompress it once to a .tar, which is read in place).
Its order and labels are known only at its end, so no worker can start before that pass ends.

Labels follow the folder rules (packer/sources/images.py): the archive's top-level folders are
the classes (a single top folder that holds only folders, as ``tar cf train.tar train/`` makes,
is looked through), images elsewhere are skipped as outside any class. A folder is there if the
archive records it (a directory entry: ``tar``, ``zip -r`` and most tools write one per folder)
or holds any member below it, as in the folder it unpacks to: a class folder that is empty, or
holds no image (only other files, hidden files or refused members), keeps its class and its
place in the numbering; only an archive written without directory entries (``zipfile.writestr``
of files alone) cannot hold an empty folder. A tar of tars: each inner
archive is a class, named by its file name less ``.tar``; a flat archive is unlabeled unless
``--labels`` names each member's label (paths relative to the archive, or to its single top
folder). Hidden names, ``__MACOSX/`` and non-images are ignored; a member whose path is absolute
or climbs out with ``..``, and a link member, are refused (skipped, with the reason). Samples are
ordered as for a folder: by class, then by path.

A folder of ``.tar`` files (no class folders) is a set of WebDataset shards: each sample is the
members sharing a key (the path up to the first dot of the file name), its image the member
with an image or ``.npy`` extension and its label the ``.cls`` member; order is the shards'
(sorted by name), then the members'. Shards packer wrote keep their class names.
"""

from __future__ import annotations

import bz2
import json
import lzma
import os
import posixpath
import stat
import tarfile
import zipfile
import zlib
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from readers.schema import Skipped

from ..errors import SourceError
from ..memory import available_memory
from .images import ImageFolder, ImageItem
from .labels import LabelTable, match_rows, safe_relative
from .rules import ARCHIVE_SUFFIXES, image_order, is_hidden, is_image_name
from .tarstream import Entry, list_tar, stream_tar

__all__ = ["Member", "ARCHIVE_SUFFIXES", "is_archive", "is_shard_folder", "scan_archive", "scan_shards", "read_member", "MEMORY_SHARE"]

#: File names SRC may end with to be read as an archive (any case).
#: Inner archives per listing process (a tar of tars with fewer than twice this is listed here).
PARALLEL_LISTING = 16
#: A compressed tar is held in memory while it converts: at most this share of what is available.
MEMORY_SHARE = 4
_ZIP_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflated", zipfile.ZIP_BZIP2: "bzip2"}
_PAYLOAD_EXTENSIONS = (".npy",)


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


def is_archive(src: str | os.PathLike[str]) -> bool:
    """Whether SRC names an archive file (by its suffix)."""
    return str(src).lower().endswith(ARCHIVE_SUFFIXES) and not Path(src).is_dir()


def is_shard_folder(src: str | os.PathLike[str]) -> bool:
    """Whether SRC is a folder of WebDataset shards: ``.tar`` files and no sub-folders."""
    path = Path(src)
    if not path.is_dir():
        return False
    entries = [e for e in os.scandir(path) if not is_hidden(e.name)]
    return any(e.name.endswith(".tar") and e.is_file() for e in entries) and not any(e.is_dir() for e in entries)


def scan_archive(src: str | os.PathLike[str], labels: LabelTable | None, workers: int | None = None) -> ImageFolder:
    """List the archive ``src``; its images (:class:`Member`), classes and skipped members."""
    path = Path(src)
    if not path.exists():
        raise SourceError(f"{src}: no such archive")
    archive = str(path.resolve())
    lower = archive.lower()
    try:
        if lower.endswith(".zip"):
            entries = _list_zip(archive)
        elif lower.endswith(".tar"):
            entries = list_tar(archive)
        else:
            entries = _stream_tar(archive)
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error, lzma.LZMAError, OSError) as exc:
        raise SourceError(f"{src}: cannot read the archive ({getattr(exc, 'strerror', None) or exc})") from None
    skipped: list[Skipped] = []
    folders: set[str] = set()
    kept = _safe(entries, skipped, folders=folders)
    inner = [entry for entry in kept if entry.name.lower().endswith(".tar")]
    if inner:
        if labels is not None:
            raise SourceError(f"{src}: a tar of tars takes its labels from its inner archives; drop --labels")
        if not lower.endswith(".tar"):
            raise SourceError(f"{src}: a compressed tar of tars cannot be read in place; decompress it once to a .tar")
        return _tar_of_tars(archive, inner, kept, skipped, workers)
    images = [entry for entry in kept if is_image_name(posixpath.basename(entry.name))]
    root = _top_folder(images, None if labels is not None else folders)
    relative = {entry.name[len(root):]: entry for entry in images}
    if labels is not None:
        matched = match_rows(labels, relative, lambda e, label: _member(archive, e, label), src)
        return _folder(archive, matched.items, labels.classes, labels.classes != [] or bool(matched.items), skipped + matched.skipped, [])
    classes = sorted({name[len(root):] for name in folders if name.startswith(root) and "/" not in name[len(root):]})
    if not classes:
        items = [_member(archive, e, -1) for name, e in sorted(relative.items(), key=lambda kv: image_order(kv[0].split("/")))]
        return _folder(archive, items, [], False, skipped, [])
    index = {name: i for i, name in enumerate(classes)}
    keyed = []
    for name, entry in relative.items():
        if "/" not in name:
            skipped.append(Skipped(entry.name, "outside any class folder (not labeled)"))
        else:
            top, rest = name.split("/", 1)
            keyed.append(((index[top], image_order(rest.split("/"))), _member(archive, entry, index[top])))
    if not keyed:
        raise SourceError(f"{src}: no images found in its class folders ({', '.join(classes[:3])}{', ...' if len(classes) > 3 else ''})")
    keyed.sort(key=lambda pair: pair[0])
    found = {member.label for _, member in keyed}
    return _folder(archive, [m for _, m in keyed], classes, True, skipped, [c for i, c in enumerate(classes) if i not in found])


def scan_shards(src: str | os.PathLike[str]) -> ImageFolder:
    """The samples of the WebDataset shards in the folder ``src``, in shard then member order."""
    folder = Path(src).resolve()
    shards = sorted(p for p in folder.iterdir() if p.name.endswith(".tar") and not is_hidden(p.name))
    classes: list[str] = []
    layout = None
    meta = folder / "packer.json"
    if meta.is_file():  # packer's own shards: class names, and (C, H, W) .npy payloads
        try:
            record = json.loads(meta.read_text(encoding="utf-8"))
            classes, layout = list(record.get("classes") or []), "chw"
        except (OSError, ValueError, AttributeError):
            pass
    items: list[Member] = []
    skipped: list[Skipped] = []
    labeled = False
    for shard in shards:
        try:
            entries = list_tar(str(shard))
        except (tarfile.TarError, OSError) as exc:
            raise SourceError(f"{shard}: cannot read the shard ({getattr(exc, 'strerror', None) or exc})") from None
        for key, group in _samples(_safe(entries, skipped, prefix=f"{shard.name}/")):
            where = f"{shard.name}/{key}"
            payload = next((e for e in group if is_image_name(posixpath.basename(e.name)) or e.name.lower().endswith(_PAYLOAD_EXTENSIONS)), None)
            if payload is None:
                skipped.append(Skipped(where, "no image member in this sample"))
                continue
            label = -1
            cls = next((e for e in group if e.name.endswith(".cls")), None)
            if cls is not None:
                text = _pread(str(shard), cls.offset, cls.size).decode("ascii", "replace").strip()
                if not text.lstrip("-").isdigit() or int(text) < -1 or (classes and int(text) >= len(classes)):
                    skipped.append(Skipped(where, f"unknown label {text[:20]!r} in {posixpath.basename(cls.name)}"))
                    continue
                label, labeled = int(text), labeled or int(text) >= 0
            items.append(_member(str(shard), payload, label, name=f"{shard.name}/{payload.name}", root=str(folder), layout=layout))
    if not items:
        raise SourceError(f"{src}: no samples with an image found in its {len(shards)} shards")
    stamps = {item.path: _stamp(item) for item in items}
    return ImageFolder(str(folder), items, classes if labeled else [], labeled, skipped, [], stamps=stamps)


def read_member(member: Member) -> bytes:
    """The bytes of ``member``, read from its archive (in a worker: by offset, one open file per
    archive per process). Raises ``OSError`` or ``ValueError`` (a damaged member) with the reason."""
    if member.data is not None:
        return member.data
    if member.method == "stored" and member.crc < 0:
        return _pread(member.archive, member.offset, member.size)
    header = _pread(member.archive, member.offset, 30)
    if len(header) < 30 or header[:4] != b"PK\x03\x04":
        raise ValueError("damaged zip member (no local header where the directory says)")
    start = member.offset + 30 + int.from_bytes(header[26:28], "little") + int.from_bytes(header[28:30], "little")
    stored = _pread(member.archive, start, member.size)
    if len(stored) != member.size:
        raise ValueError("the zip file ends inside this member (truncated)")
    try:
        data = stored if member.method == "stored" else zlib.decompress(stored, -15) if member.method == "deflated" else bz2.decompress(stored)
    except (zlib.error, OSError, ValueError) as exc:
        raise ValueError(f"damaged zip member ({exc})") from None
    if zlib.crc32(data) != member.crc:
        raise ValueError("damaged zip member (CRC mismatch)")
    return data


# -- listing ------------------------------------------------------------------------------------
def _list_inner(task: tuple[str, int, int]) -> list[Entry]:
    """The members of the inner tar at ``offset`` (``size`` bytes) of the tar ``path`` (a work unit)."""
    path, offset, size = task
    return list_tar(path, offset, size)


def _stream_tar(path: str) -> list[Entry]:
    """The members of a compressed tar, read in one streaming pass, image bytes kept (at most
    1/MEMORY_SHARE of the available memory)."""
    budget = (available_memory() or 0) // MEMORY_SHARE

    def within(held: int) -> None:
        if budget and held > budget:
            raise SourceError(
                f"{path}: a compressed tar is held in memory while it converts, and this one holds more than a "
                f"quarter of the memory available ({budget >> 20:,} MiB); decompress it once to a .tar (gunzip -k), "
                "which is read in place, in parallel"
            )

    return stream_tar(path, lambda name: is_image_name(posixpath.basename(name)), within)


def _list_zip(path: str) -> list[Entry]:
    entries = []
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            name = _zip_name(info)
            if info.is_dir():
                entries.append(Entry(name, info.header_offset, folder=True))
                continue
            method = _ZIP_METHODS.get(info.compress_type, f"method {info.compress_type}")
            if info.flag_bits & 0x1:
                method = "encrypted"
            unix_mode = info.external_attr >> 16 if info.create_system == 3 else 0  # (made on Unix: st_mode in the high bits)
            entries.append(Entry(name, info.header_offset, info.compress_size, method, info.CRC, link=stat.S_ISLNK(unix_mode)))
    return entries


def _zip_name(info: zipfile.ZipInfo) -> str:
    """A member's name as its folder had it. Without the UTF-8 flag (bit 11) the zip format says
    CP437, which ``zipfile`` follows, but Info-ZIP's ``zip`` and most Unix tools store the
    file system's UTF-8 bytes without setting it: ``ünïcode`` came out as ``├╝n├»code``. Such a
    name is read as UTF-8 when its bytes are valid UTF-8 (CP437 text above ASCII almost never is),
    as ``unzip`` and 7-Zip do."""
    if info.flag_bits & 0x800 or info.filename.isascii():
        return info.filename
    try:
        return info.filename.encode("cp437").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return info.filename


def _tar_of_tars(archive: str, inner: list[Entry], kept: list[Entry], skipped: list[Skipped], workers: int | None) -> ImageFolder:
    """Each inner tar a class (sorted by name), its images read straight from the outer file."""
    from ..parallel import ordered_map

    inner.sort(key=lambda e: e.name)
    classes = [posixpath.basename(e.name)[: -len(".tar")] for e in inner]
    for entry in kept:
        if entry not in inner and is_image_name(posixpath.basename(entry.name)):
            skipped.append(Skipped(entry.name, "outside any class archive (not labeled)"))
    tasks = [(archive, e.offset, e.size) for e in inner]
    items: list[Member] = []
    empty = []
    processes = max(1, min(workers or os.cpu_count() or 1, len(tasks) // PARALLEL_LISTING))  # a pool costs more than a few listings
    with ordered_map(_list_inner, tasks, workers=processes) if processes > 1 else nullcontext(map(_list_inner, tasks)) as listings:
        for label, (entry, members) in enumerate(zip(inner, listings)):
            found = [m for m in _safe(members, skipped, prefix=f"{entry.name}/") if is_image_name(posixpath.basename(m.name))]
            if not found:
                empty.append(classes[label])
            found.sort(key=lambda m: image_order(m.name.split("/")))
            items.extend(_member(archive, m, label, name=f"{entry.name}/{m.name}") for m in found)
    return _folder(archive, items, classes, True, skipped, empty)


def _safe(entries: Iterable[Entry], skipped: list[Skipped], prefix: str = "", folders: set[str] | None = None) -> list[Entry]:
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
        if folders is not None and parts[0] != "__MACOSX":
            for depth in range(1, len(parts) + entry.folder):
                if is_hidden(parts[depth - 1]):
                    break
                folders.add("/".join(parts[:depth]))
        if entry.folder or any(is_hidden(part) for part in parts) or parts[0] == "__MACOSX":
            continue
        if entry.link or entry.method.startswith(("method", "encrypted")):
            if is_image_name(parts[-1]) or name.lower().endswith(".tar"):
                why = "a link inside the archive; not followed" if entry.link else f"zip member {entry.method}: not supported"
                skipped.append(Skipped(prefix + name, why))
            continue
        entry.name = name
        kept.append(entry)
    return kept


def _samples(entries: list[Entry]) -> Iterable[tuple[str, list[Entry]]]:
    """WebDataset samples: consecutive members sharing a key (path up to the file name's first dot)."""
    key, group = None, []
    for entry in entries:
        folder, base = posixpath.split(entry.name)
        this = posixpath.join(folder, base.split(".", 1)[0])
        if this != key and group:
            yield key, group
            group = []
        key = this
        group.append(entry)
    if group:
        yield key, group


def _top_folder(entries: list[Entry], folders: set[str] | None) -> str:
    """``"TOP/"`` when every entry is under the one folder TOP, else ``""``. With ``folders`` (the
    archive's; TOP is looked through, its sub-folders the classes): only when TOP is the only
    top-level folder and every entry is in a sub-folder of it."""
    tops = {e.name.split("/", 1)[0] for e in entries if "/" in e.name}
    if len(tops) != 1 or any("/" not in e.name for e in entries):
        return ""
    top = tops.pop() + "/"
    if folders is not None and ({f for f in folders if "/" not in f} != {top[:-1]} or any("/" not in e.name[len(top):] for e in entries)):
        return ""
    return top


def _member(archive: str, entry: Entry, label: int, *, name: str | None = None, root: str | None = None,
            layout: str | None = None) -> Member:
    """The input for ``entry`` of ``archive``: recorded as ``name`` (default: its path), found at
    ``ROOT/name`` in messages (``root``: default the archive; for shards, their folder)."""
    name = name if name is not None else entry.name
    return Member(f"{root or archive}/{name}", label, name, archive, entry.offset, entry.size, entry.method, entry.crc, entry.data, layout)


def _folder(archive: str, items: list[Member], classes: list[str], labeled: bool, skipped: list[Skipped], empty: list[str]) -> ImageFolder:
    if not items:
        raise SourceError(f"{archive}: no images found in the archive (looked for image files, any case)")
    return ImageFolder(archive, items, classes, labeled, skipped, empty, stamps={item.path: _stamp(item) for item in items})


def _stamp(item: Member) -> str:
    st = os.stat(item.archive)
    return f"{st.st_size}:{st.st_mtime_ns}:{item.offset}:{item.size}"


_handles: dict[str, int] = {}
_owner = 0
_MAX_HANDLES = 64


def _pread(path: str, offset: int, size: int) -> bytes:
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

