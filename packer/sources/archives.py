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


A folder of WebDataset shards, and one shard (a .tar holding ``.cls`` members, or flat with a
``KEY.json`` beside each ``KEY.jpg``: ``shards.is_shard``): packer/sources/shards.py; members as inputs, and reading them
back: packer/sources/members.py.
"""

from __future__ import annotations

import logging
import lzma
import os
import posixpath
import stat
import tarfile
import zipfile
import zlib
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

from readers.schema import Skipped

from ..errors import SourceError
from ..memory import available_memory
from .images import ImageFolder, images_in_no_class, warn_one_class_of_class_folders
from .labels import LabelTable, Matched, labeled_items, match_rows
from .members import Member, member_of, safe_entries, stamp, warn_unended
from .rules import ARCHIVE_SUFFIXES, image_order, is_image_name
from .shards import is_shard, scan_shard
from .tarstream import Entry, Listing, list_tar, stream_tar

__all__ = ["ARCHIVE_SUFFIXES", "is_archive", "scan_archive", "MEMORY_SHARE"]

#: Inner archives per listing process (a tar of tars with fewer than twice this is listed here).
PARALLEL_LISTING = 16
#: A compressed tar is held in memory while it converts: at most this share of what is available.
MEMORY_SHARE = 4
log = logging.getLogger("packer")
_ZIP_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflated", zipfile.ZIP_BZIP2: "bzip2"}


def is_archive(src: str | os.PathLike[str]) -> bool:
    """Whether SRC names an archive file (by its suffix)."""
    return str(src).lower().endswith(ARCHIVE_SUFFIXES) and not Path(src).is_dir()


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
    if not getattr(entries, "ended", True):
        warn_unended(src)
    skipped: list[Skipped] = []
    folders: set[str] = set()
    kept = safe_entries(entries, skipped, folders=folders)
    images = [entry for entry in kept if is_image_name(posixpath.basename(entry.name))]
    inner = [entry for entry in kept if entry.name.lower().endswith(".tar")]
    if inner and not any("/" in entry.name for entry in images):  # (a .tar among class folders' images is a file like any other)
        if labels is not None:
            raise SourceError(f"{src}: a tar of tars takes its labels from its inner archives; drop --labels")
        if not lower.endswith(".tar"):
            raise SourceError(f"{src}: a compressed tar of tars cannot be read in place; decompress it once to a .tar")
        return _tar_of_tars(archive, inner, kept, skipped, workers)
    if labels is not None:
        return _labeled(src, archive, images, labels, skipped)
    if lower.endswith(".tar") and is_shard(kept):  # (one shard: its .cls labels; its KEY.seg.png no image of its own)
        return scan_shard(archive, kept, skipped)
    root = _top_folder(images, folders)
    relative = {entry.name[len(root):]: entry for entry in images}
    classes = sorted({name[len(root):] for name in folders if name.startswith(root) and "/" not in name[len(root):]})
    if not classes:
        items = [member_of(archive, e, -1) for name, e in sorted(relative.items(), key=lambda kv: image_order(kv[0].split("/")))]
        return _folder(archive, items, [], False, skipped, [])
    index = {name: i for i, name in enumerate(classes)}
    keyed = []
    for name, entry in relative.items():
        if "/" not in name:
            skipped.append(Skipped(entry.name, "outside any class folder (not labeled)"))
        else:
            top, rest = name.split("/", 1)
            keyed.append(((index[top], image_order(rest.split("/"))), member_of(archive, entry, index[top])))
    if not keyed:
        if len(keyed) < len(relative):  # (images at the top, beside folders without any)
            raise images_in_no_class(str(src), classes, len(relative))
        raise SourceError(f"{src}: no images found in its class folders ({', '.join(classes[:3])}{', ...' if len(classes) > 3 else ''})")
    keyed.sort(key=lambda pair: pair[0])
    found = {member.label for _, member in keyed}
    if len(classes) == 1:
        warn_one_class_of_class_folders(f"every image of {src}", classes[0], {n.split("/")[1] for n in relative if n.count("/") >= 2},
                                        f"convert {root + classes[0]} unpacked, or an archive of it")
    return _folder(archive, [m for _, m in keyed], classes, True, skipped, [c for i, c in enumerate(classes) if i not in found])


def _labeled(src: str | os.PathLike[str], archive: str, images: list[Entry], labels: LabelTable, skipped: list[Skipped]) -> ImageFolder:
    """The images the label file names, its paths relative to the archive or to its single top
    folder (whichever names more of the first rows' images: ``val/x.png`` and ``x.png`` both
    name ``val/x.png`` of ``tar cf val.tar val``)."""
    root = _top_folder(images, None)

    def matched(prefix: str, table: LabelTable) -> Matched:
        return match_rows(table, {e.name[len(prefix):]: e for e in images}, lambda e, label: member_of(archive, e, label), str(src))

    if root:
        first = replace(labels, rows=labels.rows[:1000], skipped=[], elsewhere=[])
        root = max((root, ""), key=lambda prefix: len(matched(prefix, first).items))  # (a tie: the top folder, as before)
    found = matched(root, labels)
    return _folder(archive, labeled_items(found, labels, src), labels.classes, True, skipped + found.skipped, [])


# -- listing ------------------------------------------------------------------------------------
def _list_inner(task: tuple[str, int, int]) -> Listing | str:
    """The members of the inner tar at ``offset`` (``size`` bytes) of the tar ``path``, or why it
    cannot be read (a work unit: it returns what went wrong, a pool's raise is a bug's)."""
    path, offset, size = task
    try:
        return list_tar(path, offset, size)
    except (tarfile.TarError, OSError) as exc:
        return str(getattr(exc, "strerror", None) or exc)


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
    named: dict[str, str] = {}
    for entry, name in zip(inner, classes):
        if named.setdefault(name, entry.name) != entry.name:
            raise SourceError(f"{archive}: its inner archives {named[name]} and {entry.name} would both be class {name!r}; "
                              "rename one (each inner archive is a class, named by its file name)")
    for entry in kept:
        if entry not in inner and is_image_name(posixpath.basename(entry.name)):
            skipped.append(Skipped(entry.name, "outside any class archive (not labeled)"))
    tasks = [(archive, e.offset, e.size) for e in inner]
    items: list[Member] = []
    empty = []
    processes = max(1, min(workers or os.cpu_count() or 1, len(tasks) // PARALLEL_LISTING))  # a pool costs more than a few listings
    with ordered_map(_list_inner, tasks, workers=processes) if processes > 1 else nullcontext(map(_list_inner, tasks)) as listings:
        for label, (entry, members) in enumerate(zip(inner, listings)):
            if isinstance(members, str):
                raise SourceError(f"{archive}: cannot read its inner archive {entry.name} ({members})")
            if not members.ended:
                warn_unended(f"{archive}: its inner archive {entry.name}")
            found = [m for m in safe_entries(members, skipped, prefix=f"{entry.name}/") if is_image_name(posixpath.basename(m.name))]
            if not found:
                empty.append(classes[label])
            found.sort(key=lambda m: image_order(m.name.split("/")))
            items.extend(member_of(archive, m, label, name=f"{entry.name}/{m.name}") for m in found)
    return _folder(archive, items, classes, True, skipped, empty)


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


def _folder(archive: str, items: list[Member], classes: list[str], labeled: bool, skipped: list[Skipped], empty: list[str]) -> ImageFolder:
    if not items:
        raise SourceError(f"{archive}: no images found in the archive (looked for image files, any case)")
    return ImageFolder(archive, items, classes, labeled, skipped, empty, stamps={item.path: stamp(item) for item in items})
