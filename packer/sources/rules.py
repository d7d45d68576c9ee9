"""Which files of a source folder are inputs, and in what order: one set of rules for every source
(local folders, URLs, text corpora telling themselves apart from image folders)."""

from __future__ import annotations

import logging
import os
from typing import Iterable, Sequence

from readers.schema import Skipped

__all__ = ["IMAGE_EXTENSIONS", "ARCHIVE_SUFFIXES", "SYSTEM_FOLDERS", "UNREAD_IMAGE_EXTENSIONS", "is_hidden", "is_image_name", "image_order",
           "unread_images", "unread_archive", "warn_of_empty_classes", "holds_no_images"]

#: Image file extensions (any case) that are converted.
IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".gif", ".ppm", ".pgm"})
#: Image formats met in collections that are not converted (torchvision's ImageFolder leaves them
#: out too), each with what to do: such a file in a source folder is recorded as skipped, not left
#: out without a word (a .jfif beside .jpg files, an iPhone's .heic photos).
UNREAD_IMAGE_EXTENSIONS = {
    **dict.fromkeys((".jfif", ".jpe", ".jfi"), "a JPEG under another name: rename it .jpg"),
    **dict.fromkeys((".heic", ".heif", ".avif", ".jxl", ".jp2", ".j2k", ".psd", ".tga", ".ico", ".pbm", ".pnm", ".exr", ".svg",
                     ".dng", ".cr2", ".cr3", ".nef", ".arw", ".orf", ".rw2", ".raf"), "convert it to PNG or JPEG first"),
}
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


def holds_no_images(root: object) -> bool:
    """Whether the local folder ``root`` holds, at any depth, no image (converted or not) and no
    archive: neither images nor text (empty, notes only). Text options given for it name a
    corpus, so it is read as one and said to hold no text files (it was called an image folder,
    and dropping the options led to 'must be a folder of images': a text walkthrough)."""
    if not isinstance(root, (str, os.PathLike)) or not os.path.isdir(root):
        return False
    for _folder, folders, files in os.walk(root):
        folders[:] = [f for f in folders if not is_hidden(f)]
        if any(os.path.splitext(n)[1].lower() in IMAGE_EXTENSIONS.union(UNREAD_IMAGE_EXTENSIONS) or n.lower().endswith(ARCHIVE_SUFFIXES)
               for n in files if not is_hidden(n)):
            return False
    return True


def unread_images(folder: str, names: Iterable[str]) -> list[Skipped]:
    """The skip records of the files among ``names`` (in the source's ``folder``, relative; "" for
    its top) whose extension is one of :data:`UNREAD_IMAGE_EXTENSIONS`, or that are archives (a
    folder's images are read, not an archive's in it: WebDataset shards beside class folders were
    left out without a word), sorted by name."""
    found = []
    for name in sorted(n for n in names if (os.path.splitext(n)[1].lower() in UNREAD_IMAGE_EXTENSIONS
                                            or n.lower().endswith(ARCHIVE_SUFFIXES)) and not is_hidden(n)):
        ext = os.path.splitext(name)[1].lower()  # (only those sorted: this runs over every folder a scan lists)
        found.append(Skipped(f"{folder}/{name}" if folder else name, unread_archive(name) if ext not in UNREAD_IMAGE_EXTENSIONS else
                             f"a {ext} image, not a format converted ({', '.join(sorted(IMAGE_EXTENSIONS))}): {UNREAD_IMAGE_EXTENSIONS[ext]}"))
    return found


def unread_archive(name: str) -> str:
    """Why the archive ``name`` in a source folder is skipped, and what converts it."""
    return f"an archive in a folder of images is not opened: convert it on its own (packer convert {name} DST)"


def image_order(parts: Sequence[str]) -> list[str]:
    """The sort key of an image inside its class folder: its relative path, part by part."""
    return list(parts)


def warn_of_empty_classes(root: object, names: Sequence[str]) -> None:
    """Warn of each class folder of ``root`` among ``names`` (those holding no image)."""
    for name in names:
        logging.getLogger("packer").warning("%s", empty_class_warning(root, name))


def empty_class_warning(root: object, name: str) -> str:
    """The warning for class folder ``name`` of ``root`` holding no image: with the files it
    holds, if any, by extension (``x.jfif``, ``y.avif`` read as 'no images', with no word of
    why; a newcomer walkthrough), and the extensions converted."""
    said = f"class folder {name!r} has no images (its label is kept)"
    try:
        others = []
        for folder, folders, files in os.walk(os.path.join(str(root), name)):
            folders[:] = [f for f in folders if not is_hidden(f)]  # (as the scan leaves them out)
            others.extend(os.path.join(folder, f) for f in files if not is_hidden(f))
    except (OSError, TypeError):
        return said
    if not others:
        return said
    example = os.path.relpath(min(others), str(root))
    files = f"its file ({example}) is" if len(others) == 1 else f"its {len(others):,} files (e.g. {example}) are"
    return f"{said}; {files} not of the extensions converted: {', '.join(sorted(IMAGE_EXTENSIONS))}"
