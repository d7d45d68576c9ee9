"""Find the images of a folder and their labels.

Class sub-folders give labels: class index = position in the sorted list of folder names, as
torchvision's ``ImageFolder`` does; images are found recursively inside each class folder. A
folder without sub-folders gives unlabeled samples (label -1). Hidden files and folders (name
starting with ".") are ignored. Order is deterministic: by class, then by relative path.

The folder may be a URL (``s3://``, ``http(s)://``, ``file://``...): it is listed through
fsspec (packer/sources/remote.py) and scanned by the same rules, in :func:`_scan`.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from urllib.parse import unquote
from pathlib import Path
from typing import ClassVar, Iterable, Protocol

from readers.schema import PackedFormatError, Skipped

from ..errors import SourceError
from .rules import IMAGE_EXTENSIONS, image_order, is_hidden, is_image_name, unread_images

__all__ = [
    "IMAGE_EXTENSIONS", "ImageItem", "ImageFolder", "FolderTree", "scan_image_folder", "image_files", "is_hidden", "is_image_name",
    "images_in_no_class", "image_order", "warn_one_class_of_class_folders",
]

log = logging.getLogger("packer")


@dataclass(frozen=True)
class ImageItem:
    """One input image: its path and label (-1 when unlabeled)."""

    path: str
    label: int


@dataclass(frozen=True)
class ImageFolder:
    """The result of scanning a source folder."""

    #: The folder: a local path, or the URL of a remote one (a ``str``; packer/sources/remote.py).
    root: Path | str
    items: list[ImageItem]
    classes: list[str]
    labeled: bool
    #: Inputs that will not be converted, found while scanning (unreadable folders, images
    #: outside any class folder, symlink loops, and first the ``refused`` symlinks).
    skipped: list[Skipped] = field(default_factory=list)
    #: Class folders that contain no image.
    empty_classes: list[str] = field(default_factory=list)
    #: A remote folder's ``item path -> "size:version"`` from its listing, for the resume
    #: fingerprint (``None`` for a local folder: its files are stat-ed then).
    stamps: dict[str, str] | None = None
    #: Those of ``skipped`` that are input errors, not the labelling rules at work: symlinks (and
    #: class folders) that would give a class folder another class's images (:class:`_ClassLinks`),
    #: and folders that cannot be listed.
    #: They come first in ``skipped``; ``--on-error fail`` stops at them (packer/jobs.py).
    refused: list[Skipped] = field(default_factory=list)
    #: Inputs per work unit that suit the source (a Parquet row group's rows), or ``None``.
    chunk: int | None = None
    #: Whether the items are in class order (a folder's, an archive's): ``--classes`` keeps
    #: them so; a Parquet source's are in its rows' order, which its reading relies on.
    class_order: ClassVar[bool] = True

    @property
    def source(self) -> str:
        """The source as the metadata records it: an absolute path, or the URL."""
        return self.root if isinstance(self.root, str) else str(Path(self.root).resolve())

    def relative(self, path: str) -> str:
        """``path`` relative to the root, as recorded in metadata."""
        if isinstance(self.root, str):  # a URL: items are below it (over HTTP percent-encoded: named as the server's files are)
            prefix = self.root.rstrip("/") + "/"
            rest = path[len(prefix) :] if path.startswith(prefix) else path
            return unquote(rest, errors="surrogateescape") if self.root[:8].lower().startswith(("http://", "https://")) else rest
        prefix = str(self.root).rstrip(os.sep) + os.sep
        if path.startswith(prefix):  # as the scan joins them: no relpath per sample (the driver's CPU)
            rest = path[len(prefix) :]
            if rest and not rest.startswith((os.sep, "..")) and os.path.normpath(rest) == rest:
                return rest
        try:
            return os.path.relpath(path, self.root)
        except ValueError:  # pragma: no cover - other drive on Windows
            return path


class FolderTree(Protocol):
    """One way of listing a source folder: the local filesystem, or an fsspec URL.

    :func:`scan_image_folder` applies the rules (labels, hidden names, extensions, order,
    errors) to what a tree lists, so a local and a remote SRC are scanned alike.
    """

    #: How messages name the folder (its path or URL); ``root`` is what :class:`ImageFolder` keeps.
    name: str
    root: Path | str

    def kind(self) -> str | None:
        """``"dir"``, ``"file"`` (anything else), or ``None`` if nothing is there."""

    def top(self) -> list[tuple[str, str]]:
        """``(name, kind)`` of each top-level entry, sorted by name; kind ``"dir"``, ``"file"`` or
        ``"other"``. Raises ``OSError`` if the folder cannot be listed."""

    def images(self, folder: str, skipped: list[Skipped]) -> list[str]:
        """Item paths of the images below the top-level ``folder``, in :func:`image_order`,
        never entering hidden folders (see :func:`is_hidden`); records folders it cannot list."""

    def path(self, name: str) -> str:
        """The item path of the top-level entry ``name``."""

    def broken_links(self, entries: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """``(name, target)`` of each entry of :meth:`top` that is a symlink leading nowhere."""

    def cannot_list(self, exc: Exception) -> str:
        """What went wrong listing the folder, and the fix (after ``name: ``)."""

    def stamps(self) -> dict[str, str] | None:
        """Item path -> ``"size:version"`` from the listing (``None``: stat local files instead)."""

    def is_output(self, folder: str) -> bool:
        """Whether the top-level ``folder`` is a packer dataset (or an unfinished one), not a class."""


def scan_image_folder(root: str | os.PathLike[str]) -> ImageFolder:
    """Scan ``root`` (a path, or an fsspec URL: packer/sources/remote.py); raises
    :class:`SourceError` if it is missing, not a folder or has no images."""
    from .remote import is_source_url

    if isinstance(root, str) and is_source_url(root):
        from .remote import FsspecTree

        return _scan(FsspecTree(root))
    return _scan(_LocalTree(Path(root)))


def _packed_format(root: object) -> str | None:
    """The format of a local ``root`` that opens as a finished packer dataset (its metadata
    read, not only its names: a folder of images may hold a .tar, a data.mdb or a packer.json of
    its own, and an HDF5 file need not be packer's); else ``None``."""
    if not isinstance(root, Path):
        return None
    from readers.formats import open_store

    try:
        return open_store(root).meta.format
    except Exception:  # noqa: BLE001 - a probe: whatever does not open as a dataset is scanned as a folder
        return None


def _scan(tree: FolderTree) -> ImageFolder:
    """The labelling rules, over any :class:`FolderTree`."""
    kind = tree.kind()
    if kind is None:
        raise SourceError(f"{tree.name}: no such folder; SRC must be a folder of images (class sub-folders = labels)")
    packed = _packed_format(tree.root)
    if packed is not None:  # (a folder of WebDataset shards is read as a source before this scan)
        raise SourceError(f"{tree.name}: is a packer {packed} dataset, not a source: convert the images it was made from "
                          "(packer info shows its source), or read it with readers.open_dataset")
    if kind != "dir":
        if isinstance(tree.root, str):
            raise SourceError(f"{tree.name}: is a file; a URL SRC must be a folder of images (class sub-folders = labels): "
                              "archives, text and Parquet files are read from local paths only so far; copy it locally first")
        raise SourceError(f"{tree.name}: is a file; SRC must be a folder of images (class sub-folders = labels), an archive "
                          "(.tar, .tar.gz, .zip), a text corpus (.txt, .jsonl, .parquet) or a folder of them")
    try:
        entries = tree.top()
    except OSError as exc:
        raise SourceError(f"{tree.name}: {tree.cannot_list(exc)}") from None

    class_dirs = [name for name, what in entries if what == "dir" and not is_hidden(name)]
    outputs = [name for name in class_dirs if tree.is_output(name)]  # (train.lmdb written beside train/: no class)
    for name in outputs:
        log.warning("%s: %r left out: a packer dataset (or an unfinished conversion), not a class folder", tree.name, name)
    class_dirs = [name for name in class_dirs if name not in outputs]
    # (a broken symlink or a FIFO named like an image is an input its worker records: left out, it was dropped without a word)
    top_images = [name for name, what in entries if what != "dir" and is_image_name(name)]
    broken = [Skipped(name, f"a symlink to {target!r}, which leads nowhere (missing, or a loop): a class folder's images, "
                            "if it was one, are not converted") for name, target in tree.broken_links(entries)
              if not is_hidden(name) and not os.path.splitext(name)[1]]  # (named as a folder is: an editor's .#lock or a
    # README.md link leading nowhere is no class: --on-error fail stopped a valid conversion at one, a review)
    skipped: list[Skipped] = []
    if not class_dirs:
        items = [ImageItem(tree.path(name), -1) for name in top_images]
        unread = unread_images("", (name for name, what in entries if what == "file"))
        folder = ImageFolder(tree.root, items, [], labeled=False, skipped=broken + unread, stamps=tree.stamps(), refused=broken)
    else:
        items = []
        empty = []
        for label, name in enumerate(class_dirs):
            found = tree.images(name, skipped)
            if not found:
                empty.append(name)
            items.extend(ImageItem(path, label) for path in found)
        skipped += [Skipped(name, "outside any class folder (not labeled)") for name in top_images]  # (shards beside class
        skipped += unread_images("", (name for name, what in entries if what == "file"))  # folders too: all dropped unsaid)
        refused = broken + list(getattr(tree, "refused", ()))
        first = set(refused)
        skipped = refused + [entry for entry in skipped if entry not in first]
        folder = ImageFolder(tree.root, items, class_dirs, True, skipped, empty, stamps=tree.stamps(), refused=refused)
    if not entries:
        raise SourceError(f"{tree.name}: is empty; SRC must be a folder of images (class sub-folders = labels)")
    if not folder.items:
        from .text import TEXT_EXTENSIONS

        where = "in its class sub-folders" if class_dirs else "at its top level"
        if class_dirs and top_images:
            raise images_in_no_class(tree.name, class_dirs, len(top_images))
        texts = isinstance(tree.root, str) and any(what == "file" and name.lower().endswith(TEXT_EXTENSIONS) for name, what in entries)
        raise SourceError(
            f"{tree.name}: no images found {where} "
            f"(looked for {', '.join(sorted(IMAGE_EXTENSIONS))}, any case)"
            + ("; it holds text files, and text corpora are read from local folders only so far: copy it locally first" if texts else "")
        )
    return folder


def image_files(root: str | os.PathLike[str]) -> dict[str, str]:
    """Every image below the local folder ``root`` (hidden names skipped, as everywhere): its path
    relative to ``root`` (``/``-separated) -> its path. What a label file's rows are matched to
    (packer/sources/labels.py)."""
    found: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not is_hidden(d))
        for name in filenames:
            if is_image_name(name):
                path = os.path.join(dirpath, name)
                found[os.path.relpath(path, root).replace(os.sep, "/")] = path
    return found


class _LocalTree:
    """A folder on the local filesystem (symlinks followed, never around a loop)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.name = str(root)
        #: From :meth:`top`: each class folder's real path -> its class (a folder, before links to
        #: it), and whether one lies in another (through symlinks). The entries refused because
        #: they would give a class folder other images (:class:`_ClassLinks`).
        self.classes: dict[str, str] = {}
        self.nested = False
        self.refused: list[Skipped] = []

    def kind(self) -> str | None:
        if not self.root.exists():
            return None
        return "dir" if self.root.is_dir() else "file"

    def path(self, name: str) -> str:
        return os.path.join(self.root, name)

    def cannot_list(self, exc: Exception) -> str:
        return f"cannot list the folder ({getattr(exc, 'strerror', None) or exc}); check its permissions"

    def stamps(self) -> None:
        return None

    def is_output(self, folder: str) -> bool:
        from readers.formats import PARTIAL_SUFFIX, detect_format

        if folder.endswith(PARTIAL_SUFFIX):
            return True
        try:
            detect_format(self.root / folder)
        except (PackedFormatError, OSError):
            return False
        return True

    def broken_links(self, entries: list[tuple[str, str]]) -> list[tuple[str, str]]:
        found = []
        for name, what in entries:
            path = self.path(name)
            if what == "other" and os.path.islink(path) and not os.path.exists(path):
                try:
                    found.append((name, os.readlink(path)))
                except OSError:  # pragma: no cover - removed meanwhile
                    continue
        return found

    def top(self) -> list[tuple[str, str]]:
        entries = sorted(os.scandir(self.root), key=lambda e: e.name)
        listed = [(e.name, "dir" if _is_dir(e) else "file" if _is_file(e) else "other") for e in entries]
        self.classes = {}
        names = [name for name, what in listed if what == "dir" and not is_hidden(name)]
        for name in sorted(names, key=lambda name: os.path.islink(self.path(name))):  # a folder before a link to it
            self.classes.setdefault(os.path.realpath(self.path(name)), name)
        self.nested = any(_owner(os.path.dirname(real), self.classes) is not None for real in self.classes)
        return listed

    def images(self, folder: str, skipped: list[Skipped]) -> list[str]:
        """Images below the class folder ``folder``; symlinks (and folders) that would give it
        another class's images (see :class:`_ClassLinks`) are recorded as refused, not followed."""
        top = os.path.join(self.root, folder)
        root = self.root
        links = _ClassLinks(folder, self.classes or {os.path.realpath(top): folder}, root, nested=self.nested)
        if (same := self.classes.get(links.folder, folder)) != folder:  # another class folder is this very folder
            self._refuse(skipped, folder, f"is the same folder as the class folder {same!r} (through a symlink); its images are under that label")
            return []
        found: list[str] = []
        seen: set[tuple[int, int]] = set()

        def on_error(exc: OSError) -> None:  # its images cannot be read: an input error, as an unreadable file is
            self._refuse(skipped, os.path.relpath(exc.filename or top, root), f"cannot list folder ({exc.strerror})")

        def kept(dirpath: str, names: list[str]) -> list[str]:
            """``names`` less the symlinks not followed (recorded as refused)."""
            out = []
            for name in names:
                path = os.path.join(dirpath, name)
                if links.skips(path):
                    self._refuse(skipped, os.path.relpath(path, root), links.reason(path))
                else:
                    out.append(name)
            return out

        for dirpath, dirnames, filenames in os.walk(top, onerror=on_error, followlinks=True):
            try:
                st = os.stat(dirpath)
            except OSError:  # pragma: no cover - raced with deletion
                dirnames[:] = []
                continue
            if (st.st_dev, st.st_ino) in seen:
                skipped.append(Skipped(os.path.relpath(dirpath, root), "symlink loop (folder already visited)"))
                dirnames[:] = []
                continue
            seen.add((st.st_dev, st.st_ino))
            if (other := links.inner_class(dirpath)) is not None:  # class folders nested through symlinks
                self._refuse(skipped, os.path.relpath(dirpath, root), f"is the class folder {other!r} (through a symlink); "
                                                                      "its images are under that label")
                dirnames[:] = []
                continue
            dirnames[:] = kept(dirpath, sorted(d for d in dirnames if not is_hidden(d)))
            found.extend(os.path.join(dirpath, name) for name in kept(dirpath, [n for n in filenames if is_image_name(n)]))
            skipped.extend(unread_images(os.path.relpath(dirpath, root).replace(os.sep, "/"), filenames))
        found.sort(key=lambda p: image_order(p[len(top) + 1:].split(os.sep)))  # (os.walk joins below top: no relpath per file)
        return found

    def _refuse(self, skipped: list[Skipped], path: str, reason: str) -> None:
        entry = Skipped(path, reason)
        skipped.append(entry)
        self.refused.append(entry)


class _ClassLinks:
    """Which symlinks inside a class folder are followed: each image gets the label of the class
    folder it really lies in, and no other.

    Class folders are taken at their real paths (a class folder that is itself a link is the
    class folder). A link that leads into a class folder is followed only if that is its own:
    a link to ``..``, to another class's folder or to one of its images would import them
    under this folder's label. A link to anything else in SRC (outside every class folder) is
    not followed either. Outside SRC, a link to a file is followed, as link farms are built
    (``packer bench``'s sample, git-annex, DVC and Hugging Face caches): where it sits is the
    only label it has; a link to a folder outside its class folder is not (a whole tree from
    elsewhere, or one holding SRC). Class folders nested through links give each image the
    innermost one's label; two class folders that are one folder give it the one that is not a link.
    """

    def __init__(self, name: str, classes: dict[str, str], root: str | os.PathLike[str], *, nested: bool = False) -> None:
        """``classes``: each class folder's real path -> its class (one folder, one class);
        ``nested``: whether one of them lies in another."""
        self.name = name
        self.classes = classes
        self.folder = os.path.realpath(os.path.join(root, name))
        self.root = os.path.realpath(root)
        self.nested = nested

    def inner_class(self, dirpath: str) -> str | None:
        """The other class whose folder ``dirpath``, met walking this one, really is (else ``None``)."""
        if not self.nested:
            return None
        other = self.classes.get(os.path.realpath(dirpath))
        return other if other is not None and other != self.name else None

    def skips(self, path: str) -> bool:
        """Whether ``path`` is a symlink that is not followed."""
        if not os.path.islink(path):
            return False
        target = os.path.realpath(path)
        owner = _owner(target, self.classes)
        if owner is not None:
            return owner != self.name
        return os.path.isdir(target) or _within(target, self.root)

    @staticmethod
    def reason(path: str) -> str:
        try:
            target = os.readlink(path)
        except OSError:  # pragma: no cover - raced with deletion
            target = "?"
        return f"symlink to {target!r} leads outside its class folder; not followed"


def _owner(path: str, classes: dict[str, str]) -> str | None:
    """The class whose folder (by real path, in ``classes``) the real path ``path`` lies in: the
    innermost one; ``None`` if none."""
    while True:
        if (name := classes.get(path)) is not None:
            return name
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()  # follows symlinks
    except OSError:  # pragma: no cover
        return False


def _is_file(entry: os.DirEntry) -> bool:
    try:
        return entry.is_file()
    except OSError:  # pragma: no cover
        return False


def images_in_no_class(where: str, classes: list[str], outside: int) -> SourceError:
    """The error of a source whose ``outside`` images lie beside folders without any (a flat folder
    with a stray ``thumbs/``): every folder is a class, so none of them is converted. It said only
    'no images found in its class sub-folders', nothing of the images (a walkthrough)."""
    names = ", ".join(classes[:3]) + (", ..." if len(classes) > 3 else "")
    images = f"{outside:,} images at the top level are" if outside != 1 else "image at the top level is"
    return SourceError(f"{where}: its folders ({names}) hold no images, and with folders each is a class, so its {images} "
                       "in none: move the images into class folders, or the folders out to convert "
                       "the images unlabeled")


def warn_one_class_of_class_folders(where: str, name: str, subfolders: Iterable[str], advice: str) -> None:
    """SRC given one level too high (``imagenet/`` holding ``train/``, whose sub-folders are the
    classes) converts without an error into one class, label 0 for every sample: said at once, not
    found when training does not learn. ``where``: whose images (a folder's, an archive's);
    ``advice``: what to convert instead. Nothing where ``subfolders`` are fewer than two."""
    names = sorted(set(subfolders))
    if len(names) >= 2:
        log.warning("%s is in one class folder, %r, so every sample gets label 0; its images are in %d sub-folders (%s): if "
                    "those are the classes, %s", where, name, len(names), ", ".join(names[:3]) + (", ..." if len(names) > 3 else ""), advice)
