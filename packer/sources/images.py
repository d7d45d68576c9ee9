"""Find the images of a folder and their labels.

Class sub-folders give labels: class index = position in the sorted list of folder names, as
torchvision's ``ImageFolder`` does; images are found recursively inside each class folder. A
folder without sub-folders gives unlabeled samples (label -1). Hidden files and folders (name
starting with ".") are ignored. Order is deterministic: by class, then by relative path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from readers.schema import Skipped

from ..errors import SourceError

__all__ = ["IMAGE_EXTENSIONS", "ImageItem", "ImageFolder", "scan_image_folder"]

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".gif"})


@dataclass(frozen=True)
class ImageItem:
    """One input image: its path and label (-1 when unlabeled)."""

    path: str
    label: int


@dataclass(frozen=True)
class ImageFolder:
    """The result of scanning a source folder."""

    root: Path
    items: list[ImageItem]
    classes: list[str]
    labeled: bool
    #: Inputs that will not be converted, found while scanning (unreadable folders, images
    #: outside any class folder, symlink loops).
    skipped: list[Skipped] = field(default_factory=list)
    #: Class folders that contain no image.
    empty_classes: list[str] = field(default_factory=list)

    def relative(self, path: str) -> str:
        """``path`` relative to the root, as recorded in metadata."""
        try:
            return os.path.relpath(path, self.root)
        except ValueError:  # pragma: no cover - other drive on Windows
            return path


def _is_image(name: str) -> bool:
    return not name.startswith(".") and os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


def scan_image_folder(root: str | os.PathLike[str]) -> ImageFolder:
    """Scan ``root``; raises :class:`SourceError` if it is missing, not a folder or has no images."""
    root_path = Path(root)
    if not root_path.exists():
        raise SourceError(f"{root_path}: no such folder; SRC must be a folder of images (class sub-folders = labels)")
    if not root_path.is_dir():
        raise SourceError(f"{root_path}: is a file; SRC must be a folder of images (class sub-folders = labels)")
    try:
        entries = sorted(os.scandir(root_path), key=lambda e: e.name)
    except OSError as exc:
        raise SourceError(f"{root_path}: cannot list the folder ({exc.strerror}); check its permissions") from None

    class_dirs = [e for e in entries if not e.name.startswith(".") and _is_dir(e)]
    top_images = [e for e in entries if _is_image(e.name) and _is_file(e)]
    skipped: list[Skipped] = []
    if not class_dirs:
        items = [ImageItem(e.path, -1) for e in top_images]
        folder = ImageFolder(root_path, items, [], labeled=False)
    else:
        items = []
        empty = []
        for label, entry in enumerate(class_dirs):
            found = _walk_images(entry.path, skipped, root_path)
            if not found:
                empty.append(entry.name)
            items.extend(ImageItem(path, label) for path in found)
        for e in top_images:
            skipped.append(Skipped(os.path.relpath(e.path, root_path), "outside any class folder (not labeled)"))
        folder = ImageFolder(root_path, items, [e.name for e in class_dirs], True, skipped, empty)
    if not folder.items:
        where = "in its class sub-folders" if class_dirs else "at its top level"
        raise SourceError(
            f"{root_path}: no images found {where} "
            f"(looked for {', '.join(sorted(IMAGE_EXTENSIONS))}, any case)"
        )
    return folder


def _walk_images(top: str, skipped: list[Skipped], root: Path) -> list[str]:
    """Image paths below ``top``, sorted, following symlinks but never around a loop."""
    found: list[str] = []
    seen: set[tuple[int, int]] = set()

    def on_error(exc: OSError) -> None:
        skipped.append(Skipped(os.path.relpath(exc.filename or top, root), f"cannot list folder ({exc.strerror})"))

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
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        found.extend(os.path.join(dirpath, name) for name in filenames if _is_image(name))
    found.sort(key=lambda p: os.path.relpath(p, top).split(os.sep))
    return found


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
