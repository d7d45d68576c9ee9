"""A folder of WebDataset shards as SRC: each sample is the members sharing a key (the path up
to the first dot of the file name), its image ``KEY.jpg`` (``.png``, ...; else another member with
an image or ``.npy`` extension: :func:`_payload`) and its label the ``.cls`` member (where some
samples have one, those without are skipped and recorded); order is the shards' (sorted by
name), then the members'. Side files beside the shards (img2dataset's ``.parquet`` and
``_stats.json``) are left as they are; an image or another archive beside them is skipped and
recorded. Shards packer wrote keep their class names (their ``packer.json``). Nothing is
unpacked: workers read each member by offset (packer/sources/members.py)."""

from __future__ import annotations

import json
import os
import posixpath
import re
import tarfile
from pathlib import Path
from typing import Iterable

from readers.formats.webdataset import LABEL_EXTENSION
from readers.schema import MAX_LABEL, Skipped

from ..errors import SourceError
from .images import ImageFolder
from .members import Member, member_of, pread, safe_entries, stamp, warn_unended
from .rules import ARCHIVE_SUFFIXES, IMAGE_EXTENSIONS, is_hidden, is_image_name
from .tarstream import Entry, list_tar

__all__ = ["is_shard_folder", "scan_shards", "is_shard", "scan_shard"]

_PAYLOAD_EXTENSIONS = (".npy",)


def is_shard_folder(src: str | os.PathLike[str]) -> bool:
    """Whether SRC is a folder of WebDataset shards: ``.tar`` files and no sub-folders."""
    path = Path(src)
    if not path.is_dir():
        return False
    entries = [e for e in os.scandir(path) if not is_hidden(e.name)]
    return any(e.name.endswith(".tar") and e.is_file() for e in entries) and not any(e.is_dir() for e in entries)


def scan_shards(src: str | os.PathLike[str]) -> ImageFolder:
    """The samples of the WebDataset shards in the folder ``src``, in shard then member order."""
    folder = Path(src).resolve()
    shards = sorted(p for p in folder.iterdir() if p.name.endswith(".tar") and not is_hidden(p.name))
    classes, layout = _packer_record(folder)
    items: list[Member] = []
    skipped = [Skipped(p.name, _beside_shards(p.name)) for p in sorted(folder.iterdir())  # (they were dropped unsaid)
               if not p.name.endswith(".tar") and not is_hidden(p.name) and p.name.lower().endswith((*IMAGE_EXTENSIONS, *ARCHIVE_SUFFIXES))
               and p.is_file()]
    for shard in shards:
        try:
            entries = list_tar(str(shard))
        except (tarfile.TarError, OSError) as exc:
            raise SourceError(f"{shard}: cannot read the shard ({getattr(exc, 'strerror', None) or exc})") from None
        if not entries.ended:
            warn_unended(shard)
        prefix = f"{shard.name}/"
        items += _shard_items(str(shard), safe_entries(entries, skipped, prefix=prefix), classes, layout, skipped, prefix, str(folder))
    if not items:
        raise SourceError(f"{src}: no samples with an image found in its {len(shards)} shards")
    return _shard_folder(str(folder), items, classes, skipped)


def _beside_shards(name: str) -> str:
    """Why the image or archive ``name`` beside a folder's shards is skipped, and what converts it."""
    what = "an image" if is_image_name(name) else "an archive (not a .tar shard)"
    fix = "move it into a folder of images" if is_image_name(name) else f"convert it on its own (packer convert {name} DST)"
    return f"{what} beside the shards: a folder of shards converts the samples of its .tar shards; {fix}"


def is_shard(entries: list[Entry]) -> bool:
    """Whether the safe ``entries`` of one tar are WebDataset samples rather than image files: a
    ``.cls`` label member, or, in a tar without folders, every image the only one of its key and
    beside a member that is no image (``KEY.jpg`` and ``KEY.json``, as img2dataset writes). A flat
    tar of photos stays a tar of images: ``2019.05.01 beach.jpg`` and ``2019.05.02 sea.jpg`` share
    the key ``2019``, and a photo's ``.jpg.json`` sidecar (Google Takeout's) makes no sample."""
    if any(e.name.lower().endswith(".cls") for e in entries):
        return True
    if any("/" in e.name for e in entries):
        return False
    groups = [[is_image_name(e.name) for e in group] for _, group in _samples(entries)]
    with_images = [kinds for kinds in groups if any(kinds)]
    return bool(with_images) and all(sum(kinds) == 1 and not all(kinds) for kinds in with_images)


def scan_shard(archive: str, entries: list[Entry], skipped: list[Skipped]) -> ImageFolder:
    """The samples of the one WebDataset shard ``archive`` given as SRC (its safe ``entries``, as
    packer/sources/archives.py listed them; :func:`is_shard`): read as a folder of shards reads
    each, and packer's own keep their class names (the ``packer.json`` beside it)."""
    classes, layout = _packer_record(Path(archive).parent)
    items = _shard_items(archive, entries, classes, layout, skipped, "", archive)
    if not items:
        raise SourceError(f"{archive}: no samples with an image found in this WebDataset shard")
    return _shard_folder(archive, items, classes, skipped)


def _packer_record(folder: Path) -> tuple[list[str], str | None]:
    """The class names and payload layout of packer's own shards in ``folder`` (its
    ``packer.json``), else none."""
    meta = folder / "packer.json"
    if meta.is_file():  # packer's own shards: class names, and (C, H, W) .npy payloads
        try:
            record = json.loads(meta.read_text(encoding="utf-8"))
            if record.get("format") == "webdataset":
                return list(record.get("classes") or []), "chw"
        except (OSError, ValueError, AttributeError):
            pass
    return [], None


def _shard_items(shard: str, entries: list[Entry], classes: list[str], layout: str | None, skipped: list[Skipped],
                 prefix: str, root: str) -> list[Member]:
    """One shard's samples: each key's image (:func:`_payload`) with its ``.cls`` label (-1 without
    one); a sample without an image or with a label that is no class index is skipped and recorded
    (as ``PREFIX + KEY``)."""
    items = []
    for key, group in _samples(entries):
        where = prefix + key
        found = _payload(key, group)
        if not found:
            skipped.append(Skipped(where, "no image member in this sample"))
            continue
        payload = found[0]
        # a.b.png and a.c.png are one sample to webdataset (the key ends at the first dot): the second was lost unsaid
        skipped += [Skipped(prefix + other.name, f"a second image of the sample {key} (beside {posixpath.basename(payload.name)}): "
                            "webdataset's key ends at the file name's first dot; name each sample's files KEY.EXT, "
                            "with no dot in KEY") for other in found[1:]]
        label = -1
        # webdataset's "cls" field (after the name's first dot), as StreamingShards reads it: the first member ending in
        # .cls (k.orig.cls before k.cls) gave the sample another label than webdataset's (a webdataset walkthrough)
        cls = next((e for e in group if posixpath.basename(e.name).partition(".")[2] == LABEL_EXTENSION), None)
        if cls is not None:
            text = pread(shard, cls.offset, cls.size).decode("ascii", "replace").strip()
            number = re.fullmatch(r"-?[0-9]+", text) and int(text)  # (not isdigit: '²' is a digit to it, and int raised)
            if number is None or not -1 <= number <= min(MAX_LABEL, len(classes) - 1 if classes else MAX_LABEL):
                skipped.append(Skipped(where, f"unknown label {text[:20]!r} in {posixpath.basename(cls.name)}"))
                continue
            label = number
        items.append(member_of(shard, payload, label, name=prefix + payload.name, root=root, layout=layout))
    return items


def _shard_folder(root: str, items: list[Member], classes: list[str], skipped: list[Skipped]) -> ImageFolder:
    """The shards' samples as a source: labeled when any ``.cls`` gave a class, and then the
    samples without one skipped and recorded (a labeled dataset of unlabeled samples is verify's fault)."""
    labeled = any(item.label >= 0 for item in items)
    if labeled and any(item.label < 0 for item in items):
        skipped += [Skipped(item.name, "no .cls label, where other samples of the shards have one") for item in items if item.label < 0]
        items = [item for item in items if item.label >= 0]
    stamps = {item.path: stamp(item) for item in items}
    return ImageFolder(root, items, classes if labeled else [], labeled, skipped, [], stamps=stamps)


def _payload(key: str, group: list[Entry]) -> list[Entry]:
    """The image of a sample and the members ranked as it is, which are not read (none: no image):
    its ``KEY.jpg`` (``.png``...) first, then another member named as an image is (``KEY.seg.png``
    after it: a mask is no image of the sample), then ``KEY.npy``, then another ``.npy``
    (``KEY.depth.npy``). ``a.b.png`` beside ``a.c.png``: ``a.b.png``, and ``a.c.png`` not read."""
    def field(entry: Entry) -> str:
        return entry.name[len(key) + 1:].lower()

    ranked = ([e for e in group if "." not in field(e) and is_image_name(posixpath.basename(e.name))],
              [e for e in group if is_image_name(posixpath.basename(e.name))],
              [e for e in group if field(e) == "npy"],
              [e for e in group if e.name.lower().endswith(_PAYLOAD_EXTENSIONS)])
    return next((found for found in ranked if found), [])


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
