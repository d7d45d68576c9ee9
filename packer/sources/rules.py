"""Which files of a source folder are inputs, and in what order: one set of rules for every source
(local folders, URLs, text corpora telling themselves apart from image folders)."""

from __future__ import annotations

import os
from typing import Sequence

__all__ = ["IMAGE_EXTENSIONS", "ARCHIVE_SUFFIXES", "SYSTEM_FOLDERS", "is_hidden", "is_image_name", "image_order"]

#: Image file extensions (any case) that are converted.
IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".gif", ".ppm", ".pgm"})
#: Archives read as image sources (packer/sources/archives.py).
ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".zip")


#: Folders of an operating system's metadata, never images: macOS's zip tool writes ``__MACOSX``
#: (AppleDouble ``._`` files) beside what it packs, and an archive unpacked on Linux keeps it.
SYSTEM_FOLDERS = frozenset({"__MACOSX"})


def is_hidden(name: str) -> bool:
    """Hidden files and folders (name starting with ".") and :data:`SYSTEM_FOLDERS` are ignored."""
    return name.startswith(".") or name in SYSTEM_FOLDERS


def is_image_name(name: str) -> bool:
    """A file that is converted: not hidden, with an image extension (any case)."""
    return not is_hidden(name) and os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


def image_order(parts: Sequence[str]) -> list[str]:
    """The sort key of an image inside its class folder: its relative path, part by part."""
    return list(parts)
