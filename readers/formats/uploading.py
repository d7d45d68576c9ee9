"""An upload in progress: the marker object a conversion to a URL stores first.

A WebDataset converted to a URL (``s3://bucket/train``) is stored shard by shard as it is
written, its metadata record last. Until that record is there, the folder also holds
:data:`UPLOAD_MARKER`, stored before the first shard and deleted after the record: foreign
shards have no metadata record either, and the marker is how a reader given the shards by a
brace pattern or a list tells packer's unfinished upload from them (:func:`upload_refusal`).
An ``--overwrite`` of a finished dataset at a URL stores the new one at ``URL.partial`` (its own
marker there) and copies it over at the end, the old metadata record first removed and the
marker stored at the URL meanwhile (docs/FORMATS.md, "An upload in progress").
"""

from __future__ import annotations

import datetime
import json
import os
import socket

__all__ = ["UPLOAD_MARKER", "marker_bytes", "upload_refusal", "uploader_elsewhere"]

#: The marker object's name in the folder being uploaded (a JSON object, :func:`marker_bytes`).
UPLOAD_MARKER = "packer-uploading.json"


def marker_bytes() -> bytes:
    """The marker's content: which conversion stored it (host, pid) and when (UTC, ISO 8601)."""
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    record = {"packer_upload": "in progress", "host": socket.gethostname(), "pid": os.getpid(), "started": started}
    return (json.dumps(record) + "\n").encode()


def upload_refusal(folder: str) -> str:
    """The one-line refusal of the shards of ``folder``, which holds :data:`UPLOAD_MARKER` and no
    metadata record."""
    return (f"{folder.rstrip('/')}: an unfinished upload by packer (it holds {UPLOAD_MARKER} and no metadata "
            "record yet); read it once its conversion finishes, or finish it with packer convert --resume")


def uploader_elsewhere(raw: bytes) -> str | None:
    """Who stored the marker ``raw`` when that is another machine (``"node-7, pid 4242, started
    2026-11-28T13:05:00+00:00"``): its conversion may be running there, and this machine's lock
    cannot tell; ``None`` when it is this machine's, or says no host."""
    try:
        record = json.loads(raw)
    except ValueError:
        return None
    host = record.get("host") if isinstance(record, dict) else None
    if not isinstance(host, str) or not host or host == socket.gethostname():
        return None
    return f"{host}, pid {record.get('pid', '?')}, started {record.get('started', '?')}"
