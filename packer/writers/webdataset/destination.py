"""Where a WebDataset may be written: a folder holds one dataset (:func:`pattern_refusal`), and a
DST at a URL (:class:`RemoteShards`; packer/remote.py stages the conversion and calls it) gets
its shards uploaded one by one as they are published (:class:`~packer.remote.Uploader`), the
metadata last, with an in-progress marker (readers/formats/uploading.py) there until then; an
``--overwrite`` of a finished dataset stores the new one at ``URL.partial`` and copies it over
once it is whole (:func:`replace_with`)."""

from __future__ import annotations

import logging
import re
from typing import Any, Callable

from readers.formats.uploading import UPLOAD_MARKER, marker_bytes, uploader_elsewhere
from readers.formats.webdataset import META_FILE, ShardStore, parse_metadata
from readers.schema import Metadata

from ...errors import OutputExistsError
from ...remote import Uploader

__all__ = ["RemoteShards", "pattern_refusal", "brace_pattern", "replace_with"]


def pattern_refusal(folder: str, pattern: str, meta: Metadata) -> str | None:
    """Why shards named ``pattern`` must not replace the dataset ``meta`` of ``folder`` (a local
    path or a URL): its shards have another name; ``None`` when they do not."""
    old = meta.extra.get("shard_pattern") if meta.format == "webdataset" else None
    if not isinstance(old, str) or old == pattern:
        return None
    stem = pattern.split("%", 1)[0].rstrip("-_.") or "shards"
    parent, _, name = folder.rstrip("/").rpartition("/")
    beside = f"{parent}/{stem if stem != name else f'{name}-{stem}'}" if parent else (stem if stem != name else f"{name}-{stem}")
    return (f"{folder}: holds a WebDataset of shards named {old}, not {pattern}; a folder holds one dataset, so writing "
            f"{pattern} there would delete those shards: write it to a folder of its own, for example {beside}/{pattern}")


def brace_pattern(folder: str, meta: Metadata) -> str | None:
    """The shards of the dataset ``meta`` in ``folder`` as webdataset's (and StreamingShards')
    brace pattern takes them, ``folder/train-{000000..000009}.tar`` (one shard: its path);
    ``None`` where they are not named ``shard_pattern % 0, 1, ...`` (or the metadata has no pattern)."""
    names, pattern = list(meta.extra.get("shards") or []), meta.extra.get("shard_pattern")
    if not names or not isinstance(pattern, str) or names != [pattern % i for i in range(len(names))]:
        return None
    head, field, tail = re.split(r"(%0?[0-9]*d)", pattern, maxsplit=1)
    numbers = field % 0 if len(names) == 1 else f"{{{field % 0}..{field % (len(names) - 1)}}}"
    return f"{folder.rstrip('/')}/{head}{numbers}{tail}"


class RemoteShards:
    """:class:`~packer.remote.RemoteDestination` of WebDataset shards."""

    @staticmethod
    def sink(url: str, final: str) -> Uploader:
        """Stores the marker first; publishing removes it (``url`` is ``final``) or copies the
        whole upload over the dataset at ``final`` (:func:`replace_with`), and its clean-up then
        removes ``url``."""
        url, final = url.rstrip("/"), final.rstrip("/")
        marker = (UPLOAD_MARKER, marker_bytes())
        if url == final:
            return Uploader(url, marker=marker, publish=lambda fs, root: _drop_marker(fs, root, url))
        if not url.startswith(final):  # pragma: no cover - packer/remote.py stores beside final only
            raise ValueError(f"{url}: not beside {final}")
        suffix = len(url) - len(final)  # (its path in the filesystem: the final one's and the suffix)
        return Uploader(url, marker=marker, publish=lambda fs, root: replace_with(fs, root, root[:-suffix], url))

    @staticmethod
    def unfinished(fs: Any, root: str) -> bool:
        """An upload without its metadata record (stored last): ``--resume`` may carry it on."""
        return not fs.exists(f"{root}/{META_FILE}")

    @staticmethod
    def is_ours(fs: Any, root: str, *, staged: bool) -> bool:
        """A finished dataset (its metadata record), or an unfinished upload of this machine's
        (``staged``: its staging folder is here) holding only shards and packer's own files."""
        if fs.exists(f"{root}/{META_FILE}"):
            return True
        names = [str(name).rstrip("/").rsplit("/", 1)[-1] for name in fs.ls(root, detail=False)]
        return (staged or UPLOAD_MARKER in names) and all(name.endswith(".tar") or name in ShardStore.own_names for name in names)

    @staticmethod
    def held_elsewhere(fs: Any, root: str) -> str | None:
        """An upload whose marker names another machine: running there, or interrupted there,
        where its journal is (``--resume`` or ``--overwrite`` here would delete its shards)."""
        try:
            who = uploader_elsewhere(fs.cat(f"{root}/{UPLOAD_MARKER}"))
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        if who is None:
            return None
        return (f"holds an upload from another machine ({who}), running there or interrupted there: finish it there "
                f"(packer convert --resume), or remove {root.rsplit('/', 1)[-1]}/{UPLOAD_MARKER} to take it over from here")

    @staticmethod
    def is_staged(fs: Any, root: str) -> bool:
        """The new dataset of an ``--overwrite`` (:func:`replace_with` not done): its marker, stored
        first and removed last, and only shards and packer's own files (or an empty folder, of a
        ``file://`` run killed before its marker). A finished dataset named ``URL.partial`` by its
        user has no marker."""
        names = [str(name).rstrip("/").rsplit("/", 1)[-1] for name in fs.ls(root, detail=False)]
        return not names or (UPLOAD_MARKER in names and all(name.endswith(".tar") or name in ShardStore.own_names for name in names))

    @staticmethod
    def foreign_content(fs: Any, root: str) -> list[str]:
        """Names in a finished dataset's folder that its conversion did not write (a user's
        README): ``--overwrite`` removed them with the folder, where a local DST refuses."""
        if not fs.exists(f"{root}/{META_FILE}"):
            return []
        written = set(parse_metadata(fs.cat(f"{root}/{META_FILE}"), root).extra["shards"]) | ShardStore.own_names  # (as a local folder's)
        return sorted(name for name in (str(n).rstrip("/").rsplit("/", 1)[-1] for n in fs.ls(root, detail=False)) if name not in written)

    @staticmethod
    def replaced_whole() -> bool:
        return False  # shards are stored one by one under the old ones' names: --overwrite stores beside

    @staticmethod
    def nothing_to_lose(fs: Any, root: str, url: str, dst: str) -> bool:
        """An empty folder (a local DST's rule too); shards of another name beside a shard
        pattern are refused, even with ``--overwrite``, which would delete them with the folder."""
        if fs.isdir(root) and not fs.ls(root, detail=False):
            return True
        pattern = dst.rstrip("/").rsplit("/", 1)[-1]
        if "%" in pattern and fs.exists(f"{root}/{META_FILE}"):
            refusal = pattern_refusal(url, pattern, parse_metadata(fs.cat(f"{root}/{META_FILE}"), url))
            if refusal is not None:
                raise OutputExistsError(refusal)
        return False


def _drop_marker(fs: Any, root: str, url: str) -> None:
    """Publish a fresh upload at ``url``: its metadata record is stored, so readers take it; the
    marker goes. A marker that cannot be deleted is said and left: nothing is left to publish
    (``--resume`` would find the dataset complete), and an ``--overwrite`` replaces it."""
    try:
        fs.rm_file(f"{root}/{UPLOAD_MARKER}")
    except OSError as exc:
        logging.getLogger("packer").warning("%s/%s: could not delete it (%s); the dataset is complete and readers take it "
                                            "(its metadata is there): delete that object yourself", url, UPLOAD_MARKER, exc)


def replace_with(fs: Any, staged: str, root: str, url: str = "") -> Callable[[], None]:
    """Make the whole upload at ``staged`` (its metadata record stored) the dataset at ``root``,
    which it replaces: the marker goes to ``root`` and its metadata record goes (no reader takes
    it from here on), every file of ``staged`` is copied over (server-side where the store can),
    the old files it has not replaced go, the metadata record is copied last, then the marker.
    Cut short anywhere, it is done again whole (by ``--resume``). Returns the removal of
    ``staged``, for once the conversion's journal is gone: done again with ``staged`` part
    removed, the old files it would remove were the new dataset's shards that ``staged`` no
    longer held. ``url``: ``staged``'s, to name it."""
    def names(folder: str) -> set[str]:
        fs.invalidate_cache(folder)
        return {str(name).rstrip("/").rsplit("/", 1)[-1] for name in fs.ls(folder, detail=False)} if fs.exists(folder) else set()

    fs.pipe_file(f"{root}/{UPLOAD_MARKER}", marker_bytes())
    if fs.exists(f"{root}/{META_FILE}"):
        fs.rm_file(f"{root}/{META_FILE}")
    new = sorted(names(staged) - {META_FILE, UPLOAD_MARKER})
    if new:
        fs.copy([f"{staged}/{name}" for name in new], [f"{root}/{name}" for name in new])
    stale = sorted(names(root) - set(new) - {META_FILE, UPLOAD_MARKER})
    if stale:
        fs.rm([f"{root}/{name}" for name in stale])
    fs.copy(f"{staged}/{META_FILE}", f"{root}/{META_FILE}")
    fs.rm_file(f"{root}/{UPLOAD_MARKER}")
    return lambda: _remove_staged(fs, staged, names, url or staged)


def _remove_staged(fs: Any, staged: str, names: Callable[[str], set[str]], url: str) -> None:
    """Remove a published upload's ``staged`` folder (``names`` lists a folder), its marker
    last: one cut short is still known for packer's (:meth:`RemoteShards.is_staged`), and a
    later ``--overwrite`` removes it. A failure, listing it too, is said, not raised: the
    dataset it replaced is whole."""
    try:
        rest = sorted(names(staged) - {UPLOAD_MARKER})
        if rest:
            fs.rm([f"{staged}/{name}" for name in rest])
        if fs.exists(staged):
            fs.rm(staged, recursive=True)
    except OSError as exc:
        logging.getLogger("packer").warning("%s: the dataset is complete, but its staged copy could not be removed (%s): "
                                            "delete it yourself (an --overwrite of the dataset removes it too)", url, exc)
