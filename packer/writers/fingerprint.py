"""What ``--resume`` must find unchanged (:func:`conversion_fingerprint`): the source's listing
(each input's path, label, size and modification time) and every option that changes the output;
and, for a person, how two fingerprints differ (:func:`fingerprint_difference`). The journal
(packer/writers/journal.py) records it with every checkpoint."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

from readers.remote import is_url

from ..sources.datasets import identity_difference

__all__ = ["listing_digest", "listing_digests", "conversion_fingerprint", "fingerprint_difference", "ResumeRefused",
           "SOURCE_CHANGED", "EXPLAINED", "LEGACY", "FOLDERS_KEY", "LISTED_KEY", "SIZES_KEY"]


def listing_digest(entries: Iterable[tuple[str, int]], stamps: Mapping[str, str] | None = None) -> str:
    """SHA-256 over ``(path, label)`` plus each file's size and modification time: from
    ``stamps`` (a remote SRC's listing: ``path -> "size:version"``), else from ``os.stat``. A
    local path counts as its absolute spelling: ``--resume`` from another folder, or with SRC
    spelled the other way (``data/`` and ``/home/me/data/``), is the same listing."""
    return listing_digests(entries, stamps)[0]


def listing_digests(entries: Iterable[tuple[str, int]], stamps: Mapping[str, str] | None = None,
                    folders: dict[str, Any] | None = None) -> tuple[str, str, str]:
    """:func:`listing_digest`, the digest with each path as given (how journals written before
    paths were made absolute have it: such an interrupted run still resumes), and the digest
    without modification times (:data:`SIZES_KEY`; ``""`` with ``stamps``). ``folders``, when
    given, gets each folder's ``[inputs, digest]`` (:data:`FOLDERS_KEY`)."""
    digest, given, sizes = hashlib.sha256(), hashlib.sha256(), hashlib.sha256()
    parts: dict[str, Any] = {}
    for path, label in entries:
        if stamps is not None:
            stamp = stamps.get(path, "missing")
            absolute = path
        else:
            try:
                st = os.stat(path)
                size, stamp = str(st.st_size), f"{st.st_size}:{st.st_mtime_ns}"
            except OSError:
                size = stamp = "missing"
            absolute = os.path.abspath(path)
            sizes.update(f"{absolute}\0{label}\0{size}\n".encode("utf-8", "surrogateescape"))
        line = f"{absolute}\0{label}\0{stamp}\n".encode("utf-8", "surrogateescape")
        digest.update(line)
        given.update(f"{path}\0{label}\0{stamp}\n".encode("utf-8", "surrogateescape"))
        if folders is not None:
            part = parts.get(folder := os.path.dirname(absolute))
            if part is None:
                part = parts[folder] = [0, hashlib.sha256()]
            part[0] += 1
            part[1].update(line)
    if folders is not None and len(parts) <= MAX_FOLDERS:
        folders.update({folder: [count, part.hexdigest()[:16]] for folder, (count, part) in parts.items()})
    return digest.hexdigest(), given.hexdigest(), sizes.hexdigest() if stamps is None else ""


#: The fingerprint's record of each folder's inputs (``{folder: [count, digest]}``), which names
#: what changed in a changed source; left out past :data:`MAX_FOLDERS` folders (the journal's
#: record is rewritten at every checkpoint).
FOLDERS_KEY = "listing by folder"
MAX_FOLDERS = 2000
#: The fingerprint's digest of a local source's listing without modification times: the same
#: with files only touched (packer/touched.py then compares what they convert to).
SIZES_KEY = "listing without times"
#: The journal record's time of the conversion's start (``time.time_ns()``, kept by resumes): a
#: refused resume names the files modified since.
LISTED_KEY = "listed at"
#: Files named in a folder whose files were modified.
MAX_NAMED = 3


def _folder_changes(old: Mapping[str, Any], new: Mapping[str, Any], source: str, listed: Any = None) -> str:
    """Which folders of a changed source differ, for a person ("" when a record lacks them)."""
    before, after = old.get(FOLDERS_KEY) or {}, new.get(FOLDERS_KEY) or {}
    if not before or not after:
        return ""
    changes = []
    for folder in sorted(set(before) | set(after)):
        name = os.path.relpath(folder, source) if folder and source and not is_url(source) else folder
        name = "its top folder" if name in (".", "") else name  # ("": a Python dataset's items, dataset[i])
        if folder not in after:
            changes.append(f"{name} is gone ({before[folder][0]:,} inputs)")
        elif folder not in before:
            changes.append(f"{name} is new ({after[folder][0]:,} inputs)")
        elif before[folder] != after[folder]:
            more = after[folder][0] - before[folder][0]
            changes.append(f"{name} has {abs(more):,} input{'s' if abs(more) != 1 else ''} {'more' if more > 0 else 'fewer'}" if more
                           else f"{name} has files modified{_modified_since(folder, listed, source)}")
    shown = ", ".join(changes[:5]) + (f", and {len(changes) - 5:,} more folders" if len(changes) > 5 else "")
    return f": {shown}" if shown else ""


def _modified_since(folder: str, listed: Any, source: str) -> str:
    """`` (a.txt, b.txt modified since the interrupted run listed them)``: the files of the local
    ``folder`` modified after ``listed`` (ns; a file put back with an older time is not named)."""
    if not isinstance(listed, int) or is_url(source) or not os.path.isdir(folder):
        return ""
    with os.scandir(folder) as entries:
        newer = sorted(e.name for e in entries if e.is_file() and e.stat().st_mtime_ns > listed)
    if not newer:
        return ""
    more = f" and {len(newer) - MAX_NAMED:,} more" if len(newer) > MAX_NAMED else ""
    return f" ({', '.join(newer[:MAX_NAMED])}{more} modified since the interrupted run listed them)"


def conversion_fingerprint(
    format: str, source: str, items: Iterable[tuple[str, int]], image: Mapping[str, Any], storage: Mapping[str, Any], on_error: str, dst: Path,
    stamps: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Everything that decides an image conversion's output: options by their CLI names, the
    source (an absolute path or a URL) and its listing (``stamps``: see :func:`listing_digest`).
    ``listing as given`` and ``dst as given`` are what journals written before paths were made
    absolute recorded instead (:func:`fingerprint_difference` accepts either)."""
    options = {f"--{k.replace('_', '-')}": v for k, v in {**dict(image), **dict(storage)}.items()}
    folders: dict[str, Any] = {}
    listing, given, sizes = listing_digests(items, stamps, folders)
    return {"format": format, "source": source, "dst": os.path.abspath(dst), "--on-error": on_error, "listing": listing,
            LEGACY["listing"]: given, LEGACY["dst"]: str(dst), FOLDERS_KEY: folders, **({SIZES_KEY: sizes} if sizes else {}), **options}


#: Fingerprint keys whose value older journals recorded in another spelling, and the key of that spelling.
LEGACY = {"listing": "listing as given", "dst": "dst as given"}


class ResumeRefused(ValueError):
    """The interrupted run's fingerprint differs from this run's: the message says how, and
    :attr:`advice` how the interrupted run could be finished instead."""

    def __init__(self, difference: str, advice: str) -> None:
        super().__init__(difference)
        self.advice = advice


#: How a changed source (its listing) is said.
SOURCE_CHANGED = "the source folder changed since the interrupted run (files added, removed or modified)"

#: Fingerprint keys that are no option, and what a difference in one means.
EXPLAINED = {"inputs": "the interrupted run was made by an earlier packer, which counted this source's inputs another way"}


def fingerprint_difference(old: Mapping[str, Any], new: Mapping[str, Any], listed: Any = None) -> str | None:
    """Every difference between two fingerprints, for a person (``"; "``-joined; a changed
    ``--size`` also changes the default ``--resize-mode``, and naming only the first, by name,
    named the one the user did not touch); ``None`` if they agree. A changed listing of inputs
    is said only when no option changed: a changed --split or --classes changes it too, and
    "the source folder changed" would blame files that did not."""
    changes = []
    for key in sorted(set(old) | set(new)):
        if key in LEGACY.values() or key in (FOLDERS_KEY, SIZES_KEY):
            continue  # compared through their keys, below; the folders only name what changed (the sizes: packer/touched.py)
        if key in LEGACY and old.get(key) != new.get(key) and _legacy_same(old, new, key):
            continue  # a journal written before paths were made absolute: the same, as it spelled it
        if key == "--on-error" and (old.get(key), new.get(key)) == ("fail", "skip"):
            continue  # a run that fails at a bad input skipped nothing before it: skipping would have saved the same
        if isinstance(old.get(key), Mapping) and isinstance(new.get(key), Mapping) and "sha256" in old[key]:
            changes.extend(_file_difference(key, old[key], new[key]))  # (a tokenizer)
            continue
        if old.get(key) != new.get(key):
            if key in EXPLAINED or key == "--dataset":  # (a Python dataset's identity: said, not its digests)
                changes.append(EXPLAINED[key] if key in EXPLAINED else identity_difference(str(old.get(key)), str(new.get(key))))
            elif key == "listing":
                continue  # said below, unless an option changed: options (--split, --classes) change it too
            else:
                changes.append(f"{key} was {_shown(old.get(key), key)} in the interrupted run, now {_shown(new.get(key), key)}")
    if not changes and old.get("listing") != new.get("listing") and not _legacy_same(old, new, "listing"):
        changes.append(SOURCE_CHANGED + _folder_changes(old, new, str(new.get("source", "")), listed))
    return "; ".join(changes) or None


def _file_difference(key: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """How an option naming a file (a tokenizer: its kind, size, name, ``sha256``) changed: the
    same bytes under another name or path are the same file; other bytes, one phrase naming both."""
    if old.get("sha256") != new.get("sha256"):
        return [f"{key} was {old.get('name') or old.get('kind')} in the interrupted run, now {new.get('name') or new.get('kind')} "
                "(another file)"]
    return [f"{key} {field} was {_shown(old.get(field))} in the interrupted run, now {_shown(new.get(field))}"
            for field in sorted(set(old) | set(new)) if field not in ("name", "path") and old.get(field) != new.get(field)]


def _legacy_same(old: Mapping[str, Any], new: Mapping[str, Any], key: str) -> bool:
    """Whether a journal written before paths were made absolute spelled the same ``key`` its way."""
    return LEGACY[key] not in old and old.get(key) == new.get(LEGACY[key])


def _shown(value: Any, key: str = "") -> str:
    """An option's fingerprinted value as a person typed it: ``224x224``, ``on``, ``not set``
    (``--eos``'s None is ``none``, no separator: what ``--eos none`` gives)."""
    if value is None:
        return "none" if key == "--eos" else "not set"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (list, tuple)) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        return "x".join(map(str, value))
    return str(value)
